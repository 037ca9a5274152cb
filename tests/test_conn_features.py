"""Feature negotiation against real nsqd: TLS (generated certificates, verification on),
snappy and deflate (1 byte to 1 MiB), AUTH against a small HTTP auth server."""

from __future__ import annotations

import asyncio
import socket
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from conn_helpers import run, wait_for
from conn_tls_helpers import AuthServer, Certs, auth_server, make_certs
from nsq_spark import errors
from nsq_spark.config import ConnectionConfig
from nsq_spark._conn import Connection
from nsq_spark.message import Message
from nsq_spark.testing import NSQCluster, NsqdNode, find_binary

pytestmark = pytest.mark.nsqd

SIZES = [1, 100, 4095, 65535, 65536, 65537, 300_001, 1024 * 1024]


def _hp(addr: str) -> tuple[str, int]:
    host, port = addr.rsplit(":", 1)
    return host, int(port)


def _topic() -> str:
    return "t" + uuid.uuid4().hex[:12]


def _bodies() -> list[bytes]:
    # compressible and incompressible content at each size
    out = []
    for i, n in enumerate(SIZES):
        pattern = (b"nsq-%d-" % i) * (n // 6 + 1)
        out.append(pattern[:n] if i % 2 else bytes((j * 7919 + i) % 251 for j in range(n)))
    return out


async def _roundtrip(pub_addr: str, sub_addr: str, pub_cfg: ConnectionConfig,
                     sub_cfg: ConnectionConfig, bodies: list[bytes]) -> tuple[Connection, Connection, list[Message]]:
    topic = _topic()
    got: list[Message] = []
    pub = Connection(*_hp(pub_addr), pub_cfg)
    await pub.connect()
    for b in bodies:
        assert await pub.pub(topic, b) == b"OK"
    assert await pub.mpub(topic, bodies[:4]) == b"OK"
    sub = Connection(*_hp(sub_addr), sub_cfg, on_messages=lambda c, m: got.extend(m))
    await sub.connect()
    await sub.subscribe(topic, "ch")
    sub.send_rdy(100)
    await wait_for(lambda: len(got) >= len(bodies) + len(bodies[:4]), timeout=20, what="all messages")
    for m in got:
        m.finish()
    await pub.close()
    await sub.close()
    return pub, sub, got


# -- TLS ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def tls_nsqd(certs: Certs) -> Iterator[NSQCluster]:
    with NSQCluster(nsqd=1, lookupd=0, tls_cert=str(certs.server_cert),
                    tls_key=str(certs.server_key), tls_required="tcp-https") as cluster:
        yield cluster


def test_tls_with_ca_file_verifies_and_carries_messages(tls_nsqd: NSQCluster, certs: Certs) -> None:
    addr = tls_nsqd.nsqd_tcp_addresses[0]
    cfg = ConnectionConfig(tls_v1=True, tls_ca_file=str(certs.ca))
    bodies = _bodies()[:5]
    pub, sub, got = run(_roundtrip(addr, addr, cfg, cfg, bodies))
    assert pub.tls and sub.tls
    assert sorted(m.body for m in got) == sorted(bodies + bodies[:4])


def test_tls_pynsq_style_tls_options(tls_nsqd: NSQCluster, certs: Certs) -> None:
    cfg = ConnectionConfig.from_options(tls_v1=True, tls_options={"ca_certs": str(certs.ca)})

    async def main() -> None:
        conn = await Connection(*_hp(tls_nsqd.nsqd_tcp_addresses[0]), cfg).connect()
        assert conn.tls
        assert await conn.pub(_topic(), b"x") == b"OK"
        await conn.close()

    run(main())


@pytest.mark.parametrize("codec", ["snappy", "deflate"])
def test_tls_plus_compression(tls_nsqd: NSQCluster, certs: Certs, codec: str) -> None:
    addr = tls_nsqd.nsqd_tcp_addresses[0]
    cfg = ConnectionConfig(tls_v1=True, tls_ca_file=str(certs.ca), **{codec: True})
    bodies = [_bodies()[i] for i in (0, 3, 7)]
    pub, sub, got = run(_roundtrip(addr, addr, cfg, cfg, bodies))
    assert sub.tls and getattr(sub, codec)
    assert sorted(m.body for m in got) == sorted(bodies + bodies)


def test_tls_refused_when_certificate_not_trusted(tls_nsqd: NSQCluster, certs: Certs) -> None:
    cfg = ConnectionConfig(tls_v1=True, tls_ca_file=str(certs.other_ca))

    async def main() -> None:
        with pytest.raises(errors.TLSError, match="certificate"):
            await Connection(*_hp(tls_nsqd.nsqd_tcp_addresses[0]), cfg).connect()

    run(main())


def test_tls_verification_can_be_turned_off(tls_nsqd: NSQCluster) -> None:
    async def main() -> None:
        conn = await Connection(*_hp(tls_nsqd.nsqd_tcp_addresses[0]),
                                ConnectionConfig(tls_v1=True, tls_verify=False)).connect()
        assert conn.tls
        await conn.close()

    run(main())


def test_tls_required_by_nsqd_but_not_requested(tls_nsqd: NSQCluster) -> None:
    async def main() -> None:
        conn = await Connection(*_hp(tls_nsqd.nsqd_tcp_addresses[0])).connect()
        with pytest.raises(errors.InvalidError, match="tls_v1=True"):
            await conn.pub(_topic(), b"x")
        await conn.wait_closed()

    run(main())


def test_tls_requested_but_nsqd_has_none() -> None:
    with NSQCluster(nsqd=1, lookupd=0) as cluster:
        async def main() -> None:
            with pytest.raises(errors.TLSError, match="does not offer TLS"):
                await Connection(*_hp(cluster.nsqd_tcp_addresses[0]),
                                 ConnectionConfig(tls_v1=True)).connect()

        run(main())


def test_tls_client_certificate(certs: Certs, tmp_path: Path) -> None:
    # --tls-client-auth-policy makes nsqd refuse plain HTTP too, so the harness's HTTP
    # readiness probe cannot work: start the node with a TCP probe instead
    node = NsqdNode(0, find_binary("nsqd"), tmp_path, [], {
        "tls_cert": str(certs.server_cert), "tls_key": str(certs.server_key),
        "tls_root_ca_file": str(certs.ca), "tls_client_auth_policy": "require-verify"})
    node._ready_probe = lambda: _tcp_open(node.tcp_port)
    node.start()
    try:
        addr = _hp(node.tcp_address)

        async def main() -> None:
            ok = await Connection(*addr, ConnectionConfig(
                tls_v1=True, tls_ca_file=str(certs.ca), tls_cert_file=str(certs.client_cert),
                tls_key_file=str(certs.client_key))).connect()
            assert await ok.pub(_topic(), b"x") == b"OK"
            await ok.close()
            with pytest.raises(errors.TLSError):
                await Connection(*addr, ConnectionConfig(tls_v1=True, tls_ca_file=str(certs.ca))
                                 ).connect()

        run(main())
    finally:
        node.kill()


def _tcp_open(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        return True
    except OSError:
        return False


# -- compression ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def plain_nsqd() -> Iterator[NSQCluster]:
    with NSQCluster(nsqd=1, lookupd=0, snappy=True, deflate=True, max_deflate_level=6) as cluster:
        yield cluster


@pytest.mark.parametrize("pub_codec,sub_codec", [("snappy", "snappy"), ("deflate", "deflate"),
                                                 (None, "snappy"), ("deflate", None)])
def test_compression_1_byte_to_1_mib(plain_nsqd: NSQCluster, pub_codec: str | None,
                                     sub_codec: str | None) -> None:
    addr = plain_nsqd.nsqd_tcp_addresses[0]
    pcfg = ConnectionConfig(**({pub_codec: True} if pub_codec else {}))
    scfg = ConnectionConfig(**({sub_codec: True} if sub_codec else {}))
    bodies = _bodies()
    pub, sub, got = run(_roundtrip(addr, addr, pcfg, scfg, bodies), timeout=60)
    if pub_codec:
        assert getattr(pub, pub_codec)
    if sub_codec:
        assert getattr(sub, sub_codec)
    assert sorted(m.body for m in got) == sorted(bodies + bodies[:4])


@pytest.mark.parametrize("codec", ["snappy", "deflate"])
def test_decompression_is_bounded_per_step_and_loses_nothing(plain_nsqd: NSQCluster,
                                                             codec: str) -> None:
    """max_frame_size bounds what one decompress step may produce: 300 compressible
    messages (one read expands far past 8 KiB) still arrive whole, in several steps."""
    addr = plain_nsqd.nsqd_tcp_addresses[0]
    bodies = [bytes([i % 7]) * 3000 for i in range(300)]
    topic = _topic()
    got: list[Message] = []
    steps: list[int] = []

    async def main() -> None:
        pub = await Connection(*_hp(addr)).connect()
        assert await pub.mpub(topic, bodies) == b"OK"
        sub = Connection(*_hp(addr), ConnectionConfig(**{codec: True}, max_frame_size=8192),
                         on_messages=lambda c, m: (got.extend(m), steps.append(len(m))))
        await sub.connect()
        await sub.subscribe(topic, "ch")
        sub.send_rdy(300)
        await wait_for(lambda: len(got) >= 300, timeout=20, what="all messages")
        for m in got:
            m.finish()
        await pub.close()
        await sub.close()

    run(main(), timeout=60)
    assert sorted(m.body for m in got) == sorted(bodies)
    # a step is the partial frame held back plus 8 KiB (snappy: plus one 64 KiB chunk):
    # a few 3 KiB messages; unbounded, one read carried them all
    assert max(steps) <= (3 if codec == "deflate" else 25)


def test_deflate_level_clamped_by_nsqd(plain_nsqd: NSQCluster) -> None:
    async def main() -> None:
        conn = await Connection(*_hp(plain_nsqd.nsqd_tcp_addresses[0]),
                                ConnectionConfig(deflate=True, deflate_level=9)).connect()
        assert conn.deflate and conn.deflate_level == 6
        assert conn.identify_response["max_deflate_level"] == 6
        assert await conn.pub(_topic(), b"z" * 10000) == b"OK"
        await conn.close()

    run(main())


def test_compression_refused_by_nsqd_falls_back_to_plain() -> None:
    with NSQCluster(nsqd=1, lookupd=0, snappy="false", deflate="false") as cluster:
        async def main() -> None:
            conn = await Connection(*_hp(cluster.nsqd_tcp_addresses[0]),
                                    ConnectionConfig(snappy=True)).connect()
            assert not conn.snappy
            assert await conn.pub(_topic(), b"x") == b"OK"
            await conn.close()

        run(main())


# -- AUTH ---------------------------------------------------------------------------------------

AUTH_GRANTS = {
    "good-secret": {"ttl": 60, "identity": "tester", "identity_url": "",
                    "authorizations": [{"topic": ".*", "channels": [".*"],
                                        "permissions": ["subscribe", "publish"]}]},
    "limited-secret": {"ttl": 60, "identity": "limited", "authorizations": [
        {"topic": "^allowed.*", "channels": [".*"], "permissions": ["publish"]}]},
}


@pytest.fixture(scope="module")
def auth() -> Iterator[AuthServer]:
    with auth_server(AUTH_GRANTS) as server:
        yield server


@pytest.fixture(scope="module")
def auth_nsqd(auth: AuthServer) -> Iterator[NSQCluster]:
    with NSQCluster(nsqd=1, lookupd=0, auth_http_address=auth.address) as cluster:
        yield cluster


def test_auth_allowed(auth_nsqd: NSQCluster, auth: AuthServer) -> None:
    addr = auth_nsqd.nsqd_tcp_addresses[0]
    cfg = ConnectionConfig(auth_secret="good-secret")
    pub, sub, got = run(_roundtrip(addr, addr, cfg, cfg, [b"secret stuff"]))
    assert sub.auth_required and sub.auth_response["identity"] == "tester"
    assert sub.auth_response["permission_count"] == 1  # one authorization entry
    assert sorted(m.body for m in got) == [b"secret stuff"] * 2
    assert "good-secret" not in repr(cfg)
    assert any(q.get("secret") == "good-secret" for q in auth.seen)


def test_auth_refused(auth_nsqd: NSQCluster) -> None:
    async def main() -> None:
        with pytest.raises(errors.AuthFailedError, match="E_AUTH_FAILED"):
            await Connection(*_hp(auth_nsqd.nsqd_tcp_addresses[0]),
                             ConnectionConfig(auth_secret="wrong")).connect()

    run(main())


def test_auth_required_but_no_secret(auth_nsqd: NSQCluster) -> None:
    async def main() -> None:
        with pytest.raises(errors.AuthError, match="auth_secret"):
            await Connection(*_hp(auth_nsqd.nsqd_tcp_addresses[0])).connect()

    run(main())


def test_auth_unauthorized_topic(auth_nsqd: NSQCluster) -> None:
    async def main() -> None:
        conn = await Connection(*_hp(auth_nsqd.nsqd_tcp_addresses[0]),
                                ConnectionConfig(auth_secret="limited-secret")).connect()
        assert await conn.pub("allowed_topic", b"x") == b"OK"
        with pytest.raises(errors.UnauthorizedError, match="E_UNAUTHORIZED"):
            await conn.pub("forbidden_topic", b"x")
        await conn.wait_closed()

    run(main())


# -- the blocking connection (Producer's blocking calls) has its own handshake -------------------

def test_blocking_producer_over_tls_and_compression(tls_nsqd: NSQCluster, certs: Certs) -> None:
    from nsq_spark.producer import Producer

    addr = tls_nsqd.nsqd_tcp_addresses[0]
    topic = _topic()
    bodies = [_bodies()[i] for i in (0, 3, 7)]
    for extra in ({}, {"snappy": True}, {"deflate": True}):
        with Producer(addr, tls_v1=True, tls_ca_file=str(certs.ca), **extra) as p:
            for b in bodies:
                p.publish(topic, b)
            p.mpublish(topic, bodies)
            conn = p._sync_slot(addr)
            assert conn.tls and all(getattr(conn, k) for k in extra)

    async def read() -> list[Message]:
        got: list[Message] = []
        sub = Connection(*_hp(addr), ConnectionConfig(tls_v1=True, tls_ca_file=str(certs.ca)),
                         on_messages=lambda c, m: got.extend(m))
        await sub.connect()
        await sub.subscribe(topic, "ch")
        sub.send_rdy(100)
        await wait_for(lambda: len(got) >= 18, timeout=20)
        for m in got:
            m.finish()
        await sub.close()
        return got

    assert sorted(m.body for m in run(read())) == sorted(bodies * 6)


def test_blocking_producer_tls_refused(tls_nsqd: NSQCluster, certs: Certs) -> None:
    from nsq_spark.producer import Producer

    with Producer(tls_nsqd.nsqd_tcp_addresses, tls_v1=True, tls_ca_file=str(certs.other_ca)) as p:
        with pytest.raises(errors.TLSError, match="certificate"):
            p.publish(_topic(), b"x")
    with Producer(tls_nsqd.nsqd_tcp_addresses) as p:  # nsqd requires TLS, none asked
        with pytest.raises(errors.InvalidError, match="tls_v1=True"):
            p.publish(_topic(), b"x")
    missing = "/nonexistent/nsq-ca.pem"  # told with its option and path (ssl names none)
    with Producer(tls_nsqd.nsqd_tcp_addresses, tls_v1=True, tls_ca_file=missing) as p:
        with pytest.raises(errors.TLSError, match=f"tls_ca_file '{missing}' cannot be read"):
            p.publish(_topic(), b"x")


def test_blocking_producer_auth(auth_nsqd: NSQCluster) -> None:
    from nsq_spark.producer import Producer

    addr = auth_nsqd.nsqd_tcp_addresses
    with Producer(addr, auth_secret="good-secret") as p:
        p.publish(_topic(), b"x")
        assert p._sync_slot(addr[0]).auth_response["identity"] == "tester"
    with Producer(addr, auth_secret="wrong") as p:
        with pytest.raises(errors.AuthFailedError):
            p.publish(_topic(), b"x")
    with Producer(addr) as p:
        with pytest.raises(errors.AuthError, match="auth_secret"):
            p.publish(_topic(), b"x")
    with Producer(addr, auth_secret="limited-secret") as p:
        p.publish("allowed_x", b"x")
        with pytest.raises(errors.UnauthorizedError):
            p.publish("forbidden_x", b"x")
        p.publish("allowed_y", b"x")  # reconnects after the fatal error


def test_blocking_connection_reopened_after_heartbeat_silence(plain_nsqd: NSQCluster) -> None:
    import time

    from nsq_spark.producer import Producer

    with Producer(plain_nsqd.nsqd_tcp_addresses, heartbeat_interval=1) as p:
        p.publish(_topic(), b"x")
        first = p._sync_slot(plain_nsqd.nsqd_tcp_addresses[0])._sock
        time.sleep(2.3)  # nsqd drops a client silent for two heartbeat intervals
        p.publish(_topic(), b"y")  # reopened before use, no error
        assert p._sync_slot(plain_nsqd.nsqd_tcp_addresses[0])._sock is not first
        assert p.published == 2


def test_auth_secret_never_in_logs_reprs_errors_or_stats(auth_nsqd: NSQCluster, caplog) -> None:
    import logging

    from nsq_spark.producer import Producer
    from nsq_spark.reader import Reader

    good, bad = "good-secret", "wrong-s3cret-never-shown"
    addr = auth_nsqd.nsqd_tcp_addresses[0]
    seen: list[str] = []
    caplog.set_level(logging.DEBUG)
    with Producer(addr, auth_secret=good, max_tries=1) as p:
        p.publish("secret_topic", b"x")
        seen += [repr(p), repr(p.stats()), repr(p.config)]
    with Producer(addr, auth_secret=bad, max_tries=1) as p:
        with pytest.raises(errors.AuthError) as info:
            p.publish("secret_topic", b"x")
        seen += [str(info.value), repr(info.value), repr(p), repr(p.stats())]

    async def main() -> None:
        got: list[bytes] = []
        r = Reader("secret_topic", "c", lambda m: got.append(m.body), nsqd_tcp_addresses=addr,
                   auth_secret=good)
        await wait_for(lambda: got, 10, "a message")
        seen.extend([repr(r), repr(r.stats()), repr(r.config), repr(list(r.conns.values()))])
        await r.aclose()
        r2 = Reader("secret_topic", "c", lambda m: True, nsqd_tcp_addresses=addr,
                    auth_secret=bad, reconnect_initial=0.05)
        await wait_for(lambda: any("E_AUTH_FAILED" in rec.getMessage() for rec in caplog.records),
                       10, "the refused AUTH logged")
        seen.extend([repr(r2), repr(r2.stats())])
        await r2.aclose()
    run(main())
    for rec in caplog.records:
        seen.append(rec.getMessage())
        if rec.exc_info:
            seen.append(logging.Formatter().formatException(rec.exc_info))
    assert seen and not [s for s in seen if good in s or bad in s]


def test_reader_refused_sub_keeps_one_reconnect_loop(auth_nsqd: NSQCluster) -> None:
    """nsqd refuses SUB (E_UNAUTHORIZED, fatal) after a good handshake: the Reader retries
    with backoff, in ONE reconnect loop (the closed connection's callback used to start a
    second loop next to the retrying one, at every failure: the loops doubled)."""
    from nsq_spark.reader import Reader

    async def main() -> list[int]:
        r = Reader("allowed_sub", "c", lambda m: True,
                   nsqd_tcp_addresses=auth_nsqd.nsqd_tcp_addresses,
                   auth_secret="limited-secret", reconnect_initial=0.02, reconnect_max=0.1)
        loops = []
        for _ in range(40):  # ~2 s: a dozen refused attempts
            await asyncio.sleep(0.05)
            loops.append(sum(1 for t in r._tasks if not t.done() and getattr(
                t.get_coro(), "__name__", "") == "_keep_connected"))
        await r.aclose()
        return loops
    loops = run(main())
    assert max(loops) == 1, loops
