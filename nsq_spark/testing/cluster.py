"""A real NSQ cluster for tests: ``nsqd`` and ``nsqlookupd`` (and ``nsqadmin``) on free
127.0.0.1 ports, each nsqd registered with every lookupd, with controls for faults (kill,
freeze, restart on the same ports and data dir) and helpers that talk to nsqd straight
over HTTP, independent of any client of ours (:func:`publish`, ``stats()``,
``channel_stats()``, ``nodes()``, :meth:`NSQCluster.wait_drained`).

The servers are processes (:mod:`.processes`) by default, or containers
(``mode="docker"``, :mod:`.docker`) with the same flags on the same kind of ports.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Iterable

from .docker import ContainerProcess, DockerSession
from .processes import (DEFAULT_START_TIMEOUT, HarnessError, Server, ServerProcess,
                        find_binary, free_port, start_with_port_retry, wait_until)

__all__ = ["NSQCluster", "NsqdNode", "LookupdNode", "NsqadminNode", "NsqdContainer",
           "LookupdContainer", "NsqadminContainer", "AnyNsqd", "AnyLookupd", "publish"]


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
                start_with_port_retry(node, self._start_timeout)
            for _ in range(self._n_nsqd):
                self.add_nsqd()
            if self._want_nsqadmin:
                self.nsqadmin = self._new_nsqadmin()
                start_with_port_retry(self.nsqadmin, self._start_timeout)
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
        start_with_port_retry(node, self._start_timeout)
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

    def _servers(self) -> list[Server]:
        servers: list[Server] = [*self.nsqds, *self.lookupds]
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
