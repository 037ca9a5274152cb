"""The release a platform installs: the sdist and the wheel of this checkout, as
``python -m build`` makes them (the wheel built from the sdist, so the sdist is complete),
checked with ``twine check --strict``, their metadata read back, and the wheel installed
in a clean venv where a smoke test runs from it, not from the checkout: the version, the
``nsq-spark`` command, ``py.typed``, ``pyspark_nsq``, and a Producer and Reader round trip
against a real nsqd.
"""

from __future__ import annotations

import email
import os
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from pathlib import Path

import pytest

from nsq_spark._version import __version__

pytestmark = [pytest.mark.release, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parent.parent
PYTHONS = ("3.11", "3.12", "3.13")  # the Python tier's (tests/pythons) and the main venv's


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    pytest.importorskip("build", reason="the test extra is not installed (build)")
    out = tmp_path_factory.mktemp("dist")
    proc = subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), str(REPO)],
                          capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    found = {p.suffix: p for p in out.iterdir()}
    assert set(found) == {".whl", ".gz"}, sorted(out.iterdir())
    return {"wheel": found[".whl"], "sdist": found[".gz"]}


def test_twine_checks_both_strictly(dists: dict[str, Path]):
    pytest.importorskip("twine", reason="the test extra is not installed (twine)")
    proc = subprocess.run([sys.executable, "-m", "twine", "check", "--strict",
                           str(dists["sdist"]), str(dists["wheel"])],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("PASSED") == 2, proc.stdout


def test_the_wheel_says_what_a_platform_checks(dists: dict[str, Path]):
    wheel = dists["wheel"]
    assert wheel.name == f"nsq_spark-{__version__}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        meta = email.message_from_bytes(
            z.read(f"nsq_spark-{__version__}.dist-info/METADATA"))
        entry_points = z.read(f"nsq_spark-{__version__}.dist-info/entry_points.txt").decode()
    assert {"nsq_spark/py.typed", "pyspark_nsq.py", "nsq_spark/__init__.py"} <= names
    assert not any(n.startswith(("tests/", "bench/", "docs/")) for n in names)
    assert meta["Version"] == __version__ and "dev" not in __version__
    assert meta["Requires-Python"] == ">=3.11"
    classifiers = meta.get_all("Classifier")
    for version in PYTHONS:
        assert f"Programming Language :: Python :: {version}" in classifiers
    assert "Typing :: Typed" in classifiers
    requires = meta.get_all("Requires-Dist")
    # the spark extra's floors are pyspark 4.3's own (its sql extra)
    for floor in ("pyarrow>=18", "numpy>=1.23.2", "pandas<3,>=2.2"):
        assert any(r.replace(" ", "").startswith(floor) and 'extra=="spark"' in
                   r.replace(" ", "") for r in requires), (floor, requires)
    urls = meta.get_all("Project-URL")
    assert urls and any(u.startswith("NSQ protocol, https://") for u in urls), urls
    assert "nsq-spark = nsq_spark.cli:main" in entry_points
    assert meta.get_content_type() == "text/plain" and "# nsq-spark" in meta.get_payload()


def test_the_sdist_carries_the_tests_docs_and_tools(dists: dict[str, Path]):
    top = f"nsq_spark-{__version__}"
    with tarfile.open(dists["sdist"]) as t:
        names = set(t.getnames())
    for path in ("README.md", "CHANGELOG.md", "LICENSE", "Makefile", "mkdocs.yml",
                 "setup.cfg", "pyproject.toml", "pyspark_nsq.py", "nsq_spark/py.typed",
                 "tests/conftest.py", "docs/getting-started.md", "scripts/install-nsq",
                 "bench/RESULTS.md", "examples/demo.py"):
        assert f"{top}/{path}" in names, path
    assert not any("__pycache__" in n for n in names)


@pytest.mark.nsqd
@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_the_wheel_installed_in_a_clean_venv_works_from_there(dists: dict[str, Path],
                                                              nsq_cluster, tmp_path):
    venv = tmp_path / "clean"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python, bindir = venv / "bin" / "python", venv / "bin"
    install = subprocess.run([str(python), "-m", "pip", "install", "-q",
                              "--disable-pip-version-check", str(dists["wheel"])],
                             capture_output=True, text=True, timeout=400)
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
    # nothing of the checkout: another directory, no PYTHONPATH
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    work = tmp_path / "elsewhere"
    work.mkdir()
    version = subprocess.run([str(bindir / "nsq-spark"), "--version"], cwd=work, env=env,
                             capture_output=True, text=True, timeout=60)
    assert version.returncode == 0 and __version__ in version.stdout, version
    smoke = textwrap.dedent(f"""
        import pathlib, sys
        import nsq_spark as nsq
        from nsq_spark.errors import SparkVersionError
        try:  # the module pyspark's discovery imports: there, and it names the extra
            import pyspark_nsq
        except SparkVersionError as exc:
            assert "pip install 'nsq-spark[spark]'" in str(exc), exc
        else:
            raise AssertionError("pyspark_nsq imported without pyspark installed")
        where = pathlib.Path(nsq.__file__).resolve()
        assert where.is_relative_to(pathlib.Path(sys.prefix).resolve()), where
        assert (where.parent / "py.typed").exists()
        assert nsq.__version__ == {__version__!r}
        sent = [b"release-%d" % i for i in range(50)]
        with nsq.Producer({nsq_cluster.nsqd_tcp_addresses[0]!r}) as producer:
            producer.mpublish("release", sent)
        got = []
        with nsq.Reader("release", "smoke", max_in_flight=50,
                        nsqd_tcp_addresses=[{nsq_cluster.nsqd_tcp_addresses[0]!r}]) as r:
            while len(got) < len(sent):
                batch = r.get_batch(max_messages=50, timeout=10)
                assert batch, len(got)
                got += [m.body for m in batch]
                r.finish(batch)
        assert sorted(got) == sorted(sent), len(got)
        print("SMOKE OK", where)
        """)
    run = subprocess.run([str(python), "-c", smoke], cwd=work, env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "SMOKE OK" in run.stdout, run.stdout + run.stderr
    assert str(venv) in run.stdout


def test_the_changelog_has_a_section_for_this_version_below_an_unreleased_one():
    """Keep a Changelog: ``## [Unreleased]`` first (what merges next lands there), then
    this version's section, dated."""
    import re

    headings = re.findall(r"^## \[([^\]]+)\](?: - (\d{4}-\d{2}-\d{2}))?$",
                          (REPO / "CHANGELOG.md").read_text(), re.M)
    assert headings[0] == ("Unreleased", "")
    assert headings[1][0] == __version__ and headings[1][1], headings[:3]
