"""The example alert rules (examples/prometheus/nsq-alerts.yml) pass ``promtool check
rules``, and ``promtool test rules`` (nsq-alerts.test.yml: synthetic series) shows the
alerts fire with their labels and summaries (skipped without promtool); and every metric
an alert names is in a real scrape of the collector. No server."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from promserver import promtool_binary

if TYPE_CHECKING:
    from nsq_spark.metrics import Watchable

HERE = Path(__file__).resolve().parent
RULES = HERE.parents[1] / "examples" / "prometheus" / "nsq-alerts.yml"


@pytest.fixture(scope="module")
def promtool() -> str:
    binary = promtool_binary()
    if binary is None:
        pytest.skip("no promtool (PATH, $PROMTOOL_BIN): scripts/install-services installs "
                    "Debian's prometheus package, which has it")
    return binary


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=60, cwd=HERE)


def test_promtool_checks_the_example_rules(promtool):
    done = run(promtool, "check", "rules", str(RULES))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 11 rules found" in done.stdout + done.stderr


def test_the_example_alerts_fire_on_synthetic_series(promtool):
    done = run(promtool, "test", "rules", str(HERE / "nsq-alerts.test.yml"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout + done.stderr


# -- every metric an alert names is one the collector exports ------------------------------
# Prometheus evaluates a misspelled metric to an empty vector, not an error, and
# nsq-alerts.test.yml spells its own series: neither catches a rule over a name the
# collector never exports. A scrape of the real collector does.

METRIC_NAME = re.compile(r"\bnsq_[a-z_]+")


def alert_metric_names(rules_text: str) -> set[str]:
    """Every ``nsq_*`` metric named in a rule's expression."""
    rules = yaml.safe_load(rules_text)
    return {name for group in rules["groups"] for rule in group["rules"]
            for name in METRIC_NAME.findall(rule["expr"])}


class ReaderStats:
    """A Reader's stats() as it looks while consuming (the keys of Reader.stats(); one
    connection, a give-up, backing off)."""

    def stats(self) -> dict[str, Any]:
        return {"name": "orders:billing", "topic": "orders", "channel": "billing",
                "mode": "handler", "rdy_mode": "normal", "messages_received": 12,
                "finished": 9, "requeued": 2, "given_up": 1, "duplicates": 0,
                "dropped_responses": 0, "in_flight": 1, "max_in_flight": 10,
                "total_rdy": 10, "pull_queued": 0, "connect_errors": {}, "lookupd": None,
                "backoff": {"level": 1, "duration": 0.5, "enabled": True,
                            "in_window": True, "strategy": "exponential"},
                "connections": {"127.0.0.1:4150": {"state": "subscribed", "messages": 12,
                                                   "in_flight": 1, "rdy": 10}}}


class SpoolingProducerStats:
    """A spooling Producer's stats() (its own keys, the inner producer's nested under
    "producer", whose per-nsqd dict it repeats as "nsqd"), with one nsqd down and a
    refused record."""

    def stats(self) -> dict[str, Any]:
        inner = {"messages": 5, "bytes": 50, "commands": 2, "published": 2, "retries": 1,
                 "errors": 1, "connected": [], "down": {"127.0.0.1:4150": "refused"},
                 "nsqd": {"127.0.0.1:4150": {"up": False, "messages": 5, "bytes": 50,
                                             "last_error": "refused"}}}
        return {"spool_dir": "/var/spool/nsq", "appended": 8, "acked": 5, "rejected": 1,
                "pending_bytes": 48, "spool_pending": 2, "spool_pending_bytes": 48,
                "bytes_on_disk": 120, "messages": 5, "bytes": 50, "retries": 1, "errors": 1,
                "nsqd": inner["nsqd"], "health": "failing", "last_error": "refused",
                "failing_since": 1.0, "consecutive_failures": 3, "fsyncs": 8,
                "corrupt_segments": [], "orphans_claimed": 0, "redriven": 0,
                "segments_deleted": 0, "producer": inner}


def exported_sample_names(*watched: "Watchable") -> set[str]:
    """The sample names in a real scrape (generate_latest) of an NSQCollector watching
    ``watched``: a counter's with its ``_total``, as Prometheus stores them."""
    prometheus_client = pytest.importorskip("prometheus_client")
    from prometheus_client.parser import text_string_to_metric_families

    from nsq_spark.metrics import NSQCollector

    registry = prometheus_client.CollectorRegistry()
    NSQCollector(watched).register(registry)
    text = prometheus_client.generate_latest(registry).decode()
    return {s.name for fam in text_string_to_metric_families(text) for s in fam.samples}


def watched_objects() -> tuple["Watchable", ...]:
    """The stubs and a fed SparkSourceMetrics, each checked by mypy against the port."""
    pytest.importorskip("pyspark")
    from nsq_spark.spark.listener import SparkSourceMetrics
    from nsq_spark.spark.progress import SourceLag

    source = SparkSourceMetrics(clock=lambda: 1_700_000_000.0)
    source.update("orders-q", SourceLag(
        topics=("orders",), channel="spark", batch=3, backlog_messages=40, lag_seconds=2.5,
        last_batch=2, last_batch_rows=100, last_batch_bytes=1000,
        last_batch_redeliveries_dropped=1, last_batch_oldest_age_seconds=3.0,
        last_batch_dead_lettered=1, paused_nsqds=0, unreachable_nsqds=0))
    return ReaderStats(), SpoolingProducerStats(), source


def test_every_metric_an_example_alert_names_is_exported():
    names = alert_metric_names(RULES.read_text())
    assert len(names) == 11, sorted(names)  # the extraction found the rules' metrics
    exported = exported_sample_names(*watched_objects())
    assert names - exported == set(), f"alerts name metrics no scrape has: {exported=}"


def test_a_misspelled_metric_in_an_alert_is_caught():
    text = RULES.read_text()
    assert "nsq_reader_connections_subscribed == 0" in text
    names = alert_metric_names(text.replace("nsq_reader_connections_subscribed == 0",
                                            "nsq_reader_conections_subscribed == 0"))
    assert names - exported_sample_names(*watched_objects()) == {
        "nsq_reader_conections_subscribed"}


@pytest.mark.timeout(60)
def test_the_stubs_have_only_keys_the_real_objects_stats_have(tmp_path):
    """The stubs above are real-shaped: each key is one the real Reader's and the real
    spooling Producer's stats() have (a stub key the real object lacks would export a
    series in this test that a real process never does)."""
    import nsq_spark as nsq
    from nsq_spark.testing import free_port

    reader = nsq.Reader("orders", "billing", lambda m: True,
                        nsqd_tcp_addresses=[f"127.0.0.1:{free_port()}"])
    try:
        real_reader = reader.stats()
    finally:
        reader.close()
    producer = nsq.Producer(f"127.0.0.1:{free_port()}", spool_dir=str(tmp_path / "spool"),
                            spool_fsync="never")
    try:
        real_producer = producer.stats()
    finally:
        producer.close(timeout=0)
    stub_reader, stub_producer = ReaderStats().stats(), SpoolingProducerStats().stats()
    assert set(stub_reader) <= set(real_reader), set(stub_reader) - set(real_reader)
    assert set(stub_producer) <= set(real_producer), set(stub_producer) - set(real_producer)
    assert set(stub_producer["producer"]) <= set(real_producer["producer"])
    # a spooling producer repeats its inner producer's per-nsqd dict (nsqd_up comes from it)
    assert real_producer["nsqd"] == real_producer["producer"]["nsqd"]
    assert stub_producer["nsqd"] == stub_producer["producer"]["nsqd"]
