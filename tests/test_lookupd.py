"""lookupd discovery: the pure parts (URL building, response parsing, jitter)."""

from __future__ import annotations

import json
import logging
import random

import pytest

from nsq_spark._lookupd import (LookupdError, LookupdPoller, lookup_url, next_poll_delay,
                               parse_lookup_response, producer_address)

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("address,expected", [
    ("127.0.0.1:4161", "http://127.0.0.1:4161/lookup?topic=t"),
    ("http://127.0.0.1:4161", "http://127.0.0.1:4161/lookup?topic=t"),
    ("http://127.0.0.1:4161/", "http://127.0.0.1:4161/lookup?topic=t"),
    ("https://lk.example:4161/custom", "https://lk.example:4161/custom?topic=t"),
    ("127.0.0.1:4161/lookup?topic=old&x=1", "http://127.0.0.1:4161/lookup?x=1&topic=t"),
    (" 127.0.0.1:4161 ", "http://127.0.0.1:4161/lookup?topic=t"),
])
def test_lookup_url(address, expected):
    assert lookup_url(address, "t") == expected


def test_lookup_url_encodes_topic():
    assert lookup_url("h:1", "a#ephemeral").endswith("topic=a%23ephemeral")


@pytest.mark.parametrize("bad", ["", "  ", None, "http://"])
def test_lookup_url_rejects_bad_address(bad):
    with pytest.raises(ValueError, match="lookupd HTTP address"):
        lookup_url(bad, "t")


def _p(host, port, **kw):
    return {"broadcast_address": host, "tcp_port": port, "http_port": 4151,
            "hostname": "h", "remote_address": "r", "version": "1.3.0", **kw}


def test_parse_v1_response():
    body = json.dumps({"channels": ["c"], "producers": [_p("10.0.0.1", 4150), _p("10.0.0.2", 4152)]})
    assert parse_lookup_response(body.encode()) == [("10.0.0.1", 4150), ("10.0.0.2", 4152)]


def test_parse_legacy_envelope_and_address_fallback():
    body = json.dumps({"status_code": 200, "status_txt": "OK",
                       "data": {"producers": [{"address": "h1", "tcp_port": 4150}]}})
    assert parse_lookup_response(body) == [("h1", 4150)]


def test_parse_skips_malformed_producers(caplog):
    body = json.dumps({"producers": [
        _p("ok", 1), "junk", {"tcp_port": 5}, _p("", 5), _p("h", "4150"), _p("h", 0),
        _p("h", 70000), _p("h", True), _p("ok2", 2)]})
    with caplog.at_level(logging.WARNING):
        assert parse_lookup_response(body, "lk1") == [("ok", 1), ("ok2", 2)]
    # one warning for the answer, not one per entry (a lookupd listing 10,000 bad entries
    # must not write 10,000 lines per poll)
    (warning,) = [r.getMessage() for r in caplog.records if "lk1:" in r.getMessage()]
    assert "skipped 7 of its 9 producers" in warning and "'junk'" in warning


@pytest.mark.parametrize("body,match", [
    (b"<html>nope</html>", "not JSON"),
    (b"\xff\xfe", "not JSON"),
    (b"[1, 2]", "without a 'producers' list"),
    (b'{"producers": {"a": 1}}', "without a 'producers' list"),
    (b'{"message": "NOT_FOUND"}', "without a 'producers' list"),
    (b"null", "without a 'producers' list"),
])
def test_parse_garbage_raises(body, match):
    with pytest.raises(LookupdError, match=match):
        parse_lookup_response(body, "lk")


def test_empty_producers():
    assert parse_lookup_response(b'{"channels": [], "producers": []}') == []


def test_producer_address():
    assert producer_address(("127.0.0.1", 4150)) == "127.0.0.1:4150"
    assert producer_address(("::1", 4150)) == "[::1]:4150"


def test_next_poll_delay_bounds():
    rng = random.Random(3)
    delays = [next_poll_delay(10, 0.3, rng) for _ in range(2000)]
    assert min(delays) >= 10 and max(delays) <= 13
    assert max(delays) - min(delays) > 2.5  # really jittered
    assert next_poll_delay(10, 0, rng) == 10


@pytest.mark.parametrize("kwargs,match", [
    ({"addresses": []}, "at least one"),
    ({"poll_interval": 0}, "lookupd_poll_interval"),
    ({"poll_jitter": 1.5}, "lookupd_poll_jitter"),
    ({"connect_timeout": 0}, "timeout"),
    ({"attempts": 0}, "attempts"),
])
def test_poller_validates(kwargs, match):
    args = {"addresses": ["127.0.0.1:1"], "topic": "t", "on_producers": print, **kwargs}
    with pytest.raises(ValueError, match=match):
        LookupdPoller(**args)


def test_lookup_sync_keeps_the_topology_hints():
    # the one record builder (_record) for the sync lookup too: zone and region survive
    from admin_fakes import FakeTransport

    from nsq_spark.admin.calls import Answer
    from nsq_spark._lookupd import ProducerInfo, lookup_sync
    body = json.dumps({"producers": [_p("10.0.0.1", 4150, topology_zone="z1",
                                        topology_region="r1"), _p("10.0.0.2", 4152)]})
    found = lookup_sync("127.0.0.1:4161", "t", transport=FakeTransport(Answer(200, body.encode())))
    assert found == [ProducerInfo("10.0.0.1", 4150, 4151, "z1", "r1"),
                     ProducerInfo("10.0.0.2", 4152, 4151, None, None)]


def test_lookupd_index_is_the_one_same_lookupd_rule():
    from nsq_spark._lookupd import lookupd_index
    polled = ["127.0.0.1:4161", "http://lk2:4161/"]
    assert lookupd_index(polled, "http://127.0.0.1:4161", "t") == 0
    assert lookupd_index(polled, "lk2:4161", "t") == 1
    assert lookupd_index(polled, "lk3:4161", "t") is None
    poller = LookupdPoller(polled, "t", lambda producers: None)
    assert poller.add_address("http://lk2:4161") is False
    assert poller.add_address("lk3:4161") is True and poller.addresses[-1] == "lk3:4161"
    assert poller.remove_address("http://127.0.0.1:4161/") is True
    assert poller.addresses == ["http://lk2:4161/", "lk3:4161"]
    assert poller.urls == [lookup_url(a, "t") for a in poller.addresses]
    assert poller.remove_address("127.0.0.1:4161") is False


def test_a_stopped_poller_makes_no_http_client_and_says_so(monkeypatch) -> None:
    # an explicit poll racing with stop() (Reader.query_lookupd from another thread) used
    # to make a new client after stop() had released the old one: nothing closed it
    import asyncio

    from admin_fakes import ScriptedAsyncTransport
    from nsq_spark import _lookupd as lookupd
    from nsq_spark.admin.calls import Answer
    from nsq_spark.errors import NSQError, PollerStoppedError

    made: list[ScriptedAsyncTransport] = []
    closed: list[ScriptedAsyncTransport] = []

    class Client(ScriptedAsyncTransport):
        def __init__(self, **kw: object) -> None:
            super().__init__(*[Answer(200, b'{"producers":[]}')] * 4)
            made.append(self)

        async def aclose(self) -> None:
            await asyncio.sleep(0)  # stop() yields here: the race's window
            closed.append(self)

    monkeypatch.setattr(lookupd, "AsyncHttpTransport", Client)

    async def main() -> None:
        poller = LookupdPoller(["127.0.0.1:4161"], "t", lambda found: None)
        await poller.poll_once()  # makes its own client
        stopping = asyncio.ensure_future(poller.stop())
        await asyncio.sleep(0)  # stop() is releasing the client
        with pytest.raises(PollerStoppedError, match="stopped") as raised:
            await poller.poll_once()
        assert isinstance(raised.value, NSQError)
        await stopping
        with pytest.raises(PollerStoppedError):
            await poller.query_records(poller.urls[0])

    asyncio.run(main())
    assert len(made) == 1 and closed == made  # every client made was closed
