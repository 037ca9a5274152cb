"""Structured log records: the fields every part binds (nsq_spark/_log.py), the Spark
task's fields (nsq_spark/spark/logs.py), JSON output through python-json-logger, and no
secret in any field or message (docs/logging.md)."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pythonjsonlogger.json import JsonFormatter

from nsq_spark import _log
from nsq_spark._log import FIELDS, ContextLogger, get_logger
from nsq_spark.spark import _logs as logs
from nsq_spark.testing import wait_until

HERE = os.path.dirname(os.path.abspath(__file__))


class Collect(logging.Handler):
    """Every record that reaches it, formatted too (tracebacks included)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self.lines: list[str] = []
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))
        self.records.append(record)

    def messages(self) -> list[str]:
        return [r.getMessage() for r in self.records]


@pytest.fixture
def collect() -> Iterator[Collect]:
    """Every record of the ``nsq_spark`` loggers, at DEBUG, for the test."""
    logger = logging.getLogger("nsq_spark")
    handler, level = Collect(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def fields_of(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k in FIELDS}


# -- the adapter (no sockets) ----------------------------------------------------------------


@pytest.mark.unit
def test_a_bound_field_is_on_every_record_and_a_call_extra_adds_to_it(collect: Collect) -> None:
    log = get_logger("nsq_spark.test").bind(nsqd="127.0.0.1:4150", topic="t")
    log.info("one")
    log.bind(channel="c").warning("two", extra={"reader": "r"})
    one, two = collect.records
    assert fields_of(one) == {"nsqd": "127.0.0.1:4150", "topic": "t"}
    assert fields_of(two) == {"nsqd": "127.0.0.1:4150", "topic": "t", "channel": "c",
                              "reader": "r"}


@pytest.mark.unit
def test_a_record_names_the_line_that_logged_it_not_the_adapter(collect: Collect) -> None:
    def logs_here() -> None:
        get_logger("nsq_spark.test").for_nsqd("h:1").error("here")

    logs_here()
    (rec,) = collect.records
    assert rec.funcName == "logs_here" and rec.filename == "test_logging_fields.py"


@pytest.mark.unit
def test_an_unknown_field_name_is_refused_with_the_fix() -> None:
    with pytest.raises(ValueError, match=r"'queue'.*FIELDS"):
        get_logger("nsq_spark.test", queue="q")


@pytest.mark.unit
def test_no_field_name_clashes_with_a_logrecord_attribute_and_none_says_secret() -> None:
    logger = logging.getLogger("nsq_spark.test.clash")
    # makeRecord raises KeyError for an extra that would overwrite a LogRecord attribute
    rec = logger.makeRecord(logger.name, logging.INFO, __file__, 1, "m", (), None,
                            extra={name: 1 for name in FIELDS})
    assert all(getattr(rec, name) == 1 for name in FIELDS)
    from nsq_spark._validate import is_secret_name
    assert not [name for name in FIELDS if is_secret_name(name)]


@pytest.mark.unit
def test_nothing_is_built_when_the_level_is_disabled(collect: Collect) -> None:
    calls = []

    class Counting(ContextLogger):
        def process(self, msg: Any, kwargs: Any) -> Any:
            calls.append(msg)
            return super().process(msg, kwargs)

    log = Counting(logging.getLogger("nsq_spark.test.quiet"), {"topic": "t"})
    logging.getLogger("nsq_spark.test.quiet").setLevel(logging.WARNING)
    try:
        log.debug("hidden %s", "x")
        log.info("hidden")
        log.warning("shown")
    finally:
        logging.getLogger("nsq_spark.test.quiet").setLevel(logging.NOTSET)
    assert calls == ["shown"] and collect.messages() == ["shown"]


@pytest.mark.unit
def test_the_children_per_address_are_made_once_and_stay_bounded() -> None:
    log = get_logger("nsq_spark.test")
    assert log.for_nsqd("a:1") is log.for_nsqd("a:1")
    for i in range(_log._MAX_CHILDREN + 5):
        log.for_lookupd(f"h:{i}")
    assert len(log._children) <= _log._MAX_CHILDREN


passwords = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789", min_size=8, max_size=24)


@pytest.mark.unit
@given(password=passwords)
def test_a_url_password_reaches_neither_a_field_nor_a_message(password: str) -> None:
    url = f"redis://user:{password}@127.0.0.1:6379/0?secret_key={password}"
    handler = Collect()
    logger = logging.getLogger("nsq_spark.test.redact")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        log = get_logger(logger.name).bind(lookupd=url, spool=url)
        log.warning("cannot reach %s (%r)", url, url)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(logging.NOTSET)
    (rec,) = handler.records
    assert password not in rec.getMessage() and password not in repr(fields_of(rec))
    assert "127.0.0.1:6379" in rec.getMessage() and fields_of(rec)["lookupd"].startswith("redis://user:")


# -- the Spark task's fields (no Spark) -----------------------------------------------------


@pytest.mark.unit
def test_a_spark_tasks_fields_are_on_its_lines_and_the_readers_thread_lines_too(
        collect: Collect) -> None:
    fetch = get_logger("nsq_spark.spark.fetch")

    def rows() -> Iterator[int]:
        fetch.info("batch 3 part 1: fetched")
        io_thread = threading.Thread(
            target=lambda: get_logger("nsq_spark.reader.pool").for_nsqd("h:1").info("sub"))
        io_thread.start()
        io_thread.join()
        yield 1

    assert list(logs.task_rows("DEBUG", rows(), topic="t", channel="c", spark_query="q1",
                               spark_batch=3, spark_partition=1)) == [1]
    fetch.info("after the task")
    task, io, after = collect.records
    want = {"topic": "t", "channel": "c", "spark_query": "q1", "spark_batch": 3,
            "spark_partition": 1}
    assert fields_of(task) == want and fields_of(io) == {**want, "nsqd": "h:1"}
    assert fields_of(after) == {}


@pytest.mark.unit
def test_the_text_label_is_made_from_the_fields() -> None:
    assert logs.label_of({"topic": "t", "channel": "c", "spark_batch": 3,
                          "spark_partition": 1}) == "t/c batch 3 part 1"
    assert logs.label_of({"topic": "t", "channel": "c", "spark_partition": 2}) == \
        "t/c read part 2"
    assert logs.label_of({}) == "-"


JSON_SCRIPT = """
from nsq_spark.spark import _logs as logs
from nsq_spark._log import get_logger
log = get_logger("nsq_spark.spark.fetch")
def rows():
    log.info("batch 3 part 1: 10 rows")
    yield 1
list(logs.task_rows("INFO", rows(), topic="t", channel="c", spark_query="q1",
                    spark_batch=3, spark_partition=1))
"""


@pytest.mark.unit
def test_spark_workers_write_json_lines_with_the_tasks_fields() -> None:
    env = {k: v for k, v in os.environ.items() if k != "NSQ_SPARK_LOG_LEVEL"}
    env["NSQ_SPARK_LOG_FORMAT"] = "json"
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(HERE), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-c", JSON_SCRIPT], capture_output=True,
                          text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    (line,) = [json.loads(x) for x in proc.stderr.splitlines() if x.startswith("{")]
    assert line["message"] == "batch 3 part 1: 10 rows" and line["levelname"] == "INFO"
    assert line["name"] == "nsq_spark.spark.fetch"
    assert {k: line[k] for k in ("topic", "channel", "spark_query", "spark_batch",
                                 "spark_partition")} == \
        {"topic": "t", "channel": "c", "spark_query": "q1", "spark_batch": 3,
         "spark_partition": 1}


# -- a real Reader against a real nsqd --------------------------------------------------------


@pytest.mark.nsqd
@pytest.mark.timeout(60)
@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_a_real_readers_connect_lines_carry_nsqd_topic_and_channel_as_json_fields(
        nsq_cluster: Any, running_reader: Any) -> None:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter("{asctime}{levelname}{name}{message}", style="{"))
    logger = logging.getLogger("nsq_spark")
    logger.addHandler(handler)
    level, logger.level = logger.level, logging.INFO
    addr = nsq_cluster.nsqd_tcp_addresses[0]
    try:
        r = running_reader.start("jt", "jc", lambda m: True, nsqd_tcp_addresses=[addr])
        wait_until(lambda: "subscribed to nsqd" in out.getvalue(), 10, "the SUB line")
        running_reader.stop(r)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    lines = [json.loads(x) for x in out.getvalue().splitlines()]
    connect = [x for x in lines if x["message"].startswith(("[jt:jc] connecting to nsqd",
                                                             "[jt:jc] subscribed to nsqd"))]
    assert len(connect) == 2, lines
    for x in connect:
        assert addr in x["message"]  # the address stays in the text too
        assert (x["nsqd"], x["topic"], x["channel"], x["reader"]) == (addr, "jt", "jc", "jt:jc")
    started = [x for x in lines if "starting reader" in x["message"]]
    assert started and started[0]["topic"] == "jt" and started[0]["channel"] == "jc"


# -- no secret anywhere -----------------------------------------------------------------------

AUTH_SECRET = "s3cr3t-auth-7f2a"
WRONG_SECRET = "wr0ng-auth-91c4"
REDIS_PASSWORD = "r3dis-pw-5e8b"


def assert_nowhere(secrets: list[str], collect: Collect) -> None:
    assert collect.records, "no record was captured: the check would pass vacuously"
    for rec, line in zip(collect.records, collect.lines):
        everything = line + repr(vars(rec)) + rec.getMessage()
        for secret in secrets:
            assert secret not in everything, (secret, line)


@pytest.mark.nsqd
@pytest.mark.dedup
@pytest.mark.timeout(90)
def test_no_secret_in_any_record_of_a_reader_a_producer_and_a_dedup_store(
        running_reader: Any, redis_server: Any, collect: Collect) -> None:
    from conn_tls_helpers import auth_server

    from nsq_spark.dedup import from_spec
    from nsq_spark._publish.producer import Producer
    from nsq_spark.testing import NSQCluster

    grants = {AUTH_SECRET: {"ttl": 60, "identity": "tester", "authorizations": [
        {"topic": ".*", "channels": [".*"], "permissions": ["subscribe", "publish"]}]}}
    with auth_server(grants) as auth, \
            NSQCluster(nsqd=1, lookupd=0, auth_http_address=auth.address) as cluster:
        addr = cluster.nsqd_tcp_addresses[0]
        # a handshake refused (AUTH with a wrong secret), and the reconnects after it
        refused = running_reader.start("st", "sc", lambda m: True, nsqd_tcp_addresses=[addr],
                                       auth_secret=WRONG_SECRET, reconnect_initial=0.05,
                                       reconnect_max=0.1)
        wait_until(lambda: sum("cannot connect to nsqd" in m for m in collect.messages()) >= 2,
                   20, "two refused connects")
        running_reader.stop(refused)
        # a Producer that authenticates, and one that is refused
        with Producer(addr, auth_secret=AUTH_SECRET) as p:
            p.publish("st", b"one")
            p.publish("st", b"two")
        with Producer(addr, auth_secret=WRONG_SECRET, max_tries=1, retry_deadline=1) as bad:
            with pytest.raises(Exception):
                bad.publish("st", b"refused")
        # a Reader with a dedup store whose URL has a password the server refuses
        host_port = redis_server.url.split("//", 1)[1]
        dedup = from_spec(f"redis://user:{REDIS_PASSWORD}@{host_port}")
        got: list[bytes] = []

        def handle(m: Any) -> bool:
            got.append(m.body)
            return True
        r = running_reader.start("st", "sc", handle,
                                 nsqd_tcp_addresses=[addr], auth_secret=AUTH_SECRET,
                                 dedup=dedup)
        wait_until(lambda: len(got) >= 2, 20, "the messages, handled without dedup")
        running_reader.stop(r)
    messages = collect.messages()
    assert any("authenticated as" in m for m in messages), messages
    assert any("dedup claim failed" in m for m in messages), messages
    assert any("is down" in m for m in messages), messages
    assert_nowhere([AUTH_SECRET, WRONG_SECRET, REDIS_PASSWORD], collect)


# -- a real Spark query's workers, in JSON (a child driver, so its stderr can be read) --------

SPARK_JSON_SCRIPT = """
import sys
sys.path.insert(0, {spark_tests!r})
from sparkutil import build_session
import nsq_spark.spark
spark = build_session("nsq-json-logs")
nsq_spark.spark.register(spark)
df = (spark.read.format("nsq").option("topic", "jl").option("channel", "c")
      .option("nsqdTcpAddresses", {tcp!r}).option("idleTimeout", 0.5)
      .option("logLevel", "INFO").load())
print("ROWS", df.count(), flush=True)
"""


@pytest.mark.nsqd
@pytest.mark.spark
@pytest.mark.timeout(300)
@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_a_real_spark_reads_workers_write_json_lines_with_the_task_and_connection_fields(
        nsq_cluster: Any, tmp_path: Any) -> None:
    pytest.importorskip("pyspark")
    spark_tests = os.path.join(HERE, "spark")
    sys.path.insert(0, spark_tests)
    try:
        from sparkutil import spark_env
    finally:
        sys.path.remove(spark_tests)
    addr = nsq_cluster.nsqd_tcp_addresses[0]
    nsq_cluster.publish("jl", [b"m%d" % i for i in range(20)])
    env = {k: v for k, v in os.environ.items() if k != "NSQ_SPARK_LOG_LEVEL"}
    env.update(spark_env(), NSQ_SPARK_LOG_FORMAT="json",
               PYTHONPATH=os.pathsep.join([os.path.dirname(HERE), env.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [sys.executable, "-c", SPARK_JSON_SCRIPT.format(spark_tests=spark_tests, tcp=addr)],
        capture_output=True, text=True, timeout=240, env=env, cwd=str(tmp_path))
    assert "ROWS 20" in proc.stdout, proc.stdout + proc.stderr[-3000:]
    lines = [json.loads(x) for x in proc.stderr.splitlines() if x.startswith('{"asctime"')]
    subscribed = [x for x in lines if "subscribed to nsqd" in x["message"]]
    assert subscribed, proc.stderr[-3000:]
    for x in subscribed:  # the Reader's IO thread, inside a fetch task
        assert (x["nsqd"], x["topic"], x["channel"]) == (addr, "jl", "c")
        assert x["spark_partition"] in (0, 1) and addr in x["message"]
