"""What the source says about trouble it cannot fix: a paused channel or topic, an nsqd
that left mid-stream (in the progress and a WARNING), the causes of a fetch task's
failure (AUTH, TLS, connection refused, the dedup store), and its own log lines.

The driver and the fetch tasks are driven directly against real nsqd processes (no Spark
query) where that shows the behaviour; one real Spark query shows the log level option.
"""

from __future__ import annotations

import logging
import os
import sys
import time
import urllib.request

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from sparkutil import http_mpub  # noqa: E402

from nsq_spark.testing import NSQCluster  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def nsqd_post(http_address: str, path: str) -> None:
    req = urllib.request.Request(f"http://{http_address}{path}", data=b"", method="POST")
    with urllib.request.urlopen(req, timeout=5) as resp:
        resp.read()


def wait_for(cond, timeout: float = 15.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def stream_reader(**options: str):
    from nsq_spark.spark.datasource import NSQStreamReader

    # each call must see what the test changed on nsqd just before: measure every time
    # (an idle source measures every backlogPollInterval seconds)
    options.setdefault("backlogPollInterval", "0")
    return NSQStreamReader(options)


def no_limit():
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    return ReadAllAvailable()


# -- paused channels and topics, nsqds gone mid-stream ------------------------------------


@pytest.mark.nsqd
@pytest.mark.spark
@pytest.mark.timeout(120)
def test_paused_backlog_plans_no_batch_and_a_gone_nsqd_is_reported(tmp_path, caplog):
    topic, channel = "vis_paused", "c"
    with NSQCluster(nsqd=2, lookupd=1) as cluster:
        n0, n1 = cluster.nsqds
        http_mpub(n0.http_address, topic, [b"a%d" % i for i in range(30)])
        http_mpub(n1.http_address, topic, [b"b%d" % i for i in range(20)])
        from nsq_spark.spark._backlog import lookup_nsqd_http

        wait_for(lambda: len(lookup_nsqd_http(cluster.lookupd_http_addresses, topic)) == 2,
                 what="both nsqds registered for the topic")
        reader = stream_reader(topic=topic, channel=channel,
                               lookupdHttpAddresses=cluster.lookupd_http_addresses[0],
                               spoolPath=str(tmp_path / "spool"))
        start = reader.initialOffset()
        # the first trigger creates the channel; nsqd copies the topic into it
        assert reader.latestOffset(start, no_limit())["size"] == 50
        wait_for(lambda: reader._subscription.handles[topic].backlog() == 50 and
                 reader._subscription.handles[topic].last.counts.topic_depth == 0, what="the channels filled")

        # the channel paused on one nsqd: only the other one's messages are planned
        nsqd_post(n0.http_address, f"/channel/pause?topic={topic}&channel={channel}")
        with caplog.at_level(logging.WARNING, logger="nsq_spark"):
            caplog.clear()
            end = reader.latestOffset(start, no_limit())
        assert end["batch"] == 1 and end["size"] == 20
        report = reader.reportLatestOffset()["backlog"]
        assert report["paused"] == [{"nsqd": n0.http_address, "paused": "channel",
                                     "depth": 30}]
        assert report["depth"] == 50 and report["fetchable"] == 20
        warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert any("channel is paused" in m and n0.http_address in m and
                   f"{topic}/{channel}" in m and "30 messages" in m for m in warned), warned
        # a lasting pause is not a WARNING at every poll (Spark polls every few ms)
        with caplog.at_level(logging.WARNING, logger="nsq_spark"):
            caplog.clear()
            assert reader.latestOffset(start, no_limit())["size"] == 20
        assert not [r for r in caplog.records if "paused" in r.getMessage()]
        assert reader.reportLatestOffset()["backlog"]["paused"][0]["nsqd"] == n0.http_address

        # paused everywhere: no batch at all (no task waits for messages never sent)
        nsqd_post(n1.http_address, f"/topic/pause?topic={topic}")
        nsqd_post(n1.http_address, f"/channel/pause?topic={topic}&channel={channel}")
        t = time.monotonic()
        assert reader.latestOffset(start, no_limit()) == start
        assert time.monotonic() - t < 3
        report = reader.reportLatestOffset()["backlog"]
        assert {p["nsqd"]: p["paused"] for p in report["paused"]} == {
            n0.http_address: "channel", n1.http_address: "topic+channel"}
        assert report["fetchable"] == 0 and report["nsqdsUnreachable"] == []

        # a paused topic holds back only what it has not copied into the channel yet
        nsqd_post(n1.http_address, f"/channel/unpause?topic={topic}&channel={channel}")
        http_mpub(n1.http_address, topic, [b"late%d" % i for i in range(5)])
        assert reader.latestOffset(start, no_limit())["size"] == 20

        # the nsqd leaves mid-stream: named in the progress and in a WARNING
        cluster.kill(1)
        with caplog.at_level(logging.WARNING, logger="nsq_spark"):
            caplog.clear()
            assert reader.latestOffset(start, no_limit()) == start
        report = reader.reportLatestOffset()["backlog"]
        gone = [u["nsqd"] for u in report["nsqdsUnreachable"]]
        assert gone == [n1.http_address], report
        assert report["nsqdsUnreachable"][0]["error"]
        warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert any(f"nsq source {topic}/{channel}: nsqd {n1.http_address} does not answer"
                   in m for m in warned), warned


@pytest.mark.unit
@pytest.mark.parametrize("topic_paused, channel_paused, fetchable, paused", [
    (False, False, 10, None), (True, False, 7, "topic"), (False, True, 0, "channel"),
    (True, True, 0, "topic+channel")])
def test_a_pause_holds_back_what_nsqd_will_not_send(topic_paused, channel_paused, fetchable,
                                                    paused):
    st = _on_nsqd(topic_depth=3, depth=7, in_flight=0, topic_paused=topic_paused,
                  channel_paused=channel_paused)
    assert (st.fetchable, st.paused) == (fetchable, paused)


def _on_nsqd(topic_depth: int, depth: int, in_flight: int, topic_paused: bool,
             channel_paused: bool):
    """One nsqd's answer as the admin model parses it, read for the backlog."""
    from nsq_spark.admin.model import ChannelStats, TopicStats
    from nsq_spark.spark._backlog import NsqdBacklog

    channel = ChannelStats("spark", depth, 0, in_flight, 0, 0, 0, 0, 1, channel_paused)
    return NsqdBacklog(TopicStats("t", topic_depth, 0, 0, 0, topic_paused, (channel,)),
                       "spark")


@pytest.mark.unit
def test_an_nsqd_without_the_topic_or_the_channel_holds_what_its_topic_holds():
    from nsq_spark.admin.model import TopicStats
    from nsq_spark.spark._backlog import Counts, NsqdBacklog

    assert NsqdBacklog(None, "spark").counts == Counts()
    no_channel = NsqdBacklog(TopicStats("t", 5, 0, 5, 0, False, ()), "spark")
    assert (no_channel.counts, no_channel.fetchable, no_channel.paused) == \
        (Counts(topic_depth=5), 5, None)


@pytest.mark.unit
@pytest.mark.parametrize("topic_paused, channel_paused, fetchable", [
    (False, False, 12), (True, False, 9), (False, True, 0)])
def test_what_paused_cached_readers_hold_is_fetchable(topic_paused, channel_paused,
                                                      fetchable):
    # between batches the channel's in-flight messages are held by the executors' paused
    # Readers: the next task takes them, so a batch is planned for them (AvailableNow
    # stopped short of them when only the depth counted)
    st = _on_nsqd(topic_depth=3, depth=7, in_flight=2, topic_paused=topic_paused,
                  channel_paused=channel_paused)
    assert st.fetchable == fetchable


# -- the causes of a failed fetch reach the task's error -----------------------------------


@pytest.mark.unit
@pytest.mark.parametrize("option", ["tlsCaFile", "tlsCertFile", "tlsKeyFile"])
def test_file_options_are_checked_at_query_start(option, tmp_path):
    from nsq_spark.spark.options import (NSQOptionError, parse_read_options,
                                         parse_write_options)

    missing = str(tmp_path / "nope.pem")
    base = {"nsqdTcpAddresses": "127.0.0.1:4150", "tlsV1": "true", option: missing}
    with pytest.raises(NSQOptionError, match=f"option '{option}': '{missing}' does not exist"):
        parse_read_options({"topic": "t", "channel": "c", **base}, streaming=False)
    with pytest.raises(NSQOptionError, match=f"option '{option}'.*is not a file"):
        parse_write_options({**base, option: str(tmp_path)})


SECRET = "vis-secret-6b2e"
GRANTS = {SECRET: {"ttl": 60, "identity": "vis", "authorizations": [
    {"topic": ".*", "channels": [".*"], "permissions": ["subscribe", "publish"]}]}}


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    from conn_tls_helpers import make_certs

    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def secured_nsqd(certs):
    from conn_tls_helpers import auth_server

    with auth_server(GRANTS) as auth, \
            NSQCluster(nsqd=1, lookupd=0, tls_cert=str(certs.server_cert),
                       tls_key=str(certs.server_key), tls_required="tcp-https",
                       auth_http_address=auth.address) as cluster:
        yield cluster


def read_opts(address: str, streaming: bool = False, **extra: str):
    from nsq_spark.spark.options import parse_read_options

    return parse_read_options({"topic": "vis_sec", "channel": "c", "nsqdTcpAddresses": address,
                               "idleTimeout": "0.3", **extra}, streaming=streaming)


@pytest.mark.nsqd
@pytest.mark.timeout(60)
def test_a_refused_auth_is_the_batch_fetchs_error(secured_nsqd, certs):
    from nsq_spark.errors import SubscribeRefusedError
    from nsq_spark.spark._fetch import fetch_batch_partition

    addr = secured_nsqd.nsqd_tcp_addresses[0]
    wrong = "wrong-secret-91c4"
    opts = read_opts(addr, tlsV1="true", tlsCaFile=str(certs.ca), authSecret=wrong)
    t = time.monotonic()
    with pytest.raises(SubscribeRefusedError) as err:
        list(fetch_batch_partition(opts, 10))
    # at the first refusal, not after the first wait (fetch.FIRST_WAIT, 5 s)
    assert time.monotonic() - t < 3
    text = str(err.value)
    assert f"nsqd {addr}: AuthFailedError: E_AUTH_FAILED" in text, text
    assert "authSecret" in text and wrong not in text and SECRET not in text


@pytest.mark.nsqd
@pytest.mark.timeout(60)
def test_a_tls_verification_failure_is_the_stream_fetchs_error(secured_nsqd, tmp_path):
    """No tlsCaFile: the system's CAs do not know the test CA. A streaming task the
    driver planned (a share) fails with the cause instead of ending empty."""
    from nsq_spark.errors import SubscribeRefusedError
    from nsq_spark.spark._fetch import fetch_stream_partition
    from nsq_spark.spark._spool import Spool

    addr = secured_nsqd.nsqd_tcp_addresses[0]
    opts = read_opts(addr, streaming=True, tlsV1="true", authSecret=SECRET,
                     spoolPath=str(tmp_path))
    with pytest.raises(SubscribeRefusedError) as err:
        list(fetch_stream_partition(opts, Spool(str(tmp_path), "q"), 1, 0, 10))
    text = str(err.value)
    assert "batch 1 part 0 could not subscribe to vis_sec/c" in text
    assert f"nsqd {addr}: TLSError" in text and "CERTIFICATE_VERIFY_FAILED" in text, text
    assert SECRET not in text


@pytest.mark.nsqd
@pytest.mark.timeout(60)
def test_a_refused_connection_is_the_batch_fetchs_error():
    from nsq_spark.errors import ConnectError, SubscribeRefusedError
    from nsq_spark.spark._fetch import fetch_batch_partition
    from nsq_spark.testing import free_port

    addr = f"127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(ConnectError) as err:
        list(fetch_batch_partition(read_opts(addr), 10))
    assert not isinstance(err.value, SubscribeRefusedError)
    assert f"nsqd {addr}: " in str(err.value) and "refused" in str(err.value).lower()


@pytest.mark.nsqd
@pytest.mark.timeout(60)
def test_an_unreachable_dedup_store_is_a_typed_error_naming_the_option(nsq_cluster):
    pytest.importorskip("redis")
    from nsq_spark.errors import DedupStoreError
    from nsq_spark.spark._fetch import fetch_batch_partition
    from nsq_spark.testing import free_port

    node = nsq_cluster.nsqds[0]
    http_mpub(node.http_address, "vis_dedup", [b"x%d" % i for i in range(5)])
    spec = f"redis://:pw-7e1d@127.0.0.1:{free_port()}/0?ttl=60"  # nothing listens there
    opts = read_opts(node.tcp_address, dedup=spec)
    opts = opts.__class__(**{**opts.__dict__, "topic": "vis_dedup"})
    with pytest.raises(DedupStoreError) as err:
        list(fetch_batch_partition(opts, 5))
    text = str(err.value)
    assert "option 'dedup'" in text and "remove the option 'dedup'" in text, text
    assert "pw-7e1d" not in text and "127.0.0.1" in text


# -- the connector's own log lines -----------------------------------------------------------


LOG_SCRIPT = """
import logging, sys
from nsq_spark.spark import _logs as logs
if sys.argv[1] == "root":
    logging.basicConfig(format="ROOT %(message)s")  # the user owns root: lines go there
logs.configure("INFO")
logs.configure("info")  # again (every task calls it): still one handler
log = logging.getLogger("nsq_spark.spark.fetch")
with logs.task("t/c batch 3 part 1"):
    log.info("hello")
log.info("outside")
log.debug("hidden")
logs.configure(None)  # no option: $NSQ_SPARK_LOG_LEVEL, else WARN
log.info("not shown")
log.warning("shown")
print(len(logging.getLogger("nsq_spark").handlers), len(logging.getLogger().handlers))
"""


@pytest.mark.unit
@pytest.mark.parametrize("root", ["none", "root"])
def test_log_lines_reach_stderr_once_at_the_chosen_level(root):
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "NSQ_SPARK_LOG_LEVEL"}
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(os.path.dirname(HERE)),
                                         env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-c", LOG_SCRIPT, root], capture_output=True,
                          text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    if root == "none":
        assert proc.stdout.split() == ["1", "0"]  # our handler; root left alone
        hello = [ln for ln in lines if ln.endswith(" hello")]
        assert len(hello) == 1 and " INFO nsq_spark.spark.fetch [t/c batch 3 part 1] " in \
            hello[0], lines
        assert any(ln.endswith("INFO nsq_spark.spark.fetch [-] outside") for ln in lines)
    else:
        assert proc.stdout.split() == ["0", "1"]
        assert lines.count("ROOT hello") == 1 and "ROOT outside" in lines
    assert sum("shown" in ln and "not shown" not in ln for ln in lines) == 1
    assert not any("hidden" in ln or "not shown" in ln for ln in lines), lines


@pytest.mark.unit
def test_log_level_option_is_checked():
    from nsq_spark.spark.options import NSQOptionError, parse_read_options, parse_write_options

    base = {"topic": "t", "channel": "c", "nsqdTcpAddresses": "127.0.0.1:4150"}
    assert parse_read_options({**base, "LOGLEVEL": "warn"}, streaming=False).log_level == \
        "WARNING"
    assert parse_read_options(base, streaming=False).log_level is None
    with pytest.raises(NSQOptionError, match="option 'logLevel' must be one of DEBUG, INFO"):
        parse_write_options({"nsqdTcpAddresses": "127.0.0.1:4150", "logLevel": "loud"})


# -- one real Spark driver (a child process, so that its stderr can be read) ---------------


SPARK_SCRIPT = """
import json, sys
sys.path.insert(0, {here!r})
from sparkutil import build_session
import nsq_spark.spark
spark = build_session("nsq-visibility")
nsq_spark.spark.register(spark)

def read(topic, address, **extra):
    r = (spark.read.format("nsq").option("topic", topic).option("channel", "c")
         .option("nsqdTcpAddresses", address).option("idleTimeout", 0.5))
    for k, v in extra.items():
        r = r.option(k, v)
    return r.load()

print("ROWS_INFO", read("log_info", {tcp!r}, logLevel="INFO").count(), flush=True)
print("ROWS_WARN", read("log_warn", {tcp!r}).count(), flush=True)
df = (spark.readStream.format("nsq").option("topic", "log_stream").option("channel", "c")
      .option("nsqdTcpAddresses", {tcp!r}).option("nsqdHttpAddresses", {http!r})
      .option("idleTimeout", 0.5).option("logLevel", "info")
      .option("spoolPath", {spool!r}).load())
q = (df.writeStream.format("memory").queryName("vis").trigger(availableNow=True)
     .option("checkpointLocation", {ckpt!r}).start())
q.awaitTermination(120)
print("ROWS_STREAM", spark.sql("select count(*) from vis").first()[0], flush=True)
try:
    read("log_auth", {secured!r}, tlsV1="true", tlsCaFile={ca!r},
         authSecret="wrong-secret-0a9f").count()
    print("ERROR none")
except Exception as exc:
    print("ERROR", json.dumps(str(exc)), flush=True)
"""


@pytest.fixture(scope="module")
def spark_driver(secured_nsqd, certs, tmp_path_factory):
    """Run the script above in a child driver; its (stdout, stderr)."""
    with NSQCluster(nsqd=1, lookupd=0) as cluster:
        yield _run_driver(cluster.nsqds[0], secured_nsqd, certs, tmp_path_factory)


def _run_driver(node, secured_nsqd, certs, tmp_path_factory) -> tuple[str, str]:
    import subprocess

    from sparkutil import spark_env

    for topic in ("log_info", "log_warn", "log_stream"):
        http_mpub(node.http_address, topic, [b"%s-%d" % (topic.encode(), i) for i in range(20)])
    d = tmp_path_factory.mktemp("vis")
    script = SPARK_SCRIPT.format(here=HERE, tcp=node.tcp_address, http=node.http_address,
                                 spool=str(d / "spool"), ckpt=str(d / "ckpt"),
                                 secured=secured_nsqd.nsqd_tcp_addresses[0], ca=str(certs.ca))
    root = os.path.dirname(os.path.dirname(HERE))
    env = {k: v for k, v in os.environ.items() if k != "NSQ_SPARK_LOG_LEVEL"}
    env.update(spark_env(), PYTHONPATH=os.pathsep.join([root, env.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=240, env=env, cwd=str(d))
    return proc.stdout, proc.stderr


@pytest.mark.nsqd
@pytest.mark.spark
@pytest.mark.timeout(300)
def test_log_level_option_in_a_real_spark_query(spark_driver):
    out, err = spark_driver
    assert "ROWS_INFO 20" in out and "ROWS_WARN 20" in out and "ROWS_STREAM 20" in out, \
        out + err[-3000:]
    # executors (Python workers; in local mode their stderr is the driver's)
    assert "INFO nsq_spark.reader.pool [log_info/c read part 0] " in err, err[-3000:]
    assert "INFO nsq_spark.spark.fetch [log_stream/c batch 1 part 0] batch 1 part 0: " in err
    # the streaming source's driver side (latestOffset)
    assert "INFO nsq_spark.spark.datasource [-] nsq source log_stream/c: backlog" in err
    # the default (WARN): no INFO line of the query without the option
    assert not [ln for ln in err.splitlines() if " INFO nsq_spark" in ln and "log_warn" in ln]


@pytest.mark.nsqd
@pytest.mark.spark
@pytest.mark.timeout(300)
def test_a_fetch_tasks_cause_reaches_the_driver(spark_driver, secured_nsqd):
    out, err = spark_driver
    line = next((ln for ln in out.splitlines() if ln.startswith("ERROR ")), "")
    addr = secured_nsqd.nsqd_tcp_addresses[0]
    assert "SubscribeRefusedError" in line and f"nsqd {addr}: AuthFailedError: E_AUTH_FAILED" \
        in line, out + err[-3000:]
    assert "wrong-secret-0a9f" not in out + err
