"""Real NSQ processes for tests: the project's own, and yours.

The test harness is one package: this module (servers, clusters, helpers and the pytest
plugin, registered as ``nsq_spark.testing`` by the ``pytest11`` entry point),
:mod:`nsq_spark.testing.chaos` (Toxiproxy fault injection), :mod:`nsq_spark.testing.install`
(``nsq-spark install-nsq``) and :mod:`nsq_spark.testing._binaries` (the facts the three
share: versions, the per-user cache rule, building with Go).

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
``nsq-spark install-nsq`` fills. ``RedisServer`` and ``MemcachedServer`` do the same for the
dedup backends. This module is also a pytest plugin (``nsq_cluster``, ``running_reader``,
``redis_server`` and ``memcached_server`` fixtures); on a failed test the processes' logs
are printed.

Helpers for the test bodies, independent of our own clients::

    nsq_cluster.publish("orders", [b"a", b"b"])        # HTTP /mpub to nsqd 0
    nsq_cluster.nsqds[1].publish("orders", b"c")        # HTTP /pub to nsqd 1
    reader = running_reader.start("orders", "audit", handler,
                                  nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses)
    wait_until(lambda: reader.finished >= 3, 10, "3 finished")
    running_reader.stop(reader)                         # close: everything answered
    nsq_cluster.wait_drained("orders", "audit")         # nothing left in nsqd

``NSQCluster(mode="docker")`` runs the same topology (same flags, free ports) with each
server in a container on the host network of the Docker engine that ``DOCKER_HOST`` names,
through the Docker SDK (``pip install 'nsq-spark[docker]'``): the official image
``nsqio/nsq:v1.3.0`` when present or pullable, else ``nsq-spark/nsq:v1.3.0`` built ``FROM
scratch`` from the same static binaries (no registry needed); ``image=`` or ``$NSQ_IMAGE``
picks another.
Each nsqd's data dir is a volume, so ``restart(i)`` keeps what was on disk; kill is SIGKILL
to the container, stop/resume pause it. Every container and volume is labelled
``nsq-spark.test=<test process id>`` and removed by ``close()``, by the fixtures also after
a failed test, and at exit. ``docker_engine_problem()`` says why docker mode cannot run
here (the reason a docker test tier prints when it skips).
"""

from __future__ import annotations

import atexit
import collections
import ctypes
import hashlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
import weakref
from pathlib import Path
from typing import Any, Callable, Generator, Iterable, Iterator, Sequence, TypeVar

from ._binaries import NSQ_VERSION, cache_bin_dir, nsq_bin_dir

log = logging.getLogger(__name__)

DEFAULT_START_TIMEOUT = 15.0


class HarnessError(RuntimeError):
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


# The harness's own readers of nsqd (stats(), nodes(), publish()) stay on the standard
# library: they are the independent oracle that tests of the library's HTTP path (the
# admin clients, discovery) check against. Readiness and registration waits use the
# library's path (nsq_spark.admin).
def _http_get(url: str, timeout: float = 2.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        body: bytes = resp.read()
        return body


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


# Every live process or container, so that atexit can reap what a crashed test forgot.
_LIVE: "weakref.WeakSet[ServerProcess]" = weakref.WeakSet()
_LIVE_DOCKER: "set[DockerSession]" = set()


@atexit.register
def _reap_all() -> None:
    for proc in list(_LIVE):
        proc.kill()
    for session in list(_LIVE_DOCKER):
        session.close()


class _Server:
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


def _head_tail(lines: list[str], head: int, tail: int) -> str:
    if len(lines) <= head + tail:
        return "\n".join(lines)
    return "\n".join([*lines[:head], "...", *lines[-tail:]])


class ServerProcess(_Server):
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
        return _head_tail(lines, head, tail)

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


# ---------------------------------------------------------------------------------------
# Docker: the same servers in containers on the host network


DEFAULT_IMAGE = f"nsqio/nsq:v{NSQ_VERSION}"
LOCAL_IMAGE = f"nsq-spark/nsq:v{NSQ_VERSION}"
#: Every container and volume the harness makes carries this label, valued with the id of
#: the test process that made it, so leftovers can be found and removed.
DOCKER_LABEL = "nsq-spark.test"
_PROCESS_ID = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
_IMAGE_APPS = ("nsqd", "nsqlookupd", "nsqadmin")
_NO_ENGINE_FIX = ("start one and point DOCKER_HOST at it (scripts/with-docker CMD runs CMD "
                  "with a private engine), or use mode='local'")


def docker_client(timeout: float = 60.0) -> Any:
    """A Docker SDK client for the engine named by ``DOCKER_HOST`` (else the default socket),
    checked with a ping; a HarnessError says what is missing."""
    try:
        import docker
    except ImportError:
        raise HarnessError("mode='docker' needs the Docker SDK for Python: "
                           "pip install 'nsq-spark[docker]' (or pip install docker)") from None
    where = os.environ.get("DOCKER_HOST") or "the default socket (DOCKER_HOST is unset)"
    try:
        client = docker.from_env(timeout=int(timeout))
        client.ping()
    except Exception as exc:  # the SDK raises DockerException, requests' and OSError alike
        why = os.environ.get("NSQ_SPARK_NO_DOCKER_REASON")
        raise HarnessError(f"no Docker engine reachable at {where}: {exc}"
                           + (f" ({why})" if why else "") + f"; {_NO_ENGINE_FIX}") from None
    return client


def docker_engine_problem() -> str | None:
    """None if a Docker engine answers (and the SDK is installed), else why not: the reason
    a docker test tier prints when it skips."""
    try:
        docker_client(timeout=10).close()
    except HarnessError as exc:
        return str(exc)
    return None


def docker_leftovers() -> list[str]:
    """Containers and volumes that this test process's harness labelled and that still
    exist on the engine (``container:<name>`` / ``volume:<name>``): empty after every
    cluster has been closed."""
    selector = {"label": f"{DOCKER_LABEL}={_PROCESS_ID}"}
    client = docker_client()
    try:
        return ([f"container:{c.name}" for c in client.containers.list(all=True, filters=selector)]
                + [f"volume:{v.name}" for v in client.volumes.list(filters=selector)])
    finally:
        client.close()


def _elf_is_dynamic(path: str) -> bool:
    """Whether an ELF64 little-endian executable asks for a dynamic loader (PT_INTERP): such
    a binary cannot run in a ``FROM scratch`` image. Other formats: False (not judged)."""
    with open(path, "rb") as f:
        header = f.read(64)
        if header[:4] != b"\x7fELF" or header[4] != 2 or header[5] != 1:
            return False
        phoff = int.from_bytes(header[0x20:0x28], "little")
        phentsize = int.from_bytes(header[0x36:0x38], "little")
        phnum = int.from_bytes(header[0x38:0x3A], "little")
        f.seek(phoff)
        table = f.read(phentsize * phnum)
    PT_INTERP = 3
    return any(int.from_bytes(table[i:i + 4], "little") == PT_INTERP
               for i in range(0, len(table), phentsize))


def ensure_image(client: Any, image: str | None = None,
                 bin_dirs: Sequence[Path] = ()) -> str:
    """The image the docker mode runs, made available on the engine.

    ``image=None`` means the official ``nsqio/nsq:v1.3.0``: used if present, else pulled,
    else (no registry reachable) ``nsq-spark/nsq:v1.3.0`` is built ``FROM scratch`` from the
    static binaries the local mode uses (:func:`find_binary`), rebuilt when they change.
    An explicit ``image`` must be present or pullable: it is never replaced by another.
    """
    import docker

    wanted = image or DEFAULT_IMAGE
    try:
        client.images.get(wanted)
        return wanted
    except docker.errors.ImageNotFound:
        pass
    try:
        client.images.pull(wanted)
        return wanted
    except docker.errors.APIError as exc:
        if image is not None:
            raise HarnessError(f"image {image!r} is not on the Docker engine and cannot be "
                               f"pulled ({exc}); build or load it, or leave image unset to "
                               f"use {DEFAULT_IMAGE} or a local build of it") from None
        log.info("cannot pull %s (%s): using %s built from local binaries",
                 wanted, exc, LOCAL_IMAGE)
    return _build_local_image(client, bin_dirs)


def _build_local_image(client: Any, bin_dirs: Sequence[Path]) -> str:
    import docker

    binaries = [find_binary(app, bin_dirs) for app in _IMAGE_APPS]
    for path in binaries:
        if _elf_is_dynamic(path):
            raise HarnessError(
                f"{path} is dynamically linked, so it cannot run in a FROM scratch image; "
                f"build static binaries (CGO_ENABLED=0, as nsq-spark install-nsq does), or "
                f"make the image {DEFAULT_IMAGE} available to the engine")
    digest = hashlib.sha256()
    for path in binaries:
        with open(path, "rb") as f:
            digest.update(hashlib.file_digest(f, "sha256").digest())
    fingerprint = digest.hexdigest()[:16]
    try:
        if client.images.get(LOCAL_IMAGE).labels.get("nsq-spark.binaries") == fingerprint:
            return LOCAL_IMAGE
    except docker.errors.ImageNotFound:
        pass
    with tempfile.TemporaryDirectory(prefix="nsq-spark-image-") as context:
        for app, path in zip(_IMAGE_APPS, binaries):
            shutil.copy2(path, Path(context) / app)
        # The official image has its binaries at /nsqd etc. too, so commands fit both.
        (Path(context) / "Dockerfile").write_text(
            f"FROM scratch\nCOPY {' '.join(_IMAGE_APPS)} /\n")
        try:
            client.images.build(path=context, tag=LOCAL_IMAGE, rm=True, forcerm=True,
                                labels={"nsq-spark.binaries": fingerprint})
        except docker.errors.DockerException as exc:
            raise HarnessError(f"building {LOCAL_IMAGE} from {binaries} failed: {exc}") from None
    return LOCAL_IMAGE


class DockerSession:
    """One cluster's containers and volumes on one engine, all labelled; ``close()`` removes
    every one of them (also those a failed start left behind). Safe to call twice."""

    def __init__(self, image: str | None = None, bin_dirs: Sequence[Path] = ()) -> None:
        self.client = docker_client()
        self.id = uuid.uuid4().hex[:10]
        self.labels = {DOCKER_LABEL: _PROCESS_ID, "nsq-spark.cluster": self.id}
        _LIVE_DOCKER.add(self)
        try:
            # NSQ_IMAGE picks the image here as in integration/docker-compose.yml
            self.image = ensure_image(self.client, image or os.environ.get("NSQ_IMAGE") or None,
                                      bin_dirs)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        _LIVE_DOCKER.discard(self)
        if self.client is None:
            return
        selector = {"label": f"nsq-spark.cluster={self.id}"}
        try:
            for container in self.client.containers.list(all=True, filters=selector):
                container.remove(force=True, v=True)
            for volume in self.client.volumes.list(filters=selector):
                volume.remove(force=True)
        except Exception as exc:  # never mask the test's own error; say what is left
            log.warning("could not remove docker containers/volumes labelled "
                        "nsq-spark.cluster=%s: %s", self.id, exc)
        self.client.close()
        self.client = None


class ContainerProcess(_Server):
    """One server in a container on the host network, with the controls of a process:
    kill is SIGKILL to the container, pause/unpause freeze it, start after a kill runs the
    same container again (same command, same ``/data`` volume)."""

    def __init__(self, name: str, session: DockerSession, argv: list[str],
                 ready_url: str | None, data_volume: bool = False) -> None:
        self.name = name
        self.session = session
        self.argv = argv
        self.ready_url = ready_url
        self.container_name = f"nsq-spark-{session.id}-{name}"
        self.volume_name = f"{self.container_name}-data" if data_volume else None
        self.container: Any = None
        self._created_argv: list[str] = []

    def _state(self) -> dict[str, Any]:
        if self.container is None:
            return {}
        try:
            self.container.reload()
        except Exception:  # removed underneath us
            return {}
        return dict(self.container.attrs.get("State") or {})

    @property
    def running(self) -> bool:
        return bool(self._state().get("Running"))

    @property
    def pid(self) -> int | None:
        """The server's pid on this host (0/None when not running)."""
        return self._state().get("Pid") or None

    def start(self, timeout: float = DEFAULT_START_TIMEOUT) -> None:
        if self.container is not None and self._created_argv != self.argv:
            self.container.remove(force=True)  # new ports (port retry): new container
            self.container = None
        if self.container is None:
            volumes = {}
            if self.volume_name:
                self.session.client.volumes.create(self.volume_name, labels=self.session.labels)
                volumes[self.volume_name] = {"bind": "/data", "mode": "rw"}
            self.container = self.session.client.containers.create(
                self.session.image, self.argv, name=self.container_name,
                labels=self.session.labels, network_mode="host", volumes=volumes,
                detach=True)
            self._created_argv = list(self.argv)
        self.container.start()
        self.wait_ready(timeout)

    def _exit_code(self) -> int | None:
        state = self._state()
        if state.get("Status") in ("exited", "dead"):
            return int(state.get("ExitCode", -1))
        return None

    def log_text(self, head: int = 10, tail: int = 50) -> str:
        if self.container is None:
            return "(not started)"
        try:
            text = self.container.logs().decode(errors="replace")
        except Exception as exc:
            return f"(no log: {exc})"
        return _head_tail([f"--- container {self.container_name}: {' '.join(self.argv)}",
                           *text.splitlines()], head, tail)

    def pause(self) -> None:
        if self._state().get("Status") == "running":
            self.container.pause()

    def unpause(self) -> None:
        if self._state().get("Paused"):
            self.container.unpause()

    def kill(self) -> None:
        """SIGKILL the container and wait until it has exited; a no-op if not running."""
        if not self.running:
            return
        self.unpause()  # the engine refuses to kill a paused container
        try:
            self.container.kill("SIGKILL")
            self.container.wait(timeout=10)
        except Exception as exc:  # already gone, or exited meanwhile
            log.debug("%s: kill: %s", self.name, exc)

    def terminate(self, timeout: float = 10.0) -> None:
        """SIGTERM, wait, then SIGKILL (the engine's stop)."""
        if not self.running:
            return
        self.unpause()
        self.container.stop(timeout=int(timeout))


# ---------------------------------------------------------------------------------------
# NSQ


def _nsqd_args(tcp_port: int, http_port: int, https_port: int, data_path: str,
               lookupd_tcp: list[str], flags: dict[str, Any]) -> list[str]:
    return [
        f"--tcp-address=127.0.0.1:{tcp_port}",
        f"--http-address=127.0.0.1:{http_port}",
        f"--https-address=127.0.0.1:{https_port}",
        "--broadcast-address=127.0.0.1",
        f"--data-path={data_path}",
        *(f"--lookupd-tcp-address={a}" for a in lookupd_tcp),
        *_flag_args(flags),
    ]


def _lookupd_args(tcp_port: int, http_port: int, flags: dict[str, Any]) -> list[str]:
    return [f"--tcp-address=127.0.0.1:{tcp_port}", f"--http-address=127.0.0.1:{http_port}",
            "--broadcast-address=127.0.0.1", *_flag_args(flags)]


def _nsqadmin_args(http_port: int, lookupd_http: list[str], nsqd_http: list[str]) -> list[str]:
    # nsqadmin takes lookupds or nsqds, not both
    sources = ([f"--lookupd-http-address={a}" for a in lookupd_http] if lookupd_http
               else [f"--nsqd-http-address={a}" for a in nsqd_http])
    return [f"--http-address=127.0.0.1:{http_port}", *sources]


class _LoopbackPorts:
    """The TCP and HTTP addresses of a server on 127.0.0.1, however it runs."""

    tcp_port: int
    http_port: int

    @property
    def tcp_address(self) -> str:
        return f"127.0.0.1:{self.tcp_port}"

    @property
    def http_address(self) -> str:
        return f"127.0.0.1:{self.http_port}"


class _NsqdApi(_LoopbackPorts):
    """Addresses, stats and publishing of an nsqd, however it runs."""

    def stats(self, topic: str | None = None) -> dict[str, Any]:
        """nsqd's ``/stats`` as JSON (optionally for one topic)."""
        url = f"http://{self.http_address}/stats?format=json"
        if topic:
            url += f"&topic={topic}"
        stats: dict[str, Any] = json.loads(_http_get(url))
        return stats

    def channel_stats(self, topic: str, channel: str) -> dict[str, Any]:
        """This nsqd's stats of ``topic/channel`` (``depth``, ``in_flight_count``, ...);
        ``{}`` while the channel does not exist."""
        for t in self.stats(topic).get("topics") or []:
            if t["topic_name"] == topic:
                for c in t["channels"]:
                    if c["channel_name"] == channel:
                        found: dict[str, Any] = c
                        return found
        return {}

    def publish(self, topic: str, bodies: bytes | Iterable[bytes], chunk: int = 5000) -> None:
        """Publish straight to this nsqd over HTTP (see :func:`publish`)."""
        publish(self.http_address, topic, bodies, chunk)


class _LookupdApi(_LoopbackPorts):
    """Addresses and registrations of an nsqlookupd, however it runs."""

    def nodes(self) -> list[dict[str, Any]]:
        """The producers this lookupd knows (``/nodes``)."""
        producers: list[dict[str, Any]] = json.loads(
            _http_get(f"http://{self.http_address}/nodes"))["producers"]
        return producers


class NsqdNode(_NsqdApi, ServerProcess):
    """One nsqd: its addresses stay fixed across restarts, and so does its data dir."""

    def __init__(self, index: int, binary: str, workdir: Path, lookupd_tcp: list[str],
                 flags: dict[str, Any]) -> None:
        self.index = index
        self.tcp_port = free_port()
        self.http_port = free_port()
        self.https_port = free_port()
        self.data_path = workdir / f"nsqd{index}-data"
        self.data_path.mkdir(parents=True, exist_ok=True)
        argv = [binary, *_nsqd_args(self.tcp_port, self.http_port, self.https_port,
                                    str(self.data_path), lookupd_tcp, flags)]
        super().__init__(f"nsqd{index}", argv, workdir, f"http://127.0.0.1:{self.http_port}/ping")


class LookupdNode(_LookupdApi, ServerProcess):
    def __init__(self, index: int, binary: str, workdir: Path, flags: dict[str, Any]) -> None:
        self.index = index
        self.tcp_port = free_port()
        self.http_port = free_port()
        argv = [binary, *_lookupd_args(self.tcp_port, self.http_port, flags)]
        super().__init__(f"nsqlookupd{index}", argv, workdir,
                         f"http://127.0.0.1:{self.http_port}/ping")


class NsqadminNode(ServerProcess):
    def __init__(self, binary: str, workdir: Path, lookupd_http: list[str],
                 nsqd_http: list[str]) -> None:
        self.http_port = free_port()
        argv = [binary, *_nsqadmin_args(self.http_port, lookupd_http, nsqd_http)]
        super().__init__("nsqadmin", argv, workdir, f"http://127.0.0.1:{self.http_port}/ping")

    @property
    def http_address(self) -> str:
        return f"127.0.0.1:{self.http_port}"


class NsqdContainer(_NsqdApi, ContainerProcess):
    """nsqd in a container; its data dir is a volume, so a restart keeps what was on disk."""

    def __init__(self, index: int, session: DockerSession, lookupd_tcp: list[str],
                 flags: dict[str, Any]) -> None:
        self.index = index
        self.tcp_port = free_port()
        self.http_port = free_port()
        self.https_port = free_port()
        argv = ["/nsqd", *_nsqd_args(self.tcp_port, self.http_port, self.https_port, "/data",
                                     lookupd_tcp, flags)]
        super().__init__(f"nsqd{index}", session, argv,
                         f"http://127.0.0.1:{self.http_port}/ping", data_volume=True)


class LookupdContainer(_LookupdApi, ContainerProcess):
    def __init__(self, index: int, session: DockerSession, flags: dict[str, Any]) -> None:
        self.index = index
        self.tcp_port = free_port()
        self.http_port = free_port()
        argv = ["/nsqlookupd", *_lookupd_args(self.tcp_port, self.http_port, flags)]
        super().__init__(f"nsqlookupd{index}", session, argv,
                         f"http://127.0.0.1:{self.http_port}/ping")


class NsqadminContainer(ContainerProcess):
    def __init__(self, session: DockerSession, lookupd_http: list[str],
                 nsqd_http: list[str]) -> None:
        self.http_port = free_port()
        argv = ["/nsqadmin", *_nsqadmin_args(self.http_port, lookupd_http, nsqd_http)]
        super().__init__("nsqadmin", session, argv, f"http://127.0.0.1:{self.http_port}/ping")

    @property
    def http_address(self) -> str:
        return f"127.0.0.1:{self.http_port}"


AnyNsqd = NsqdNode | NsqdContainer
AnyLookupd = LookupdNode | LookupdContainer


class NSQCluster:
    """``nsqd`` real nsqd processes registered with ``lookupd`` real nsqlookupd processes.

    Args:
        nsqd: how many nsqd to start.
        lookupd: how many nsqlookupd to start (0 is allowed: nsqd then runs standalone).
        mode: ``"local"`` (binaries, default) or ``"docker"`` (the same topology, same
            flags and free ports, each server in a container on the host network of the
            engine that ``DOCKER_HOST`` names; needs ``pip install 'nsq-spark[docker]'``).
        image: docker mode only: the image to run (default ``$NSQ_IMAGE``, else
            ``nsqio/nsq:v1.3.0`` if present or pullable, else ``nsq-spark/nsq:v1.3.0`` built
            ``FROM scratch`` from the local binaries). A named image must be present or
            pullable, and have ``/nsqd``, ``/nsqlookupd``, ``/nsqadmin``.
        nsqadmin: also start an nsqadmin (on the lookupds, or on the nsqds if there are
            none); its address is ``nsqadmin_http_address``.
        bin_dir: where the NSQ binaries are; default ``$NSQ_BIN_DIR``, the install-nsq
            cache, then ``PATH``.
        lookupd_flags: flags for every nsqlookupd, same form as the nsqd flags.
        start_timeout: seconds each process has to answer ``/ping``.
        **nsqd_flags: flags for every nsqd (``mem_queue_size=0`` -> ``--mem-queue-size=0``).
    """

    def __init__(self, nsqd: int = 1, lookupd: int = 1, *, mode: str = "local",
                 image: str | None = None, nsqadmin: bool = False,
                 bin_dir: str | os.PathLike[str] | None = None,
                 lookupd_flags: dict[str, Any] | None = None,
                 start_timeout: float = DEFAULT_START_TIMEOUT, **nsqd_flags: Any) -> None:
        if nsqd < 0 or lookupd < 0:
            raise ValueError("NSQCluster needs nsqd >= 0 and lookupd >= 0")
        if mode not in ("local", "docker"):
            raise ValueError(f"NSQCluster mode must be 'local' or 'docker', not {mode!r}")
        if image is not None and mode != "docker":
            raise ValueError("NSQCluster image= is for mode='docker'; drop it, or pass "
                             "mode='docker'")
        self.mode = mode
        self._image = image
        self._want_nsqadmin = nsqadmin
        self._n_nsqd = nsqd
        self._n_lookupd = lookupd
        self._bin_dirs = [Path(bin_dir)] if bin_dir else []
        self._nsqd_flags = nsqd_flags
        self._lookupd_flags = lookupd_flags or {}
        self._start_timeout = start_timeout
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self.workdir: Path | None = None
        self.nsqds: list[AnyNsqd] = []
        self.lookupds: list[AnyLookupd] = []
        self.nsqadmin: NsqadminNode | NsqadminContainer | None = None
        self.docker: DockerSession | None = None

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> "NSQCluster":
        self._tmp = tempfile.TemporaryDirectory(prefix="nsq-spark-cluster-")
        self.workdir = Path(self._tmp.name)
        try:
            if self.mode == "docker":
                self.docker = DockerSession(self._image, self._bin_dirs)
            for i in range(self._n_lookupd):
                node = self._new_lookupd(i)
                self.lookupds.append(node)
                _start_with_port_retry(node, self._start_timeout)
            for _ in range(self._n_nsqd):
                self.add_nsqd()
            if self._want_nsqadmin:
                self.nsqadmin = self._new_nsqadmin()
                _start_with_port_retry(self.nsqadmin, self._start_timeout)
        except BaseException:
            self.close()
            raise
        return self

    def _new_lookupd(self, i: int) -> AnyLookupd:
        if self.docker is not None:
            return LookupdContainer(i, self.docker, self._lookupd_flags)
        assert self.workdir is not None
        return LookupdNode(i, find_binary("nsqlookupd", self._bin_dirs), self.workdir,
                           self._lookupd_flags)

    def _new_nsqd(self, i: int, flags: dict[str, Any]) -> AnyNsqd:
        lookupd_tcp = [lk.tcp_address for lk in self.lookupds]
        if self.docker is not None:
            return NsqdContainer(i, self.docker, lookupd_tcp, flags)
        assert self.workdir is not None
        return NsqdNode(i, find_binary("nsqd", self._bin_dirs), self.workdir, lookupd_tcp,
                        flags)

    def _new_nsqadmin(self) -> NsqadminNode | NsqadminContainer:
        lookupd_http = [lk.http_address for lk in self.lookupds]
        nsqd_http = [n.http_address for n in self.nsqds]
        if self.docker is not None:
            return NsqadminContainer(self.docker, lookupd_http, nsqd_http)
        assert self.workdir is not None
        return NsqadminNode(find_binary("nsqadmin", self._bin_dirs), self.workdir,
                            lookupd_http, nsqd_http)

    def add_nsqd(self, **extra_flags: Any) -> int:
        """Start one more nsqd (registered with every lookupd); returns its index."""
        if self.workdir is None:
            raise HarnessError("start the cluster before adding nsqd")
        node = self._new_nsqd(len(self.nsqds), {**self._nsqd_flags, **extra_flags})
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
        """Kill every process, remove every container and volume, and the data dirs.
        Safe to call twice."""
        for node in self._servers():
            node.kill()
        if self.docker is not None:
            self.docker.close()
            self.docker = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def _servers(self) -> list[_Server]:
        servers: list[_Server] = [*self.nsqds, *self.lookupds]
        if self.nsqadmin is not None:
            servers.append(self.nsqadmin)
        return servers

    def __enter__(self) -> "NSQCluster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- addresses ----------------------------------------------------------------------

    @property
    def nsqd_tcp_addresses(self) -> list[str]:
        return [n.tcp_address for n in self.nsqds]

    @property
    def nsqd_http_addresses(self) -> list[str]:
        return [n.http_address for n in self.nsqds]

    @property
    def lookupd_http_addresses(self) -> list[str]:
        return [lk.http_address for lk in self.lookupds]

    @property
    def lookupd_tcp_addresses(self) -> list[str]:
        return [lk.tcp_address for lk in self.lookupds]

    @property
    def nsqadmin_http_address(self) -> str | None:
        return self.nsqadmin.http_address if self.nsqadmin is not None else None

    # -- fault controls (nsqd by index) -------------------------------------------------

    def kill(self, i: int) -> None:
        """SIGKILL nsqd ``i`` (what was fsynced to its data dir survives a restart)."""
        self.nsqds[i].kill()

    def stop(self, i: int) -> None:
        """Freeze nsqd ``i`` (SIGSTOP; a paused container): it holds its sockets open but
        answers nothing."""
        self.nsqds[i].pause()

    def resume(self, i: int) -> None:
        """Unfreeze nsqd ``i`` (SIGCONT; unpause)."""
        self.nsqds[i].unpause()

    def restart(self, i: int) -> None:
        """(Re)start nsqd ``i`` on the same ports with the same data dir."""
        node = self.nsqds[i]
        node.terminate()
        node.start(self._start_timeout)
        self.wait_registered(i)

    def kill_lookupd(self, i: int) -> None:
        self.lookupds[i].kill()

    def restart_lookupd(self, i: int) -> None:
        self.lookupds[i].kill()
        self.lookupds[i].start(self._start_timeout)

    def publish(self, topic: str, bodies: bytes | Iterable[bytes], nsqd: int = 0) -> None:
        """Publish straight to nsqd ``nsqd`` over HTTP (no client of ours in between)."""
        self.nsqds[nsqd].publish(topic, bodies)

    def wait_drained(self, topic: str, channel: str, timeout: float = 5.0) -> None:
        """Until every running nsqd holds nothing for ``topic/channel``: no depth, nothing
        in flight or deferred (nothing left for nsqd to time out or redeliver). Raises
        AssertionError with the channels' stats after ``timeout`` seconds."""
        def undrained() -> dict[int, dict[str, Any]]:
            return {i: c for i, node in enumerate(self.nsqds) if node.running
                    for c in [node.channel_stats(topic, channel)]
                    if c and (c["depth"] or c["in_flight_count"] or c["deferred_count"])}
        try:
            wait_until(lambda: not undrained(), timeout, f"{topic}/{channel} drained")
        except AssertionError:
            raise AssertionError(f"{topic}/{channel} not drained after {timeout}s: "
                                 f"{json.dumps(undrained())[:2000]}") from None

    def logs(self) -> str:
        """The tail of every process's output, for failure reports."""
        return "\n".join(f"==== {n.name} ====\n{n.log_text()}"
                         for n in [*self.lookupds, *self.nsqds,
                                   *([self.nsqadmin] if self.nsqadmin else [])])


def _lists_node(lookupd: AnyLookupd, tcp_port: int) -> bool:
    from nsq_spark.admin import AdminError, LookupdClient
    from nsq_spark.admin.transport import shared_transport

    try:
        nodes = LookupdClient(lookupd.http_address, timeout=2.0,
                              transport=shared_transport()).nodes()
    except (AdminError, OSError):
        return False
    return any(p.tcp_port == tcp_port for p in nodes)


def _start_with_port_retry(node: Any, timeout: float, attempts: int = 3) -> None:
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
# helpers for tests: publish straight to nsqd, wait for a condition, run a Reader

T = TypeVar("T")


def publish(http_address: str, topic: str, bodies: bytes | Iterable[bytes],
            chunk: int = 5000) -> None:
    """Publish straight to the nsqd at ``http_address`` over its HTTP API, independent of
    any client of ours: one body with ``/pub``, several with binary ``/mpub`` (bodies may
    hold newlines) in MPUBs of ``chunk``. Raises :class:`HarnessError` with nsqd's answer
    when it does not say OK."""
    query = urllib.parse.urlencode({"topic": topic})
    if isinstance(bodies, (bytes, bytearray, memoryview)):
        posts = [(f"/pub?{query}", bytes(bodies))]
    else:
        items = list(bodies)
        posts = [(f"/mpub?{query}&binary=true",
                  len(part).to_bytes(4, "big")
                  + b"".join(len(b).to_bytes(4, "big") + b for b in part))
                 for part in (items[i:i + chunk] for i in range(0, len(items), chunk))]
    for path, data in posts:
        req = urllib.request.Request(f"http://{http_address}{path}", data=data, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                answer = resp.read()
        except urllib.error.HTTPError as exc:
            answer = exc.read()
        except OSError as exc:
            raise HarnessError(f"publishing to nsqd at {http_address} failed: {exc}; is it "
                               "running, and is this its HTTP (not TCP) address?") from exc
        if answer != b"OK":
            raise HarnessError(f"nsqd at {http_address} refused POST {path.split('?')[0]} "
                               f"to topic {topic!r}: {answer[:200]!r}")


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


class ReaderRunner:
    """Readers running on their own event-loop threads, for synchronous tests.

    ``start(topic, channel, handler, **kwargs)`` builds a :class:`nsq_spark.Reader` (or
    ``reader_class``, e.g. a subclass with pynsq's hooks) with those arguments on a new
    loop thread (so handler, batch and coroutine handlers run as in an application) and
    returns it; ``stop(reader)`` closes it there (every message
    answered, the connections closed) and ends the thread; ``close()`` stops all that are
    left. The ``running_reader`` fixture is one, closed after the test."""

    def __init__(self) -> None:
        self._running: dict[int, tuple[Any, Any]] = {}

    def start(self, topic: str, channel: str, message_handler: Any = None, *,
              reader_class: Any = None, **kwargs: Any) -> Any:
        from nsq_spark._loop import LoopThread
        from nsq_spark.consumer.reader import Reader

        cls = reader_class or Reader
        thread = LoopThread(name=f"test-reader-{topic}-{channel}")

        async def build() -> Any:
            return cls(topic, channel, message_handler, **kwargs)
        try:
            reader = thread.run_coroutine(build()).result(DEFAULT_START_TIMEOUT)
        except BaseException:
            thread.stop()
            raise
        self._running[id(reader)] = (reader, thread)
        return reader

    def stop(self, reader: Any, timeout: float = 30.0) -> None:
        """Close ``reader`` on its loop (at most ``timeout`` s) and end its thread."""
        entry = self._running.pop(id(reader), None)
        if entry is None:
            return
        _, thread = entry
        try:
            thread.run_coroutine(reader.aclose()).result(timeout)
        finally:
            thread.stop()

    def close(self) -> None:
        """Stop every reader still running. A reader that fails to stop does not leave the
        others running (their loop threads would outlive the test): all are stopped, then
        the first failure is raised, with the later ones in its notes."""
        first: Exception | None = None
        for reader, _ in list(self._running.values()):
            try:
                self.stop(reader)
            except Exception as exc:  # not KeyboardInterrupt: an interrupt ends the cleanup
                if first is None:
                    first = exc
                else:
                    first.add_note(f"stopping another reader failed too: {exc!r}")
        if first is not None:
            raise first

    def __enter__(self) -> "ReaderRunner":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------------------------------
# pytest plugin (registered through the ``pytest11`` entry point)

try:
    import pytest
except ImportError:  # pragma: no cover - the harness works without pytest
    pytest = None  # type: ignore[assignment]

if pytest is not None:

    @pytest.hookimpl(hookwrapper=True, tryfirst=True)
    def pytest_runtest_makereport(item: Any, call: Any) -> Generator[None, Any, None]:
        outcome = yield
        rep = outcome.get_result()
        setattr(item, f"_nsq_spark_rep_{rep.when}", rep)

    def _failed(request: Any) -> bool:
        return any(getattr(getattr(request.node, f"_nsq_spark_rep_{w}", None), "failed", False)
                   for w in ("setup", "call"))

    def _cluster_for(request: Any, kwargs: dict[str, Any]) -> Iterator[NSQCluster]:
        if kwargs.get("mode") == "docker":
            problem = docker_engine_problem()
            if problem:
                pytest.skip(f"docker mode: {problem}")
        # the context manager removes processes, containers and volumes, failed or not
        with NSQCluster(**kwargs) as cluster:
            yield cluster
            if _failed(request):
                print(f"\nNSQ process logs for {request.node.nodeid}:\n{cluster.logs()}")

    @pytest.fixture
    def nsq_cluster(request: Any) -> Iterator[NSQCluster]:
        """One nsqd and one nsqlookupd. Parametrize with
        ``@pytest.mark.nsq_cluster(nsqd=2, lookupd=2, mem_queue_size=0)``; with
        ``mode="docker"`` the servers run in containers (skipped, with the reason, when no
        Docker engine is reachable)."""
        marker = request.node.get_closest_marker("nsq_cluster")
        yield from _cluster_for(request, dict(marker.kwargs) if marker else {})

    @pytest.fixture
    def docker_nsq_cluster(request: Any) -> Iterator[NSQCluster]:
        """``nsq_cluster`` in docker mode: the same marker shapes it."""
        marker = request.node.get_closest_marker("nsq_cluster")
        yield from _cluster_for(request, {**(marker.kwargs if marker else {}), "mode": "docker"})

    @pytest.fixture
    def running_reader() -> Iterator[ReaderRunner]:
        """A :class:`ReaderRunner`: ``running_reader.start(topic, channel, handler,
        nsqd_tcp_addresses=...)`` runs a Reader on its own loop thread; every Reader still
        running is closed after the test."""
        with ReaderRunner() as runner:
            yield runner

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
