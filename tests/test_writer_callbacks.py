"""pynsq's Writer callback gets ``(conn, data)``: a callback that reads ``conn.id``,
``conn.host`` and ``conn.port`` (as pynsq programs do) works for ``pub`` and ``mpub``,
on success and on error, and ``conn`` names the nsqd that really took the command."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest

import nsq_spark as nsq
from nsq_spark import errors
from nsq_spark.compat.writer import WriterConnection
from nsq_spark.testing import free_port

pytestmark = [pytest.mark.nsqd, pytest.mark.timeout(60)]

Seen = list[tuple[str, str, int, Any]]


def recorder(seen: Seen):
    def callback(conn, data):  # what a pynsq program's callback reads
        seen.append((conn.id, conn.host, conn.port, data))
    return callback


def host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0, max_msg_size=100)
def test_pub_and_mpub_callbacks_read_the_connection_on_success_and_error(nsq_cluster):
    [address] = nsq_cluster.nsqd_tcp_addresses
    host, port = host_port(address)
    seen: Seen = []
    cb = recorder(seen)

    async def main() -> None:
        w = nsq.Writer(address)
        assert await w.pub("wcb", b"small", callback=cb) == b"OK"
        assert await w.mpub("wcb", [b"a", b"b"], callback=cb) == b"OK"
        with pytest.raises(errors.BadMessageError):  # nsqd refuses: over --max-msg-size
            await w.pub("wcb", b"x" * 200, callback=cb)
        with pytest.raises(errors.BadMessageError):
            await w.mpub("wcb", [b"ok", b"y" * 200], callback=cb)
        await w.aclose()

    asyncio.run(asyncio.wait_for(main(), 30))
    assert [s[:3] for s in seen] == [(address, host, port)] * 4
    assert [s[3] for s in seen[:2]] == [b"OK", b"OK"]
    assert all(isinstance(s[3], errors.BadMessageError) for s in seen[2:])


@pytest.mark.nsq_cluster(nsqd=2, lookupd=0)
def test_conn_names_the_nsqd_that_took_each_message(nsq_cluster):
    took: list[tuple[Any, int]] = []  # (conn, messages) per callback

    def counting(n: int):
        return lambda conn, data: took.append((conn, n))

    async def main() -> None:
        w = nsq.Writer(nsq_cluster.nsqd_tcp_addresses)  # round robin over both
        for i in range(500):  # until both took some (the second may connect late)
            await w.pub("wrr", b"m%d" % i, callback=counting(1))
            if i >= 8 and len({conn.id for conn, _ in took}) == 2:
                break
        await w.mpub("wrr", [b"x", b"y"], callback=counting(2))
        await w.aclose()

    asyncio.run(asyncio.wait_for(main(), 30))
    for node, address in zip(nsq_cluster.nsqds, nsq_cluster.nsqd_tcp_addresses):
        [t] = [t for t in node.stats("wrr")["topics"] if t["topic_name"] == "wrr"]
        said = sum(n for conn, n in took if conn.id == address)
        assert 0 < said == t["message_count"], (address, said, t["message_count"])
    # one object per nsqd, as pynsq keeps one conn per nsqd
    assert len({id(conn) for conn, _ in took}) == 2


def test_an_unreachable_only_nsqd_gives_conn_none_as_in_pynsq():
    # pynsq 0.9.1 calls back (None, SendError) whenever no connection is open, also with
    # one nsqd configured: programs test ``conn is None``
    address = f"127.0.0.1:{free_port()}"
    seen: list[Any] = []

    def callback(conn: Any, data: Any) -> None:
        seen.append((conn, data))

    async def main() -> None:
        w = nsq.Writer(address, retry_deadline=0.3, publish_timeout=1)
        for call in (w.pub("wdown", b"x", callback=callback),
                     w.mpub("wdown", [b"x", b"y"], callback=callback)):
            with pytest.raises(errors.NSQError):
                await call
        await w.aclose()

    asyncio.run(asyncio.wait_for(main(), 30))
    assert [s[0] for s in seen] == [None, None]
    assert all(isinstance(s[1], errors.NSQError) for s in seen)


def test_with_several_unreachable_nsqd_conn_is_none_as_in_pynsq():
    addresses = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
    got: list[Any] = []

    async def main() -> None:
        w = nsq.Writer(addresses, retry_deadline=0.3, publish_timeout=1)
        with pytest.raises(errors.NSQError):
            await w.pub("wdown", b"x", callback=lambda conn, data: got.append((conn, data)))
        await w.aclose()

    asyncio.run(asyncio.wait_for(main(), 30))
    assert got[0][0] is None and isinstance(got[0][1], errors.NSQError)


@pytest.mark.unit
def test_callbacks_written_for_the_writer_argument_keep_working():
    w = nsq.Writer(["127.0.0.1:4150", "[::1]:4151"])
    try:
        conn = WriterConnection(w, w._tcp.addresses["[::1]:4151"])
        assert (conn.id, conn.host, conn.port, str(conn)) == ("[::1]:4151", "::1", 4151,
                                                               "[::1]:4151")
        assert conn.pub == w.pub and conn.name == w.name  # the old (writer, data) callbacks
        with pytest.raises(AttributeError):
            conn.no_such_thing
        with pytest.raises(AttributeError, match="cannot be closed"):
            conn.close()  # pynsq's closes one connection: never the whole Writer
        assert copy.copy(conn).id == conn.id  # no recursion through the forwarding
    finally:
        w.close()
