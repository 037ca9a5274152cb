"""go-nsq's connection controls, seen on the wire of a real nsqd v1.3.0: the source address
a client dials from (``local_address``, go-nsq's ``LocalAddr``) is the remote address nsqd
reports in ``/stats``, for the consumer's tornado connection, the producer's blocking one
and a whole Reader; and IDENTIFY with the topology hints (``topology_zone`` /
``topology_region``, an experiment on nsq's main branch) is accepted by v1.3.0."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from nsq_spark import protocol
from nsq_spark.config import ConnectionConfig
from nsq_spark._conn import Connection
from nsq_spark._consumer.reader import Reader
from nsq_spark.errors import ConnectError
from nsq_spark._sync_conn import SyncConnection
from nsq_spark.testing import NSQCluster, wait_until

pytestmark = pytest.mark.nsqd

SOURCE = "127.0.0.2"  # another loopback address: Linux routes all of 127/8 to lo


def _hp(addr: str) -> tuple[str, int]:
    host, port = addr.rsplit(":", 1)
    return host, int(port)


def _topic() -> str:
    return "t" + uuid.uuid4().hex[:12]


def _clients(cluster: NSQCluster, topic: str) -> list[dict[str, Any]]:
    """Every subscribed client of ``topic`` in nsqd 0's /stats."""
    stats = cluster.nsqds[0].stats(topic)
    return [c for t in stats.get("topics") or [] if t["topic_name"] == topic
            for ch in t["channels"] for c in ch["clients"]]


def _producers(cluster: NSQCluster, topic: str) -> list[dict[str, Any]]:
    stats = cluster.nsqds[0].stats(topic)
    return [p for p in stats.get("producers") or []]


def test_a_consumer_connection_dials_from_local_address(nsq_cluster: NSQCluster) -> None:
    topic = _topic()

    async def go() -> list[dict[str, Any]]:
        conn = Connection(*_hp(nsq_cluster.nsqd_tcp_addresses[0]),
                          ConnectionConfig(local_address=SOURCE, client_id="from-two"),
                          on_messages=lambda c, ms: None)
        await conn.connect()
        await conn.subscribe(topic, "ch")
        try:
            return await asyncio.to_thread(_clients, nsq_cluster, topic)
        finally:
            await conn.close()

    clients = asyncio.run(go())
    assert [c["client_id"] for c in clients] == ["from-two"]
    assert clients[0]["remote_address"].rsplit(":", 1)[0] == SOURCE


def test_without_local_address_the_os_chooses_127_0_0_1(nsq_cluster: NSQCluster) -> None:
    topic = _topic()

    async def go() -> list[dict[str, Any]]:
        conn = Connection(*_hp(nsq_cluster.nsqd_tcp_addresses[0]), ConnectionConfig(),
                          on_messages=lambda c, ms: None)
        await conn.connect()
        await conn.subscribe(topic, "ch")
        try:
            return await asyncio.to_thread(_clients, nsq_cluster, topic)
        finally:
            await conn.close()

    clients = asyncio.run(go())
    assert clients[0]["remote_address"].rsplit(":", 1)[0] == "127.0.0.1"


def test_a_blocking_producer_connection_dials_from_local_address(
        nsq_cluster: NSQCluster) -> None:
    topic = _topic()
    conn = SyncConnection(*_hp(nsq_cluster.nsqd_tcp_addresses[0]),
                          ConnectionConfig(local_address=SOURCE))
    conn.connect()
    try:
        assert conn.command(protocol.pub(topic, b"x")) == b"OK"
        producers = _producers(nsq_cluster, topic)
    finally:
        conn.close()
    assert [p["remote_address"].rsplit(":", 1)[0] for p in producers] == [SOURCE]


def test_a_reader_dials_from_local_address(nsq_cluster: NSQCluster, running_reader: Any
                                           ) -> None:
    topic = _topic()
    nsq_cluster.publish(topic, [b"a", b"b"])
    reader: Reader = running_reader.start(topic, "ch", lambda m: True,
                                          nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses,
                                          local_address=SOURCE)
    wait_until(lambda: reader.finished >= 2, 10, "2 finished")
    clients = _clients(nsq_cluster, topic)
    assert [c["remote_address"].rsplit(":", 1)[0] for c in clients] == [SOURCE]


def test_an_address_not_of_this_host_fails_with_a_hint(nsq_cluster: NSQCluster) -> None:
    conn = SyncConnection(*_hp(nsq_cluster.nsqd_tcp_addresses[0]),
                          ConnectionConfig(local_address="192.0.2.1"))  # TEST-NET-1
    with pytest.raises(ConnectError, match="local_address='192.0.2.1'"):
        conn.connect()


def test_nsqd_v1_3_0_accepts_identify_with_topology_hints(nsq_cluster: NSQCluster) -> None:
    topic = _topic()
    cfg = ConnectionConfig(topology_zone="zone-a", topology_region="region-1",
                           client_id="zoned")
    assert cfg.identify_payload()["topology_zone"] == "zone-a"
    assert cfg.identify_payload()["topology_region"] == "region-1"

    async def go() -> tuple[list[dict[str, Any]], list[bytes]]:
        got: list[bytes] = []
        conn = Connection(*_hp(nsq_cluster.nsqd_tcp_addresses[0]), cfg,
                          on_messages=lambda c, ms: [got.append(m.body) or m.finish()
                                                     for m in ms])
        await conn.connect()
        await conn.subscribe(topic, "ch")
        conn.send_rdy(1)
        await asyncio.to_thread(nsq_cluster.publish, topic, [b"zoned"])
        for _ in range(500):
            if got:
                break
            await asyncio.sleep(0.01)
        try:
            return await asyncio.to_thread(_clients, nsq_cluster, topic), got
        finally:
            await conn.close()

    clients, got = asyncio.run(go())
    assert got == [b"zoned"]  # IDENTIFY, SUB and a delivery all went through
    assert [c["client_id"] for c in clients] == ["zoned"]
