"""The body envelope: what a publisher puts in front of a body, since NSQ messages have no
headers. Sans-IO: bytes in, bytes out; the Producer stamps, the consumers open.

Three versions, told apart by their 5-byte magic. Every reader of any version checks it
before trusting a byte of it: a damaged envelope (cut short, a checksum or digest that does
not match the body) is never opened, never cut and never used as a key -- it is the whole
body, as received, with ``damaged`` saying why (:func:`open_body`).

Version 3, the publish envelope (``Producer(publish_ids=True)``, implied by ``replicas``)::

    b"\\x00NID\\x03" | publish id (16 bytes) | u32 crc32 (big endian) | u16 extension
    length | extension | body

The *publish id* names one publish, not its content: unique per ``publish()`` of each
message (:class:`PublishIds`), or derived from the caller's idempotency key
(:func:`publish_id_for`); every copy of it (the replicas on several nsqds, a retry, the
spool's resend after a crash) carries the same one, and two publishes of equal bytes carry
two. The CRC-32 covers the publish id, the extension length, the extension and the body: a
cut or damaged envelope fails it. The extension is a list of ``u8 tag | u8 length | value``
fields (tag 1 a W3C ``traceparent``, tag 2 its ``tracestate``); a reader skips tags it does
not know. 27 bytes more per message without trace context.

Identifiers are not authenticated: anyone who may publish to a topic can write any id.
The checksum finds damage, not forgery; what a forged id can cost is bounded by the
deduplicator's key (``dedup_key="publish_id"`` is the id alone: a message published under
another one's id, with a valid checksum, is taken for it).

Version 1 (``message_id_digest=True``): ``b"\\x00NID\\x01" | blake2b-128(body) | body``.
Version 2 (version 1 with trace context, ``Telemetry(trace_context=True)``):
``b"\\x00NID\\x02" | digest | u16 extension length | extension | body``. Their digest names
the content (equal to ``nsq_spark.dedup.by_body_digest`` of the inner body); it is checked
against the body when opened. Both are still written and read.
"""

from __future__ import annotations

import hashlib
import os
import struct
import threading
import zlib
from typing import Any, NamedTuple

__all__ = [
    "ENVELOPE_MAGIC", "TRACED_ENVELOPE_MAGIC", "PUBLISH_ENVELOPE_MAGIC", "DIGEST_SIZE",
    "PUBLISH_ID_SIZE", "MAX_TRACE_FIELD", "Opened", "Envelope", "open_body", "stamp",
    "stamp_many", "with_trace", "wrap_envelope", "open_envelope", "open_traced_envelope",
    "by_envelope_digest", "PublishIds", "publish_id_for", "TRACEPARENT_ONLY_AT",
    "TRACEPARENT_ONLY_HEAD", "TRACEPARENT_AT", "TRACEPARENT_ONLY_BODY_AT",
    "PUBLISH_ID_AT", "PUBLISH_EXT_AT", "PUBLISH_BODY_AT", "PUBLISH_TRACED_BODY_AT", "PUBLISH_TRACEPARENT_AT",
    "publish_extension", "publish_extensions",
]

ENVELOPE_MAGIC = b"\x00NID\x01"
TRACED_ENVELOPE_MAGIC = b"\x00NID\x02"
PUBLISH_ENVELOPE_MAGIC = b"\x00NID\x03"
_FAMILY = b"\x00NID"                 # the first four bytes of every version
DIGEST_SIZE = 16
PUBLISH_ID_SIZE = 16
#: the longest value of one extension field (its length is one byte)
MAX_TRACE_FIELD = 255
_MAGIC_SIZE = len(ENVELOPE_MAGIC)
_EXT_LEN = struct.Struct(">H")
_CRC = struct.Struct(">I")
_EXT_AT = _MAGIC_SIZE + DIGEST_SIZE            # where version 2's extension length is
_V3_CRC_AT = _MAGIC_SIZE + PUBLISH_ID_SIZE     # version 3: the CRC-32
_V3_EXT_AT = _V3_CRC_AT + _CRC.size            # version 3: the extension length
_V3_HEAD = _V3_EXT_AT + _EXT_LEN.size          # version 3 with no extension: the body
_TAG_TRACEPARENT = 1
_TAG_TRACESTATE = 2
_TRACEPARENT_SIZE = 55                      # "00-" + 32 + "-" + 16 + "-" + 2 (W3C, version 00)
_TRACEPARENT_ONLY = 2 + _TRACEPARENT_SIZE   # the extension holding just a traceparent
#: The layout of the version-2 envelope a Producer writes without tracestate, for readers
#: that open whole columns at once (the Spark source): at ``TRACEPARENT_ONLY_AT`` the bytes
#: ``TRACEPARENT_ONLY_HEAD`` (extension length, tag, size), the traceparent from
#: ``TRACEPARENT_AT`` to ``TRACEPARENT_ONLY_BODY_AT``, then the inner body.
TRACEPARENT_ONLY_AT = _EXT_AT
TRACEPARENT_ONLY_HEAD = _EXT_LEN.pack(_TRACEPARENT_ONLY) + bytes((_TAG_TRACEPARENT,
                                                                   _TRACEPARENT_SIZE))
TRACEPARENT_AT = _EXT_AT + len(TRACEPARENT_ONLY_HEAD)
TRACEPARENT_ONLY_BODY_AT = TRACEPARENT_AT + _TRACEPARENT_SIZE
_NO_EXT = _EXT_LEN.pack(0)
#: The layout of version 3 for readers that open whole columns at once (the Spark
#: source): the publish id from ``PUBLISH_ID_AT`` (16 bytes); with no extension the body
#: from ``PUBLISH_BODY_AT``; with the extension a Producer writes for a traceparent alone
#: (``TRACEPARENT_ONLY_HEAD`` at the extension length), the traceparent from
#: ``PUBLISH_TRACEPARENT_AT`` and the body from ``PUBLISH_TRACED_BODY_AT``. Which layout a
#: body has, and whether it is intact, only :func:`publish_extension` says.
PUBLISH_ID_AT = _MAGIC_SIZE
PUBLISH_EXT_AT = _V3_EXT_AT
PUBLISH_BODY_AT = _V3_HEAD
PUBLISH_TRACEPARENT_AT = _V3_EXT_AT + len(TRACEPARENT_ONLY_HEAD)
PUBLISH_TRACED_BODY_AT = PUBLISH_TRACEPARENT_AT + _TRACEPARENT_SIZE


def _digest(body: bytes) -> bytes:
    # the same function as nsq_spark.dedup.by_body_digest, so keys agree
    return hashlib.blake2b(body, digest_size=DIGEST_SIZE).digest()


# ---------------------------------------------------------------------------------------
# opening


class Envelope(NamedTuple):
    """What :func:`open_body` found.

    ``body``: the inner body, or the whole body when there is no envelope or a damaged one.
    ``version``: 1, 2 or 3; 0 for a plain body and for a damaged envelope.
    ``publish_id``: the 16-byte publish id (version 3), else None.
    ``digest``: the content digest (versions 1 and 2), else None.
    ``traceparent``, ``tracestate``: the trace context an extension carried, else None.
    ``damaged``: why an envelope was not trusted (None: intact or no envelope).
    """
    body: bytes
    version: int = 0
    publish_id: bytes | None = None
    digest: bytes | None = None
    traceparent: str | None = None
    tracestate: str | None = None
    damaged: str | None = None


def _plain(body: bytes, damaged: str | None = None) -> Envelope:
    return Envelope(body, damaged=damaged)


def _fields(body: bytes, start: int, stop: int) -> dict[int, str]:
    fields: dict[int, str] = {}
    pos = start
    while pos + 2 <= stop:
        tag, size = body[pos], body[pos + 1]
        value_end = pos + 2 + size
        if value_end > stop:
            break   # a field cut by the extension's end: ignore it, keep the rest
        fields[tag] = bytes(body[pos + 2:value_end]).decode("ascii", "replace")
        pos = value_end
    return fields


def publish_extension(data: Any, start: int, end: int) -> int:
    """The checks of :func:`open_body` on a version-3 envelope at ``data[start:end]`` (a
    ``bytes`` or ``memoryview`` holding many bodies: the columnar readers pass an Arrow
    buffer and each row's span), without copying the body: its extension's length when
    the envelope is intact (0: none; the extension starts at ``start + PUBLISH_EXT_AT``
    with its length, so a traceparent alone shows ``TRACEPARENT_ONLY_HEAD`` there);
    -1 when it is cut short, its extension runs past the end or
    its CRC-32 does not match (a damaged one: the whole body, no id). The caller has seen
    the magic."""
    n = end - start
    if n < _V3_HEAD:
        return -1
    ext_len: int = (data[start + _V3_EXT_AT] << 8) | data[start + _V3_EXT_AT + 1]
    if _V3_HEAD + ext_len > n:
        return -1
    crc = zlib.crc32(data[start + _V3_EXT_AT:end],
                     zlib.crc32(data[start + _MAGIC_SIZE:start + _V3_CRC_AT]))
    if crc.to_bytes(4, "big") != bytes(data[start + _V3_CRC_AT:start + _V3_EXT_AT]):
        return -1
    return ext_len


def publish_extensions(data: Any, starts: Any, ends: Any) -> Any:
    """:func:`publish_extension` for many bodies at once (the columnar readers): ``data``
    a buffer holding them, ``starts``/``ends`` numpy arrays of their spans (each seen to
    start with the magic); returns a numpy ``int64`` array, each the extension length or
    -1. The lengths and the stored CRC-32 are gathered with numpy; the CRC-32 of each
    body is zlib's, on the buffer, no copy. (numpy is imported here: only the Spark
    source, which has it, calls this.)"""
    import numpy as np

    n = len(starts)
    out = np.full(n, -1, np.int64)
    if n == 0:
        return out
    raw = np.frombuffer(data, np.uint8)
    starts = np.asarray(starts, np.int64)
    ends = np.asarray(ends, np.int64)
    ok = ends - starts >= _V3_HEAD
    at = starts[ok]
    ext = (raw[at + _V3_EXT_AT].astype(np.int64) << 8) | raw[at + _V3_EXT_AT + 1]
    fits = _V3_HEAD + ext <= ends[ok] - at
    idx = np.flatnonzero(ok)[fits]
    at, ext = at[fits], ext[fits]
    stored = ((raw[at + _V3_CRC_AT].astype(np.uint32) << 24)
              | (raw[at + _V3_CRC_AT + 1].astype(np.uint32) << 16)
              | (raw[at + _V3_CRC_AT + 2].astype(np.uint32) << 8)
              | raw[at + _V3_CRC_AT + 3])
    view = memoryview(data).cast("B")
    crc32 = zlib.crc32
    computed = np.fromiter(
        (crc32(view[s + _V3_EXT_AT:e], crc32(view[s + _MAGIC_SIZE:s + _V3_CRC_AT]))
         for s, e in zip(at.tolist(), ends[idx].tolist())), np.uint32, len(at))
    good = computed == stored
    out[idx[good]] = ext[good]
    return out


def open_body(body: bytes) -> Envelope:
    """Open an enveloped body of any version, checked; a plain body as it is.

    A damaged envelope -- shorter than its header, an extension running past the end, a
    CRC-32 (version 3) or digest (versions 1 and 2) that does not match -- comes back as
    the whole body with ``damaged`` set: never a cut body, never an id or digest."""
    if body[:4] != _FAMILY:
        return _plain(body)
    version = body[4:5]
    n = len(body)
    if version == b"\x03":
        if n < _V3_HEAD:
            return _plain(body, f"publish envelope cut short ({n} of {_V3_HEAD} header bytes)")
        (ext_len,) = _EXT_LEN.unpack_from(body, _V3_EXT_AT)
        start = _V3_HEAD
        stop = start + ext_len
        if stop > n:
            return _plain(body, f"publish envelope's extension ({ext_len} bytes) runs past "
                                f"the end of the body ({n} bytes)")
        pid = body[_MAGIC_SIZE:_V3_CRC_AT]
        (crc,) = _CRC.unpack_from(body, _V3_CRC_AT)
        if zlib.crc32(memoryview(body)[_V3_EXT_AT:], zlib.crc32(pid)) != crc:
            return _plain(body, "publish envelope's CRC-32 does not match (damaged or cut)")
        if ext_len:
            f = _fields(body, start, stop)
            return Envelope(body[stop:], 3, pid, None, f.get(_TAG_TRACEPARENT),
                            f.get(_TAG_TRACESTATE))
        return Envelope(body[stop:], 3, pid)
    if version == b"\x01":
        if n < _EXT_AT:
            return _plain(body, f"message-id envelope cut short ({n} of {_EXT_AT} bytes)")
        digest, inner = body[_MAGIC_SIZE:_EXT_AT], body[_EXT_AT:]
        if _digest(inner) != digest:
            return _plain(body, "message-id envelope's digest does not match its body "
                                "(damaged, cut or forged)")
        return Envelope(inner, 1, None, digest)
    if version == b"\x02":
        if n < _EXT_AT + _EXT_LEN.size:
            return _plain(body, f"traced envelope cut short ({n} bytes)")
        (ext_len,) = _EXT_LEN.unpack_from(body, _EXT_AT)
        start = _EXT_AT + _EXT_LEN.size
        stop = start + ext_len
        if stop > n:
            return _plain(body, f"traced envelope's extension ({ext_len} bytes) runs past "
                                f"the end of the body ({n} bytes)")
        digest, inner = body[_MAGIC_SIZE:_EXT_AT], body[stop:]
        if _digest(inner) != digest:
            return _plain(body, "traced envelope's digest does not match its body "
                                "(damaged, cut or forged)")
        f = _fields(body, start, stop)
        return Envelope(inner, 2, None, digest, f.get(_TAG_TRACEPARENT),
                        f.get(_TAG_TRACESTATE))
    return _plain(body)   # a later version, or not an envelope: the body as it is


# ---------------------------------------------------------------------------------------
# writing


def _field(tag: int, value: str, name: str) -> bytes:
    raw = value.encode("ascii")
    if len(raw) > MAX_TRACE_FIELD:
        raise ValueError(f"{name} is {len(raw)} bytes, over the envelope's "
                         f"{MAX_TRACE_FIELD}: shorten it (tracestate) or leave it out")
    return bytes((tag, len(raw))) + raw


def _extension(traceparent: str | None, tracestate: str | None) -> bytes:
    if traceparent is None:
        return b""
    ext = _field(_TAG_TRACEPARENT, traceparent, "traceparent")
    if tracestate and len(tracestate) <= MAX_TRACE_FIELD:
        ext += _field(_TAG_TRACESTATE, tracestate, "tracestate")
    return ext


def stamp(body: bytes, publish_id: bytes, traceparent: str | None = None,
          tracestate: str | None = None) -> bytes:
    """``body`` in a version-3 envelope carrying ``publish_id`` (16 bytes) and the trace
    context, if any (a ``tracestate`` over 255 bytes is left out).

    A body that is already an intact version-3 envelope keeps its own id (a relay
    forwarding what it consumed keeps the publish it forwards); the trace context given
    replaces the one it carried only when it carried none. An intact version-1 or -2
    envelope is opened first (its trace context kept). A damaged one is a plain body."""
    if body[:4] == _FAMILY:
        opened = open_body(body)
        if opened.version:
            if opened.version == 3:
                publish_id = opened.publish_id  # type: ignore[assignment]
            if opened.traceparent is not None:
                traceparent, tracestate = opened.traceparent, opened.tracestate
            body = opened.body
    if type(publish_id) is not bytes or len(publish_id) != PUBLISH_ID_SIZE:
        raise ValueError(f"a publish id is {PUBLISH_ID_SIZE} bytes, got {publish_id!r}: make "
                         "one with PublishIds().new() or publish_id_for(key)")
    ext = _extension(traceparent, tracestate)
    tail = _EXT_LEN.pack(len(ext)) + ext if ext else _NO_EXT
    crc = zlib.crc32(body, zlib.crc32(tail, zlib.crc32(publish_id)))
    return b"".join((PUBLISH_ENVELOPE_MAGIC, publish_id, _CRC.pack(crc), tail, body))


def stamp_many(bodies: list[bytes], publish_ids: list[bytes]) -> list[bytes]:
    """:func:`stamp` for a batch without trace context (the Producer's hot path: one loop,
    no extension; about 0.3 us a body here against 0.9 through :func:`stamp`)."""
    out: list[bytes] = []
    app = out.append
    crc32 = zlib.crc32
    pack = _CRC.pack
    join = b"".join
    magic, no_ext = PUBLISH_ENVELOPE_MAGIC, _NO_EXT
    for body, pid in zip(bodies, publish_ids):
        if body[:4] == _FAMILY:
            app(stamp(body, pid))
            continue
        app(join((magic, pid, pack(crc32(body, crc32(no_ext, crc32(pid)))), no_ext, body)))
    return out


def with_trace(body: bytes, traceparent: str, tracestate: str | None = None) -> bytes:
    """``body`` carrying the trace context: a version-3 envelope keeps its publish id and
    gains the context (unless it carries one already); anything else is wrapped as
    :func:`wrap_envelope` does (version 2)."""
    if body[:_MAGIC_SIZE] == PUBLISH_ENVELOPE_MAGIC:
        opened = open_body(body)
        if opened.version == 3:
            if opened.traceparent is not None:
                return body
            return stamp(opened.body, opened.publish_id,  # type: ignore[arg-type]
                         traceparent, tracestate)
    return wrap_envelope(body, traceparent, tracestate)


def wrap_envelope(body: bytes, traceparent: str | None = None,
                  tracestate: str | None = None) -> bytes:
    """``body`` with its message-id envelope: version 1, or version 2 carrying
    ``traceparent`` (and ``tracestate`` when it fits in 255 bytes; a longer one is left
    out). A body that already is an intact envelope (any version) is returned as it is,
    so a spooling producer that both traces and digests never wraps twice; a body that
    only starts like one is wrapped like any other."""
    if body[:4] == _FAMILY and open_body(body).version:
        return body
    if traceparent is None:
        return ENVELOPE_MAGIC + _digest(body) + body
    ext = _extension(traceparent, tracestate)
    return b"".join((TRACED_ENVELOPE_MAGIC, _digest(body), _EXT_LEN.pack(len(ext)), ext,
                     body))


# ---------------------------------------------------------------------------------------
# the earlier readers' shapes (kept: users call them)


class Opened(NamedTuple):
    """What :func:`open_traced_envelope` found: the digest (None: no envelope, or a
    version-3 one, whose id is not a digest: :func:`open_body` has it), the inner body,
    and the trace context (else None)."""
    digest: bytes | None
    body: bytes
    traceparent: str | None = None
    tracestate: str | None = None


def open_traced_envelope(body: bytes) -> Opened:
    """Open any version (checked, see :func:`open_body`); a plain or damaged body comes
    back whole with no digest."""
    e = open_body(body)
    return Opened(e.digest, e.body, e.traceparent, e.tracestate)


def open_envelope(body: bytes) -> tuple[bytes | None, bytes]:
    """``(digest, inner body)`` of an enveloped body (checked, any version; a version-3
    envelope has no digest: ``(None, inner)``); ``(None, body)`` for a plain or damaged
    one."""
    e = open_body(body)
    return e.digest, e.body


def by_envelope_digest(msg: Any) -> bytes:
    """Deduplication key by content: the envelope's digest, checked, or the BLAKE2b-128
    digest of the inner body (a version-3 envelope, or none). A damaged envelope is never
    a key: its whole body is hashed, as a plain body is."""
    e = open_body(msg.body)
    return e.digest if e.digest is not None else _digest(e.body)


# ---------------------------------------------------------------------------------------
# publish ids


class PublishIds:
    """Publish ids, unique per call: a random 8-byte prefix per process (drawn again in a
    forked child) and an 8-byte counter. Unique across processes and hosts as long as two
    prefixes do not collide (2^-64 per pair). About 0.1 us an id (``os.urandom`` per id
    would be a system call each). Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reseed()
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._reseed)

    def _reseed(self) -> None:
        self._prefix = os.urandom(8)
        self._next = int.from_bytes(os.urandom(4), "big")  # not 0: ids differ per prefix

    def new(self) -> bytes:
        """One id."""
        with self._lock:
            n = self._next
            self._next = n + 1
            prefix = self._prefix
        return prefix + (n & 0xFFFF_FFFF_FFFF_FFFF).to_bytes(8, "big")

    def many(self, count: int) -> list[bytes]:
        """``count`` ids, consecutive."""
        with self._lock:
            n = self._next
            self._next = n + count
            prefix = self._prefix
        mask = 0xFFFF_FFFF_FFFF_FFFF
        return [prefix + ((n + i) & mask).to_bytes(8, "big") for i in range(count)]


def publish_id_for(key: bytes | str) -> bytes:
    """The publish id of an idempotency key: its BLAKE2b-128 digest (any length of key;
    ``str`` keys as UTF-8). The same key gives the same id in every process, so a caller
    (or the Spark sink, from the query, batch, partition and row) that publishes again
    under one key publishes the same message."""
    if isinstance(key, str):
        key = key.encode("utf-8")
    elif not isinstance(key, bytes):
        if isinstance(key, (bytearray, memoryview)):
            key = bytes(key)
        else:
            raise TypeError(f"an idempotency key is bytes or str, not {type(key).__name__}")
    if not key:
        raise ValueError("an idempotency key may not be empty: give each publish its own "
                         "non-empty key, or leave the key out for a new id per publish")
    return hashlib.blake2b(key, digest_size=PUBLISH_ID_SIZE, person=b"nsq-spark-pid").digest()
