"""Stream compression as nsqd speaks it: snappy framing and raw deflate, free of IO.

Private (``_codecs``): the connections and the handshake use it; users choose a codec with
``ConnectionConfig(snappy=True)`` / ``deflate=True``. (Its old path ``nsq_spark.codecs``
was internal and is gone.)

After IDENTIFY negotiated ``snappy`` or ``deflate``, every byte in both directions goes
through one codec object: :meth:`decompress` takes whatever the socket gave, :meth:`compress`
makes one self-contained piece of stream out of each write. Decompression works in bulk (a
whole read chunk at once, then decoded by :class:`~nsq_spark.protocol.FrameDecoder`).

Bounded output: ``decompress(data, max_length)`` returns at most about ``max_length`` bytes
and keeps the rest of the input; :attr:`has_pending_output` then says that more output is
ready without new input, and ``decompress(b"", max_length)`` gives it. A small compressed
read can expand a thousandfold (deflate), so the connections drain with that pair, bounded
by ``max_frame_size`` (a frame of that size still completes; a few KiB of deflated zeros do
not become gigabytes in one step). ``max_length`` 0 (the default) means unbounded.

Corrupt input raises :class:`~nsq_spark.errors.ProtocolError` naming the codec.
"""

from __future__ import annotations

import zlib
from typing import Literal, Protocol

import cramjam

from .errors import ProtocolError

__all__ = ["StreamCodec", "SnappyStream", "DeflateStream", "CodecKind", "make_codec"]

CodecKind = Literal["snappy", "deflate"]

#: snappy's framing format caps a chunk's uncompressed data at 64 KiB
_SNAPPY_MAX_CHUNK = 65536


class StreamCodec(Protocol):
    """What a connection needs of a compression codec."""

    def decompress(self, data: bytes, max_length: int = 0) -> bytes: ...

    def compress(self, data: bytes) -> bytes: ...

    @property
    def buffered(self) -> int:
        """Compressed bytes held back (an incomplete chunk, or input not yet expanded)."""
        ...

    @property
    def has_pending_output(self) -> bool:
        """True when ``decompress(b"")`` would return more bytes (after a bounded call)."""
        ...


class SnappyStream:
    """Snappy *framed* stream format (what nsqd speaks), on cramjam.

    cramjam decompresses complete framed streams only, so incoming bytes are cut at chunk
    boundaries here (4-byte chunk header: type, 24-bit little-endian length); the complete
    chunks of each read go to cramjam in one call, the partial chunk waits for more bytes.
    """

    STREAM_ID = b"\xff\x06\x00\x00sNaPpY"

    def __init__(self) -> None:
        self._buf = b""
        self._complete = 0  # bytes of _buf that are whole chunks (left by a bounded call)

    def decompress(self, data: bytes, max_length: int = 0) -> bytes:
        buf = self._buf + data if self._buf else data
        n = len(buf)
        # a chunk expands to at most 64 KiB: this many chunks keep the output bounded
        chunks_left = max_length // _SNAPPY_MAX_CHUNK + 1 if max_length > 0 else -1
        pos = 0
        while n - pos >= 4 and chunks_left != 0:
            end = pos + 4 + (buf[pos + 1] | buf[pos + 2] << 8 | buf[pos + 3] << 16)
            if end > n:
                break
            pos = end
            chunks_left -= 1
        self._complete = 0
        if pos == 0:
            self._buf = buf
            return b""
        if pos == n:
            complete, self._buf = buf, b""
        else:
            complete, self._buf = buf[:pos], buf[pos:]
            if chunks_left == 0:
                self._complete = self._whole_chunks()
        if not complete.startswith(self.STREAM_ID):
            complete = self.STREAM_ID + complete  # cramjam insists on the stream header first
        try:
            return bytes(cramjam.snappy.decompress(complete))
        except Exception as exc:  # cramjam.DecompressionError and friends
            raise ProtocolError(f"corrupt snappy stream from nsqd: {exc}") from exc

    def _whole_chunks(self) -> int:
        buf, n, pos = self._buf, len(self._buf), 0
        while n - pos >= 4:
            end = pos + 4 + (buf[pos + 1] | buf[pos + 2] << 8 | buf[pos + 3] << 16)
            if end > n:
                break
            pos = end
        return pos

    @property
    def buffered(self) -> int:
        return len(self._buf)

    @property
    def has_pending_output(self) -> bool:
        return self._complete > 0

    def compress(self, data: bytes) -> bytes:
        # each write is a complete framed stream; repeated stream identifiers are allowed
        return bytes(cramjam.snappy.compress(data))


class DeflateStream:
    """Raw deflate (no zlib header), sync-flushed after each write, as nsqd does."""

    def __init__(self, level: int) -> None:
        self._d = zlib.decompressobj(-zlib.MAX_WBITS)
        self._c = zlib.compressobj(level, zlib.DEFLATED, -zlib.MAX_WBITS)

    def decompress(self, data: bytes, max_length: int = 0) -> bytes:
        d = self._d
        if d.unconsumed_tail:
            data = d.unconsumed_tail + data
        try:
            return d.decompress(data, max(0, max_length))
        except zlib.error as exc:
            raise ProtocolError(f"corrupt deflate stream from nsqd: {exc}") from exc

    @property
    def buffered(self) -> int:
        return len(self._d.unconsumed_tail)

    @property
    def has_pending_output(self) -> bool:
        return bool(self._d.unconsumed_tail)

    def compress(self, data: bytes) -> bytes:
        return self._c.compress(data) + self._c.flush(zlib.Z_SYNC_FLUSH)


def make_codec(kind: CodecKind, level: int = 6) -> SnappyStream | DeflateStream:
    """The codec for a negotiated kind (``level`` applies to deflate only)."""
    if kind == "snappy":
        return SnappyStream()
    if kind == "deflate":
        return DeflateStream(level)
    raise ValueError(f"unknown stream codec {kind!r}; expected 'snappy' or 'deflate'")
