"""integration/docker-compose.yml stays usable: its commands are the harness's own, and
they run.

The tests do not use compose (v2 is not installed here and no registry is reachable); the
harness starts the same servers with the same flags through the Docker SDK. This checks
that the file says what the harness does, then runs the file's own commands in containers
(its fixed default ports; skipped if another process holds one of them).
"""

from __future__ import annotations

import json
import re
import shlex
import socket
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from nsq_spark import testing
from nsq_spark.testing import cluster, wait_until

COMPOSE = Path(__file__).resolve().parents[2] / "integration" / "docker-compose.yml"
IMAGE_LINE = "${NSQ_IMAGE:-%s}" % testing.DEFAULT_IMAGE


def _services() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())["services"]


def _argv(service: dict[str, Any]) -> list[str]:
    command = service["command"]
    return shlex.split(command) if isinstance(command, str) else list(command)


def _flag(argv: list[str], name: str) -> list[str]:
    return [a.split("=", 1)[1] for a in argv if a.startswith(f"--{name}=")]


def _port(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


@pytest.mark.unit
def test_compose_file_runs_the_harness_topology_with_the_harness_flags():
    services = _services()
    assert set(services) == {"nsqlookupd", "nsqd0", "nsqd1", "nsqadmin"}
    for name, service in services.items():
        assert service["image"] == IMAGE_LINE, name
        assert service["network_mode"] == "host", name  # same addresses as local mode
    lookupd = _argv(services["nsqlookupd"])
    lk_tcp, lk_http = _flag(lookupd, "tcp-address")[0], _flag(lookupd, "http-address")[0]
    assert lookupd == ["/nsqlookupd", *cluster._lookupd_args(_port(lk_tcp), _port(lk_http), {})]
    for name in ("nsqd0", "nsqd1"):
        argv = _argv(services[name])
        ports = [_port(_flag(argv, f)[0]) for f in ("tcp-address", "http-address",
                                                    "https-address")]
        assert argv == ["/nsqd", *cluster._nsqd_args(*ports, "/data", [lk_tcp], {})], name
        assert services[name]["volumes"] == [f"{name}-data:/data"]
        assert services[name]["depends_on"] == {"nsqlookupd": {"condition": "service_healthy"}}
        assert f"http://127.0.0.1:{ports[1]}/ping" in services[name]["healthcheck"]["test"]
    assert f"http://{lk_http}/ping" in services["nsqlookupd"]["healthcheck"]["test"]
    admin = _argv(services["nsqadmin"])
    assert admin == ["/nsqadmin", *cluster._nsqadmin_args(
        _port(_flag(admin, "http-address")[0]), [lk_http], [])]
    declared = yaml.safe_load(COMPOSE.read_text())["volumes"]
    assert set(declared) == {"nsqd0-data", "nsqd1-data"}


def _port_taken(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def test_compose_file_commands_run_and_register():
    """Each service's command, in a container of the harness's image, answers /ping; both
    nsqd register with the lookupd and nsqadmin sees them: what `compose up` would give."""
    services = _services()
    argvs = {name: _argv(service) for name, service in services.items()}
    ports = sorted({int(p) for argv in argvs.values() for a in argv
                    for p in re.findall(r"^--(?:tcp|http|https)-address=127\.0\.0\.1:(\d+)$", a)})
    taken = [p for p in ports if _port_taken(p)]
    if taken:
        pytest.skip(f"ports {taken} of integration/docker-compose.yml are in use on this host")
    session = testing.DockerSession()
    try:
        order = ["nsqlookupd", "nsqd0", "nsqd1", "nsqadmin"]  # the file's depends_on order
        for name in order:
            http = _flag(argvs[name], "http-address")[0]
            server = testing.ContainerProcess(name, session, argvs[name],
                                              f"http://{http}/ping",
                                              data_volume=name.startswith("nsqd"))
            server.start(timeout=15)
        lk_http = _flag(argvs["nsqlookupd"], "http-address")[0]
        nsqd_ports = {_port(_flag(argvs[n], "tcp-address")[0]) for n in ("nsqd0", "nsqd1")}

        def registered() -> set[int]:
            with urllib.request.urlopen(f"http://{lk_http}/nodes", timeout=2) as resp:
                return {p["tcp_port"] for p in json.loads(resp.read())["producers"]}

        wait_until(lambda: registered() == nsqd_ports, 10, "both nsqd registered with lookupd")
        admin_http = _flag(argvs["nsqadmin"], "http-address")[0]
        with urllib.request.urlopen(f"http://{admin_http}/api/nodes", timeout=5) as resp:
            assert {n["tcp_port"] for n in json.loads(resp.read())["nodes"]} == nsqd_ports
    finally:
        session.close()
