"""The publish spool's on-disk format, with no IO beyond reading a whole file:
records, their framing and checksums, the message-id envelope, and the spool's errors.

Segment format: the 8-byte magic ``NSQSPL01``, then records, each
``u32 payload length | u32 crc32(payload) | payload`` (little endian), the payload being
``u8 flags | u8 topic length | u32 defer ms | topic | body``. A truncated or damaged tail
is detected by the length and the checksum (:func:`decode_records` reports it in
``error``); the records before it stay readable.

Message-id envelope, version 1: ``b"\\x00NID\\x01" + blake2b(body, digest_size=16) +
body``; the digest equals ``nsq_spark.dedup.by_body_digest`` of the inner body, so
:func:`by_envelope_digest` and ``by_body_digest`` agree on every message.

Version 2 (the traced envelope, written only when a Producer propagates trace context:
NSQ messages have no headers): ``b"\\x00NID\\x02" + digest + u16 extension length (big
endian) + extension + body``. The extension is a list of ``u8 tag | u8 length | value``
fields: tag 1 a W3C ``traceparent``, tag 2 its ``tracestate`` (only when it fits in 255
bytes; a longer one is dropped, the traceparent alone still links the traces). A reader
skips tags it does not know, so later fields need no new version. The digest is still
the inner body's, so deduplication keys do not change when tracing is switched on.
Readers of this version (:func:`open_envelope`, :func:`by_envelope_digest`, the Reader
with telemetry, the Spark source) get the same inner body and digest from both versions;
code of a release before it treats a version-2 body as a plain body (no wrong inner
body, but the envelope stays in it), so upgrade consumers before producers propagate.
"""

from __future__ import annotations

import hashlib
import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from nsq_spark.errors import NSQError

__all__ = ["SpoolError", "SpoolDirectoryError", "SpoolFullError", "MAGIC", "Decoded",
           "encode_record", "decode_records", "read_segment", "ENVELOPE_MAGIC", "DIGEST_SIZE",
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


def read_segment(path: str | os.PathLike[str]) -> Decoded:
    """All intact records of a segment file (for inspection and tests); ``error`` tells
    what is wrong with the rest, if anything."""
    data = Path(path).read_bytes()
    if data[:len(MAGIC)] != MAGIC:
        return Decoded([], 0, 0, "not a spool segment (bad magic)")
    return decode_records(data[len(MAGIC):], len(MAGIC), eof=True)


# ---------------------------------------------------------------------------------------
# message-id envelope

ENVELOPE_MAGIC = b"\x00NID\x01"
TRACED_ENVELOPE_MAGIC = b"\x00NID\x02"
DIGEST_SIZE = 16
#: the longest value of one extension field (its length is one byte)
MAX_TRACE_FIELD = 255
_MAGIC_SIZE = len(ENVELOPE_MAGIC)
_EXT_LEN = struct.Struct(">H")
_EXT_AT = _MAGIC_SIZE + DIGEST_SIZE            # where version 2's extension length is
_TAG_TRACEPARENT = 1
_TAG_TRACESTATE = 2
_TRACEPARENT_SIZE = 55                      # "00-" + 32 + "-" + 16 + "-" + 2 (W3C, version 00)
_TRACEPARENT_ONLY = 2 + _TRACEPARENT_SIZE   # the extension holding just a traceparent
#: The layout of the envelope a Producer writes without tracestate, for readers that
#: open whole columns at once (the Spark source): at ``TRACEPARENT_ONLY_AT`` the bytes
#: ``TRACEPARENT_ONLY_HEAD`` (extension length, tag, size), the traceparent from
#: ``TRACEPARENT_AT`` to ``TRACEPARENT_ONLY_BODY_AT``, then the inner body.
TRACEPARENT_ONLY_AT = _EXT_AT
TRACEPARENT_ONLY_HEAD = _EXT_LEN.pack(_TRACEPARENT_ONLY) + bytes((_TAG_TRACEPARENT,
                                                                   _TRACEPARENT_SIZE))
TRACEPARENT_AT = _EXT_AT + len(TRACEPARENT_ONLY_HEAD)
TRACEPARENT_ONLY_BODY_AT = TRACEPARENT_AT + _TRACEPARENT_SIZE


def _digest(body: bytes) -> bytes:
    # the same function as nsq_spark.dedup.by_body_digest, so keys agree
    return hashlib.blake2b(body, digest_size=DIGEST_SIZE).digest()


def _field(tag: int, value: str, name: str) -> bytes:
    raw = value.encode("ascii")
    if len(raw) > MAX_TRACE_FIELD:
        raise ValueError(f"{name} is {len(raw)} bytes, over the envelope's "
                         f"{MAX_TRACE_FIELD}: shorten it (tracestate) or leave it out")
    return bytes((tag, len(raw))) + raw


def wrap_envelope(body: bytes, traceparent: str | None = None,
                  tracestate: str | None = None) -> bytes:
    """``body`` with its message-id envelope (see the module doc): version 1, or version
    2 carrying ``traceparent`` (and ``tracestate`` when it fits in 255 bytes; a longer one
    is left out). A body that already has an envelope is returned as it is, so a spooling
    producer that both traces and digests never wraps twice."""
    if body[:_MAGIC_SIZE] in (ENVELOPE_MAGIC, TRACED_ENVELOPE_MAGIC):
        return body
    if traceparent is None:
        return ENVELOPE_MAGIC + _digest(body) + body
    ext = _field(_TAG_TRACEPARENT, traceparent, "traceparent")
    if tracestate and len(tracestate) <= MAX_TRACE_FIELD:
        ext += _field(_TAG_TRACESTATE, tracestate, "tracestate")
    return b"".join((TRACED_ENVELOPE_MAGIC, _digest(body), _EXT_LEN.pack(len(ext)), ext,
                     body))


class Opened(NamedTuple):
    """What :func:`open_traced_envelope` found: the digest (None: no envelope), the inner
    body, and the trace context a version-2 envelope carried (else None)."""
    digest: bytes | None
    body: bytes
    traceparent: str | None = None
    tracestate: str | None = None


def open_traced_envelope(body: bytes) -> Opened:
    """Open either version of the envelope; a plain body (or a version-2 body whose
    extension is cut short: not one of ours) comes back unchanged with no digest."""
    magic = body[:_MAGIC_SIZE]
    if magic == ENVELOPE_MAGIC and len(body) >= _EXT_AT:
        return Opened(bytes(body[_MAGIC_SIZE:_EXT_AT]), bytes(body[_EXT_AT:]))
    if magic != TRACED_ENVELOPE_MAGIC or len(body) < _EXT_AT + _EXT_LEN.size:
        return Opened(None, body)
    (ext_len,) = _EXT_LEN.unpack_from(body, _EXT_AT)
    start = _EXT_AT + _EXT_LEN.size
    stop = start + ext_len
    if stop > len(body):
        return Opened(None, body)
    if ext_len == _TRACEPARENT_ONLY and body[start] == _TAG_TRACEPARENT and \
            body[start + 1] == _TRACEPARENT_SIZE:
        # what a Producer writes without tracestate: no field loop (half the time)
        return Opened(bytes(body[_MAGIC_SIZE:_EXT_AT]), bytes(body[stop:]),
                      bytes(body[start + 2:stop]).decode("ascii", "replace"))
    fields: dict[int, str] = {}
    pos = start
    while pos + 2 <= stop:
        tag, size = body[pos], body[pos + 1]
        value_end = pos + 2 + size
        if value_end > stop:
            break   # a field cut by the extension's end: ignore it, keep the rest
        fields[tag] = bytes(body[pos + 2:value_end]).decode("ascii", "replace")
        pos = value_end
    return Opened(bytes(body[_MAGIC_SIZE:_EXT_AT]), bytes(body[stop:]),
                  fields.get(_TAG_TRACEPARENT), fields.get(_TAG_TRACESTATE))


def open_envelope(body: bytes) -> tuple[bytes | None, bytes]:
    """``(digest, inner body)`` of an enveloped body (either version); ``(None, body)``
    for a plain one."""
    if body[:_MAGIC_SIZE] == ENVELOPE_MAGIC and len(body) >= _EXT_AT:
        return bytes(body[_MAGIC_SIZE:_EXT_AT]), bytes(body[_EXT_AT:])
    opened = open_traced_envelope(body)
    return opened.digest, opened.body


def by_envelope_digest(msg: Any) -> bytes:
    """Deduplication key: the envelope's digest, or the body's BLAKE2b-128 digest when the
    message has no envelope -- equal to ``by_body_digest`` of the inner body either way."""
    digest, body = open_envelope(msg.body)
    return digest if digest is not None else _digest(body)
