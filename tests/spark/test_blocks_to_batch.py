"""blocks_to_batch (the fetch path: Arrow columns cut from the bytes received) must give the
very record batch that messages_to_batch gives for the same messages."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pa = pytest.importorskip("pyarrow")
pytest.importorskip("numpy")

from nsq_spark.protocol import (FRAME_TYPE_RESPONSE, FrameDecoder,  # noqa: E402
                                MessageBlock, encode_frame, encode_message_frame)
from nsq_spark.spark._schema import arrow_schema, blocks_to_batch, messages_to_batch  # noqa: E402

pytestmark = pytest.mark.unit

T, C = "topic_t", "chan_c"
HEARTBEAT = encode_frame(FRAME_TYPE_RESPONSE, b"_heartbeat_")


class Responder:
    def __init__(self, address: str) -> None:
        self.address = address


def frames_of(rows: list[tuple]) -> bytes:
    return b"".join(encode_message_frame(*r) for r in rows)


def decode(data: bytes, responder) -> list[MessageBlock]:
    blocks, _ = FrameDecoder(responder).feed_blocks(data)
    return blocks


def assert_parity(blocks: list[MessageBlock]) -> "pa.RecordBatch":
    got = blocks_to_batch(blocks, T, C)
    want = messages_to_batch([m for b in blocks for m in b.messages()], T, C)
    got.validate(full=True)
    assert got.schema == want.schema == arrow_schema()
    assert got.num_rows == want.num_rows == sum(map(len, blocks))
    for name in arrow_schema().names:  # column by column first: a readable failure
        assert got.column(name).to_pylist() == want.column(name).to_pylist(), name
    assert got.equals(want)
    return got


def rows(n: int, start: int = 0, attempts: int = 1) -> list[tuple]:
    return [(b"%016d" % i, b"body-%d" % i, 1_700_000_000_123_456_789 + 1001 * i, attempts)
            for i in range(start, start + n)]


def test_one_block() -> None:
    rb = assert_parity(decode(frames_of(rows(50)), Responder("127.0.0.1:4150")))
    assert rb.column("id").to_pylist()[:2] == ["0000000000000000", "0000000000000001"]
    assert rb.column("body").to_pylist()[-1] == b"body-49"
    assert set(rb.column("nsqd_address").to_pylist()) == {"127.0.0.1:4150"}
    assert set(rb.column("topic").to_pylist()) == {T}
    assert set(rb.column("channel").to_pylist()) == {C}
    # nanoseconds from nsqd, microseconds for Spark
    assert rb.column("timestamp").cast(pa.int64()).to_pylist()[0] == 1_700_000_000_123_456


def test_several_blocks_from_two_nsqds() -> None:
    a, b = Responder("127.0.0.1:4150"), Responder("127.0.0.1:4151")
    blocks = decode(frames_of(rows(10)), a) + decode(frames_of(rows(5, 100)), b) \
        + decode(frames_of(rows(3, 200)), a)
    rb = assert_parity(blocks)
    assert rb.column("nsqd_address").to_pylist() == \
        ["127.0.0.1:4150"] * 10 + ["127.0.0.1:4151"] * 5 + ["127.0.0.1:4150"] * 3


def test_block_split_by_a_heartbeat_and_split_and_selected_blocks() -> None:
    r = Responder("h:1")
    data = frames_of(rows(4)) + HEARTBEAT + frames_of(rows(6, 10))
    blocks = decode(data, r)
    assert [len(b) for b in blocks] == [4, 6]
    assert blocks[1].offsets[0] > 0  # offsets not starting at 0 reach Arrow as they are
    assert_parity(blocks)
    head, tail = blocks[1].split(2)
    assert_parity([tail, head])
    assert_parity(blocks[1].select([True, False, True, True, False, True]))
    assert_parity([tail])


def test_empty_bodies_and_extreme_fields() -> None:
    r = Responder("x:9")
    data = frames_of([
        (b"a" * 16, b"", 0, 1),
        (b"b" * 16, b"", 1_999, 65535),  # attempts at its 16-bit maximum
        (b"c" * 16, b"\x00\xff" * 40, -1_500, 0),  # a negative timestamp rounds as //
        (b"d" * 16, b"", 2**63 - 1, 65534),
    ])
    rb = assert_parity(decode(data, r))
    assert rb.column("attempts").to_pylist() == [1, 65535, 0, 65534]
    assert rb.column("body").to_pylist()[:2] == [b"", b""]


def test_no_blocks_and_unknown_address() -> None:
    assert_parity([])
    rb = assert_parity(decode(frames_of(rows(3)), None))
    assert rb.column("nsqd_address").to_pylist() == [None, None, None]


def test_large_bodies() -> None:
    data = frames_of([(b"%016d" % i, bytes([i]) * (100_000 + i), i, 2) for i in range(5)])
    rb = assert_parity(decode(data, Responder("big:1")))
    assert [len(b) for b in rb.column("body").to_pylist()] == [100_000 + i for i in range(5)]


def test_non_utf8_id_raises() -> None:
    bad = b"\xff\xfe" + b"0" * 14
    data = frames_of(rows(2) + [(bad, b"x", 1, 1)] + rows(2, 10))
    blocks = decode(data, Responder("h:1"))
    with pytest.raises(pa.ArrowInvalid):
        blocks_to_batch(blocks, T, C)
    with pytest.raises(pa.ArrowInvalid):  # the messages path agrees
        messages_to_batch([m for b in blocks for m in b.messages()], T, C)
    # the block without the bad frame converts
    ok = [x for b in blocks for x in b.select([i != 2 for i in range(len(b))])]
    assert_parity(ok)


_row = st.tuples(st.text("0123456789abcdef", min_size=16, max_size=16).map(str.encode),
                 st.binary(max_size=50), st.integers(-2**63, 2**63 - 1),
                 st.integers(0, 65535))


@given(st.lists(st.tuples(st.lists(_row, min_size=0, max_size=20), st.sampled_from(
    ["127.0.0.1:4150", "127.0.0.1:4151", None]), st.booleans()), max_size=6))
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_parity_property(groups: list[tuple[list[tuple], str | None, bool]]) -> None:
    blocks: list[MessageBlock] = []
    for group, address, heartbeat in groups:
        data = frames_of(group)
        if heartbeat and len(group) > 1:  # a heartbeat in the middle: two blocks
            half = len(group) // 2
            data = frames_of(group[:half]) + HEARTBEAT + frames_of(group[half:])
        blocks += decode(data, Responder(address) if address else None)
    assert_parity(blocks)
