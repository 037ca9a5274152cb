"""Every benchmark runs at HEAD: each in its smallest form, in a process of its own, as
``make bench`` runs it (bench/RESULTS.md's figures can only be reproduced with code that
still runs). Counts are asserted where a benchmark reports them (messages consumed,
rows, what is left on nsqd), never a speed: how fast is bench/RESULTS.md's business.

The Spark benchmarks run in the shared Spark session (tests/spark/test_bench_spark.py),
the latency benchmark on a standalone cluster (tests/test_bench_smoke.py), the options
benchmark beside the rows it measures (tests/test_options_rows.py); this file
checks that every benchmark is in one of them and in the Makefile's ``BENCHES``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench"

# The smallest form of each benchmark run here: its arguments.
SMALLEST = {
    "bench_backlog_poll": ["--intervals", "0,0.1", "--idle-seconds", "0.3", "--samples", "2"],
    "bench_consume": ["--n", "2000", "--kinds",
                      "pynsq,go-nsq,msg,batch,pull,blocks,aiter,abatches"],
    "bench_copies": ["--publishes", "300", "--rounds", "1", "--warmup", "0"],
    "bench_decode": ["--frames", "2000", "--repeat", "1"],
    "bench_dedup": ["--smoke"],
    "bench_driver_batch": ["--batches", "3", "--warmup", "1"],
    "bench_fetch_stages": ["--messages", "2000", "--rounds", "1", "--warmup", "0"],
    "bench_fetch_task": ["--rounds", "2", "--warmup", "1"],
    "bench_latency": ["--rates", "300", "--seconds", "0.5", "--warmup", "0.2"],
    "bench_nsqd_raw": ["--n", "2000"],
    "bench_publish": ["--messages", "2000", "--pub-messages", "10000", "--serial-messages",
                      "100", "--rounds", "1"],
    "bench_publish_spool": ["--messages", "2000", "--single-messages", "200"],
    "bench_trace_column": ["--calls", "2", "--runs", "1"],
}
# run elsewhere: in the shared Spark session, on the standalone cluster, or beside the
# rows they measure
ELSEWHERE = {"bench_spark": "tests/spark/test_bench_spark.py",
             "bench_sink": "tests/spark/test_bench_spark.py",
             "bench_spark_latency": "tests/test_bench_smoke.py",
             "bench_options": "tests/test_options_rows.py"}
# not benchmarks: the interleaving tool, helpers the benchmarks import
HELPERS = {"ab", "timings", "pyrate_source", "__init__"}


def _run(args: list[str], timeout: float = 240) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, (args, proc.stdout[-3000:], proc.stderr[-3000:])
    return proc


def _json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


# -- the list -------------------------------------------------------------------------


@pytest.mark.unit
def test_every_benchmark_has_a_smallest_form_that_a_test_runs():
    modules = {p.stem for p in BENCH.glob("*.py")} - HELPERS
    assert modules == set(SMALLEST) | set(ELSEWHERE) | {"cpu_publish_spool"}, (
        "a benchmark without a smoke test can rot unseen: give it its smallest form here")
    for module, where in ELSEWHERE.items():
        assert re.search(rf"bench[. ](import )?{module}\b", (REPO / where).read_text()), \
            (module, where)


@pytest.mark.unit
def test_make_bench_runs_every_benchmark():
    makefile = (REPO / "Makefile").read_text()
    joined = re.sub(r"\\\n\s*", " ", makefile)  # continuation lines
    benches = set(re.search(r"^BENCHES := (.*)$", joined, re.M).group(1).split())
    modules = {p.stem.removeprefix("bench_") for p in BENCH.glob("bench_*.py")}
    assert benches == modules
    assert "bench/cpu_publish_spool.py" in makefile


# -- the runs ------------------------------------------------------------------------


@pytest.mark.nsqd
@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("module", sorted(set(SMALLEST) - {"bench_consume", "bench_latency",
                                                           "bench_fetch_stages",
                                                           "bench_copies"}))
def test_the_benchmark_runs_in_its_smallest_form(module):
    proc = _run(["-m", f"bench.{module}", *SMALLEST[module]])
    assert proc.stdout.strip(), f"{module} printed no figure"


@pytest.mark.nsqd
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bench_consume_every_consumer_takes_every_message():
    proc = _run(["-m", "bench.bench_consume", *SMALLEST["bench_consume"]])
    runs = {r["kind"]: r for r in _json_lines(proc.stdout) if "kind" in r}
    kinds = SMALLEST["bench_consume"][-1].split(",")
    assert sorted(runs) == sorted(kinds)
    for kind, r in runs.items():
        if kind == "go-nsq" and shutil.which("go") is None:
            assert "go toolchain not found" in r["error"]
            continue
        assert "error" not in r, r
        assert r["messages"] == 2000 and r["left_in_channel"] == 0, r


@pytest.mark.nsqd
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bench_latency_measures_each_client_on_every_message():
    proc = _run(["-m", "bench.bench_latency", *SMALLEST["bench_latency"]])
    results = _json_lines(proc.stdout)
    assert [r["consumer"] for r in results] == ["ours", "go-nsq", "pynsq"]
    for r in results:
        if "skipped" in r:  # no Go toolchain: said so, not a number
            assert r["consumer"] == "go-nsq" and shutil.which("go") is None, r
            continue
        # 300/s for 0.7 s: 210 published, those after the 0.2 s warm-up measured
        assert r["messages"] == r["published"] == 210, r
        assert r["measured"] == 150, r
        assert 0 < r["p50_s"] <= r["p99_s"] <= r["max_s"], r


@pytest.mark.nsqd
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bench_fetch_stages_two_tasks_take_the_backlog_and_profile_it():
    proc = _run(["-m", "bench.bench_fetch_stages", *SMALLEST["bench_fetch_stages"]])
    rounds = [r for r in _json_lines(proc.stdout) if "round" in r]
    assert len(rounds) == 1 and rounds[0]["rows"] == 2000 and rounds[0]["redelivered"] == 0
    profile = rounds[0]["task_cpu_us_per_msg"]
    assert profile["all"] > 0 and profile["convert"] > 0 and profile["spool_write"] > 0
    assert rounds[0]["reader_blocks_cpu_us_per_msg"] > 0


@pytest.mark.nsqd
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bench_copies_every_publish_is_one_row():
    proc = _run(["-m", "bench.bench_copies", *SMALLEST["bench_copies"]])
    cases = {r["case"]: r for r in _json_lines(proc.stdout) if "rows" in r}
    assert sorted(cases) == ["ids", "plain", "replicas"]
    for case, r in cases.items():
        assert r["rows"] == 300, r
    assert cases["replicas"]["copies_dropped"] == 300


@pytest.mark.nsqd
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_cpu_publish_spool_runs_on_this_tree():
    proc = _run(["bench/cpu_publish_spool.py", str(REPO), "200"])
    assert "us CPU per call" in proc.stdout


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ab_interleaves_two_revisions_of_a_benchmark(tmp_path):
    """bench/ab.py, the before/after tool, on the smallest benchmark against HEAD."""
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout: bench/ab.py compares git revisions")
    proc = _run(["-m", "bench.ab", "--before", "HEAD", "--rounds", "1", "bench_trace_column",
                 "--calls", "1", "--runs", "1"])
    assert "===== before" in proc.stdout and "===== after" in proc.stdout
    assert proc.stdout.count("blocks_to_batch plain") == 2
