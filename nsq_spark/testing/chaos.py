"""Fault injection for tests: a real Toxiproxy between your client and nsqd.

Toxiproxy (v2.12.0) is a TCP proxy driven over a small JSON HTTP API; "toxics" added to a
proxy reset connections, add latency, cut the stream into small fragments, stall it, or
close it after so many bytes. This module provides:

* the binary: ``find_toxiproxy()`` returns ``$TOXIPROXY_BIN`` if set, else the per-user
  cache ``$XDG_CACHE_HOME/nsq-spark/toxiproxy-v2.12.0/bin/toxiproxy-server`` when it holds
  that version, else None; ``ensure_toxiproxy()`` (``scripts/install-toxiproxy``, or
  ``python -m nsq_spark.testing.chaos``) also builds it once into the cache with
  ``go install`` through the Go module proxy. Only the standard library is used.
* ``ToxiproxyServer``: a ``toxiproxy-server`` process on a free 127.0.0.1 port, reaped like
  the servers of :mod:`nsq_spark.testing` (it dies with the test process).
* ``Toxiproxy`` / ``Proxy``: a typed client of the HTTP API (proxies, toxics, reset).
  API errors raise :class:`ToxiproxyError` with the server's own message.
* ``inject_periodically``: a bounded fault schedule on a thread (add a toxic, hold it,
  remove it; ``count`` times at most).
* pytest fixtures ``toxiproxy_server`` (one per session) and ``toxiproxy`` (a client whose
  proxies are deleted after the test). Use them with
  ``from nsq_spark.testing.chaos import toxiproxy, toxiproxy_server`` in a conftest.py
  (the old path ``nsq_spark.testing_chaos`` is a re-export).
  Without a binary the fixtures skip with the install command, except when the ``CI``
  environment variable is set: there a missing binary fails the test.

Example::

    def test_reader_survives_resets(nsq_cluster, toxiproxy):
        proxy = toxiproxy.create_proxy("nsqd", upstream=nsq_cluster.nsqd_tcp_addresses[0])
        with inject_periodically(proxy, "reset_peer", every=0.5, hold=0.05, count=10):
            ...  # a Reader on nsqd_tcp_addresses=[proxy.listen]
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import shutil
import sys
import tempfile
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Iterator, Sequence

from .._addresses import parse_address
from ..errors import ConfigError
from .processes import DEFAULT_START_TIMEOUT, HarnessError, ServerProcess, free_port
from ._binaries import TOXIPROXY_VERSION, InstallError, cache_bin_dir, reports_version, run_go

__all__ = ["TOXIPROXY_VERSION", "TOXIPROXY_MODULE", "BINARY_NAME", "INSTALL_HINT", "TOXIC_TYPES",
           "STREAMS", "InstallError", "ToxiproxyError", "cache_binary", "find_toxiproxy",
           "ensure_toxiproxy", "main", "Proxy", "Toxiproxy", "ToxiproxyServer", "FaultLog",
           "inject_periodically"]

TOXIPROXY_MODULE = "github.com/Shopify/toxiproxy/v2"
BINARY_NAME = "toxiproxy-server"
INSTALL_HINT = ("run scripts/install-toxiproxy (or `python -m nsq_spark.testing.chaos`; it "
                f"builds toxiproxy-server v{TOXIPROXY_VERSION} once with Go), or set "
                "TOXIPROXY_BIN to an existing toxiproxy-server binary")

#: The toxic types of Toxiproxy v2.12.0 (``slow_close`` and ``noop`` included).
TOXIC_TYPES = frozenset({"latency", "bandwidth", "slow_close", "timeout", "reset_peer",
                         "slicer", "limit_data", "noop"})
STREAMS = ("upstream", "downstream")


class ToxiproxyError(HarnessError):
    """The Toxiproxy API refused a request; the message is the server's, with the request."""


# ---------------------------------------------------------------------------------------
# the binary


def cache_binary(version: str = TOXIPROXY_VERSION) -> Path:
    """Where ``ensure_toxiproxy`` caches its build (the fixtures look there too)."""
    return cache_bin_dir("toxiproxy", version) / BINARY_NAME


def _version_ok(binary: Path, version: str) -> bool:
    return reports_version(binary, version, flag="-version", prefix="")


def find_toxiproxy(version: str = TOXIPROXY_VERSION) -> Path | None:
    """``$TOXIPROXY_BIN`` if set (taken as it is: the user chose it), else the cached build
    when it reports ``version``, else None."""
    chosen = os.environ.get("TOXIPROXY_BIN")
    if chosen:
        path = Path(chosen)
        return path if path.is_file() and os.access(path, os.X_OK) else None
    cached = cache_binary(version)
    if os.access(cached, os.X_OK) and _version_ok(cached, version):
        return cached
    return None


def _log(stream: IO[str], text: str) -> None:
    stream.write(f"install-toxiproxy: {text}\n")
    stream.flush()


def _build(target: Path, version: str, stderr: IO[str]) -> None:
    go = shutil.which("go")
    if go is None:
        raise InstallError(
            f"cannot build toxiproxy-server v{version}: there is no Go toolchain (`go`) "
            "on PATH. Install Go 1.23 or newer (e.g. `apt-get install golang-go`, or from "
            "the Go project's downloads) and run scripts/install-toxiproxy again; or set "
            "TOXIPROXY_BIN to an existing toxiproxy-server binary.")
    _log(stderr, f"building toxiproxy-server v{version} with Go (one-time, cached in "
                 f"{target.parent})")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="nsq-spark-toxiproxy-",
                                     dir=target.parent) as gobin:
        # -X sets the version the binary reports (`-version`, GET /version): without it
        # a `go install` build says "git", and the cache could not be checked
        run_go(go, "install", f"-ldflags=-X {TOXIPROXY_MODULE}.Version={version}",
               f"{TOXIPROXY_MODULE}/cmd/server@v{version}", env={"GOBIN": gobin})
        os.replace(Path(gobin) / "server", target)  # same directory: atomic
    if not _version_ok(target, version):
        raise InstallError(f"the toxiproxy-server built into {target} does not report "
                           f"v{version}")
    _log(stderr, f"built toxiproxy-server v{version} into {target}")


def ensure_toxiproxy(version: str = TOXIPROXY_VERSION,
                     stderr: IO[str] | None = None) -> Path:
    """The toxiproxy-server binary: ``$TOXIPROXY_BIN``, the cache, or a one-time build."""
    stderr = stderr or sys.stderr
    chosen = os.environ.get("TOXIPROXY_BIN")
    if chosen:
        found = find_toxiproxy(version)
        if found is None:
            raise InstallError(f"TOXIPROXY_BIN={chosen} is not an executable file: point it "
                               "at a toxiproxy-server binary, or unset it to build one")
        _log(stderr, f"using TOXIPROXY_BIN={found}")
        return found
    found = find_toxiproxy(version)
    if found is not None:
        _log(stderr, f"using cached toxiproxy-server v{version}")
        return found
    target = cache_binary(version)
    _build(target, version, stderr)
    return target


def main(argv: Sequence[str] | None = None, *, stdout: IO[str] | None = None,
         stderr: IO[str] | None = None) -> int:
    """Print the binary's path (exit 0), or why it cannot be had (exit 1)."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="install-toxiproxy",
        description=f"Provide toxiproxy-server v{TOXIPROXY_VERSION} ($TOXIPROXY_BIN, the "
        f"cache {cache_binary()}, or a one-time build with Go) and print its path.")
    try:
        parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    stdout, stderr = stdout or sys.stdout, stderr or sys.stderr
    try:
        binary = ensure_toxiproxy(stderr=stderr)
    except (InstallError, OSError) as exc:
        _log(stderr, str(exc))
        return 1
    stdout.write(f"{binary}\n")
    return 0


# ---------------------------------------------------------------------------------------
# the HTTP API


class _Api:
    """One JSON request per call to the Toxiproxy API on ``host:port``."""

    def __init__(self, host: str, port: int, timeout: float = 5.0) -> None:
        self.host, self.port, self.timeout = host, port, timeout

    def request(self, method: str, path: str, body: Any = None) -> Any:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            payload = None if body is None else json.dumps(body).encode()
            conn.request(method, path, body=payload,
                         headers={"Content-Type": "application/json"} if payload else {})
            resp = conn.getresponse()
            data = resp.read()
        except OSError as exc:
            raise ToxiproxyError(f"{method} {path}: toxiproxy-server at "
                                 f"{self.host}:{self.port} unreachable: {exc}") from exc
        finally:
            conn.close()
        if resp.status >= 400:
            try:
                why = json.loads(data).get("error", data.decode(errors="replace"))
            except ValueError:
                why = data.decode(errors="replace")
            raise ToxiproxyError(f"{method} {path} {json.dumps(body) if body else ''}: "
                                 f"HTTP {resp.status}: {why}")
        return json.loads(data) if data.strip() else None


@dataclass
class Proxy:
    """One proxy: clients connect to ``listen`` ("127.0.0.1:port"), it connects to
    ``upstream``. ``upstream`` toxics act on client -> server bytes, ``downstream`` on
    server -> client bytes."""

    name: str
    listen: str
    upstream: str
    _api: _Api = field(repr=False)

    def add_toxic(self, type: str, stream: str = "downstream", toxicity: float = 1.0,
                  name: str | None = None, **attributes: int) -> str:
        """Add a toxic to the live proxy (existing connections too); returns its name.
        ``attributes`` are the toxic's own (``latency=50, jitter=20``; ``timeout=0``;
        ``average_size=4, size_variation=3``; ``bytes=10000``)."""
        return self._add_toxic(type, stream, toxicity, name, attributes)

    def _add_toxic(self, type: str, stream: str, toxicity: float, name: str | None,
                   attributes: dict[str, int]) -> str:
        if type not in TOXIC_TYPES:
            raise ToxiproxyError(f"toxic type {type!r} is not one of {sorted(TOXIC_TYPES)}")
        if stream not in STREAMS:
            raise ToxiproxyError(f"toxic stream {stream!r}: give 'upstream' or 'downstream'")
        name = name or f"{type}_{stream}_{uuid.uuid4().hex[:6]}"
        self._api.request("POST", f"/proxies/{self.name}/toxics", {
            "name": name, "type": type, "stream": stream, "toxicity": toxicity,
            "attributes": attributes})
        return name

    def remove_toxic(self, name: str) -> None:
        self._api.request("DELETE", f"/proxies/{self.name}/toxics/{name}")

    def toxics(self) -> list[dict[str, Any]]:
        return list(self._api.request("GET", f"/proxies/{self.name}/toxics") or [])

    @contextlib.contextmanager
    def toxic(self, type: str, stream: str = "downstream", toxicity: float = 1.0,
              **attributes: int) -> Iterator[str]:
        """The toxic for the duration of the ``with`` block."""
        name = self._add_toxic(type, stream, toxicity, None, attributes)
        try:
            yield name
        finally:
            self.remove_toxic(name)

    def set_enabled(self, enabled: bool) -> None:
        """Disabled, the proxy closes every connection and refuses new ones."""
        self._api.request("POST", f"/proxies/{self.name}", {"enabled": enabled})

    def set_upstream(self, upstream: str) -> None:
        """Point the proxy at another ``host:port`` (its connections are closed; new ones
        go there): a service moved, or a wrong address corrected."""
        self._api.request("POST", f"/proxies/{self.name}", {"upstream": upstream})
        self.upstream = upstream

    def delete(self) -> None:
        self._api.request("DELETE", f"/proxies/{self.name}")


class Toxiproxy:
    """A client of one toxiproxy-server's API (``host:port``)."""

    def __init__(self, api_address: str, timeout: float = 5.0) -> None:
        address = parse_address(api_address, "api_address", "127.0.0.1:8474")
        self.api_address = str(address)
        self._api = _Api(address.host, address.port, timeout)
        self.created: list[Proxy] = []

    def version(self) -> str:
        """The server's version, e.g. ``"2.12.0"``."""
        answer = self._api.request("GET", "/version")
        return str(answer["version"] if isinstance(answer, dict) else answer)

    def create_proxy(self, name: str, upstream: str, listen: str = "127.0.0.1:0") -> Proxy:
        """A new enabled proxy to ``upstream``; by default on a free loopback port (the
        answer's ``listen`` is the real address). ``name`` gets a unique suffix."""
        unique = f"{name}_{uuid.uuid4().hex[:8]}"
        answer = self._api.request("POST", "/proxies", {
            "name": unique, "listen": listen, "upstream": upstream, "enabled": True})
        proxy = Proxy(unique, answer["listen"], answer["upstream"], self._api)
        self.created.append(proxy)
        return proxy

    def reset(self) -> None:
        """Enable every proxy and remove every toxic."""
        self._api.request("POST", "/reset")

    def delete_created(self) -> None:
        """Delete the proxies this client created (their connections close)."""
        for proxy in self.created:
            with contextlib.suppress(ToxiproxyError):
                proxy.delete()
        self.created.clear()


class ToxiproxyServer(ServerProcess):
    """A ``toxiproxy-server`` on a free 127.0.0.1 port; ``client()`` talks to it."""

    def __init__(self, binary: str | os.PathLike[str], workdir: Path | None = None) -> None:
        self._tmp = None if workdir else tempfile.TemporaryDirectory(prefix="nsq-spark-toxi-")
        wd = Path(workdir or self._tmp.name)  # type: ignore[union-attr]
        self.binary = str(binary)
        self.port = free_port()
        super().__init__("toxiproxy-server", self._argv(), wd, None, self._answers)

    def _argv(self) -> list[str]:
        return [self.binary, "-host", "127.0.0.1", "-port", str(self.port)]

    def _answers(self) -> bool:
        try:
            Toxiproxy(self.api_address, timeout=0.5).version()
            return True
        except ToxiproxyError:
            return False

    @property
    def api_address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def client(self) -> Toxiproxy:
        return Toxiproxy(self.api_address)

    def __enter__(self) -> "ToxiproxyServer":
        for attempt in range(3):
            try:
                self.start(DEFAULT_START_TIMEOUT)
                return self
            except HarnessError as exc:
                # the port was free a moment ago; another process may have taken it
                if "address already in use" not in str(exc) or attempt == 2:
                    self.__exit__()
                    raise
                self.port = free_port()
                self.argv = self._argv()
        raise AssertionError("unreachable")  # pragma: no cover

    def __exit__(self, *exc: object) -> None:
        self.kill()
        if self._tmp is not None:
            self._tmp.cleanup()


# ---------------------------------------------------------------------------------------
# a bounded fault schedule


@dataclass
class FaultLog:
    """What ``inject_periodically`` did: ``injected`` toxics, ``errors`` from the API."""

    injected: int = 0
    errors: list[BaseException] = field(default_factory=list)


@contextlib.contextmanager
def inject_periodically(proxy: Proxy, type: str, *, every: float, hold: float, count: int,
                        streams: Sequence[str] = ("downstream",), start_after: float = 0.0,
                        **attributes: int) -> Iterator[FaultLog]:
    """On a thread: wait ``start_after``, then ``count`` times at most: add the toxic on
    every stream in ``streams``, keep it ``hold`` seconds, remove it, wait ``every``
    seconds. Leaving the block stops the schedule and removes a toxic still in place;
    an API error stops it too and is raised there."""
    for param, value, least in (("count", count, 1), ("every", every, 0), ("hold", hold, 0),
                                ("start_after", start_after, 0)):
        if value < least:
            raise ConfigError(f"inject_periodically {param}={value!r}: give a number >= "
                              f"{least} (count bounds the faults, the others are seconds)")
    stop = threading.Event()
    done = FaultLog()

    def run() -> None:
        if stop.wait(start_after):
            return
        for _ in range(count):
            names: list[str] = []
            try:
                for stream in streams:
                    names.append(proxy._add_toxic(type, stream, 1.0, None, attributes))
                done.injected += 1
                stop.wait(hold)
            except ToxiproxyError as exc:
                done.errors.append(exc)
                stop.set()
            finally:
                for name in names:
                    try:
                        proxy.remove_toxic(name)
                    except ToxiproxyError as exc:
                        done.errors.append(exc)
            if stop.wait(every):
                return

    thread = threading.Thread(target=run, name=f"toxiproxy-{type}", daemon=True)
    thread.start()
    try:
        yield done
    finally:
        stop.set()
        thread.join(timeout=10)
    if done.errors:
        raise done.errors[0]


# ---------------------------------------------------------------------------------------
# pytest fixtures

try:
    import pytest
except ImportError:  # pragma: no cover - the harness works without pytest
    pytest = None  # type: ignore[assignment]

if pytest is not None:
    __all__ += ["toxiproxy_server", "toxiproxy"]

    @pytest.fixture(scope="session")
    def toxiproxy_server() -> Iterator[ToxiproxyServer]:
        """A toxiproxy-server shared by the session. No binary: skipped with the install
        command, or failed when the ``CI`` environment variable is set."""
        binary = find_toxiproxy()
        if binary is None:
            why = (f"toxiproxy-server v{TOXIPROXY_VERSION} not found "
                   f"(TOXIPROXY_BIN unset, not in {cache_binary()}): {INSTALL_HINT}")
            if os.environ.get("CI"):
                pytest.fail(why)
            pytest.skip(why)
        with ToxiproxyServer(binary) as server:
            yield server

    @pytest.fixture
    def toxiproxy(toxiproxy_server: ToxiproxyServer) -> Iterator[Toxiproxy]:
        """A client of the session's toxiproxy-server; the proxies it created are deleted
        after the test."""
        client = toxiproxy_server.client()
        try:
            yield client
        finally:
            client.delete_created()


if __name__ == "__main__":
    sys.exit(main())
