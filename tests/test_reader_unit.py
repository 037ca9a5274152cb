"""Reader helpers that need no socket: address parsing, pynsq units."""

from __future__ import annotations

import pytest

from nsq_spark.errors import ConfigError
from nsq_spark.reader import Reader, _address_list, _split_hostport

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("addr,expected", [
    ("127.0.0.1:4150", ("127.0.0.1", 4150)),
    ("nsqd.example:1", ("nsqd.example", 1)),
    ("[::1]:4150", ("::1", 4150)),
])
def test_split_hostport(addr, expected):
    assert _split_hostport(addr) == expected


@pytest.mark.parametrize("bad", ["localhost", ":4150", "h:", "h:x", "h:0", "h:70000"])
def test_split_hostport_rejects(bad):
    with pytest.raises(ValueError, match="host:port"):
        _split_hostport(bad)


def test_address_list():
    assert _address_list(None, "x") == []
    assert _address_list("a:1", "x") == ["a:1"]
    assert _address_list([" a:1 ", "b:2"], "x") == ["a:1", "b:2"]
    with pytest.raises(TypeError, match="x must be"):
        _address_list(42, "x")
    with pytest.raises(ValueError, match="non-empty"):
        _address_list(["a:1", ""], "x")


def test_pynsq_units_are_seconds_without_guessing():
    r = Reader("t", "c", nsqd_tcp_addresses="127.0.0.1:1", heartbeat_interval=5,
               msg_timeout=2.5, requeue_delay=3, max_requeue_delay=7.5,
               output_buffer_timeout=100)
    assert r.config.heartbeat_interval_ms == 5000
    assert r.config.identify_payload()["heartbeat_interval"] == 5000
    assert r.config.identify_payload()["msg_timeout"] == 2500
    assert r.config.identify_payload()["output_buffer_timeout"] == 100  # ms, as in pynsq
    assert r.requeue_delay_ms == 3000 and r.max_requeue_delay_ms == 7500
    # milliseconds are no longer guessed: a ms-sized value is refused with the fix named
    with pytest.raises(ConfigError, match=r"seconds.*heartbeat_interval=5"):
        Reader("t", "c", nsqd_tcp_addresses="127.0.0.1:1", heartbeat_interval=5000)
    # 1000 s is a legal (if long) msg_timeout in seconds: taken as given, not as 1 s
    r = Reader("t", "c", nsqd_tcp_addresses="127.0.0.1:1", msg_timeout=1000)
    assert r.config.identify_payload()["msg_timeout"] == 1_000_000


def test_dedup_key_defaults_to_the_deduplicators_own_key():
    from nsq_spark.dedup import OppositeBloomFilter, by_body_digest, by_message_id

    by_body = OppositeBloomFilter(16, key="body")
    r = Reader("t", "c", nsqd_tcp_addresses="127.0.0.1:1", dedup=by_body)
    assert r._dedup_key is by_body_digest
    r = Reader("t", "c", nsqd_tcp_addresses="127.0.0.1:1", dedup=by_body, dedup_key="id")
    assert r._dedup_key is by_message_id
    r = Reader("t", "c", nsqd_tcp_addresses="127.0.0.1:1", dedup=OppositeBloomFilter(16))
    assert r._dedup_key is by_message_id
