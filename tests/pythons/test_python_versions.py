"""The Python tier: the checkout on every other Python it claims (setup.cfg's
classifiers), not only the main venv's 3.11.

For each version in ``python-versions.txt``, with that version's cached venv
(``scripts/install-python-versions``, called by ``make setup``: setup.cfg's requirements,
the package itself not installed), the checkout first on PYTHONPATH:

* ``python_smoke.py``: a Producer, a Reader through nsqlookupd, the admin client, a
  Spark streaming read (``Trigger.AvailableNow``, every message once) and a batch write,
  against this test's nsqd and nsqlookupd, with ``PYSPARK_PYTHON`` unset;
* the unit tier (``pytest -m unit``) in one process, but for tests/test_typing.py, whose
  mypy run checks the code for Python 3.11 on any interpreter (the main run's check).

An interpreter that cannot be found, or a venv that cannot be built, skips its test with
the reason, unless ``CI`` is set: then it fails, so a green CI run always ran the tier.
"""

from __future__ import annotations

import importlib.machinery
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.pythons, pytest.mark.spark, pytest.mark.nsqd,
              pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
INSTALL = REPO / "scripts" / "install-python-versions"
VERSIONS = [v.strip() for v in (HERE / "python-versions.txt").read_text().splitlines()
            if v.strip() and not v.startswith("#")]


def venv_python(version: str) -> str:
    """The version's venv python, built if missing (a second or so when cached)."""
    run = subprocess.run([sys.executable, str(INSTALL)], capture_output=True, text=True,
                         timeout=1800)
    found = dict(line.split(" ", 1) for line in run.stdout.splitlines() if " " in line)
    python = found.get(version, "")
    if run.returncode == 0 and python and not python.startswith("- "):
        return python
    problem = (f"Python {version}: " + (python[2:] if python.startswith("- ") else
               f"scripts/install-python-versions exited {run.returncode}: "
               f"{run.stderr[-2000:]}"))
    if os.environ.get("CI"):
        pytest.fail(problem)
    pytest.skip(problem)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYSPARK", "SPARK_", "VIRTUAL_ENV", "PYTHON"))}
    env["PYTHONPATH"] = str(REPO)  # this checkout, for the driver and Spark's workers
    return env


def _install_script() -> Any:
    """scripts/install-python-versions as a module, loaded (not run)."""
    loader = importlib.machinery.SourceFileLoader("install_python_versions", str(INSTALL))
    module = types.ModuleType(loader.name)
    module.__file__ = str(INSTALL)
    loader.exec_module(module)
    return module


@pytest.mark.unit
def test_an_interpreter_that_cannot_be_found_is_reported_with_the_way_to_get_it(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """The tier skips it and says why (scripts/install-python-versions prints
    ``VERSION - REASON``); here: no python3.99 anywhere it looks."""
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path))
    python, why = _install_script().find_interpreter("3.99")
    assert python is None
    assert "no Python 3.99" in why and "pyenv install 3.99" in why, why


@pytest.mark.unit
def test_the_interpreter_found_is_the_version_asked_for():
    script = _install_script()
    here = f"{sys.version_info[0]}.{sys.version_info[1]}"
    python, why = script.find_interpreter(here)
    if python is None:  # this interpreter is not where the script looks (a venv only)
        pytest.skip(why)
    assert script._is(python, here) and not script._is(python, "2.7"), python


def _plugin(python: str) -> list[str]:
    """The harness's pytest plugin: found by its entry point where the checkout carries
    the metadata of its editable install (``nsq_spark.egg-info``, made by ``make
    setup``), else named (naming it as well would register it twice)."""
    probe = subprocess.run(
        [python, "-c", "import importlib.metadata as m; print(any(e.name == 'nsq_spark' "
         "for e in m.entry_points(group='pytest11')))"],
        cwd=REPO, env=_env(), capture_output=True, text=True, timeout=60)
    return [] if probe.stdout.strip() == "True" else ["-p", "nsq_spark.testing"]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.nsq_cluster(nsqd=1, lookupd=1)
def test_the_smoke_and_the_unit_tier_on_python(version, nsq_cluster):
    python = venv_python(version)
    node = nsq_cluster.nsqds[0]
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"nsq-python-{version}-") as work:
        cfg = {"nsqd_tcp": node.tcp_address, "nsqd_http": node.http_address,
               "lookupd_http": nsq_cluster.lookupd_http_addresses[0], "workdir": work}
        smoke = subprocess.run([python, str(HERE / "python_smoke.py"), json.dumps(cfg)],
                               cwd=work, env=_env(), capture_output=True, text=True,
                               timeout=300)
    out = smoke.stdout
    print(f"Python {version} smoke: {time.monotonic() - t0:.1f} s\n{out}")
    assert smoke.returncode == 0 and "DONE" in out, (out, smoke.stderr[-4000:])
    assert f"PYTHON {version} " in out, out
    assert f"NSQ_SPARK {REPO / 'nsq_spark'}" in out, out  # the checkout, not a stale copy
    for name in ("admin", "producer", "reader", "spark_stream", "spark_write"):
        assert f"CHECK {name} " in out, out

    t0 = time.monotonic()
    unit = subprocess.run(
        [python, "-m", "pytest", "-m", "unit", *_plugin(python), "-p", "no:cacheprovider",
         "-q", "-n", "0",
         # the typing checks run mypy for --python-version 3.11 whatever the interpreter:
         # the main run's result, again (8-17 s)
         "--ignore", "tests/test_typing.py", "tests"],
        cwd=REPO, env=_env(), capture_output=True, text=True, timeout=580)
    tail = unit.stdout[-3000:]
    print(f"Python {version} unit tier: {time.monotonic() - t0:.1f} s\n{tail}")
    assert unit.returncode == 0, tail + unit.stderr[-3000:]
    summary = unit.stdout.strip().splitlines()[-1]
    passed = re.search(r"(\d+) passed", summary)
    assert passed and int(passed.group(1)) > 1000 and "failed" not in summary, summary
