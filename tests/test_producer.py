"""Producer against real nsqd: blocking and asyncio APIs, pipelining, DPUB, MPUB split,
failover and retries, HTTP mode, and typed errors for bad input."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from typing import Iterator

import pytest

from conn_helpers import channel_stats, run, topic_message_count, wait_for
from nsq_spark import Producer, errors
from nsq_spark._conn import Connection
from nsq_spark.message import Message
from nsq_spark.errors import is_transient
from nsq_spark.testing import NSQCluster, free_port

pytestmark = pytest.mark.nsqd


@pytest.fixture(scope="module")
def nsqd() -> Iterator[NSQCluster]:
    with NSQCluster(nsqd=1, lookupd=0, max_msg_size=4096, max_body_size=65536) as cluster:
        yield cluster


def _topic() -> str:
    return "p" + uuid.uuid4().hex[:12]


def _consume(addr: str, topic: str, n: int, timeout: float = 15.0) -> list[Message]:
    """Read n messages with our own connection (FIN each)."""
    async def main() -> list[Message]:
        got: list[Message] = []
        host, port = addr.rsplit(":", 1)
        conn = Connection(host, int(port), on_messages=lambda c, m: got.extend(m))
        await conn.connect()
        await conn.subscribe(topic, "ch")
        conn.send_rdy(500)
        await wait_for(lambda: len(got) >= n, timeout, f"{n} messages")
        await asyncio.sleep(0.05)  # anything extra would arrive now
        for m in got:
            m.finish()
        await conn.close()
        return got

    return run(main(), timeout + 10)


def test_blocking_publish_mpublish_and_context_manager(nsqd: NSQCluster) -> None:
    topic = _topic()
    bodies = [bytes([i % 256]) * (1 + i) for i in range(300)]
    with Producer(nsqd.nsqd_tcp_addresses[0]) as p:
        p.publish(topic, b"\x00first\xff")
        p.mpublish(topic, bodies)
        p.mpublish(topic, iter([b"gen-1", b"gen-2"]))
        assert p.published == 3
    got = _consume(nsqd.nsqd_tcp_addresses[0], topic, 303)
    assert [m.body for m in got] == [b"\x00first\xff", *bodies, b"gen-1", b"gen-2"]
    with pytest.raises(errors.NSQError, match="closed"):
        p.publish(topic, b"x")


def _create_channel(http_address: str, topic: str, channel: str = "ch") -> None:
    import urllib.request
    for path in (f"/topic/create?topic={topic}", f"/channel/create?topic={topic}&channel={channel}"):
        urllib.request.urlopen(urllib.request.Request(f"http://{http_address}{path}", data=b""),
                               timeout=5).read()


def test_deferred_publish(nsqd: NSQCluster) -> None:
    # nsqd only scans a new channel's deferred queue after its 5 s refresh: rather than
    # wait for delivery, check that nsqd holds the message as deferred
    topic = _topic()
    _create_channel(nsqd.nsqd_http_addresses[0], topic)
    with Producer(nsqd.nsqd_tcp_addresses) as p:
        p.publish(topic, b"later", defer_ms=60_000)
        p.publish(topic, b"now")
    stats = channel_stats(nsqd.nsqd_http_addresses[0], topic, "ch")
    assert stats["deferred_count"] == 1 and stats["depth"] == 1
    assert [m.body for m in _consume(nsqd.nsqd_tcp_addresses[0], topic, 1)] == [b"now"]


def test_threads_pipeline_on_one_connection(nsqd: NSQCluster) -> None:
    topic = _topic()
    errs: list[BaseException] = []
    with Producer(nsqd.nsqd_tcp_addresses) as p:
        def worker(k: int) -> None:
            try:
                for i in range(200):
                    p.publish(topic, b"%d-%d" % (k, i))
            except BaseException as exc:  # noqa: BLE001
                errs.append(exc)

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        futs = [p.publish_async(topic, b"async-%d" % i) for i in range(400)]
        for t in threads:
            t.join(60)
        assert all(f.result(30) == b"OK" for f in futs)
        assert len(p.stats()["connected"]) == 1
    assert errs == []
    assert topic_message_count(nsqd.nsqd_http_addresses[0], topic) == 2000


def test_asyncio_api_binds_to_running_loop(nsqd: NSQCluster) -> None:
    topic = _topic()

    async def main() -> None:
        async with Producer(nsqd.nsqd_tcp_addresses) as p:
            await p.apublish(topic, b"a1")
            await p.ampublish(topic, [b"a2", b"a3"])
            futs = [p.publish_nowait(topic, b"n%d" % i) for i in range(100)]
            assert set(await asyncio.gather(*futs)) == {b"OK"}
            await p.apublish(topic, b"d")
            await p.apublish(topic, b"deferred", defer_ms=60_000)
            # no IO thread in asyncio mode
            assert not [t for t in threading.enumerate() if t.name == "nsq-producer-io"]
            with pytest.raises(errors.NSQError, match="apublish"):
                p.publish(topic, b"blocking on the loop")

    run(main())
    got = _consume(nsqd.nsqd_tcp_addresses[0], topic, 104)
    assert sorted(m.body for m in got) == sorted([b"a1", b"a2", b"a3", b"d"] + [b"n%d" % i for i in range(100)])


def test_async_api_from_another_loop_hops_to_io_thread(nsqd: NSQCluster) -> None:
    topic = _topic()
    p = Producer(nsqd.nsqd_tcp_addresses)
    p.publish(topic, b"blocking")  # blocking calls need no loop
    assert p.publish_async(topic, b"from thread").result(10) == b"OK"  # starts the IO thread
    run(p.apublish(topic, b"from another loop"))
    run(p.ampublish(topic, [b"m1", b"m2"]))
    p.close()
    assert topic_message_count(nsqd.nsqd_http_addresses[0], topic) == 5


def test_asyncio_api_across_successive_event_loops(nsqd: NSQCluster) -> None:
    topic = _topic()
    p = Producer(nsqd.nsqd_tcp_addresses)
    run(p.apublish(topic, b"loop-1"))
    run(p.apublish(topic, b"loop-2"))  # the first loop is gone: the producer rebinds
    p.publish(topic, b"blocking")
    p.close()
    assert topic_message_count(nsqd.nsqd_http_addresses[0], topic) == 3


def test_mpublish_split_over_max_body_size(nsqd: NSQCluster) -> None:
    topic = _topic()
    bodies = [b"%05d" % i + b"x" * 995 for i in range(200)]  # 200 kB > nsqd's 64 kB body limit
    with Producer(nsqd.nsqd_tcp_addresses, max_mpub_bytes=65536) as p:
        p.mpublish(topic, bodies)
        assert p.published > 3
    got = _consume(nsqd.nsqd_tcp_addresses[0], topic, 200)
    assert [m.body for m in got] == bodies


# -- bad input ------------------------------------------------------------------------------

def test_bad_input_raises_typed_errors_and_producer_recovers(nsqd: NSQCluster) -> None:
    topic = _topic()
    with Producer(nsqd.nsqd_tcp_addresses) as p:
        with pytest.raises(errors.InvalidNameError):
            p.publish("bad topic!", b"x")
        with pytest.raises(errors.InvalidNameError):
            p.mpublish("x" * 65, [b"x"])
        with pytest.raises(errors.InvalidBodyError, match="empty"):
            p.publish(topic, b"")
        with pytest.raises(errors.InvalidBodyError, match="empty"):
            p.mpublish(topic, [b"ok", b""])
        with pytest.raises(errors.InvalidBodyError, match="bytes"):
            p.publish(topic, "text")  # type: ignore[arg-type]
        with pytest.raises(errors.InvalidBodyError):
            p.mpublish(topic, [])
        # over nsqd's --max-msg-size: nsqd refuses (fatal for that connection)
        with pytest.raises(errors.BadMessageError, match="too big"):
            p.publish(topic, b"x" * 5000)
        with pytest.raises(errors.BadMessageError):
            p.mpublish(topic, [b"ok", b"y" * 5000])
        p.publish(topic, b"after")  # reconnects by itself
    with Producer(nsqd.nsqd_tcp_addresses, max_msg_size=4096) as p:
        with pytest.raises(errors.InvalidBodyError, match="max-msg-size"):
            p.publish(topic, b"x" * 4097)
    assert topic_message_count(nsqd.nsqd_http_addresses[0], topic) == 1


def test_unreachable_nsqd_is_connect_error_after_bounded_retries() -> None:
    addr = f"127.0.0.1:{free_port()}"
    p = Producer([addr], max_tries=3, retry_wait=0.01, retry_max_wait=0.05)
    t0 = time.monotonic()
    with pytest.raises(errors.ConnectError, match=addr):
        p.publish("t", b"x")
    assert time.monotonic() - t0 < 5
    p.close()

    async def main() -> None:
        p2 = Producer([addr], max_tries=2, retry_wait=0.01)
        with pytest.raises(errors.ConnectError):
            await p2.apublish("t", b"x")
        await p2.aclose()

    run(main())


def test_constructor_validation() -> None:
    with pytest.raises(ValueError):
        Producer()
    with pytest.raises(ValueError):
        Producer(["nohost"])
    with pytest.raises(errors.ConfigError, match="seconds"):
        Producer(["127.0.0.1:1"], heartbeat_interval=5000)  # ms by mistake: pynsq's unit is s
    assert is_transient(errors.ConnectionClosedError("x"))
    assert not is_transient(errors.BadTopicError("E_BAD_TOPIC"))
    assert is_transient(errors.PubFailedError("E_PUB_FAILED"))


# -- several nsqd -------------------------------------------------------------------------------

def test_failover_and_retry_across_nsqd_restart() -> None:
    with NSQCluster(nsqd=2, lookupd=0) as cluster:
        topic = _topic()
        a0, a1 = cluster.nsqd_http_addresses
        with Producer(cluster.nsqd_tcp_addresses, strategy="failover", retry_wait=0.02,
                      max_tries=20, retry_deadline=20) as p:
            for i in range(50):
                p.publish(topic, b"before-%d" % i)
            assert topic_message_count(a0, topic) == 50  # the preferred one
            cluster.kill(0)
            for i in range(50):
                p.publish(topic, b"during-%d" % i)  # fails over to nsqd 1, no error
            assert topic_message_count(a1, topic) == 50
            cluster.restart(0)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and len(p.stats()["connected"]) < 2:
                p.publish(topic, b"probe")
                time.sleep(0.05)
            assert len(p.stats()["connected"]) == 2
            before = topic_message_count(a0, topic)
            p.publish(topic, b"back")
            assert topic_message_count(a0, topic) == before + 1  # back on the preferred nsqd


def test_round_robin_spreads_and_retries_when_all_down_for_a_moment() -> None:
    with NSQCluster(nsqd=2, lookupd=0) as cluster:
        topic = _topic()
        with Producer(cluster.nsqd_tcp_addresses, retry_wait=0.05, retry_max_wait=0.3,
                      max_tries=50, retry_deadline=20) as p:
            p.publish(topic, b"warm")
            deadline = time.monotonic() + 5
            while len(p.stats()["connected"]) < 2 and time.monotonic() < deadline:
                p.publish(topic, b"warm")
            for i in range(100):
                p.publish(topic, b"rr-%d" % i)
            counts = [topic_message_count(a, topic) for a in cluster.nsqd_http_addresses]
            assert min(counts) >= 40 and sum(counts) >= 101

            cluster.kill(0)
            cluster.kill(1)
            result: list[BaseException | None] = []

            def late_publish() -> None:
                try:
                    p.publish(topic, b"survivor")
                    result.append(None)
                except BaseException as exc:  # noqa: BLE001
                    result.append(exc)

            t = threading.Thread(target=late_publish)
            t.start()
            time.sleep(0.5)
            cluster.restart(1)
            t.join(25)
            assert result == [None]
        got = _consume(cluster.nsqd_tcp_addresses[1], topic, 1, timeout=10)
        assert b"survivor" in [m.body for m in got]


# -- HTTP mode ----------------------------------------------------------------------------------

def test_http_mode(nsqd: NSQCluster) -> None:
    topic = _topic()
    _create_channel(nsqd.nsqd_http_addresses[0], topic)
    with Producer(nsqd_http_addresses=nsqd.nsqd_http_addresses) as p:
        p.publish(topic, b"h1")
        p.mpublish(topic, [b"h2", b"h\n3", bytes(range(256))])
        p.publish(topic, b"h4")
        p.publish(topic, b"h5", defer_ms=60_000)
        with pytest.raises(errors.BadMessageError):
            p.publish(topic, b"z" * 5000)
        with pytest.raises(errors.InvalidNameError):
            p.publish("bad topic", b"x")
        with pytest.raises(errors.InvalidBodyError):
            p.publish(topic, b"")
    assert channel_stats(nsqd.nsqd_http_addresses[0], topic, "ch")["deferred_count"] == 1
    got = _consume(nsqd.nsqd_tcp_addresses[0], topic, 5)
    assert sorted(m.body for m in got) == sorted([b"h1", b"h2", b"h\n3", bytes(range(256)), b"h4"])

    async def main() -> None:
        p = Producer(nsqd_http_addresses=[f"http://{nsqd.nsqd_http_addresses[0]}"])
        await p.apublish(topic, b"async-http")
        await p.ampublish(topic, [b"async-http-2"])
        await p.aclose()

    run(main())
    bad = Producer(nsqd_http_addresses=[f"127.0.0.1:{free_port()}"], max_tries=2, retry_wait=0.01)
    with pytest.raises(errors.ConnectError):
        bad.publish(topic, b"x")
    bad.close()


def test_producer_with_snappy_and_deflate(nsqd: NSQCluster) -> None:
    topic = _topic()
    for opt in ({"snappy": True}, {"deflate": True, "deflate_level": 1}):
        with Producer(nsqd.nsqd_tcp_addresses, **opt) as p:
            p.mpublish(topic, [b"c" * 4000] * 10)
            p.publish(topic, b"d" * 4096)
            conn = p._sync_slot(nsqd.nsqd_tcp_addresses[0])  # the blocking calls' connection
            assert conn.snappy or conn.deflate
            assert p.publish_async(topic, b"e" * 3000).result(10) == b"OK"  # the IO thread's
            aconn = p._direct_only.tcp._conns[nsqd.nsqd_tcp_addresses[0]]
            assert aconn.snappy or aconn.deflate
    got = _consume(nsqd.nsqd_tcp_addresses[0], topic, 24)
    assert sorted(m.body for m in got) == sorted(([b"c" * 4000] * 10 + [b"d" * 4096, b"e" * 3000]) * 2)


def test_blocking_publish_when_nsqd_closes_mid_frame(nsqd: NSQCluster) -> None:
    from conn_helpers import CuttingProxy

    host, port = nsqd.nsqd_tcp_addresses[0].rsplit(":", 1)
    proxy = CuttingProxy((host, int(port)), b"PUB ")
    try:
        with Producer(f"127.0.0.1:{proxy.port}", max_tries=1) as p:
            with pytest.raises(errors.ConnectionClosedError, match="middle of a frame"):
                p.publish(_topic(), b"x" * 100)
        assert proxy.cuts == 1
    finally:
        proxy.close()


def test_futures_after_an_asyncio_run_has_ended(nsqd: NSQCluster) -> None:
    topic = _topic()
    p = Producer(nsqd.nsqd_tcp_addresses)
    run(p.apublish(topic, b"in asyncio.run"))
    assert p.publish_async(topic, b"future").result(10) == b"OK"  # moves to an IO thread
    with pytest.raises(errors.InvalidBodyError):
        p.mpublish(topic, [b"ok", 5])  # type: ignore[list-item]
    p.close()
    assert topic_message_count(nsqd.nsqd_http_addresses[0], topic) == 2


def test_blocking_publish_times_out_on_a_stopped_nsqd(nsqd: NSQCluster) -> None:
    topic = _topic()
    with Producer(nsqd.nsqd_tcp_addresses, max_tries=1, response_timeout=0.5) as p:
        p.publish(topic, b"before")
        nsqd.stop(0)  # SIGSTOP: the socket stays open, nothing answers
        try:
            t0 = time.monotonic()
            with pytest.raises(errors.NSQTimeoutError, match="0.5s"):
                p.publish(topic, b"stuck")
            assert time.monotonic() - t0 < 3
        finally:
            nsqd.resume(0)
        p.publish(topic, b"after")  # a fresh connection
    # the stuck one may or may not have been stored: NSQ publishing is at-least-once
    assert topic_message_count(nsqd.nsqd_http_addresses[0], topic) in (2, 3)


def test_blocking_threads_pipeline_and_survive_a_fatal_error(nsqd: NSQCluster) -> None:
    """16 threads share one blocking connection (answers handed out in order); one thread's
    oversized body makes nsqd close it: that thread gets BadMessageError, the others'
    commands in flight are retried, and every good message is stored."""
    topics = [_topic() for _ in range(16)]
    errs: list[BaseException] = []
    bad: list[BaseException] = []
    with Producer(nsqd.nsqd_tcp_addresses, blocking_connections=1, retry_wait=0.01) as p:
        def worker(k: int) -> None:
            try:
                for i in range(150):
                    if k == 0 and i == 75:
                        try:
                            p.publish(topics[k], b"z" * 5000)  # over --max-msg-size=4096
                        except errors.BadMessageError as exc:
                            bad.append(exc)
                    p.publish(topics[k], b"%d" % i)
            except BaseException as exc:  # noqa: BLE001
                errs.append(exc)

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert errs == [] and len(bad) == 1
    counts = [topic_message_count(nsqd.nsqd_http_addresses[0], t) for t in topics]
    # a command cut off by the close may have been stored before it: at-least-once
    assert all(150 <= c <= 152 for c in counts), counts


def test_pynsq_style_writer_with_callbacks(nsqd: NSQCluster) -> None:
    from nsq_spark.producer import Writer

    topic = _topic()
    results: list[object] = []
    errs: list[object] = []

    async def main() -> None:
        w = Writer(nsqd.nsqd_tcp_addresses)
        w.pub(topic, b"w1", callback=lambda conn, data: results.append(data))
        w.mpub(topic, [b"w2", b"w3"], callback=lambda conn, data: results.append(data))
        w.dpub(topic, 60_000, b"w4", callback=lambda conn, data: results.append(data))
        w.pub(topic, b"w5")  # no callback
        w.mpub(topic, b"w6", callback=lambda conn, data: results.append(data))  # one body
        split = Writer(nsqd.nsqd_tcp_addresses, max_mpub_bytes=64)
        split.mpub(topic, [b"s" * 40] * 3, callback=lambda conn, data: results.append(data))
        # pynsq: pub() never raises; a bad topic reaches the callback and the future
        bad = w.pub("bad topic", b"x", callback=lambda conn, data: errs.append(data))
        with pytest.raises(errors.InvalidNameError):
            await bad
        await wait_for(lambda: len(results) == 5, 10)
        await w.aclose()
        await split.aclose()

    run(main())
    assert results == [b"OK"] * 5
    assert len(errs) == 1 and isinstance(errs[0], errors.InvalidNameError)
    assert topic_message_count(nsqd.nsqd_http_addresses[0], topic) == 9
    Writer(nsqd.nsqd_tcp_addresses).pub(topic, b"outside a loop",
                                        callback=lambda conn, data: errs.append(data))
    assert isinstance(errs[1], errors.SendError) and "running event loop" in str(errs[1])


def test_writer_without_callback_logs_a_failed_publish(caplog) -> None:
    """pynsq's Writer logs a failed pub when no callback was given; it must not vanish."""
    from nsq_spark.producer import Writer

    dead = f"127.0.0.1:{free_port()}"

    async def main() -> None:
        w = Writer(dead, max_tries=1)
        w.pub("lost_topic", b"x")
        await wait_for(lambda: any(r.levelname == "ERROR" for r in caplog.records), 10)
        await w.aclose()

    with caplog.at_level("ERROR", logger="nsq_spark.producer"):
        run(main())
    errs = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert any("PUB lost_topic" in e and dead in e for e in errs), errs


# -- Producer(..., spool_dir=...) -----------------------------------------------------------

def test_spool_dir_gives_a_producer_that_delivers(nsqd: NSQCluster, tmp_path) -> None:
    topic = _topic()
    spool = tmp_path / "spool"
    p = Producer(nsqd.nsqd_tcp_addresses[0], spool_dir=str(spool), spool_fsync="never",
                 heartbeat_interval=5)  # connection options reach the inner Producer
    try:
        assert type(p) is Producer
        p.publish(topic, b"spooled-1")
        p.mpublish(topic, [b"spooled-2", b"spooled-3"])
        assert p.flush(timeout=15), "nsqd did not acknowledge the spool"
    finally:
        p.close()
    got = _consume(nsqd.nsqd_tcp_addresses[0], topic, 3)
    assert sorted(m.body for m in got) == [b"spooled-1", b"spooled-2", b"spooled-3"]
    assert not list(spool.glob("*.seg")), "acknowledged segments must be deleted"


def test_spool_options_without_spool_dir_raise_naming_the_fix(tmp_path) -> None:
    with pytest.raises(ValueError, match=r"spool_fsync only applies .*spool_dir="):
        Producer("127.0.0.1:1", spool_fsync="never")
    with pytest.raises(ValueError, match=r"message_id_digest, spool_max_bytes only apply"):
        Producer("127.0.0.1:1", spool_max_bytes=1 << 20, message_id_digest=True)
    with pytest.raises(ValueError, match="spool_dir"):
        Producer("127.0.0.1:1", spool_dir=None, spool_full="raise")
    # spool_dir belongs to Producer itself: a subclass does not silently drop it
    from nsq_spark.producer import Writer
    with pytest.raises(ValueError, match="spool_dir is an option of nsq_spark.Producer"):
        Writer("127.0.0.1:1", spool_dir=str(tmp_path))
    assert not list(tmp_path.iterdir())
    assert type(Producer("127.0.0.1:1")) is Producer  # no spool_dir: a plain Producer
