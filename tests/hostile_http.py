"""A hostile HTTP server on loopback for the HTTP clients' tests (the admin clients, lookupd
discovery, ``nsq-spark stat``): it answers every request the way it is told to misbehave,
records the requests it got, and is stopped (its sockets and threads) by the test.

Modes:

* ``"drip"``: a valid answer (``body``), one byte every ``every`` seconds;
* ``"huge"``: ``Content-Length: 4294967296``, then zeros for as long as the client reads;
* ``"chunks"``: chunked, 64 KiB chunks for ever;
* ``"silent"``: reads the request and never answers;
* ``"answer"``: ``body`` at once, with ``status`` and ``headers`` (for deep JSON, wrong
  types, a compressed answer, ...).

:func:`child` runs Python code in a new interpreter and returns what it printed as JSON,
with its peak RSS (``VmHWM``) in MB: memory is measured in a process of its own, where
nothing of the test runner's counts.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any

__all__ = ["HostileHttp", "child", "PEAK_RSS"]

#: code for a child: ``peak_rss_mb()`` is its own peak RSS so far, in MB
PEAK_RSS = """
def peak_rss_mb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return -1.0
"""


class HostileHttp:
    """See the module doc. ``address`` is ``127.0.0.1:port``; ``requests`` holds the raw
    head of each request received."""

    def __init__(self, mode: str, body: bytes = b"{}", status: int = 200,
                 every: float = 1.0, headers: bytes = b"") -> None:
        assert mode in ("drip", "huge", "chunks", "silent", "answer"), mode
        self.mode, self.body, self.status, self.every = mode, body, status, every
        self.extra_headers = headers
        self.requests: list[bytes] = []
        self._stop = threading.Event()
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(128)
        self._sock.settimeout(0.1)
        self.port = self._sock.getsockname()[1]
        self.address = f"127.0.0.1:{self.port}"
        self._conns: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._accepting = threading.Thread(target=self._accept, daemon=True,
                                           name=f"hostile-http {self.port}")
        self._accepting.start()

    def __enter__(self) -> "HostileHttp":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._stop.set()
        self._accepting.join(5)
        self._sock.close()
        with self._lock:
            conns, threads = list(self._conns), list(self._threads)
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            c.close()
        for t in threads:
            t.join(5)

    # -- serving -----------------------------------------------------------------------

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            conn.settimeout(0.2)
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            with self._lock:
                self._conns.append(conn)
                self._threads.append(t)
            t.start()

    def _read_head(self, conn: socket.socket) -> bytes | None:
        head = b""
        while b"\r\n\r\n" not in head:
            if self._stop.is_set():
                return None
            try:
                data = conn.recv(65536)
            except socket.timeout:
                continue
            except OSError:
                return None
            if not data:
                return None
            head += data
        return head

    def _send(self, conn: socket.socket, data: bytes) -> bool:
        """Send all of ``data`` unless stopped or the client left; False then."""
        view = memoryview(data)
        while view:
            if self._stop.is_set():
                return False
            try:
                n = conn.send(view)
            except socket.timeout:
                continue
            except OSError:
                return False
            view = view[n:]
        return True

    def _serve(self, conn: socket.socket) -> None:
        while not self._stop.is_set():
            head = self._read_head(conn)
            if head is None:
                return
            self.requests.append(head)
            answer = (f"HTTP/1.1 {self.status} X\r\nContent-Type: application/json\r\n"
                      f"Content-Length: {len(self.body)}\r\n").encode() + \
                self.extra_headers + b"\r\n" + self.body
            if self.mode == "answer":
                if not self._send(conn, answer):
                    return
                continue
            if self.mode == "silent":
                self._stop.wait()
                return
            if self.mode == "drip":
                for i in range(len(answer)):
                    if not self._send(conn, answer[i:i + 1]) or self._stop.wait(self.every):
                        return
                continue
            if self.mode == "huge":
                if not self._send(conn, b"HTTP/1.1 200 OK\r\nContent-Length: 4294967296\r\n"
                                  b"\r\n"):
                    return
                zeros = b"0" * 65536
                while self._send(conn, zeros):
                    pass
                return
            # chunks
            if not self._send(conn, b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"):
                return
            chunk = b"10000\r\n" + b"x" * 65536 + b"\r\n"
            while self._send(conn, chunk):
                pass
            return

    def headers(self, i: int = -1) -> dict[str, str]:
        """The headers of request ``i`` (names lower-cased)."""
        lines = self.requests[i].split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
        return {k.strip().lower(): v.strip() for k, _, v in
                (line.partition(":") for line in lines[1:])}


def child(code: str, timeout: float = 120.0, env: dict[str, str] | None = None
          ) -> dict[str, Any]:
    """Run ``code`` (with :data:`PEAK_RSS`'s ``peak_rss_mb()`` defined) in a new Python;
    its last line of stdout is JSON, returned as a dict with ``"seconds"`` (its run time)
    added. Raises with its output when it fails."""
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", PEAK_RSS + textwrap.dedent(code)],
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})
    if proc.returncode != 0 or not proc.stdout.strip():
        raise AssertionError(f"the child failed ({proc.returncode}):\n{proc.stdout}\n"
                             f"{proc.stderr}")
    doc: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    doc["seconds"] = time.monotonic() - started
    doc["stderr"] = proc.stderr
    return doc
