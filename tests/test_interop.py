"""Interoperability with the reference clients, byte for byte: what our Producer publishes,
Go ``nsq_tail`` and pynsq's Reader read; what pynsq's Writer and Go ``to_nsq`` publish, our
Connection reads. The peers run as separate processes."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
import uuid
from typing import Iterator

import pytest

from conn_helpers import run, wait_for
from nsq_spark._conn import Connection
from nsq_spark.message import Message
from nsq_spark import Producer
from nsq_spark.testing import NSQCluster, find_binary

pytestmark = pytest.mark.nsqd


@pytest.fixture(scope="module")
def nsqd() -> Iterator[NSQCluster]:
    with NSQCluster(nsqd=1, lookupd=0) as cluster:
        yield cluster


def _topic() -> str:
    return "i" + uuid.uuid4().hex[:12]


def _binary_bodies(n: int, newline_free: bool = False) -> list[bytes]:
    out = []
    for i in range(n):
        b = bytes((i * 31 + j * 7) % 256 for j in range(1 + (i * 97) % 3000))
        if newline_free:
            b = b.replace(b"\n", b"\x0b")
        out.append(b)
    return out


def _read_with_our_connection(addr: str, topic: str, n: int) -> list[Message]:
    async def main() -> list[Message]:
        got: list[Message] = []
        host, port = addr.rsplit(":", 1)
        conn = Connection(host, int(port), on_messages=lambda c, m: got.extend(m))
        await conn.connect()
        await conn.subscribe(topic, "ours")
        conn.send_rdy(200)
        await wait_for(lambda: len(got) >= n, 20, f"{n} messages")
        await asyncio.sleep(0.05)
        for m in got:
            m.finish()
        await conn.close()
        return got

    return run(main(), 40)


def test_our_producer_to_go_nsq_tail(nsqd: NSQCluster) -> None:
    topic = _topic()
    bodies = _binary_bodies(60, newline_free=True)  # nsq_tail ends each body with a newline
    addr = nsqd.nsqd_tcp_addresses[0]
    tail = subprocess.Popen([find_binary("nsq_tail"), f"--nsqd-tcp-address={addr}",
                             f"--topic={topic}", "--channel=tail", f"-n={len(bodies)}"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        with Producer(addr) as p:
            for b in bodies[:20]:
                p.publish(topic, b)
            p.mpublish(topic, bodies[20:])
        out, err = tail.communicate(timeout=30)
    finally:
        tail.kill()
        tail.wait()
    assert tail.returncode == 0, err.decode(errors="replace")
    assert out == b"".join(b + b"\n" for b in bodies)


_PYNSQ_READER = textwrap.dedent("""
    import json, sys
    import nsq, tornado.ioloop
    addr, topic, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    got = []
    loop = tornado.ioloop.IOLoop.current()
    def handler(message):
        got.append(message.body.hex())
        if len(got) >= n:
            loop.add_callback(loop.stop)
        return True
    nsq.Reader(topic=topic, channel="pynsq", nsqd_tcp_addresses=[addr],
               message_handler=handler, max_in_flight=100)
    loop.call_later(30, loop.stop)
    loop.start()
    print(json.dumps(got))
""")


def test_our_producer_to_pynsq_reader(nsqd: NSQCluster) -> None:
    topic = _topic()
    bodies = _binary_bodies(50) + [bytes(range(256)) * 4, b"\n", b"\x00"]
    addr = nsqd.nsqd_tcp_addresses[0]
    with Producer(addr, snappy=True) as p:  # compression is ours alone: nsqd decodes it
        p.mpublish(topic, bodies[:25])
        for b in bodies[25:]:
            p.publish(topic, b)
    proc = subprocess.run([sys.executable, "-c", _PYNSQ_READER, addr, topic, str(len(bodies))],
                          capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    got = [bytes.fromhex(h) for h in json.loads(proc.stdout.decode().strip().splitlines()[-1])]
    assert sorted(got) == sorted(bodies)


_PYNSQ_WRITER = textwrap.dedent("""
    import json, sys
    import nsq, tornado.ioloop
    addr, topic = sys.argv[1], sys.argv[2]
    bodies = [bytes.fromhex(h) for h in json.loads(sys.stdin.read())]
    loop = tornado.ioloop.IOLoop.current()
    writer = nsq.Writer([addr])
    pending = [len(bodies) - 10 + 1]
    failures = []
    def done(conn, data):
        if isinstance(data, Exception):
            failures.append(repr(data))
        pending[0] -= 1
        if pending[0] == 0:
            loop.add_callback(loop.stop)
    def go():
        if not writer.conns:
            loop.call_later(0.05, go)
            return
        for b in bodies[:-10]:
            writer.pub(topic, b, callback=done)
        writer.mpub(topic, bodies[-10:], callback=done)
    loop.add_callback(go)
    loop.call_later(30, loop.stop)
    loop.start()
    print(json.dumps({"pending": pending[0], "failures": failures}))
""")


def test_pynsq_writer_to_our_connection(nsqd: NSQCluster) -> None:
    topic = _topic()
    bodies = _binary_bodies(40) + [bytes(range(256))]
    addr = nsqd.nsqd_tcp_addresses[0]
    proc = subprocess.run([sys.executable, "-c", _PYNSQ_WRITER, addr, topic],
                          input=json.dumps([b.hex() for b in bodies]).encode(),
                          capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    assert json.loads(proc.stdout.decode().strip().splitlines()[-1]) == {"pending": 0, "failures": []}
    got = _read_with_our_connection(addr, topic, len(bodies))
    assert sorted(m.body for m in got) == sorted(bodies)
    assert all(m.attempts == 1 and len(m.id) == 16 for m in got)


def test_go_to_nsq_to_our_connection(nsqd: NSQCluster) -> None:
    topic = _topic()
    bodies = _binary_bodies(30, newline_free=True)
    addr = nsqd.nsqd_tcp_addresses[0]
    proc = subprocess.run([find_binary("to_nsq"), f"--nsqd-tcp-address={addr}", f"--topic={topic}"],
                          input=b"".join(b + b"\n" for b in bodies), capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    got = _read_with_our_connection(addr, topic, len(bodies))
    assert [m.body for m in got] == bodies
