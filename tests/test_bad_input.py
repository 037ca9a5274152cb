"""Bad input, table by table: every public entry point (Reader, Producer, Writer, the
publish calls, ConnectionConfig, dedup, the Spark options, the CLI) answers a bad value
at construction or call time with a typed error (a ConfigError, an InvalidAddressError
or an InvalidBodyError) whose message names the parameter. Values accepted on purpose
are rows that assert what they become. No sockets: nothing here connects (the Readers
and Producers are built on an address nobody listens on and never used)."""

from __future__ import annotations

import io
import math
import struct
from typing import Any, Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsq_spark import Producer, Reader, Writer, _validate as validate
from nsq_spark._addresses import Address, parse_address
from nsq_spark.cli import main as cli_main
from nsq_spark.config import ConnectionConfig
from nsq_spark.dedup import BloomFilter, OppositeBloomFilter, RedisBloomFilter, from_spec
from nsq_spark.dedup.stores import MemcachedDeduplicator, RedisDeduplicator
from nsq_spark.errors import ConfigError, InvalidAddressError, InvalidBodyError
from nsq_spark._lookupd import lookup_url
from nsq_spark.spark.options import NSQOptionError, parse_read_options, parse_write_options

pytestmark = pytest.mark.unit

NAN, INF = float("nan"), float("inf")
NOWHERE = "127.0.0.1:1"  # nothing listens there; nothing here connects anyway
SECRET = "hunter2-s3cr3t"


# -- the targets: each builds or calls one entry point with the row's arguments ----------


def _reader(**kw: Any) -> Any:
    kw.setdefault("nsqd_tcp_addresses", NOWHERE)
    reader = Reader("t", "c", **kw)
    reader.close()
    return reader


def _producer(*args: Any, **kw: Any) -> Any:
    producer = Producer(*(args or (NOWHERE,)), **kw)
    producer.close()
    return producer


def _writer(*args: Any, **kw: Any) -> Any:
    writer = Writer(*(args or (NOWHERE,)), **kw)
    writer.close()
    return writer


def _call(method: str, *args: Any, **kw: Any) -> Any:
    """A publish call on a producer that has no connection yet: the check comes first.
    Writer's calls never raise (as pynsq's): their future carries the error."""
    producer = Writer(NOWHERE) if method in ("dpub", "mpub", "pub") else Producer(NOWHERE)
    try:
        result = getattr(producer, method)(*args, **kw)
        if isinstance(producer, Writer):
            raise result.exception()
        return result
    finally:
        producer.close()


def _read_options(**kw: str) -> Any:
    options = {"topic": "t", "channel": "c", "nsqdTcpAddresses": NOWHERE,
               "spoolPath": "/tmp/nowhere", **kw}
    return parse_read_options({k: v for k, v in options.items() if v is not None},
                              streaming=True)


def _write_options(**kw: str) -> Any:
    options = {"topic": "t", "nsqdTcpAddresses": NOWHERE, **kw}
    return parse_write_options({k: v for k, v in options.items() if v is not None})


TARGETS: dict[str, Callable[..., Any]] = {
    "ConnectionConfig": lambda **kw: ConnectionConfig.from_options(**kw),
    "Reader": _reader,
    "Producer": _producer,
    "Writer": _writer,
    "OppositeBloomFilter": lambda *a, **kw: OppositeBloomFilter(*a, **kw),
    "BloomFilter": lambda *a, **kw: BloomFilter(*a, **kw),
    "size_for": lambda *a: OppositeBloomFilter.size_for(*a),
    "RedisDeduplicator": lambda **kw: RedisDeduplicator("redis://127.0.0.1:1/0", **kw),
    # checked before the first command: nothing listens on port 1, nothing is asked
    "RedisBloomFilter": lambda **kw: RedisBloomFilter("redis://127.0.0.1:1/0", **kw),
    "MemcachedDeduplicator": lambda *a, **kw: MemcachedDeduplicator(*(a or (NOWHERE,)), **kw),
    "from_spec": from_spec,
    "lookup_url": lambda address: lookup_url(address, "t"),
    "read options": _read_options,
    "write options": _write_options,
}


def row(target: str, param: str, *args: Any, error: type[Exception] = ConfigError,
        named: str | None = None, **kw: Any) -> Any:
    """One bad input: ``TARGETS[target](*args, **kw)`` raises ``error`` whose message
    contains ``named`` (default: ``param``)."""
    shown = ", ".join([*(repr(a) for a in args), *(f"{k}={v!r}" for k, v in kw.items())])
    return pytest.param(target, args, kw, error, named or param,
                        id=f"{target}({shown})"[:90])


# -- item 4 of issue #13: addresses -------------------------------------------------------

ADDRESS_ROWS = [
    # the Reader's direct nsqd addresses
    row("Reader", "nsqd_tcp_addresses", nsqd_tcp_addresses="127.0.0.1:4150:9",
        error=InvalidAddressError),
    row("Reader", "nsqd_tcp_addresses", nsqd_tcp_addresses="http://127.0.0.1:4150",
        error=InvalidAddressError),
    row("Reader", "nsqd_tcp_addresses", nsqd_tcp_addresses=["127.0.0.1:4150", "h:0"],
        error=InvalidAddressError, named="'h:0'"),
    row("Reader", "nsqd_tcp_addresses", nsqd_tcp_addresses=4150, error=InvalidAddressError),
    row("Reader", "nsqd_tcp_addresses", nsqd_tcp_addresses="::1:4150",
        error=InvalidAddressError),
    # lookupd
    row("Reader", "lookupd_http_addresses", nsqd_tcp_addresses=None,
        lookupd_http_addresses="127.0.0.1:-1", error=InvalidAddressError),
    row("Reader", "lookupd_http_addresses", nsqd_tcp_addresses=None,
        lookupd_http_addresses=":abc", error=InvalidAddressError),
    row("Reader", "lookupd_http_addresses", nsqd_tcp_addresses=None,
        lookupd_http_addresses="ftp://h:4161", error=InvalidAddressError),
    row("Reader", "nsqd_tcp_addresses or lookupd_http_addresses", nsqd_tcp_addresses=None),
    row("lookup_url", "lookupd HTTP address", "127.0.0.1:-1", error=InvalidAddressError),
    row("lookup_url", "lookupd HTTP address", ":abc", error=InvalidAddressError),
    row("lookup_url", "lookupd HTTP address", "h:4161:1/lookup", error=InvalidAddressError),
    # the Producer and the Writer
    row("Producer", "nsqd_tcp_addresses", 4150, error=InvalidAddressError),
    row("Producer", "nsqd_tcp_addresses", "127.0.0.1:0", error=InvalidAddressError),
    row("Producer", "nsqd_tcp_addresses", "127.0.0.1:65536", error=InvalidAddressError),
    row("Producer", "nsqd_tcp_addresses", ":4150", error=InvalidAddressError),
    row("Producer", "nsqd_tcp_addresses", "", error=ConfigError,
        named="give nsqd_tcp_addresses or nsqd_http_addresses"),
    row("Producer", "nsqd_http_addresses", None, nsqd_http_addresses="h:4151:1",
        error=InvalidAddressError),
    row("Writer", "nsqd_tcp_addresses", "h:1:2", error=InvalidAddressError),
    row("Writer", "nsqd_tcp_addresses", ["h:1", None], error=InvalidAddressError),
    # the dedup stores
    row("MemcachedDeduplicator", "MemcachedDeduplicator client", "127.0.0.1:11211:1",
        error=InvalidAddressError),
    row("MemcachedDeduplicator", "MemcachedDeduplicator client", ("h", 0),
        error=InvalidAddressError),
    # the Spark options
    row("read options", "nsqdTcpAddresses", nsqdTcpAddresses="h:4150:extra",
        error=NSQOptionError),
    row("read options", "lookupdHttpAddresses", nsqdTcpAddresses=None,
        lookupdHttpAddresses="h:4161:extra", error=NSQOptionError),
    row("read options", "nsqdHttpAddresses", nsqdHttpAddresses="h:0", error=NSQOptionError),
    row("write options", "nsqdTcpAddresses", nsqdTcpAddresses="h:-1", error=NSQOptionError),
]


# -- item 5 of issue #13: numbers (and strings and flags) --------------------------------

CONNECTION_ROWS = [
    row("ConnectionConfig", "msg_timeout", msg_timeout=NAN),
    row("ConnectionConfig", "msg_timeout", msg_timeout=INF),
    row("ConnectionConfig", "msg_timeout", msg_timeout=0.5),
    row("ConnectionConfig", "msg_timeout", msg_timeout="60"),
    row("ConnectionConfig", "msg_timeout", msg_timeout=True),
    row("ConnectionConfig", "response_timeout", response_timeout=INF),
    row("ConnectionConfig", "response_timeout", response_timeout=NAN),
    row("ConnectionConfig", "response_timeout", response_timeout=0),
    row("ConnectionConfig", "connect_timeout", timeout=-1),
    row("ConnectionConfig", "connect_timeout", timeout="5"),
    row("ConnectionConfig", "close_timeout", close_timeout=1e12),
    row("ConnectionConfig", "close_timeout", close_timeout=10 ** 400),
    row("ConnectionConfig", "heartbeat_interval", heartbeat_interval=NAN),
    row("ConnectionConfig", "heartbeat_interval", heartbeat_interval=True),
    row("ConnectionConfig", "heartbeat_interval", heartbeat_interval=30000),
    row("ConnectionConfig", "sample_rate", sample_rate=1.5),
    row("ConnectionConfig", "sample_rate", sample_rate=-1),
    row("ConnectionConfig", "deflate_level", deflate_level=True),
    row("ConnectionConfig", "deflate_level", deflate_level=10),
    row("ConnectionConfig", "output_buffer_size", output_buffer_size=10),
    row("ConnectionConfig", "output_buffer_size", output_buffer_size=1.5),
    row("ConnectionConfig", "output_buffer_timeout", output_buffer_timeout=NAN),
    row("ConnectionConfig", "output_buffer_timeout", output_buffer_timeout=-5),
    row("ConnectionConfig", "requeue_delay", requeue_delay=NAN),
    row("ConnectionConfig", "requeue_delay", requeue_delay=-1),
    row("ConnectionConfig", "read_size", read_size=4096.0),
    row("ConnectionConfig", "max_frame_size", max_frame_size=None),
    row("ConnectionConfig", "user_agent", user_agent=123),
    row("ConnectionConfig", "user_agent", user_agent=""),
    row("ConnectionConfig", "hostname", hostname=5),
    row("ConnectionConfig", "client_id", client_id=b"me"),
    row("ConnectionConfig", "tls_v1", tls_v1="yes"),
    row("ConnectionConfig", "snappy", snappy=1),
    row("ConnectionConfig", "tls_check_hostname", tls_check_hostname="no"),
    row("ConnectionConfig", "tls_ca_file", tls_ca_file=5),
    row("ConnectionConfig", "auth_secret", auth_secret=12345),
    row("ConnectionConfig", "heartbeat_intervall", heartbeat_intervall=1,
        named="did you mean 'heartbeat_interval'"),
]

READER_ROWS = [
    row("Reader", "max_in_flight", max_in_flight=-1),
    row("Reader", "max_in_flight", max_in_flight=0, named="set_max_in_flight(0)"),
    row("Reader", "max_in_flight", max_in_flight=1.5),
    row("Reader", "max_in_flight", max_in_flight=True),
    row("Reader", "max_in_flight", max_in_flight="5"),
    row("Reader", "max_in_flight", max_in_flight=10 ** 400),
    row("Reader", "max_tries", max_tries="5"),
    row("Reader", "max_tries", max_tries=-1),
    row("Reader", "max_tries", max_tries=5.0),
    row("Reader", "max_tries", max_tries=70000),
    row("Reader", "lookupd_poll_interval", lookupd_poll_interval=NAN),
    row("Reader", "lookupd_poll_interval", lookupd_poll_interval=0),
    row("Reader", "lookupd_poll_jitter", lookupd_poll_jitter=1.5),
    row("Reader", "lookupd_poll_jitter", lookupd_poll_jitter=NAN),
    row("Reader", "lookupd_connect_timeout", lookupd_connect_timeout=INF),
    row("Reader", "lookupd_request_timeout", lookupd_request_timeout=None),
    row("Reader", "low_rdy_idle_timeout", low_rdy_idle_timeout=-1),
    row("Reader", "max_backoff_duration", max_backoff_duration=INF),
    row("Reader", "max_backoff_duration", max_backoff_duration="128"),
    row("Reader", "max_requeue_delay", max_requeue_delay=NAN),
    row("Reader", "backoff_multiplier", backoff_multiplier=0),
    row("Reader", "rdy_redistribute_interval", rdy_redistribute_interval=-INF),
    row("Reader", "reconnect_initial", reconnect_initial=True),
    row("Reader", "reconnect_max", reconnect_max=INF),
    row("Reader", "drain_timeout", drain_timeout=NAN),
    # connection options reach ConnectionConfig
    row("Reader", "msg_timeout", msg_timeout=NAN),
    row("Reader", "requeue_delay", requeue_delay=INF),
    row("Reader", "user_agent", user_agent=123),
]

PRODUCER_ROWS = [
    row("Producer", "max_tries", max_tries="5"),
    row("Producer", "max_tries", max_tries=0),
    row("Producer", "max_tries", max_tries=True),
    row("Producer", "max_tries", max_tries=2.5),
    row("Producer", "blocking_connections", blocking_connections=1.5),
    row("Producer", "blocking_connections", blocking_connections=0),
    row("Producer", "retry_wait", retry_wait=NAN),
    row("Producer", "retry_max_wait", retry_max_wait=-1),
    row("Producer", "retry_deadline", retry_deadline=INF),
    row("Producer", "publish_timeout", publish_timeout=NAN),
    row("Producer", "publish_timeout", publish_timeout=0),
    row("Producer", "max_msg_size", max_msg_size=0),
    row("Producer", "max_msg_size", max_msg_size=1e6),
    row("Producer", "max_mpub_bytes", max_mpub_bytes=0),
    row("Producer", "strategy", strategy="random"),
    row("Producer", "spool_max_bytes", spool_max_bytes=NAN),
    row("Producer", "spool_block_timeout", spool_block_timeout=INF),
    row("Producer", "batch_size", batch_size=0),
    row("Producer", "batch_bytes", batch_bytes="1"),
    row("Producer", "rescan_interval", rescan_interval=0),
    row("Producer", "response_timeout", response_timeout=INF),
    row("Producer", "msg_timeout", msg_timeout=NAN),
    row("Writer", "max_tries", max_tries="5"),
    row("Writer", "publish_timeout", publish_timeout=INF),
    row("Writer", "reconnect_interval", reconnect_interval=NAN),
]

PUBLISH_ROWS = [
    pytest.param("mpublish", ("t", None), {}, InvalidBodyError, "bodies",
                 id="mpublish(t, None)"),
    pytest.param("mpublish", ("t", b"abc"), {}, InvalidBodyError, "bodies",
                 id="mpublish(t, b'abc')"),
    pytest.param("mpublish", ("t", 5), {}, InvalidBodyError, "bodies", id="mpublish(t, 5)"),
    pytest.param("mpublish_async", ("t", None), {}, InvalidBodyError, "bodies",
                 id="mpublish_async(t, None)"),
    pytest.param("publish", ("t", "text"), {}, InvalidBodyError, "body",
                 id="publish(t, 'text')"),
    pytest.param("publish", ("t", None), {}, InvalidBodyError, "body", id="publish(t, None)"),
    pytest.param("publish", ("t", b""), {}, InvalidBodyError, "body", id="publish(t, b'')"),
    pytest.param("publish", ("t", b"x"), {"defer_ms": NAN}, ConfigError, "defer_ms",
                 id="publish(defer_ms=nan)"),
    pytest.param("publish", ("t", b"x"), {"defer_ms": -1}, ConfigError, "defer_ms",
                 id="publish(defer_ms=-1)"),
    pytest.param("publish", ("t", b"x"), {"defer_ms": 1.5}, ConfigError, "defer_ms",
                 id="publish(defer_ms=1.5)"),
    pytest.param("publish", ("t", b"x"), {"defer_ms": True}, ConfigError, "defer_ms",
                 id="publish(defer_ms=True)"),
    pytest.param("publish", ("t", b"x"), {"defer_ms": "5"}, ConfigError, "defer_ms",
                 id="publish(defer_ms='5')"),
    pytest.param("publish", ("t", b"x"), {"defer_ms": 2 ** 63}, ConfigError, "defer_ms",
                 id="publish(defer_ms=2**63)"),
    pytest.param("publish_async", ("t", b"x"), {"defer_ms": INF}, ConfigError, "defer_ms",
                 id="publish_async(defer_ms=inf)"),
    pytest.param("dpub", ("t", NAN, b"x"), {}, ConfigError, "delay_ms", id="Writer.dpub(nan)"),
    pytest.param("dpub", ("t", None, b"x"), {}, ConfigError, "delay_ms",
                 id="Writer.dpub(None)"),
    pytest.param("mpub", ("t", None), {}, InvalidBodyError, "msg", id="Writer.mpub(t, None)"),
]

DEDUP_ROWS = [
    row("OppositeBloomFilter", "digest_size", 10, digest_size="16"),
    row("OppositeBloomFilter", "digest_size", 10, digest_size=0),
    row("OppositeBloomFilter", "size", 1.5),
    row("OppositeBloomFilter", "size", True),
    row("OppositeBloomFilter", "size", 10 ** 13, named="MAX_MEMORY_BYTES"),
    row("size_for", "rate_per_second", INF, 60, 0.9),
    row("size_for", "rate_per_second", NAN, 60, 0.9),
    row("size_for", "window_seconds", 1000, -1, 0.9),
    row("size_for", "probability", 1000, 60, 1.0),
    row("size_for", "probability", 1000, 60, "0.9"),
    row("size_for", "MAX_MEMORY_BYTES", 1e9, 1e6, 0.99),
    row("BloomFilter", "error_rate", 100, "0.1"),
    row("BloomFilter", "error_rate", 100, NAN),
    row("BloomFilter", "error_rate", 100, 1.0),
    row("BloomFilter", "capacity", True),
    row("BloomFilter", "capacity", 10.0),
    row("BloomFilter", "capacity", 10 ** 13, 1e-9, named="MAX_MEMORY_BYTES"),
    row("BloomFilter", "max_erased", 100, max_erased=-1),
    row("RedisBloomFilter", "capacity", capacity=0),
    row("RedisBloomFilter", "error_rate", error_rate=INF),
    row("RedisBloomFilter", "erase_ttl", erase_ttl=1.5),
    row("RedisBloomFilter", "module", module="yes"),
    row("RedisDeduplicator", "ttl", ttl=1.5),
    row("RedisDeduplicator", "ttl", ttl=True),
    row("RedisDeduplicator", "ttl", ttl=0),
    row("RedisDeduplicator", "keep_days", keep_days=True),
    row("RedisDeduplicator", "prefix", prefix=""),
    row("MemcachedDeduplicator", "ttl", ttl=NAN),
    row("MemcachedDeduplicator", "timeout", timeout=INF),
    row("from_spec", "error_rate", "memory://bloom?capacity=100&error_rate=nan"),
    row("from_spec", "ttl", "memcached://127.0.0.1:11211?ttl=1.5"),
    row("from_spec", "digest_size", "memory://opposite?size=10&digest_size=x"),
    row("from_spec", "rate_per_second", "memory://opposite?rate=inf&window=60"),
]

SPARK_ROWS = [
    row("read options", "maxInFlight", maxInFlight="0", error=NSQOptionError),
    row("read options", "maxInFlight", maxInFlight="1.5", error=NSQOptionError),
    row("read options", "maxInFlight", maxInFlight="nan", error=NSQOptionError),
    row("read options", "maxInFlight", maxInFlight="10000000", error=NSQOptionError),
    row("read options", "numPartitions", numPartitions="0", error=NSQOptionError),
    row("read options", "numPartitions", numPartitions="100000", error=NSQOptionError),
    row("read options", "maxMessagesPerTrigger", maxMessagesPerTrigger="-5",
        error=NSQOptionError),
    row("read options", "maxFetchPeriod", maxFetchPeriod="nan", error=NSQOptionError),
    row("read options", "maxFetchPeriod", maxFetchPeriod="inf", error=NSQOptionError),
    row("read options", "idleTimeout", idleTimeout="0", error=NSQOptionError),
    row("read options", "idleTimeout", idleTimeout="1e12", error=NSQOptionError),
    row("read options", "maxAttempts", maxAttempts="70000", error=NSQOptionError),
    row("read options", "maxMessages", maxMessages="many", error=NSQOptionError),
    row("read options", "msgTimeout", msgTimeout="nan", error=NSQOptionError),
    row("read options", "msgTimeout", msgTimeout="500", error=NSQOptionError),
    row("read options", "heartbeatInterval", heartbeatInterval="5", error=NSQOptionError),
    row("read options", "deflateLevel", deflate="true", deflateLevel="10",
        error=NSQOptionError),
    row("read options", "msg_timeout", **{"nsq.msg_timeout": "nan"}, error=NSQOptionError),
    row("read options", "user_agent", **{"nsq.user_agent": "5"}, error=NSQOptionError),
    row("write options", "batchSize", batchSize="0", error=NSQOptionError),
    row("write options", "batchSize", batchSize="1.5", error=NSQOptionError),
    row("write options", "maxBatchBytes", maxBatchBytes="1", error=NSQOptionError),
    row("write options", "retries", retries="-1", error=NSQOptionError),
    row("write options", "publishTimeout", publishTimeout="inf", error=NSQOptionError),
]


@pytest.mark.parametrize("target, args, kwargs, error, named", [
    *ADDRESS_ROWS, *CONNECTION_ROWS, *READER_ROWS, *PRODUCER_ROWS, *DEDUP_ROWS, *SPARK_ROWS])
def test_bad_input_is_a_typed_error_naming_the_parameter(target, args, kwargs, error, named):
    with pytest.raises(error) as caught:
        TARGETS[target](*args, **kwargs)
    assert named in str(caught.value)


@pytest.mark.parametrize("method, args, kwargs, error, named", PUBLISH_ROWS)
def test_bad_publish_arguments_fail_before_anything_is_sent(method, args, kwargs, error,
                                                            named):
    with pytest.raises(error) as caught:
        _call(method, *args, **kwargs)
    assert named in str(caught.value)


def test_every_typed_error_is_a_config_or_body_error_and_a_value_error():
    # what callers catch: nsq_spark.errors classes, and ValueError for pynsq-style code
    assert issubclass(NSQOptionError, ConfigError)
    assert issubclass(InvalidAddressError, ConfigError)
    assert all(issubclass(c, ValueError) for c in (ConfigError, InvalidBodyError))


def test_a_secret_of_the_wrong_type_is_not_echoed():
    with pytest.raises(ConfigError) as caught:
        ConnectionConfig(auth_secret=987654321)  # type: ignore[arg-type]
    assert "auth_secret" in str(caught.value) and "987654321" not in str(caught.value)


# -- the CLI: bad numbers are usage errors (exit 2), bad addresses errors (exit 1) ------


@pytest.mark.parametrize("argv, option", [
    (["publish", "--topic", "t", "--nsqd-tcp-address", NOWHERE, "--rate", "nan"], "--rate"),
    (["publish", "--topic", "t", "--nsqd-tcp-address", NOWHERE, "--batch-size", "0"],
     "--batch-size"),
    (["publish", "--topic", "t", "--nsqd-tcp-address", NOWHERE, "--flush-timeout", "inf"],
     "--flush-timeout"),
    (["publish", "--topic", "t", "--nsqd-tcp-address", NOWHERE, "--spool-max-bytes", "1.5"],
     "--spool-max-bytes"),
    (["tail", "--topic", "t", "--nsqd-tcp-address", NOWHERE, "-n", "-1"], "-n"),
    (["tail", "--topic", "t", "--nsqd-tcp-address", NOWHERE, "--idle-exit", "nan"],
     "--idle-exit"),
    (["tail", "--topic", "t", "--nsqd-tcp-address", NOWHERE, "--max-in-flight", "0"],
     "--max-in-flight"),
], ids=lambda v: " ".join(v[-2:]) if isinstance(v, list) else v)
def test_cli_bad_numbers_are_usage_errors_naming_the_option(argv, option, capsys):
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert f"argument {option}" in err and "give" in err


@pytest.mark.parametrize("command", ["publish", "tail"])
@pytest.mark.parametrize("address", ["127.0.0.1:4150:9", "http://127.0.0.1:4150", "h:0"])
def test_cli_bad_addresses_are_errors_naming_the_parameter(command, address):
    err = io.StringIO()
    argv = [command, "--topic", "t", "--nsqd-tcp-address", address, "--quiet"]
    assert cli_main(argv, stdin=io.BytesIO(b"x\n"), stdout=io.BytesIO(), stderr=err) == 1
    assert "nsqd_tcp_addresses" in err.getvalue() and repr(address) in err.getvalue()


# -- accepted on purpose (documented where the option is defined) ------------------------


def test_accepted_comma_joined_addresses_like_pynsq():
    # Reader/Producer docstrings: "a list, or one comma-separated string"
    assert _reader(nsqd_tcp_addresses="a:1, b:2,a:1").nsqd_tcp_addresses == ["a:1", "b:2"]
    assert _producer("a:1,b:2").nsqd_tcp_addresses == ["a:1", "b:2"]
    assert _read_options(nsqdTcpAddresses="a:1,b:2").nsqd_tcp_addresses == ["a:1", "b:2"]


def test_accepted_ipv6_in_brackets_everywhere():
    assert _reader(nsqd_tcp_addresses="[::1]:4150").nsqd_tcp_addresses == ["[::1]:4150"]
    assert _producer(["[::1]:4150"]).nsqd_tcp_addresses == ["[::1]:4150"]
    assert _read_options(nsqdTcpAddresses="[::1]:4150").nsqd_tcp_addresses == ["[::1]:4150"]
    assert lookup_url("[::1]:4161", "t") == "http://[::1]:4161/lookup?topic=t"


def test_accepted_lookupd_urls_with_scheme_and_path_like_pynsq():
    reader = _reader(nsqd_tcp_addresses=None,
                     lookupd_http_addresses="https://h:4161/base/, h:4161/lookup")
    assert reader.lookupd_http_addresses == ["https://h:4161/base/", "h:4161/lookup"]


def test_accepted_special_values_keep_their_meaning():
    cfg = ConnectionConfig(heartbeat_interval=-1, output_buffer_size=-1,
                           output_buffer_timeout=0, msg_timeout=None, connect_timeout=2)
    assert cfg.identify_payload()["heartbeat_interval"] == -1
    assert cfg.identify_payload()["output_buffer_size"] == -1
    reader = _reader(max_tries=0, max_backoff_duration=0,
                     low_rdy_idle_timeout=0, drain_timeout=0)
    assert reader.max_tries == 0 and reader.max_backoff_duration == 0
    producer = _producer(publish_timeout=None, retry_deadline=None, max_tries=1)
    assert producer.publish_timeout is None and producer.max_tries == 1


# -- hypothesis: the rule holds for every value, not only the rows above ----------------

SECONDS_OPTIONS = ["connect_timeout", "response_timeout", "close_timeout", "requeue_delay",
                   "msg_timeout", "heartbeat_interval"]
# infinities, and NaNs with any sign and payload (the bits of a float64 with all-ones exponent)
NOT_FINITE = st.one_of(
    st.sampled_from([INF, -INF]),
    st.tuples(st.booleans(), st.integers(1, 2 ** 52 - 1)).map(
        lambda sm: struct.unpack("<d", struct.pack(
            "<Q", (sm[0] << 63) | (0x7FF << 52) | sm[1]))[0]))


@given(st.sampled_from(SECONDS_OPTIONS), NOT_FINITE)
def test_any_non_finite_float_is_refused_naming_the_option(option, value):
    with pytest.raises(ConfigError, match=option):
        ConnectionConfig.from_options(**{option: value})


@given(st.sampled_from(SECONDS_OPTIONS + ["sample_rate", "deflate_level", "read_size"]),
       st.booleans())
def test_a_bool_is_never_a_number(option, value):
    with pytest.raises(ConfigError, match=option):
        ConnectionConfig.from_options(**{option: value})


@given(st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(),
                 st.integers(10 ** 300, 10 ** 400)),
       st.floats(-1e6, 1e6), st.floats(0, 1e6), st.booleans())
def test_number_accepts_exactly_the_finite_values_in_range(value, lo, width, lo_open):
    hi = lo + width
    finite = isinstance(value, int) or math.isfinite(value)
    expected = finite and (value > lo if lo_open else value >= lo) and value <= hi
    try:
        got = validate.number(value, "p", lo=lo, hi=hi, lo_open=lo_open)
    except ConfigError as exc:
        assert not expected and str(exc).startswith("p=")
    else:
        assert expected and got == value


@given(st.integers(1, 65535), st.ip_addresses(v=4))
def test_any_valid_port_parses_and_round_trips(port, host):
    text = f"{host}:{port}"
    assert parse_address(text, "p") == Address(str(host), port)
    assert str(parse_address(text, "p")) == text


@given(st.integers(1, 65535), st.ip_addresses(v=6))
def test_any_bracketed_ipv6_address_parses(port, host):
    assert parse_address(f"[{host}]:{port}", "p") == Address(str(host), port)


@given(st.one_of(st.integers(max_value=0), st.integers(min_value=65536)))
def test_any_port_outside_1_to_65535_is_refused_naming_the_entry(port):
    with pytest.raises(InvalidAddressError, match=r"nsqd_tcp_addresses: 'h:-?\d+'"):
        parse_address(f"h:{port}", "nsqd_tcp_addresses")


@settings(max_examples=50)
@given(st.text(min_size=1, max_size=12).filter(lambda s: "," not in s and s.strip()))
def test_any_text_with_two_colons_is_refused(junk):
    with pytest.raises(InvalidAddressError):
        parse_address(f"h:1:{junk}", "p")


# -- secrets: never in a repr or str --------------------------------------------------


def test_no_secret_in_the_connection_config():
    cfg = ConnectionConfig(auth_secret=SECRET)
    assert SECRET not in repr(cfg) and SECRET not in str(cfg)
    assert cfg.auth_secret == SECRET


def test_no_secret_in_the_producer_reader_and_writer():
    producer = _producer(auth_secret=SECRET)
    writer = _writer(auth_secret=SECRET.encode())
    reader = _reader(auth_secret=SECRET)
    for obj in (producer, producer.config, writer, writer.config, reader, reader.config):
        assert SECRET not in repr(obj) and SECRET not in str(obj)
    assert reader.config.auth_secret == SECRET


def test_no_secret_in_the_spark_read_and_write_options():
    read = _read_options(authSecret=SECRET, dedup=f"redis://:{SECRET}@127.0.0.1:6379/0",
                         spoolPath=f"s3://bucket/spool?access_key=AK&secret_key={SECRET}",
                         **{"nsq.auth_secret": SECRET})
    write = _write_options(authSecret=SECRET)
    for options in (read, write):
        assert SECRET not in repr(options) and SECRET not in str(options)
        assert options.connection["auth_secret"] == SECRET  # hidden, not lost
        assert validate.REDACTED in repr(options)
    assert read.dedup == f"redis://:{SECRET}@127.0.0.1:6379/0"
    assert "access_key=AK" in repr(read) and "127.0.0.1:6379" in repr(read)


def test_no_secret_in_the_cli_arguments(monkeypatch, tmp_path):
    from nsq_spark.cli import build_parser
    from nsq_spark.cli._common import connection_options

    monkeypatch.setenv("NSQ_AUTH_SECRET", SECRET)
    args = build_parser().parse_args(
        ["tail", "--topic", "t", "--nsqd-tcp-address", NOWHERE])
    assert SECRET not in repr(args)
    assert connection_options(args)["auth_secret"] == SECRET
    secret_file = tmp_path / "secret"
    secret_file.write_text(SECRET + "\n")
    args = build_parser().parse_args(["publish", "--topic", "t", "--nsqd-tcp-address",
                                      NOWHERE, "--auth-secret-file", str(secret_file)])
    assert SECRET not in repr(args)
    # on the command line it would be visible to every user (ps): refused
    with pytest.raises(SystemExit):
        build_parser().parse_args(["tail", "--topic", "t", "--auth-secret", SECRET])


def test_no_password_in_dedup_spec_errors():
    with pytest.raises(ConfigError) as caught:
        from_spec(f"redis://:{SECRET}@127.0.0.1:1/0?no_such_option=1")
    assert "no_such_option" in str(caught.value) and SECRET not in str(caught.value)


@pytest.mark.parametrize("url, shown", [
    ("redis://:pw@h:1/0", "redis://:***@h:1/0"),
    ("redis://user:pw@h:1/0?ttl=5", "redis://user:***@h:1/0?ttl=5"),
    ("s3://b/p?access_key=a&secret_key=pw", "s3://b/p?access_key=a&secret_key=***"),
    ("redis://h:1/0?password=pw&key=id", "redis://h:1/0?password=***&key=id"),
    ("/local/path", "/local/path"),
])
def test_redact_url_hides_passwords_and_secret_parameters(url, shown):
    assert validate.redact_url(url) == shown
