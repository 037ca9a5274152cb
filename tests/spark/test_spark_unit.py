"""Pure logic of the Spark connector: options, shares, the spool protocol (no sockets).

The fetch-protocol tests drive ``fetch_stream_partition`` with an in-memory stand-in for
the Reader's pull API (the NSQ side is tested for real in test_spark_stream.py); they
check what only a controlled interleaving can show: a task that dies between chunks,
its retry, replay of a completed partition, and FIN only after the chunk is durable.
"""

from __future__ import annotations

import os

import pytest

from nsq_spark.message import Message
from nsq_spark.spark.datasource import split_shares
from nsq_spark.spark._fetch import fetch_stream_partition
from nsq_spark.spark.options import NSQOptionError, parse_read_options, parse_write_options
from nsq_spark.spark.sink import _slices
from nsq_spark.spark._spool import Spool, SpoolConflict

from stand_in_reader import Addr, StandInReader  # tests/spark: typed, checked by mypy

pytestmark = pytest.mark.unit

BASE = {"topic": "t", "channel": "c", "nsqdTcpAddresses": "127.0.0.1:4150",
        "spoolPath": "/tmp/x"}


def opts(**kw):
    d = dict(BASE)
    for k, v in kw.items():
        if v is None:
            d.pop(k, None)
        else:
            d[k] = v
    return d


# -- options ---------------------------------------------------------------------------


def test_options_case_insensitive_and_defaults():
    o = parse_read_options({k.lower(): v for k, v in opts(maxInFlight="10").items()},
                           streaming=True)
    assert (o.topic, o.channel, o.nsqd_tcp_addresses) == ("t", "c", ["127.0.0.1:4150"])
    assert o.max_in_flight == 10 and o.spool_chunk_size == 5 and o.num_partitions == 2
    assert o.reader_kwargs()["max_tries"] == 0


@pytest.mark.parametrize("bad, name", [
    (dict(topic=None), "topic"),
    (dict(channel=None), "channel"),
    (dict(spoolPath=None), "spoolPath"),
    (dict(nsqdTcpAddresses=None), "nsqdTcpAddresses"),
    (dict(lookupdHttpAddresses="127.0.0.1:4161"), "lookupdHttpAddresses"),
    (dict(nsqdTcpAddresses="nohost"), "nsqdTcpAddresses"),
    (dict(maxInFlight="ten"), "maxInFlight"),
    (dict(maxInFlight="0"), "maxInFlight"),
    (dict(numPartitions="-1"), "numPartitions"),
    (dict(maxMessagesPerTrigger="1.5"), "maxMessagesPerTrigger"),
    (dict(maxFetchPeriod="0"), "maxFetchPeriod"),
    (dict(maxFetchPeriod="soon"), "maxFetchPeriod"),
    (dict(idleTimeout="nan"), "idleTimeout"),
    (dict(topic="bad topic!"), "topic"),
    (dict(spoolChunkSize="5000"), "spoolChunkSize"),
    (dict(tlsV1="maybe"), "tlsV1"),
    (dict(snappy="true", deflate="true"), "snappy"),
    (dict(nsqdHttpAddresses="127.0.0.1:1,127.0.0.1:2"), "nsqdHttpAddresses"),
])
def test_bad_read_options_name_the_option(bad, name):
    with pytest.raises(NSQOptionError, match=name):
        parse_read_options(opts(**bad), streaming=True)


def test_batch_read_needs_no_spool():
    assert parse_read_options(opts(spoolPath=None), streaming=False).spool_path is None


def test_connection_options_map_to_pynsq_names(tmp_path):
    ca = tmp_path / "ca.pem"  # file options must name a readable file at query start
    ca.write_text("-")
    o = parse_read_options(opts(tlsV1="true", tlsCaFile=str(ca), authSecret="s3",
                                tlsServerHostname="nsqd.example", deflate="true", deflateLevel="3", msgTimeout="30000",
                                heartbeatInterval="5000",
                                **{"nsq.output_buffer_timeout": "5"}), streaming=True)
    # Spark options in ms, ConnectionConfig (pynsq) in seconds; output_buffer_timeout in ms
    assert o.connection == {"tls_v1": True, "tls_options": {"ca_certs": str(ca)},
                            "tls_server_hostname": "nsqd.example", "auth_secret": "s3", "deflate": True, "deflate_level": 3,
                            "msg_timeout": 30.0, "heartbeat_interval": 5.0,
                            "output_buffer_timeout": 5}
    # the Reader gets the source's output-buffer defaults unless an option says otherwise
    assert o.reader_kwargs()["output_buffer_timeout"] == 5
    assert o.reader_kwargs()["output_buffer_size"] == 65536
    plain = parse_read_options(opts(), streaming=True).reader_kwargs()
    assert (plain["output_buffer_size"], plain["output_buffer_timeout"]) == (65536, 25)


def test_bad_connection_options_fail_early():
    with pytest.raises(NSQOptionError, match="heartbeat_interval"):
        parse_read_options(opts(heartbeatInterval="5"), streaming=True)
    with pytest.raises(NSQOptionError, match="no_such_option"):
        parse_read_options(opts(**{"nsq.no_such_option": "1"}), streaming=True)


def test_write_options():
    w = parse_write_options({"nsqdtcpaddresses": "127.0.0.1:1", "batchsize": "7"})
    assert w.topic is None and w.batch_size == 7
    with pytest.raises(NSQOptionError, match="nsqdTcpAddresses"):
        parse_write_options({"topic": "t"})


@pytest.mark.parametrize("failure", ["tls", "not_http", "unreachable"])
def test_the_sink_skips_a_lookupd_that_fails_with_any_admin_error(failure, monkeypatch):
    import nsq_spark._lookupd
    from nsq_spark.admin import AdminTLSError, NodeUnreachableError, UnexpectedAnswerError
    from nsq_spark._lookupd import ProducerInfo
    from nsq_spark.spark.sink import nsqd_addresses

    error = {"tls": AdminTLSError("GET https://bad:4161/nodes: certificate verify failed"),
             "not_http": UnexpectedAnswerError("GET http://bad:4161/nodes: not HTTP"),
             "unreachable": NodeUnreachableError("GET http://bad:4161/nodes: no answer")}

    def lookup_sync(address, topic, timeout=2.0, path="/lookup", transport=None):
        assert path == "/nodes"
        if address.startswith("bad"):
            raise error[failure]
        return [ProducerInfo("10.0.0.1", 4150, 4151, None, None)]

    monkeypatch.setattr(nsq_spark._lookupd, "lookup_sync", lookup_sync)
    opts = parse_write_options({"lookupdHttpAddresses": "bad:4161,good:4161"})
    assert nsqd_addresses(opts) == ["10.0.0.1:4150"]


def test_split_shares():
    assert split_shares(10, 3) == [4, 3, 3]
    assert split_shares(1, 2) == [1]
    assert split_shares(0, 2) == [None, None]
    assert sum(split_shares(1_000_001, 2)) == 1_000_001


def test_mpub_slices_respect_count_and_bytes():
    bodies = [b"x" * 10] * 25
    assert [len(s) for s in _slices(bodies, 10, 10**6)] == [10, 10, 5]
    assert [len(s) for s in _slices(bodies, 100, 50)] == [3] * 8 + [1]
    assert [len(s) for s in _slices([b"x" * 100], 10, 50)] == [1]  # never an empty slice


# -- the spool protocol ------------------------------------------------------------------


def make_messages(n, start=0):
    return [Message(b"%016d" % i, b"body-%d" % i, 1_700_000_000_000_000_000 + i, 1, Addr())
            for i in range(start, start + n)]


def read_opts(tmp_path, **kw):
    return parse_read_options(opts(spoolPath=str(tmp_path), maxInFlight="4",
                                   idleTimeout="0.05", **kw), streaming=True)


def bodies(batches):
    return [b for rb in batches for b in rb.column("body").to_pylist()]


def test_fetch_spools_before_fin_and_replays(tmp_path):
    o = read_opts(tmp_path)
    spool = Spool(str(tmp_path), "q1")
    queue, log = make_messages(7), []

    def factory(_):
        r = StandInReader(queue, log)
        # every FIN must find its chunk already on disk
        orig = r.finish_blocks

        def finish(blocks):
            n = len([e for e in log if e[0] == "FIN"])
            assert os.path.exists(spool.partition(1, 0).chunk_path(n))
            orig(blocks)
        r.finish_blocks = finish
        return r

    got = bodies(fetch_stream_partition(o, spool, 1, 0, None, factory))
    assert got == [b"body-%d" % i for i in range(7)]
    assert [len(ids) for what, ids in log if what == "FIN"] == [2, 2, 2, 1]
    assert spool.partition(1, 0).completion().rows == 7
    # re-execution: replay, no reader at all
    again = bodies(fetch_stream_partition(o, spool, 1, 0, None,
                                          lambda _: pytest.fail("replay must not fetch")))
    assert again == got
    assert spool.delete_upto(1) == 1 and spool.batches() == []


def test_fetch_resumes_after_a_dead_attempt(tmp_path):
    o = read_opts(tmp_path)
    spool = Spool(str(tmp_path), "q2")
    queue, log = make_messages(9), []
    with pytest.raises(ConnectionError):
        list(fetch_stream_partition(o, spool, 3, 1, 8,
                                    lambda _: StandInReader(queue, log, fail_after_gets=2)))
    # two chunks of 2 were written and FINished; the retry continues after them
    assert spool.partition(3, 1).chunk_count() == 2
    first = bodies(fetch_stream_partition(
        o, spool, 3, 1, 8, lambda ro: StandInReader(queue, log, max_in_flight=ro.max_in_flight)))
    assert first == [b"body-%d" % i for i in range(8)]  # share of 8 honoured across attempts
    assert [m.body for m in queue] == [b"body-8"]
    assert bodies(fetch_stream_partition(o, spool, 3, 1, 8, None)) == first


def test_chunk_conflict_requeues(tmp_path):
    o = read_opts(tmp_path)
    spool = Spool(str(tmp_path), "q3")
    part = spool.partition(5, 0)
    from nsq_spark.spark._schema import messages_to_batch

    queue, log = make_messages(2), []
    # a racing attempt writes chunk 0 between this attempt's listing and its write
    racer = messages_to_batch(make_messages(1, 100), "t", "c")

    class Racing(StandInReader):
        def get_blocks(self, max_messages=1000, timeout=1.0):
            if not part.chunk_count():
                part.write_chunk(0, racer)
            return super().get_blocks(max_messages, timeout)

    with pytest.raises(SpoolConflict):
        list(fetch_stream_partition(o, spool, 5, 0, None, lambda _: Racing(queue, log)))
    assert log == [("REQ", [b"%016d" % 0, b"%016d" % 1])]


def test_messages_to_batch_schema():
    from nsq_spark.spark._schema import arrow_schema, messages_to_batch

    rb = messages_to_batch(make_messages(3), "t", "c")
    assert rb.schema == arrow_schema()
    row = rb.to_pylist()[0]
    assert row["id"] == "0000000000000000" and row["attempts"] == 1
    assert row["nsqd_address"] == "127.0.0.1:4150" and row["topic"] == "t"
    assert row["timestamp"].year == 2023


def test_dedup_option_needs_a_shared_store():
    from nsq_spark.spark._fetch import check_dedup_spec

    with pytest.raises(NSQOptionError, match="'dedup'.*shared store"):
        check_dedup_spec("memory://opposite?size=1000")
    with pytest.raises(NSQOptionError, match="'dedup'"):
        check_dedup_spec("nonsense")


def test_torn_chunk_and_gap_are_discarded_on_resume(tmp_path):
    """A chunk torn by a crash (and one after a gap) held nothing FINished: the retry
    drops them and fetches those messages again."""
    o = read_opts(tmp_path)
    spool = Spool(str(tmp_path), "q4")
    queue, log = make_messages(6), []
    with pytest.raises(ConnectionError):
        list(fetch_stream_partition(o, spool, 1, 0, None,
                                    lambda _: StandInReader(queue, log, fail_after_gets=2)))
    part = spool.partition(1, 0)
    assert part.chunk_count() == 2
    # chunk 1 torn mid-write, and a stray chunk 3 beyond a gap
    data = open(part.chunk_path(1), "rb").read()
    open(part.chunk_path(1), "wb").write(data[: len(data) // 2])
    open(part.chunk_path(3), "wb").write(data)
    # chunk 1's messages were not FINished in that world: give them back to the queue
    queue[:0] = make_messages(2, 2)
    got = bodies(fetch_stream_partition(o, spool, 1, 0, None,
                                        lambda _: StandInReader(queue, log)))
    assert got == [b"body-%d" % i for i in range(6)]
    assert bodies(fetch_stream_partition(o, spool, 1, 0, None, None)) == got


def test_torn_completion_marker_is_ignored(tmp_path):
    part = Spool(str(tmp_path), "q5").partition(2, 0)
    part.complete(0, 0)
    open(f"{part.path}/_COMPLETE", "wb").write(b'{"chun')
    assert part.completion() is None
    assert part.complete(3, 30).chunks == 3


def test_unwritable_spool_path_is_reported():
    from nsq_spark.errors import SparkSpoolError

    with pytest.raises(SparkSpoolError, match="spoolPath"):
        Spool("/proc/nsq-spark-cannot-write-here", "q").check_writable()


# -- no requeue at a share boundary; maxAttempts to the dead letters -----------------------


def test_a_task_asks_for_no_more_than_its_share_and_requeues_nothing(tmp_path):
    """Before each FIN the task lowers max_in_flight to what is left of its share, so nsqd
    (here: the stand-in's in-flight rule) never sends more, and nothing is requeued."""
    o = read_opts(tmp_path)
    queue, log = make_messages(20), []
    got = bodies(fetch_stream_partition(
        o, Spool(str(tmp_path), "q6"), 1, 0, 7,
        lambda ro: StandInReader(queue, log, max_in_flight=ro.max_in_flight)))
    assert got == [b"body-%d" % i for i in range(7)]
    assert not [e for e in log if e[0] == "REQ"]
    assert len(queue) == 13
    # the cap only ever went down, to 0 at the end
    caps = [n for what, n in log if what == "MIF"]
    assert caps == sorted(caps, reverse=True) and caps[-1] == 0


def test_what_a_task_holds_at_the_end_is_spooled_not_requeued(tmp_path):
    """A Reader that delivered beyond the share (nsqd had sent them before the lower RDY
    arrived): the extra messages go into the last chunk; nothing is requeued."""
    o = read_opts(tmp_path)
    spool = Spool(str(tmp_path), "q7")
    queue, log = make_messages(5), []

    class Eager(StandInReader):
        def get_blocks(self, max_messages=1000, timeout=1.0):
            # hands out everything it has, whatever was asked
            return super().get_blocks(1000, timeout)

    got = bodies(fetch_stream_partition(o, spool, 1, 0, 3, lambda _: Eager(queue, log)))
    assert got == [b"body-%d" % i for i in range(5)]
    assert not [e for e in log if e[0] == "REQ"]
    assert spool.partition(1, 0).completion().rows == 5


def test_max_attempts_sends_messages_to_the_dead_letters_not_the_void(tmp_path):
    import glob

    import pyarrow as pa

    o = read_opts(tmp_path, maxAttempts="2")
    assert o.dead_letter_path == str(tmp_path) + "/_dead_letter"
    msgs = make_messages(6)
    for m in msgs[::2]:
        m.attempts = 3  # delivered more often than maxAttempts
    queue, log = list(msgs), []
    got = bodies(fetch_stream_partition(o, Spool(str(tmp_path), "q8"), 1, 0, None,
                                        lambda _: StandInReader(queue, log)))
    assert got == [b"body-1", b"body-3", b"body-5"]
    files = glob.glob(str(tmp_path / "_dead_letter" / "*.arrow"))
    dead = sorted(b for f in files for rb in pa.ipc.open_file(pa.OSFile(f)).read_all()
                  .to_batches() for b in rb.column("body").to_pylist())
    assert dead == [b"body-0", b"body-2", b"body-4"]
    # every message was FINished: the dead ones after they were written
    assert sorted(i for what, ids in log if what == "FIN" for i in ids) == \
        sorted(m.id for m in msgs)


def test_max_attempts_needs_a_place_for_dead_letters():
    with pytest.raises(NSQOptionError, match="'maxAttempts'.*deadLetterPath"):
        parse_read_options(opts(spoolPath=None, maxAttempts="3"), streaming=False)
    with pytest.raises(NSQOptionError, match="'deadLetterPath'.*maxAttempts"):
        parse_read_options(opts(deadLetterPath="/tmp/dl"), streaming=True)


# -- options: misspelled, and options that need another ------------------------------------


@pytest.mark.parametrize("key, closest", [
    ("maxMesages", "maxMessages"), ("maxInFlite", "maxInFlight"), ("spoolpth", "spoolPath"),
    ("MAXINFLITE", "maxInFlight"), ("lookupdHttpAddress", "lookupdHttpAddresses"),
])
def test_a_misspelled_option_fails_naming_the_closest(key, closest):
    with pytest.raises(NSQOptionError, match=f"unknown option '{key}'.*did you mean '{closest}'"):
        parse_read_options(opts(**{key: "1"}), streaming=True)


def test_spark_keys_and_nsq_prefix_are_accepted():
    parse_read_options(opts(path="/x", **{"nsq.output_buffer_timeout": "5"}), streaming=True)
    parse_write_options({"nsqdTcpAddresses": "127.0.0.1:1", "checkpointLocation": "/c",
                         "path": "p"})
    with pytest.raises(NSQOptionError, match="unknown option 'batchsise'.*'batchSize'"):
        parse_write_options({"nsqdTcpAddresses": "127.0.0.1:1", "batchsise": "3"})
    with pytest.raises(NSQOptionError, match="unknown option 'spoolPath'"):
        parse_write_options({"nsqdTcpAddresses": "127.0.0.1:1", "spoolPath": "/s"})


@pytest.mark.parametrize("key, needs", [
    ("tlsInsecure", "tlsV1"), ("tlsCaFile", "tlsV1"), ("tlsServerHostname", "tlsV1"),
    ("deflateLevel", "deflate"),
])
def test_an_option_without_the_one_it_needs_fails(key, needs):
    with pytest.raises(NSQOptionError, match=f"'{key}' only takes effect with '{needs}'"):
        parse_read_options(opts(**{key: "true" if key == "tlsInsecure" else "3"}),
                           streaming=True)


def test_addresses_follow_the_one_rule():
    o = parse_read_options(opts(nsqdTcpAddresses="[::1]:4150, 127.0.0.1:4250"),
                           streaming=True)
    assert o.nsqd_tcp_addresses == ["[::1]:4150", "127.0.0.1:4250"]
    with pytest.raises(NSQOptionError, match="option 'nsqdTcpAddresses'.*http"):
        parse_read_options(opts(nsqdTcpAddresses="http://127.0.0.1:4150"), streaming=True)


# -- the shared-spool marker ---------------------------------------------------------------


def test_a_task_that_cannot_see_the_driver_marker_fails_saying_shared(tmp_path):
    from nsq_spark.errors import SparkSpoolError

    driver = Spool(str(tmp_path / "driver-disk"), "q9")
    marker = driver.write_marker(1)
    executor = Spool(str(tmp_path / "executor-disk"), "q9")  # another node's local disk
    with pytest.raises(SparkSpoolError, match="shared storage reachable from every executor"):
        list(fetch_stream_partition(read_opts(tmp_path), executor, 1, 0, 1,
                                    lambda _: pytest.fail("must not fetch"), marker=marker))
    driver.check_marker(1, marker)  # the driver's own view is fine


def test_committed_batches_leave_no_directory_behind(tmp_path):
    spool = Spool(str(tmp_path), "q10")
    spool.check_writable()
    assert os.listdir(tmp_path) == []  # the start-up probe leaves nothing behind
    spool.write_marker(1)
    spool.partition(1, 0).complete(0, 0)
    spool.write_marker(2)
    assert spool.tidy(1) == 1 and spool.batches() == [2]  # batch 2 is not committed yet
    assert spool.tidy(2) == 1
    assert os.listdir(tmp_path) == []


# -- the one lookupd parser, as the driver and the sink use it ------------------------------


def test_lookupd_records_carry_the_http_port():
    from nsq_spark._lookupd import parse_lookup_response, parse_producer_records

    body = ('{"channels":["a"],"producers":[{"broadcast_address":"10.0.0.1","tcp_port":4150,'
            '"http_port":4151},{"broadcast_address":"::1","tcp_port":4250,"http_port":4251},'
            '{"broadcast_address":"h","tcp_port":4350}]}')
    recs = parse_producer_records(body)
    assert [r.http_address for r in recs] == ["10.0.0.1:4151", "[::1]:4251", None]
    assert parse_lookup_response(body) == [("10.0.0.1", 4150), ("::1", 4250), ("h", 4350)]
    old = '{"status_code":200,"data":{"producers":[{"address":"h","tcp_port":1,"http_port":2}]}}'
    assert [r.http_address for r in parse_producer_records(old)] == ["h:2"]


# -- issue #21: the silent loss paths --------------------------------------------------------


@pytest.mark.parametrize("streaming", [True, False])
def test_an_ephemeral_channel_is_refused_naming_a_durable_one(streaming):
    with pytest.raises(NSQOptionError) as err:
        parse_read_options(opts(channel="spark#ephemeral"), streaming=streaming)
    msg = str(err.value)
    assert "'channel'" in msg and "ephemeral" in msg and "last client disconnects" in msg
    assert "durable channel" in msg and "'spark'" in msg  # the fix, with the name to use
    assert parse_read_options(opts(channel="spark"), streaming=streaming).channel == "spark"


class FakeNsqds:
    """The driver's view of nsqd (backlog.Nsqds) without sockets: ``depth`` is what waits."""

    def __init__(self, depth=0):
        self.depth = depth
        self.last = None

    def check_reachable(self, require_producer):
        pass

    def backlog(self):
        return self.depth

    def settled_backlog(self):
        return self.depth


def driver(tmp_path, depth=0, **kw):
    from nsq_spark.spark.datasource import NSQStreamReader

    r = NSQStreamReader(opts(spoolPath=str(tmp_path / "spool"), **kw))
    r._subscription.handles[r.opts.topic] = FakeNsqds(depth)
    return r


def run_tasks(reader, parts, rows_each):
    """What the fetch tasks leave in the spool: every partition complete with its rows."""
    for p in parts:
        reader._spool(p.query).partition(p.batch, p.index).complete(1, rows_each)


def test_a_batch_from_the_checkpoint_keeps_the_partition_count_it_was_planned_with(tmp_path):
    first = driver(tmp_path, depth=1000, numPartitions="2")
    start = first.initialOffset()
    end = first.latestOffset(start, None)
    assert end["parts"] == 2
    parts = first.partitions(start, end)
    assert [(p.index, p.share) for p in parts] == [(0, 500), (1, 500)]
    # the driver dies before the commit; restarted on the checkpoint with numPartitions 1
    again = driver(tmp_path, numPartitions="1").partitions(start, end)
    assert [(p.index, p.share) for p in again] == [(0, 500), (1, 500)]
    # an offset from before the field: at least the partitions its spool holds
    run_tasks(first, parts, 10)
    old = {k: v for k, v in end.items() if k != "parts"}
    assert len(driver(tmp_path, numPartitions="1").partitions(start, old)) == 2
    assert len(driver(tmp_path, numPartitions="3").partitions(start, old)) == 3


def test_available_now_after_a_failed_batch_drains_everything(tmp_path):
    """The first run's batch 1 fetched 10,000 of 40,000 and failed in the sink; the
    restart (AvailableNow) must plan batches for all 30,000 still on nsqd."""
    from pyspark.sql.streaming.datasource import ReadMaxRows

    first = driver(tmp_path, depth=40_000, maxMessagesPerTrigger="10000")
    start = first.initialOffset()
    end = first.latestOffset(start, ReadMaxRows(10_000))
    run_tasks(first, first.partitions(start, end), 5_000)  # FINished on nsqd: 30,000 left
    second = driver(tmp_path, depth=30_000, maxMessagesPerTrigger="10000")
    second.prepareForTriggerAvailableNow()
    run_tasks(second, second.partitions(start, end), 5_000)  # Spark replays batch 1
    planned = 0
    for _ in range(10):
        nxt = second.latestOffset(end, ReadMaxRows(10_000))
        if nxt == end:
            break
        # Spark's order: a batch is committed once the next one is planned
        # (latestOffset(start=end_N) runs before commit(end_N))
        second.commit(end)
        planned += nxt["size"]
        run_tasks(second, second.partitions(end, nxt), nxt["size"] // 2)
        second._subscription.handles[second.opts.topic].depth -= nxt["size"]
        end = nxt
    assert planned == 30_000 and second._subscription.handles[second.opts.topic].depth == 0


def test_available_now_reads_a_finished_batchs_spool_summary_once(tmp_path, monkeypatch):
    """The rows counted toward the AvailableNow target and the progress numbers come
    from one read of the batch's spool (a listdir and one _COMPLETE per partition)."""
    from pyspark.sql.streaming.datasource import ReadMaxRows

    from nsq_spark.spark._spool import Spool

    reads: list[int] = []
    real = Spool.batch_summary

    def counted(self, batch):
        reads.append(batch)
        return real(self, batch)

    monkeypatch.setattr(Spool, "batch_summary", counted)
    r = driver(tmp_path, depth=1000, numPartitions="2")
    r.prepareForTriggerAvailableNow()
    start = r.initialOffset()
    end = r.latestOffset(start, ReadMaxRows(400))
    run_tasks(r, r.partitions(start, end), 100)
    r._subscription.handles[r.opts.topic].depth -= 200
    nxt = r.latestOffset(end, ReadMaxRows(400))
    assert reads == [1]
    assert r._available_now.fetched == 200 and r._last_summary[0] == 1
    assert r._last_summary[1].rows == 200 and nxt["batch"] == 2


def test_a_spool_deleted_while_the_query_was_stopped_fails_naming_the_batch(tmp_path):
    import shutil

    from nsq_spark.errors import SparkSpoolError

    first = driver(tmp_path, depth=100)
    start = first.initialOffset()
    end = first.latestOffset(start, None)
    run_tasks(first, first.partitions(start, end), 50)  # FINished, then the driver dies
    shutil.rmtree(tmp_path / "spool")
    with pytest.raises(SparkSpoolError) as err:
        driver(tmp_path).partitions(start, end)
    msg = str(err.value)
    assert str(tmp_path / "spool") in msg and "micro-batch 1" in msg and "deleted" in msg
    assert "new checkpointLocation" in msg
    assert not os.path.exists(tmp_path / "spool")  # nothing recreated


def test_deleted_batch_directories_fail_the_restart_naming_the_batch(tmp_path):
    """``rm -rf <spool>/*/batch-*`` while the query is stopped after a failed batch: the
    query marker stays, the batch's record says its tasks were handed out, so the restart
    fails (it used to fetch new messages in place of the FINished ones: 10,000 lost)."""
    import glob
    import shutil

    from nsq_spark.errors import SparkSpoolError

    first = driver(tmp_path, depth=100)
    start = first.initialOffset()
    end = first.latestOffset(start, None)
    run_tasks(first, first.partitions(start, end), 50)  # FINished, then the driver dies
    for d in glob.glob(str(tmp_path / "spool" / "*" / "batch-*")):
        shutil.rmtree(d)
    spool = first._spool(start["query"])
    assert spool.has_query_marker() and spool.was_started(1)
    with pytest.raises(SparkSpoolError) as err:
        driver(tmp_path).partitions(start, end)
    msg = str(err.value)
    assert "micro-batch 1" in msg and str(tmp_path / "spool") in msg
    assert "batch-000000000001" in msg and "new checkpointLocation" in msg
    assert not os.path.exists(spool.batch_dir(1))  # nothing recreated
    # the batch committed (a restart after the commit never runs it again): its record goes
    first.commit(end)
    assert not spool.was_started(1)


def test_a_restart_with_another_spool_path_is_named_as_such(tmp_path):
    from nsq_spark.errors import SparkSpoolError

    first = driver(tmp_path, depth=100)
    start = first.initialOffset()
    end = first.latestOffset(start, None)
    assert end["spool"] == str(tmp_path / "spool")
    run_tasks(first, first.partitions(start, end), 50)
    moved = driver(tmp_path / "x")  # spoolPath <tmp>/x/spool: another place
    with pytest.raises(SparkSpoolError) as err:
        moved.partitions(start, end)
    msg = str(err.value)
    assert "option 'spoolPath' changed" in msg and "micro-batch 1" in msg
    assert str(tmp_path / "spool") in msg and str(tmp_path / "x" / "spool") in msg
    assert "was deleted" not in msg


def test_a_batch_planned_but_never_started_is_no_false_alarm(tmp_path):
    first = driver(tmp_path, depth=100)
    start = first.initialOffset()
    end = first.latestOffset(start, None)  # the offset log has it; partitions() never ran
    assert not os.path.exists(first._spool(start["query"]).batch_dir(1))
    assert len(driver(tmp_path).partitions(start, end)) == 2
    # a stopped query keeps its directory, with its marker, whatever was committed
    first.commit(end)
    first._tidy(start["query"], 1)
    assert sorted(os.listdir(tmp_path / "spool" / start["query"])) == ["_QUERY", "_started"]
    assert os.listdir(tmp_path / "spool" / start["query"] / "_started") == []


def test_a_spool_deleted_between_batches_of_a_running_driver_goes_on(tmp_path):
    import shutil

    first = driver(tmp_path, depth=100)
    start = first.initialOffset()
    shutil.rmtree(tmp_path / "spool")
    end = first.latestOffset(start, None)  # planned here: nothing fetched into it yet
    assert len(first.partitions(start, end)) == 2
    assert first._spool(start["query"]).has_query_marker()


def test_an_old_query_without_the_marker_is_not_refused_and_gets_one(tmp_path):
    first = driver(tmp_path, depth=100)
    start = {"query": "oldquery", "batch": 0, "size": 0}  # from before offsets had "v"
    end = first.latestOffset(start, None)
    assert end["v"] == 2 and first._spool("oldquery").has_query_marker()
    old_end = {"query": "oldquery2", "batch": 1, "size": 10}
    assert len(driver(tmp_path).partitions({"query": "oldquery2", "batch": 0}, old_end)) == 2


# -- fencing: an attempt that outlives its batch, or another attempt's seal --------------------


def test_an_attempt_whose_batch_is_committed_meanwhile_never_fins_nor_recreates(tmp_path):
    from nsq_spark.spark._spool import SpoolFenced

    o = read_opts(tmp_path)
    spool = Spool(str(tmp_path), "q11")
    spool.write_query_marker()
    marker = spool.write_marker(4)
    queue, log = make_messages(6), []

    class CommittedMeanwhile(StandInReader):
        def get_blocks(self, max_messages=1000, timeout=1.0):
            got = super().get_blocks(max_messages, timeout)
            if got:  # the driver commits batch 4 while this attempt holds messages
                spool.delete_upto(4)
            return got

    with pytest.raises(SpoolFenced, match="committed"):
        list(fetch_stream_partition(o, spool, 4, 0, None,
                                    lambda _: CommittedMeanwhile(queue, log), marker=marker))
    assert not [e for e in log if e[0] == "FIN"]
    assert [e[0] for e in log] == ["REQ"]  # the rest: the real Reader's close requeues
    assert not os.path.exists(spool.batch_dir(4))  # nothing recreated
    # an attempt that starts after the commit fetches nothing, and says why
    with pytest.raises(SpoolFenced, match="committed"):
        list(fetch_stream_partition(o, spool, 4, 1, None,
                                    lambda _: pytest.fail("must not fetch"), marker=marker))


def test_an_attempt_whose_partition_another_sealed_never_fins(tmp_path):
    from nsq_spark.spark._spool import SpoolFenced

    o = read_opts(tmp_path)
    spool = Spool(str(tmp_path), "q12")
    marker = spool.write_marker(2)
    part = spool.partition(2, 0, marker)
    queue, log = make_messages(3), []

    class SealedMeanwhile(StandInReader):
        def get_blocks(self, max_messages=1000, timeout=1.0):
            got = super().get_blocks(max_messages, timeout)
            if got and not part.sealed():  # the winning attempt completes (no chunks)
                part.seal()
                part.complete(0, 0)
            return got

    with pytest.raises(SpoolFenced, match="another attempt"):
        list(fetch_stream_partition(o, spool, 2, 0, None,
                                    lambda _: SealedMeanwhile(queue, log), marker=marker))
    assert not [e for e in log if e[0] == "FIN"]  # (the stand-in does not requeue on close)


def test_the_completing_attempt_takes_in_chunks_another_wrote_before_the_seal(tmp_path):
    """Two live attempts: B wrote (and FINished) a chunk after A's last one; A seals, so
    B FINishes nothing more, and A's result holds B's chunk instead of dropping it."""
    from nsq_spark.spark._schema import messages_to_batch

    o = read_opts(tmp_path)
    spool = Spool(str(tmp_path), "q13")
    part = spool.partition(6, 0)
    queue, log = make_messages(2), []
    other = messages_to_batch(make_messages(2, 50), "t", "c")

    class Racing(StandInReader):
        def get_blocks(self, max_messages=1000, timeout=1.0):
            got = super().get_blocks(max_messages, timeout)
            if not got and part.chunk_count() == 1 and not part.sealed():
                part.write_chunk(1, other)  # B's chunk, FINished by B
            return got

    got = bodies(fetch_stream_partition(o, spool, 6, 0, None, lambda _: Racing(queue, log)))
    assert got == [b"body-0", b"body-1", b"body-50", b"body-51"]
    assert part.completion().chunks == 2 and part.completion().rows == 4
    assert bodies(fetch_stream_partition(o, spool, 6, 0, None, None)) == got  # replay


def test_a_sealed_partition_whose_sealer_died_is_completed_without_fetching(tmp_path):
    o = read_opts(tmp_path)
    spool = Spool(str(tmp_path), "q14")
    queue, log = make_messages(2), []
    list(fetch_stream_partition(o, spool, 7, 0, None, lambda _: StandInReader(queue, log)))
    part = spool.partition(7, 0)
    os.unlink(f"{part.path}/_COMPLETE")  # the sealer died between its seal and _COMPLETE
    got = bodies(fetch_stream_partition(o, spool, 7, 0, 10, lambda _: pytest.fail("fetch")))
    assert got == [b"body-0", b"body-1"] and part.completion().rows == 2


def test_speculation_is_refused_in_the_task_before_connecting(tmp_path, monkeypatch):
    from pyspark import TaskContext

    from nsq_spark.spark._fetch import fetch_batch_partition

    # TaskContext() installs itself as the process's context: clear the slot through
    # monkeypatch first, so that teardown puts None back (a context left behind makes
    # every later SparkSession in this worker fail with CONTEXT_ONLY_VALID_ON_DRIVER)
    monkeypatch.setattr(TaskContext, "_taskContext", None)
    ctx = TaskContext()
    ctx._localProperties = {"spark.speculation": "true"}
    o = read_opts(tmp_path)
    for run in (lambda: fetch_stream_partition(o, Spool(str(tmp_path), "q15"), 1, 0, None,
                                               lambda _: pytest.fail("must not connect")),
                lambda: fetch_batch_partition(o, 10, lambda _: pytest.fail("must not connect"))):
        with pytest.raises(NSQOptionError, match="spark.speculation=false"):
            list(run())
    ctx._localProperties = {"spark.speculation": "false"}
    assert len(bodies(fetch_stream_partition(o, Spool(str(tmp_path), "q15"), 1, 0, None,
                                             lambda _: StandInReader(make_messages(1), [])))) == 1


# -- issue #24: the completion record carries what the driver reports as lag ---------------


def test_old_completion_records_stay_readable_and_a_batch_sums_its_partitions(tmp_path):
    from nsq_spark.spark._spool import BatchSummary, Completion

    spool = Spool(str(tmp_path), "q16")
    old = spool.partition(1, 0)
    os.makedirs(old.path)
    with open(f"{old.path}/_COMPLETE", "w") as f:  # written before the lag fields
        f.write('{"chunks": 2, "rows": 5}')
    assert old.completion() == Completion(2, 5)
    spool.partition(1, 1).complete(1, 3, bytes=30, oldest_timestamp_ns=20,
                                   newest_timestamp_ns=40, redeliveries_dropped=2)
    spool.partition(1, 2).complete(1, 4, bytes=7, oldest_timestamp_ns=10,
                                   newest_timestamp_ns=30, redeliveries_dropped=1)
    os.makedirs(spool.partition(1, 3).path)  # not complete: not counted
    assert spool.batch_summary(1) == BatchSummary(
        rows=12, bytes=37, oldest_timestamp_ns=10, newest_timestamp_ns=40,
        redeliveries_dropped=3, partitions=3)
    assert spool.batch_rows(1) == 12
    assert spool.batch_summary(2) == BatchSummary() and spool.batch_rows(2) is None


# -- register() -----------------------------------------------------------------------------


class _Refused(Exception):
    """A pyspark error as 4.0 raises it (getCondition; getErrorClass before the rename)."""

    def __init__(self, condition: str) -> None:
        super().__init__(f"[{condition}] ...")
        self.condition = condition

    def getCondition(self) -> str:
        return self.condition


class _Registry:
    def __init__(self, refuse: str | None) -> None:
        self.refuse, self.registered = refuse, []

    def register(self, source) -> None:
        if self.refuse:
            raise _Refused(self.refuse)
        self.registered.append(source)


class _Session:
    def __init__(self, refuse: str | None = None) -> None:
        self.dataSource = _Registry(refuse)


def test_register_is_idempotent_where_pyspark_refuses_a_second_registration():
    """pyspark 4.0 refuses a second registration of "nsq" (discovery registered it) with
    DATA_SOURCE_ALREADY_EXISTS: the source is there, not an error. Any other refusal is
    raised. The version tier runs this against the real pyspark 4.0."""
    import nsq_spark.spark
    from nsq_spark.spark.datasource import NSQDataSource

    ok = _Session()
    nsq_spark.spark.register(ok)
    assert ok.dataSource.registered == [NSQDataSource]
    nsq_spark.spark.register(_Session("DATA_SOURCE_ALREADY_EXISTS"))
    with pytest.raises(_Refused, match="SOMETHING_ELSE"):
        nsq_spark.spark.register(_Session("SOMETHING_ELSE"))
