"""Producer.stats() in messages and bytes, checked against nsqd's own counts, and the
once-per-transition log lines when an nsqd goes down and comes back (real nsqd, killed
and restarted)."""

from __future__ import annotations

import asyncio
import logging
import uuid

import pytest

from conn_helpers import topic_message_count
from nsq_spark.errors import ConnectError
from nsq_spark import Producer
from nsq_spark.testing import NSQCluster

pytestmark = [pytest.mark.nsqd, pytest.mark.timeout(120)]


def _topic() -> str:
    return "s" + uuid.uuid4().hex[:12]


@pytest.fixture(scope="module")
def nsqd():
    with NSQCluster(nsqd=1, lookupd=0) as cluster:
        yield cluster


def test_stats_count_messages_and_bytes_as_nsqd_does(nsqd: NSQCluster) -> None:
    topic = _topic()
    bodies = [b"x" * (i % 50 + 1) for i in range(500)]
    with Producer(nsqd.nsqd_tcp_addresses[0]) as p:
        p.publish(topic, b"one")
        p.mpublish(topic, bodies)
        p.mpublish_async(topic, bodies[:100]).result(10)
        for f in [p.publish_async(topic, b"f%d" % i) for i in range(50)]:
            f.result(10)
        st = p.stats()
    sent = 1 + 500 + 100 + 50
    assert st["messages"] == sent == topic_message_count(nsqd.nsqd_http_addresses[0], topic)
    assert st["bytes"] == 3 + sum(map(len, bodies)) + sum(map(len, bodies[:100])) + \
        sum(len(b"f%d" % i) for i in range(50))
    assert st["commands"] == st["published"] == 1 + 1 + 1 + 50
    assert st["retries"] == 0 and st["errors"] == 0
    (detail,) = st["nsqd"].values()
    assert detail["up"] is True and detail["messages"] == sent


def test_http_mode_counts_messages_too(nsqd: NSQCluster) -> None:
    topic = _topic()

    async def main() -> dict:
        async with Producer(nsqd_http_addresses=nsqd.nsqd_http_addresses[0]) as p:
            await p.apublish(topic, b"h1")
            await p.ampublish(topic, [b"h2", b"h33"])
            return p.stats()

    st = asyncio.run(main())
    assert st["messages"] == 3 == topic_message_count(nsqd.nsqd_http_addresses[0], topic)
    assert st["bytes"] == 7 and st["commands"] == 2


def test_failures_count_errors_and_retries(nsqd: NSQCluster) -> None:
    with Producer("127.0.0.1:1", max_tries=3, retry_wait=0.001, retry_max_wait=0.002) as p:
        with pytest.raises(ConnectError):
            p.mpublish("t", [b"a", b"b"])
        st = p.stats()
    assert st["errors"] == 2 and st["retries"] == 2 and st["messages"] == 0


def test_spool_mode_stats(nsqd: NSQCluster, tmp_path) -> None:
    topic = _topic()
    with Producer(nsqd.nsqd_tcp_addresses[0], spool_dir=tmp_path, spool_fsync="never") as p:
        p.mpublish(topic, [b"s1", b"s22"])
        p.publish(topic, b"s333")
        assert p.flush(15)
        st = p.stats()
    assert st["messages"] == 3 == topic_message_count(nsqd.nsqd_http_addresses[0], topic)
    assert st["bytes"] == 9 and st["errors"] == 0
    assert st["spool_pending"] == 0 and st["spool_pending_bytes"] == 0
    assert list(st["nsqd"]) == [nsqd.nsqd_tcp_addresses[0]]


@pytest.mark.slow
def test_nsqd_down_and_up_are_logged_once_each(caplog) -> None:
    with NSQCluster(nsqd=1, lookupd=0) as cluster:
        addr = cluster.nsqd_tcp_addresses[0]
        topic = _topic()
        with Producer(addr, max_tries=2, retry_wait=0.01, retry_max_wait=0.02,
                      retry_deadline=2) as p, \
                caplog.at_level(logging.INFO, logger="nsq_spark.producer"):
            p.publish(topic, b"before")
            p.publish_async(topic, b"before-async").result(10)   # a pipelined connection too
            cluster.kill(0)
            for _ in range(5):                                   # many failed attempts
                with pytest.raises(ConnectError):
                    p.publish(topic, b"during")
                with pytest.raises(ConnectError):
                    p.publish_async(topic, b"during").result(10)
            cluster.restart(0)
            p.publish(topic, b"after")
            p.publish_async(topic, b"after-async").result(10)
            st = p.stats()
        lines = [(r.levelname, r.getMessage()) for r in caplog.records
                 if r.name == "nsq_spark.producer" and r.levelno >= logging.INFO]
    assert [level for level, _ in lines] == ["WARNING", "INFO"], lines
    assert addr in lines[0][1] and "down" in lines[0][1]
    assert addr in lines[1][1] and "up" in lines[1][1]
    assert st["messages"] == 4 and st["errors"] == 10 and st["nsqd"][addr]["up"] is True
