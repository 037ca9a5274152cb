"""Where the test servers' binaries come from: the facts the harness, the NSQ installer and
the Toxiproxy installer share, written once.

* the versions: nsq v1.3.0, toxiproxy v2.12.0;
* the per-user cache rule: ``$XDG_CACHE_HOME/nsq-spark`` (default ``~/.cache``), with the
  binaries in ``<name>-v<version>/bin`` (for nsq, ``$NSQ_BIN_DIR`` overrides it) and the
  version tier's venvs (scripts/install-pyspark-versions) in ``pyspark-<version>``;
* asking a binary its version (``--version`` / ``-version``) and comparing;
* running the Go toolchain for a one-time build (static: ``CGO_ENABLED=0``; module mode),
  with an :class:`InstallError` that quotes Go's own message.

Only the standard library is used: the installers run before any dependency is installed.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from ..errors import NSQError

__all__ = ["NSQ_VERSION", "NSQ_APPS", "TOXIPROXY_VERSION", "InstallError", "cache_root",
           "cache_bin_dir", "nsq_bin_dir", "reports_version", "run_go"]

NSQ_VERSION = "1.3.0"
NSQ_APPS = ("nsqd", "nsqlookupd", "nsqadmin", "to_nsq", "nsq_tail")
TOXIPROXY_VERSION = "2.12.0"


class InstallError(NSQError, RuntimeError):
    """A binary could not be provided; the message lists the ways out."""


def cache_root() -> Path:
    """The per-user cache of nsq-spark: ``$XDG_CACHE_HOME/nsq-spark`` (else
    ``~/.cache/nsq-spark``), shared by every checkout of the same user."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "nsq-spark"


def cache_bin_dir(name: str, version: str) -> Path:
    """The per-user cache of ``name`` at ``version``: ``<cache_root()>/<name>-v<version>/bin``."""
    return cache_root() / f"{name}-v{version}" / "bin"


def nsq_bin_dir(version: str = NSQ_VERSION) -> Path:
    """``$NSQ_BIN_DIR`` if set, else the per-user cache of nsq ``version``: where
    ``nsq-spark install-nsq`` puts a build and where the harness looks first."""
    chosen = os.environ.get("NSQ_BIN_DIR")
    return Path(chosen) if chosen else cache_bin_dir("nsq", version)


def reports_version(binary: Path, version: str, flag: str = "--version",
                    prefix: str = "v") -> bool:
    """True when ``binary flag`` prints ``prefix`` + ``version`` as a whole word (nsq says
    ``nsqd v1.3.0``, toxiproxy ``2.12.0``)."""
    try:
        out = subprocess.run([str(binary), flag], capture_output=True, text=True,
                             timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return re.search(rf"\b{re.escape(prefix + version)}\b", out) is not None


def run_go(go: str, *args: str, cwd: str | os.PathLike[str] | None = None,
           env: dict[str, str] | None = None,
           check: bool = True) -> subprocess.CompletedProcess[str]:
    """``go args...`` for a static module-mode build; a failure raises
    :class:`InstallError` with Go's message (unless ``check`` is False)."""
    proc = subprocess.run([go, *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "GOFLAGS": "-mod=mod", "CGO_ENABLED": "0",
                               **(env or {})})
    if check and proc.returncode != 0:
        raise InstallError(f"`go {' '.join(args)}` failed (check GOPROXY and the network):\n"
                           f"{proc.stderr.strip()}")
    return proc
