"""``python -m nsq_spark publish`` and ``tail`` as real processes against a real nsqd.
Published contents are read back with the real ``nsq_tail``; ``tail`` reads what nsqd's
HTTP ``/mpub`` published."""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import time
import urllib.request

import pytest

from nsq_spark.testing import find_binary, free_port

pytestmark = [pytest.mark.nsqd, pytest.mark.timeout(120)]

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_cli(*args: str, stdin: bytes | None = None, timeout: float = 60):
    return subprocess.run([sys.executable, "-m", "nsq_spark", *args], input=stdin,
                          capture_output=True, timeout=timeout, cwd=REPO)


def http_post(addr: str, path: str, body: bytes = b"") -> None:
    req = urllib.request.Request(f"http://{addr}{path}", data=body, method="POST")
    urllib.request.urlopen(req, timeout=5).read()


def make_channel(cluster, topic: str, channel: str) -> None:
    http_post(cluster.nsqd_http_addresses[0], f"/topic/create?topic={topic}")
    http_post(cluster.nsqd_http_addresses[0], f"/channel/create?topic={topic}&channel={channel}")


def nsq_tail(cluster, topic: str, channel: str, n: int) -> list[bytes]:
    out = subprocess.run(
        [find_binary("nsq_tail"), f"--nsqd-tcp-address={cluster.nsqd_tcp_addresses[0]}",
         f"--topic={topic}", f"--channel={channel}", f"-n={n}"],
        capture_output=True, timeout=30, check=True)
    return out.stdout.split(b"\n")[:-1]


def depth(cluster, topic: str, channel: str) -> int:
    for t in cluster.nsqds[0].stats(topic).get("topics", []):
        for c in t["channels"]:
            if c["channel_name"] == channel:
                return c["depth"] + c["in_flight_count"]
    return 0


@pytest.mark.nsq_cluster(lookupd=0)
def test_publish_files_and_stdin_with_progress(nsq_cluster, tmp_path):
    make_channel(nsq_cluster, "clipub", "c")
    f1, f2 = tmp_path / "a.txt", tmp_path / "b.txt"
    f1.write_bytes(b"".join(b"file-a-%04d\n" % i for i in range(1500)))
    f2.write_bytes(b"".join(b"file-b-%04d\r\n" % i for i in range(500)))   # CRLF, too
    r = run_cli("publish", "--topic", "clipub", "--nsqd-tcp-address",
                nsq_cluster.nsqd_tcp_addresses[0], "--batch-size", "300", str(f1), str(f2))
    assert r.returncode == 0, r.stderr.decode()
    err = r.stderr.decode()
    assert "100.0%" in err and "2,000 msgs" in err and "published 2,000 messages" in err
    r = run_cli("publish", "-topic", "clipub", "-nsqd-tcp-address",
                nsq_cluster.nsqd_tcp_addresses[0], "--quiet", stdin=b"stdin-1\nstdin-2\n")
    assert r.returncode == 0 and r.stderr == b""
    got = nsq_tail(nsq_cluster, "clipub", "c", 2002)
    # a \r before \n stays in the body, as to_nsq keeps it
    expected = [b"file-a-%04d" % i for i in range(1500)] + \
        [b"file-b-%04d\r" % i for i in range(500)] + [b"stdin-1", b"stdin-2"]
    assert sorted(got) == sorted(expected)


@pytest.mark.nsq_cluster(lookupd=0)
def test_publish_with_spool_survives_an_unreachable_nsqd(nsq_cluster, tmp_path):
    make_channel(nsq_cluster, "clispool", "c")
    spool = tmp_path / "spool"
    data = b"".join(b"spooled-%03d\n" % i for i in range(200))
    dead = f"127.0.0.1:{free_port()}"
    r = run_cli("publish", "--topic", "clispool", "--nsqd-tcp-address", dead,
                "--spool-dir", str(spool), "--flush-timeout", "0.5", stdin=data)
    assert r.returncode == 3, r.stderr.decode()
    assert "stay in the spool" in r.stderr.decode()
    # the next run, with nsqd reachable, sends the leftovers along with its own input
    r = run_cli("publish", "--topic", "clispool", "--nsqd-tcp-address",
                nsq_cluster.nsqd_tcp_addresses[0], "--spool-dir", str(spool),
                stdin=b"second-run\n")
    assert r.returncode == 0, r.stderr.decode()
    got = nsq_tail(nsq_cluster, "clispool", "c", 201)
    assert collections.Counter(got) == collections.Counter(
        [b"spooled-%03d" % i for i in range(200)] + [b"second-run"])
    assert not list(spool.glob("*.seg"))


@pytest.mark.nsq_cluster(lookupd=0)
def test_publish_reports_a_bad_spool_dir_and_unreachable_nsqd(nsq_cluster, tmp_path):
    f = tmp_path / "plainfile"
    f.write_text("x")
    r = run_cli("publish", "--topic", "t", "--nsqd-tcp-address",
                nsq_cluster.nsqd_tcp_addresses[0], "--spool-dir", str(f / "sub"),
                stdin=b"x\n")
    assert r.returncode == 1
    assert "spool directory" in r.stderr.decode() and "Traceback" not in r.stderr.decode()
    started = time.monotonic()
    r = run_cli("publish", "--topic", "t", "--nsqd-tcp-address",
                f"127.0.0.1:{free_port()}", "--retry-deadline", "2", stdin=b"x\n")
    assert r.returncode == 1 and "Traceback" not in r.stderr.decode()
    assert "error" in r.stderr.decode() and "is down" in r.stderr.decode()
    assert time.monotonic() - started < 15  # the default would retry for 30 s


@pytest.mark.nsq_cluster(lookupd=1)
def test_tail_prints_messages_like_nsq_tail(nsq_cluster):
    make_channel(nsq_cluster, "clitail", "tailch")
    bodies = [b"tail-%03d" % i for i in range(150)]
    http_post(nsq_cluster.nsqd_http_addresses[0], "/mpub?topic=clitail", b"\n".join(bodies))
    r = run_cli("tail", "--topic", "clitail", "--channel", "tailch", "--nsqd-tcp-address",
                nsq_cluster.nsqd_tcp_addresses[0], "-n", "100")
    assert r.returncode == 0, r.stderr.decode()
    first = r.stdout.split(b"\n")[:-1]
    assert len(first) == 100 and set(first) <= set(bodies)
    # the rest, through lookupd, with the topic printed
    r = run_cli("tail", "-topic", "clitail", "-channel", "tailch", "-lookupd-http-address",
                nsq_cluster.lookupd_http_addresses[0], "-print-topic", "-n", "50")
    assert r.returncode == 0, r.stderr.decode()
    rest = r.stdout.split(b"\n")[:-1]
    assert all(line.startswith(b"clitail | ") for line in rest)
    assert sorted(first + [line[len(b"clitail | "):] for line in rest]) == bodies
    assert depth(nsq_cluster, "clitail", "tailch") == 0


@pytest.mark.nsq_cluster(lookupd=0)
def test_publish_rate_limit(nsq_cluster):
    import time

    make_channel(nsq_cluster, "clirate", "c")
    data = b"".join(b"r-%03d\n" % i for i in range(60))
    t0 = time.monotonic()
    r = run_cli("publish", "--topic", "clirate", "--nsqd-tcp-address",
                nsq_cluster.nsqd_tcp_addresses[0], "--rate", "100", "--quiet", stdin=data)
    elapsed = time.monotonic() - t0
    assert r.returncode == 0, r.stderr.decode()
    assert elapsed >= 0.5          # 60 messages at 100/s: at least ~0.6 s (a lower bound)
    assert sorted(nsq_tail(nsq_cluster, "clirate", "c", 60)) == data.split(b"\n")[:-1]


@pytest.mark.nsq_cluster(lookupd=0)
def test_tail_idle_exit_on_an_empty_topic(nsq_cluster):
    make_channel(nsq_cluster, "cliempty", "c")
    r = run_cli("tail", "--topic", "cliempty", "--channel", "c", "--nsqd-tcp-address",
                nsq_cluster.nsqd_tcp_addresses[0], "--idle-exit", "0.5")
    assert r.returncode == 0 and r.stdout == b"", r.stderr.decode()


def test_nsq_spark_install_nsq_prints_the_directory_or_the_ways_out(tmp_path):
    nsqd = find_binary("nsqd")
    r = run_cli("install-nsq")
    assert r.returncode == 0, r.stderr.decode()
    directory = r.stdout.decode().splitlines()[-1]
    assert os.path.isfile(os.path.join(directory, "nsqd"))
    assert os.path.samefile(os.path.join(directory, "nsqd"), nsqd) or \
        os.path.basename(directory) == "bin"
    # nothing on PATH, an empty cache, no Go: exit 1 with the ways out
    env = {**os.environ, "PATH": str(tmp_path), "NSQ_BIN_DIR": str(tmp_path / "empty")}
    r = subprocess.run([sys.executable, "-m", "nsq_spark", "install-nsq"], env=env,
                       capture_output=True, timeout=60, cwd=REPO)
    err = r.stderr.decode()
    assert r.returncode == 1 and r.stdout == b"", err
    assert "no Go toolchain" in err and "NSQ_BIN_DIR" in err and str(tmp_path / "empty") in err


@pytest.mark.nsq_cluster(lookupd=0)
def test_publish_with_spool_to_a_dead_nsqd_says_nothing_was_acknowledged(nsq_cluster, tmp_path):
    make_channel(nsq_cluster, "clihonest", "c")
    spool = tmp_path / "spool"
    data = b"".join(b"m-%03d\n" % i for i in range(100))
    r = run_cli("publish", "--topic", "clihonest", "--nsqd-tcp-address",
                f"127.0.0.1:{free_port()}", "--spool-dir", str(spool),
                "--flush-timeout", "0.5", stdin=data)
    err = r.stderr.decode()
    assert r.returncode == 3, err
    assert "published" not in err
    assert "spooled 100 messages" in err and "nsqd acknowledged 0;" in err
    assert "NOT acknowledged" in err
    r = run_cli("publish", "--topic", "clihonest", "--nsqd-tcp-address",
                nsq_cluster.nsqd_tcp_addresses[0], "--spool-dir", str(spool), stdin=b"x\n")
    err = r.stderr.decode()
    assert r.returncode == 0, err
    assert "spooled 1 messages" in err and "acknowledged 101 (leftovers" in err
    assert "nothing left in the spool" in err
    assert depth(nsq_cluster, "clihonest", "c") == 101


def test_tail_that_never_connects_exits_1():
    dead = f"127.0.0.1:{free_port()}"
    r = run_cli("tail", "--topic", "t", "--nsqd-tcp-address", dead, "--idle-exit", "1")
    err = r.stderr.decode()
    assert r.returncode == 1, err
    assert f"never connected to nsqd {dead}" in err and "Traceback" not in err


@pytest.mark.nsq_cluster(lookupd=0)
def test_tail_says_which_channel_it_reads(nsq_cluster):
    addr = nsq_cluster.nsqd_tcp_addresses[0]
    make_channel(nsq_cluster, "clisays", "durable")
    r = run_cli("tail", "--topic", "clisays", "--nsqd-tcp-address", addr, "--idle-exit", "0.5")
    err = r.stderr.decode()
    assert r.returncode == 0, err
    assert "ephemeral channel" in err and "only messages published from now on" in err
    assert "--channel NAME" in err
    r = run_cli("tail", "--topic", "clisays", "--channel", "durable", "--nsqd-tcp-address",
                addr, "--idle-exit", "0.5")
    assert r.returncode == 0 and "its backlog" in r.stderr.decode(), r.stderr.decode()
    r = run_cli("tail", "--topic", "clisays", "--nsqd-tcp-address", addr, "--idle-exit", "0.5",
                "-q")
    assert r.returncode == 0 and r.stderr == b""


@pytest.mark.nsq_cluster(lookupd=0)
def test_tail_reads_the_backlog_of_a_named_channel_published_before_it_started(nsq_cluster):
    # the topic already has a channel: a new ephemeral one would see nothing of this
    make_channel(nsq_cluster, "clibacklog", "archive")
    bodies = [b"old-%02d" % i for i in range(10)]
    r = run_cli("publish", "--topic", "clibacklog", "--nsqd-tcp-address",
                nsq_cluster.nsqd_tcp_addresses[0], "-q", stdin=b"\n".join(bodies) + b"\n")
    assert r.returncode == 0, r.stderr.decode()
    r = run_cli("tail", "--topic", "clibacklog", "--nsqd-tcp-address",
                nsq_cluster.nsqd_tcp_addresses[0], "-n", "10", "--idle-exit", "1")
    assert r.returncode == 0 and r.stdout == b"", r.stderr.decode()
    r = run_cli("tail", "--topic", "clibacklog", "--channel", "archive", "--nsqd-tcp-address",
                nsq_cluster.nsqd_tcp_addresses[0], "-n", "10")
    assert r.returncode == 0, r.stderr.decode()
    assert sorted(r.stdout.split(b"\n")[:-1]) == bodies


@pytest.mark.nsq_cluster(lookupd=1)
def test_tail_through_lookupd_of_a_topic_no_nsqd_has_exits_1(nsq_cluster):
    r = run_cli("tail", "--topic", "clinowhere", "--lookupd-http-address",
                nsq_cluster.lookupd_http_addresses[0], "--idle-exit", "1")
    err = r.stderr.decode()
    assert r.returncode == 1, err
    assert "never connected to any nsqd for topic clinowhere through lookupd" in err
