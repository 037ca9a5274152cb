"""Reader rules that need no socket: address parsing, pynsq units, argument errors."""

from __future__ import annotations

import pytest

from nsq_spark.errors import ConfigError, InvalidAddressError
from nsq_spark import Reader

pytestmark = pytest.mark.unit


def test_addresses_follow_the_one_address_rule():
    r = Reader("t", "c", nsqd_tcp_addresses=" 127.0.0.1:4150 ,[::1]:4151")
    assert r.nsqd_tcp_addresses == ["127.0.0.1:4150", "[::1]:4151"]
    r = Reader("t", "c", nsqd_tcp_addresses=["127.0.0.1:1", "127.0.0.1:1"],
               lookupd_http_addresses="http://127.0.0.1:4161")
    assert r.nsqd_tcp_addresses == ["127.0.0.1:1"]
    assert r.lookupd_http_addresses == ["http://127.0.0.1:4161"]


def test_the_address_lists_are_read_only_and_say_which_control_changes_them():
    # pynsq programs append to r.lookupd_http_addresses: a copy that swallowed the append
    # changed nothing, silently; now it is an immutable snapshot that says what to call
    r = Reader("t", "c", nsqd_tcp_addresses="127.0.0.1:4150",
               lookupd_http_addresses="127.0.0.1:4161")
    lookupds, nsqds = r.lookupd_http_addresses, r.nsqd_tcp_addresses
    assert isinstance(lookupds, tuple) and lookupds == ("127.0.0.1:4161",)
    with pytest.raises(ConfigError, match=r"connect_to_lookupd.*disconnect_from_lookupd"):
        lookupds.append("127.0.0.1:4261")
    with pytest.raises(ConfigError, match="connect_to_lookupd"):
        r.lookupd_http_addresses += ["127.0.0.1:4261"]
    with pytest.raises(ConfigError, match=r"read-only.*connect_to_lookupd"):
        r.lookupd_http_addresses = ["127.0.0.1:4261"]
    with pytest.raises(ConfigError, match=r"connect_to_nsqd.*disconnect_from_nsqd"):
        nsqds.extend(["127.0.0.1:4250"])
    with pytest.raises(ConfigError, match=r"read-only.*connect_to_nsqd"):
        r.nsqd_tcp_addresses = []
    assert r.lookupd_http_addresses == ["127.0.0.1:4161"]  # unchanged
    assert r.nsqd_tcp_addresses == ["127.0.0.1:4150"] != ["x:1"]
    assert r.connect_to_lookupd("127.0.0.1:4261") is True  # the control does change it
    assert r.lookupd_http_addresses == ("127.0.0.1:4161", "127.0.0.1:4261")


def test_the_address_snapshots_copy_pickle_and_add_like_pynsqs_lists():
    import copy
    import pickle

    r = Reader("t", "c", lookupd_http_addresses="127.0.0.1:4161")
    lookupds = r.lookupd_http_addresses
    for again in (copy.copy(lookupds), copy.deepcopy(lookupds),
                  pickle.loads(pickle.dumps(lookupds))):
        assert again == ["127.0.0.1:4161"]
        with pytest.raises(ConfigError, match="connect_to_lookupd"):
            again.append("127.0.0.1:4261")   # still says which control to call
    assert lookupds + ["127.0.0.1:4261"] == ["127.0.0.1:4161", "127.0.0.1:4261"]
    assert ["127.0.0.1:4261"] + lookupds == ["127.0.0.1:4261", "127.0.0.1:4161"]
    mine = lookupds.copy()
    mine.append("127.0.0.1:4261")   # a plain list of one's own, as list.copy gave
    assert mine == ["127.0.0.1:4161", "127.0.0.1:4261"]
    assert r.lookupd_http_addresses == ["127.0.0.1:4161"]


@pytest.mark.parametrize("bad", ["localhost", ":4150", "h:", "h:x", "h:0", "h:70000", "::1:4150"])
def test_bad_nsqd_address_names_the_parameter(bad):
    with pytest.raises(InvalidAddressError, match="nsqd_tcp_addresses"):
        Reader("t", "c", nsqd_tcp_addresses=[bad])


def test_bad_lookupd_address_names_the_parameter():
    with pytest.raises(InvalidAddressError, match="lookupd_http_addresses"):
        Reader("t", "c", lookupd_http_addresses="ftp://127.0.0.1:4161")
    with pytest.raises(InvalidAddressError, match="lookupd_http_addresses"):
        Reader("t", "c", lookupd_http_addresses=42)


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


def test_pull_api_rejected_with_handler_and_argument_errors():
    from nsq_spark.errors import NSQError

    T, C = "rt", "rc"
    r = Reader(T, C, batch_handler=lambda ms: True, nsqd_tcp_addresses=["127.0.0.1:1"])
    with pytest.raises(NSQError, match="without a message_handler"):
        r.get_batch()
    r.close()  # never started: closing is immediate, and it will not start later
    assert r.closed
    with pytest.raises(ValueError, match="nsqd_tcp_addresses or lookupd_http_addresses"):
        Reader(T, C)
    with pytest.raises(ValueError, match="host:port"):
        Reader(T, C, nsqd_tcp_addresses="localhost")
    with pytest.raises(ValueError, match="not both"):
        Reader(T, C, lambda m: True, nsqd_tcp_addresses="h:1", batch_handler=print)
    with pytest.raises(ValueError, match="max_in_flight"):
        Reader(T, C, nsqd_tcp_addresses="h:1", max_in_flight=-1)
    with pytest.raises(Exception, match="topic"):
        Reader("bad topic!", C, nsqd_tcp_addresses="h:1")
    with pytest.raises(Exception, match="unknown connection option"):
        Reader(T, C, nsqd_tcp_addresses="h:1", heartbeat_intervall=5)
