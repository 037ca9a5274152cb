"""Real NSQ processes for tests: the project's own, and yours.

The test harness is one package, one room per job; every public name is importable from
here (``from nsq_spark.testing import NSQCluster``), and this package is the pytest
plugin (the ``pytest11`` entry point registers ``nsq_spark.testing``):

* :mod:`~nsq_spark.testing.processes`: a server process (start, readiness, kill, freeze,
  log, reaped whatever happens), free ports, binaries, :func:`wait_until`;
* :mod:`~nsq_spark.testing.cluster`: :class:`NSQCluster` (nsqd, nsqlookupd, nsqadmin) and
  :func:`publish` straight to nsqd;
* :mod:`~nsq_spark.testing.services`: ``redis-server`` and ``memcached``;
* :mod:`~nsq_spark.testing.docker`: the same servers in containers (testcontainers);
* :mod:`~nsq_spark.testing.readers`: :class:`ReaderRunner`, Readers on loop threads;
* :mod:`~nsq_spark.testing.plugin`: the fixtures and hooks (re-exported here);
* :mod:`~nsq_spark.testing.chaos` (Toxiproxy fault injection),
  :mod:`~nsq_spark.testing.install` (``nsq-spark install-nsq``) and
  :mod:`~nsq_spark.testing._binaries` (the facts they share: versions, the per-user cache
  rule, building with Go).

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
on testcontainers (``pip install 'nsq-spark[docker]'``; why: :mod:`.docker`): the official image
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

from ._binaries import NSQ_VERSION, cache_bin_dir, nsq_bin_dir
from .cluster import (AnyLookupd, AnyNsqd, LookupdContainer, LookupdNode, NSQCluster,
                      NsqadminContainer, NsqadminNode, NsqdContainer, NsqdNode, publish)
from .docker import (DEFAULT_IMAGE, DOCKER_LABEL, LOCAL_IMAGE, ContainerProcess,
                     DockerSession, docker_client, docker_engine_problem, docker_leftovers,
                     ensure_image)
from .processes import (DEFAULT_START_TIMEOUT, HarnessError, ServerProcess, find_binary,
                        free_port, wait_until)
from .readers import ReaderRunner
from .services import MemcachedServer, RedisServer

__all__ = [
    "NSQCluster", "NsqdNode", "LookupdNode", "NsqadminNode", "NsqdContainer",
    "LookupdContainer", "NsqadminContainer", "AnyNsqd", "AnyLookupd", "publish",
    "ServerProcess", "HarnessError", "DEFAULT_START_TIMEOUT", "find_binary", "free_port",
    "wait_until", "RedisServer", "MemcachedServer", "ReaderRunner", "DEFAULT_IMAGE",
    "LOCAL_IMAGE", "DOCKER_LABEL", "ContainerProcess", "DockerSession", "docker_client",
    "docker_engine_problem", "docker_leftovers", "ensure_image", "NSQ_VERSION",
    "cache_bin_dir", "nsq_bin_dir",
]

try:
    import pytest as _pytest  # noqa: F401  (the harness works without pytest)
except ImportError:  # pragma: no cover - depends on the install
    pass
else:
    # the entry point registers this package: its hooks and fixtures are the plugin's
    from .plugin import (docker_nsq_cluster, memcached_server, nsq_cluster,  # noqa: F401
                         pytest_configure, pytest_runtest_makereport, redis_server,
                         running_reader)
