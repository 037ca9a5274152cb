"""The test harness itself: real nsqd/nsqlookupd processes, controls, cleanup."""

from __future__ import annotations

import importlib.machinery
import os
import threading
import types
import urllib.request
from pathlib import Path

import pytest

from nsq_spark.testing import HarnessError, NSQCluster, find_binary, publish, wait_until

pytestmark = pytest.mark.nsqd


def _depth(cluster: NSQCluster, i: int, topic: str) -> int:
    topics = cluster.nsqds[i].stats(topic)["topics"]
    return sum(t["depth"] for t in topics if t["topic_name"] == topic)


def _pyspark_versions_script() -> types.ModuleType:
    """scripts/install-pyspark-versions as a module, loaded (not run) in this process."""
    path = Path(__file__).resolve().parent.parent / "scripts" / "install-pyspark-versions"
    loader = importlib.machinery.SourceFileLoader("install_pyspark_versions", str(path))
    module = types.ModuleType(loader.name)
    module.__file__ = str(path)
    loader.exec_module(module)
    return module


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_two_by_two_cluster_registers_everywhere_and_is_reaped() -> None:
    with NSQCluster(nsqd=2, lookupd=2) as cluster:
        assert len(cluster.nsqd_tcp_addresses) == 2
        assert len(set(cluster.nsqd_tcp_addresses)) == 2
        expected = {n.tcp_port for n in cluster.nsqds}
        for lk in cluster.lookupds:
            assert {p["tcp_port"] for p in lk.nodes()} == expected
        pids = [n.pid for n in [*cluster.nsqds, *cluster.lookupds]]
        assert all(pid and _alive(pid) for pid in pids)
        workdir = cluster.workdir
    assert not any(_alive(pid) for pid in pids if pid)
    assert workdir is not None and not workdir.exists()


def test_kill_and_restart_keep_disk_queued_messages() -> None:
    with NSQCluster(nsqd=1, lookupd=1, mem_queue_size=0, sync_every=1) as cluster:
        http = cluster.nsqd_http_addresses[0]
        tcp_before = cluster.nsqd_tcp_addresses[0]
        for i in range(25):
            publish(http, "harness", b"m%d" % i)
        assert _depth(cluster, 0, "harness") == 25
        cluster.kill(0)
        assert not cluster.nsqds[0].running
        cluster.restart(0)
        assert cluster.nsqd_tcp_addresses[0] == tcp_before
        assert _depth(cluster, 0, "harness") == 25


def test_stop_and_resume() -> None:
    with NSQCluster(nsqd=1, lookupd=0) as cluster:
        cluster.stop(0)
        with pytest.raises(OSError):
            urllib.request.urlopen(f"http://{cluster.nsqd_http_addresses[0]}/ping", timeout=0.5)
        cluster.resume(0)
        with urllib.request.urlopen(f"http://{cluster.nsqd_http_addresses[0]}/ping", timeout=5) as r:
            assert r.read() == b"OK"


def test_nsqd_added_later_registers() -> None:
    with NSQCluster(nsqd=1, lookupd=1) as cluster:
        i = cluster.add_nsqd()
        assert i == 1
        ports = {p["tcp_port"] for p in cluster.lookupds[0].nodes()}
        assert ports == {cluster.nsqds[0].tcp_port, cluster.nsqds[1].tcp_port}


def test_bad_flag_reports_nsqd_output() -> None:
    with pytest.raises(HarnessError) as err:
        with NSQCluster(nsqd=1, lookupd=0, no_such_flag=1):
            pass
    assert "exited at start" in str(err.value)
    assert "no-such-flag" in str(err.value)


def test_missing_binary_names_the_fix() -> None:
    with pytest.raises(HarnessError, match="install"):
        find_binary("definitely-not-a-binary-xyz")


def test_fixture_gives_running_cluster(nsq_cluster: NSQCluster) -> None:
    with urllib.request.urlopen(f"http://{nsq_cluster.nsqd_http_addresses[0]}/ping", timeout=5) as r:
        assert r.read() == b"OK"


@pytest.mark.dedup
def test_redis_and_memcached_fixtures(redis_server, memcached_server) -> None:  # type: ignore[no-untyped-def]
    import socket

    with socket.create_connection(("127.0.0.1", redis_server.port), timeout=2) as s:
        s.sendall(b"PING\r\n")
        assert s.recv(16) == b"+PONG\r\n"
    with socket.create_connection(memcached_server.address, timeout=2) as s:
        s.sendall(b"version\r\n")
        assert s.recv(64).startswith(b"VERSION")


def test_local_nsqadmin_sees_the_nsqd_through_lookupd() -> None:
    import json

    with NSQCluster(nsqd=1, lookupd=1, nsqadmin=True) as cluster:
        admin = cluster.nsqadmin_http_address
        assert admin is not None
        with urllib.request.urlopen(f"http://{admin}/api/nodes", timeout=5) as r:
            nodes = json.loads(r.read())["nodes"]
        assert [n["tcp_port"] for n in nodes] == [cluster.nsqds[0].tcp_port]
        pid = cluster.nsqadmin.pid if cluster.nsqadmin else None
    assert pid and not _alive(pid)


@pytest.mark.unit
def test_image_without_docker_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="mode='docker'"):
        NSQCluster(image="nsqio/nsq:v1.3.0")


@pytest.mark.unit
def test_static_binaries_are_told_from_dynamic_ones() -> None:
    """The FROM scratch image needs static binaries; install-nsq builds them so."""
    import shutil
    import sys

    from nsq_spark.testing.docker import _elf_is_dynamic

    assert not _elf_is_dynamic(find_binary("nsqd"))
    assert _elf_is_dynamic(sys.executable) or _elf_is_dynamic(str(shutil.which("ls")))
    assert not _elf_is_dynamic(__file__)  # not ELF: not judged


def test_docker_mode_without_an_engine_says_how_to_get_one(monkeypatch: pytest.MonkeyPatch,
                                                           tmp_path) -> None:  # type: ignore[no-untyped-def]
    from nsq_spark.testing import docker_engine_problem

    pytest.importorskip("testcontainers")
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    problem = docker_engine_problem()
    assert problem is not None
    assert "no-engine.sock" in problem and "scripts/with-docker" in problem
    with pytest.raises(HarnessError, match="no Docker engine reachable"):
        NSQCluster(mode="docker").start()


# -- the helpers for test bodies: publish, wait_until, wait_drained, running_reader -------------


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_publish_sends_one_body_or_many_with_newlines_in_them(nsq_cluster):
    node = nsq_cluster.nsqds[0]
    node.publish("h", b"one")
    nsq_cluster.publish("h", [b"two\nlines", b"three"])
    publish(node.http_address, "h", [b"x"] * 7, chunk=3)  # three MPUBs
    assert _depth(nsq_cluster, 0, "h") == 10


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_publish_refused_by_nsqd_names_the_answer_and_the_topic(nsq_cluster):
    with pytest.raises(HarnessError, match=r"refused POST /pub to topic 'bad topic!'.*INVALID_TOPIC"):
        nsq_cluster.publish("bad topic!", b"x")
    with pytest.raises(HarnessError, match="is it running, and is this its HTTP"):
        publish(nsq_cluster.nsqd_tcp_addresses[0].replace(
            str(nsq_cluster.nsqds[0].tcp_port), "1"), "t", b"x")


@pytest.mark.unit
def test_wait_until_returns_the_first_true_value_or_names_what_it_waited_for():
    values = iter([0, None, [], "done"])
    assert wait_until(lambda: next(values), 5, interval=0) == "done"
    with pytest.raises(AssertionError, match=r"after 0.05s waiting for the sky to fall"):
        wait_until(lambda: False, 0.05, "the sky to fall", interval=0.01)


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_running_reader_handles_on_its_own_loop_and_stop_answers_everything(
        nsq_cluster, running_reader):
    import threading

    nsq_cluster.publish("rr", [b"a", b"b", b"c"])
    threads, got = set(), []

    def handler(m):
        threads.add(threading.get_ident())
        got.append(m.body)
        return True

    r = running_reader.start("rr", "c", handler, max_in_flight=5,
                             nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses)
    wait_until(lambda: r.finished == 3, 10, "3 finished")
    assert threading.get_ident() not in threads and len(threads) == 1
    running_reader.stop(r)
    assert r.closed and sorted(got) == [b"a", b"b", b"c"]
    nsq_cluster.wait_drained("rr", "c")


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_wait_drained_reports_what_nsqd_still_holds(nsq_cluster, running_reader):
    r = running_reader.start("wd", "c", lambda m: m.enable_async(), max_in_flight=5,
                             drain_timeout=0, nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses)
    nsq_cluster.publish("wd", [b"held"])
    wait_until(lambda: r.messages_received == 1, 10, "the message in flight")
    with pytest.raises(AssertionError, match=r"wd/c not drained after 0.2s: .*in_flight_count"):
        nsq_cluster.wait_drained("wd", "c", timeout=0.2)
    # the fixture closes the Reader after the test: the held message goes back to nsqd


@pytest.mark.unit
def test_closing_the_runner_stops_every_reader_when_one_fails_to_stop() -> None:
    from nsq_spark.testing import ReaderRunner

    class ReaderClosingOnTopic:
        """Stands in for a Reader: built on the loop thread, closed there by ``aclose``."""

        def __init__(self, topic: str, channel: str, handler: object) -> None:
            self.topic, self.closed = topic, False

        async def aclose(self) -> None:
            self.closed = True
            if self.topic.startswith("bad"):
                raise RuntimeError(f"{self.topic} refuses to close")

    runner = ReaderRunner()
    readers = [runner.start(topic, "c", reader_class=ReaderClosingOnTopic)
               for topic in ("first", "bad1", "middle", "bad2", "last")]
    loop_threads = {t for t in threading.enumerate() if t.name.startswith("test-reader-")}
    assert len(loop_threads) == 5
    with pytest.raises(RuntimeError, match="bad1 refuses to close") as raised:
        runner.close()
    assert raised.value.__notes__ == [
        "stopping another reader failed too: RuntimeError('bad2 refuses to close')"]
    assert [r.closed for r in readers] == [True] * 5
    assert not any(t.is_alive() for t in loop_threads)
    runner.close()  # nothing left to stop


# -- the facts the harness, the installer and the chaos tier share ---------------------------


@pytest.mark.unit
def test_the_harness_and_both_installers_follow_one_cache_rule(monkeypatch, tmp_path):
    from nsq_spark.testing.processes import _default_nsq_bin_dirs
    from nsq_spark.testing._binaries import NSQ_VERSION, TOXIPROXY_VERSION, cache_root
    from nsq_spark.testing.chaos import cache_binary
    from nsq_spark.testing.install import default_bin_dir

    monkeypatch.delenv("NSQ_BIN_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_root() == tmp_path / "nsq-spark"
    nsq_cache = tmp_path / "nsq-spark" / f"nsq-v{NSQ_VERSION}" / "bin"
    assert default_bin_dir() == nsq_cache and _default_nsq_bin_dirs() == [nsq_cache]
    assert cache_binary().parent == tmp_path / "nsq-spark" / f"toxiproxy-v{TOXIPROXY_VERSION}" / "bin"
    # the version tier's venvs (scripts/install-pyspark-versions) live under the same root
    # (one directory per requirement list: <name>-<digest>, nsq_spark/testing/_venvs.py)
    built = _pyspark_versions_script().venv_dir("9.9.9")
    assert built.parent == tmp_path / "nsq-spark" and built.name.startswith("pyspark-9.9.9-")
    # NSQ_BIN_DIR: where install-nsq builds, and where the harness looks first
    monkeypatch.setenv("NSQ_BIN_DIR", str(tmp_path / "mine"))
    assert default_bin_dir() == tmp_path / "mine"
    assert _default_nsq_bin_dirs() == [tmp_path / "mine", nsq_cache]


@pytest.mark.unit
def test_free_port_never_hands_out_a_port_twice_even_when_the_kernel_repeats(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The kernel may give two binds in a row the same port once the first socket is closed
    # (CI saw nsqlookupd's TCP and HTTP listeners given one port); free_port must skip it.
    import nsq_spark.testing.processes as harness

    kernel_ports = iter([41001, 41001, 41001, 41002])

    class RepeatingSocket:
        def __init__(self, *args: object) -> None:
            self.port = next(kernel_ports)

        def __enter__(self) -> "RepeatingSocket":
            return self

        def __exit__(self, *exc: object) -> None:
            return None

        def bind(self, address: object) -> None:
            return None

        def getsockname(self) -> tuple[str, int]:
            return ("127.0.0.1", self.port)

    monkeypatch.setattr(harness, "_RECENT_PORTS", harness.collections.deque(maxlen=8))
    monkeypatch.setattr(harness.socket, "socket", RepeatingSocket)
    assert [harness.free_port(), harness.free_port()] == [41001, 41002]


@pytest.mark.unit
def test_the_names_of_nsq_spark_testing_stay_importable_after_the_split() -> None:
    """0.1.0's one module is rooms now (processes, cluster, services, docker, readers,
    plugin): what users' tests and the pytest11 entry point import from
    ``nsq_spark.testing`` is still there, the same objects as in the rooms."""
    import nsq_spark.errors
    import nsq_spark.testing as harness
    from nsq_spark.testing import cluster, docker, plugin, processes, readers, services

    names = {
        cluster: ["NSQCluster", "NsqdNode", "LookupdNode", "NsqadminNode", "NsqdContainer",
                  "LookupdContainer", "NsqadminContainer", "publish"],
        processes: ["ServerProcess", "HarnessError", "DEFAULT_START_TIMEOUT", "find_binary",
                    "free_port", "wait_until"],
        services: ["RedisServer", "MemcachedServer"],
        readers: ["ReaderRunner"],
        docker: ["DEFAULT_IMAGE", "LOCAL_IMAGE", "DOCKER_LABEL", "ContainerProcess",
                 "DockerSession", "docker_client", "docker_engine_problem",
                 "docker_leftovers", "ensure_image"],
        plugin: ["nsq_cluster", "docker_nsq_cluster", "running_reader", "redis_server",
                 "memcached_server", "pytest_configure", "pytest_runtest_makereport"],
    }
    for room, listed in names.items():
        for name in listed:
            assert getattr(harness, name) is getattr(room, name), name
    assert harness.NSQ_VERSION == "1.3.0"
    assert issubclass(harness.HarnessError, nsq_spark.errors.NSQError)
    assert issubclass(harness.HarnessError, RuntimeError)   # as in 0.1.0
