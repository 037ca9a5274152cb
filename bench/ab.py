"""Run one benchmark on two revisions of the library, interleaved, in one run.

    flock /tmp/nsq-spark-bench.lock python -m bench.ab --before 32b963a --rounds 3 \\
        -- bench_consume --kinds msg,batch,pull,blocks

The ``--before`` revision is checked out into a temporary git worktree; the benchmark
module then runs alternately there and in this checkout (before, after, before, after,
...), each time as ``python -m bench.<module> ARGS`` with that tree as its working
directory and first on ``PYTHONPATH`` (the benchmarks start their children the same way),
so both see the same machine, the same nsqd binaries and the same load. The benchmark's
own output is printed under a header naming the revision and the round; compare the
figures side by side. The worktree is removed at the end.

The benchmark file itself is always this checkout's: it is copied over the before tree's
(or into it, when the before revision does not have it, e.g. a benchmark written for the
change being measured), so only the library differs. A benchmark that imports helpers
from the tree it runs in (``tests/``, other ``bench/`` files) gets the before tree's.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True,
                          text=True).stdout.strip()


def _run(tree: Path, label: str, round_: int, module: str, args: list[str]) -> None:
    env = dict(os.environ, PYTHONPATH=str(tree))
    print(f"\n===== {label} ({_git('-C', str(tree), 'rev-parse', '--short', 'HEAD')}), "
          f"round {round_} =====", flush=True)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", f"bench.{module}", *args], cwd=tree, env=env,
                   check=False, timeout=3600)
    print(f"----- {label} round {round_}: {time.perf_counter() - t0:.1f} s wall", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, help="git revision to compare against")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("module", help="benchmark module under bench/, e.g. bench_consume")
    ap.add_argument("args", nargs=argparse.REMAINDER, help="the benchmark's arguments")
    opts = ap.parse_args()
    if opts.rounds < 1:
        ap.error("--rounds must be at least 1")
    if not (ROOT / "bench" / f"{opts.module}.py").exists():
        ap.error(f"no benchmark bench/{opts.module}.py")
    with tempfile.TemporaryDirectory(prefix="nsq-spark-ab-") as tmp:
        before = Path(tmp) / "before"
        _git("worktree", "add", "--detach", str(before), opts.before)
        try:
            # the benchmark script itself comes from this checkout in both runs, so only
            # the library differs
            bench_file = before / "bench" / f"{opts.module}.py"
            if not bench_file.exists():
                print(f"bench/{opts.module}.py is not in {opts.before}: running this "
                      "checkout's copy against its library", flush=True)
            bench_file.write_bytes(
                (ROOT / "bench" / f"{opts.module}.py").read_bytes())
            for i in range(1, opts.rounds + 1):
                _run(before, "before", i, opts.module, opts.args)
                _run(ROOT, "after", i, opts.module, opts.args)
        finally:
            _git("worktree", "remove", "--force", str(before))


if __name__ == "__main__":
    main()
