"""LookupdPoller against real nsqlookupd/nsqd: union of producers, a lookupd that is down,
one that answers garbage, an unknown topic, an nsqd that registers later."""

from __future__ import annotations

import asyncio
import http.server
import threading
import time
import urllib.request

import pytest

from nsq_spark._lookupd import LookupdPoller
from nsq_spark.testing import NSQCluster, free_port

pytestmark = pytest.mark.nsqd


def _publish(http_address: str, topic: str, body: bytes = b"x") -> None:
    urllib.request.urlopen(f"http://{http_address}/pub?topic={topic}", data=body, timeout=5).read()


class _Garbage(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server API
        body = b"<html>this is not nsqlookupd</html>"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def garbage_server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Garbage)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def _poll(poller: LookupdPoller):
    async def go():
        try:
            return await poller.poll_once()
        finally:
            await poller.stop()
    return asyncio.run(go())


@pytest.mark.nsq_cluster(nsqd=2, lookupd=2)
def test_union_and_bad_lookupds_skipped(nsq_cluster, garbage_server, caplog):
    for http_addr in nsq_cluster.nsqd_http_addresses:
        _publish(http_addr, "lk_union")
    seen = []
    down = f"127.0.0.1:{free_port()}"
    addrs = [*nsq_cluster.lookupd_http_addresses, down, garbage_server,
             nsq_cluster.nsqd_http_addresses[0]]  # an nsqd is not a lookupd: 404 -> skipped
    poller = LookupdPoller(addrs, "lk_union", seen.append, poll_interval=1)
    got = _poll(poller)
    expected = {("127.0.0.1", n.tcp_port) for n in nsq_cluster.nsqds}
    assert got == expected and seen == [expected]
    assert set(poller.failures) == set(poller.urls[2:])
    text = caplog.text
    assert "not JSON" in text and down in text


@pytest.mark.nsq_cluster(nsqd=1, lookupd=1)
def test_unknown_topic_is_empty_not_an_error(nsq_cluster):
    poller = LookupdPoller(nsq_cluster.lookupd_http_addresses, "lk_never_published", print)
    assert _poll(poller) == set()
    assert poller.failures == {}


def test_nsqd_registering_later_is_found_within_interval_plus_jitter():
    interval, jitter = 0.5, 0.3
    with NSQCluster(nsqd=0, lookupd=1) as cluster:
        found: list[tuple[float, set]] = []

        async def go():
            poller = LookupdPoller(cluster.lookupd_http_addresses, "lk_late",
                                   lambda p: found.append((time.monotonic(), p)),
                                   poll_interval=interval, poll_jitter=jitter)
            poller.start()
            try:
                while not found:
                    await asyncio.sleep(0.01)
                assert found[0][1] == set()
                # an nsqd appears (registers its topic once something is published)
                await asyncio.to_thread(cluster.add_nsqd)
                await asyncio.to_thread(_publish, cluster.nsqd_http_addresses[0], "lk_late")
                t0 = time.monotonic()
                deadline = t0 + 5
                while not any(p for _, p in found) and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)
                hit = next((t for t, p in found if p), None)
                assert hit is not None, "late nsqd never discovered"
                assert hit - t0 <= interval * (1 + jitter) + 0.5  # + HTTP/registration slack
            finally:
                await poller.stop()
        asyncio.run(go())


@pytest.mark.nsq_cluster(nsqd=1, lookupd=2)
def test_one_lookupd_down_other_answers_then_recovers(nsq_cluster, caplog):
    caplog.set_level("INFO", logger="nsq_spark.lookupd")
    _publish(nsq_cluster.nsqd_http_addresses[0], "lk_down")
    nsq_cluster.kill_lookupd(0)
    poller = LookupdPoller(nsq_cluster.lookupd_http_addresses, "lk_down", lambda p: None)

    async def go():
        try:
            first = await poller.poll_once()
            assert list(poller.failures) == [poller.urls[0]]
            # back up (nsqd re-registers with it only at its next 15 s ping: the union
            # still holds through the other lookupd)
            await asyncio.to_thread(nsq_cluster.restart_lookupd, 0)
            second = await poller.poll_once()
            return first, second
        finally:
            await poller.stop()
    first, second = asyncio.run(go())
    expected = {("127.0.0.1", nsq_cluster.nsqds[0].tcp_port)}
    assert first == expected and second == expected
    assert poller.failures == {}
    assert "answers again" in caplog.text
