"""The Spark source's ``publish_id`` column: publish envelopes opened column-wise by the
one envelope rule (damaged ones whole, with no id), from MessageBlocks and from Messages
alike, and the ids as keys. No Spark, no sockets."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pa = pytest.importorskip("pyarrow")
np = pytest.importorskip("numpy")

from nsq_spark import envelope  # noqa: E402
from conn_helpers import message_blocks  # noqa: E402
from nsq_spark.spark._schema import (arrow_schema, blocks_to_batch,  # noqa: E402
                                    messages_to_batch, open_envelopes)
from nsq_spark.spark._seen import pid_keys  # noqa: E402

pytestmark = pytest.mark.unit

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
PID = bytes(range(16))


blocks = message_blocks


def both(bodies: list[bytes]):
    bs = blocks(bodies)
    return (blocks_to_batch(bs, "t", "c"),
            messages_to_batch([m for b in bs for m in b.messages()], "t", "c"))


def damaged(body: bytes) -> bytes:
    out = bytearray(body)
    out[-1] ^= 0x40
    return bytes(out)


def test_published_bodies_are_opened_and_their_id_is_a_column_from_blocks_and_messages():
    stamped = [envelope.stamp(b"one", PID), envelope.stamp(b"", bytes(16))]
    for rb in both([stamped[0], b"plain", stamped[1]]):
        assert rb.schema == arrow_schema()
        assert rb.column("body").to_pylist() == [b"one", b"plain", b""]
        assert rb.column("publish_id").to_pylist() == [PID, None, bytes(16)]
        assert rb.column("trace_parent").null_count == 3


def test_a_traced_publish_gives_its_trace_parent_and_any_extension_is_read_row_wise():
    bodies = [envelope.stamp(b"a", PID, PARENT), envelope.stamp(b"b", PID, PARENT, "k=v"),
              envelope.wrap_envelope(b"c", PARENT), envelope.stamp(b"d", PID), b"e"]
    for rb in both(bodies):
        assert rb.column("body").to_pylist() == [b"a", b"b", b"c", b"d", b"e"]
        assert rb.column("trace_parent").to_pylist() == [PARENT, PARENT, PARENT, None, None]
        assert rb.column("publish_id").to_pylist() == [PID, PID, None, PID, None]


def test_a_damaged_publish_envelope_is_the_whole_body_and_no_id():
    good = envelope.stamp(b"payload", PID)
    cut = good[:20]
    bad_crc = damaged(good)
    long_ext = good[:25] + b"\xff\xff" + good[27:]  # an extension past the end
    for rb in both([good, cut, bad_crc, long_ext]):
        assert rb.column("body").to_pylist() == [b"payload", cut, bad_crc, long_ext]
        assert rb.column("publish_id").to_pylist() == [PID, None, None, None]


def test_a_topic_without_envelopes_gets_null_columns_and_its_bodies_untouched():
    bodies = [b"a", b"\x00zero first", b"x" * 300]
    rb = blocks_to_batch(blocks(bodies), "t", "c")
    assert rb.column("body").to_pylist() == bodies
    assert rb.column("publish_id").null_count == 3


fragments = st.sampled_from([b"", b"\x00", b"\x00NID", b"\x00NID\x03", b"\x00NID\x02",
                             b"\x00NID\x01", PID, b"\x80\xff", b"\x00\x39", b"x" * 7])


@st.composite
def any_body(draw) -> bytes:
    kind = draw(st.integers(0, 5))
    inner = b"".join(draw(st.lists(fragments, max_size=4)))
    if kind == 0:
        return envelope.stamp(inner, draw(st.binary(min_size=16, max_size=16)))
    if kind == 1:
        return envelope.stamp(inner, PID, PARENT, draw(st.sampled_from([None, "a=b"])))
    if kind == 2:
        return envelope.wrap_envelope(inner, draw(st.sampled_from([None, PARENT])))
    if kind == 3:  # an envelope with a byte changed or cut off
        body = envelope.stamp(inner, PID)
        at = draw(st.integers(0, len(body) - 1))
        return draw(st.sampled_from([body[:at], body[:at] + bytes([body[at] ^ 1])
                                     + body[at + 1:]]))
    return inner


@settings(deadline=None, max_examples=150)
@given(st.lists(any_body(), min_size=1, max_size=12))
def test_the_columns_say_what_open_body_says_row_by_row(bodies):
    col = pa.array(bodies, pa.binary())
    body, parents, pids = open_envelopes(col)
    for i, raw in enumerate(bodies):
        e = envelope.open_body(raw)
        opened = e.version in (2, 3)  # version 1 stays in the body, as before
        assert body[i].as_py() == (e.body if opened else raw)
        assert pids[i].as_py() == e.publish_id
        assert parents[i].as_py() == (e.traceparent if opened else None)


def test_publish_ids_as_keys_of_a_slice_with_nulls_and_odd_lengths():
    col = pa.array([PID, None, bytes(16), b"short", PID[::-1]], pa.binary()).slice(1)
    keys, valid = pid_keys(col)
    assert valid.tolist() == [False, True, False, True]
    assert keys[3].tobytes() == PID[::-1] and keys[1].tobytes() == bytes(16)
    keys, valid = pid_keys(pa.chunked_array([pa.array([PID], pa.binary()),
                                             pa.nulls(2, pa.binary())]))
    assert valid.tolist() == [True, False, False] and keys[0].tobytes() == PID
