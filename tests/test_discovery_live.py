"""Discovery and the run-time controls against real nsqd and nsqlookupd: what the wire
shows (which nsqd has a client on the channel, which one's messages are consumed).

* a Reader subclass overriding ``connect_to_nsqd`` (and ``query_lookupd``) to keep one
  of two nsqds out, as a real pynsq project does: it is asked for both, only the other is
  connected;
* ``discovery_filter=`` keeping one of two;
* ``disconnect_from_nsqd``: the client leaves that nsqd and does not come back;
* ``connect_to_lookupd`` / ``disconnect_from_lookupd`` on a running Reader.
"""

from __future__ import annotations

import time
import urllib.request
from typing import Any

import pytest

from nsq_spark._consumer import Reader
from nsq_spark._lookupd import ProducerInfo, lookup_sync
from nsq_spark.testing import NSQCluster, ReaderRunner, publish, wait_until

pytestmark = [pytest.mark.nsqd, pytest.mark.timeout(90),
              pytest.mark.nsq_cluster(nsqd=2, lookupd=1)]

N = 20


def _prepare(cluster: Any, topic: str, channel: str, n: int = N) -> None:
    """The topic and channel on both nsqds, ``n`` messages on each, both registered."""
    for http in cluster.nsqd_http_addresses:
        for path in (f"topic/create?topic={topic}",
                     f"channel/create?topic={topic}&channel={channel}"):
            urllib.request.urlopen(urllib.request.Request(f"http://{http}/{path}",
                                                          method="POST"), timeout=5).read()
        publish(http, topic, [b"m%d" % i for i in range(n)])
    lookupd = cluster.lookupd_http_addresses[0]
    wait_until(lambda: len(lookup_sync(lookupd, topic)) == 2, 10, "both nsqds registered")


def _record(into: list[bytes], body: bytes) -> bool:
    into.append(body)
    return True


def _clients(cluster: Any, i: int, topic: str, channel: str) -> int:
    return int(cluster.nsqds[i].channel_stats(topic, channel).get("client_count", 0))


def _depth(cluster: Any, i: int, topic: str, channel: str) -> int:
    return int(cluster.nsqds[i].channel_stats(topic, channel)["depth"])


def test_a_subclass_overriding_connect_to_nsqd_keeps_one_nsqd_out(nsq_cluster: NSQCluster,
        running_reader: ReaderRunner) -> None:
    topic, channel = "disc_override", "c"
    _prepare(nsq_cluster, topic, channel)
    keep_out = nsq_cluster.nsqds[1].tcp_port
    asked: list[tuple[str, int]] = []
    polls: list[int] = []

    class OnlySome(Reader):
        def query_lookupd(self) -> Any:
            polls.append(1)
            return super().query_lookupd()

        def connect_to_nsqd(self, host: str, port: int) -> None:
            asked.append((host, port))
            if port != keep_out:
                super().connect_to_nsqd(host, port)

    handled: list[bytes] = []
    r = running_reader.start(topic, channel, lambda m: _record(handled, m.body),
                             reader_class=OnlySome, max_in_flight=10, lookupd_poll_interval=1,
                             lookupd_http_addresses=nsq_cluster.lookupd_http_addresses)
    wait_until(lambda: len(handled) == N, 15, "nsqd 0's messages")
    wait_until(lambda: len(polls) >= 2, 10, "a second scheduled poll through query_lookupd")
    assert ("127.0.0.1", keep_out) in asked  # asked, and it said no
    assert list(r.conns) == [f"127.0.0.1:{nsq_cluster.nsqds[0].tcp_port}"]
    assert _clients(nsq_cluster, 1, topic, channel) == 0
    assert _depth(nsq_cluster, 1, topic, channel) == N  # nsqd 1's messages untouched
    assert sorted(handled) == sorted(b"m%d" % i for i in range(N))


def test_discovery_filter_keeps_the_nsqds_it_returns(nsq_cluster: NSQCluster,
        running_reader: ReaderRunner) -> None:
    topic, channel = "disc_filter", "c"
    _prepare(nsq_cluster, topic, channel)
    wanted = nsq_cluster.nsqds[1].tcp_port
    calls: list[list[ProducerInfo]] = []

    def only_one(records: list[ProducerInfo]) -> list[ProducerInfo]:
        calls.append(records)
        return [rec for rec in records if rec.tcp_port == wanted]

    handled: list[bytes] = []
    running_reader.start(topic, channel, lambda m: _record(handled, m.body),
                         max_in_flight=10, lookupd_poll_interval=1, discovery_filter=only_one,
                         lookupd_http_addresses=nsq_cluster.lookupd_http_addresses)
    wait_until(lambda: len(handled) == N, 15, "nsqd 1's messages")
    wait_until(lambda: len(calls) >= 2, 10, "the filter at a second poll")
    assert all(len(records) == 2 for records in calls)  # it saw both, once per poll
    assert _clients(nsq_cluster, 0, topic, channel) == 0
    assert _depth(nsq_cluster, 0, topic, channel) == N


def test_disconnect_from_nsqd_leaves_that_nsqd_for_good(nsq_cluster: NSQCluster,
        running_reader: ReaderRunner) -> None:
    topic, channel = "disc_direct", "c"
    _prepare(nsq_cluster, topic, channel)
    a, b = nsq_cluster.nsqd_tcp_addresses
    handled: list[bytes] = []
    r = running_reader.start(topic, channel, lambda m: _record(handled, m.body),
                             max_in_flight=10, nsqd_tcp_addresses=[a, b], reconnect_initial=0.1,
                             reconnect_max=0.2)
    wait_until(lambda: len(handled) == 2 * N, 15, "both nsqds' messages")
    assert _clients(nsq_cluster, 0, topic, channel) == 1
    r.disconnect_from_nsqd(a)
    wait_until(lambda: _clients(nsq_cluster, 0, topic, channel) == 0, 10, "the client to leave")
    assert r.nsqd_tcp_addresses == [b]
    publish(nsq_cluster.nsqd_http_addresses[0], topic, [b"late"] * 5)
    publish(nsq_cluster.nsqd_http_addresses[1], topic, [b"later"] * 5)
    wait_until(lambda: handled.count(b"later") == 5, 10, "nsqd 1 still consumed")
    time.sleep(0.5)  # longer than the reconnect backoff of a direct address
    assert _clients(nsq_cluster, 0, topic, channel) == 0
    assert _depth(nsq_cluster, 0, topic, channel) == 5 and b"late" not in handled
    c = nsq_cluster.nsqds[0].channel_stats(topic, channel)
    assert (c["requeue_count"], c["timeout_count"]) == (0, 0)  # left cleanly


def test_disconnect_from_nsqd_twice_joins_the_one_graceful_closing(
        nsq_cluster: NSQCluster) -> None:
    # a second call while the first closing runs must not cut it short: the message a
    # puller holds still gets close_timeout seconds, and its FIN reaches nsqd
    topic, channel = "disc_twice", "c"
    _prepare(nsq_cluster, topic, channel, n=3)
    a = nsq_cluster.nsqd_tcp_addresses[0]
    r = Reader(topic, channel, nsqd_tcp_addresses=[a], max_in_flight=1, close_timeout=4.0)
    try:
        held = r.get_batch(1, timeout=10)
        assert len(held) == 1
        start = time.monotonic()
        r.disconnect_from_nsqd(a)
        r.disconnect_from_nsqd(a)  # joins the closing in progress
        time.sleep(0.5)  # well within close_timeout
        assert _clients(nsq_cluster, 0, topic, channel) == 1, "closed before close_timeout"
        r.finish(held)
        wait_until(lambda: _clients(nsq_cluster, 0, topic, channel) == 0, 10,
                   "the client to leave")
        assert time.monotonic() - start < 4.0 + 2.0  # left once the held one was answered
        c = nsq_cluster.nsqds[0].channel_stats(topic, channel)
        # FIN arrived: nothing in flight (a lost FIN stays in flight until msg_timeout)
        assert (c["in_flight_count"], c["timeout_count"]) == (0, 0), c
        assert c["depth"] == 2 and c["requeue_count"] == 0, c
    finally:
        r.close()


def test_lookupds_added_and_removed_on_a_running_reader(nsq_cluster: NSQCluster,
        running_reader: ReaderRunner) -> None:
    topic, channel = "disc_lookupd", "c"
    _prepare(nsq_cluster, topic, channel)
    a = nsq_cluster.nsqd_tcp_addresses[0]
    lookupd = nsq_cluster.lookupd_http_addresses[0]
    handled: list[bytes] = []
    r = running_reader.start(topic, channel, lambda m: _record(handled, m.body),
                             max_in_flight=10, nsqd_tcp_addresses=[a], lookupd_poll_interval=1)
    wait_until(lambda: len(handled) == N, 15, "the direct nsqd's messages")
    assert _clients(nsq_cluster, 1, topic, channel) == 0  # no lookupd: nsqd 1 unknown
    assert r.connect_to_lookupd(lookupd) is True
    assert r.connect_to_lookupd(lookupd) is False
    wait_until(lambda: len(handled) == 2 * N, 15, "nsqd 1 found through the new lookupd")
    assert _clients(nsq_cluster, 1, topic, channel) == 1
    r.disconnect_from_lookupd(lookupd)
    assert r.lookupd_http_addresses == []
    assert r.stats()["lookupd"] is None  # no poller any more; its connections stay
    assert _clients(nsq_cluster, 1, topic, channel) == 1


def test_a_query_lookupd_override_doing_its_own_http_drives_discovery(nsq_cluster: NSQCluster,
        running_reader: ReaderRunner) -> None:
    """A real project's shape: ``query_lookupd`` overridden by a tornado coroutine that
    queries one lookupd at a time (pynsq's ``lookupd_query_index``), builds the URL with
    pynsq's private ``_utf8_params`` and connects each producer with ``connect_to_nsqd``."""
    import json
    from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

    import tornado.gen
    import tornado.httpclient

    from nsq_spark.reader import _utf8_params

    topic, channel = "disc_own_http", "c"
    _prepare(nsq_cluster, topic, channel)
    fetched: list[str] = []

    class OwnLookup(Reader):
        @tornado.gen.coroutine
        def query_lookupd(self) -> Any:
            address = self.lookupd_http_addresses[self.lookupd_query_index]
            self.lookupd_query_index = ((self.lookupd_query_index + 1)
                                        % len(self.lookupd_http_addresses))
            scheme, netloc, path, query, fragment = urlsplit("http://" + address)
            params: dict[str, Any] = dict(parse_qs(query))
            params["topic"] = self.topic
            query = urlencode(_utf8_params(params), doseq=True)
            url = urlunsplit((scheme, netloc, "/lookup", query, fragment))
            response = yield tornado.httpclient.AsyncHTTPClient().fetch(url)
            fetched.append(url)
            for producer in json.loads(response.body)["producers"]:
                self.connect_to_nsqd(producer["broadcast_address"], producer["tcp_port"])

    handled: list[bytes] = []
    r = running_reader.start(topic, channel, lambda m: _record(handled, m.body),
                             reader_class=OwnLookup, max_in_flight=10, lookupd_poll_interval=1,
                             lookupd_http_addresses=nsq_cluster.lookupd_http_addresses)
    wait_until(lambda: len(handled) == 2 * N, 15, "both nsqds' messages")
    assert fetched and fetched[0].endswith(f"/lookup?topic={topic}")
    assert len(r.conns) == 2 and r.stats()["lookupd"]["polls"] == 0  # ours never ran
