"""The Spark benchmarks run at HEAD, in their smallest form, in the shared Spark session
(no JVM of their own): ``bench.bench_spark`` (the ceilings, the ``nsq`` source, the
Reader's block path, the runs without Spark) and ``bench.bench_sink``. Counts, never
speeds: every row of each query, nothing left on nsqd, every message the Reader alone
took. (A ceiling that no longer matches the source's schema failed here: it is what
stopped ``make bench`` before.)"""

from __future__ import annotations

import json

import pytest

from bench import bench_sink, bench_spark

pytestmark = [pytest.mark.spark, pytest.mark.nsqd, pytest.mark.slow]


@pytest.mark.timeout(600)
def test_bench_spark_smallest_form_reads_every_message(spark, tmp_path, capsys):
    out = tmp_path / "figures.json"
    assert bench_spark.main(["--messages", "2000", "--rounds", "1", "--no-spark-messages",
                             "1000", "--json", str(out)], spark=spark) == 0
    figures = json.loads(out.read_text())
    (r,) = figures["rounds"]
    assert r["ceiling_rows"] == r["tuples_ceiling_rows"] == 2000, r
    assert r["nsq_rows"] == 2000 and r["left_on_nsqd"] == 0 and r["nsqd_requeues"] == 0, r
    assert r["reader_blocks_messages"] == 2000, r
    assert figures["nospark_reader_alone_messages"] == 1000
    assert figures["nospark_fetch_task_messages"] == 1000
    assert set(r["task_cpu_us_per_msg"]) >= {"fetch", "io", "convert", "spool_write", "seen",
                                             "handover", "loop", "all"}
    assert "fetch tasks' CPU" in capsys.readouterr().err


@pytest.mark.timeout(600)
def test_bench_sink_smallest_form_publishes_every_row(spark):
    # the benchmark itself asserts that nsqd holds every row of each case
    results = bench_sink.main(["--messages", "500", "--rounds", "1"], spark=spark)
    assert len(results) == 5 and all(len(rates) == 1 for rates in results.values())
