"""Cached virtual environments of the tiers that run this checkout somewhere else: on
another pyspark (``scripts/install-pyspark-versions``) or another Python
(``scripts/install-python-versions``). One rule for both, written once here:

* a venv lives in the per-user cache (:func:`~nsq_spark.testing._binaries.cache_root`) as
  ``<name>-<digest>``, where the digest covers the interpreter's version and the
  requirement list it was built from: checkouts that agree share it, and a branch that
  changes a requirement gets a directory of its own, so two checkouts never rebuild (or
  delete) each other's venv while the other is using it;
* it is complete when its stamp file (the requirement list, written last) is there: a
  half-built one (interrupted) is built anew;
* builders take one lock on the cache: checkouts and workers build one at a time;
* the package itself is not installed: the tiers put the checkout under test first on
  PYTHONPATH, so a venv serves any checkout.

The requirement lists come from setup.cfg (``install_requires`` and extras), so they are
written once. Standard library only: the installers run before any dependency is.
"""

from __future__ import annotations

import configparser
import fcntl
import hashlib
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import IO, Iterator, Sequence

from ._binaries import cache_root

__all__ = ["CachedVenv", "building_lock", "setup_cfg_requirements"]

STAMP = ".nsq-spark-requirements"


def setup_cfg_requirements(root: Path, extras: Sequence[str] = (),
                           drop: Sequence[str] = ()) -> list[str]:
    """setup.cfg's ``install_requires`` and the entries of ``extras``, in order, each once,
    without those whose project name is in ``drop``."""
    cfg = configparser.ConfigParser()
    cfg.read(root / "setup.cfg")

    def entries(section: str, key: str) -> list[str]:
        return [e.strip() for e in cfg[section][key].splitlines()
                if e.strip() and not e.strip().startswith("#")]

    found = entries("options", "install_requires")
    for extra in extras:
        found += entries("options.extras_require", extra)
    out: list[str] = []
    for entry in found:
        project = entry.split(";")[0].split("[")[0]
        for sep in "<>=!~ ":
            project = project.split(sep)[0]
        if entry not in out and project.lower() not in {d.lower() for d in drop}:
            out.append(entry)
    return out


def python_version(python: str) -> str:
    """``major.minor`` of the interpreter ``python`` (it is run to ask)."""
    return subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                          capture_output=True, text=True, check=True,
                          timeout=60).stdout.strip()


@dataclass(frozen=True)
class CachedVenv:
    """A venv ``name`` made with ``python`` holding ``requirements``."""

    name: str
    python: str
    requirements: tuple[str, ...]

    @cached_property
    def digest(self) -> str:
        text = "\n".join([python_version(self.python), *self.requirements])
        return hashlib.sha256(text.encode()).hexdigest()[:10]

    @property
    def path(self) -> Path:
        return cache_root() / f"{self.name}-{self.digest}"

    @property
    def bin_python(self) -> Path:
        return self.path / "bin" / "python"

    def is_built(self) -> bool:
        stamp = self.path / STAMP
        return (self.bin_python.exists() and stamp.exists()
                and stamp.read_text() == "\n".join(self.requirements))

    def build(self, log: IO[str] = sys.stderr) -> None:
        """Build it anew (whatever is in its directory is removed first)."""
        target = self.path
        shutil.rmtree(target, ignore_errors=True)
        t0 = time.monotonic()
        log.write(f"building {target} ({' '.join(self.requirements)})\n")
        log.flush()
        subprocess.run([self.python, "-m", "venv", str(target)], check=True)
        subprocess.run([str(self.bin_python), "-m", "pip", "install", "-q",
                        "--disable-pip-version-check", *self.requirements],
                       check=True, timeout=1800)
        (target / STAMP).write_text("\n".join(self.requirements))
        log.write(f"{target} ready in {time.monotonic() - t0:.0f} s\n")
        log.flush()


@contextmanager
def building_lock(name: str) -> Iterator[None]:
    """One builder of the cache's venvs at a time (checkouts share the cache)."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
