"""Resilient delivery end to end (issue 32), on real processes: a stream published to two
of three nsqds (``Producer(replicas=2)``), one nsqd SIGKILLed and its data directory
deleted mid-stream, consumers that deduplicate by publish id.

Each consumer process records every publish id its handler is given, in a file of its
own, before the handler returns (the handler's durable record: a line written and flushed
survives the process's SIGKILL). Counting by publish id over those records:

* **lost** = published (``publish()`` returned) and in no record: must be 0;
* **handled twice** = in two records or twice in one: only what a consumer killed inside
  its handler had recorded and not yet committed (at most its last chunk: its
  ``max_in_flight``), counted and bounded; 0 without a kill.

nsqd runs with ``--msg-timeout=2s``: what a dead consumer held comes back in about two
seconds, and a dedup claim's lease (the connection's msg_timeout) is as long.
"""

from __future__ import annotations

import collections
import shutil
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest

from nsq_spark import Producer
from nsq_spark.envelope import publish_id_for
from nsq_spark.testing import NSQCluster, wait_until

pytestmark = [pytest.mark.nsqd, pytest.mark.slow, pytest.mark.timeout(120)]

T, C = "resilient", "archive"
N = 300            # messages published
DESTROY_AT = 120   # nsqd 0 is destroyed once this many are published
IN_FLIGHT = 10     # each consumer's max_in_flight: the most a kill can leave handled twice

# A consumer process. ``victim`` "-": never stops; "K": its handler blocks (to be
# SIGKILLed there) on the K-th message it is given, after recording it.
CONSUMER = r"""
import sys, time
import nsq_spark as nsq
from nsq_spark.dedup import OppositeBloomFilter, from_spec

spec, lookupd, topic, channel, record, victim = sys.argv[1:7]
if spec == "opposite":
    dedup = OppositeBloomFilter(OppositeBloomFilter.size_for(1000, 60, 0.99))
else:
    dedup = from_spec(spec)
out = open(record, "a", buffering=1)
given = 0

def handle(message):
    global given
    given += 1
    pid = message.publish_id
    out.write((pid.hex() if pid else "no-id:" + message.body.decode()) + "\n")
    out.flush()
    if victim != "-" and given >= int(victim):
        out.write("blocked\n")
        out.flush()
        time.sleep(3600)
    return True

nsq.Reader(topic, channel, message_handler=handle, lookupd_http_addresses=[lookupd],
           dedup=dedup, dedup_key="publish_id", max_in_flight=%d, lookupd_poll_interval=1)
nsq.run()
""" % IN_FLIGHT


def published_id(i: int) -> str:
    return publish_id_for(f"m{i}").hex()


class Consumer:
    def __init__(self, tmp: Path, name: str, spec: str, lookupd: str, victim: str) -> None:
        self.record = tmp / f"{name}.record"
        self.record.touch()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CONSUMER, spec, lookupd, T, C, str(self.record), victim],
            cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def handled(self) -> list[str]:
        return [x for x in self.record.read_text().splitlines() if x != "blocked"]

    def blocked(self) -> bool:
        return "blocked" in self.record.read_text().splitlines()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()   # SIGKILL
        self.proc.wait(10)

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            _, err = self.proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate(timeout=10)
        return err.decode(errors="replace")[-3000:]


def publish_while_destroying(cluster: NSQCluster) -> set[str]:
    """Publish N messages with replicas=2 (quorum 2); at DESTROY_AT, SIGKILL nsqd 0 and
    delete its data directory. The ids of what publish() returned for."""
    ok: set[str] = set()
    with Producer(cluster.nsqd_tcp_addresses, replicas=2, publish_timeout=20,
                  retry_deadline=10) as producer:
        for i in range(N):
            if i == DESTROY_AT:
                cluster.kill(0)
                shutil.rmtree(cluster.nsqds[0].data_path)
            producer.publish(T, f"m{i}".encode(), idempotency_key=f"m{i}")
            ok.add(published_id(i))
    return ok


def drained(cluster: NSQCluster) -> bool:
    for node in cluster.nsqds[1:]:
        c = node.channel_stats(T, C)
        if not c or c["depth"] or c["in_flight_count"] or c["deferred_count"]:
            return False
    return True


def wait_subscribed(cluster: NSQCluster, consumers: int) -> None:
    """Every consumer subscribed on every nsqd before the stream starts, so that each
    takes part in it from the start."""
    wait_until(lambda: all(len(node.channel_stats(T, C).get("clients", [])) >= consumers
                           for node in cluster.nsqds), 30, f"{consumers} consumer(s) on every nsqd")


def counted(records: list[list[str]]) -> collections.Counter[str]:
    return collections.Counter(x for r in records for x in r)


def start_cluster_channel(cluster: NSQCluster) -> None:
    """The topic and channel on every nsqd before anything is published (a new channel
    gets only what comes after it)."""
    import urllib.request

    for address in cluster.nsqd_http_addresses:
        for path in (f"topic/create?topic={T}", f"channel/create?topic={T}&channel={C}"):
            urllib.request.urlopen(urllib.request.Request(
                f"http://{address}/{path}", method="POST"), timeout=5).read()


@pytest.mark.dedup
@pytest.mark.nsq_cluster(nsqd=3, lookupd=1, msg_timeout="2s")
@pytest.mark.parametrize("store", ["memcached", "redis"])
def test_a_replicated_stream_survives_a_destroyed_nsqd_and_a_consumer_killed_in_its_handler(
        store, nsq_cluster, memcached_server, redis_server, tmp_path):
    prefix = "resilient-" + uuid.uuid4().hex[:8]
    if store == "redis":
        spec = f"{redis_server.url}?ttl=600&prefix={prefix}"
    else:
        host, port = memcached_server.address
        spec = f"memcached://{host}:{port}?ttl=600&prefix={prefix}"
    start_cluster_channel(nsq_cluster)
    lookupd = nsq_cluster.lookupd_http_addresses[0]
    doomed = Consumer(tmp_path, "doomed", spec, lookupd, victim="40")
    survivor = Consumer(tmp_path, "survivor", spec, lookupd, victim="-")
    errors = ""
    try:
        wait_subscribed(nsq_cluster, 2)
        sent = publish_while_destroying(nsq_cluster)
        try:
            wait_until(doomed.blocked, 60, "the doomed consumer's handler to block")
        except AssertionError:
            doomed.kill()
            raise AssertionError(f"doomed handled {len(doomed.handled())}, survivor "
                                 f"{len(survivor.handled())}; doomed's stderr: "
                                 f"{doomed.stop()}") from None
        doomed.kill()   # inside its handler: what it holds comes back after 2 s
        wait_until(lambda: sent <= set(counted([doomed.handled(), survivor.handled()])), 60,
                   "every published message to be handled")
        wait_until(lambda: drained(nsq_cluster), 30, "the channel drained on the live nsqds")
    finally:
        doomed.kill()
        errors = survivor.stop()
    seen = counted([doomed.handled(), survivor.handled()])
    lost = sent - set(seen)
    assert not lost, f"{len(lost)} lost; survivor's stderr: {errors}"
    assert set(seen) == sent, f"handled what was never published: {set(seen) - sent}"
    twice = {k for k, n in seen.items() if n > 1}
    # only what the killed consumer recorded and had not committed: its last chunk
    assert twice <= set(doomed.handled()), errors
    assert all(seen[k] == 2 for k in twice)
    assert len(twice) <= IN_FLIGHT, f"{len(twice)} handled twice: more than one chunk"
    assert collections.Counter(survivor.handled()).most_common(1)[0][1] == 1
    print(f"{store}: {len(sent)} published, 0 lost, {len(twice)} handled twice "
          "(the killed consumer's last chunk)")


@pytest.mark.nsq_cluster(nsqd=3, lookupd=1, msg_timeout="2s")
def test_a_replicated_stream_survives_a_destroyed_nsqd_with_the_in_process_filter(
        nsq_cluster, tmp_path):
    start_cluster_channel(nsq_cluster)
    consumer = Consumer(tmp_path, "only", "opposite", nsq_cluster.lookupd_http_addresses[0],
                        victim="-")
    errors = ""
    try:
        wait_subscribed(nsq_cluster, 1)
        sent = publish_while_destroying(nsq_cluster)
        wait_until(lambda: sent <= set(consumer.handled()), 60,
                   "every published message to be handled")
        wait_until(lambda: drained(nsq_cluster), 30, "the channel drained on the live nsqds")
    finally:
        errors = consumer.stop()
    seen = collections.Counter(consumer.handled())
    assert set(seen) == sent, f"lost: {sent - set(seen)}; stderr: {errors}"
    assert seen.most_common(1)[0][1] == 1, "a message was handled twice"
