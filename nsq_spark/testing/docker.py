"""Docker mode: the harness's servers in containers on the host network of the engine
that ``DOCKER_HOST`` names, on testcontainers (``pip install 'nsq-spark[docker]'``).

``NSQCluster(mode="docker")`` runs the same topology as the process mode (same flags,
free ports) with each server in a container: the official image ``nsqio/nsq:v1.3.0``
when present or pullable, else ``nsq-spark/nsq:v1.3.0`` built ``FROM scratch`` from the
same static binaries (no registry needed); ``image=`` or ``$NSQ_IMAGE`` picks another.
Each nsqd's data dir is a volume, so ``restart(i)`` keeps what was on disk; kill is
SIGKILL to the container, stop/resume pause it. Every container and volume is labelled
``nsq-spark.test=<test process id>`` and removed by ``close()``, by the fixtures also
after a failed test, and at exit; :func:`docker_engine_problem` says why docker mode
cannot run here (the reason a docker test tier prints when it skips).

Why it stays, and on testcontainers (issue 37): it earns what the process mode cannot
give, NSQ without local binaries (no Go toolchain, no ``install-nsq``: the official image
is the whole set-up) and the official image itself under test where a registry is
reachable; and ``integration/docker-compose.yml`` is checked against it. testcontainers
(testcontainers-python) makes each container, with its session label, the image pulled
when missing, the engine found as the Docker CLI finds it (``DOCKER_HOST``, the current
context), and its reaper (Ryuk), which removes the containers of a test process that died
without cleaning up (SIGKILL, OOM: no ``atexit`` runs). What testcontainers does not model
stays here, on the Docker SDK it wraps: a container killed and started again with its
volume (testcontainers' ``stop()`` removes it), freezing, the volumes, and the image built
``FROM scratch``. The reaper runs from its own image: where the engine has it or can pull
it it is used, else (no registry: this project's own CI) it is turned off for the process,
with an INFO line, and the labels, ``close()`` and ``atexit`` do the clean-up as before.
"""

from __future__ import annotations

import atexit
import hashlib
import logging
import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any, Sequence

from ._binaries import NSQ_VERSION
from .processes import DEFAULT_START_TIMEOUT, HarnessError, Server, find_binary, head_tail

__all__ = ["DEFAULT_IMAGE", "LOCAL_IMAGE", "DOCKER_LABEL", "docker_client",
           "docker_engine_problem", "docker_leftovers", "ensure_image", "DockerSession",
           "ContainerProcess"]

log = logging.getLogger("nsq_spark.testing")

DEFAULT_IMAGE = f"nsqio/nsq:v{NSQ_VERSION}"
LOCAL_IMAGE = f"nsq-spark/nsq:v{NSQ_VERSION}"
#: Every container and volume the harness makes carries this label, valued with the id of
#: the test process that made it, so leftovers can be found and removed.
DOCKER_LABEL = "nsq-spark.test"
_PROCESS_ID = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
_IMAGE_APPS = ("nsqd", "nsqlookupd", "nsqadmin")
_NO_ENGINE_FIX = ("start one and point DOCKER_HOST at it (scripts/with-docker CMD runs CMD "
                  "with a private engine), or use mode='local'")
_INSTALL = "pip install 'nsq-spark[docker]' (or pip install testcontainers)"

# Every live session, so that atexit can remove what a crashed test forgot.
_LIVE_DOCKER: "set[DockerSession]" = set()


@atexit.register
def _remove_all() -> None:
    for session in list(_LIVE_DOCKER):
        session.close()


def docker_client(timeout: float = 60.0) -> Any:
    """A Docker SDK client for the engine testcontainers finds (``DOCKER_HOST``, else the
    current Docker context, else the default socket), checked with a ping; a HarnessError
    says what is missing."""
    try:
        from testcontainers.core.docker_client import DockerClient
    except ImportError:
        raise HarnessError(f"mode='docker' needs testcontainers: {_INSTALL}") from None
    where = os.environ.get("DOCKER_HOST") or "the default socket (DOCKER_HOST is unset)"
    try:
        client = DockerClient(timeout=int(timeout)).client
        client.ping()
    except Exception as exc:  # the SDK raises DockerException, requests' and OSError alike
        why = os.environ.get("NSQ_SPARK_NO_DOCKER_REASON")
        raise HarnessError(f"no Docker engine reachable at {where}: {exc}"
                           + (f" ({why})" if why else "") + f"; {_NO_ENGINE_FIX}") from None
    return client


def docker_engine_problem() -> str | None:
    """None if a Docker engine answers (and testcontainers is installed), else why not:
    the reason a docker test tier prints when it skips."""
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


_reaper_decided = False


def _reaper_or_none(client: Any) -> None:
    """Keep testcontainers' reaper when its image is on the engine or can be pulled; turn
    it off for this process otherwise (see the module doc). Decided once per process; a
    choice made by the user (``TESTCONTAINERS_RYUK_DISABLED``) stands."""
    global _reaper_decided
    import docker
    from testcontainers.core.config import testcontainers_config as config

    if _reaper_decided or config.ryuk_disabled:
        return
    _reaper_decided = True
    try:
        client.images.get(config.ryuk_image)
        return
    except docker.errors.ImageNotFound:
        pass
    except docker.errors.DockerException as exc:
        log.debug("looking for %s: %s", config.ryuk_image, exc)
    try:
        client.images.pull(config.ryuk_image)
    except docker.errors.DockerException as exc:
        config.ryuk_disabled = True
        log.info("testcontainers' reaper image %s cannot be had (%s): reaper off; the "
                 "containers are removed by close() and at exit, and labelled %s",
                 config.ryuk_image, str(exc).splitlines()[0][:200], DOCKER_LABEL)


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
        self.client: Any = docker_client()
        self.id = uuid.uuid4().hex[:10]
        self.labels = {DOCKER_LABEL: _PROCESS_ID, "nsq-spark.cluster": self.id}
        _LIVE_DOCKER.add(self)
        try:
            _reaper_or_none(self.client)
            # NSQ_IMAGE picks the image here as in integration/docker-compose.yml
            self.image = ensure_image(self.client, image or os.environ.get("NSQ_IMAGE") or None,
                                      bin_dirs)
        except BaseException:
            self.close()
            raise

    def volume_labels(self) -> dict[str, str]:
        """A volume's labels: the session's, and testcontainers' session label, by which
        its reaper removes volumes too (containers get theirs from testcontainers)."""
        from testcontainers.core.labels import LABEL_SESSION_ID, SESSION_ID

        return {**self.labels, LABEL_SESSION_ID: SESSION_ID}

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


class ContainerProcess(Server):
    """One server in a container on the host network, with the controls of a process:
    kill is SIGKILL to the container, pause/unpause freeze it, start after a kill runs the
    same container again (same command, same ``/data`` volume). testcontainers makes the
    container (``DockerContainer``); the controls use the container it wraps."""

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

    def _create_and_start(self) -> Any:
        from testcontainers.core.container import DockerContainer

        made = (DockerContainer(self.session.image, name=self.container_name)
                .with_command(self.argv)
                # host networking: the servers listen on free 127.0.0.1 ports exactly as
                # processes do ("network" as the SDK takes it: testcontainers then picks
                # no network of its own)
                .with_kwargs(network="host", labels=self.session.labels))
        if self.volume_name:
            self.session.client.volumes.create(self.volume_name,
                                               labels=self.session.volume_labels())
            made.with_volume_mapping(self.volume_name, "/data", "rw")
        made.start()
        return made.get_wrapped_container()

    def start(self, timeout: float = DEFAULT_START_TIMEOUT) -> None:
        if self.container is not None and self._created_argv != self.argv:
            self.container.remove(force=True)  # new ports (port retry): new container
            self.container = None
        if self.container is None:
            self._created_argv = list(self.argv)
            self.container = self._create_and_start()
        else:
            self.container.start()   # after a kill: the same container, the same volume
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
        shown: str = head_tail([f"--- container {self.container_name}: {' '.join(self.argv)}",
                                *text.splitlines()], head, tail)
        return shown

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
