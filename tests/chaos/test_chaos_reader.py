"""A Reader behind a real Toxiproxy: connections reset again and again, latency with
jitter, frames cut into 1-7 byte fragments, a black-holed connection, connections cut
after so many bytes. Bodies are published straight to nsqd (around the proxy) while the
faults run; every body must reach the Reader at least once and nsqd's channel must end
drained (every message finished). Duplicates are allowed, counted and printed."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import pytest

from chaos_helpers import (C, T, PacedPublisher, assert_zero_loss, bodies, consume,
                           create_channel, drained)
from nsq_spark._consumer.reader import Reader
from nsq_spark.testing.chaos import inject_periodically

pytestmark = [pytest.mark.chaos, pytest.mark.nsqd, pytest.mark.slow, pytest.mark.timeout(60)]

# Quick recovery, and nsqd gives a lost FIN's message to someone else after 1 s
READER = dict(max_in_flight=100, reconnect_initial=0.05, reconnect_max=0.5, msg_timeout=1)


def reader_through(proxy, **options) -> Reader:
    return Reader(T, C, nsqd_tcp_addresses=[proxy.listen], **{**READER, **options})


def test_reader_loses_nothing_when_its_connection_is_reset_again_and_again(
        nsq_cluster, toxiproxy):
    proxy = toxiproxy.create_proxy("nsqd_tcp", upstream=nsq_cluster.nsqd_tcp_addresses[0])
    http = nsq_cluster.nsqd_http_addresses[0]
    create_channel(http)
    sent = bodies(5000, "reset")
    with reader_through(proxy) as reader, \
            inject_periodically(proxy, "reset_peer", every=0.25, hold=0.05, count=15,
                                streams=("downstream", "upstream"), timeout=0) as faults, \
            PacedPublisher(http, sent, chunk=100, interval=0.08):
        counts = consume(reader, set(sent), nsq_cluster, timeout=25)
    assert faults.injected >= 5, f"only {faults.injected} resets during the flow"
    assert_zero_loss(set(sent), counts, "reader, reset_peer", nsq_cluster,
                     resets=faults.injected)


def test_reader_loses_nothing_through_latency_with_jitter(nsq_cluster, toxiproxy):
    proxy = toxiproxy.create_proxy("nsqd_tcp", upstream=nsq_cluster.nsqd_tcp_addresses[0])
    http = nsq_cluster.nsqd_http_addresses[0]
    create_channel(http)
    sent = bodies(3000, "latency")
    with proxy.toxic("latency", "downstream", latency=40, jitter=30), \
            proxy.toxic("latency", "upstream", latency=20, jitter=15), \
            reader_through(proxy, msg_timeout=5) as reader, \
            PacedPublisher(http, sent, chunk=100, interval=0.05):
        counts = consume(reader, set(sent), nsq_cluster, timeout=25)
    assert_zero_loss(set(sent), counts, "reader, latency 40+-30 ms down, 20+-15 ms up",
                     nsq_cluster)


@pytest.mark.parametrize("compression", ["none", "snappy", "deflate"])
def test_reader_loses_nothing_when_every_frame_arrives_in_1_to_7_byte_fragments(
        nsq_cluster, toxiproxy, compression):
    proxy = toxiproxy.create_proxy("nsqd_tcp", upstream=nsq_cluster.nsqd_tcp_addresses[0])
    http = nsq_cluster.nsqd_http_addresses[0]
    create_channel(http)
    sent = bodies(2000 if compression == "none" else 1000, "slicer")
    codec = {} if compression == "none" else {compression: True}
    # average 4 +- 3 bytes: every chunk of the stream is cut into 1..7 byte pieces, both
    # ways (nsqd reads our FIN/RDY in pieces too); 10 us between pieces so that they
    # reach the socket one by one instead of coalesced
    with proxy.toxic("slicer", "downstream", average_size=4, size_variation=3, delay=10), \
            proxy.toxic("slicer", "upstream", average_size=4, size_variation=3, delay=10), \
            reader_through(proxy, msg_timeout=5, **codec) as reader, \
            PacedPublisher(http, sent, chunk=100, interval=0.03):
        counts = consume(reader, set(sent), nsq_cluster, timeout=25)
    assert_zero_loss(set(sent), counts, f"reader, slicer 1-7 bytes, {compression}",
                     nsq_cluster)


def test_reader_recovers_from_a_black_holed_connection(nsq_cluster, toxiproxy):
    """A stall (the timeout toxic with timeout=0 drops every byte and closes nothing) for
    longer than two heartbeats, while bodies keep being published: the Reader must
    notice the silence, drop the connection, keep retrying through the stalled proxy and
    get everything once the stall is removed."""
    proxy = toxiproxy.create_proxy("nsqd_tcp", upstream=nsq_cluster.nsqd_tcp_addresses[0])
    http = nsq_cluster.nsqd_http_addresses[0]
    create_channel(http)
    sent = bodies(2000, "stall")
    with reader_through(proxy, heartbeat_interval=1, connect_timeout=1,
                        response_timeout=1) as reader, \
            inject_periodically(proxy, "timeout", every=0, hold=3.5, count=1,
                                start_after=0.5, streams=("downstream", "upstream"),
                                timeout=0) as faults, \
            PacedPublisher(http, sent, chunk=100, interval=0.2):
        counts = consume(reader, set(sent), nsq_cluster, timeout=25)
    assert faults.injected == 1
    assert_zero_loss(set(sent), counts, "reader, a stall of 3.5 s", nsq_cluster)


@pytest.mark.parametrize("compression", ["none", "deflate"])
def test_reader_loses_nothing_when_connections_are_cut_mid_frame(nsq_cluster, toxiproxy,
                                                                 compression):
    """limit_data closes a connection after so many bytes: mostly in the middle of a
    frame (with deflate, in the middle of the compressed stream, whose state a new
    connection starts afresh). While it is in place every new connection is cut again."""
    proxy = toxiproxy.create_proxy("nsqd_tcp", upstream=nsq_cluster.nsqd_tcp_addresses[0])
    http = nsq_cluster.nsqd_http_addresses[0]
    create_channel(http)
    sent = bodies(3000, "limit")
    codec = {} if compression == "none" else {compression: True}
    limit = 20_011 if compression == "none" else 3_001  # deflate sends far fewer bytes
    with reader_through(proxy, **codec) as reader, \
            inject_periodically(proxy, "limit_data", every=0.3, hold=0.5, count=8,
                                bytes=limit) as faults, \
            PacedPublisher(http, sent, chunk=100, interval=0.06):
        counts = consume(reader, set(sent), nsq_cluster, timeout=25)
    assert faults.injected >= 2, f"only {faults.injected} cuts during the flow"
    assert_zero_loss(set(sent), counts, f"reader, limit_data {limit} bytes, {compression}",
                     nsq_cluster, cuts=faults.injected)


def test_reader_with_a_handler_loses_nothing_when_its_connection_is_reset(
        nsq_cluster, toxiproxy):
    """The same resets with the pynsq-style push API: a handler on the event loop,
    FIN by returning True."""
    proxy = toxiproxy.create_proxy("nsqd_tcp", upstream=nsq_cluster.nsqd_tcp_addresses[0])
    http = nsq_cluster.nsqd_http_addresses[0]
    create_channel(http)
    sent = bodies(4000, "push")
    want = set(sent)
    counts: Counter[bytes] = Counter()

    def handler(message) -> bool:
        counts[message.body] += 1
        return True

    async def consume_with_handler() -> None:
        reader = Reader(T, C, handler, nsqd_tcp_addresses=[proxy.listen], **READER)
        try:
            deadline = time.monotonic() + 25
            while time.monotonic() < deadline:
                await asyncio.sleep(0.3)
                if want <= counts.keys() and await asyncio.to_thread(drained, nsq_cluster):
                    break
        finally:
            await reader.aclose()

    with inject_periodically(proxy, "reset_peer", every=0.25, hold=0.05, count=15,
                             streams=("downstream", "upstream"), timeout=0) as faults, \
            PacedPublisher(http, sent, chunk=100, interval=0.08):
        asyncio.run(consume_with_handler())
    assert faults.injected >= 5, f"only {faults.injected} resets during the flow"
    assert_zero_loss(want, counts, "reader (handler), reset_peer", nsq_cluster,
                     resets=faults.injected)
