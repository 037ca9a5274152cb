"""pynsq's ``SyncConn``: a blocking socket that speaks NSQ frames and nothing more. The
caller does the protocol: after :meth:`SyncConn.connect` (which sends the magic) it sends
``nsq.protocol.identify(...)``, ``subscribe(...)``, ``ready(...)`` itself and reads each
frame with :meth:`SyncConn.read_response` (then ``protocol.unpack_response``).

It is deliberately not :class:`nsq_spark._sync_conn.SyncConnection`: that class does the
whole handshake (IDENTIFY, TLS, compression, AUTH) itself, and a second IDENTIFY from a
pynsq program would make nsqd close the connection. For a blocking connection that does the
handshake and publishes, use ``SyncConnection`` or ``Producer``.
"""

from __future__ import annotations

import socket
import struct

from .. import protocol
from .._addresses import parse_address
from ..errors import ConnectionClosedError, ProtocolError

__all__ = ["SyncConn"]

_SIZE = struct.Struct(">l")


class SyncConn:
    """``connect(host, port)``, ``send(bytes)``, ``read_response() -> bytes`` (one frame:
    its 4-byte type and its data). ``timeout`` applies to every socket operation."""

    def __init__(self, timeout: float = 1.0) -> None:
        self.timeout = timeout
        self.buffer = b""
        self.s: socket.socket | None = None

    def connect(self, host: str, port: int) -> None:
        address = parse_address((host, port), "SyncConn.connect(host, port)")
        self.s = socket.socket(socket.AF_INET6 if ":" in address.host else socket.AF_INET,
                               socket.SOCK_STREAM)
        self.s.settimeout(self.timeout)
        self.s.connect((address.host, address.port))
        self.s.send(protocol.MAGIC_V2)

    def _sock(self) -> socket.socket:
        if self.s is None:
            raise ConnectionClosedError("SyncConn is not connected: call connect(host, port)")
        return self.s

    def _read_exactly(self, n: int) -> bytes:
        sock = self._sock()
        while len(self.buffer) < n:
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionClosedError(f"nsqd closed the connection ({len(self.buffer)} "
                                            f"of {n} bytes received)")
            self.buffer += chunk
        data, self.buffer = self.buffer[:n], self.buffer[n:]
        return data

    def read_response(self) -> bytes:
        """The next frame, without its size prefix: ``frame_type (4 bytes) + data``."""
        (size,) = _SIZE.unpack(self._read_exactly(4))
        if size < 4:
            raise ProtocolError(f"frame size {size} is below the 4-byte minimum")
        return self._read_exactly(size)

    def send(self, data: bytes) -> None:
        """Send command bytes (all of them)."""
        sock = self._sock()
        view = memoryview(data)
        while view:
            view = view[sock.send(view):]

    def close(self) -> None:
        if self.s is not None:
            self.s.close()
            self.s = None
