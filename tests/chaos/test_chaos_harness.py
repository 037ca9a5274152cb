"""The chaos harness itself (nsq_spark.testing.chaos): where the binary is found, what a
missing one says, the fixtures' skip-or-fail rule, and the client against a real
toxiproxy-server (proxying, toxics, API errors, the bounded fault schedule)."""

from __future__ import annotations

import io
import os
import socket
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from nsq_spark.errors import ConfigError, InvalidAddressError
from nsq_spark.testing.install import InstallError
from nsq_spark.testing.chaos import (BINARY_NAME, TOXIPROXY_VERSION, Toxiproxy,
                                     ToxiproxyError, cache_binary, ensure_toxiproxy,
                                     find_toxiproxy, inject_periodically, main)

REPO = Path(__file__).resolve().parents[2]


# -- finding and installing the binary (no sockets) ---------------------------------------


@pytest.mark.unit
def test_the_cache_is_per_user_and_per_version(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_binary() == (tmp_path / "nsq-spark" / f"toxiproxy-v{TOXIPROXY_VERSION}"
                              / "bin" / BINARY_NAME)


@pytest.mark.unit
def test_a_bad_api_address_is_a_typed_error_naming_the_parameter():
    with pytest.raises(InvalidAddressError, match="api_address"):
        Toxiproxy("127.0.0.1")


@pytest.mark.unit
@pytest.mark.parametrize("bad", [{"count": 0}, {"every": -1}, {"hold": -0.5},
                                 {"start_after": -1}])
def test_a_fault_schedule_must_be_bounded(bad):
    schedule = {"every": 0.1, "hold": 0.1, "count": 3, **bad}
    param = next(iter(bad))
    with pytest.raises(ConfigError, match=f"inject_periodically {param}="):
        with inject_periodically(None, "latency", **schedule):  # type: ignore[arg-type]
            pass


@pytest.mark.unit
def test_toxiproxy_bin_is_taken_as_it_is_when_executable(monkeypatch, tmp_path):
    binary = tmp_path / "my-toxiproxy"
    binary.write_text("#!/bin/sh\n")
    monkeypatch.setenv("TOXIPROXY_BIN", str(binary))
    assert find_toxiproxy() is None  # not executable
    binary.chmod(0o755)
    assert find_toxiproxy() == binary


@pytest.mark.unit
def test_a_cached_binary_of_another_version_is_not_used(monkeypatch, tmp_path):
    monkeypatch.delenv("TOXIPROXY_BIN", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    fake = cache_binary()
    fake.parent.mkdir(parents=True)
    fake.write_text("#!/bin/sh\necho 'toxiproxy-server version git'\n")
    fake.chmod(0o755)
    assert find_toxiproxy() is None


@pytest.mark.unit
def test_a_wrong_toxiproxy_bin_is_an_error_that_names_it(monkeypatch, tmp_path):
    monkeypatch.setenv("TOXIPROXY_BIN", str(tmp_path / "absent"))
    with pytest.raises(InstallError, match="TOXIPROXY_BIN=.*absent.*not an executable"):
        ensure_toxiproxy(stderr=io.StringIO())


@pytest.mark.unit
def test_without_go_the_error_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.delenv("TOXIPROXY_BIN", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path))  # no `go` here
    err = io.StringIO()
    out = io.StringIO()
    assert main([], stdout=out, stderr=err) == 1
    assert out.getvalue() == ""
    assert "no Go toolchain (`go`)" in err.getvalue()
    assert "Install Go" in err.getvalue() and "TOXIPROXY_BIN" in err.getvalue()
    assert not cache_binary().exists()


@pytest.mark.chaos
def test_the_install_script_prints_the_binary_path_last(tmp_path):
    binary = tmp_path / "toxiproxy-server"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    proc = subprocess.run([str(REPO / "scripts" / "install-toxiproxy")], capture_output=True,
                          text=True, timeout=60,
                          env={**os.environ, "TOXIPROXY_BIN": str(binary),
                               "PYTHON": sys.executable})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == str(binary)


# -- the fixtures' rule: skip with the install command, fail under CI ---------------------

USES_FIXTURE = '''
def test_needs_toxiproxy(toxiproxy):
    assert toxiproxy.version()
'''


def _run_pytest_without_binary(tmp_path: Path, ci: bool) -> subprocess.CompletedProcess[str]:
    (tmp_path / "conftest.py").write_text(
        "from nsq_spark.testing.chaos import toxiproxy, toxiproxy_server  # noqa: F401\n")
    (tmp_path / "test_uses_it.py").write_text(textwrap.dedent(USES_FIXTURE))
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["TOXIPROXY_BIN"] = str(tmp_path / "no-such-binary")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    if ci:
        env["CI"] = "true"
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                           "-p", "no:xdist", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)


@pytest.mark.chaos
def test_without_the_binary_the_fixture_skips_with_the_install_command(tmp_path):
    proc = _run_pytest_without_binary(tmp_path, ci=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 skipped" in proc.stdout
    assert "scripts/install-toxiproxy" in proc.stdout


@pytest.mark.chaos
def test_without_the_binary_under_ci_the_fixture_fails(tmp_path):
    proc = _run_pytest_without_binary(tmp_path, ci=True)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "1 error" in proc.stdout
    assert "scripts/install-toxiproxy" in proc.stdout


# -- the client against a real toxiproxy-server ------------------------------------------


def _ping(address: str, timeout: float = 2.0) -> bytes:
    with urllib.request.urlopen(f"http://{address}/ping", timeout=timeout) as resp:
        return resp.read()


@pytest.mark.chaos
@pytest.mark.nsqd
def test_a_proxy_on_a_free_port_carries_traffic_until_disabled(nsq_cluster, toxiproxy):
    proxy = toxiproxy.create_proxy("nsqd_http", upstream=nsq_cluster.nsqd_http_addresses[0])
    host, _, port = proxy.listen.rpartition(":")
    assert host == "127.0.0.1" and int(port) > 0
    assert toxiproxy.version() == TOXIPROXY_VERSION
    assert _ping(proxy.listen) == b"OK"
    proxy.set_enabled(False)
    with pytest.raises(OSError):
        socket.create_connection((host, int(port)), timeout=1).close()
    proxy.set_enabled(True)
    assert _ping(proxy.listen) == b"OK"


@pytest.mark.chaos
@pytest.mark.nsqd
def test_a_toxic_acts_while_in_place_and_is_gone_when_removed(nsq_cluster, toxiproxy):
    proxy = toxiproxy.create_proxy("nsqd_http", upstream=nsq_cluster.nsqd_http_addresses[0])
    with proxy.toxic("timeout", "downstream", timeout=0) as name:
        assert [t["name"] for t in proxy.toxics()] == [name]
        with pytest.raises((urllib.error.URLError, TimeoutError, OSError)):
            _ping(proxy.listen, timeout=0.5)
    assert proxy.toxics() == []
    assert _ping(proxy.listen) == b"OK"


@pytest.mark.chaos
def test_api_errors_are_typed_and_carry_the_servers_reason(toxiproxy):
    proxy = toxiproxy.create_proxy("nowhere", upstream="127.0.0.1:1")
    with pytest.raises(ToxiproxyError, match="toxic type 'resett' is not one of"):
        proxy.add_toxic("resett")
    with pytest.raises(ToxiproxyError, match="stream 'sideways'"):
        proxy.add_toxic("latency", "sideways", latency=1)
    with pytest.raises(ToxiproxyError, match="HTTP 404"):
        proxy.remove_toxic("never_added")
    proxy.delete()
    with pytest.raises(ToxiproxyError, match="HTTP 404"):
        proxy.add_toxic("latency", latency=1)


@pytest.mark.chaos
def test_the_fault_schedule_is_bounded_and_cleans_up(toxiproxy):
    proxy = toxiproxy.create_proxy("nowhere", upstream="127.0.0.1:1")
    started = time.monotonic()
    with inject_periodically(proxy, "latency", every=0.01, hold=0.01, count=3,
                             streams=("downstream", "upstream"), latency=5) as faults:
        time.sleep(1.0)
    assert faults.injected == 3
    assert proxy.toxics() == []
    # leaving the block early stops the schedule and removes the toxic in place
    with inject_periodically(proxy, "latency", every=0, hold=30, count=100,
                             latency=5) as faults:
        time.sleep(0.3)
        assert len(proxy.toxics()) == 1
    assert faults.injected == 1
    assert proxy.toxics() == []
    assert time.monotonic() - started < 5
