"""Stream compression wrappers: correct for any split of the compressed stream."""

from __future__ import annotations

import zlib

import cramjam
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsq_spark.codecs import DeflateStream as _DeflateStream
from nsq_spark.codecs import SnappyStream as _SnappyStream
from nsq_spark.errors import ProtocolError
from nsq_spark.protocol import FrameDecoder, encode_frame, encode_message_frame

pytestmark = pytest.mark.unit


def _frames(n: int, size: int) -> bytes:
    return b"".join(encode_message_frame(b"%016d" % i, bytes([i % 256]) * size) for i in range(n)) \
        + encode_frame(0, b"_heartbeat_")


def _decode_split(codec: object, stream: bytes, cuts: list[int]) -> tuple[int, int]:
    dec = FrameDecoder()
    msgs = others = 0
    prev = 0
    for cut in [*sorted(cuts), len(stream)]:
        m, o = dec.feed(codec.decompress(stream[prev:cut]))  # type: ignore[attr-defined]
        msgs += len(m)
        others += len(o)
        prev = cut
    assert dec.buffered == 0
    return msgs, others


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 40), st.integers(1, 70000), st.data())
def test_snappy_framed_any_split(n: int, size: int, data: st.DataObject) -> None:
    raw = _frames(n, size)
    # several framed streams back to back, as written by successive flushes
    stream = b"".join(bytes(cramjam.snappy.compress(raw[i:i + 50000]))
                      for i in range(0, len(raw), 50000))
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=10))
    assert _decode_split(_SnappyStream(), stream, cuts) == (n, 1)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 40), st.integers(1, 70000), st.data())
def test_deflate_any_split(n: int, size: int, data: st.DataObject) -> None:
    raw = _frames(n, size)
    c = zlib.compressobj(6, zlib.DEFLATED, -15)
    stream = b"".join(c.compress(raw[i:i + 30000]) + c.flush(zlib.Z_SYNC_FLUSH)
                      for i in range(0, len(raw), 30000))
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=10))
    assert _decode_split(_DeflateStream(6), stream, cuts) == (n, 1)


def test_our_compressors_round_trip() -> None:
    raw = _frames(10, 100_000)
    for codec_out, codec_in in [(_SnappyStream(), _SnappyStream()), (_DeflateStream(1), _DeflateStream(1))]:
        stream = b"".join(codec_out.compress(raw[i:i + 70000]) for i in range(0, len(raw), 70000))
        assert b"".join(codec_in.decompress(stream[i:i + 999]) for i in range(0, len(stream), 999)) == raw


def test_corrupt_compressed_streams_are_protocol_errors() -> None:
    with pytest.raises(ProtocolError, match="snappy"):
        _SnappyStream().decompress(b"\x00\x05\x00\x00garbage")
    with pytest.raises(ProtocolError, match="deflate"):
        _DeflateStream(6).decompress(b"\xff\xff\xff\xff garbage")


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=500), st.integers(1, 64))
def test_fuzz_random_compressed_bytes_only_raise_protocol_error(blob: bytes, step: int) -> None:
    for codec in (_SnappyStream(), _DeflateStream(6)):
        dec = FrameDecoder(max_frame_size=1 << 20)
        try:
            for i in range(0, len(blob), step):
                dec.feed(codec.decompress(blob[i:i + step]))
        except ProtocolError:
            pass
