"""MessageBlock and FrameDecoder.feed_blocks: the columnar consumer path without an object per
message. Blocks must describe exactly the messages that ``feed`` decodes from the same byte
stream, however it is chunked; plus the ConnectionConfig bounds that keep a block's offsets
within int32."""

from __future__ import annotations

import struct
from array import array

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nsq_spark import protocol
from nsq_spark.config import ConnectionConfig
from nsq_spark.errors import ConfigError, ProtocolError
from nsq_spark.message import Message
from nsq_spark.protocol import (FRAME_TYPE_ERROR, FRAME_TYPE_RESPONSE, FrameDecoder,
                                MessageBlock, encode_frame, encode_message_frame)

pytestmark = pytest.mark.unit

HEARTBEAT = encode_frame(FRAME_TYPE_RESPONSE, b"_heartbeat_")


class Responder:
    """A stand-in answerer: only its ``address`` is read by blocks and messages."""

    def __init__(self, address: str) -> None:
        self.address = address


def mid(i: int) -> bytes:
    return b"%016x" % i


def decode_one(frames: bytes, responder=None) -> MessageBlock:
    blocks, others = FrameDecoder(responder).feed_blocks(frames)
    assert others == [] and len(blocks) == 1
    return blocks[0]


def sample_block(n: int = 7, responder=None) -> tuple[MessageBlock, list[tuple]]:
    """A decoded block of ``n`` messages after a response frame (so that its offsets do not
    start at 0), and the (id, body, timestamp, attempts) of each."""
    fields = [(mid(i), b"body-%d" % i * (i % 3), 1_600_000_000_000_000_000 + 7919 * i,
               1 + (i * 4099) % 65535) for i in range(n)]
    data = encode_frame(FRAME_TYPE_RESPONSE, b"OK") + b"".join(
        encode_message_frame(*f) for f in fields)
    blocks, others = FrameDecoder(responder).feed_blocks(data)
    assert others == [(FRAME_TYPE_RESPONSE, b"OK")] and len(blocks) == 1
    assert blocks[0].offsets[0] == 10
    return blocks[0], fields


def fields_of(messages: list[Message]) -> list[tuple]:
    return [(m.id, m.body, m.timestamp, m.attempts) for m in messages]


# -- MessageBlock ---------------------------------------------------------------------------


def test_block_accessors_match_the_frames() -> None:
    r = Responder("127.0.0.1:4150")
    b, fields = sample_block(7, r)
    assert len(b) == 7
    assert b.ids() == [f[0] for f in fields]
    assert b.attempts() == [f[3] for f in fields]
    assert b.max_attempts == max(f[3] for f in fields)
    msgs = b.messages()
    assert fields_of(msgs) == fields
    assert all(m.nsqd_address == "127.0.0.1:4150" for m in msgs)
    assert b.nsqd_address == "127.0.0.1:4150"
    assert "7 messages" in repr(b) and "127.0.0.1:4150" in repr(b)
    for i, f in enumerate(fields):  # frame i is data[offsets[i]:offsets[i + 1]]
        assert b.data[b.offsets[i]:b.offsets[i + 1]] == encode_message_frame(*f)
        s = b.offsets[i]
        assert b.data[s + protocol.ID_AT:s + protocol.BODY_AT] == f[0]
        assert b.data[s + protocol.BODY_AT:b.offsets[i + 1]] == f[1]
        assert struct.unpack_from(">qH", b.data, s + protocol.TIMESTAMP_AT) == (f[2], f[3])
    assert decode_one(encode_message_frame(mid(1), b"x")).nsqd_address is None


def test_split_every_position_keeps_order_and_shares_bytes() -> None:
    r = Responder("a:1")
    b, fields = sample_block(6, r)
    for k in range(1, 6):
        head, tail = b.split(k)
        assert (len(head), len(tail)) == (k, 6 - k)
        assert fields_of(head.messages()) == fields[:k]
        assert fields_of(tail.messages()) == fields[k:]
        assert head.data is b.data and tail.data is b.data  # no copy of the frames
        assert head.responder is r and tail.responder is r
        # an upper bound after a split
        assert head.max_attempts >= max(head.attempts())
        assert tail.max_attempts >= max(tail.attempts())
        assert head.ids() + tail.ids() == b.ids()
        assert head.fin_commands() + tail.fin_commands() == b.fin_commands()
    for k in (0, 6, -1, 7):
        with pytest.raises(ValueError):
            b.split(k)


@given(st.lists(st.integers(0, 300), min_size=1, max_size=30), st.integers(1, 5000))
@settings(max_examples=200, deadline=None)
def test_body_bytes_and_count_to_reach_follow_the_bodies(sizes: list[int], nbytes: int
                                                         ) -> None:
    data = b"".join(encode_message_frame(mid(i), b"b" * n, 1, 1) for i, n in enumerate(sizes))
    b = decode_one(data)
    assert [b.body_bytes(k) for k in range(len(sizes) + 1)] == \
        [sum(sizes[:k]) for k in range(len(sizes) + 1)]
    assert b.body_bytes() == sum(sizes)
    k = b.count_to_reach(nbytes)
    if sum(sizes) < nbytes:
        assert k == len(sizes)  # they never reach it: all of them
    else:  # the first k that reaches it: at least one, none past it
        assert k >= 1 and sum(sizes[:k]) >= nbytes and sum(sizes[:k - 1]) < nbytes


@given(st.lists(st.booleans(), min_size=1, max_size=40))
@settings(max_examples=200, deadline=None)
def test_select_keeps_flagged_messages_as_runs(keep: list[bool]) -> None:
    b, fields = sample_block(len(keep), Responder("a:1"))
    out = b.select(keep)
    assert fields_of([m for blk in out for m in blk.messages()]) == \
        [f for f, k in zip(fields, keep) if k]
    # one block per run of kept messages: as many blocks as runs of True
    runs = sum(1 for i, k in enumerate(keep) if k and (i == 0 or not keep[i - 1]))
    assert len(out) == runs
    for blk in out:
        assert len(blk) >= 1 and blk.data is b.data and blk.responder is b.responder
        assert blk.max_attempts >= max(blk.attempts())
        assert not blk._responded


def test_select_argument_errors() -> None:
    b, _ = sample_block(3)
    assert b.select([False, False, False]) == []
    with pytest.raises(ValueError):
        b.select([True, True])
    with pytest.raises(ValueError):
        b.select([True] * 4)


def expected_fins(b: MessageBlock) -> bytes:
    return b"".join(b"FIN " + i + b"\n" for i in b.ids())


def test_fin_commands_numpy_and_fallback_give_the_same_bytes(monkeypatch) -> None:
    b, fields = sample_block(9)
    head, tail = b.split(4)
    sel = b.select([i % 3 != 1 for i in range(9)])
    blocks = [b, head, tail, *sel, decode_one(encode_message_frame(mid(5), b""))]
    with_numpy = [x.fin_commands() for x in blocks]
    monkeypatch.setattr(protocol, "_numpy", lambda: None)
    fallback = [x.fin_commands() for x in blocks]
    assert with_numpy == fallback == [expected_fins(x) for x in blocks]
    assert with_numpy[0] == b"".join(b"FIN " + f[0] + b"\n" for f in fields)
    assert len(with_numpy[0]) == 21 * 9


def test_fin_commands_uses_numpy_when_present() -> None:
    # the fast path must really be taken in this environment, else the test above compares
    # the fallback with itself
    pytest.importorskip("numpy")
    assert protocol._numpy() is not None


# -- feed_blocks vs feed --------------------------------------------------------------------

_ids = st.binary(min_size=16, max_size=16)
_bodies = st.one_of(
    st.binary(max_size=60),
    st.just(b""),
    # beyond the decoder's 64 KiB threshold: gathered in pieces across reads
    st.integers(70_000, 90_000).map(lambda n: b"\xab" * n),
)
_message = st.tuples(st.just("m"), _ids, _bodies, st.integers(-2**63, 2**63 - 1),
                     st.integers(0, 65535))
_other = st.one_of(
    st.just(("o", FRAME_TYPE_RESPONSE, b"_heartbeat_")),
    st.tuples(st.just("o"), st.just(FRAME_TYPE_RESPONSE), st.binary(max_size=20)),
    st.tuples(st.just("o"), st.just(FRAME_TYPE_ERROR), st.binary(max_size=30)),
)
_frames = st.lists(st.one_of(_message, _message, _message, _other), max_size=60)


def encode(frames: list[tuple]) -> bytes:
    out = []
    for f in frames:
        if f[0] == "m":
            _, i, body, ts, att = f
            out.append(encode_message_frame(i, body, ts, att))
        else:
            out.append(encode_frame(f[1], f[2]))
    return b"".join(out)


def chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in zip(points, points[1:])] or [b""]


@given(_frames, st.lists(st.integers(0, 10**7), max_size=12))
@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
def test_feed_blocks_matches_feed(frames: list[tuple], cuts: list[int]) -> None:
    data = encode(frames)
    chunks = chunked(data, cuts)
    r = Responder("127.0.0.1:4150")
    dec_m = FrameDecoder(r, max_frame_size=1 << 20)
    dec_b = FrameDecoder(r, max_frame_size=1 << 20)
    msgs, others_m, others_b = [], [], []
    calls: list[list[MessageBlock]] = []
    for c in chunks:
        m, o = dec_m.feed(c)
        msgs += m
        others_m += o
        # bytes, bytearray and memoryview are all accepted, as by feed
        b, o = dec_b.feed_blocks(memoryview(c) if len(c) % 2 else bytearray(c))
        calls.append(b)
        others_b += o
    assert dec_m.buffered == dec_b.buffered == 0
    want_msgs = [f[1:] for f in frames if f[0] == "m"]
    want_others = [f[1:] for f in frames if f[0] == "o"]
    assert [(m.id, m.body, m.timestamp, m.attempts) for m in msgs] == \
        [(i, body, ts, att) for i, body, ts, att in want_msgs]
    assert others_m == others_b == want_others

    # the blocks hold the same messages, in order
    blocks = [b for call in calls for b in call]
    from_blocks = [m for b in blocks for m in b.messages()]
    assert fields_of(from_blocks) == fields_of(msgs)
    assert [i for b in blocks for i in b.ids()] == [m.id for m in msgs]
    assert [a for b in blocks for a in b.attempts()] == [m.attempts for m in msgs]
    assert all(m.nsqd_address == "127.0.0.1:4150" for m in from_blocks)

    # where each message sits among all frames: blocks never span a non-message frame,
    # and two blocks of one call are split by one
    where = [k for k, f in enumerate(frames) if f[0] == "m"]
    k = 0
    for call in calls:
        prev_last = None
        for b in call:
            assert len(b) >= 1 and b.responder is r and not b._responded
            first, last = where[k], where[k + len(b) - 1]
            assert last - first == len(b) - 1, "a block spans a non-message frame"
            if prev_last is not None:
                assert first > prev_last + 1, "two blocks of one read with no frame between"
            prev_last = last
            # decoded blocks: max_attempts is exact
            assert b.max_attempts == max(b.attempts())
            # each frame is exactly the encoded frame, at the recorded offsets
            assert len(b.offsets) == len(b) + 1 and b.offsets.typecode == "i"
            for j in range(len(b)):
                f = frames[where[k + j]]
                assert b.data[b.offsets[j]:b.offsets[j + 1]] == encode([f])
            assert b.fin_commands() == expected_fins(b)
            k += len(b)
    assert k == len(msgs)


def _corrupt_frames() -> list[tuple[str, bytes]]:
    return [
        ("unknown frame type", struct.pack(">ii", 8, 3) + b"abcd"),
        ("size below 4", struct.pack(">i", 3) + b"abcdefgh"),
        ("negative size", struct.pack(">i", -5) + b"abcdefgh"),
        ("short message frame", struct.pack(">ii", 12, 2) + b"12345678"),
        ("size over the limit", struct.pack(">ii", (1 << 20) + 1, 1) + b"x" * 40),
        ("message over the limit", struct.pack(">ii", 2**31 - 1, 2) + b"x" * 40),
    ]


@pytest.mark.parametrize("label,bad", _corrupt_frames(), ids=[c[0] for c in _corrupt_frames()])
@given(before=_frames, cuts=st.lists(st.integers(0, 10**7), max_size=6))
@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
def test_corrupt_streams_raise_from_both(label: str, bad: bytes, before: list[tuple],
                                         cuts: list[int]) -> None:
    data = encode(before) + bad + HEARTBEAT
    chunks = chunked(data, cuts)

    def first_error(feed) -> int:
        for n, c in enumerate(chunks):
            try:
                feed(c)
            except ProtocolError:
                return n
        return -1

    at_m = first_error(FrameDecoder(max_frame_size=1 << 20).feed)
    at_b = first_error(FrameDecoder(max_frame_size=1 << 20).feed_blocks)
    assert at_m != -1, f"feed accepted a stream with a {label}"
    assert at_b == at_m, f"feed_blocks raised at chunk {at_b}, feed at {at_m}"


def test_heartbeat_between_messages_splits_the_block() -> None:
    m = [encode_message_frame(mid(i), b"b%d" % i, i, i + 1) for i in range(5)]
    data = m[0] + m[1] + HEARTBEAT + m[2] + encode_frame(FRAME_TYPE_ERROR, b"E_FIN_FAILED x") \
        + m[3] + m[4]
    blocks, others = FrameDecoder().feed_blocks(data)
    assert [b.ids() for b in blocks] == [[mid(0), mid(1)], [mid(2)], [mid(3), mid(4)]]
    assert [b.max_attempts for b in blocks] == [2, 3, 5]
    assert others == [(FRAME_TYPE_RESPONSE, b"_heartbeat_"),
                      (FRAME_TYPE_ERROR, b"E_FIN_FAILED x")]
    assert all(b.data is data for b in blocks)  # one buffer shared by the read's blocks


def test_partial_frames_wait_for_the_rest() -> None:
    frame = encode_message_frame(mid(1), b"hello", 5, 2)
    dec = FrameDecoder()
    for i in range(len(frame) - 1):
        assert dec.feed_blocks(frame[i:i + 1]) == ([], [])
    blocks, others = dec.feed_blocks(frame[-1:])
    assert others == [] and [b.ids() for b in blocks] == [[mid(1)]]
    assert blocks[0].data[blocks[0].offsets[0]:] == frame
    assert dec.buffered == 0
    assert dec.feed_blocks(b"") == ([], [])


def test_block_built_by_hand_from_offsets() -> None:
    # the documented layout is enough to build a block: frames back to back + boundaries
    frames = [encode_message_frame(mid(i), b"x" * i, 10 + i, 3) for i in range(3)]
    data = b"".join(frames)
    offsets = array("i", [0])
    for f in frames:
        offsets.append(offsets[-1] + len(f))
    b = MessageBlock(data, offsets, 3)
    assert fields_of(b.messages()) == [(mid(i), b"x" * i, 10 + i, 3) for i in range(3)]
    assert b.nsqd_address is None and len(b) == 3


# -- ConnectionConfig bounds ----------------------------------------------------------------


@pytest.mark.parametrize("value", [4096, 65536, 1 << 28])
def test_read_size_accepted(value: int) -> None:
    assert ConnectionConfig(read_size=value).read_size == value


@pytest.mark.parametrize("value", [4095, 0, -1, (1 << 28) + 1, 1 << 31, 4096.0, "4096", None])
def test_read_size_rejected(value) -> None:
    with pytest.raises(ConfigError, match="read_size"):
        ConnectionConfig(read_size=value)


@pytest.mark.parametrize("value", [64, 1 << 20, 1 << 30])
def test_max_frame_size_accepted(value: int) -> None:
    assert ConnectionConfig(max_frame_size=value).max_frame_size == value


@pytest.mark.parametrize("value", [63, 0, -1, (1 << 30) + 1, 1 << 31, 1e6, "1048576", None])
def test_max_frame_size_rejected(value) -> None:
    with pytest.raises(ConfigError, match="max_frame_size"):
        ConnectionConfig(max_frame_size=value)


def test_bounds_also_apply_through_from_options() -> None:
    with pytest.raises(ConfigError, match="read_size"):
        ConnectionConfig.from_options(read_size=1 << 29)
    with pytest.raises(ConfigError, match="max_frame_size"):
        ConnectionConfig().replace(max_frame_size=32)
