"""Provide the NSQ v1.3.0 binaries (nsqd, nsqlookupd, nsqadmin, to_nsq, nsq_tail).

``nsq-spark install-nsq`` (or ``python -m nsq_spark.testing.install``) prints the directory that
holds them, as its last line on stdout; progress and errors go to stderr:

1. every binary already on PATH at the right version: that directory;
2. cached in ``$NSQ_BIN_DIR`` (default ``$XDG_CACHE_HOME/nsq-spark/nsq-v1.3.0/bin``,
   where :mod:`nsq_spark.testing` looks too; the rule is in
   :mod:`nsq_spark.testing._binaries`): the cache, at no cost;
3. else built once with the Go toolchain through the Go module proxy, inside a throwaway
   module, into that cache. ``go install github.com/nsqio/nsq/apps/nsqd@v1.3.0`` refuses
   because nsq's go.mod carries ``replace`` directives; a module that requires nsq and
   repeats them builds.

This is the one implementation: ``scripts/install-nsq`` of a checkout calls it. Only the
standard library is used, so it runs before any dependency is installed. (Its old path
``nsq_spark.install`` is a re-export.)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO, Sequence

from ._binaries import NSQ_APPS as APPS
from ._binaries import NSQ_VERSION, InstallError, nsq_bin_dir, reports_version, run_go

__all__ = ["NSQ_VERSION", "APPS", "InstallError", "default_bin_dir", "complete_dir",
           "ensure_nsq", "main"]


def default_bin_dir(version: str = NSQ_VERSION) -> Path:
    """``$NSQ_BIN_DIR`` if set, else the per-user cache that ``nsq_spark.testing`` searches."""
    return nsq_bin_dir(version)


def complete_dir(directory: Path, version: str = NSQ_VERSION) -> bool:
    """True when every app is an executable in ``directory`` and nsqd/nsqlookupd report
    ``version``."""
    if not all(os.access(directory / app, os.X_OK) for app in APPS):
        return False
    return reports_version(directory / "nsqd", version) and \
        reports_version(directory / "nsqlookupd", version)


def _log(stream: IO[str], text: str) -> None:
    stream.write(f"install-nsq: {text}\n")
    stream.flush()


def _no_way_out(bin_dir: Path, version: str) -> InstallError:
    return InstallError(
        f"cannot provide nsq v{version}: the binaries are not on PATH, not in {bin_dir}, "
        "and there is no Go toolchain (`go`) to build them. Ways out:\n"
        "  - install Go 1.17 or newer and run `nsq-spark install-nsq` again;\n"
        f"  - or download the official nsq-{version} release "
        "(https://nsq.io/deployment/installing.html) and put nsqd, nsqlookupd, nsqadmin, "
        f"to_nsq and nsq_tail on PATH, or into {bin_dir} (or set NSQ_BIN_DIR to their "
        "directory).")


def _build(bin_dir: Path, version: str, stderr: IO[str]) -> None:
    go = shutil.which("go")
    if go is None:
        raise _no_way_out(bin_dir, version)
    gov = subprocess.run([go, "version"], capture_output=True, text=True).stdout.strip()
    _log(stderr, f"building nsq v{version} with {gov} (one-time, cached in {bin_dir})")
    module = f"github.com/nsqio/nsq@v{version}"
    with tempfile.TemporaryDirectory(prefix="nsq-spark-build-") as work:
        def go_run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
            return run_go(go, *args, cwd=work, check=check)

        go_run("mod", "init", "nsq-spark-build")
        go_run("mod", "edit", f"-require={module}")
        # repeat nsq's own replace directives (the go-svc fork) in our module
        info = go_run("mod", "download", "-json", module, check=False)
        try:
            gomod = Path(json.loads(info.stdout)["GoMod"])
        except (ValueError, KeyError):
            raise InstallError(f"could not download {module} from the Go module proxy "
                               f"(check GOPROXY and the network): {info.stderr.strip()}"
                               ) from None
        for line in gomod.read_text().splitlines():
            parts = line.split()
            if len(parts) == 5 and parts[0] == "replace" and parts[2] == "=>":
                go_run("mod", "edit", f"-replace={parts[1]}={parts[3]}@{parts[4]}")
        pkgs = [f"github.com/nsqio/nsq/apps/{app}" for app in APPS]
        go_run("get", *pkgs, check=False)
        bin_dir.mkdir(parents=True, exist_ok=True)
        go_run("build", "-o", f"{bin_dir}{os.sep}", *pkgs)
    if not complete_dir(bin_dir, version):
        raise InstallError(f"the binaries built into {bin_dir} do not report v{version}")
    _log(stderr, f"built nsq v{version} into {bin_dir}")


def ensure_nsq(bin_dir: Path | None = None, version: str = NSQ_VERSION,
               stderr: IO[str] | None = None) -> Path:
    """The directory holding the NSQ binaries, building them if needed (see module doc)."""
    stderr = stderr or sys.stderr
    bin_dir = bin_dir or default_bin_dir(version)
    on_path = shutil.which("nsqd")
    if on_path and complete_dir(Path(on_path).parent, version):
        _log(stderr, f"using nsq v{version} found on PATH")
        return Path(on_path).parent
    if complete_dir(bin_dir, version):
        _log(stderr, f"using cached nsq v{version}")
        return bin_dir
    _build(bin_dir, version, stderr)
    return bin_dir


def main(argv: Sequence[str] | None = None, *, stdout: IO[str] | None = None,
         stderr: IO[str] | None = None) -> int:
    """Print the binaries' directory (exit 0), or why they cannot be had (exit 1)."""
    from nsq_spark._strict_argparse import StrictParser

    parser = StrictParser(
        prog="nsq-spark install-nsq",
        description=f"Provide the nsq v{NSQ_VERSION} binaries (PATH, cache, or a one-time "
        "build with Go) and print their directory.")
    parser.add_argument("--bin-dir", type=Path, default=None,
                        help="where to cache a build (default: $NSQ_BIN_DIR, else "
                        f"{default_bin_dir()})")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    stdout, stderr = stdout or sys.stdout, stderr or sys.stderr
    try:
        directory = ensure_nsq(args.bin_dir, stderr=stderr)
    except (InstallError, OSError) as exc:
        _log(stderr, str(exc))
        return 1
    stdout.write(f"{directory}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
