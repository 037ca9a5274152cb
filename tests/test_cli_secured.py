"""``nsq-spark publish`` and ``tail`` against a real nsqd that offers TLS and requires
AUTH (a small HTTP auth server beside it). The secret reaches nsqd and nowhere else: not
the command line, not stdout/stderr, even at debug log level."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Iterator

import pytest

from conn_tls_helpers import Certs, auth_server, make_certs
from nsq_spark.testing import NSQCluster

pytestmark = [pytest.mark.nsqd, pytest.mark.timeout(120)]

SECRET = "cli-secret-7f3a9c"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# everything on every topic and channel, for this secret only
GRANTS = {SECRET: {"ttl": 60, "identity": "cli", "authorizations": [
    {"topic": ".*", "channels": [".*"], "permissions": ["subscribe", "publish"]}]}}


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def secured_nsqd(certs: Certs) -> Iterator[NSQCluster]:
    with auth_server(GRANTS) as auth, \
            NSQCluster(nsqd=1, lookupd=0, tls_cert=str(certs.server_cert),
                       tls_key=str(certs.server_key), tls_required="tcp-https",
                       auth_http_address=auth.address) as cluster:
        yield cluster


def run_cli(*args: str, stdin: bytes | None = None, env: dict[str, str] | None = None):
    return subprocess.run([sys.executable, "-m", "nsq_spark", *args], input=stdin,
                          capture_output=True, timeout=60, cwd=REPO,
                          env={**os.environ, **(env or {})})


def test_publish_and_tail_over_tls_with_auth(secured_nsqd, certs, tmp_path):
    addr = secured_nsqd.nsqd_tcp_addresses[0]
    secret_file = tmp_path / "secret"
    secret_file.write_text(SECRET + "\n")
    tls = ["--tls", "--tls-ca-file", str(certs.ca)]
    bodies = [b"secure-%02d" % i for i in range(20)]
    r = run_cli("publish", "--topic", "clisecure", "--nsqd-tcp-address", addr, *tls,
                "--auth-secret-file", str(secret_file), "--log-level", "debug",
                stdin=b"\n".join(bodies) + b"\n")
    assert r.returncode == 0, r.stderr.decode()
    assert SECRET.encode() not in r.stdout + r.stderr
    r = run_cli("tail", "--topic", "clisecure", "--channel", "c", "--nsqd-tcp-address",
                addr, *tls, "-n", "20", "--log-level", "debug",
                env={"NSQ_AUTH_SECRET": SECRET})
    assert r.returncode == 0, r.stderr.decode()
    assert sorted(r.stdout.split(b"\n")[:-1]) == bodies
    assert SECRET.encode() not in r.stderr


def test_refusals_are_errors_that_do_not_echo_the_secret(secured_nsqd, certs, tmp_path):
    addr = secured_nsqd.nsqd_tcp_addresses[0]
    wrong = "wrong-secret-5d1e"
    r = run_cli("publish", "--topic", "clisecure", "--nsqd-tcp-address", addr, "--tls",
                "--tls-ca-file", str(certs.ca), "--log-level", "debug", stdin=b"x\n",
                env={"NSQ_AUTH_SECRET": wrong})
    err = r.stderr.decode()
    assert r.returncode == 1, err
    assert "error" in err and "Traceback" not in err and wrong not in err
    # no secret at all: nsqd requires one, and the error says how to give it
    env = {k: v for k, v in os.environ.items() if k != "NSQ_AUTH_SECRET"}
    r = subprocess.run([sys.executable, "-m", "nsq_spark", "publish", "--topic", "clisecure",
                        "--nsqd-tcp-address", addr, "--tls", "--tls-ca-file", str(certs.ca)],
                       input=b"x\n", capture_output=True, timeout=60, cwd=REPO, env=env)
    assert r.returncode == 1 and "auth" in r.stderr.decode().lower(), r.stderr.decode()
    # nsqd requires TLS: without --tls it refuses
    r = run_cli("publish", "--topic", "clisecure", "--nsqd-tcp-address", addr, stdin=b"x\n",
                env={"NSQ_AUTH_SECRET": SECRET})
    assert r.returncode == 1 and "Traceback" not in r.stderr.decode(), r.stderr.decode()
    # TLS verified against a CA that signed nothing here: refused
    r = run_cli("publish", "--topic", "clisecure", "--nsqd-tcp-address", addr,
                "--tls-ca-file", str(certs.other_ca), stdin=b"x\n",
                env={"NSQ_AUTH_SECRET": SECRET})
    assert r.returncode == 1 and "Traceback" not in r.stderr.decode(), r.stderr.decode()
