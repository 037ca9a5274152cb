"""Connection against a real nsqd over plain TCP: handshake, SUB/RDY, bulk delivery,
FIN/REQ/TOUCH, heartbeats, CLS, typed errors."""

from __future__ import annotations

import asyncio
import socket
import uuid
from typing import Any, Iterator

import pytest

from conn_helpers import channel_stats, run, wait_for
from nsq_spark import errors
from nsq_spark.config import ConnectionConfig
from nsq_spark._conn import Connection, ConnState
from nsq_spark.message import Message
from nsq_spark.testing import NSQCluster, free_port, publish

pytestmark = pytest.mark.nsqd


@pytest.fixture(scope="module")
def nsqd() -> Iterator[NSQCluster]:
    with NSQCluster(nsqd=1, lookupd=0, msg_timeout="3s") as cluster:
        yield cluster


def _hostport(addr: str) -> tuple[str, int]:
    host, port = addr.rsplit(":", 1)
    return host, int(port)


def _topic() -> str:
    return "t" + uuid.uuid4().hex[:12]


class Collector:
    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.chunks = 0
        self.closed: list[BaseException | None] = []
        self.errors: list[errors.NSQServerError] = []
        self.heartbeats = 0

    def kwargs(self) -> dict[str, Any]:
        return dict(on_messages=self.on_messages, on_close=self.on_close,
                    on_error=self.on_error, on_heartbeat=self.on_heartbeat)

    def on_messages(self, conn: Connection, msgs: list[Message]) -> None:
        self.chunks += 1
        self.messages.extend(msgs)

    def on_close(self, conn: Connection, exc: BaseException | None) -> None:
        self.closed.append(exc)

    def on_error(self, conn: Connection, exc: errors.NSQServerError) -> None:
        self.errors.append(exc)

    def on_heartbeat(self, conn: Connection) -> None:
        self.heartbeats += 1


def test_identify_negotiates_and_obeys_answer(nsqd: NSQCluster) -> None:
    async def main() -> None:
        conn = Connection(*_hostport(nsqd.nsqd_tcp_addresses[0]),
                          ConnectionConfig(msg_timeout=2, client_id="cid-1",
                                           user_agent="ua/1.0", output_buffer_timeout=50,
                                           sample_rate=0))
        await conn.connect()
        assert conn.identify_response["max_rdy_count"] == 2500 == conn.max_rdy_count
        assert conn.msg_timeout == 2000
        assert conn.max_msg_timeout == conn.identify_response["max_msg_timeout"] > 0
        assert conn.output_buffer_timeout == 50
        assert conn.nsqd_version == "1.3.0"
        assert not (conn.tls or conn.snappy or conn.deflate or conn.auth_required)
        assert conn.address == nsqd.nsqd_tcp_addresses[0]
        await conn.close()
        assert conn.closed

    run(main())


def test_subscribe_rdy_bulk_delivery_and_fin(nsqd: NSQCluster) -> None:
    topic = _topic()
    bodies = [b"msg-%d" % i for i in range(500)]
    publish(nsqd.nsqd_http_addresses[0], topic, bodies)

    async def main() -> None:
        col = Collector()
        conn = Connection(*_hostport(nsqd.nsqd_tcp_addresses[0]), ConnectionConfig(),
                          **col.kwargs())
        await conn.connect()
        assert await conn.subscribe(topic, "ch") == b"OK"
        conn.send_rdy(1000)
        await wait_for(lambda: len(col.messages) == 500, what="500 messages")
        assert col.chunks < 500  # bulk: several messages per callback
        assert [m.body for m in col.messages] == bodies
        assert all(m.attempts == 1 and len(m.id) == 16 for m in col.messages)
        assert all(m.nsqd_address == conn.address for m in col.messages)
        assert channel_stats(nsqd.nsqd_http_addresses[0], topic, "ch")["in_flight_count"] == 500
        for m in col.messages[:250]:
            m.finish()
        conn.fin_many([m.id for m in col.messages[250:]])
        await wait_for(lambda: channel_stats(nsqd.nsqd_http_addresses[0], topic, "ch")
                       .get("in_flight_count") == 0, what="in-flight 0")
        stats = channel_stats(nsqd.nsqd_http_addresses[0], topic, "ch")
        assert stats["depth"] == 0 and stats["message_count"] == 500
        await conn.close()
        assert col.closed == [None]
        assert col.errors == []

    run(main())


def test_req_redelivers_and_touch_extends(nsqd: NSQCluster) -> None:
    topic = _topic()
    publish(nsqd.nsqd_http_addresses[0], topic, [b"a", b"b"])

    async def main() -> None:
        col = Collector()
        conn = Connection(*_hostport(nsqd.nsqd_tcp_addresses[0]),
                          ConnectionConfig(msg_timeout=1), **col.kwargs())
        await conn.connect()
        await conn.subscribe(topic, "ch")
        conn.send_rdy(10)
        await wait_for(lambda: len(col.messages) == 2)
        a, b = sorted(col.messages, key=lambda m: m.body)
        a.requeue(0)
        await wait_for(lambda: len(col.messages) == 3, what="redelivery")
        again = col.messages[2]
        assert again.id == a.id and again.body == b"a" and again.attempts == 2
        again.finish()
        # keep b alive past its 1 s timeout by touching it
        for _ in range(5):
            await asyncio.sleep(0.4)
            b.touch()
        b.finish()
        await asyncio.sleep(0.2)
        stats = channel_stats(nsqd.nsqd_http_addresses[0], topic, "ch")
        assert stats["timeout_count"] == 0
        assert stats["requeue_count"] == 1
        assert len(col.messages) == 3  # b was never redelivered
        await conn.close()

    run(main())


def test_heartbeats_answered_and_connection_survives(nsqd: NSQCluster) -> None:
    async def main() -> None:
        col = Collector()
        conn = Connection(*_hostport(nsqd.nsqd_tcp_addresses[0]),
                          ConnectionConfig(heartbeat_interval=1), **col.kwargs())
        await conn.connect()
        await conn.subscribe(_topic(), "ch")
        # nsqd drops a client that stays silent for two intervals; three heartbeats
        # answered with NOP prove the connection is kept alive
        await wait_for(lambda: col.heartbeats >= 3, timeout=6, what="3 heartbeats")
        assert not conn.closed and col.closed == []
        await conn.close()
        assert col.closed == [None]

    run(main())


def test_cls_gets_close_wait_and_in_flight_can_still_finish(nsqd: NSQCluster) -> None:
    topic = _topic()
    publish(nsqd.nsqd_http_addresses[0], topic, [b"x"])

    async def main() -> None:
        col = Collector()
        conn = Connection(*_hostport(nsqd.nsqd_tcp_addresses[0]), **col.kwargs())
        await conn.connect()
        await conn.subscribe(topic, "ch")
        conn.send_rdy(1)
        await wait_for(lambda: len(col.messages) == 1)
        assert await conn.send_cls() == b"CLOSE_WAIT"
        col.messages[0].finish()
        await conn.close()
        assert col.closed == [None] and col.errors == []
        # nsqd handles the FIN a moment later; well before the 3 s message timeout
        await wait_for(lambda: channel_stats(nsqd.nsqd_http_addresses[0], topic, "ch")
                       ["in_flight_count"] == 0, timeout=2, what="FIN processed")
        stats = channel_stats(nsqd.nsqd_http_addresses[0], topic, "ch")
        assert stats["depth"] == 0 and stats["requeue_count"] == 0 and stats["timeout_count"] == 0

    run(main())


def test_non_fatal_error_keeps_connection_and_fatal_closes_it(nsqd: NSQCluster) -> None:
    async def main() -> None:
        col = Collector()
        conn = Connection(*_hostport(nsqd.nsqd_tcp_addresses[0]), **col.kwargs())
        await conn.connect()
        await conn.subscribe(_topic(), "ch")
        conn.fin(b"0123456789abcdef")  # unknown id: E_FIN_FAILED, non-fatal
        await wait_for(lambda: len(col.errors) == 1)
        assert isinstance(col.errors[0], errors.FinFailedError) and not col.errors[0].fatal
        await asyncio.sleep(0.1)
        assert not conn.closed
        conn.send(b"FIN short\n")  # malformed id: E_INVALID, fatal
        await wait_for(lambda: col.closed != [], what="close")
        assert isinstance(col.closed[0], errors.InvalidError)
        assert conn.closed

    run(main())


def test_client_side_validation(nsqd: NSQCluster) -> None:
    async def main() -> None:
        col = Collector()
        conn = Connection(*_hostport(nsqd.nsqd_tcp_addresses[0]), **col.kwargs())
        await conn.connect()
        with pytest.raises(errors.InvalidNameError):
            conn.subscribe("bad topic", "ch")
        with pytest.raises(errors.InvalidNameError):
            conn.subscribe("t", "c" * 65)
        await conn.subscribe(_topic(), "ch#ephemeral")
        with pytest.raises(ValueError, match="max_rdy_count"):
            conn.send_rdy(conn.max_rdy_count + 1)
        await conn.close()

    run(main())


def test_unreachable_address_is_connect_error() -> None:
    port = free_port()  # nothing listens there

    async def main() -> None:
        with pytest.raises(errors.ConnectError, match=f"127.0.0.1:{port}"):
            await Connection("127.0.0.1", port).connect()

    run(main())


def test_unknown_option_is_config_error() -> None:
    with pytest.raises(errors.ConfigError, match="heartbeat_interval"):
        Connection("127.0.0.1", 1, heartbeat_intervall=1)
    with pytest.raises(errors.ConfigError):
        ConnectionConfig(snappy=True, deflate=True)


async def _cutting_proxy(target: tuple[str, int]) -> tuple[asyncio.AbstractServer, int]:
    """Forwards to nsqd; once the client has sent RDY, passes on half of the next chunk
    from nsqd and closes both sides: nsqd 'closes mid-frame'."""

    async def handle(cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        sr, sw = await asyncio.open_connection(*target)
        rdy_seen = asyncio.Event()

        async def up() -> None:
            while data := await cr.read(65536):
                if b"RDY" in data:
                    rdy_seen.set()
                sw.write(data)

        async def down() -> None:
            while data := await sr.read(65536):
                if rdy_seen.is_set() and len(data) > 20:
                    cw.write(data[: len(data) // 2])
                    await cw.drain()
                    cw.close()
                    sw.close()
                    return
                cw.write(data)

        task = asyncio.ensure_future(up())
        try:
            await down()
        finally:
            task.cancel()
            cw.close()
            sw.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


def test_server_closing_mid_frame_is_typed_error(nsqd: NSQCluster) -> None:
    topic = _topic()
    publish(nsqd.nsqd_http_addresses[0], topic, [b"y" * 5000])

    async def main() -> None:
        server, port = await _cutting_proxy(_hostport(nsqd.nsqd_tcp_addresses[0]))
        col = Collector()
        conn = Connection("127.0.0.1", port, **col.kwargs())
        await conn.connect()
        await conn.subscribe(topic, "ch")
        conn.send_rdy(1)
        await wait_for(lambda: col.closed != [], what="close")
        assert isinstance(col.closed[0], errors.ConnectionClosedError)
        assert "middle of a frame" in str(col.closed[0])
        assert col.messages == []
        server.close()

    run(main())


def test_handshake_against_non_nsq_server_fails_typed() -> None:
    """A server that answers garbage (not NSQ) gives a ProtocolError, not a hang."""
    async def main() -> None:
        async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            await r.read(100)
            w.write(b"HTTP/1.1 400 Bad Request\r\n\r\n")
            await w.drain()
            w.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        with pytest.raises((errors.ProtocolError, errors.ConnectionClosedError)):
            await Connection("127.0.0.1", port).connect()
        server.close()

    run(main())


def test_nsqds_http_port_given_as_its_tcp_port_says_so(nsqd: NSQCluster) -> None:
    """nsqd's HTTP port answers the magic with an HTTP 400, whose first four bytes read as
    a frame of size 1213486160 ('HTTP'): both connections name the mistake instead."""
    from nsq_spark._sync_conn import SyncConnection

    host, port = _hostport(nsqd.nsqd_http_addresses[0])
    with pytest.raises(errors.ProtocolError, match=r"HTTP port.*TCP port \(4150"):
        SyncConnection(host, port).connect()

    async def main() -> None:
        conn = Connection(host, port)
        with pytest.raises(errors.ProtocolError, match=r"HTTP port.*TCP port \(4150"):
            await conn.connect()
        assert conn.state is ConnState.CLOSED

    run(main())


def test_a_server_silent_after_identify_times_out_typed() -> None:
    """Both connections: a TCP server that accepts and never answers gives
    NSQTimeoutError naming the step, within response_timeout."""
    import socket
    import time

    from nsq_spark._sync_conn import SyncConnection

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    port = server.getsockname()[1]
    cfg = ConnectionConfig(response_timeout=0.5)
    try:
        t0 = time.monotonic()
        with pytest.raises(errors.NSQTimeoutError, match="waiting for the IDENTIFY answer"):
            SyncConnection("127.0.0.1", port, cfg).connect()

        async def main() -> None:
            with pytest.raises(errors.NSQTimeoutError, match="waiting for the IDENTIFY answer"):
                await Connection("127.0.0.1", port, cfg).connect()

        run(main())
        assert time.monotonic() - t0 < 5
    finally:
        server.close()


def test_connection_states_are_the_enum(nsqd: NSQCluster) -> None:
    async def main() -> None:
        conn = Connection(*_hostport(nsqd.nsqd_tcp_addresses[0]), on_messages=lambda c, m: None)
        assert conn.state is ConnState.INIT
        await conn.connect()
        assert conn.state is ConnState.CONNECTED
        await conn.subscribe(_topic(), "ch")
        assert conn.state is ConnState.SUBSCRIBED and conn.state == "subscribed"
        await conn.close()
        assert conn.state is ConnState.CLOSED

    run(main())


def test_silent_nsqd_is_detected_by_missed_heartbeats() -> None:
    with NSQCluster(nsqd=1, lookupd=0) as cluster:
        async def main() -> None:
            col = Collector()
            conn = Connection(*_hostport(cluster.nsqd_tcp_addresses[0]),
                              ConnectionConfig(heartbeat_interval=1), **col.kwargs())
            await conn.connect()
            await conn.subscribe(_topic(), "ch")
            cluster.stop(0)  # SIGSTOP: the socket stays open, nothing arrives
            try:
                await wait_for(lambda: col.closed != [], timeout=6, what="close")
            finally:
                cluster.resume(0)
            assert isinstance(col.closed[0], errors.NSQTimeoutError)
            assert "heartbeat" in str(col.closed[0])

        run(main())



def test_blocking_connection_never_writes_a_heartbeat_nop_inside_another_threads_write(
        nsqd: NSQCluster) -> None:
    """Threads pipeline on one SyncConnection: the thread reading answers also answers
    heartbeats, while another thread may be half-way through writing a command (a big
    MPUB takes several send calls; compressed writes must go out in compression order).
    A NOP written in between corrupted the stream and nsqd reset the connection."""
    import threading
    import time

    from nsq_spark import protocol
    from nsq_spark._conn import _NOP, SyncConnection

    conn = SyncConnection(*_hostport(nsqd.nsqd_tcp_addresses[0]),
                          ConnectionConfig(heartbeat_interval=1)).connect()
    topic = _topic()
    writes: list[tuple[bytes, bool]] = []  # (data, written inside the slow write)
    real_write = conn._write
    slow_write = threading.Event()

    def spy(data: bytes) -> None:
        writes.append((data, slow_write.is_set()))
        real_write(data)
    conn._write = spy  # type: ignore[method-assign]
    answers: list[Any] = []

    def read_answers() -> None:
        try:
            answers.append(conn._read_frame())  # the PUB's answer; heartbeats meanwhile
            deadline = time.monotonic() + 1.5
            while time.monotonic() < deadline:
                answers.append(conn._read_frame())
        except Exception as exc:
            answers.append(exc)
    data = protocol.pub(topic, b"x" * 1000)
    with conn._wlock:  # one PUB written in two parts, 1.3 s apart (a heartbeat between)
        slow_write.set()
        conn._sock.sendall(data[:500])
        reader = threading.Thread(target=read_answers)
        reader.start()
        time.sleep(1.3)
        conn._sock.sendall(data[500:])
        slow_write.clear()
    reader.join(5)
    conn.close()
    assert answers and answers[0] == (protocol.FRAME_TYPE_RESPONSE, protocol.OK), answers
    nops = [inside for d, inside in writes if d == _NOP]
    assert not any(nops), writes  # never inside the other thread's write
    assert nops  # heartbeats are still answered once the writer is done
