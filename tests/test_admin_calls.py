"""The admin clients' sans-IO layer (nsq_spark.admin.calls) against answers recorded from a
real nsqd / nsqlookupd v1.3.0 (tests/data/admin, captured with a Reader subscribed, one
channel paused), and the clients over a fake transport typed against the port."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsq_spark.admin import (AsyncNsqdClient, ChannelNotFoundError, HTTPStatusError,
                             LookupdClient, LookupdError, NodeUnreachableError, NotFoundError,
                             NsqdClient, TopicNotFoundError, UnexpectedAnswerError)
from nsq_spark.admin import calls
from nsq_spark.admin.calls import Answer, read_answer
from nsq_spark.errors import InvalidAddressError, InvalidNameError, is_transient

pytestmark = pytest.mark.unit

sys.path.insert(0, os.path.dirname(__file__))
from admin_fakes import (FakeAsyncTransport, FakeTransport, ScriptedAsyncTransport,  # noqa: E402
                         ScriptedTransport)

DATA = Path(__file__).parent / "data" / "admin"


def recorded(name: str) -> bytes:
    return (DATA / name).read_bytes()


# tests/admin_fakes.py is checked by mypy --strict against the transport ports, with a
# drifted fake that must fail: tests/test_typing.py (the suite's one mypy run)


# -- parsing recorded answers -----------------------------------------------------------


def test_nsqd_stats_are_read_whole_with_clients_and_pause_flags():
    stats = calls.parse_nsqd_stats(recorded("nsqd_stats.json"))
    assert (stats.version, stats.health) == ("1.3.0", "OK")
    orders = stats.topic("orders")
    assert orders is not None
    assert (orders.message_count, orders.message_bytes, orders.depth, orders.paused) == \
        (15, 30, 0, False)
    audit, billing = orders.channel("audit"), orders.channel("billing")
    assert audit is not None and billing is not None
    assert (audit.paused, audit.depth, audit.client_count, audit.clients) == (True, 5, 0, ())
    assert (billing.paused, billing.depth, billing.in_flight_count, billing.deferred_count,
            billing.requeue_count, billing.message_count) == (False, 12, 2, 1, 1, 15)
    (client,) = billing.clients
    assert (client.state, client.ready_count, client.in_flight_count, client.requeue_count,
            client.user_agent.startswith("nsq_spark/"), client.tls) == \
        (3, 1, 2, 1, True, False)
    assert stats.channel("orders", "nope") is None and stats.topic("nope") is None


def test_stats_without_clients_keep_the_counts():
    stats = calls.parse_nsqd_stats(recorded("nsqd_stats_topic_no_clients.json"))
    billing = stats.channel("orders", "billing")
    assert billing is not None and billing.clients == () and billing.client_count == 1


def test_nsqd_info_gives_its_addresses():
    info = read_answer(calls.nsqd_info("127.0.0.1:4151"), Answer(200, recorded("nsqd_info.json")))
    assert info.version == "1.3.0"
    assert info.tcp_address == f"127.0.0.1:{info.tcp_port}" and info.http_port > 0


def test_lookupd_nodes_lookup_topics_channels_info():
    nodes = read_answer(calls.lookupd_nodes("l:4161"), Answer(200, recorded("lookupd_nodes.json")))
    (node,) = nodes
    assert (node.topics, node.tombstones, node.version) == (("orders",), (False,), "1.3.0")
    assert node.http_address == f"127.0.0.1:{node.http_port}"
    found = read_answer(calls.lookup("l:4161", "orders"),
                        Answer(200, recorded("lookupd_lookup.json")))
    assert found.channels == ("billing", "audit")
    assert [p.tcp_address for p in found.producers] == [node.tcp_address]
    assert read_answer(calls.lookupd_topics("l:4161"),
                       Answer(200, recorded("lookupd_topics.json"))) == ["orders"]
    assert read_answer(calls.lookupd_channels("l:4161", "orders"),
                       Answer(200, recorded("lookupd_channels.json"))) == ["billing", "audit"]
    assert read_answer(calls.lookupd_info("l:4161"),
                       Answer(200, recorded("lookupd_info.json"))).version == "1.3.0"


def test_an_unknown_topic_is_an_empty_lookup_not_an_error():
    found = read_answer(calls.lookup("l:4161", "nope"),
                        Answer(404, recorded("lookupd_lookup_404.txt")))
    assert found.producers == () and found.channels == ()


# -- error answers ----------------------------------------------------------------------


@pytest.mark.parametrize("call, file, status, kind, words", [
    (calls.topic_action("n:4151", "pause", "nope"), "nsqd_404_topic_pause.txt", 404,
     TopicNotFoundError, ["topic 'nope' does not exist on nsqd n:4151", "create it"]),
    (calls.channel_action("n:4151", "empty", "orders", "nope"), "nsqd_404_channel_empty.txt",
     404, ChannelNotFoundError, ["channel 'nope' of topic 'orders' does not exist"]),
    (calls.topic_action("n:4151", "create", "orders"), "nsqd_400_bad_topic.txt", 400,
     HTTPStatusError, ["HTTP 400 INVALID_TOPIC", "POST http://n:4151/topic/create"]),
    (calls.topic_action("n:4151", "create", "orders"), "nsqd_405_get_create.txt", 405,
     HTTPStatusError, ["HTTP 405 METHOD_NOT_ALLOWED"]),
])
def test_error_answers_are_typed_and_name_the_fix(call, file, status, kind, words):
    with pytest.raises(kind) as info:
        read_answer(call, Answer(status, recorded(file)))
    assert info.value.status == status
    for w in words:
        assert w in str(info.value)
    assert not is_transient(info.value)  # an answer: another attempt gets the same


@pytest.mark.parametrize("status, transient", [
    (500, True), (502, True), (503, True), (504, True), (501, False), (505, False),
    (400, False), (403, False), (404, False), (405, False)])
def test_5xx_answers_are_transient_the_others_are_not(status, transient):
    with pytest.raises(HTTPStatusError) as info:
        read_answer(calls.nsqd_stats("n:4151"), Answer(status, b'{"message":"X"}'))
    assert is_transient(info.value) is transient


def test_a_404_of_another_server_says_which_port_to_give():
    with pytest.raises(NotFoundError, match="is this address an nsqd HTTP port"):
        read_answer(calls.nsqd_stats("n:4151"), Answer(404, b"404 page not found\n"))


@pytest.mark.parametrize("body", [b"<html>", b"[]", b'{"topics": []}', b"\xff"])
def test_a_2xx_that_is_not_nsqds_stats_is_refused(body):
    with pytest.raises(UnexpectedAnswerError, match="nsqd"):
        read_answer(calls.nsqd_stats("n:4151"), Answer(200, body))


def test_lookupd_garbage_is_a_lookupd_error():
    with pytest.raises(LookupdError, match="not JSON"):
        calls.parse_producers(b"OK")
    with pytest.raises(LookupdError, match="'producers'"):
        calls.parse_producers(b'{"x": 1}')


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["topics", "channels", "clients", "topic_name", "channel_name",
                         "depth", "paused", "version", "producers", "data", "tcp_port",
                         "broadcast_address", "http_port"]), inner, max_size=6),
    max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_any_json_parses_or_is_an_unexpected_answer(doc):
    body = json.dumps(doc).encode()
    for parse in (calls.parse_nsqd_stats, calls.parse_producers, calls.parse_lookup):
        try:
            parse(body, "x")
        except UnexpectedAnswerError:
            pass


# -- names and addresses before any request ---------------------------------------------


@pytest.mark.parametrize("op", [
    lambda c: c.pause_topic("bad name"), lambda c: c.create_channel("ok", "bad/name"),
    lambda c: c.stats("x" * 65), lambda c: c.empty_channel("", "c"),
])
def test_a_bad_name_is_refused_before_any_request(op):
    fake = FakeTransport()
    with pytest.raises(InvalidNameError, match="names are 1-64 characters"):
        op(NsqdClient("127.0.0.1:4151", transport=fake))
    assert fake.asked == []


@pytest.mark.parametrize("address", ["127.0.0.1", "nsqd:notaport", "ftp://h:1", ""])
def test_a_bad_address_is_refused_at_construction(address):
    with pytest.raises(InvalidAddressError, match="nsqd HTTP address"):
        NsqdClient(address, transport=FakeTransport())


@pytest.mark.parametrize("timeout", [0, -1, float("nan"), float("inf"), "5"])
def test_timeout_is_bounded(timeout):
    with pytest.raises(ValueError, match="timeout"):
        NsqdClient("127.0.0.1:4151", timeout=timeout, transport=FakeTransport())


# -- what the clients ask ---------------------------------------------------------------


def test_operations_post_to_nsqds_endpoints_with_encoded_names():
    fake = FakeTransport()
    nsqd = NsqdClient("http://127.0.0.1:4151", timeout=2, transport=fake)
    nsqd.pause_channel("orders", "tail#ephemeral")
    nsqd.delete_topic("orders")
    fake.answer = Answer(200, recorded("nsqd_stats_topic_no_clients.json"))
    nsqd.stats("orders", include_clients=False)
    assert fake.asked == [
        ("POST", "http://127.0.0.1:4151/channel/pause?topic=orders&channel=tail%23ephemeral", 2.0),
        ("POST", "http://127.0.0.1:4151/topic/delete?topic=orders", 2.0),
        ("GET", "http://127.0.0.1:4151/stats?format=json&topic=orders&include_clients=false",
         2.0),
    ]


def nodes_answer(*producers: tuple[str, int, list[str], list[bool]]) -> Answer:
    return Answer(200, json.dumps({"producers": [
        {"broadcast_address": host, "hostname": "h", "remote_address": f"{host}:1",
         "tcp_port": port - 1, "http_port": port, "version": "1.3.0", "topics": topics,
         "tombstones": tombstones} for host, port, topics, tombstones in producers]}).encode())


def test_tombstone_names_the_nsqd_as_lookupd_does_and_checks_it_took():
    # nsqlookupd compares node with fmt.Sprintf("%s:%d", BroadcastAddress, HTTPPort):
    # an IPv6 host goes without brackets
    fake = ScriptedTransport(Answer(200, b""), nodes_answer(("::1", 4151, ["t"], [True])))
    LookupdClient("[::1]:4161", transport=fake).tombstone_topic_producer("t", "[::1]:4151")
    assert fake.asked == [
        ("POST", "http://[::1]:4161/topic/tombstone?topic=t&node=%3A%3A1%3A4151"),
        ("GET", "http://[::1]:4161/nodes")]


@pytest.mark.parametrize("node", ["10.0.0.9:4151", "10.0.0.1:4150"])
def test_a_tombstone_that_matched_nothing_is_not_found_naming_the_producers(node):
    fake = ScriptedTransport(Answer(200, b""), nodes_answer(
        ("10.0.0.1", 4151, ["t"], [False]), ("10.0.0.2", 4151, ["other"], [False])))
    with pytest.raises(NotFoundError) as info:
        LookupdClient("10.0.0.5:4161", transport=fake).tombstone_topic_producer("t", node)
    text = str(info.value)
    assert f"no producer of topic 't' is at {node}" in text
    assert "knows: 10.0.0.1:4151;" in text and "10.0.0.2" not in text
    assert info.value.message == "NODE_NOT_FOUND" and not is_transient(info.value)


@pytest.mark.parametrize("node, words", [
    # listed for the topic, not tombstoned: did not take, or expired already
    ("10.0.0.1:4151", ["lists the producer of topic 't' at 10.0.0.1:4151 but not as "
                       "tombstoned", "--tombstone-lifetime"]),
    # listed, not for the topic: lookupd tombstones among the topic's producers
    ("10.0.0.2:4151", ["tombstoned nothing: no producer of topic 't' is at 10.0.0.2:4151",
                       "registered for other only", "knows: 10.0.0.1:4151;"]),
    # not listed at all (lookupd leaves out inactive nsqds): not confirmed, not "nothing"
    ("10.0.0.9:4151", ["did not confirm the tombstone", "lists no nsqd there at all",
                       "--inactive-producer-timeout", "the tombstone may have taken",
                       "knows: 10.0.0.1:4151;"]),
])
def test_a_tombstone_not_seen_in_nodes_says_what_is_known(node, words):
    fake = ScriptedTransport(Answer(200, b""), nodes_answer(
        ("10.0.0.1", 4151, ["t"], [False]), ("10.0.0.2", 4151, ["other"], [False])))
    with pytest.raises(NotFoundError) as info:
        LookupdClient("10.0.0.5:4161", transport=fake).tombstone_topic_producer("t", node)
    text = str(info.value)
    assert all(w in text for w in words), text
    assert ("tombstoned nothing" in text) == (node == "10.0.0.2:4151")
    assert info.value.message == "NODE_NOT_FOUND" and not is_transient(info.value)


def test_async_client_reads_the_same_answers():
    fake = FakeAsyncTransport(Answer(200, recorded("nsqd_stats.json")))

    async def go():
        async with AsyncNsqdClient("127.0.0.1:4151", transport=fake) as nsqd:
            return await nsqd.stats()

    stats = asyncio.run(go())
    assert stats == calls.parse_nsqd_stats(recorded("nsqd_stats.json"))
    assert fake.asked == [("GET", "http://127.0.0.1:4151/stats?format=json")]


# -- discovery's poller on the same call layer ------------------------------------------


def poll(*steps: Answer | BaseException):
    from nsq_spark._lookupd import LookupdPoller

    transport = ScriptedAsyncTransport(*steps)
    poller = LookupdPoller(["127.0.0.1:4161"], "orders", lambda found: None, attempts=2,
                           transport=transport)
    found = asyncio.run(poller.poll_once())
    return found, poller.failures, transport.asked


LOOKUP = Answer(200, recorded("lookupd_lookup.json"))
PRODUCER = {(p.broadcast_address, p.tcp_port)
            for p in calls.parse_producers(recorded("lookupd_lookup.json"))}


@pytest.mark.parametrize("first", [
    Answer(500, b'{"message":"INTERNAL_ERROR"}'),
    NodeUnreachableError("refused"),
])
def test_the_poller_retries_a_transport_error_or_5xx_once(first):
    found, failures, asked = poll(first, LOOKUP)
    assert found == PRODUCER and failures == {} and len(asked) == 2


def test_the_poller_takes_an_unknown_topic_as_empty_and_garbage_as_a_failure():
    found, failures, asked = poll(Answer(404, recorded("lookupd_lookup_404.txt")))
    assert found == set() and failures == {} and len(asked) == 1
    found, failures, asked = poll(Answer(200, b"<html>"))
    assert found == set() and len(asked) == 1  # an answer: no retry
    (error,) = failures.values()
    assert error.startswith("LookupdError") and "not JSON" in error


names = st.from_regex(r"[.a-zA-Z0-9_-]{1,54}(#ephemeral)?", fullmatch=True)


@settings(max_examples=200, deadline=None)
@given(names, names, st.sampled_from(calls.TOPIC_ACTIONS))
def test_any_valid_name_reaches_nsqd_unchanged(topic, channel, action):
    from urllib.parse import parse_qs, urlsplit

    call = calls.channel_action("127.0.0.1:4151", action, topic, channel)
    parts = urlsplit(call.url)
    assert (call.method, parts.path) == ("POST", f"/channel/{action}")
    assert parse_qs(parts.query) == {"topic": [topic], "channel": [channel]}


def test_ssl_context_and_a_transport_are_not_given_together():
    import ssl

    from nsq_spark.errors import ConfigError

    with pytest.raises(ConfigError, match="ssl_context or transport, not both"):
        NsqdClient("127.0.0.1:4151", transport=FakeTransport(),
                   ssl_context=ssl.create_default_context())


@pytest.mark.parametrize("text, not_http", [
    # h11 could not parse what came back: not HTTP (the same on every attempt)
    ("illegal request line", True),  # nsqd's TCP port: a framed E_BAD_PROTOCOL
    ("illegal status line: bytearray(b'E_BAD_PROTOCOL')", True),
    ("illegal header line: bytearray(b'x')", True),
    ("Receive buffer too long", True),
    ("no response line received", True),
    # the connection closed or was cut short: no answer (transient)
    ("peer unexpectedly closed connection", False),
    ("peer closed connection without sending complete message body (incomplete chunked "
     "read)", False),
    ("Server disconnected without sending a response.", False),
    ("Server disconnected", False),
    ("Can't receive data when peer state is ERROR", False),
])
def test_a_protocol_error_is_not_http_only_when_h11_could_not_parse_the_answer(
        text, not_http):
    import httpcore

    from nsq_spark.admin.transport import _failure

    error = _failure("GET", "http://n:4151/stats", httpcore.RemoteProtocolError(text))
    assert isinstance(error, UnexpectedAnswerError if not_http else NodeUnreachableError)
    assert is_transient(error) is not not_http
    assert ("not HTTP" in str(error)) is not_http and text in str(error)
