"""NSQCluster(mode="docker"): Reader, Producer and faults against nsqd in containers."""

from __future__ import annotations

import collections
import json
import time
import urllib.request

import pytest

from nsq_spark import Producer
from nsq_spark._consumer.reader import Reader
from nsq_spark.testing import HarnessError, NSQCluster, docker_client, docker_leftovers, publish, wait_until

pytestmark = [pytest.mark.nsqd]


def _lookup_producers(lookupd_http: str, topic: str) -> list[dict]:
    try:
        with urllib.request.urlopen(f"http://{lookupd_http}/lookup?topic={topic}",
                                    timeout=2) as resp:
            return json.loads(resp.read())["producers"]
    except OSError:  # 404 until the topic is registered
        return []


def _read_all(reader: Reader, want: int, timeout: float) -> collections.Counter[bytes]:
    """Pull and FIN until ``want`` messages came or ``timeout`` seconds passed."""
    seen: collections.Counter[bytes] = collections.Counter()
    deadline = time.monotonic() + timeout
    while sum(seen.values()) < want and time.monotonic() < deadline:
        batch = reader.get_batch(max_messages=2000, timeout=0.5)
        seen.update(m.body for m in batch)
        reader.finish(batch)
    return seen


def test_reader_reads_10000_through_lookupd_from_two_nsqd_containers_and_none_is_left():
    topic, channel = "docker_lookupd", "c"
    with NSQCluster(mode="docker", nsqd=2, lookupd=1) as cluster:
        assert cluster.docker is not None
        selector = {"label": f"nsq-spark.cluster={cluster.docker.id}"}
        containers = cluster.docker.client.containers.list(filters=selector)
        assert sorted(c.name.rsplit("-", 1)[1] for c in containers) == [
            "nsqd0", "nsqd1", "nsqlookupd0"]
        assert all(c.attrs["HostConfig"]["NetworkMode"] == "host" for c in containers)
        sent = [b"m-%05d" % i for i in range(10_000)]
        publish(cluster.nsqd_http_addresses[0], topic, sent[:5000])
        publish(cluster.nsqd_http_addresses[1], topic, sent[5000:])
        lookupd = cluster.lookupd_http_addresses[0]
        wait_until(lambda: len(_lookup_producers(lookupd, topic)) == 2, 10,
                   "both nsqd containers registered the topic with lookupd")
        with Reader(topic, channel, lookupd_http_addresses=cluster.lookupd_http_addresses,
                    max_in_flight=2000) as reader:
            seen = _read_all(reader, len(sent), timeout=60)
        assert seen == collections.Counter(sent)  # every message once, from both nsqd
        for i in range(2):
            wait_until(lambda: cluster.nsqds[i].channel_stats(topic, channel).get("depth") == 0
                       and cluster.nsqds[i].channel_stats(topic, channel).get("in_flight_count") == 0,
                       10, f"nsqd{i} drained")
    client = docker_client()
    try:
        assert client.containers.list(all=True, filters=selector) == []
        assert client.volumes.list(filters=selector) == []
    finally:
        client.close()


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_producer_publishes_to_an_nsqd_container(docker_nsq_cluster):
    topic = "docker_producer"
    bodies = [b"p-%04d" % i for i in range(500)]
    producer = Producer(docker_nsq_cluster.nsqd_tcp_addresses)
    try:
        producer.publish(topic, b"single")
        producer.mpublish(topic, bodies)
    finally:
        producer.close()
    with Reader(topic, "c", nsqd_tcp_addresses=docker_nsq_cluster.nsqd_tcp_addresses,
                max_in_flight=600) as reader:
        seen = _read_all(reader, len(bodies) + 1, timeout=30)
    assert seen == collections.Counter([b"single", *bodies])


@pytest.mark.nsq_cluster(nsqd=1, lookupd=1, mem_queue_size=0, sync_every=1)
def test_killed_nsqd_container_restarts_with_its_disk_queue(docker_nsq_cluster):
    cluster = docker_nsq_cluster
    topic = "docker_restart"
    sent = [b"d-%03d" % i for i in range(200)]
    publish(cluster.nsqd_http_addresses[0], topic, sent)
    tcp_before = cluster.nsqd_tcp_addresses[0]
    cluster.kill(0)
    assert not cluster.nsqds[0].running
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://{cluster.nsqd_http_addresses[0]}/ping", timeout=0.5)
    cluster.restart(0)  # same container, same ports, same data volume; registered again
    assert cluster.nsqd_tcp_addresses[0] == tcp_before
    assert [p["tcp_port"] for p in cluster.lookupds[0].nodes()] == [cluster.nsqds[0].tcp_port]
    with Reader(topic, "c", lookupd_http_addresses=cluster.lookupd_http_addresses,
                max_in_flight=300) as reader:
        seen = _read_all(reader, len(sent), timeout=30)
    assert seen == collections.Counter(sent)


@pytest.mark.nsq_cluster(nsqd=2, lookupd=1)
def test_reader_keeps_reading_across_an_nsqd_container_killed_and_started_again(
        docker_nsq_cluster):
    cluster = docker_nsq_cluster
    topic = "docker_live_restart"
    before = [b"b-%03d" % i for i in range(200)]
    after = [b"a-%03d" % i for i in range(200)]
    for i in range(2):
        publish(cluster.nsqd_http_addresses[i], topic, before[i::2])
    lookupd = cluster.lookupd_http_addresses[0]
    wait_until(lambda: len(_lookup_producers(lookupd, topic)) == 2, 10, "topic on both nsqd")
    with Reader(topic, "c", lookupd_http_addresses=cluster.lookupd_http_addresses,
                max_in_flight=400, lookupd_poll_interval=1, reconnect_initial=0.2,
                reconnect_max=1) as reader:
        assert _read_all(reader, len(before), timeout=30) == collections.Counter(before)
        cluster.kill(0)  # SIGKILL the container under a connected Reader
        cluster.restart(0)
        publish(cluster.nsqd_http_addresses[0], topic, after)
        assert _read_all(reader, len(after), timeout=30) == collections.Counter(after)


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_stopped_nsqd_container_answers_nothing_until_resumed(docker_nsq_cluster):
    ping = f"http://{docker_nsq_cluster.nsqd_http_addresses[0]}/ping"
    docker_nsq_cluster.stop(0)
    with pytest.raises(OSError):
        urllib.request.urlopen(ping, timeout=0.5)
    docker_nsq_cluster.resume(0)
    with urllib.request.urlopen(ping, timeout=5) as resp:
        assert resp.read() == b"OK"
    docker_nsq_cluster.stop(0)  # close() must remove a paused container too


@pytest.mark.nsq_cluster(nsqd=2, lookupd=1, nsqadmin=True)
def test_nsqadmin_container_sees_both_nsqd(docker_nsq_cluster):
    admin = docker_nsq_cluster.nsqadmin_http_address
    with urllib.request.urlopen(f"http://{admin}/api/nodes", timeout=5) as resp:
        nodes = json.loads(resp.read())["nodes"]
    assert sorted(n["tcp_port"] for n in nodes) == sorted(
        n.tcp_port for n in docker_nsq_cluster.nsqds)


def test_a_failed_start_leaves_no_container():
    """An nsqd that exits at start (bad flag): HarnessError with its output, nothing left."""
    with pytest.raises(HarnessError, match="exited at start") as err:
        NSQCluster(mode="docker", nsqd=1, lookupd=1, no_such_flag=1).start()
    assert "no-such-flag" in str(err.value)
    assert docker_leftovers() == []


def test_an_explicit_image_that_is_missing_is_not_replaced():
    with pytest.raises(HarnessError, match="nsq-spark/no-such-image:0.*cannot be pulled"):
        NSQCluster(mode="docker", image="nsq-spark/no-such-image:0").start()


def test_nsq_image_from_the_environment_is_the_explicit_image(monkeypatch):
    monkeypatch.setenv("NSQ_IMAGE", "nsq-spark/no-such-image:1")
    with pytest.raises(HarnessError, match="nsq-spark/no-such-image:1.*cannot be pulled"):
        NSQCluster(mode="docker").start()


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_containers_and_volumes_carry_the_reapers_session_label(docker_nsq_cluster):
    """testcontainers' reaper removes what carries its session label: the containers get
    it from testcontainers, the nsqd data volume from the harness. Where the reaper's
    image cannot be had (no registry), the reaper is off and the harness cleans up."""
    import os

    import docker
    from testcontainers.core.config import testcontainers_config
    from testcontainers.core.labels import LABEL_SESSION_ID, SESSION_ID

    node = docker_nsq_cluster.nsqds[0]
    client = docker_nsq_cluster.docker.client
    assert node.container.labels[LABEL_SESSION_ID] == SESSION_ID
    assert node.container.labels["nsq-spark.cluster"] == docker_nsq_cluster.docker.id
    volume = client.volumes.get(node.volume_name)
    assert volume.attrs["Labels"][LABEL_SESSION_ID] == SESSION_ID
    if "TESTCONTAINERS_RYUK_DISABLED" not in os.environ:
        try:
            client.images.get(testcontainers_config.ryuk_image)
            has_reaper_image = True
        except docker.errors.ImageNotFound:
            has_reaper_image = False
        assert testcontainers_config.ryuk_disabled is (not has_reaper_image)
