"""The sans-IO handshake: bytes in, actions out, typed errors; no sockets here.

A scripted nsqd answers with the frames a real one sends; the test plays the IO loop,
honouring ``read_size`` (exact reads before a codec, any split after it)."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsq_spark import errors, protocol
from nsq_spark.config import ConnectionConfig
from nsq_spark._handshake import (HTTP_PORT_HINT, Action, ConnState, Done, Handshake,
                                 InstallCodec, SendBytes, StartTLS)

pytestmark = pytest.mark.unit

OK = protocol.encode_frame(protocol.FRAME_TYPE_RESPONSE, protocol.OK)
HEARTBEAT = protocol.encode_frame(protocol.FRAME_TYPE_RESPONSE, protocol.HEARTBEAT)


def response(data: bytes | dict[str, Any]) -> bytes:
    if isinstance(data, dict):
        data = json.dumps(data).encode()
    return protocol.encode_frame(protocol.FRAME_TYPE_RESPONSE, data)


def error(text: bytes) -> bytes:
    return protocol.encode_frame(protocol.FRAME_TYPE_ERROR, text)


def identify_answer(**fields: Any) -> dict[str, Any]:
    """What nsqd 1.3.0 answers, with some fields changed."""
    answer: dict[str, Any] = {
        "max_rdy_count": 2500, "version": "1.3.0", "max_msg_timeout": 900000,
        "msg_timeout": 60000, "tls_v1": False, "deflate": False, "deflate_level": 0,
        "max_deflate_level": 6, "snappy": False, "sample_rate": 0, "auth_required": False,
        "output_buffer_size": 16384, "output_buffer_timeout": 250}
    answer.update(fields)
    return answer


def feed_counting(hs: Handshake, stream: bytes, pieces: list[int] | None
                  ) -> tuple[list[Action], int]:
    """Like feed, and how many bytes were fed."""
    actions: list[Action] = []
    pos = 0
    sizes = iter(pieces or [])
    while pos < len(stream) and not hs.done:
        n = hs.read_size
        if n is None:
            n = next(sizes, len(stream) - pos) or 1
        actions += hs.receive_data(stream[pos:pos + n])
        pos += n
    return actions, min(pos, len(stream))


def feed(hs: Handshake, stream: bytes, pieces: list[int] | None = None) -> list[Action]:
    """Play the IO loop over ``stream`` (what nsqd sends, decompressed): exact reads while
    ``read_size`` asks for them, else pieces of the given sizes. Returns every action."""
    return feed_counting(hs, stream, pieces)[0]


def kinds(actions: list[Action]) -> list[str]:
    return [type(a).__name__ for a in actions]


# -- the order of the steps, for every feature combination ------------------------------

@pytest.mark.parametrize("tls", [False, True])
@pytest.mark.parametrize("codec", [None, "snappy", "deflate"])
@pytest.mark.parametrize("auth", [False, True])
def test_every_feature_combination_runs_the_steps_in_nsqs_order(
        tls: bool, codec: str | None, auth: bool) -> None:
    cfg = ConnectionConfig(tls_v1=tls, snappy=codec == "snappy", deflate=codec == "deflate",
                           auth_secret="s3cret" if auth else None, client_id="c", hostname="h")
    hs = Handshake(cfg, "127.0.0.1", 4150)
    first = hs.initial_bytes()
    assert first.startswith(protocol.MAGIC_V2 + b"IDENTIFY\n")
    sent = json.loads(first[len(protocol.MAGIC_V2) + 13:])
    assert sent["tls_v1"] is tls and sent["snappy"] is (codec == "snappy")
    answer = identify_answer(tls_v1=tls, snappy=codec == "snappy", deflate=codec == "deflate",
                             deflate_level=6 if codec == "deflate" else 0, auth_required=auth)
    stream = response(answer)
    expected = []
    if tls:
        stream += OK
        expected.append("StartTLS")
    if codec:
        stream += OK
        expected.append("InstallCodec")
    if auth:
        stream += response({"identity": "tester", "permission_count": 1})
        expected.append("SendBytes")
    actions = feed(hs, stream)
    assert kinds(actions) == expected + ["Done"]
    assert hs.done
    done = actions[-1]
    assert isinstance(done, Done) and done.frames == []
    n = done.negotiated
    assert (n.tls, n.snappy, n.deflate, n.auth_required) == (
        tls, codec == "snappy", codec == "deflate", auth)
    assert n.identify_response == answer and n.nsqd_version == "1.3.0"
    if auth:
        assert n.auth_response == {"identity": "tester", "permission_count": 1}
        auth_cmd = next(a for a in actions if isinstance(a, SendBytes))
        assert auth_cmd.data == protocol.auth("s3cret")


def test_reads_are_exact_until_a_codec_is_installed() -> None:
    hs = Handshake(ConnectionConfig(snappy=True), "h", 1)
    frame = response(identify_answer(snappy=True))
    assert hs.read_size == 4
    assert hs.receive_data(frame[:4]) == []
    assert hs.read_size == len(frame) - 4
    assert hs.receive_data(frame[4:]) == [InstallCodec("snappy", 0)]
    assert hs.read_size is None  # compressed from here: any amount, decompressed by the IO


def test_tls_verifies_the_configured_server_name_or_the_host() -> None:
    answer = response(identify_answer(tls_v1=True))
    hs = Handshake(ConnectionConfig(tls_v1=True), "nsqd.example", 4150)
    assert feed(hs, answer) == [StartTLS("nsqd.example")]
    hs = Handshake(ConnectionConfig(tls_v1=True, tls_server_hostname="other"), "10.0.0.1", 1)
    assert feed(hs, answer) == [StartTLS("other")]


def test_bytes_read_past_an_upgrade_are_refused_not_misread() -> None:
    hs = Handshake(ConnectionConfig(snappy=True), "h", 1)
    with pytest.raises(errors.ProtocolError, match="read exactly read_size"):
        hs.receive_data(response(identify_answer(snappy=True)) + b"\xff\x06\x00")


# -- what nsqd decided ----------------------------------------------------------------------

def test_refused_compression_falls_back_to_plain_with_a_warning(caplog: Any) -> None:
    hs = Handshake(ConnectionConfig(snappy=True), "h", 1)
    with caplog.at_level(logging.WARNING, logger="nsq_spark.handshake"):
        actions = feed(hs, response(identify_answer(snappy=False)))
    assert kinds(actions) == ["Done"]
    assert "snappy requested but nsqd refused it" in caplog.text


@pytest.mark.parametrize("answered, installed", [(3, 3), (0, 9)])
def test_deflate_level_is_nsqds_clamped_one_else_ours(answered: int, installed: int) -> None:
    hs = Handshake(ConnectionConfig(deflate=True, deflate_level=9), "h", 1)
    actions = feed(hs, response(identify_answer(deflate=True, deflate_level=answered)) + OK)
    assert actions[0] == InstallCodec("deflate", installed)


def test_nsqd_limits_are_obeyed() -> None:
    hs = Handshake(ConnectionConfig(), "h", 1)
    done = feed(hs, response(identify_answer(max_rdy_count=7, msg_timeout=1500,
                                             output_buffer_timeout=-1)))[-1]
    assert isinstance(done, Done)
    n = done.negotiated
    assert (n.max_rdy_count, n.msg_timeout, n.output_buffer_timeout) == (7, 1500, -1)


def test_without_feature_negotiation_ok_means_nsqds_defaults() -> None:
    hs = Handshake(ConnectionConfig(feature_negotiation=False), "h", 1)
    done = feed(hs, OK)[-1]
    assert isinstance(done, Done)
    assert done.negotiated.max_rdy_count == 2500 and not done.negotiated.tls


def test_tls_asked_but_not_offered_is_a_tls_error() -> None:
    hs = Handshake(ConnectionConfig(tls_v1=True), "h", 1)
    with pytest.raises(errors.TLSError, match="does not offer TLS"):
        feed(hs, response(identify_answer(tls_v1=False)))


def test_auth_required_without_a_secret_is_an_auth_error() -> None:
    hs = Handshake(ConnectionConfig(), "h", 1)
    with pytest.raises(errors.AuthError, match="set the auth_secret"):
        feed(hs, response(identify_answer(auth_required=True)))


def test_a_secret_nsqd_does_not_ask_for_is_not_sent(caplog: Any) -> None:
    hs = Handshake(ConnectionConfig(auth_secret="s3cret"), "h", 1)
    with caplog.at_level(logging.WARNING, logger="nsq_spark.handshake"):
        actions = feed(hs, response(identify_answer()))
    assert kinds(actions) == ["Done"]
    assert "not sent" in caplog.text and "s3cret" not in caplog.text


@pytest.mark.parametrize("frame, exc", [
    (error(b"E_BAD_BODY IDENTIFY failed"), errors.BadBodyError),
    (error(b"E_IDENTIFY_FAILED no"), errors.IdentifyFailedError),
])
def test_error_frames_become_their_typed_errors(frame: bytes, exc: type) -> None:
    with pytest.raises(exc):
        feed(Handshake(ConnectionConfig(), "h", 1), frame)


def test_refused_secret_is_auth_failed() -> None:
    hs = Handshake(ConnectionConfig(auth_secret="wrong"), "h", 1)
    with pytest.raises(errors.AuthFailedError):
        feed(hs, response(identify_answer(auth_required=True)) + error(b"E_AUTH_FAILED no"))


def test_heartbeats_during_the_handshake_are_answered() -> None:
    hs = Handshake(ConnectionConfig(auth_secret="x"), "h", 1)
    actions = feed(hs, response(identify_answer(auth_required=True)) + HEARTBEAT
                   + response({"identity": "i"}))
    assert actions[1] == SendBytes(protocol.nop())
    assert kinds(actions) == ["SendBytes", "SendBytes", "Done"]


def test_frames_after_the_last_answer_are_handed_over_with_done() -> None:
    hs = Handshake(ConnectionConfig(snappy=True, auth_secret="x"), "h", 1)
    feed(hs, response(identify_answer(snappy=True, auth_required=True)))
    # compressed now: one read may carry OK, the AUTH answer, a heartbeat and half a frame
    decoder_tail = response({"more": 1})[:5]
    actions = hs.receive_data(OK + response({"identity": "i"}) + HEARTBEAT + decoder_tail)
    assert kinds(actions) == ["SendBytes", "Done"]
    done = actions[-1]
    assert isinstance(done, Done)
    assert done.frames == [(protocol.FRAME_TYPE_RESPONSE, protocol.HEARTBEAT)]
    with pytest.raises(errors.NSQError, match="over"):
        hs.receive_data(b"x")


def test_the_connections_decoder_keeps_a_partial_frame_for_the_read_loop() -> None:
    decoder = protocol.FrameDecoder()
    hs = Handshake(ConnectionConfig(snappy=True), "h", 1, decoder)
    feed(hs, response(identify_answer(snappy=True)))
    rest = response(b"after")
    hs.receive_data(OK + rest[:6])
    assert hs.done and decoder.buffered == 6
    assert decoder.feed(rest[6:]) == ([], [(0, b"after")])


def test_connection_lost_explains_itself() -> None:
    hs = Handshake(ConnectionConfig(tls_v1=True), "h", 1)
    feed(hs, response(identify_answer(tls_v1=True)))
    exc = hs.connection_lost("reset")
    assert isinstance(exc, errors.TLSError) and "client certificate" in str(exc)
    hs = Handshake(ConnectionConfig(), "h", 1)
    exc = hs.connection_lost()
    assert isinstance(exc, errors.ConnectionClosedError) and "IDENTIFY" in str(exc)


def test_a_silent_nsqd_times_out_naming_the_step() -> None:
    hs = Handshake(ConnectionConfig(auth_secret="x"), "h", 1)
    feed(hs, response(identify_answer(auth_required=True)))
    exc = hs.timed_out(2.5)
    assert isinstance(exc, errors.NSQTimeoutError)
    assert "within 2.5s" in str(exc) and "the AUTH answer" in str(exc)


# -- not nsqd, or a hostile one ------------------------------------------------------------

@pytest.mark.parametrize("piece", [1, 3, 4, 100])
def test_an_http_port_is_named_as_such(piece: int) -> None:
    hs = Handshake(ConnectionConfig(), "127.0.0.1", 4151)
    answer = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"
    with pytest.raises(errors.ProtocolError) as info:
        for i in range(0, len(answer), piece):
            hs.receive_data(answer[i:i + piece])
    assert HTTP_PORT_HINT in str(info.value) and "4150" in str(info.value)


@pytest.mark.parametrize("junk, match", [
    (b"\x00\x00\x00\x02xx", "frame of size 2"),
    (b"\x7f\xff\xff\xffxx", "frame of size 2147483647"),
    (protocol.encode_frame(7, b"what"), "during the handshake: unknown frame type 7"),
    (protocol.encode_message_frame(b"0" * 16, b"body"), "messages during the handshake"),
    (response(b"not json"), "neither OK nor JSON"),
    (response(b"[1, 2]"), "not a JSON object"),
    (response(b"\xff\xfe"), "neither OK nor JSON"),
])
def test_non_nsq_answers_are_protocol_errors(junk: bytes, match: str) -> None:
    with pytest.raises(errors.ProtocolError, match=match):
        feed(Handshake(ConnectionConfig(), "h", 1), junk)


@pytest.mark.parametrize("field, raw", [
    ("max_rdy_count", '"2500"'),
    ("max_rdy_count", "null"),
    ("max_rdy_count", "[1]"),
    ("max_rdy_count", "-1"),
    ("max_rdy_count", "true"),
    ("msg_timeout", "1e400"),
    ("msg_timeout", "NaN"),
    ("msg_timeout", "1.5"),
    ("max_msg_timeout", "1" + "0" * 400),
    ("deflate_level", "10"),
    ("sample_rate", "100"),
    ("output_buffer_size", "{}"),
    ("snappy", '"yes"'),
    ("tls_v1", "1"),
    ("auth_required", "null"),
    ("version", "130"),
])
def test_hostile_identify_fields_are_protocol_errors_naming_the_field(field: str, raw: str) -> None:
    body = json.dumps(identify_answer())[:-1] + f', "{field}": {raw}}}'
    with pytest.raises(errors.ProtocolError, match=f"IDENTIFY answer with {field}="):
        feed(Handshake(ConnectionConfig(), "h", 1), response(body.encode()))


def test_integral_floats_are_accepted_as_integers() -> None:
    done = feed(Handshake(ConnectionConfig(), "h", 1),
                response(b'{"max_rdy_count": 2500.0}'))[-1]
    assert isinstance(done, Done) and done.negotiated.max_rdy_count == 2500


def test_deeply_nested_identify_answer_is_a_protocol_error() -> None:
    body = b'{"x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    with pytest.raises(errors.ProtocolError, match="nested too deeply"):
        feed(Handshake(ConnectionConfig(), "h", 1), response(body))


def test_deeply_nested_auth_answer_is_a_protocol_error() -> None:
    hs = Handshake(ConnectionConfig(auth_secret="x"), "h", 1)
    with pytest.raises(errors.ProtocolError, match="AUTH response"):
        feed(hs, response(identify_answer(auth_required=True))
             + response(b"[" * 100_000 + b"]" * 100_000))


def test_both_compressions_at_once_are_a_protocol_error() -> None:
    with pytest.raises(errors.ProtocolError, match="both snappy and deflate"):
        feed(Handshake(ConnectionConfig(), "h", 1),
             response(identify_answer(snappy=True, deflate=True)))


def test_anything_but_ok_after_an_upgrade_is_a_protocol_error() -> None:
    hs = Handshake(ConnectionConfig(deflate=True), "h", 1)
    with pytest.raises(errors.ProtocolError, match="compression upgrade"):
        feed(hs, response(identify_answer(deflate=True, deflate_level=6)) + response(b"KO"))


# -- properties ----------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                max_size=3),
    max_leaves=10)
FIELDS = ["max_rdy_count", "msg_timeout", "max_msg_timeout", "tls_v1", "snappy", "deflate",
          "deflate_level", "max_deflate_level", "sample_rate", "auth_required",
          "output_buffer_size", "output_buffer_timeout", "version"]


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=6), st.booleans())
def test_any_identify_answer_gives_actions_or_a_typed_error(answer: dict[str, Any],
                                                             secret: bool) -> None:
    hs = Handshake(ConnectionConfig(auth_secret="x" if secret else None), "h", 1)
    try:
        actions = hs.receive_data(response(json.dumps(answer).encode()))
    except errors.NSQError:
        return
    assert actions and isinstance(actions[-1], (StartTLS, InstallCodec, SendBytes, Done))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.integers(1, 16))
def test_random_bytes_only_raise_nsq_errors(blob: bytes, step: int) -> None:
    hs = Handshake(ConnectionConfig(max_frame_size=1 << 16), "h", 1)
    try:
        for i in range(0, len(blob), step):
            if hs.done:
                break
            hs.receive_data(blob[i:i + step])
    except errors.NSQError:
        pass


@settings(max_examples=100, deadline=None)
@given(st.sampled_from([None, "snappy", "deflate"]), st.booleans(), st.booleans(),
       st.lists(st.integers(1, 40), max_size=20))
def test_any_split_of_the_compressed_part_gives_the_same_actions(
        codec: str | None, auth: bool, heartbeat: bool, pieces: list[int]) -> None:
    cfg = ConnectionConfig(snappy=codec == "snappy", deflate=codec == "deflate",
                           auth_secret="x" if auth else None)
    answer = identify_answer(snappy=codec == "snappy", deflate=codec == "deflate",
                             deflate_level=6 if codec == "deflate" else 0, auth_required=auth)
    stream = (response(answer) + (OK if codec else b"") + (HEARTBEAT if heartbeat else b"")
              + (response({"identity": "i"}) if auth else b""))
    results = []
    for how in (None, pieces):
        decoder = protocol.FrameDecoder()
        actions, used = feed_counting(Handshake(cfg, "h", 1, decoder), stream, how)
        done = actions[-1]
        assert isinstance(done, Done)
        # every frame after the handshake reaches the read loop: with Done, or still unread
        after = done.frames + decoder.feed(stream[used:])[1]
        results.append((actions[:-1], done.negotiated, after))
    assert results[0] == results[1]


def test_conn_state_compares_as_its_string() -> None:
    assert ConnState.SUBSCRIBED == "subscribed"
    assert f"{ConnState.CLOSED}" == "closed"
    assert json.dumps({"state": ConnState.CONNECTED}) == '{"state": "connected"}'


def test_an_ipv6_nsqd_is_named_with_brackets() -> None:
    hs = Handshake(ConnectionConfig(tls_v1=True), "::1", 4150)
    with pytest.raises(errors.TLSError, match=r"nsqd at \[::1\]:4150 "):
        feed(hs, response(identify_answer()))


def test_handshake_and_codecs_do_no_io() -> None:
    """Sans-IO below: the handshake and the codecs import no socket, loop, thread or clock."""
    import ast
    from pathlib import Path

    import nsq_spark

    io_modules = {"socket", "asyncio", "tornado", "threading", "time", "select", "selectors"}
    for name in ("_handshake.py", "_codecs.py"):
        tree = ast.parse((Path(nsq_spark.__file__).parent / name).read_text())
        imported = {alias.name.split(".")[0] for node in ast.walk(tree)
                    if isinstance(node, ast.Import) for alias in node.names}
        imported |= {(node.module or "").split(".")[0] for node in ast.walk(tree)
                     if isinstance(node, ast.ImportFrom) and not node.level}
        assert not imported & io_modules, (name, imported & io_modules)
