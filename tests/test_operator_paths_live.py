"""The operator paths of issue 34 against a real nsqd and NSQ's own Go tools:

* ``nsq-spark publish`` and ``to_nsq`` given the same input (empty lines, ``\\r\\n``)
  publish the same messages;
* a pynsq-style program whose Writer's IO loop runs in a thread that outlives the main
  thread publishes (during interpreter shutdown, asyncio's executor refuses work: every
  connect used to fail, and the healthy nsqd was logged as down);
* a Writer with no nsqd reachable calls back at once, as pynsq does (it used to after
  the Producer's 30 s of retrying), and with ``retry_deadline`` given it retries.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import time
from typing import Any

import pytest

import nsq_spark as nsq
from nsq_spark import errors
from nsq_spark._consumer import Reader
from nsq_spark.testing import NSQCluster, find_binary, free_port

pytestmark = [pytest.mark.nsqd, pytest.mark.timeout(120)]

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _bodies(cluster: NSQCluster, topic: str, n: int) -> list[bytes]:
    with Reader(topic, "c", nsqd_tcp_addresses=cluster.nsqd_tcp_addresses,
                max_in_flight=100) as reader:
        got: list[bytes] = []
        started = time.monotonic()
        while len(got) < n and time.monotonic() - started < 30:
            batch = reader.get_batch(timeout=0.2)
            reader.finish(batch)
            got += [m.body for m in batch]
        assert reader.get_batch(timeout=0.3) == []   # no more than n
    return got


@pytest.mark.nsq_cluster(lookupd=0)
def test_publish_and_to_nsq_publish_the_same_messages(nsq_cluster):
    data = b"one\n\ntwo\r\n\n\nthree \r\n\xff\xfe\n"   # empty lines, CRLF, not UTF-8
    address = nsq_cluster.nsqd_tcp_addresses[0]
    # the channel first, so every message is kept for reading
    from nsq_spark.admin import NsqdClient
    with NsqdClient(nsq_cluster.nsqd_http_addresses[0]) as nsqd:
        for topic in ("to_nsq_go", "to_nsq_ours"):
            nsqd.create_topic(topic)
            nsqd.create_channel(topic, "c")
    go = subprocess.run([find_binary("to_nsq"), f"--nsqd-tcp-address={address}",
                         "--topic=to_nsq_go"], input=data, capture_output=True, timeout=30)
    assert go.returncode == 0, go.stderr
    ours = subprocess.run([sys.executable, "-m", "nsq_spark", "publish", "--topic",
                           "to_nsq_ours", "--nsqd-tcp-address", address, "--quiet"],
                          input=data, capture_output=True, timeout=60, cwd=REPO)
    # before: exit 1 at the first empty line, the batch unpublished
    assert ours.returncode == 0, ours.stderr
    assert b"skipped 3 empty messages (first at stdin:2)" in ours.stderr
    expected = [b"one", b"two\r", b"three \r", b"\xff\xfe"]   # \r kept, as to_nsq
    assert _bodies(nsq_cluster, "to_nsq_go", 4) == expected
    assert _bodies(nsq_cluster, "to_nsq_ours", 4) == expected


OUTLIVING = """
import sys, threading
import tornado.ioloop
import nsq_spark as nsq

Writer = nsq.Writer   # imported by the main thread, as a program's imports are
address = sys.argv[1]
answers = []

def worker():
    loop = tornado.ioloop.IOLoop()
    w = Writer([address])

    def callback(conn, data):
        answers.append((str(conn), repr(data)))
        if len(answers) == 3:
            print(answers, flush=True)
            loop.stop()

    # published after the main thread has ended: the interpreter is shutting down
    for i in range(3):
        loop.call_later(0.3 + 0.1 * i, lambda: w.pub("outliving", b"x", callback))
    loop.start()

threading.Thread(target=worker).start()   # not a daemon: it outlives the main thread
"""


@pytest.mark.nsq_cluster(lookupd=0)
@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])   # a name is looked up too
def test_a_writer_whose_loop_thread_outlives_the_main_thread_publishes(nsq_cluster, host):
    address = nsq_cluster.nsqd_tcp_addresses[0].replace("127.0.0.1", host)
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(OUTLIVING), address],
                          capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("b'OK'") == 3, proc.stdout + proc.stderr
    assert "interpreter shutdown" not in proc.stderr and "is down" not in proc.stderr
    (topic,) = nsq_cluster.nsqds[0].stats("outliving")["topics"]
    assert topic["message_count"] == 3


def _pub_outcome(addresses: list[str], **kwargs: Any) -> tuple[Any, Any, float]:
    async def main() -> tuple[Any, Any, float]:
        w = nsq.Writer(addresses, **kwargs)
        got: list[tuple[Any, Any]] = []
        started = time.monotonic()
        with pytest.raises(errors.NSQError):
            await w.pub("nowhere", b"x", callback=lambda conn, data: got.append((conn, data)))
        took = time.monotonic() - started
        await w.aclose()
        ((conn, data),) = got
        return conn, data, took

    return asyncio.run(asyncio.wait_for(main(), 60))


def test_a_writer_with_no_nsqd_reachable_calls_back_at_once_as_pynsq():
    dead = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    conn, data, took = _pub_outcome(dead)
    assert conn is None and isinstance(data, errors.ConnectError)
    assert all(a in str(data) for a in dead)   # each nsqd was tried once
    assert took < 5, took   # before: 30 s (the Producer's retry_deadline)
    # asking for the Producer's retrying gets it: the callback after the deadline
    conn, data, took = _pub_outcome(dead[:1], retry_deadline=1.5)
    assert conn is None and isinstance(data, errors.ConnectError)
    assert 1.4 < took < 10, took


@pytest.mark.nsq_cluster(lookupd=0)
def test_a_writer_with_one_nsqd_down_and_one_up_publishes_at_once(nsq_cluster):
    async def main() -> list[Any]:
        w = nsq.Writer([f"127.0.0.1:{free_port()}", nsq_cluster.nsqd_tcp_addresses[0]],
                       strategy="failover")
        got: list[Any] = []
        assert await w.pub("half", b"x", callback=lambda c, d: got.append((str(c), d))) \
            == b"OK"
        await w.aclose()
        return got

    got = asyncio.run(asyncio.wait_for(main(), 30))
    assert got == [(nsq_cluster.nsqd_tcp_addresses[0], b"OK")]
