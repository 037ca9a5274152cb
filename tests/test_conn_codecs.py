"""Stream compression (nsq_spark._codecs): correct for any split of the compressed stream,
and with bounded output per call."""

from __future__ import annotations

import zlib

import cramjam
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsq_spark._codecs import DeflateStream, SnappyStream, make_codec
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
    assert _decode_split(SnappyStream(), stream, cuts) == (n, 1)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 40), st.integers(1, 70000), st.data())
def test_deflate_any_split(n: int, size: int, data: st.DataObject) -> None:
    raw = _frames(n, size)
    c = zlib.compressobj(6, zlib.DEFLATED, -15)
    stream = b"".join(c.compress(raw[i:i + 30000]) + c.flush(zlib.Z_SYNC_FLUSH)
                      for i in range(0, len(raw), 30000))
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=10))
    assert _decode_split(DeflateStream(6), stream, cuts) == (n, 1)


def test_our_compressors_round_trip() -> None:
    raw = _frames(10, 100_000)
    for codec_out, codec_in in [(SnappyStream(), SnappyStream()), (DeflateStream(1), DeflateStream(1))]:
        stream = b"".join(codec_out.compress(raw[i:i + 70000]) for i in range(0, len(raw), 70000))
        assert b"".join(codec_in.decompress(stream[i:i + 999]) for i in range(0, len(stream), 999)) == raw


def test_corrupt_compressed_streams_are_protocol_errors() -> None:
    with pytest.raises(ProtocolError, match="snappy"):
        SnappyStream().decompress(b"\x00\x05\x00\x00garbage")
    with pytest.raises(ProtocolError, match="deflate"):
        DeflateStream(6).decompress(b"\xff\xff\xff\xff garbage")


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=500), st.integers(1, 64))
def test_fuzz_random_compressed_bytes_only_raise_protocol_error(blob: bytes, step: int) -> None:
    for codec in (SnappyStream(), DeflateStream(6)):
        dec = FrameDecoder(max_frame_size=1 << 20)
        try:
            for i in range(0, len(blob), step):
                dec.feed(codec.decompress(blob[i:i + step]))
        except ProtocolError:
            pass


def _drain(codec: object, piece: bytes, limit: int) -> list[bytes]:
    outs = [codec.decompress(piece, limit)]  # type: ignore[attr-defined]
    while codec.has_pending_output:  # type: ignore[attr-defined]
        outs.append(codec.decompress(b"", limit))  # type: ignore[attr-defined]
    return outs


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["snappy", "deflate"]), st.integers(1, 300_000), st.integers(1, 200_000),
       st.data())
def test_bounded_output_gives_the_same_bytes_in_bounded_pieces(
        kind: str, size: int, limit: int, data: st.DataObject) -> None:
    raw = bytes(size // 3) + bytes(range(256)) * (size // 768 + 1)  # compressible, not only
    out_codec = make_codec(kind, 6)  # type: ignore[arg-type]
    stream = b"".join(out_codec.compress(raw[i:i + 100_000]) for i in range(0, len(raw), 100_000))
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=5)))
    codec = make_codec(kind, 6)  # type: ignore[arg-type]
    outs: list[bytes] = []
    for a, b in zip([0, *cuts], [*cuts, len(stream)]):
        outs += _drain(codec, stream[a:b], limit)
    assert b"".join(outs) == raw
    # deflate stops at the limit; snappy at the whole 64 KiB chunk that crosses it
    bound = limit if kind == "deflate" else limit + 65536
    assert max(map(len, outs)) <= bound


def test_a_deflate_bomb_is_expanded_a_bounded_piece_at_a_time() -> None:
    bomb = DeflateStream(9).compress(bytes(50 * 1024 * 1024))  # 50 MiB of zeros, ~50 KiB
    assert len(bomb) < 100_000
    codec = DeflateStream(9)
    first = codec.decompress(bomb, 1 << 20)
    assert len(first) == 1 << 20 and codec.has_pending_output
    assert sum(map(len, _drain(codec, b"", 1 << 20))) == 49 * 1024 * 1024
    assert not codec.has_pending_output


def test_unknown_codec_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="snappy"):
        make_codec("lz4")  # type: ignore[arg-type]
