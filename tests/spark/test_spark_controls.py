"""Kafka's controls on the ``nsq`` source, and its lag as numbers: the pure planner
(:mod:`nsq_spark.spark._admission`), the options, the driver with fakes of its nsqd port
(no sockets, no Spark), and :func:`nsq_spark.spark.progress.source_lag`.

The driver reads a finished batch's numbers with ``Spool.batch_summary``: the tests that
need them write real ``_COMPLETE`` records through the spool API.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsq_spark.spark._admission import (Limits, TopicPlan, apportion, hold_back, plan_topics,
                                       split_shares, task_shares)
from nsq_spark.spark._backlog import Backlog, Counts, Paused, TopicBacklog, combine
from nsq_spark.spark.options import NSQOptionError, parse_read_options
from nsq_spark.spark.progress import BatchNumbers, SourceLag, lag_fields, source_lag, source_lags
from nsq_spark.spark._spool import BatchSummary

pytestmark = pytest.mark.unit

BASE = {"channel": "c", "nsqdTcpAddresses": "127.0.0.1:4150",
        "nsqdHttpAddresses": "127.0.0.1:4151", "spoolPath": "/tmp/x"}


# -- the planner ---------------------------------------------------------------------------


@given(st.integers(0, 10 ** 6), st.lists(st.integers(0, 10 ** 6), min_size=1, max_size=20))
def test_apportion_sums_to_the_total_and_is_within_one_of_the_exact_share(total, weights):
    out = apportion(total, weights)
    assert sum(out) == total and len(out) == len(weights)
    whole = sum(weights) or len(weights)
    exact = [total * (w if sum(weights) else 1) / whole for w in weights]
    assert all(abs(o - e) < 1 for o, e in zip(out, exact))
    assert out == apportion(total, weights)  # the same offset gives the same tasks


def test_split_shares_gives_the_first_tasks_the_remainder():
    assert split_shares(1000, 3) == [334, 333, 333]
    assert split_shares(2, 4) == [1, 1]  # no task with nothing to fetch
    assert split_shares(0, 2) == [None, None]  # 0: no cap


backlogs = st.dictionaries(st.from_regex(r"[a-z]{1,6}", fullmatch=True),
                           st.integers(0, 100_000), min_size=1, max_size=8)


@given(backlogs, st.none() | st.integers(1, 50_000), st.integers(1, 20),
       st.none() | st.integers(1, 10 ** 9))
@settings(max_examples=300)
def test_a_measured_plan_reads_what_waits_up_to_the_cap_on_the_topics_that_have_it(
        depth, cap, parts, max_bytes):
    plan = plan_topics(depth, Limits(max_rows=cap, max_bytes=max_bytes), parts)
    total = sum(depth.values())
    if total == 0:
        assert plan == ()
        return
    assert sum(p.size for p in plan) == (total if cap is None else min(total, cap))
    for p in plan:
        assert 0 < p.size <= depth[p.topic]  # a topic without a backlog gets no task
        assert 1 <= p.parts <= p.size
    assert len(plan) <= sum(p.parts for p in plan) <= max(parts, len(plan))
    assert [p.topic for p in plan] == [t for t in depth if t in {p.topic for p in plan}]
    if max_bytes is None:
        assert all(p.max_bytes is None for p in plan)
    else:
        assert sum(p.max_bytes or 0 for p in plan) == max(max_bytes,
                                                           sum(p.parts for p in plan))
    tasks = [t for p in plan for t in task_shares(p)]
    assert sum(s or 0 for s, _ in tasks) == sum(p.size for p in plan)
    assert len(tasks) == sum(p.parts for p in plan)
    if max_bytes is not None:  # every task gets a byte share, at least 1 byte
        assert all(b is not None and b >= 1 for _, b in tasks)
        assert sum(b or 0 for _, b in tasks) == max(max_bytes, len(tasks))


def test_tasks_follow_the_backlog_and_every_topic_with_one_gets_a_task():
    plan = plan_topics({"a": 9000, "b": 1000, "c": 0}, Limits(), 4)
    assert plan == (TopicPlan("a", 3, 9000, None), TopicPlan("b", 1, 1000, None))
    # more topics than numPartitions: one task each
    plan = plan_topics({"a": 5, "b": 5, "c": 5}, Limits(), 2)
    assert [(p.topic, p.parts) for p in plan] == [("a", 1), ("b", 1), ("c", 1)]
    # a cap divided in proportion to the backlog (Kafka: maxOffsetsPerTrigger by lag)
    plan = plan_topics({"a": 3000, "b": 1000}, Limits(max_rows=400), 2)
    assert [(p.topic, p.size) for p in plan] == [("a", 300), ("b", 100)]


def test_without_a_measurement_every_topic_gets_its_even_part():
    plan = plan_topics({"a": None, "b": None}, Limits(), 3)
    assert plan == (TopicPlan("a", 2, 0, None), TopicPlan("b", 1, 0, None))
    plan = plan_topics({"a": None, "b": None}, Limits(max_rows=101, max_bytes=1000), 4)
    # bytes follow the messages; every task at least 1 byte (it takes one message)
    assert plan == (TopicPlan("a", 2, 51, 505), TopicPlan("b", 2, 50, 495))
    assert task_shares(plan[0]) == [(26, 257), (25, 248)]
    assert [b for _, b in task_shares(TopicPlan("a", 3, 30, 2))] == [1, 1, 1]


def test_a_pattern_matching_nothing_plans_nothing():
    assert plan_topics({}, Limits(), 2) == ()


def test_the_minimum_holds_a_batch_back_until_the_delay_has_passed():
    limits = Limits(min_rows=100, max_trigger_delay=60.0)
    assert hold_back(99, limits, since_last_batch=10.0)
    assert not hold_back(100, limits, since_last_batch=10.0)
    assert not hold_back(1, limits, since_last_batch=60.0)
    assert not hold_back(0 and None, Limits(), 0.0)
    assert not hold_back(None, limits, 0.0)  # cannot be measured: never held


def test_a_topic_plan_round_trips_through_the_offset():
    plan = TopicPlan("t", 2, 10, 4096)
    assert TopicPlan.from_offset(json.loads(json.dumps(plan.as_offset()))) == plan
    assert TopicPlan.from_offset(["t", 1, 0, None]).max_bytes is None


# -- options -------------------------------------------------------------------------------


@pytest.mark.parametrize("given_opts, needle", [
    ({}, "exactly one of the options 'topic'"),
    ({"topic": "a", "topics": "b"}, "'topic' and 'topics'"),
    ({"topics": "a", "topicPattern": "b.*"}, "'topics' and 'topicPattern'"),
    ({"topic": "a,b"}, "use .option(\"topics\""),
    ({"topics": " , "}, "option 'topics' is empty"),
    ({"topics": "a,b c"}, "not a valid NSQ topic name"),
    ({"topicPattern": "ev(ents"}, "not a valid regular expression"),
])
def test_the_subscription_is_exactly_one_valid_option(given_opts, needle):
    with pytest.raises(NSQOptionError, match=None) as err:
        parse_read_options({**BASE, **given_opts}, streaming=True)
    assert needle in str(err.value)


def test_topics_and_pattern_parse():
    o = parse_read_options({**BASE, "topics": "a, b,a"}, streaming=True)
    assert o.topics == ("a", "b") and o.topic == "a" and o.topic_pattern is None
    o = parse_read_options({**BASE, "TOPICPATTERN": "ev_.*"}, streaming=True)
    assert o.topics == () and o.topic == "" and o.topic_pattern == "ev_.*"


def test_a_pattern_needs_somewhere_to_list_topics():
    tcp_only = {k: v for k, v in BASE.items() if k != "nsqdHttpAddresses"}
    with pytest.raises(NSQOptionError, match="topicPattern' needs a list of topics"):
        parse_read_options({**tcp_only, "topicPattern": "a.*"}, streaming=True)


@pytest.mark.parametrize("extra, needle", [
    ({"minMessagesPerTrigger": "10", "maxMessagesPerTrigger": "5"}, "must not exceed"),
    ({"maxTriggerDelay": "5"}, "only takes effect with 'minMessagesPerTrigger'"),
    ({"minMessagesPerTrigger": "0"}, "minMessagesPerTrigger"),
    ({"maxBytesPerTrigger": "0"}, "maxBytesPerTrigger"),
    ({"maxTriggerDelay": "-1", "minMessagesPerTrigger": "1"}, "maxTriggerDelay"),
    ({"backlogPollInterval": "-0.5"}, "backlogPollInterval"),
])
def test_bad_controls_fail_naming_the_option(extra, needle):
    with pytest.raises(NSQOptionError) as err:
        parse_read_options({**BASE, "topic": "t", **extra}, streaming=True)
    assert needle in str(err.value)


@pytest.mark.parametrize("given, seconds", [
    ("5", 5.0), ("5s", 5.0), ("500ms", 0.5), ("1m", 60.0), ("15m", 900.0),
    ("2 minutes", 120.0), ("1h", 3600.0), ("1d", 86400.0), ("1.5 S", 1.5), ("250us", 250e-6),
])
def test_max_trigger_delay_takes_kafkas_duration_strings(given, seconds):
    o = parse_read_options({**BASE, "topic": "t", "minMessagesPerTrigger": "5",
                            "maxTriggerDelay": given}, streaming=True)
    assert o.max_trigger_delay == pytest.approx(seconds)


@pytest.mark.parametrize("given", ["5 parsecs", "s", "five seconds", "-1s", "0ms", "2y"])
def test_a_duration_that_is_not_one_is_refused_naming_the_option(given):
    with pytest.raises(NSQOptionError, match="maxTriggerDelay") as err:
        parse_read_options({**BASE, "topic": "t", "minMessagesPerTrigger": "5",
                            "maxTriggerDelay": given}, streaming=True)
    assert repr(given) in str(err.value) or "> 0" in str(err.value)


def test_the_minimum_needs_a_measurable_backlog():
    tcp_only = {k: v for k, v in BASE.items() if k != "nsqdHttpAddresses"}
    with pytest.raises(NSQOptionError, match="needs the backlog measured"):
        parse_read_options({**tcp_only, "topic": "t", "minMessagesPerTrigger": "5"},
                           streaming=True)


def test_controls_parse_with_defaults():
    o = parse_read_options({**BASE, "topic": "t", "minMessagesPerTrigger": "500",
                            "maxBytesPerTrigger": "1048576"}, streaming=True)
    assert (o.min_messages_per_trigger, o.max_trigger_delay, o.max_bytes_per_trigger,
            o.backlog_poll_interval) == (500, 900.0, 1048576, 0.1)


# -- the driver, with fakes of its port ----------------------------------------------------


class FakeTopic:
    """One topic's nsqds (the driver's TopicBacklog port) without sockets."""

    def __init__(self, depth: int | None = 0) -> None:
        self.depth = depth
        self.last: Backlog | None = None
        self.measured = 0

    def check_reachable(self, require_producer: bool) -> None:
        pass

    def backlog(self) -> int | None:
        self.measured += 1
        if self.depth is not None:
            self.last = Backlog(Counts(depth=self.depth), 1, 1, 1_700_000_000.0)
        return self.depth

    def settled_backlog(self) -> int | None:
        return self.depth


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def driver(tmp_path, topics: dict[str, int | None], **options: str):
    from nsq_spark.spark.datasource import NSQStreamReader

    names = list(topics)
    subscription = {"topic": names[0]} if len(names) == 1 else {"topics": ",".join(names)}
    r = NSQStreamReader({**BASE, **subscription, "spoolPath": str(tmp_path / "spool"),
                         **options})
    fakes: dict[str, TopicBacklog] = {t: FakeTopic(d) for t, d in topics.items()}
    r._subscription.handles = fakes
    r._clock = Clock()
    return r, fakes


def test_no_batch_below_the_minimum_until_max_trigger_delay(tmp_path):
    r, fakes = driver(tmp_path, {"t": 40}, minMessagesPerTrigger="100",
                      maxTriggerDelay="30", backlogPollInterval="0")
    start = r.initialOffset()
    assert r.latestOffset(start, None) == start  # 40 < 100, the delay counts from start
    r._clock.now += 29
    assert r.latestOffset(start, None) == start
    r._clock.now += 1  # 30 s since the start: the batch goes, with what there is
    end = r.latestOffset(start, None)
    assert end["batch"] == 1 and end["size"] == 40
    fakes["t"].depth = 100  # at the minimum: at once
    assert r.latestOffset(end, None)["batch"] == 2
    fakes["t"].depth = 99  # the delay counts again from that batch
    r._clock.now += 29.9
    later = {**end, "batch": 2}
    assert r.latestOffset(later, None) == later


def test_the_report_says_when_a_minimum_may_hold_a_backlog_back_while_idle(tmp_path):
    """An idle query sends no progress: the listener learns from the last report whether
    an idle trigger means "caught up" or "a backlog below the minimum may wait"."""
    r, _ = driver(tmp_path, {"t": 40}, minMessagesPerTrigger="100",
                  backlogPollInterval="0")
    start = r.initialOffset()
    assert r.latestOffset(start, None) == start
    report = r.reportLatestOffset()
    assert report["minMessagesPerTrigger"] == 100
    assert source_lag({"sources": [{"latestOffset": json.dumps(report)}]}
                      ).min_messages_per_trigger == 100
    plain, _ = driver(tmp_path, {"t": 40}, backlogPollInterval="0")
    plain.latestOffset(plain.initialOffset(), None)
    assert "minMessagesPerTrigger" not in plain.reportLatestOffset()
    available_now, _ = driver(tmp_path, {"t": 5}, minMessagesPerTrigger="100")
    available_now.prepareForTriggerAvailableNow()
    available_now.latestOffset(available_now.initialOffset(), None)
    assert "minMessagesPerTrigger" not in available_now.reportLatestOffset()


def test_available_now_does_not_wait_for_the_minimum(tmp_path):
    r, _ = driver(tmp_path, {"t": 5}, minMessagesPerTrigger="100")
    start = r.initialOffset()
    r.prepareForTriggerAvailableNow()
    assert r.latestOffset(start, None)["size"] == 5


def test_the_read_limit_spark_gets_is_the_options_one(tmp_path):
    from nsq_spark.spark._compat import ReadMaxBytes, ReadMaxRows, ReadMinRows

    if ReadMinRows is None:
        pytest.skip("this pyspark has no ReadMinRows / ReadMaxBytes")
    limit = driver(tmp_path, {"t": 0}, minMessagesPerTrigger="7")[0].getDefaultReadLimit()
    assert limit == ReadMinRows(7)
    limit = driver(tmp_path, {"t": 0}, maxBytesPerTrigger="70")[0].getDefaultReadLimit()
    assert limit == ReadMaxBytes(70)
    r, _ = driver(tmp_path, {"t": 1000}, minMessagesPerTrigger="7",
                  maxMessagesPerTrigger="300", maxBytesPerTrigger="600")
    assert r.getDefaultReadLimit() == ReadMaxRows(300)
    # the other two still apply: the source takes them from its options
    end = r.latestOffset(r.initialOffset(), ReadMaxRows(300))
    assert end["size"] == 300 and end["plan"] == [["t", 2, 300, 600]]


def test_several_topics_are_planned_and_recorded_in_the_offset(tmp_path):
    r, fakes = driver(tmp_path, {"a": 3000, "b": 1000, "c": 0}, numPartitions="4",
                      maxBytesPerTrigger="4000")
    start = r.initialOffset()
    end = r.latestOffset(start, None)
    assert end["plan"] == [["a", 3, 3000, 3000], ["b", 1, 1000, 1000]]
    assert (end["size"], end["parts"]) == (4000, 4)
    parts = r.partitions(start, end)
    assert [(p.index, p.topic, p.share, p.max_bytes) for p in parts] == [
        (0, "a", 1000, 1000), (1, "a", 1000, 1000), (2, "a", 1000, 1000),
        (3, "b", 1000, 1000)]
    # run again from the checkpoint by a driver whose topics now wait elsewhere: the
    # same topics, tasks and shares (the offset says them, not the backlog now)
    again, _ = driver(tmp_path, {"a": 0, "b": 0, "c": 500}, numPartitions="1")
    assert [(p.index, p.topic, p.share, p.max_bytes) for p in again.partitions(start, end)] \
        == [(p.index, p.topic, p.share, p.max_bytes) for p in parts]
    report = r.reportLatestOffset()
    assert report["topics"] == ["a", "b", "c"] and "topic" not in report
    assert report["backlogByTopic"] == {"a": 3000, "b": 1000, "c": 0}
    assert report["backlog"]["depth"] == 4000 and report["backlogMessages"] == 4000


def test_a_one_topic_offset_looks_as_before_and_an_old_one_is_refused_for_several(tmp_path):
    r, _ = driver(tmp_path, {"t": 10})
    start = r.initialOffset()
    end = r.latestOffset(start, None)
    assert "plan" not in end and (end["size"], end["parts"]) == (10, 2)
    assert [(p.topic, p.share) for p in r.partitions(start, end)] == [("t", 5), ("t", 5)]
    several, _ = driver(tmp_path, {"t": 0, "u": 0})
    with pytest.raises(NSQOptionError, match="which topic that batch read"):
        several.partitions(start, end)


def test_an_idle_source_measures_every_poll_interval_and_at_once_after_a_batch(tmp_path):
    r, fakes = driver(tmp_path, {"t": 0}, backlogPollInterval="0.1")
    fake = fakes["t"]
    assert isinstance(fake, FakeTopic)
    start = r.initialOffset()
    for _ in range(10):  # Spark's idle polling, every 10 ms
        assert r.latestOffset(start, None) == start
        r._clock.now += 0.01
    assert fake.measured == 1
    r._clock.now += 0.01  # 0.1 s since the measurement
    fake.depth = 3
    end = r.latestOffset(start, None)
    assert end["batch"] == 1 and fake.measured == 2
    assert r.latestOffset(end, None)["batch"] == 2  # a batch ended: measured at once
    assert fake.measured == 3


def test_the_report_has_the_lag_of_the_batch_that_just_ran(tmp_path):
    r, fakes = driver(tmp_path, {"t": 10})
    r._wall = lambda: 1_700_000_010.0
    start = r.initialOffset()
    end = r.latestOffset(start, None)
    parts = r.partitions(start, end)  # Spark runs batch 1: its two tasks complete
    assert len(parts) == 2
    spool = r._spool(end["query"])
    spool.partition(1, 0).complete(1, 6, bytes=700,
                                   oldest_timestamp_ns=1_700_000_001_000_000_000,
                                   newest_timestamp_ns=1_700_000_005_000_000_000,
                                   redeliveries_dropped=1)
    spool.partition(1, 1).complete(1, 4, bytes=534,
                                   oldest_timestamp_ns=1_700_000_003_000_000_000,
                                   newest_timestamp_ns=1_700_000_007_500_000_000,
                                   redeliveries_dropped=1)
    fakes["t"].depth = 4  # measured after batch 1 ran
    r.latestOffset(end, None)
    report = r.reportLatestOffset()
    assert report["topic"] == "t" and report["topics"] == ["t"]
    assert {k: report[k] for k in ("backlogMessages", "lastBatch", "lastBatchRows",
                                   "lastBatchBytes", "lastBatchRedeliveriesDropped",
                                   "lastBatchOldestAgeSeconds", "lagSeconds",
                                   "pausedNsqds", "unreachableNsqds")} == {
        "backlogMessages": 4, "lastBatch": 1, "lastBatchRows": 10, "lastBatchBytes": 1234,
        "lastBatchRedeliveriesDropped": 2, "lastBatchOldestAgeSeconds": 9.0,
        "lagSeconds": 2.5, "pausedNsqds": 0, "unreachableNsqds": 0}
    lag = source_lag({"sources": [{"latestOffset": json.dumps(report)}]})
    assert lag is not None and lag.lag_seconds == 2.5 and lag.last_batch_rows == 10
    assert lag.topics == ("t",) and lag.channel == "c" and lag.backlog_messages == 4


class NoNumbers:
    """A spool whose numbers cannot be read."""

    def batch_summary(self, batch: int) -> BatchNumbers:
        raise OSError("spool unreachable")

    def tidy(self, batch: int) -> int:
        return 0

    def has_query_marker(self) -> bool:
        return True

    def write_query_marker(self) -> None:
        pass


def test_a_spool_without_numbers_costs_the_numbers_not_the_batch(tmp_path, caplog):
    r, fakes = driver(tmp_path, {"t": 10})
    start = r.initialOffset()
    end = r.latestOffset(start, None)
    # restarted on a checkpoint whose last batch was committed before: its spool is
    # gone, and it is not asked for numbers (no warning)
    restarted, _ = driver(tmp_path, {"t": 10})
    restarted._spool = lambda query: NoNumbers()
    restarted.latestOffset(end, None)
    assert "could not read" not in caplog.text
    r.partitions(start, end)
    r._spool = lambda query: NoNumbers()
    assert r.latestOffset(end, None)["batch"] == 2
    assert "could not read the numbers of batch 1" in caplog.text
    assert "lastBatchRows" not in r.reportLatestOffset()


# -- the numbers ---------------------------------------------------------------------------


def test_lag_is_zero_when_caught_up_and_unknown_before_a_batch():
    n = BatchSummary(5, 50, 1_000_000_000, 2_000_000_000, 0, 1)
    assert lag_fields(0, 0, 0, 1, n, 12.0)["lagSeconds"] == 0.0
    assert lag_fields(7, 0, 0, 1, n, 12.0)["lagSeconds"] == 10.0
    assert "lagSeconds" not in lag_fields(7, 0, 0, None, None, 12.0)
    empty = BatchSummary(0, 0, None, None, 0, 2)
    out = lag_fields(7, 1, 2, 3, empty, 12.0)
    assert "lagSeconds" not in out and out["lastBatchRows"] == 0
    assert (out["pausedNsqds"], out["unreachableNsqds"]) == (1, 2)


def test_source_lag_reads_dicts_json_and_progress_objects_and_skips_other_sources():
    report = {"query": "q", "batch": 3, "channel": "c", "topics": ["a", "b"],
              "backlogByTopic": {"a": 1, "b": 2}, "backlogMessages": 3, "lagSeconds": 0.5,
              "pausedNsqds": 1, "unreachableNsqds": 0}
    other = {"latestOffset": json.dumps({"0": 17}), "description": "RateStream"}
    as_dict = {"sources": [other, {"latestOffset": json.dumps(report)}]}

    class Source:
        latestOffset = json.dumps(report)

    class Progress:
        sources = [Source()]

    expected = SourceLag(topics=("a", "b"), channel="c", batch=3, backlog_messages=3,
                         lag_seconds=0.5, paused_nsqds=1,
                         backlog_by_topic={"a": 1, "b": 2})
    assert source_lag(as_dict) == expected
    assert source_lag(json.dumps(as_dict)) == expected
    assert source_lag(Progress()) == expected
    assert source_lags({"sources": [other]}) == [] and source_lag({"sources": []}) is None
    # an nsq source on pyspark < 4.2 reports no numbers: None, not zeros
    assert source_lag({"sources": [{"latestOffset": json.dumps(
        {"query": "q", "batch": 1, "size": 0})}]}) is None


def test_combined_backlog_names_each_pause_with_its_topic():
    a = Backlog(Counts(depth=5), 2, 2, 1.0, 5, (Paused("n1:4151", "channel", 3),))
    b = Backlog(Counts(depth=7, in_flight=1), 1, 1, 2.0, 4, (),
                (("n2:4151", "refused"),))
    both = combine({"a": a, "b": b})
    assert both is not None
    shown = both.as_progress()
    assert (shown["depth"], shown["fetchable"], shown["inFlight"]) == (12, 9, 1)
    assert shown["paused"] == [{"nsqd": "n1:4151", "paused": "channel", "depth": 3,
                                "topic": "a"}]
    assert shown["nsqdsUnreachable"] == [{"nsqd": "n2:4151", "error": "refused"}]
    assert combine({"a": a}) is a and combine({}) is None


class Unreachable(FakeTopic):
    def check_reachable(self, require_producer: bool) -> None:
        from nsq_spark.errors import ConnectError

        raise ConnectError("no nsqd answered (test)")


def test_a_query_on_several_topics_starts_while_one_of_them_answers(caplog):
    from nsq_spark.errors import ConnectError
    from nsq_spark.spark._backlog import Subscription

    handles: dict[str, TopicBacklog] = {"a": Unreachable(), "b": FakeTopic(3)}
    sub = Subscription(("a", "b"), None, [], ["127.0.0.1:1"], lambda t: handles[t])
    sub.check_reachable(require_producer=False)  # b answers: a warning for a
    assert "topic a: no nsqd answered" in caplog.text
    assert sub.backlogs() == {"a": 0, "b": 3}
    alone = Subscription(("a",), None, [], ["127.0.0.1:1"], lambda t: Unreachable())
    with pytest.raises(ConnectError, match="no nsqd answered"):
        alone.check_reachable(require_producer=False)
    none: dict[str, TopicBacklog] = {"a": Unreachable(), "b": Unreachable()}
    both = Subscription(("a", "b"), None, [], ["127.0.0.1:1"], lambda t: none[t])
    with pytest.raises(ConnectError):
        both.check_reachable(require_producer=False)
