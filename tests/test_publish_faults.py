"""Publishing against a real nsqd that fails: a SIGKILL and restart of about 2 s must cost
no raised publish and no lost body (the retry budget is retry_deadline); an oversize body
is BadMessageError at once, every time, blocking and async (nsqd's error frame is read
before the reset); a TLS certificate failure, over TCP+TLS and HTTPS, is raised at once,
not retried."""

from __future__ import annotations

import concurrent.futures
import threading
import time
import uuid
from typing import Iterator

import pytest

from conn_helpers import publish_by, run, wait_for
from conn_tls_helpers import Certs, make_certs
from nsq_spark import Producer, errors
from nsq_spark._conn import Connection
from nsq_spark.message import Message
from nsq_spark.testing import NSQCluster

pytestmark = [pytest.mark.nsqd, pytest.mark.timeout(120)]


def _topic() -> str:
    return "f" + uuid.uuid4().hex[:12]


def _bodies_in(addr: str, topic: str, expected: int, timeout: float = 30.0) -> set[bytes]:
    """Every body nsqd holds for ``topic`` (read with our own connection, FIN each)."""
    async def main() -> set[bytes]:
        got: list[Message] = []
        host, port = addr.rsplit(":", 1)
        conn = Connection(host, int(port), on_messages=lambda c, m: got.extend(m))
        await conn.connect()
        await conn.subscribe(topic, "ch")
        conn.send_rdy(2000)
        await wait_for(lambda: len({m.body for m in got}) >= expected, timeout,
                       f"{expected} distinct bodies")
        for m in got:
            m.finish()
        await conn.close()
        return {m.body for m in got}

    return run(main(), timeout + 10)


def test_a_2s_nsqd_restart_costs_no_raised_publish_and_no_body() -> None:
    # mem_queue_size=0 and sync_every=1: nsqd acknowledges a message once it is on disk
    # with its queue's metadata, so a SIGKILL loses none it acknowledged
    with NSQCluster(nsqd=1, lookupd=0, mem_queue_size=0, sync_every=1) as cluster:
        addr = cluster.nsqd_tcp_addresses[0]
        topic = _topic()
        raised: list[BaseException] = []
        sent: list[bytes] = []
        futures: list[tuple[bytes, concurrent.futures.Future[bytes]]] = []
        restarted = threading.Event()

        with Producer(addr) as p:    # the defaults: that is what is tested
            p.publish(topic, b"warm-up")
            sent.append(b"warm-up")

            def publishing() -> None:
                # bounded: until 200 rounds after the restart, at most 40 s / 5,000 rounds
                after = i = 0
                deadline = time.monotonic() + 40
                while after < 200 and time.monotonic() < deadline and i < 5_000:
                    body = b"b-%d" % i
                    try:
                        p.publish(topic, body)
                        sent.append(body)
                    except Exception as exc:  # noqa: BLE001 - counted: there must be none
                        raised.append(exc)
                    abody = b"a-%d" % i
                    futures.append((abody, p.publish_async(topic, abody)))
                    i += 1
                    if restarted.is_set():
                        after += 1
                    time.sleep(0.002)

            # the harness's processes die with the thread that started them: the outage
            # is driven from this (the main) thread, the publishing from another
            t = threading.Thread(target=publishing)
            t.start()
            time.sleep(0.5)
            cluster.kill(0)          # SIGKILL by pid
            time.sleep(2.0)
            cluster.restart(0)       # same ports, same data dir
            restarted.set()
            t.join(60)
            assert not t.is_alive()
            for abody, fut in futures:
                try:
                    fut.result(40)
                    sent.append(abody)
                except Exception as exc:  # noqa: BLE001
                    raised.append(exc)
            retries = p.stats()["retries"]
        assert raised == []
        assert retries > 0                   # the outage was felt, and ridden out
        got = _bodies_in(addr, topic, len(set(sent)))
        assert set(sent) <= got


def test_an_oversize_body_is_bad_message_at_once_blocking_and_async() -> None:
    with NSQCluster(nsqd=1, lookupd=0) as cluster:    # nsqd's default --max-msg-size 1 MiB
        topic = _topic()
        big = b"x" * (8 << 20)
        with Producer(cluster.nsqd_tcp_addresses[0]) as p:
            for path in ("blocking", "async"):
                for _ in range(10):
                    t0 = time.monotonic()
                    with pytest.raises(errors.BadMessageError, match="too big"):
                        if path == "blocking":
                            p.publish(topic, big)
                        else:
                            p.publish_async(topic, big).result(30)
                    assert time.monotonic() - t0 < 2
            assert p.stats()["retries"] == 0       # refused, not retried
            p.publish(topic, b"fine")              # and the producer goes on


def test_commands_behind_an_oversize_one_are_retried_not_refused() -> None:
    with NSQCluster(nsqd=1, lookupd=0) as cluster:
        topic = _topic()
        with Producer(cluster.nsqd_tcp_addresses[0]) as p:
            p.publish_async(topic, b"warm").result(10)
            bad = p.publish_async(topic, b"x" * (8 << 20))
            good = [p.publish_async(topic, b"ok-%d" % i) for i in range(20)]
            with pytest.raises(errors.BadMessageError):
                bad.result(30)
            for f in good:
                assert f.result(30) == b"OK"


# -- TLS certificate failures: permanent -------------------------------------------------------

@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def tls_nsqd(certs: Certs) -> Iterator[NSQCluster]:
    with NSQCluster(nsqd=1, lookupd=0, tls_cert=str(certs.server_cert),
                    tls_key=str(certs.server_key)) as cluster:
        yield cluster


@pytest.mark.parametrize("path", ["blocking", "future", "asyncio"])
def test_an_untrusted_certificate_over_tcp_tls_is_raised_at_once(
        tls_nsqd: NSQCluster, certs: Certs, path: str) -> None:
    p = Producer(tls_nsqd.nsqd_tcp_addresses[0], tls_v1=True, tls_ca_file=str(certs.other_ca))
    t0 = time.monotonic()
    try:
        with pytest.raises(errors.TLSError, match="certificate"):
            publish_by(p, path, _topic(), b"x", 30)
        assert p.stats()["retries"] == 0
        assert time.monotonic() - t0 < 3
    finally:
        p.close()


def test_an_untrusted_certificate_over_https_is_raised_at_once(
        tls_nsqd: NSQCluster, certs: Certs) -> None:
    node = tls_nsqd.nsqds[0]
    with Producer(nsqd_http_addresses=f"https://127.0.0.1:{node.https_port}",
                  tls_ca_file=str(certs.other_ca)) as p:
        t0 = time.monotonic()
        with pytest.raises(errors.TLSError, match="certificate"):
            p.publish(_topic(), b"x")
        assert p.stats()["retries"] == 0
        assert time.monotonic() - t0 < 3
    with Producer(nsqd_http_addresses=f"https://127.0.0.1:{node.https_port}",
                  tls_ca_file=str(certs.ca)) as ok:
        ok.publish(_topic(), b"trusted")         # the same server, the right CA: works
