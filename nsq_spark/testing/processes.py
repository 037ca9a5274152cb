"""Server processes for tests: find a binary, start it on free ports, wait until it is
ready, control it (kill, SIGTERM, freeze), read its log, and reap it whatever happens.

What every server of the harness shares, whether a process or a container
(:class:`Server`: readiness, controls, log), the process form (:class:`ServerProcess`:
dies with the test process through ``PR_SET_PDEATHSIG``, and an ``atexit`` hook kills
what a crashed test forgot), the port rules (:func:`free_port`, a start retried on new
ports when one was taken meanwhile) and the polling helper the tests use
(:func:`wait_until`). The NSQ cluster (:mod:`.cluster`), the other services
(:mod:`.services`, :mod:`.chaos`) and the containers (:mod:`.docker`) are built on it.
"""

from __future__ import annotations

import atexit
import collections
import ctypes
import logging
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import weakref
from pathlib import Path
from typing import Any, Callable, Sequence, TypeVar

from ..errors import NSQError
from ._binaries import NSQ_VERSION, cache_bin_dir, nsq_bin_dir

__all__ = ["DEFAULT_START_TIMEOUT", "HarnessError", "Server", "ServerProcess", "find_binary",
           "free_port", "start_with_port_retry", "wait_until"]

log = logging.getLogger("nsq_spark.testing")

DEFAULT_START_TIMEOUT = 15.0
T = TypeVar("T")


class HarnessError(NSQError, RuntimeError):
    """A test process could not be found, started or reached; the message says how to fix it."""


# ---------------------------------------------------------------------------------------
# helpers


# Ports this process handed out recently. The kernel may give the same port to two binds in
# a row once the first socket is closed (seen on CI: nsqlookupd got one port for its TCP and
# HTTP listeners and could never start), so a port is not handed out twice in a window.
_RECENT_PORTS: collections.deque[int] = collections.deque(maxlen=4096)
_RECENT_PORTS_LOCK = threading.Lock()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago and that this process has not
    handed out among its last 4096 ports."""
    with _RECENT_PORTS_LOCK:
        for _ in range(100):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind(("127.0.0.1", 0))
                port: int = s.getsockname()[1]
            if port not in _RECENT_PORTS:
                _RECENT_PORTS.append(port)
                return port
    raise HarnessError("free_port: the kernel kept returning ports this process already "
                       "handed out; widen net.ipv4.ip_local_port_range")


def _default_nsq_bin_dirs() -> list[Path]:
    """``$NSQ_BIN_DIR`` (when set), then the per-user cache that install-nsq fills."""
    chosen = nsq_bin_dir()
    cached = cache_bin_dir("nsq", NSQ_VERSION)
    return [chosen, cached] if chosen != cached else [cached]


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


def _wait_all_threads_stopped(pid: int, timeout: float) -> None:
    """Until every thread of ``pid`` is in state ``T`` (stopped) in ``/proc``, at most
    ``timeout`` seconds; returns at once where ``/proc`` cannot tell (not Linux, gone)."""
    deadline = time.monotonic() + timeout
    task_dir = f"/proc/{pid}/task"
    while True:
        try:
            states = []
            for tid in os.listdir(task_dir):
                with open(f"{task_dir}/{tid}/stat", "rb") as f:
                    # "tid (comm) S ...": the state follows the last ')' (comm may hold one)
                    states.append(f.read().rpartition(b")")[2].split()[0])
        except (OSError, IndexError):
            return
        if all(st in (b"T", b"t") for st in states) or time.monotonic() > deadline:
            return
        time.sleep(0.001)


def _set_pdeathsig() -> None:
    """In the child: die with the parent, so an interrupted test run leaves no process."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


# Every live process, so that atexit can reap what a crashed test forgot.
_LIVE: "weakref.WeakSet[ServerProcess]" = weakref.WeakSet()


@atexit.register
def _reap_all() -> None:
    for proc in list(_LIVE):
        proc.kill()


class Server:
    """What every test server shares, whether a process or a container: start, readiness,
    controls, log. Subclasses say how to run it."""

    name: str
    ready_url: str | None
    _ready_probe: Any = None

    @property
    def running(self) -> bool:
        raise NotImplementedError

    @property
    def pid(self) -> int | None:
        return None

    def start(self, timeout: float = DEFAULT_START_TIMEOUT) -> None:
        raise NotImplementedError

    def _exit_code(self) -> int | None:
        """The exit code once it has exited, else None."""
        raise NotImplementedError

    def log_text(self, head: int = 10, tail: int = 50) -> str:
        raise NotImplementedError

    def kill(self) -> None:
        raise NotImplementedError

    def terminate(self, timeout: float = 10.0) -> None:
        raise NotImplementedError

    def pause(self) -> None:
        """Freeze it: it holds its sockets open but answers nothing."""
        raise NotImplementedError

    def unpause(self) -> None:
        raise NotImplementedError

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            code = self._exit_code()
            if code is not None:
                raise HarnessError(
                    f"{self.name} exited at start with code {code}; "
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
        from nsq_spark.admin.transport import answer_limit, shared_transport

        try:
            status, body = shared_transport().request("GET", self.ready_url, 0.5,
                                                      max_bytes=answer_limit("status"))
        except OSError:  # NodeUnreachableError: nothing answered yet
            return False
        # An answer at all means it is up: nsqd with --tls-required=true answers plain
        # HTTP /ping with 403.
        return status != 200 or body.strip() == b"OK"


def head_tail(lines: list[str], head: int, tail: int) -> str:
    if len(lines) <= head + tail:
        return "\n".join(lines)
    return "\n".join([*lines[:head], "...", *lines[-tail:]])


class ServerProcess(Server):
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

    def _exit_code(self) -> int | None:
        return None if self.popen is None else self.popen.poll()

    def log_text(self, head: int = 10, tail: int = 50) -> str:
        """The first and last lines of the process's output (errors often come first)."""
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return head_tail(lines, head, tail)

    def signal(self, sig: int) -> None:
        if self.running:
            assert self.popen is not None
            self.popen.send_signal(sig)

    def pause(self) -> None:
        """SIGSTOP, then wait until every thread is stopped: kill() returns before the
        threads running on another core have stopped, and nsqd (Go: many threads) could
        still answer a command sent right after (a test saw a PUB answered "OK")."""
        self.signal(signal.SIGSTOP)
        if self.popen is not None:
            _wait_all_threads_stopped(self.popen.pid, timeout=2.0)

    def unpause(self) -> None:
        self.signal(signal.SIGCONT)

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


def start_with_port_retry(node: Any, timeout: float, attempts: int = 3) -> None:
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


def _reassign_ports(node: Any) -> None:
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


def wait_until(predicate: Callable[[], T], timeout: float, what: str = "the condition",
               interval: float = 0.02) -> T:
    """Poll ``predicate`` until it returns something true and return that; after
    ``timeout`` seconds raise AssertionError naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)
