"""The publish spool's on-disk format, with no IO beyond reading a whole file:
records, their framing and checksums, and the spool's errors.

Segment format: the 8-byte magic ``NSQSPL01``, then records, each
``u32 payload length | u32 crc32(payload) | payload`` (little endian), the payload being
``u8 flags | u8 topic length | u32 defer ms | topic | body``. A truncated or damaged tail
is detected by the length and the checksum (:func:`decode_records` reports it in
``error``); the records before it stay readable.

The message-id envelope (versions 1 and 2) and the publish envelope (version 3) are
described and implemented in :mod:`nsq_spark.envelope`; their names are re-exported here.
"""

from __future__ import annotations

import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

from nsq_spark.envelope import (DIGEST_SIZE, ENVELOPE_MAGIC, MAX_TRACE_FIELD,
                                TRACED_ENVELOPE_MAGIC, TRACEPARENT_AT, TRACEPARENT_ONLY_AT,
                                TRACEPARENT_ONLY_BODY_AT, TRACEPARENT_ONLY_HEAD, Opened,
                                by_envelope_digest, open_envelope, open_traced_envelope,
                                wrap_envelope)
from nsq_spark.errors import NSQError

__all__ = ["SpoolError", "SpoolDirectoryError", "SpoolFullError", "MAGIC", "Decoded",
           "Salvaged", "encode_record", "decode_records", "read_segment", "salvage_records", "ENVELOPE_MAGIC", "DIGEST_SIZE",
           "wrap_envelope", "open_envelope", "by_envelope_digest", "TRACED_ENVELOPE_MAGIC",
           "Opened", "open_traced_envelope", "MAX_TRACE_FIELD", "TRACEPARENT_ONLY_AT",
           "TRACEPARENT_ONLY_HEAD", "TRACEPARENT_AT", "TRACEPARENT_ONLY_BODY_AT"]

# ---------------------------------------------------------------------------------------
# errors


class SpoolError(NSQError):
    """Base class of the spool's errors."""


class SpoolDirectoryError(SpoolError, OSError):
    """The spool directory cannot be created, written or locked."""


class SpoolFullError(SpoolError):
    """The spool reached ``spool_max_bytes`` (and ``spool_full="raise"``, or the block
    timeout passed)."""


# ---------------------------------------------------------------------------------------
# record framing (sans-IO)

MAGIC = b"NSQSPL01"
_HDR = struct.Struct("<II")          # payload length, crc32(payload)
_PAY = struct.Struct("<BBI")         # flags, topic length, defer ms
_FLAG_DEFER = 1
_MAX_PAYLOAD = 1 << 30               # a length beyond this is corruption, not a message


def encode_record(topic: str, body: bytes, defer_ms: int | None = None) -> bytes:
    """One framed spool record."""
    t = topic.encode("ascii")
    flags = _FLAG_DEFER if defer_ms is not None else 0
    payload = b"".join((_PAY.pack(flags, len(t), defer_ms or 0), t, body))
    return _HDR.pack(len(payload), zlib.crc32(payload)) + payload


@dataclass
class Decoded:
    """Result of :func:`decode_records` on a buffer that starts at file offset ``base``."""
    records: list[tuple[str, bytes, int | None, int]]  # topic, body, defer_ms, end offset
    end: int            # file offset just after the last complete, valid record
    need: int = 0       # >0: the next record is complete only with this many bytes from `end`
    error: str | None = None  # set when the bytes at `end` are not a valid record


def decode_records(buf: bytes | memoryview, base: int = 0, limit: int | None = None,
                   eof: bool = False) -> Decoded:
    """Decode the complete records of ``buf`` (which starts at file offset ``base``).

    Stops after ``limit`` records. A record cut by the end of ``buf`` is reported through
    ``need`` -- or, with ``eof=True`` (the buffer reaches the end of the file), as a
    truncated tail in ``error``. A bad length or checksum is an ``error`` at ``end``.
    """
    if not isinstance(buf, bytes):
        buf = bytes(buf)
    mv = memoryview(buf)         # checksums without copies; bodies are sliced from bytes
    n = len(buf)
    pos = 0
    out: list[tuple[str, bytes, int | None, int]] = []
    hdr = _HDR.unpack_from
    pay = _PAY.unpack_from
    crc = zlib.crc32
    hsize, psize = _HDR.size, _PAY.size
    topics: dict[bytes, str] = {}
    todo = n if limit is None else limit
    while pos < n and todo > 0:
        if n - pos < hsize:
            if eof:
                return Decoded(out, base + pos, 0,
                               f"truncated record header ({n - pos} of {hsize} bytes)")
            return Decoded(out, base + pos, hsize)
        length, checksum = hdr(buf, pos)
        if length < psize or length > _MAX_PAYLOAD:
            return Decoded(out, base + pos, 0, f"impossible record length {length}")
        start = pos + hsize
        stop = start + length
        if stop > n:
            if eof:
                return Decoded(out, base + pos, 0,
                               f"truncated record ({n - pos} of {hsize + length} bytes)")
            return Decoded(out, base + pos, hsize + length)
        if crc(mv[start:stop]) != checksum:
            return Decoded(out, base + pos, 0, "checksum mismatch")
        flags, tlen, defer = pay(buf, start)
        t_start = start + psize
        t_end = t_start + tlen
        if t_end > stop:
            return Decoded(out, base + pos, 0, "topic length beyond the record")
        tb = buf[t_start:t_end]
        topic = topics.get(tb)
        if topic is None:
            topic = topics[tb] = tb.decode("ascii", "replace")
        out.append((topic, buf[t_end:stop], defer if flags & _FLAG_DEFER else None,
                    base + stop))
        pos = stop
        todo -= 1
    return Decoded(out, base + pos)


@dataclass
class Salvaged:
    """What :func:`salvage_records` found: every intact record, and the damaged spans
    ``(offset, length, what was wrong)`` between them."""
    records: list[tuple[str, bytes, int | None, int]]
    damaged: list[tuple[int, int, str]]

    @property
    def damaged_bytes(self) -> int:
        return sum(n for _, n, _ in self.damaged)


def _intact_at(buf: bytes, pos: int) -> bool:
    """Whether a whole record with a good checksum starts at ``pos``."""
    if len(buf) - pos < _HDR.size:
        return False
    length: int
    checksum: int
    length, checksum = _HDR.unpack_from(buf, pos)
    stop = pos + _HDR.size + length
    if length < _PAY.size or length > _MAX_PAYLOAD or stop > len(buf):
        return False
    if zlib.crc32(memoryview(buf)[pos + _HDR.size:stop]) != checksum:
        return False
    topic_length: int = buf[pos + _HDR.size + 1]
    return pos + _HDR.size + _PAY.size + topic_length <= stop


def salvage_records(buf: bytes, base: int = 0) -> Salvaged:
    """Every intact record of a whole file's records (``buf`` starts at file offset
    ``base``), those after a damaged one included: past a damaged record, the next offset
    where a whole record with a good checksum starts is where reading goes on (a
    checksum that matches by chance: about one in four billion offsets). For ``spool
    redrive``: a refused message must not be lost for a flipped byte in another."""
    records: list[tuple[str, bytes, int | None, int]] = []
    damaged: list[tuple[int, int, str]] = []
    pos = 0
    while pos < len(buf):
        dec = decode_records(buf[pos:], base + pos, eof=True)
        records += dec.records
        if dec.error is None:
            break
        start = dec.end - base
        nxt = start + 1
        while nxt < len(buf) and not _intact_at(buf, nxt):
            nxt += 1
        damaged.append((base + start, nxt - start, dec.error))
        pos = nxt
    return Salvaged(records, damaged)


def read_segment(path: str | os.PathLike[str]) -> Decoded:
    """All intact records of a segment file (for inspection and tests); ``error`` tells
    what is wrong with the rest, if anything."""
    data = Path(path).read_bytes()
    if data[:len(MAGIC)] != MAGIC:
        return Decoded([], 0, 0, "not a spool segment (bad magic)")
    return decode_records(data[len(MAGIC):], len(MAGIC), eof=True)
