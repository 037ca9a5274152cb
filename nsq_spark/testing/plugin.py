"""The pytest plugin: fixtures for a real NSQ cluster (``nsq_cluster``, in containers
``docker_nsq_cluster``), Readers on their own loop threads (``running_reader``) and the
dedup backends (``redis_server``, ``memcached_server``); the processes' logs are printed
after a failed test. Registered through the ``pytest11`` entry point as
``nsq_spark.testing``, which re-exports these hooks and fixtures (so
``pytest_plugins = ["nsq_spark.testing"]`` works too)."""

from __future__ import annotations

from typing import Any, Generator, Iterator

import pytest

from .cluster import NSQCluster
from .docker import docker_engine_problem
from .readers import ReaderRunner
from .services import MemcachedServer, RedisServer

__all__ = ["pytest_runtest_makereport", "pytest_configure", "nsq_cluster",
           "docker_nsq_cluster", "running_reader", "redis_server", "memcached_server"]


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
