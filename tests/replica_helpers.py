"""Helpers of the publish-id and replica tests: read what an nsqd holds, raw, with a
consumer of a few lines over a plain socket (nothing of the library's consumer in between,
so a check does not trust the code it checks), and a proxy that loses one answer."""

from __future__ import annotations

import socket
import struct
import threading
import time
import urllib.request
from collections import Counter
from typing import Iterable

from nsq_spark.envelope import open_body

_FRAME = struct.Struct(">ii")
_MESSAGE = 2


def http_post(http_address: str, path: str) -> None:
    req = urllib.request.Request(f"http://{http_address}{path}", data=b"", method="POST")
    urllib.request.urlopen(req, timeout=5).read()


def make_channel(http_address: str, topic: str, channel: str = "check") -> None:
    """Create the topic and a channel, so that the channel keeps every message."""
    http_post(http_address, f"/topic/create?topic={topic}")
    http_post(http_address, f"/channel/create?topic={topic}&channel={channel}")


def raw_bodies(tcp_address: str, topic: str, count: int, channel: str = "check",
               timeout: float = 20.0) -> list[bytes]:
    """``count`` message bodies of ``topic/channel`` as nsqd holds them (FINished); fewer
    when the channel runs dry for a second or ``timeout`` passes."""
    host, port = tcp_address.rsplit(":", 1)
    out: list[bytes] = []
    if count == 0:
        return out
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(b"  V2" + f"SUB {topic} {channel}\nRDY {min(count, 2500)}\n".encode())
        buf = b""
        deadline = time.monotonic() + timeout
        s.settimeout(1.0)
        while len(out) < count and time.monotonic() < deadline:
            try:
                chunk = s.recv(1 << 16)
            except socket.timeout:
                break
            if not chunk:
                break
            buf += chunk
            while len(buf) >= 8:
                size, ftype = _FRAME.unpack_from(buf)
                if len(buf) < 4 + size:
                    break
                data, buf = buf[8:4 + size], buf[4 + size:]
                if ftype == _MESSAGE:
                    msg_id = data[10:26]
                    out.append(data[26:])
                    s.sendall(b"FIN " + msg_id + b"\n")
                elif data == b"_heartbeat_":
                    s.sendall(b"NOP\n")
    return out


def depth(cluster: object, i: int, topic: str, channel: str = "check") -> int:
    """What nsqd ``i`` holds for ``topic/channel``: the channel's messages, and those still
    in the topic's queue (nsqd copies a topic's messages into its channels
    asynchronously: just after a publish, a message may be in the topic only)."""
    stats = cluster.nsqds[i].stats(topic)  # type: ignore[attr-defined]
    for t in stats.get("topics") or []:
        if t["topic_name"] == topic:
            for c in t["channels"] or []:
                if c["channel_name"] == channel:
                    return int(t["depth"] + c["depth"] + c["in_flight_count"]
                               + c["deferred_count"])
            return int(t["depth"])
    return 0


def settled_depth(cluster: object, i: int, topic: str, channel: str = "check",
                  timeout: float = 10.0) -> int:
    """:func:`depth` once three readings in a row agree (the topic-to-channel copy of
    the last publish has landed), within ``timeout``."""
    readings = [depth(cluster, i, topic, channel)]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(0.05)
        readings.append(depth(cluster, i, topic, channel))
        if len(readings) >= 3 and readings[-1] == readings[-2] == readings[-3]:
            break
    return readings[-1]


def drain(cluster: object, i: int, topic: str, channel: str = "check") -> list[bytes]:
    """Everything nsqd ``i`` holds for ``topic/channel`` (counted first, then read)."""
    n = settled_depth(cluster, i, topic, channel)
    bodies = raw_bodies(cluster.nsqds[i].tcp_address, topic, n, channel)  # type: ignore
    assert len(bodies) == n, f"nsqd{i}: read {len(bodies)} of {n}"
    return bodies


def ids_of(bodies: Iterable[bytes]) -> Counter[bytes]:
    """Publish id -> copies; every body must carry an intact version-3 envelope."""
    out: Counter[bytes] = Counter()
    for b in bodies:
        e = open_body(b)
        assert e.version == 3 and e.publish_id is not None, (b[:40], e.damaged)
        out[e.publish_id] += 1
    return out


class LosingProxy:
    """A TCP proxy in front of nsqd that loses the answer to the first command carrying
    ``trigger``: the command reaches nsqd (which stores the message), then both sides of
    that connection are closed before the client reads the answer. Later connections
    pass through. ``lost`` counts the answers lost."""

    def __init__(self, target: tuple[str, int], trigger: bytes) -> None:
        self.target = target
        self.trigger = trigger
        self.lost = 0
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            cut = threading.Event()
            for fn in (self._up, self._down):
                threading.Thread(target=fn, args=(client, upstream, cut), daemon=True).start()

    def _up(self, c: socket.socket, u: socket.socket, cut: threading.Event) -> None:
        try:
            while data := c.recv(65536):
                if self.trigger in data and self.lost == 0:
                    self.lost += 1
                    cut.set()                # nothing nsqd says from now on gets through
                    u.sendall(data)
                    time.sleep(0.2)          # nsqd takes the message and answers ...
                    _close(c, u)             # ... which the client never reads
                    return
                u.sendall(data)
        except OSError:
            pass

    def _down(self, c: socket.socket, u: socket.socket, cut: threading.Event) -> None:
        try:
            while data := u.recv(65536):
                if not cut.is_set():
                    c.sendall(data)
        except OSError:
            pass
        _close(c, u)

    def close(self) -> None:
        self.sock.close()


def _close(*socks: socket.socket) -> None:
    for x in socks:
        try:
            x.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        x.close()


def unacked_in_spool(spool: "object") -> int:
    """Records in the spool's segments past their acknowledged watermark (read from the
    files, as the next producer on the directory will)."""
    from pathlib import Path

    from nsq_spark.spool._format import read_segment

    n = 0
    for seg in Path(str(spool)).glob("*.seg"):
        ack = Path(str(seg) + ".ack")
        mark = struct.unpack("<Q", ack.read_bytes()[:8])[0] if ack.exists() else 0
        n += sum(1 for r in read_segment(seg).records if r[3] > mark)
    return n
