"""Test certificates made with the openssl CLI: a CA, a server certificate for 127.0.0.1
(SAN IP), and a client certificate; and a small HTTP auth server of the kind nsqd's
``--auth-http-address`` names. No tests here."""

from __future__ import annotations

import http.server
import json
import shutil
import subprocess
import threading
import urllib.parse
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Certs:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path  # a CA that signed nothing here: verification against it must fail


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_certs(d: Path) -> Certs:
    if shutil.which("openssl") is None:
        raise RuntimeError("the TLS tests need the openssl CLI (apt-get install -y openssl)")
    d.mkdir(parents=True, exist_ok=True)
    for ca in ("ca", "other-ca"):
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                 "-keyout", f"{ca}.key", "-out", f"{ca}.pem", "-subj", f"/CN=nsq-spark test {ca}",
                 "-addext", "basicConstraints=critical,CA:TRUE",
                 "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d)
    (d / "server.ext").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n"
        "basicConstraints=CA:FALSE\n")
    (d / "client.ext").write_text("extendedKeyUsage=clientAuth\nbasicConstraints=CA:FALSE\n")
    for name in ("server", "client"):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key",
                 "-out", f"{name}.csr", "-subj", f"/CN=nsq-spark test {name}", cwd=d)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                 "-CAcreateserial", "-days", "2", "-out", f"{name}.pem",
                 "-extfile", f"{name}.ext", cwd=d)
    return Certs(ca=d / "ca.pem", server_cert=d / "server.pem", server_key=d / "server.key",
                 client_cert=d / "client.pem", client_key=d / "client.key",
                 other_ca=d / "other-ca.pem")


@dataclass
class AuthServer:
    """A running auth server: ``address`` for nsqd's ``--auth-http-address``, ``seen``
    the query of every request nsqd made."""

    address: str
    seen: list[dict[str, str]] = field(default_factory=list)


@contextmanager
def auth_server(grants: Mapping[str, dict[str, Any]]) -> Iterator[AuthServer]:
    """Serve nsqd's auth protocol on 127.0.0.1: a secret in ``grants`` gets its JSON answer
    (``ttl``, ``identity``, ``authorizations``), any other secret a 403."""
    seen: list[dict[str, str]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            query = dict(urllib.parse.parse_qsl(urllib.parse.urlparse(self.path).query))
            seen.append(query)
            grant = grants.get(query.get("secret", ""))
            if grant is None:
                self.send_response(403)
                self.end_headers()
                self.wfile.write(b'{"message":"NOT_AUTHORIZED"}')
                return
            data = json.dumps(grant).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield AuthServer(f"127.0.0.1:{server.server_address[1]}", seen)
    finally:
        server.shutdown()
        server.server_close()
