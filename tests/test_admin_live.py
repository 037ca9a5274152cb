"""nsq_spark.admin against real nsqd / nsqlookupd v1.3.0 (blocking and asyncio), and the
effects of its operations as a running Reader sees them: a paused channel delivers nothing
and keeps its depth, unpause delivers, empty drops, delete closes the Reader's connection
(nsqd does it) and the Reader reconnects, which makes the channel again."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from nsq_spark.admin import (AdminTLSError, AsyncLookupdClient, AsyncNsqdClient,
                             ChannelNotFoundError, LookupdClient, NodeUnreachableError,
                             NotFoundError, NsqdClient, TopicNotFoundError,
                             UnexpectedAnswerError)
from nsq_spark.errors import InvalidNameError, is_transient
from nsq_spark.testing import free_port, wait_until

pytestmark = pytest.mark.nsqd


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_blocking_nsqd_client_operates_and_reads_typed_stats(nsq_cluster):
    with NsqdClient(nsq_cluster.nsqd_http_addresses[0], timeout=3) as nsqd:
        assert nsqd.ping() == "OK"
        info = nsqd.info()
        assert info.version == "1.3.0" and info.tcp_address == nsq_cluster.nsqd_tcp_addresses[0]
        nsqd.create_topic("adm_t")
        nsqd.create_channel("adm_t", "c")
        nsq_cluster.publish("adm_t", [b"a", b"b"])
        stats = nsqd.stats("adm_t")
        c = stats.channel("adm_t", "c")
        assert c is not None and (c.depth, c.message_count, c.paused) == (2, 2, False)
        nsqd.pause_channel("adm_t", "c")
        nsqd.pause_topic("adm_t")
        t = nsqd.stats("adm_t", "c", include_clients=False).topic("adm_t")
        assert t is not None and t.paused and t.channel("c").paused  # type: ignore[union-attr]
        with pytest.raises(TopicNotFoundError, match="'adm_nope' does not exist on nsqd"):
            nsqd.pause_topic("adm_nope")
        with pytest.raises(ChannelNotFoundError, match="channel 'nope' of topic 'adm_t'"):
            nsqd.empty_channel("adm_t", "nope")
        with pytest.raises(InvalidNameError):
            nsqd.create_topic("adm t")
        nsqd.delete_topic("adm_t")
        assert nsqd.stats("adm_t").topic("adm_t") is None


def test_an_unreachable_node_is_a_transient_typed_error():
    down = f"127.0.0.1:{free_port()}"
    with NsqdClient(down, timeout=1) as nsqd:
        with pytest.raises(NodeUnreachableError, match=f"{down}.*no answer") as info:
            nsqd.stats()
    assert isinstance(info.value, OSError) and is_transient(info.value)


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_a_port_that_answers_but_not_http_says_which_port_to_give(nsq_cluster):
    # nsqd's TCP port answers an HTTP request with E_BAD_PROTOCOL: an answer, not "none"
    tcp = nsq_cluster.nsqd_tcp_addresses[0]
    with NsqdClient(tcp, timeout=2) as nsqd:
        with pytest.raises(UnexpectedAnswerError, match="answered, but not HTTP") as info:
            nsqd.stats()
    assert tcp in str(info.value) and "4151" in str(info.value)
    assert not is_transient(info.value)

    async def go():
        async with AsyncLookupdClient(tcp, timeout=2) as lookupd:
            await lookupd.nodes()

    with pytest.raises(UnexpectedAnswerError, match="is this the HTTP port"):
        asyncio.run(go())


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_https_to_a_plain_http_port_says_use_http(nsq_cluster):
    url = f"https://{nsq_cluster.nsqd_http_addresses[0]}"
    with NsqdClient(url, timeout=2) as nsqd:
        with pytest.raises(AdminTLSError, match="use http://") as info:
            nsqd.ping()
    assert url in str(info.value) and not is_transient(info.value)


@pytest.mark.nsq_cluster(nsqd=1, lookupd=1)
def test_async_clients_lookup_and_tombstone(nsq_cluster):
    nsqd_http = nsq_cluster.nsqd_http_addresses[0]
    lookupd_http = nsq_cluster.lookupd_http_addresses[0]

    async def go():
        async with AsyncNsqdClient(nsqd_http) as nsqd, \
                AsyncLookupdClient(lookupd_http) as lookupd:
            assert await lookupd.ping() == "OK"
            assert (await lookupd.info()).version == "1.3.0"
            assert (await lookupd.lookup("adm_a")).producers == ()  # unknown: empty
            await nsqd.create_topic("adm_a")
            await nsqd.create_channel("adm_a", "c")
            for _ in range(100):
                found = await lookupd.lookup("adm_a")
                if found.producers and found.channels:
                    break
                await asyncio.sleep(0.05)
            assert [p.http_address for p in found.producers] == [nsqd_http]
            assert found.channels == ("c",)
            assert "adm_a" in await lookupd.topics()
            assert await lookupd.channels("adm_a") == ["c"]
            (node,) = await lookupd.nodes()
            assert node.tcp_address == nsq_cluster.nsqd_tcp_addresses[0]
            assert "adm_a" in node.topics
            await lookupd.tombstone_topic_producer("adm_a", nsqd_http)
            assert (await lookupd.lookup("adm_a")).producers == ()
            (node,) = await lookupd.nodes()
            assert node.tombstones[node.topics.index("adm_a")] is True
            s = await nsqd.stats("adm_a")
            return s.channel("adm_a", "c")

    channel = asyncio.run(go())
    assert channel is not None and channel.depth == 0


@pytest.mark.nsq_cluster(nsqd=1, lookupd=1)
def test_a_tombstone_of_a_mistyped_node_fails_naming_the_producers(nsq_cluster):
    nsqd_http = nsq_cluster.nsqd_http_addresses[0]
    with NsqdClient(nsqd_http) as nsqd, \
            LookupdClient(nsq_cluster.lookupd_http_addresses[0]) as lookupd:
        nsqd.create_topic("adm_tomb")
        wait_until(lambda: lookupd.lookup("adm_tomb").producers, 5, "adm_tomb registered")
        # the TCP port instead of the HTTP one: lookupd answers 200 and tombstones nothing
        typo = nsq_cluster.nsqd_tcp_addresses[0]
        with pytest.raises(NotFoundError) as info:
            lookupd.tombstone_topic_producer("adm_tomb", typo)
        assert f"no producer of topic 'adm_tomb' is at {typo}" in str(info.value)
        assert f"knows: {nsqd_http};" in str(info.value)
        assert lookupd.lookup("adm_tomb").producers  # still listed
        lookupd.tombstone_topic_producer("adm_tomb", nsqd_http)
        assert lookupd.lookup("adm_tomb").producers == ()


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_empty_channel_drops_queued_and_in_flight_messages(nsq_cluster, running_reader):
    topic, channel = "adm_empty", "c"
    held = []

    def keep(message):  # no answer: the messages stay in flight
        message.enable_async()
        held.append(message)

    with NsqdClient(nsq_cluster.nsqd_http_addresses[0]) as nsqd:
        nsqd.create_topic(topic)
        nsqd.create_channel(topic, channel)
        nsq_cluster.publish(topic, [b"m%d" % i for i in range(5)])
        reader = running_reader.start(topic, channel, keep,
                                      nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses,
                                      max_in_flight=2)
        wait_until(lambda: len(held) == 2, 10, "2 messages in flight")
        before = nsqd.stats(topic, channel).channel(topic, channel)
        assert before is not None and (before.in_flight_count, before.depth) == (2, 3)
        nsqd.empty_channel(topic, channel)
        after = nsqd.stats(topic, channel).channel(topic, channel)
        assert after is not None and (after.in_flight_count, after.depth) == (0, 0)
        running_reader.stop(reader)


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_a_running_reader_sees_pause_unpause_empty_and_delete(nsq_cluster, running_reader):
    topic, channel = "adm_reader", "c"
    got: list[bytes] = []
    lock = threading.Lock()

    def handler(message):
        with lock:
            got.append(message.body)
        return True

    def received() -> int:
        with lock:
            return len(got)

    nsqd = NsqdClient(nsq_cluster.nsqd_http_addresses[0], timeout=3)
    nsqd.create_topic(topic)
    nsqd.create_channel(topic, channel)

    def stats():
        return nsqd.stats(topic, channel).channel(topic, channel)

    running_reader.start(topic, channel, handler,
                         nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses,
                         reconnect_initial=0.1, reconnect_max=0.5)
    nsq_cluster.publish(topic, [b"a%d" % i for i in range(5)])
    wait_until(lambda: received() == 5, 10, "5 delivered")

    # paused: nothing delivered, the depth stays on nsqd
    nsqd.pause_channel(topic, channel)
    nsq_cluster.publish(topic, [b"b%d" % i for i in range(5)])
    time.sleep(1.0)
    assert received() == 5
    st = stats()
    assert st is not None and st.paused and st.depth == 5 and st.client_count == 1

    # unpaused: delivered
    nsqd.unpause_channel(topic, channel)
    wait_until(lambda: received() == 10, 10, "the 5 held back delivered")

    # emptied while paused: gone
    nsqd.pause_channel(topic, channel)
    nsq_cluster.publish(topic, [b"c%d" % i for i in range(4)])
    wait_until(lambda: stats().depth == 4, 5, "depth 4")
    nsqd.empty_channel(topic, channel)
    assert stats().depth == 0
    nsqd.unpause_channel(topic, channel)
    time.sleep(1.0)
    assert received() == 10

    # deleted: nsqd closes the Reader's connection; the Reader reconnects and its SUB
    # makes the channel again (a new connection: another remote port)
    (before,) = stats().clients
    nsqd.delete_channel(topic, channel)

    def reconnected():
        st = stats()
        return st is not None and [k.remote_address for k in st.clients
                                   if k.remote_address != before.remote_address]

    wait_until(reconnected, 15, "the Reader reconnected and subscribed again")
    nsq_cluster.publish(topic, [b"d%d" % i for i in range(3)])
    wait_until(lambda: received() == 13, 10, "delivered after the reconnect")
    assert not any(body.startswith(b"c") for body in got)
    nsqd.close()


@pytest.mark.nsq_cluster(nsqd=1, lookupd=1)
def test_blocking_lookupd_client(nsq_cluster):
    nsq_cluster.publish("adm_l", [b"x"])
    nsq_cluster.wait_registered(0)
    with LookupdClient(nsq_cluster.lookupd_http_addresses[0]) as lookupd:
        wait_until(lambda: lookupd.lookup("adm_l").producers, 5, "adm_l registered")
        (producer,) = lookupd.lookup("adm_l").producers
        assert producer.tcp_address == nsq_cluster.nsqd_tcp_addresses[0]
        assert [n.http_address for n in lookupd.nodes()] == nsq_cluster.nsqd_http_addresses


def test_https_with_a_client_certificate_and_a_refused_handshake(tmp_path_factory):
    import os
    import sys

    sys.path.insert(0, os.path.dirname(__file__))
    from conn_tls_helpers import make_certs

    from nsq_spark.admin import AdminTLSError
    from nsq_spark.config import ConnectionConfig
    from nsq_spark.testing import NSQCluster

    certs = make_certs(tmp_path_factory.mktemp("admin-certs"))
    with NSQCluster(nsqd=1, lookupd=0, tls_cert=str(certs.server_cert),
                    tls_key=str(certs.server_key), tls_root_ca_file=str(certs.ca),
                    tls_client_auth_policy="require-verify") as cluster:
        url = f"https://127.0.0.1:{cluster.nsqds[0].https_port}"
        good = ConnectionConfig(tls_v1=True, tls_ca_file=str(certs.ca),
                                tls_cert_file=str(certs.client_cert),
                                tls_key_file=str(certs.client_key)).ssl_context()
        with NsqdClient(url, ssl_context=good) as nsqd:
            assert nsqd.ping() == "OK"
            nsqd.create_topic("adm_tls")
            assert nsqd.stats("adm_tls").topic("adm_tls") is not None
        wrong_ca = ConnectionConfig(tls_v1=True, tls_ca_file=str(certs.other_ca)).ssl_context()
        with NsqdClient(url, ssl_context=wrong_ca) as nsqd:
            with pytest.raises(AdminTLSError, match="TLS handshake failed") as info:
                nsqd.ping()
        assert not is_transient(info.value)
