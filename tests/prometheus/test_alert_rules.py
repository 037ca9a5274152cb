"""The example alert rules (examples/prometheus/nsq-alerts.yml) pass ``promtool check
rules``, and ``promtool test rules`` (nsq-alerts.test.yml: synthetic series) shows the
alerts fire with their labels and summaries. No server; skipped without promtool."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from promserver import promtool_binary

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
