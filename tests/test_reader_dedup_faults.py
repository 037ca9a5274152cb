"""Claim, then commit, on real processes: the consumer killed inside its handler, and the
connection lost while a handler holds the message. nsqd runs with ``--msg-timeout=2s``, so
a message a dead consumer held comes back in about two seconds, and the claims' lease (the
connection's msg_timeout) is as long.

The loss these tests pin down (issue 32): a deduplicator that marks the key when the
message *arrives* makes the next consumer finish the redelivery as a duplicate when the
first one died in its handler. With a claim, the redelivery is held while the lease
lasts and handled after it.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import uuid

import pytest

from nsq_spark.testing import wait_until

T, C = "dedup_faults", "c"

pytestmark = [pytest.mark.nsqd, pytest.mark.timeout(60)]

# A consumer process: records that its handler started, then hangs there until killed.
CONSUMER = r"""
import sys, time
import nsq_spark as nsq
from nsq_spark.dedup import from_spec

spec, nsqd, topic, channel, record = sys.argv[1:6]

def handle(message):
    with open(record, "a") as f:
        f.write("started %s\n" % message.body.decode())
    time.sleep(3600)

nsq.Reader(topic, channel, message_handler=handle, nsqd_tcp_addresses=[nsqd],
           dedup=from_spec(spec), max_in_flight=1)
nsq.run()
"""


def drained(cluster) -> bool:
    c = cluster.nsqds[0].channel_stats(T, C)
    return bool(c) and c["depth"] == 0 and c["in_flight_count"] == 0 \
        and c["deferred_count"] == 0


@pytest.mark.dedup
@pytest.mark.nsq_cluster(nsqd=1, lookupd=0, msg_timeout="2s")
@pytest.mark.parametrize("store", ["redis", "memcached"])
def test_a_consumer_killed_inside_its_handler_loses_nothing(
        store, nsq_cluster, redis_server, memcached_server, running_reader, tmp_path):
    prefix = "kill-" + uuid.uuid4().hex[:8]
    if store == "redis":
        spec = f"{redis_server.url}?ttl=600&prefix={prefix}"
    else:
        host, port = memcached_server.address
        spec = f"memcached://{host}:{port}?ttl=600&prefix={prefix}"
    nsqd = nsq_cluster.nsqd_tcp_addresses[0]
    nsq_cluster.publish(T, [b"the-one"])
    record = tmp_path / "record"
    record.touch()
    first = subprocess.Popen([sys.executable, "-c", CONSUMER, spec, nsqd, T, C, str(record)],
                             cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_until(lambda: "started the-one" in record.read_text(), 20,
                   "the first consumer's handler to start")
    finally:
        first.kill()  # SIGKILL, inside the handler
        first.wait(10)
    from nsq_spark.dedup import from_spec
    handled: list[tuple[bytes, int]] = []
    r = running_reader.start(T, C, lambda m: handled.append((m.body, m.attempts)),
                             nsqd_tcp_addresses=[nsqd], dedup=from_spec(spec),
                             max_in_flight=1)
    wait_until(lambda: handled, 20, "the second consumer to handle the message")
    wait_until(lambda: drained(nsq_cluster), 10, "the channel to drain")
    assert [b for b, _ in handled] == [b"the-one"]  # 0 lost
    assert handled[0][1] >= 2  # a redelivery: the first consumer had it
    assert r.duplicates == 0


def _abort_connection(r, address: str) -> None:
    """Drop the Reader's connection to ``address`` at once (no CLS), and wait until the
    Reader saw it go."""
    conn = r.conns[address]
    r.loop.call_soon_threadsafe(conn.abort)
    wait_until(lambda: r.conns.get(address) is not conn, 10, "the connection to drop")


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0, msg_timeout="2s")
@pytest.mark.parametrize("outcome", ["succeeds", "fails"])
def test_a_handler_that_outlives_its_connection_with_the_in_process_filter(
        outcome, nsq_cluster, running_reader):
    """The connection drops while the handler has the message. A success still commits
    (its FIN cannot be sent), so the redelivery nsqd makes after its timeout is finished
    as a duplicate, never handled twice; a failure releases, so the redelivery is
    handled."""
    from nsq_spark.dedup import OppositeBloomFilter
    nsqd = nsq_cluster.nsqd_tcp_addresses[0]
    nsq_cluster.publish(T, [b"m"])
    started, go = threading.Event(), threading.Event()
    calls: list[int] = []

    def handler(m):
        calls.append(m.attempts)
        if m.attempts == 1:
            started.set()
            go.wait(20)
            if outcome == "fails":
                raise RuntimeError("handling failed after the connection dropped")
        return True

    r = running_reader.start(T, C, handler, nsqd_tcp_addresses=[nsqd], concurrency=2,
                             dedup=OppositeBloomFilter(1 << 16), max_in_flight=1,
                             reconnect_initial=0.1, reconnect_max=0.5,
                             max_backoff_duration=0)
    assert started.wait(20)
    _abort_connection(r, nsqd)
    go.set()  # the handler ends now, well before nsqd's 2 s timeout
    wait_until(lambda: drained(nsq_cluster) and r.stats()["in_flight"] == 0, 20,
               "the redelivery to be answered")
    if outcome == "succeeds":
        assert calls == [1]  # handled once: its redelivery was a committed duplicate
        assert r.duplicates == 1
    else:
        assert calls[0] == 1 and calls[1:] and calls[-1] >= 2  # handled again: 0 lost
        assert r.duplicates == 0
    assert r.dropped_responses >= 1  # the answer on the lost connection
