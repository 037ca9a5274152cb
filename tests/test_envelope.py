"""The body envelope (nsq_spark.envelope): publish ids, checked opening, no cut bodies."""

from __future__ import annotations

import hashlib
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsq_spark.envelope import (ENVELOPE_MAGIC, PUBLISH_ENVELOPE_MAGIC, PUBLISH_ID_SIZE,
                                PublishIds, by_envelope_digest, open_body, open_envelope,
                                publish_id_for, stamp, stamp_many, with_trace, wrap_envelope)
from nsq_spark.message import Message

pytestmark = pytest.mark.unit

PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
PID = bytes(range(16))
bodies = st.binary(min_size=0, max_size=300)


def digest(body: bytes) -> bytes:
    return hashlib.blake2b(body, digest_size=16).digest()


@given(bodies, st.binary(min_size=16, max_size=16), st.booleans())
def test_a_stamped_body_opens_to_itself_and_its_publish_id(body: bytes, pid: bytes,
                                                            traced: bool) -> None:
    wire = stamp(body, pid, PARENT if traced else None, "k=v" if traced else None)
    e = open_body(wire)
    assert (e.version, e.body, e.publish_id, e.damaged) == (3, body, pid, None)
    assert (e.traceparent, e.tracestate) == ((PARENT, "k=v") if traced else (None, None))


@settings(max_examples=50)
@given(st.binary(min_size=1, max_size=64), st.booleans(), st.integers(0, 2))
def test_no_cut_envelope_of_any_version_is_ever_opened_into_a_cut_body(
        body: bytes, traced: bool, version: int) -> None:
    if version == 0:
        wire = stamp(body, PID, PARENT if traced else None)
    else:
        wire = wrap_envelope(body, PARENT if version == 2 else None)
    for cut in range(len(wire)):
        part = wire[:cut]
        e = open_body(part)
        # whole, or (by chance: the inner body was cut off entirely with a match) nothing
        # taken from it that is not in the original
        assert e.body == part, (version, cut)
        assert e.publish_id is None and e.digest is None
        if part[:4] == b"\x00NID" and len(part) > 4:
            assert e.damaged


def test_a_forged_digest_or_checksum_is_never_a_key_nor_opened() -> None:
    genuine = wrap_envelope(b"genuine")
    forged = ENVELOPE_MAGIC + digest(b"genuine") + b"something else"
    e = open_body(forged)
    assert e.body == forged and e.digest is None and "digest" in (e.damaged or "")
    assert open_envelope(forged) == (None, forged)
    # the dedup key of the forgery is the digest of its whole bytes, not the genuine one's
    assert by_envelope_digest(Message(b"1" * 16, forged, 0, 1)) == digest(forged)
    assert by_envelope_digest(Message(b"2" * 16, genuine, 0, 1)) == digest(b"genuine")
    v3 = bytearray(stamp(b"payload", PID))
    v3[-1] ^= 1   # one bit of the body
    e3 = open_body(bytes(v3))
    assert e3.publish_id is None and e3.body == bytes(v3) and "CRC-32" in (e3.damaged or "")


def test_a_truncated_message_id_envelope_is_whole_not_a_cut_body() -> None:
    wire = wrap_envelope(b"inner-value")[:-3]   # the issue's b'inner-va'
    assert open_envelope(wire) == (None, wire)
    assert open_body(wire).damaged


def test_equal_bytes_published_twice_carry_two_ids_and_a_key_carries_one() -> None:
    ids = PublishIds()
    a, b = stamp(b"click", ids.new()), stamp(b"click", ids.new())
    assert open_body(a).publish_id != open_body(b).publish_id
    assert publish_id_for("order-1") == publish_id_for(b"order-1") != publish_id_for("order-2")
    assert len(publish_id_for("x")) == PUBLISH_ID_SIZE
    with pytest.raises(ValueError, match="may not be empty"):
        publish_id_for("")
    with pytest.raises(TypeError, match="bytes or str"):
        publish_id_for(12)  # type: ignore[arg-type]


def test_restamping_keeps_the_publish_a_body_already_carries() -> None:
    first = stamp(b"x", PID)
    assert stamp(first, bytes(16)) == first                       # a relay keeps the id
    traced = with_trace(first, PARENT)
    e = open_body(traced)
    assert (e.publish_id, e.body, e.traceparent) == (PID, b"x", PARENT)
    assert with_trace(traced, "00-" + "1" * 32 + "-" + "2" * 16 + "-01") == traced
    # a version-1 envelope is opened and restamped; its content stays
    assert open_body(stamp(wrap_envelope(b"y"), PID)).body == b"y"
    # a plain body gets version 2 from with_trace, as before
    assert open_body(with_trace(b"z", PARENT)).version == 2
    assert wrap_envelope(first) == first


def test_stamp_many_writes_what_stamp_writes() -> None:
    ids = PublishIds().many(3)
    plain = [b"a", b"bb", stamp(b"c", PID)]
    assert stamp_many(plain, ids) == [stamp(b, i) for b, i in zip(plain, ids)]
    with pytest.raises(ValueError, match="16 bytes"):
        stamp(b"x", b"short")


def test_publish_ids_are_unique_across_calls_threads_and_a_fork() -> None:
    ids = PublishIds()
    got = {ids.new() for _ in range(1000)} | set(ids.many(1000))
    assert len(got) == 2000
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.write(w, ids.new())
        os._exit(0)
    os.close(w)
    child = os.read(r, 16)
    os.close(r)
    os.waitpid(pid, 0)
    mine = ids.new()
    assert len(child) == 16 and child[:8] != mine[:8] and child not in got


def test_a_later_version_or_a_plain_body_passes_as_it_is() -> None:
    for body in (b"\x00NID\x09whatever", b"plain", b"", b"\x00NI"):
        e = open_body(body)
        assert (e.body, e.version, e.damaged) == (body, 0, None)
    assert PUBLISH_ENVELOPE_MAGIC == b"\x00NID\x03"


def test_a_body_that_only_starts_like_an_envelope_is_wrapped_and_comes_back_whole() -> None:
    for raw in (b"\x00NID\x03", b"\x00NID\x01" + bytes(16) + b"x", b"\x00NID\x02\x00"):
        for wire in (wrap_envelope(raw), wrap_envelope(raw, PARENT), stamp(raw, PID)):
            assert open_body(wire).body == raw
