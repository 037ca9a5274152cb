"""lookupd discovery with a hostile lookupd (tests/hostile_http.py) beside a real nsqlookupd
and nsqd: one that drips its answer a byte at a time never holds back what the healthy one
answered, at start-up and after ``connect_to_lookupd``; one that answers 4 GiB leaves the
Reader under 200 MB (measured in a child process); one that lists 10,000 nsqds makes the
Reader dial at most ``lookupd_max_producers`` of them, with one warning. Time bounds are
generous: they catch a hang, not a slow machine."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import pytest

from fake_nsqd import FakeConnections
from hostile_http import HostileHttp, child
from nsq_spark._consumer import Reader
from nsq_spark._lookupd import lookup_sync
from nsq_spark.testing import NSQCluster, wait_until

pytestmark = [pytest.mark.nsqd, pytest.mark.timeout(120)]

N = 100


def _ready(cluster: NSQCluster, topic: str, n: int = N, nsqd: int = 0) -> None:
    cluster.publish(topic, [b"m%03d" % i for i in range(n)], nsqd=nsqd)
    cluster.wait_registered(nsqd)
    lookupd = cluster.lookupd_http_addresses[0]
    wait_until(lambda: any(p.tcp_port == cluster.nsqds[nsqd].tcp_port
                           for p in lookup_sync(lookupd, topic)), 10, f"{topic} registered")


def _pull(reader: Reader, n: int, timeout: float) -> tuple[list[bytes], float | None]:
    """Up to ``n`` bodies within ``timeout`` s (finished), and when the first came."""
    got: list[bytes] = []
    first = None
    started = time.monotonic()
    while len(got) < n and time.monotonic() - started < timeout:
        batch = reader.get_batch(max_messages=n - len(got), timeout=0.2)
        if batch and first is None:
            first = time.monotonic() - started
        reader.finish(batch)
        got += [m.body for m in batch]
    return got, first


@pytest.mark.nsq_cluster(nsqd=1, lookupd=1)
@pytest.mark.parametrize("order", ["dripping first", "healthy first"])
def test_a_dripping_lookupd_beside_a_healthy_one_delays_nothing(nsq_cluster, order):
    topic = "hostile_drip" + order[0]
    _ready(nsq_cluster, topic)
    with HostileHttp("drip", b'{"producers": []}', every=1.0) as drip:
        lookupds = [drip.address, nsq_cluster.lookupd_http_addresses[0]]
        if order == "healthy first":
            lookupds.reverse()
        reader = Reader(topic, "c", lookupd_http_addresses=lookupds, max_in_flight=N,
                        lookupd_request_timeout=2)
        try:
            got, first = _pull(reader, N, 30)
            # the dripping one ends at its deadline (2 s), and once more on the retry
            failing = wait_until(lambda: reader.stats()["lookupd"]["failing"], 20,
                                 "the dripping lookupd given up")
        finally:
            reader.close()
    # before: 0 of 100 in 60 s, in either order (the poll waited for the dripping answer)
    assert sorted(got) == [b"m%03d" % i for i in range(N)]
    assert first is not None and first < 5, first
    (url,) = failing
    assert drip.address in url and "HTTPDeadlineError" in failing[url]


@pytest.mark.nsq_cluster(nsqd=1, lookupd=1)
def test_a_dripping_lookupd_connected_later_does_not_stop_discovery(nsq_cluster):
    topic = "hostile_later"
    _ready(nsq_cluster, topic, n=1)
    with HostileHttp("drip", b'{"producers": []}', every=1.0) as drip:
        reader = Reader(topic, "c", lookupd_http_addresses=nsq_cluster.lookupd_http_addresses,
                        max_in_flight=N, lookupd_poll_interval=1, lookupd_request_timeout=1)
        try:
            assert _pull(reader, 1, 20)[0] == [b"m000"]
            assert reader.connect_to_lookupd(drip.address) is True
            wait_until(lambda: len(drip.requests) >= 1, 10, "the dripping lookupd asked")
            # a new nsqd appears at the healthy lookupd: the next poll finds it
            i = nsq_cluster.add_nsqd()
            started = time.monotonic()
            _ready(nsq_cluster, topic, nsqd=i)
            got, _ = _pull(reader, N, 45)
            took = time.monotonic() - started
        finally:
            reader.close()
    assert sorted(got) == [b"m%03d" % k for k in range(N)]   # before: not found in 45 s
    assert took < 30, took


@pytest.mark.nsq_cluster(nsqd=1, lookupd=1)
@pytest.mark.parametrize("mode", ["huge", "chunks"])
def test_a_lookupd_answering_4_gib_leaves_the_reader_under_200_mb(nsq_cluster, mode):
    topic = "hostile_" + mode
    _ready(nsq_cluster, topic)
    with HostileHttp(mode) as hostile:
        got = child(f"""
            import json, time
            from nsq_spark._consumer import Reader
            r = Reader({topic!r}, "c", max_in_flight={N},
                       lookupd_http_addresses=[{hostile.address!r},
                                               {nsq_cluster.lookupd_http_addresses[0]!r}])
            got = []
            started = time.monotonic()
            while len(got) < {N} and time.monotonic() - started < 60:
                batch = r.get_batch(max_messages={N}, timeout=0.2)
                r.finish(batch)
                got += batch
            while not r.stats()["lookupd"]["failing"] and time.monotonic() - started < 60:
                time.sleep(0.1)
            failing = r.stats()["lookupd"]["failing"]
            r.close()
            print(json.dumps({{"got": len(got), "failing": list(failing.values()),
                              "rss": peak_rss_mb()}}))
        """)
    assert got["got"] == N
    assert got["rss"] < 200, got   # before: 2.5 GB with a healthy lookupd beside it
    (failure,) = got["failing"]
    assert failure.startswith("AnswerTooLargeError") and "size limit of 16 MiB" in failure


def _lookup_of(n: int) -> bytes:
    return json.dumps({"channels": [], "producers": [
        {"broadcast_address": "127.0.0.1", "tcp_port": 10000 + i % 50000, "http_port": 1,
         "hostname": f"h{i}", "remote_address": "", "version": "1.3.0"}
        for i in range(n)]}).encode()


def test_a_lookupd_listing_10000_nsqds_makes_the_reader_dial_at_most_its_cap(caplog):
    made = FakeConnections()
    with HostileHttp("answer", _lookup_of(10_000)) as lookupd:
        with caplog.at_level(logging.WARNING):
            reader = Reader("capped", "c", lookupd_http_addresses=[lookupd.address],
                            connection_factory=made, lookupd_max_producers=50,
                            lookupd_poll_interval=0.2)
            try:
                reader.get_batch(timeout=0.1)   # starts it
                wait_until(lambda: len(lookupd.requests) >= 3, 20, "three polls")
            finally:
                reader.close()
    # before: every one dialled (371 MB, 30,001 WARNING lines in 39 s)
    assert len(made.made) == 50
    assert [c.address for c in made.made] == [f"127.0.0.1:{10000 + i}" for i in range(50)]
    warnings = [r.getMessage() for r in caplog.records if "lookupd_max_producers" in
                r.getMessage()]
    assert len(warnings) == 1, warnings   # once, not once a poll
    assert ("lookupd lists 10,000 nsqds for topic capped; connecting to the first 50 "
            "(lookupd_max_producers=50) and skipping 9,950: 127.0.0.1:10050, "
            "127.0.0.1:10051") in warnings[0] and "and 9,945 more" in warnings[0]


def test_lookupd_max_producers_is_bounded():
    from nsq_spark.errors import ConfigError

    for bad in (0, -1, 1.5, 10_000_001, True):
        with pytest.raises(ConfigError, match="lookupd_max_producers"):
            Reader("t", "c", lookupd_http_addresses=["127.0.0.1:4161"],
                   lookupd_max_producers=bad)


def _reader_headers(auth: dict[str, Any], address: str) -> dict[str, str]:
    with HostileHttp("answer", _lookup_of(0)) as lookupd:
        where = address.replace("HOST", lookupd.address)
        reader = Reader("authed", "c", lookupd_http_addresses=[where],
                        connection_factory=FakeConnections(), **auth)
        try:
            reader.get_batch(timeout=0.1)
            wait_until(lambda: lookupd.requests, 10, "a lookup")
        finally:
            reader.close()
        return lookupd.headers(0)


def test_the_reader_sends_its_auth_secret_to_lookupd_as_go_nsq_does():
    assert _reader_headers({"auth_secret": "s3cret"}, "HOST")["authorization"] == \
        "Bearer s3cret"
    assert "authorization" not in _reader_headers(
        {"auth_secret": "s3cret", "lookupd_authorization": False}, "HOST")
    assert "authorization" not in _reader_headers({}, "HOST")
    # user info wins for its address: basic, base64 of user:password
    assert _reader_headers({"auth_secret": "s3cret"}, "http://op:p%40ss@HOST")[
        "authorization"] == "Basic b3A6cEBzcw=="


def test_a_dead_nsqd_listed_at_every_poll_is_one_warning_not_one_a_poll(caplog):
    from nsq_spark.testing import free_port

    dead = [free_port() for _ in range(20)]
    body = json.dumps({"producers": [
        {"broadcast_address": "127.0.0.1", "tcp_port": p, "http_port": 1} for p in dead]})
    with HostileHttp("answer", body.encode()) as lookupd:
        with caplog.at_level(logging.WARNING):
            reader = Reader("dead_nsqds", "c", lookupd_http_addresses=[lookupd.address],
                            lookupd_poll_interval=0.2)
            try:
                reader.get_batch(timeout=0.1)
                wait_until(lambda: len(lookupd.requests) >= 4, 20, "four polls")
                time.sleep(0.3)   # the last poll's dials fail too
            finally:
                reader.close()
    lines = [r.getMessage() for r in caplog.records if "cannot connect to nsqd" in
             r.getMessage()]
    # each was dialled at every poll (still: a lookupd that lists it is believed), and
    # said once, when it started failing
    assert sorted({line.split("nsqd ")[1].split(" ")[0] for line in lines}) == \
        sorted(f"127.0.0.1:{p}" for p in dead)
    assert len(lines) == 20, len(lines)
