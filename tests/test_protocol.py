"""Sans-IO protocol: command encoding, bulk frame decoding, names, typed errors."""

from __future__ import annotations

import json
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nsq_spark import errors, protocol
from nsq_spark.errors import InvalidBodyError, InvalidNameError, ProtocolError
from nsq_spark.message import Message
from nsq_spark.protocol import (FRAME_TYPE_ERROR, FRAME_TYPE_MESSAGE, FRAME_TYPE_RESPONSE,
                                FrameDecoder, decode_frames, encode_frame, encode_message_frame)

pytestmark = pytest.mark.unit

MID = b"0123456789abcdef"


# -- encoders -----------------------------------------------------------------------------

def test_simple_commands_are_exact_bytes() -> None:
    assert protocol.MAGIC_V2 == b"  V2"
    assert protocol.sub("t", "c#ephemeral") == b"SUB t c#ephemeral\n"
    assert protocol.rdy(2500) == b"RDY 2500\n"
    assert protocol.fin(MID) == b"FIN " + MID + b"\n"
    assert protocol.req(MID, 1500) == b"REQ " + MID + b" 1500\n"
    assert protocol.req(MID) == b"REQ " + MID + b" 0\n"
    assert protocol.touch(MID) == b"TOUCH " + MID + b"\n"
    assert protocol.nop() == b"NOP\n"
    assert protocol.cls() == b"CLS\n"


def test_identify_and_auth_have_sized_bodies() -> None:
    cmd = protocol.identify({"client_id": "x", "feature_negotiation": True})
    assert cmd.startswith(b"IDENTIFY\n")
    (n,) = struct.unpack(">I", cmd[9:13])
    assert n == len(cmd) - 13
    assert json.loads(cmd[13:]) == {"client_id": "x", "feature_negotiation": True}
    assert protocol.auth("s3cret") == b"AUTH\n\x00\x00\x00\x06s3cret"


def test_pub_and_dpub() -> None:
    assert protocol.pub("topic", b"hello") == b"PUB topic\n\x00\x00\x00\x05hello"
    assert protocol.pub("topic", bytearray(b"hi")) == b"PUB topic\n\x00\x00\x00\x02hi"
    assert protocol.dpub("topic", 2500, b"x") == b"DPUB topic 2500\n\x00\x00\x00\x01x"


def test_mpub_layout() -> None:
    cmd = protocol.mpub("t", [b"a", b"bcd", memoryview(b"ef")])
    header = b"MPUB t\n"
    assert cmd.startswith(header)
    body_len, count = struct.unpack(">II", cmd[len(header):len(header) + 8])
    body = cmd[len(header) + 8:]
    assert count == 3
    assert body_len == len(body) + 4
    assert body == b"\x00\x00\x00\x01a\x00\x00\x00\x03bcd\x00\x00\x00\x02ef"
    # a generator works too
    assert protocol.mpub("t", (b for b in [b"a", b"bcd", b"ef"])) == cmd


@pytest.mark.parametrize("bad", [b"", "text"])
def test_bad_bodies_are_typed_errors(bad: object) -> None:
    with pytest.raises(InvalidBodyError):
        protocol.pub("t", bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidBodyError, match="#1"):
        protocol.mpub("t", [b"ok", bad])  # type: ignore[list-item]


def test_body_limits() -> None:
    with pytest.raises(InvalidBodyError, match="max-msg-size"):
        protocol.pub("t", b"x" * 11, max_size=10)
    with pytest.raises(InvalidBodyError, match="max-msg-size"):
        protocol.mpub("t", [b"x", b"x" * 11], max_size=10)
    with pytest.raises(InvalidBodyError, match="at least one"):
        protocol.mpub("t", [])
    assert protocol.pub("t", b"x" * 10, max_size=10).endswith(b"x" * 10)


def test_split_bodies_respects_batch_size() -> None:
    bodies = [b"x" * 10] * 10
    batches = protocol.split_bodies(bodies, 4 + 3 * 14)
    assert [len(b) for b in batches] == [3, 3, 3, 1]
    assert sum(batches, []) == bodies


# -- names ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["a", "a" * 64, "foo.bar-baz_1", "t#ephemeral",
                                  "a" * 54 + "#ephemeral"])
def test_valid_names(name: str) -> None:
    assert protocol.valid_topic_name(name)
    assert protocol.valid_channel_name(name)
    assert protocol.check_topic(name) == name
    assert protocol.check_channel(name.encode()) == name


@pytest.mark.parametrize("name", ["", "a" * 65, "a" * 55 + "#ephemeral", "sp ace", "new\nline",
                                  "t\n", "#ephemeral", "t#ephemeral#ephemeral", "t#other",
                                  "ünïcode", "slash/x", None, 5])
def test_invalid_names(name: object) -> None:
    assert not protocol.valid_topic_name(name)
    with pytest.raises(InvalidNameError, match="topic"):
        protocol.check_topic(name)  # type: ignore[arg-type]
    with pytest.raises(InvalidNameError, match="channel"):
        protocol.check_channel(name)  # type: ignore[arg-type]
    if isinstance(name, str):
        with pytest.raises(InvalidNameError):
            protocol.pub(name, b"x")
        with pytest.raises(InvalidNameError):
            protocol.sub("ok", name)


# -- errors ---------------------------------------------------------------------------------

@pytest.mark.parametrize("code,cls,fatal", [
    ("E_INVALID", errors.InvalidError, True),
    ("E_BAD_TOPIC", errors.BadTopicError, True),
    ("E_BAD_MESSAGE", errors.BadMessageError, True),
    ("E_PUB_FAILED", errors.PubFailedError, True),
    ("E_FIN_FAILED", errors.FinFailedError, False),
    ("E_REQ_FAILED", errors.ReqFailedError, False),
    ("E_TOUCH_FAILED", errors.TouchFailedError, False),
    ("E_AUTH_FAILED", errors.AuthFailedError, True),
    ("E_UNAUTHORIZED", errors.UnauthorizedError, True),
    ("E_SOMETHING_NEW", errors.NSQServerError, True),
])
def test_error_frames_map_to_typed_errors(code: str, cls: type, fatal: bool) -> None:
    exc = errors.error_from_frame(code.encode() + b" some text", "127.0.0.1:4150")
    assert type(exc) is cls
    assert isinstance(exc, errors.NSQError)
    assert exc.code == code and exc.description == "some text"
    assert exc.fatal is fatal and errors.is_fatal(code) is fatal
    assert "127.0.0.1:4150" in str(exc) and code in str(exc)


def test_auth_errors_are_auth_errors() -> None:
    assert isinstance(errors.error_from_frame(b"E_UNAUTHORIZED x"), errors.AuthError)


# -- decoding -------------------------------------------------------------------------------

def _stream() -> tuple[bytes, list[tuple[int, bytes]]]:
    frames = [
        (FRAME_TYPE_RESPONSE, b"OK"),
        (FRAME_TYPE_MESSAGE, struct.pack(">qH16s", 1_700_000_000_123_456_789, 3, MID) + b"body-1"),
        (FRAME_TYPE_RESPONSE, protocol.HEARTBEAT),
        (FRAME_TYPE_ERROR, b"E_FIN_FAILED FIN 0123 failed"),
        (FRAME_TYPE_MESSAGE, struct.pack(">qH16s", 5, 1, b"f" * 16) + b"x" * 1000),
        (FRAME_TYPE_MESSAGE, struct.pack(">qH16s", 6, 65535, b"e" * 16)),  # empty body decodes
    ]
    return b"".join(encode_frame(t, d) for t, d in frames), frames


def test_decode_frames_all_at_once() -> None:
    data, frames = _stream()
    got, used = decode_frames(data + b"\x00\x00")
    assert got == frames
    assert used == len(data)


def test_frame_decoder_builds_messages_in_bulk() -> None:
    data, _ = _stream()
    responder = object()
    dec = FrameDecoder(responder)  # type: ignore[arg-type]
    msgs, others = dec.feed(data)
    assert [m.id for m in msgs] == [MID, b"f" * 16, b"e" * 16]
    assert msgs[0].timestamp == 1_700_000_000_123_456_789 and msgs[0].attempts == 3
    assert msgs[0].body == b"body-1" and msgs[1].body == b"x" * 1000 and msgs[2].body == b""
    assert msgs[2].attempts == 65535
    assert all(m._responder is responder for m in msgs)
    assert others == [(0, b"OK"), (0, b"_heartbeat_"), (1, b"E_FIN_FAILED FIN 0123 failed")]
    assert dec.buffered == 0


def test_encode_message_frame_round_trip() -> None:
    frame = encode_message_frame(MID, b"hello", 42, 2)
    msgs, others = FrameDecoder().feed(frame)
    assert others == [] and [fields(m) for m in msgs] == [(MID, b"hello", 42, 2)]
    again = protocol.decode_message(frame[8:])
    assert fields(again) == fields(msgs[0])
    assert again is not msgs[0] and again != msgs[0]  # identity, as pynsq: two messages


def fields(m: Message) -> tuple:
    return (m.id, m.body, m.timestamp, m.attempts)


def test_large_frame_in_small_pieces() -> None:
    body = bytes(range(256)) * 4096  # 1 MiB
    frame = encode_message_frame(MID, body) + encode_frame(0, b"OK")
    dec = FrameDecoder()
    got: list[Message] = []
    others: list[tuple[int, bytes]] = []
    for i in range(0, len(frame), 7000):
        m, o = dec.feed(frame[i:i + 7000])
        got += m
        others += o
        if i + 7000 < len(frame) - 10:
            assert dec.buffered == i + 7000 or got
    assert [m.body for m in got] == [body] and others == [(0, b"OK")]
    assert dec.buffered == 0


@pytest.mark.parametrize("data,match", [
    (struct.pack(">i", 3), "below"),
    (struct.pack(">i", -1), "below"),
    (struct.pack(">ii", 1 << 30, 0), "exceeds"),
    (struct.pack(">ii", 6, 7) + b"OK", "unknown frame type"),
    (struct.pack(">ii", 10, 2) + b"x" * 6, "shorter"),
])
def test_corrupt_streams_raise_protocol_error(data: bytes, match: str) -> None:
    with pytest.raises(ProtocolError, match=match):
        FrameDecoder().feed(data)
    with pytest.raises(ProtocolError, match=match):
        decode_frames(data)


def test_decode_message_too_short() -> None:
    with pytest.raises(ProtocolError):
        protocol.decode_message(b"short")


def test_identify_response_parsing() -> None:
    assert protocol.parse_identify_response(b"OK") == {}
    assert protocol.parse_identify_response(b'{"max_rdy_count": 2500}') == {"max_rdy_count": 2500}
    with pytest.raises(ProtocolError):
        protocol.parse_identify_response(b"[1]")
    with pytest.raises(ProtocolError):
        protocol.parse_identify_response(b"garbage")


# -- fuzzing ------------------------------------------------------------------------------

frame_st = st.one_of(
    st.tuples(st.sampled_from([0, 1]), st.binary(max_size=40)),
    st.tuples(st.just(2), st.builds(lambda ts, a, mid, body: struct.pack(">qH16s", ts, a, mid) + body,
                                    st.integers(-(2 ** 63), 2 ** 63 - 1), st.integers(0, 65535),
                                    st.binary(min_size=16, max_size=16), st.binary(max_size=300))),
)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.lists(frame_st, max_size=12), st.data())
def test_fuzz_valid_stream_split_anywhere_never_loses_sync(frames: list[tuple[int, bytes]],
                                                           data: st.DataObject) -> None:
    stream = b"".join(encode_frame(t, d) for t, d in frames)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=8)))
    dec = FrameDecoder()
    msgs: list[Message] = []
    others: list[tuple[int, bytes]] = []
    prev = 0
    for cut in [*cuts, len(stream)]:
        m, o = dec.feed(stream[prev:cut])
        msgs += m
        others += o
        prev = cut
    assert dec.buffered == 0
    assert others == [(t, d) for t, d in frames if t != 2]
    assert [protocol.encode_message_frame(m.id, m.body, m.timestamp, m.attempts)[8:] for m in msgs] \
        == [d for t, d in frames if t == 2]


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=400), st.integers(1, 64))
def test_fuzz_random_bytes_only_raise_protocol_error(blob: bytes, step: int) -> None:
    dec = FrameDecoder(max_frame_size=1 << 20)
    try:
        for i in range(0, len(blob), step):
            dec.feed(blob[i:i + step])
    except ProtocolError:
        pass
    try:
        decode_frames(blob, max_frame_size=1 << 20)
    except ProtocolError:
        pass


@settings(max_examples=200, deadline=None)
@given(st.lists(frame_st, min_size=1, max_size=6), st.data())
def test_fuzz_truncated_stream_keeps_tail(frames: list[tuple[int, bytes]], data: st.DataObject) -> None:
    stream = b"".join(encode_frame(t, d) for t, d in frames)
    cut = data.draw(st.integers(0, len(stream) - 1))
    dec = FrameDecoder()
    m, o = dec.feed(stream[:cut])
    assert len(m) + len(o) < len(frames)
    assert dec.buffered == cut - sum(len(encode_frame(t, d)) for t, d in frames[:len(m) + len(o)])


def test_feed_restores_gc_state_even_on_error() -> None:
    import gc

    assert gc.isenabled()
    FrameDecoder().feed(encode_message_frame(MID, b"x"))
    assert gc.isenabled()
    with pytest.raises(ProtocolError):
        FrameDecoder().feed(struct.pack(">ii", 6, 9) + b"OK")
    assert gc.isenabled()
    gc.disable()
    try:
        FrameDecoder().feed(encode_message_frame(MID, b"x"))
        assert not gc.isenabled()  # left as the caller had it
    finally:
        gc.enable()


@pytest.mark.parametrize("method", ["feed", "feed_blocks"])
def test_frame_over_max_frame_size_raises_whole_or_split(method: str) -> None:
    """The limit does not depend on how the bytes were cut: a whole oversized message
    frame in one read is refused like one that arrives in pieces."""
    frame = encode_message_frame(MID, b"x" * 200)  # size field 230
    with pytest.raises(ProtocolError, match="exceeds the limit of 64"):
        getattr(FrameDecoder(max_frame_size=64), method)(frame)
    dec = FrameDecoder(max_frame_size=64)
    with pytest.raises(ProtocolError, match="exceeds the limit of 64"):
        getattr(dec, method)(frame[:100])
    ok = getattr(FrameDecoder(max_frame_size=230), method)(frame)[0]
    assert sum(len(x) for x in ok) == 1 if method == "feed_blocks" else len(ok) == 1
