"""The latency benchmark (bench/bench_spark_latency.py) measures what it says.

Its pure parts (arguments, bodies, percentiles, the exactly-once count, the batch window,
the overhead against ``rate``) without sockets; its paced publisher against a real nsqd;
and one short run of the whole benchmark on a standalone cluster (the cluster tier).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench import bench_spark_latency as lat
from bench import pyrate_source

REPO = Path(__file__).resolve().parents[1]


# -- arguments --------------------------------------------------------------------------

@pytest.mark.unit
def test_triggers_are_default_or_an_interval_in_spark_terms():
    assert lat.parse_triggers("1s,default") == [
        lat.Trigger("1s", "1000 milliseconds"), lat.Trigger("default", None)]
    assert lat.parse_triggers("500ms") == [lat.Trigger("500ms", "500 milliseconds")]
    assert lat.parse_triggers("0.5s") == [lat.Trigger("0.5s", "500 milliseconds")]


@pytest.mark.unit
@pytest.mark.parametrize("bad", ["", "1", "1 s", "0s", "fast", "1s,1s", "default,"])
def test_a_trigger_that_is_not_understood_is_refused_with_the_form_to_use(bad):
    with pytest.raises(ValueError, match="trigger"):
        lat.parse_triggers(bad)


@pytest.mark.unit
def test_rates_are_distinct_positive_whole_numbers():
    assert lat.parse_rates("20,2000,20000") == [20, 2000, 20000]
    for bad in ("", "20,20", "0", "-5", "1.5", "2k", "300000"):
        with pytest.raises(ValueError, match="rates"):
            lat.parse_rates(bad)


@pytest.mark.unit
def test_source_options_are_key_value_pairs():
    assert lat.parse_source_options(["maxInFlight=5000", "a=b=c"]) == {
        "maxInFlight": "5000", "a": "b=c"}
    with pytest.raises(ValueError, match="key=value"):
        lat.parse_source_options(["maxInFlight"])


@pytest.mark.unit
def test_the_command_line_refuses_what_cannot_be_measured(capsys):
    for argv in (["--seconds", "0"], ["--size", "10"], ["--rates", "x"],
                 ["--option", "novalue"]):
        with pytest.raises(SystemExit) as exc:
            lat.main(argv)
        assert exc.value.code == 2, argv
    assert "rates 'x'" in capsys.readouterr().err


@pytest.mark.unit
def test_the_rate_baseline_runs_next_to_the_nsq_runs_of_its_trigger():
    args = lat.build_parser().parse_args(["--rates", "20,2000", "--triggers", "1s,default",
                                          "--with-rate-source"])
    assert [(s, r, t.label) for s, r, t in lat.configurations(args)] == [
        ("rate", 20, "1s"), ("nsq", 20, "1s"), ("nsq", 2000, "1s"),
        ("rate", 20, "default"), ("nsq", 20, "default"), ("nsq", 2000, "default")]
    args = lat.build_parser().parse_args(["--rates", "20", "--triggers", "default"])
    assert [s for s, _, _ in lat.configurations(args)] == ["nsq"]
    args = lat.build_parser().parse_args(["--rates", "20,2000", "--triggers", "1s,default",
                                          "--with-rate-source", "--with-python-floor"])
    assert [(s, r, t.label) for s, r, t in lat.configurations(args)] == [
        ("rate", 20, "1s"), ("pyrate", 20, "1s"), ("nsq", 20, "1s"), ("nsq", 2000, "1s"),
        ("rate", 20, "default"), ("pyrate", 20, "default"), ("nsq", 20, "default"),
        ("nsq", 2000, "default")]


# -- bodies and statistics --------------------------------------------------------------

@pytest.mark.unit
@given(seq=st.integers(0, 10**9), at=st.floats(1e9, 4e9), size=st.integers(40, 300))
def test_a_body_carries_its_sequence_number_and_publish_time(seq, at, size):
    body = lat.make_body(seq, at, size)
    assert len(body) == size
    got_seq, got_at = lat.parse_body(body)
    assert got_seq == seq and abs(got_at - at) <= 1e-6


@pytest.mark.unit
def test_percentile_is_nearest_rank():
    values = [float(v) for v in range(1, 101)]
    assert lat.percentile(values, 50) == 50.0
    assert lat.percentile(values, 99) == 99.0
    assert lat.percentile(values, 100) == 100.0
    assert lat.percentile([7.0], 99) == 7.0
    assert math.isnan(lat.percentile([], 50))


def _progress(at: float, rows: int, trigger_ms: float, add_ms: float | None) -> dict:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(at)) + f".{int(at % 1 * 1000):03d}Z"
    durations = {"triggerExecution": trigger_ms, "latestOffset": 5}
    if add_ms is not None:
        durations["addBatch"] = add_ms
    return {"timestamp": stamp, "numInputRows": rows, "durationMs": durations}


@pytest.mark.unit
def test_batches_are_the_triggers_that_ran_one_and_carry_their_start_time():
    t0 = 1_800_000_000.0
    batches = lat.batch_timings([_progress(t0, 10, 300, 200), _progress(t0 + 1.5, 0, 4, None)])
    assert batches == [lat.BatchTiming(t0, 10, {"triggerExecution": 300.0,
                                                "latestOffset": 5.0, "addBatch": 200.0})]


@pytest.mark.unit
def test_min_batches_waits_for_batches_started_in_the_window_and_a_row_published_in_it():
    """--min-batches: a count to wait for, not a time (a slow machine only waits longer)."""
    t0 = 1_800_000_000.0

    class Query:
        recentProgress: list[dict] = []

    query, sink = Query(), lat._Sink("nsq")
    assert not lat._enough(query, sink, t0, 1)  # nothing yet
    Query.recentProgress = [_progress(t0 - 1, 5, 300, 200)]  # a warm-up batch only
    sink.arrivals.add([(0, t0 - 1.5)], t0 - 0.5)
    assert not lat._enough(query, sink, t0, 1)
    Query.recentProgress.append(_progress(t0 + 2, 5, 300, 200))  # started in the window
    assert not lat._enough(query, sink, t0, 1)  # its rows not arrived yet
    sink.arrivals.add([(1, t0 + 1.0)], t0 + 2.5)
    assert lat._enough(query, sink, t0, 1)
    assert not lat._enough(query, sink, t0, 2)
    for argv in (["--min-batches", "-1"],):
        with pytest.raises(SystemExit):
            lat.main(argv)


@pytest.mark.unit
def test_summary_counts_every_row_and_measures_only_the_window():
    t0 = 1_800_000_000.0
    arrivals = lat.Arrivals()
    arrivals.add([(0, t0 + 0.5), (1, t0 + 0.6)], t0 + 1.0)  # warm-up: not measured
    arrivals.add([(2, t0 + 2.0), (3, t0 + 2.5)], t0 + 3.0)  # latencies 1.0, 0.5
    arrivals.add([(3, t0 + 2.5), (9, t0 + 3.5)], t0 + 4.0)  # 3 again; 9 never published
    batches = lat.batch_timings([
        _progress(t0 + 1.0, 2, 1000, 900),  # before the window
        _progress(t0 + 2.0, 2, 300, 200), _progress(t0 + 3.0, 2, 500, 400),
        _progress(t0 + 3.5, 0, 2, None),  # idle trigger: no batch
    ])
    s = lat.summarize(arrivals, published=5, batches=batches, window=(t0 + 2, t0 + 4))
    assert (s["published"], s["received"]) == (5, 6)
    assert (s["duplicates"], s["missing"], s["unexpected"]) == (1, 1, 1)
    assert s["exactly_once"] is False
    # rows published in the window: 2, 3, 3 (again), 9 -> latencies 1.0, 0.5, 1.5, 0.5
    assert s["measured_rows"] == 4
    assert s["latency_p50_s"] == 0.5 and s["latency_p99_s"] == 1.5
    assert s["batches"] == 2 and s["batches_per_s"] == 1.0
    assert s["triggerExecution_ms"] == 400.0 and s["addBatch_ms"] == 300.0
    assert s["triggerExecution_max_ms"] == 500.0
    assert s["rows_per_batch"] == 2.0
    assert s["latency_p99_per_5s"] == [1.5]  # a 2 s window is one slice


@pytest.mark.unit
def test_every_message_once_is_exactly_once():
    arrivals = lat.Arrivals()
    arrivals.add([(i, 10.0) for i in range(3)], 11.0)
    s = lat.summarize(arrivals, published=3, batches=[], window=(0.0, 20.0))
    assert s["exactly_once"] is True and s["latency_p99_s"] == 1.0
    assert s["batches"] == 0 and math.isnan(s["triggerExecution_ms"])
    # 20 s: four slices, the rows (published at 10.0) in the third
    assert s["latency_p99_per_5s"][2] == 1.0
    assert [math.isnan(v) for v in s["latency_p99_per_5s"]] == [True, True, False, True]


@pytest.mark.unit
def test_overhead_is_nsq_minus_rate_mean_trigger_execution_at_the_same_rate_and_trigger():
    def r(source, rate, trigger, ms, add_ms=0.0):
        return {"source": source, "rate": rate, "trigger": trigger, "triggerExecution_ms": ms,
                "addBatch_ms": add_ms}

    results = [r("rate", 20, "1s", 180.0, 100.0), r("nsq", 2000, "1s", 400.0),
               r("nsq", 20, "1s", 380.0, 250.0), r("nsq", 20, "default", 300.0)]
    assert lat.overheads(results) == [{
        "trigger": "1s", "over": "nsq", "base": "rate", "nsq_rate": 20, "rate_rate": 20,
        "nsq_triggerExecution_ms": 380.0, "rate_triggerExecution_ms": 180.0,
        "overhead_ms": 200.0, "addBatch_overhead_ms": 150.0}]
    # no pyrate run: only the line against rate
    assert [line.split(",")[0] for line in lat.overhead_lines(results)] == [
        "per-batch overhead of nsq over rate"]


@pytest.mark.unit
def test_with_pyrate_the_overheads_are_stated_against_it_too():
    def r(source, trigger, ms, add_ms):
        return {"source": source, "rate": 20, "trigger": trigger, "triggerExecution_ms": ms,
                "addBatch_ms": add_ms}

    results = [r("rate", "1s", 140.0, 60.0), r("pyrate", "1s", 190.0, 100.0),
               r("nsq", "1s", 225.0, 130.0)]
    got = {(o["over"], o["base"]): o["overhead_ms"] for o in lat.all_overheads(results)}
    assert got == {("nsq", "rate"): 85.0, ("nsq", "pyrate"): 35.0, ("pyrate", "rate"): 50.0}
    lines = lat.overhead_lines(results)
    assert lines[1] == (
        "per-batch overhead of nsq over a Python source (pyrate), trigger 1s: 35 ms (mean "
        "triggerExecution: nsq 20/s 225 ms - pyrate 20/s 190 ms; addBatch +30 ms)")
    assert lines[2].startswith("per-batch overhead of a Python source (pyrate) over rate, "
                               "trigger 1s: 50 ms")


# -- pyrate: the rate source as a Python data source ------------------------------------

@pytest.mark.unit
def test_pyrate_counts_the_rows_generated_before_now_and_stamps_each_when_generated():
    t0 = 1_800_000_000_000_000
    assert pyrate_source.rows_at(t0, t0, 20) == 0
    assert pyrate_source.rows_at(t0, t0 - 5, 20) == 0  # a clock behind the start
    assert pyrate_source.rows_at(t0, t0 + 1, 20) == 1  # row 0: generated at the start
    assert pyrate_source.rows_at(t0, t0 + 50_000, 20) == 1  # row 1 is due now, not before
    assert pyrate_source.rows_at(t0, t0 + 50_001, 20) == 2
    assert pyrate_source.rows_at(t0, t0 + 10_000_000, 20) == 200
    assert pyrate_source.generated_us(t0, 0, 20) == t0
    assert pyrate_source.generated_us(t0, 3, 20) == t0 + 150_000
    assert pyrate_source.generated_us(t0, 1, 3) == t0 + 333_333
    # every row counted at a time was generated before it: latency is never negative
    for now in range(t0, t0 + 1_000_000, 7_919):
        n = pyrate_source.rows_at(t0, now, 3)
        assert n == 0 or pyrate_source.generated_us(t0, n - 1, 3) < now
        assert pyrate_source.generated_us(t0, n, 3) >= now


@pytest.mark.unit
@given(lo=st.integers(0, 1000), n=st.integers(0, 50), parts=st.integers(1, 8))
def test_pyrate_splits_a_range_over_at_most_num_partitions_tasks_each_row_once(lo, n, parts):
    tasks = pyrate_source.plan(7, 20, lo, lo + n, parts)
    assert len(tasks) == min(parts, n)
    rows = sorted(v for t in tasks for v in range(t.first, t.end, t.step))
    assert rows == list(range(lo, lo + n))
    assert all(t.start_us == 7 and t.rows_per_second == 20 for t in tasks)


@pytest.mark.unit
def test_pyrate_reads_its_rows_at_once_as_one_arrow_batch_and_offsets_are_row_counts():
    reader = pyrate_source.PyRateStreamReader({"rowsPerSecond": "20", "numPartitions": "2"})
    start = reader.initialOffset()
    assert start == {"start_us": reader.start_us, "rows": 0}
    later = {"start_us": reader.start_us, "rows": 5}
    # the clock cannot take back rows Spark saw; a restart keeps the offset's start
    assert reader.latestOffset(later, None)["rows"] >= 5
    assert reader.latestOffset({"start_us": 0, "rows": 0}, None)["start_us"] == 0
    tasks = reader.partitions(start, later)
    batches = [list(reader.read(t)) for t in tasks]
    assert [len(b) for b in batches] == [1, 1]
    values = sorted(v for b in batches for v in b[0].column("value").to_pylist())
    assert values == [0, 1, 2, 3, 4]
    stamps = {v: ts for b in batches for v, ts in zip(b[0].column("value").to_pylist(),
                                                      b[0].column("timestamp").to_pylist())}
    assert stamps[4].timestamp() == pytest.approx(reader.start_us / 1e6 + 0.2, abs=1e-6)
    assert reader.partitions(later, later) == []
    assert pyrate_source.PyRateDataSource({}).schema() == "value long, timestamp timestamp"
    with pytest.raises(ValueError, match="rowsPerSecond"):
        pyrate_source.PyRateStreamReader({"rowsPerSecond": "0"})


# -- the publisher against nsqd ---------------------------------------------------------

@pytest.mark.nsqd
@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_the_publisher_keeps_its_pace_and_nsqd_has_every_message(nsq_cluster):
    node = nsq_cluster.nsqds[0]
    pub = lat.PacedPublisher(node.http_address, "paced", rate=400, size=100)
    pub.start()
    time.sleep(1.5)
    pub.stop()
    pub.join(10)
    assert pub.error is None
    elapsed = pub.stopped_at - pub.started_at
    # message i is due i/rate after the start: what was sent is what was due, give or
    # take one request's worth
    assert abs(pub.sent - 400 * elapsed) <= 40, (pub.sent, elapsed)
    topics = [t for t in node.stats("paced")["topics"] if t["topic_name"] == "paced"]
    assert topics[0]["message_count"] == pub.sent


# -- the whole benchmark, briefly -------------------------------------------------------

@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.timeout(420)
def test_a_short_run_on_a_standalone_cluster_is_exactly_once_and_measures_each_config(
        tmp_path):
    out = tmp_path / "figures.json"
    # --min-batches 1: each configuration measures until one batch started in its window
    # has ended, however slow the machine (a loaded one once gave Spark's own rate source
    # no batch in 4 s); --drain-timeout 60 and the timeouts only catch a hang
    proc = subprocess.run(
        [sys.executable, "-m", "bench.bench_spark_latency", "--rates", "200",
         "--triggers", "1s", "--seconds", "4", "--warmup", "2", "--session-warmup", "5",
         "--drain-timeout", "60", "--min-batches", "1",
         "--with-rate-source", "--with-python-floor", "--json", str(out)],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True,
        text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert [(r["source"], r["rate"], r["trigger"]) for r in figures["results"]] == [
        ("rate", 20, "1s"), ("pyrate", 20, "1s"), ("nsq", 200, "1s")]
    for r in figures["results"]:
        assert r["exactly_once"] and r["received"] == r["published"] > 0, r
        # figures, not speeds: measured, ordered, finite (how fast is bench/RESULTS.md's)
        assert 0 < r["latency_p50_s"] <= r["latency_p99_s"], r
        assert math.isfinite(r["latency_p99_s"]) and r["seconds"] >= 4, r
        assert r["batches"] >= 1 and r["triggerExecution_ms"] > 0, r
    assert [(o["over"], o["base"], o["trigger"]) for o in figures["overheads"]] == [
        ("nsq", "rate", "1s"), ("nsq", "pyrate", "1s"), ("pyrate", "rate", "1s")]
    assert "per-batch overhead of nsq over rate, trigger 1s" in proc.stdout
    assert "per-batch overhead of nsq over a Python source (pyrate), trigger 1s" in proc.stdout
