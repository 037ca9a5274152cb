"""Real NSQ processes for tests: the project's own, and yours.

``NSQCluster`` starts real ``nsqd`` and ``nsqlookupd`` processes on free 127.0.0.1 ports
with temporary data directories, waits until each answers HTTP ``/ping`` and every nsqd is
registered with every lookupd, and always reaps them::

    from nsq_spark.testing import NSQCluster

    with NSQCluster(nsqd=2, lookupd=2, mem_queue_size=0) as cluster:
        cluster.nsqd_tcp_addresses      # ["127.0.0.1:40001", "127.0.0.1:40007"]
        cluster.lookupd_http_addresses  # ["127.0.0.1:40003", ...]
        cluster.kill(0)                 # SIGKILL nsqd 0
        cluster.restart(0)              # same ports, same data dir

Keyword arguments other than the documented ones become nsqd flags: ``mem_queue_size=0``
is ``--mem-queue-size=0``, ``snappy=True`` is ``--snappy``, a list repeats the flag.

The binaries come from ``$NSQ_BIN_DIR``, then ``PATH``, then the cache that
``scripts/install-nsq`` fills. ``RedisServer`` and ``MemcachedServer`` do the same for the
dedup backends. This module is also a pytest plugin (``nsq_cluster``, ``redis_server`` and
``memcached_server`` fixtures); on a failed test the processes' logs are printed.

``NSQCluster(mode="docker")`` runs the fixed topology of ``integration/docker-compose.yml``
(two nsqd, one nsqlookupd, nsqadmin) where a Docker engine exists; the local-binary mode is
the default and the one CI uses.
"""

from __future__ import annotations

import atexit
import ctypes
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import weakref
from pathlib import Path
from typing import Any, Iterator, Sequence

log = logging.getLogger(__name__)

NSQ_VERSION = "1.3.0"
DEFAULT_START_TIMEOUT = 15.0


class HarnessError(RuntimeError):
    """A test process could not be found, started or reached; the message says how to fix it."""


# ---------------------------------------------------------------------------------------
# helpers


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _default_nsq_bin_dirs() -> list[Path]:
    dirs = []
    if os.environ.get("NSQ_BIN_DIR"):
        dirs.append(Path(os.environ["NSQ_BIN_DIR"]))
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    dirs.append(cache / "nsq-spark" / f"nsq-v{NSQ_VERSION}" / "bin")
    return dirs


def find_binary(name: str, extra_dirs: Sequence[Path] = ()) -> str:
    """Path of an NSQ (or other server) binary, or a HarnessError that says how to get it."""
    for d in [*extra_dirs, *_default_nsq_bin_dirs()]:
        candidate = Path(d) / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    on_path = shutil.which(name)
    if on_path:
        return on_path
    if name.startswith("nsq") or name in ("to_nsq",):
        searched = ", ".join(str(d) for d in [*extra_dirs, *_default_nsq_bin_dirs()])
        hint = (
            f"run `nsq-spark install-nsq` (installed with this package; it finds nsq "
            f"v{NSQ_VERSION} on PATH or builds it once with Go, and prints the directory), "
            "then set NSQ_BIN_DIR to that directory if it is not the default; or put the "
            "official release binaries on PATH or in $NSQ_BIN_DIR "
            f"(searched: {searched}, then PATH)"
        )
    else:
        hint = f"install it, e.g. `apt-get install -y {name}` (or scripts/install-services)"
    raise HarnessError(f"{name} not found: {hint}")


def _set_pdeathsig() -> None:
    """In the child: die with the parent, so an interrupted test run leaves no process."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _http_get(url: str, timeout: float = 2.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.read()


def _flag_args(flags: dict[str, Any]) -> list[str]:
    args: list[str] = []
    for key, value in flags.items():
        name = "--" + key.replace("_", "-")
        if value is True:
            args.append(name)
        elif value is False or value is None:
            continue
        elif isinstance(value, (list, tuple)):
            args.extend(f"{name}={v}" for v in value)
        else:
            args.append(f"{name}={value}")
    return args


# Every live process, so that atexit can reap what a crashed test forgot.
_LIVE: "weakref.WeakSet[ServerProcess]" = weakref.WeakSet()


@atexit.register
def _reap_all() -> None:
    for proc in list(_LIVE):
        proc.kill()


class ServerProcess:
    """One server process with its log file, controls and readiness check."""

    def __init__(self, name: str, argv: list[str], workdir: Path, ready_url: str | None,
                 ready_probe: Any = None) -> None:
        self.name = name
        self.argv = argv
        self.workdir = workdir
        self.ready_url = ready_url
        self._ready_probe = ready_probe
        self.log_path = workdir / f"{name}.log"
        self.popen: subprocess.Popen[bytes] | None = None

    @property
    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen else None

    def start(self, timeout: float = DEFAULT_START_TIMEOUT) -> None:
        with open(self.log_path, "ab") as logf:
            logf.write(f"--- start: {' '.join(self.argv)}\n".encode())
            logf.flush()
            self.popen = subprocess.Popen(
                self.argv, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                cwd=self.workdir, preexec_fn=_set_pdeathsig,
            )
        _LIVE.add(self)
        self.wait_ready(timeout)

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.popen is not None and self.popen.poll() is not None:
                raise HarnessError(
                    f"{self.name} exited at start with code {self.popen.returncode}; "
                    f"its output:\n{self.log_text()}"
                )
            if self._is_ready():
                return
            if time.monotonic() > deadline:
                self.kill()
                raise HarnessError(
                    f"{self.name} did not become ready within {timeout:.0f}s "
                    f"({self.ready_url or 'probe'}); its output:\n{self.log_text()}"
                )
            time.sleep(0.02)

    def _is_ready(self) -> bool:
        if self._ready_probe is not None:
            return bool(self._ready_probe())
        if self.ready_url is None:
            return True
        try:
            return _http_get(self.ready_url, timeout=0.5).strip() == b"OK"
        except urllib.error.HTTPError:
            # An answer at all means it is up: nsqd with --tls-required=true answers plain
            # HTTP /ping with 403.
            return True
        except (OSError, urllib.error.URLError):
            return False

    def log_text(self, head: int = 10, tail: int = 50) -> str:
        """The first and last lines of the process's output (errors often come first)."""
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        if len(lines) <= head + tail:
            return "\n".join(lines)
        return "\n".join([*lines[:head], "...", *lines[-tail:]])

    def signal(self, sig: int) -> None:
        if self.running:
            assert self.popen is not None
            self.popen.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL and reap; a no-op if not running."""
        if self.popen is None:
            return
        if self.popen.poll() is None:
            try:
                self.popen.send_signal(signal.SIGCONT)  # a stopped process must run to die cleanly
                self.popen.kill()
            except ProcessLookupError:
                pass
        try:
            self.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL does not time out
            pass

    def terminate(self, timeout: float = 10.0) -> None:
        """SIGTERM, wait, then SIGKILL if it does not exit."""
        if self.popen is None or self.popen.poll() is not None:
            return
        self.popen.send_signal(signal.SIGCONT)
        self.popen.terminate()
        try:
            self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()


# ---------------------------------------------------------------------------------------
# NSQ


class NsqdNode(ServerProcess):
    """One nsqd: its addresses stay fixed across restarts, and so does its data dir."""

    def __init__(self, index: int, binary: str, workdir: Path, lookupd_tcp: list[str],
                 flags: dict[str, Any]) -> None:
        self.index = index
        self.tcp_port = free_port()
        self.http_port = free_port()
        self.https_port = free_port()
        self.data_path = workdir / f"nsqd{index}-data"
        self.data_path.mkdir(parents=True, exist_ok=True)
        argv = [
            binary,
            f"--tcp-address=127.0.0.1:{self.tcp_port}",
            f"--http-address=127.0.0.1:{self.http_port}",
            f"--https-address=127.0.0.1:{self.https_port}",
            "--broadcast-address=127.0.0.1",
            f"--data-path={self.data_path}",
            *(f"--lookupd-tcp-address={a}" for a in lookupd_tcp),
            *_flag_args(flags),
        ]
        super().__init__(f"nsqd{index}", argv, workdir, f"http://127.0.0.1:{self.http_port}/ping")

    @property
    def tcp_address(self) -> str:
        return f"127.0.0.1:{self.tcp_port}"

    @property
    def http_address(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    def stats(self, topic: str | None = None) -> dict[str, Any]:
        """nsqd's ``/stats`` as JSON (optionally for one topic)."""
        url = f"http://{self.http_address}/stats?format=json"
        if topic:
            url += f"&topic={topic}"
        return json.loads(_http_get(url))


class LookupdNode(ServerProcess):
    def __init__(self, index: int, binary: str, workdir: Path, flags: dict[str, Any]) -> None:
        self.index = index
        self.tcp_port = free_port()
        self.http_port = free_port()
        argv = [
            binary,
            f"--tcp-address=127.0.0.1:{self.tcp_port}",
            f"--http-address=127.0.0.1:{self.http_port}",
            "--broadcast-address=127.0.0.1",
            *_flag_args(flags),
        ]
        super().__init__(f"nsqlookupd{index}", argv, workdir,
                         f"http://127.0.0.1:{self.http_port}/ping")

    @property
    def tcp_address(self) -> str:
        return f"127.0.0.1:{self.tcp_port}"

    @property
    def http_address(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    def nodes(self) -> list[dict[str, Any]]:
        """The producers this lookupd knows (``/nodes``)."""
        return json.loads(_http_get(f"http://{self.http_address}/nodes"))["producers"]


class NSQCluster:
    """``nsqd`` real nsqd processes registered with ``lookupd`` real nsqlookupd processes.

    Args:
        nsqd: how many nsqd to start.
        lookupd: how many nsqlookupd to start (0 is allowed: nsqd then runs standalone).
        mode: ``"local"`` (binaries, default) or ``"docker"`` (integration/docker-compose.yml;
            the topology is then fixed at two nsqd and one nsqlookupd).
        bin_dir: where the NSQ binaries are; default ``$NSQ_BIN_DIR``, the install-nsq
            cache, then ``PATH``.
        lookupd_flags: flags for every nsqlookupd, same form as the nsqd flags.
        start_timeout: seconds each process has to answer ``/ping``.
        **nsqd_flags: flags for every nsqd (``mem_queue_size=0`` -> ``--mem-queue-size=0``).
    """

    def __init__(self, nsqd: int = 1, lookupd: int = 1, *, mode: str = "local",
                 bin_dir: str | os.PathLike[str] | None = None,
                 lookupd_flags: dict[str, Any] | None = None,
                 start_timeout: float = DEFAULT_START_TIMEOUT, **nsqd_flags: Any) -> None:
        if nsqd < 0 or lookupd < 0:
            raise ValueError("NSQCluster needs nsqd >= 0 and lookupd >= 0")
        if mode not in ("local", "docker"):
            raise ValueError(f"NSQCluster mode must be 'local' or 'docker', not {mode!r}")
        self.mode = mode
        self._n_nsqd = nsqd
        self._n_lookupd = lookupd
        self._bin_dirs = [Path(bin_dir)] if bin_dir else []
        self._nsqd_flags = nsqd_flags
        self._lookupd_flags = lookupd_flags or {}
        self._start_timeout = start_timeout
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self.workdir: Path | None = None
        self.nsqds: list[NsqdNode] = []
        self.lookupds: list[LookupdNode] = []
        self._docker: _DockerCompose | None = None

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> "NSQCluster":
        if self.mode == "docker":
            self._docker = _DockerCompose()
            self._docker.up(self._start_timeout)
            return self
        self._tmp = tempfile.TemporaryDirectory(prefix="nsq-spark-cluster-")
        self.workdir = Path(self._tmp.name)
        try:
            lookupd_bin = find_binary("nsqlookupd", self._bin_dirs)
            for i in range(self._n_lookupd):
                node = LookupdNode(i, lookupd_bin, self.workdir, self._lookupd_flags)
                self.lookupds.append(node)
                _start_with_port_retry(node, self._start_timeout)
            for _ in range(self._n_nsqd):
                self.add_nsqd()
        except BaseException:
            self.close()
            raise
        return self

    def add_nsqd(self, **extra_flags: Any) -> int:
        """Start one more nsqd (registered with every lookupd); returns its index."""
        if self.workdir is None:
            raise HarnessError("start the cluster before adding nsqd")
        binary = find_binary("nsqd", self._bin_dirs)
        node = NsqdNode(len(self.nsqds), binary, self.workdir,
                        [lk.tcp_address for lk in self.lookupds],
                        {**self._nsqd_flags, **extra_flags})
        self.nsqds.append(node)
        _start_with_port_retry(node, self._start_timeout)
        self.wait_registered(node.index)
        return node.index

    def wait_registered(self, index: int, timeout: float | None = None) -> None:
        """Wait until nsqd ``index`` is in every lookupd's ``/nodes``."""
        node = self.nsqds[index]
        deadline = time.monotonic() + (timeout or self._start_timeout)
        pending = [lk for lk in self.lookupds if lk.running]
        while pending:
            pending = [lk for lk in pending if not _lists_node(lk, node.tcp_port)]
            if not pending:
                return
            if time.monotonic() > deadline:
                raise HarnessError(
                    f"nsqd{index} did not register with {[lk.name for lk in pending]}; "
                    f"nsqd output:\n{node.log_text()}"
                )
            time.sleep(0.05)

    def close(self) -> None:
        """Kill every process and remove the data dirs. Safe to call twice."""
        if self._docker is not None:
            self._docker.down()
            self._docker = None
        for node in [*self.nsqds, *self.lookupds]:
            node.kill()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> "NSQCluster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- addresses ----------------------------------------------------------------------

    @property
    def nsqd_tcp_addresses(self) -> list[str]:
        if self._docker:
            return self._docker.nsqd_tcp_addresses
        return [n.tcp_address for n in self.nsqds]

    @property
    def nsqd_http_addresses(self) -> list[str]:
        if self._docker:
            return self._docker.nsqd_http_addresses
        return [n.http_address for n in self.nsqds]

    @property
    def lookupd_http_addresses(self) -> list[str]:
        if self._docker:
            return self._docker.lookupd_http_addresses
        return [lk.http_address for lk in self.lookupds]

    @property
    def lookupd_tcp_addresses(self) -> list[str]:
        return [lk.tcp_address for lk in self.lookupds]

    # -- fault controls (nsqd by index) -------------------------------------------------

    def kill(self, i: int) -> None:
        """SIGKILL nsqd ``i`` (what was fsynced to its data dir survives a restart)."""
        if self._docker:
            return self._docker.run("kill", "-s", "SIGKILL", f"nsqd{i}")
        self.nsqds[i].kill()

    def stop(self, i: int) -> None:
        """SIGSTOP nsqd ``i``: it holds its sockets open but answers nothing."""
        if self._docker:
            return self._docker.run("pause", f"nsqd{i}")
        self.nsqds[i].signal(signal.SIGSTOP)

    def resume(self, i: int) -> None:
        """SIGCONT nsqd ``i``."""
        if self._docker:
            return self._docker.run("unpause", f"nsqd{i}")
        self.nsqds[i].signal(signal.SIGCONT)

    def restart(self, i: int) -> None:
        """(Re)start nsqd ``i`` on the same ports with the same data dir."""
        if self._docker:
            return self._docker.run("restart", f"nsqd{i}")
        node = self.nsqds[i]
        node.terminate()
        node.start(self._start_timeout)
        self.wait_registered(i)

    def kill_lookupd(self, i: int) -> None:
        self.lookupds[i].kill()

    def restart_lookupd(self, i: int) -> None:
        self.lookupds[i].kill()
        self.lookupds[i].start(self._start_timeout)

    def logs(self) -> str:
        """The tail of every process's output, for failure reports."""
        return "\n".join(f"==== {n.name} ====\n{n.log_text()}"
                         for n in [*self.lookupds, *self.nsqds])


def _lists_node(lookupd: LookupdNode, tcp_port: int) -> bool:
    try:
        return any(p.get("tcp_port") == tcp_port for p in lookupd.nodes())
    except (OSError, urllib.error.URLError, ValueError, KeyError):
        return False


def _start_with_port_retry(node: ServerProcess, timeout: float, attempts: int = 3) -> None:
    """Start a node; if a port got taken between free_port() and bind, pick new ports."""
    for attempt in range(attempts):
        try:
            node.start(timeout)
            return
        except HarnessError as exc:
            if "address already in use" not in str(exc) or attempt == attempts - 1:
                raise
            log.warning("%s: port taken, retrying with new ports", node.name)
            _reassign_ports(node)


def _reassign_ports(node: ServerProcess) -> None:
    old_new = {}
    for attr in ("tcp_port", "http_port", "https_port", "port"):
        if hasattr(node, attr):
            old = getattr(node, attr)
            new = free_port()
            setattr(node, attr, new)
            old_new[str(old)] = str(new)
    node.argv = [_replace_port(a, old_new) for a in node.argv]
    if node.ready_url:
        node.ready_url = _replace_port(node.ready_url, old_new)


def _replace_port(arg: str, old_new: dict[str, str]) -> str:
    for old, new in old_new.items():
        if arg.endswith(":" + old):
            return arg[: -len(old)] + new
        if f":{old}/" in arg:
            return arg.replace(f":{old}/", f":{new}/")
    return arg


class _DockerCompose:
    """The fixed topology of integration/docker-compose.yml (needs a Docker engine)."""

    COMPOSE = Path(__file__).resolve().parent.parent / "integration" / "docker-compose.yml"
    NSQD_TCP = ["127.0.0.1:4150", "127.0.0.1:4250"]
    NSQD_HTTP = ["127.0.0.1:4151", "127.0.0.1:4251"]
    LOOKUPD_HTTP = ["127.0.0.1:4161"]

    nsqd_tcp_addresses = NSQD_TCP
    nsqd_http_addresses = NSQD_HTTP
    lookupd_http_addresses = LOOKUPD_HTTP

    def run(self, *args: str) -> None:
        if shutil.which("docker") is None:
            raise HarnessError("docker mode needs the docker CLI and a Docker engine; "
                               "use the default local mode instead")
        cmd = ["docker", "compose", "-f", str(self.COMPOSE), *args]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise HarnessError(f"`{' '.join(cmd)}` failed ({proc.returncode}): {proc.stderr.strip()} "
                               "-- is a Docker engine running? Otherwise use mode='local'.")

    def up(self, timeout: float) -> None:
        self.run("up", "-d", "--wait")
        deadline = time.monotonic() + timeout
        for addr in [*self.NSQD_HTTP, *self.LOOKUPD_HTTP]:
            while True:
                try:
                    if _http_get(f"http://{addr}/ping", 0.5).strip() == b"OK":
                        break
                except (OSError, urllib.error.URLError):
                    pass
                if time.monotonic() > deadline:
                    raise HarnessError(f"docker compose service at {addr} did not answer /ping")
                time.sleep(0.1)

    def down(self) -> None:
        self.run("down", "-v")


# ---------------------------------------------------------------------------------------
# Redis and memcached (the dedup backends)


def _tcp_connectable(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


class RedisServer(ServerProcess):
    """A throwaway redis-server on a free port, no persistence. ``url`` for clients."""

    def __init__(self, workdir: Path | None = None) -> None:
        self._tmp = None if workdir else tempfile.TemporaryDirectory(prefix="nsq-spark-redis-")
        wd = Path(workdir or self._tmp.name)  # type: ignore[union-attr]
        self.port = free_port()
        argv = [find_binary("redis-server"), "--port", str(self.port), "--bind", "127.0.0.1",
                "--save", "", "--appendonly", "no", "--dir", str(wd)]
        super().__init__("redis-server", argv, wd, None, lambda: _tcp_connectable(self.port))

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def __enter__(self) -> "RedisServer":
        _start_with_port_retry(self, DEFAULT_START_TIMEOUT)
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()
        if self._tmp is not None:
            self._tmp.cleanup()


class MemcachedServer(ServerProcess):
    """A throwaway memcached on a free port. ``address`` is ``(host, port)``."""

    def __init__(self, workdir: Path | None = None, memory_mb: int = 64) -> None:
        self._tmp = None if workdir else tempfile.TemporaryDirectory(prefix="nsq-spark-memcached-")
        wd = Path(workdir or self._tmp.name)  # type: ignore[union-attr]
        self.port = free_port()
        argv = [find_binary("memcached"), "-l", "127.0.0.1", "-p", str(self.port), "-U", "0",
                "-m", str(memory_mb), "-u", "root"]
        super().__init__("memcached", argv, wd, None, lambda: _tcp_connectable(self.port))

    @property
    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    def __enter__(self) -> "MemcachedServer":
        _start_with_port_retry(self, DEFAULT_START_TIMEOUT)
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()
        if self._tmp is not None:
            self._tmp.cleanup()


# ---------------------------------------------------------------------------------------
# pytest plugin (registered through the ``pytest11`` entry point)

try:
    import pytest
except ImportError:  # pragma: no cover - the harness works without pytest
    pytest = None  # type: ignore[assignment]

if pytest is not None:

    @pytest.hookimpl(hookwrapper=True, tryfirst=True)
    def pytest_runtest_makereport(item: Any, call: Any) -> Iterator[None]:
        outcome = yield
        rep = outcome.get_result()
        setattr(item, f"_nsq_spark_rep_{rep.when}", rep)

    def _failed(request: Any) -> bool:
        return any(getattr(getattr(request.node, f"_nsq_spark_rep_{w}", None), "failed", False)
                   for w in ("setup", "call"))

    @pytest.fixture
    def nsq_cluster(request: Any) -> Iterator[NSQCluster]:
        """One nsqd and one nsqlookupd. Parametrize with
        ``@pytest.mark.nsq_cluster(nsqd=2, lookupd=2, mem_queue_size=0)``."""
        marker = request.node.get_closest_marker("nsq_cluster")
        kwargs = dict(marker.kwargs) if marker else {}
        cluster = NSQCluster(**kwargs)
        with cluster:
            yield cluster
            if _failed(request):
                print(f"\nNSQ process logs for {request.node.nodeid}:\n{cluster.logs()}")

    @pytest.fixture(scope="session")
    def redis_server() -> Iterator[RedisServer]:
        """A redis-server shared by the test session."""
        with RedisServer() as server:
            yield server

    @pytest.fixture(scope="session")
    def memcached_server() -> Iterator[MemcachedServer]:
        """A memcached shared by the test session."""
        with MemcachedServer() as server:
            yield server

    def pytest_configure(config: Any) -> None:
        config.addinivalue_line(
            "markers", "nsq_cluster(nsqd=1, lookupd=1, **flags): shape of the nsq_cluster fixture")
