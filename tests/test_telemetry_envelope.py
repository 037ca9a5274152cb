"""The traced message-id envelope (version 2): what it carries, that every reader of the
envelope gets the same inner body and digest from both versions, and that damaged or
foreign bytes never lose a body. Sans-IO: no sockets."""

from __future__ import annotations

import hashlib
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nsq_spark.dedup import by_body_digest
from nsq_spark.spool._format import (ENVELOPE_MAGIC, MAX_TRACE_FIELD, TRACED_ENVELOPE_MAGIC,
                                    by_envelope_digest, open_envelope, open_traced_envelope,
                                    wrap_envelope)

pytestmark = pytest.mark.unit

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


class Msg:
    def __init__(self, body: bytes) -> None:
        self.body = body


def digest(body: bytes) -> bytes:
    return hashlib.blake2b(body, digest_size=16).digest()


def test_a_traceparent_makes_a_version_2_envelope_that_carries_it_and_the_state():
    wire = wrap_envelope(b"payload", PARENT, "vendor=abc")
    assert wire.startswith(TRACED_ENVELOPE_MAGIC)
    opened = open_traced_envelope(wire)
    assert opened == (digest(b"payload"), b"payload", PARENT, "vendor=abc")


def test_without_a_traceparent_the_envelope_is_version_1_as_before():
    wire = wrap_envelope(b"payload")
    assert wire == ENVELOPE_MAGIC + digest(b"payload") + b"payload"
    assert open_traced_envelope(wire) == (digest(b"payload"), b"payload", None, None)


def test_open_envelope_and_the_dedup_key_agree_on_both_versions():
    body = b'{"event": 1}'
    for wire in (wrap_envelope(body), wrap_envelope(body, PARENT), wrap_envelope(body, PARENT, "a=b")):
        assert open_envelope(wire) == (digest(body), body)
        assert by_envelope_digest(Msg(wire)) == by_body_digest(Msg(body)) == digest(body)


def test_a_tracestate_over_255_bytes_is_left_out_and_the_traceparent_kept():
    wire = wrap_envelope(b"x", PARENT, "k=" + "v" * MAX_TRACE_FIELD)
    assert open_traced_envelope(wire) == (digest(b"x"), b"x", PARENT, None)


def test_a_traceparent_over_255_bytes_is_refused_naming_the_field():
    with pytest.raises(ValueError, match="traceparent is 300 bytes"):
        wrap_envelope(b"x", "0" * 300)


def test_an_already_enveloped_body_is_not_wrapped_twice():
    once = wrap_envelope(b"x", PARENT)
    assert wrap_envelope(once) == once and wrap_envelope(once, PARENT) == once
    v1 = wrap_envelope(b"x")
    assert wrap_envelope(v1, PARENT) == v1


def test_unknown_extension_fields_are_skipped():
    ext = bytes((9, 3)) + b"new" + bytes((1, len(PARENT))) + PARENT.encode()
    wire = TRACED_ENVELOPE_MAGIC + digest(b"b") + struct.pack(">H", len(ext)) + ext + b"b"
    assert open_traced_envelope(wire) == (digest(b"b"), b"b", PARENT, None)


def test_a_version_2_prefix_with_a_cut_extension_is_a_plain_body():
    wire = TRACED_ENVELOPE_MAGIC + digest(b"b") + struct.pack(">H", 500) + b"short"
    assert open_traced_envelope(wire) == (None, wire, None, None)
    assert open_envelope(wire) == (None, wire)


@given(body=st.binary(max_size=300),
       parent=st.none() | st.text(st.characters(min_codepoint=32, max_codepoint=126),
                                  min_size=1, max_size=MAX_TRACE_FIELD),
       state=st.none() | st.text(st.characters(min_codepoint=32, max_codepoint=126),
                                 max_size=300))
def test_any_body_comes_back_whole_with_its_digest_and_context(body, parent, state):
    if body[:5] in (ENVELOPE_MAGIC, TRACED_ENVELOPE_MAGIC):
        body = b"p" + body   # an enveloped body is passed through on purpose (tested above)
    opened = open_traced_envelope(wrap_envelope(body, parent, state))
    assert opened.body == body and opened.digest == digest(body)
    assert opened.traceparent == parent
    kept = parent is not None and bool(state) and len(state) <= MAX_TRACE_FIELD
    assert opened.tracestate == (state if kept else None)


@given(st.binary(max_size=200))
def test_any_bytes_open_without_error_and_plain_bodies_stay_plain(raw):
    wire = TRACED_ENVELOPE_MAGIC + raw
    opened = open_traced_envelope(wire)
    if opened.digest is None:   # not a whole envelope: the body is every byte received
        assert opened.body == wire and opened.traceparent is None
    else:   # a whole one: digest, extension and inner body are the bytes, in order
        assert len(opened.digest) == 16 and wire.endswith(opened.body)
    plain = b"plain " + raw
    assert open_traced_envelope(plain) == (None, plain, None, None)
