"""The Prometheus exporter (nsq_spark.metrics) over real Readers and Producers: published
and consumed messages show up in a scrape over HTTP, with the documented names."""

from __future__ import annotations

import gc
import time
import urllib.request

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from nsq_spark.metrics import NSQCollector  # noqa: E402


def scrape(registry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = prometheus_client.generate_latest(registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def value(samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


class _Stats:
    """Any object with stats(): what the collector reads (a plain data holder)."""

    def __init__(self, stats: dict) -> None:
        self._stats = stats

    def stats(self) -> dict:
        return self._stats


@pytest.mark.unit
def test_producer_keys_that_exist_are_exported_and_missing_ones_are_not():
    registry = prometheus_client.CollectorRegistry()
    collector = NSQCollector().register(registry)
    old = _Stats({"published": 3, "connected": ["127.0.0.1:4150"],
                  "down": {"127.0.0.1:4250": "refused"}})
    new = _Stats({"published": 2, "messages": 7, "bytes": 70, "retries": 1, "errors": 0,
                  "connected": [], "down": {}})
    collector.watch(old, name="old")
    collector.watch(new, name="new")
    got = scrape(registry)
    assert value(got, "nsq_producer_commands_total", producer="old") == 3
    assert value(got, "nsq_producer_messages_total", producer="new") == 7
    assert value(got, "nsq_producer_bytes_total", producer="new") == 70
    assert value(got, "nsq_producer_retries_total", producer="new") == 1
    assert value(got, "nsq_producer_errors_total", producer="new") == 0
    assert ("nsq_producer_messages_total", (("producer", "old"),)) not in got
    assert value(got, "nsq_producer_nsqd_up", producer="old", nsqd="127.0.0.1:4150") == 1
    assert value(got, "nsq_producer_nsqd_up", producer="old", nsqd="127.0.0.1:4250") == 0


@pytest.mark.unit
def test_per_nsqd_producer_stats_and_a_spooling_producers_outer_counters():
    registry = prometheus_client.CollectorRegistry()
    collector = NSQCollector().register(registry)
    per_nsqd = _Stats({"messages": 5, "commands": 2, "published": 2, "nsqd": {
        "a:1": {"up": True, "messages": 5, "bytes": 50, "last_error": None},
        "b:2": {"up": False, "messages": 0, "bytes": 0, "last_error": "refused"},
        "c:3": {"up": None, "messages": 0, "bytes": 0, "last_error": None}}})
    spooling = _Stats({"messages": 9, "appended": 10, "acked": 9, "rejected": 1,
                       "pending_bytes": 12, "producer": {"messages": 4, "published": 3}})
    collector.watch(per_nsqd, name="direct")
    collector.watch(spooling, name="spooled")
    got = scrape(registry)
    assert value(got, "nsq_producer_commands_total", producer="direct") == 2
    assert value(got, "nsq_producer_nsqd_up", producer="direct", nsqd="a:1") == 1
    assert value(got, "nsq_producer_nsqd_up", producer="direct", nsqd="b:2") == 0
    assert ("nsq_producer_nsqd_up", (("nsqd", "c:3"), ("producer", "direct"))) not in got
    assert value(got, "nsq_producer_nsqd_messages_total", producer="direct", nsqd="a:1") == 5
    assert value(got, "nsq_producer_nsqd_bytes_total", producer="direct", nsqd="a:1") == 50
    # the outer (spool) figure wins over the inner producer's; the inner fills the gaps
    assert value(got, "nsq_producer_messages_total", producer="spooled") == 9
    assert value(got, "nsq_producer_commands_total", producer="spooled") == 3
    assert value(got, "nsq_producer_spool_appended_total", producer="spooled") == 10
    assert value(got, "nsq_producer_spool_rejected_total", producer="spooled") == 1
    assert value(got, "nsq_producer_spool_pending_bytes", producer="spooled") == 12


@pytest.mark.unit
def test_a_reader_figure_is_exported_when_it_is_a_number_and_not_when_it_is_a_bool():
    registry = prometheus_client.CollectorRegistry()
    collector = NSQCollector().register(registry)
    reader = _Stats({"topic": "t", "channel": "c", "connections": {}, "name": "t:c",
                     "messages_received": 4, "finished": 3.0, "requeued": True,
                     "in_flight": False, "max_in_flight": 10})
    collector.watch(reader)
    got = scrape(registry)
    rl = {"reader": "t:c", "topic": "t", "channel": "c"}
    assert value(got, "nsq_reader_messages_received_total", **rl) == 4
    assert value(got, "nsq_reader_messages_finished_total", **rl) == 3
    assert value(got, "nsq_reader_max_in_flight", **rl) == 10
    exported = {name for name, _labels in got}
    assert "nsq_reader_messages_requeued_total" not in exported
    assert "nsq_reader_in_flight" not in exported
    assert value(got, "nsq_reader_connections", **rl) == 0


@pytest.mark.unit
def test_a_connection_still_connecting_is_not_a_subscribed_one():
    """NSQReaderNoConnection alerts on subscribed connections: a link re-added at each
    retry to a blackholed nsqd (state connecting) must not look like a connection."""
    registry = prometheus_client.CollectorRegistry()
    collector = NSQCollector().register(registry)
    reader = _Stats({"topic": "t", "channel": "c", "name": "t:c", "connections": {
        "10.0.0.1:4150": {"state": "connecting", "messages": 0, "in_flight": 0, "rdy": 0},
        "10.0.0.2:4150": {"state": "closing", "messages": 3, "in_flight": 0, "rdy": 0}}})
    collector.watch(reader)   # held weakly: kept alive by this name
    got = scrape(registry)
    rl = {"reader": "t:c", "topic": "t", "channel": "c"}
    assert value(got, "nsq_reader_connections", **rl) == 2
    assert value(got, "nsq_reader_connections_subscribed", **rl) == 0


_PRODUCER_KEYS = {"messages": "nsq_producer_messages_total", "bytes": "nsq_producer_bytes_total",
                  "retries": "nsq_producer_retries_total", "errors": "nsq_producer_errors_total",
                  "published": "nsq_producer_commands_total"}


@pytest.mark.unit
@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.sampled_from(sorted(_PRODUCER_KEYS)),
                       st.integers(min_value=0, max_value=2**53)))
def test_exactly_the_producer_keys_present_are_exported_with_their_values(stats):
    registry = prometheus_client.CollectorRegistry()
    collector = NSQCollector().register(registry)
    holder = _Stats(stats)
    collector.watch(holder, name="p")
    got = {name: v for (name, labels), v in scrape(registry).items()
           if name.startswith("nsq_producer_")}
    assert got == {_PRODUCER_KEYS[k]: float(v) for k, v in stats.items()}


@pytest.mark.unit
def test_a_failing_stats_is_skipped_and_a_collected_object_is_forgotten(caplog):
    class Broken:
        def stats(self) -> dict:
            raise RuntimeError("boom")

    registry = prometheus_client.CollectorRegistry()
    collector = NSQCollector().register(registry)
    broken = Broken()
    ok = _Stats({"published": 1})
    collector.watch(broken)
    collector.watch(ok, name="ok")
    got = scrape(registry)
    assert value(got, "nsq_producer_commands_total", producer="ok") == 1
    assert "boom" in caplog.text
    del ok
    gc.collect()
    collector.unwatch(broken)
    assert not [k for k in scrape(registry) if k[0].startswith("nsq_")]
    with pytest.raises(TypeError, match="no stats"):
        collector.watch(object())


@pytest.mark.nsqd
@pytest.mark.timeout(60)
@pytest.mark.nsq_cluster(lookupd=0)
def test_a_scrape_over_http_shows_what_was_published_and_consumed(nsq_cluster):
    import nsq_spark as nsq

    addr = nsq_cluster.nsqd_tcp_addresses[0]
    registry = prometheus_client.CollectorRegistry()
    collector = NSQCollector().register(registry)
    bodies = [b"metric-%02d" % i for i in range(25)]
    with nsq.Producer(addr) as producer, \
            nsq.Reader("metrics", "c", nsqd_tcp_addresses=[addr], max_in_flight=50) as reader:
        collector.watch(producer, name="p1")
        collector.watch(reader)
        producer.mpublish("metrics", bodies[:20])
        for body in bodies[20:]:
            producer.publish("metrics", body)
        got_bodies: list[bytes] = []
        for batch in reader.iter_batches(max_messages=100, timeout=1.0):
            got_bodies += [m.body for m in batch]
            reader.finish(batch)
            if len(got_bodies) >= len(bodies):
                break
        assert sorted(got_bodies) == bodies
        # the IO thread writes the FINs: wait for them, bounded
        deadline = time.monotonic() + 10
        while reader.stats()["finished"] < 25 and time.monotonic() < deadline:
            time.sleep(0.05)
        server, thread = prometheus_client.start_http_server(0, addr="127.0.0.1",
                                                             registry=registry)
        try:
            port = server.server_address[1]
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                text = r.read().decode()
        finally:
            server.shutdown()
            server.server_close()
            thread.join(5)
        got = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for fam in text_string_to_metric_families(text) for s in fam.samples}
        rl = {"reader": reader.name, "topic": "metrics", "channel": "c"}
        assert value(got, "nsq_reader_messages_received_total", **rl) == 25
        assert value(got, "nsq_reader_messages_finished_total", **rl) == 25
        assert value(got, "nsq_reader_in_flight", **rl) == 0
        assert value(got, "nsq_reader_connections", **rl) == 1
        assert value(got, "nsq_reader_connections_subscribed", **rl) == 1
        assert value(got, "nsq_reader_connection_messages_received_total", nsqd=addr, **rl) == 25
        assert value(got, "nsq_reader_max_in_flight", **rl) == 50
        assert value(got, "nsq_producer_commands_total", producer="p1") == 6  # 1 MPUB + 5 PUB
        if "messages" in producer.stats():   # Producer.stats() counting messages
            assert value(got, "nsq_producer_messages_total", producer="p1") == 25
        assert value(got, "nsq_producer_nsqd_up", producer="p1", nsqd=addr) == 1
    assert text.count("# TYPE nsq_") >= 10


@pytest.mark.nsqd
@pytest.mark.timeout(60)
def test_a_spooling_producer_exports_its_spool(tmp_path):
    import nsq_spark as nsq
    from nsq_spark.testing import free_port

    registry = prometheus_client.CollectorRegistry()
    collector = NSQCollector().register(registry)
    dead = f"127.0.0.1:{free_port()}"
    producer = nsq.Producer(dead, spool_dir=str(tmp_path / "spool"), spool_fsync="never")
    try:
        collector.watch(producer, name="spooled")
        producer.mpublish("metrics", [b"a", b"b", b"c"])
        assert not producer.flush(0.2)
        got = scrape(registry)
        assert value(got, "nsq_producer_spool_appended_total", producer="spooled") == 3
        assert value(got, "nsq_producer_spool_acked_total", producer="spooled") == 0
        assert value(got, "nsq_producer_spool_pending_bytes", producer="spooled") > 0
    finally:
        producer.close(timeout=0)
