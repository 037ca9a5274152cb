"""The stream source's offset (``nsq_spark.spark._offset``): every form ever written reads
back and is written back byte for byte, a round trip is the identity, every older form
of a batch gives the same tasks, and anything else is a typed error naming the fix. Then
the stream reader writes today's form and restarts from each older one, with fakes of
its port. No Spark session, no sockets."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsq_spark.errors import NSQError, SparkCheckpointError
from nsq_spark.spark._admission import TopicPlan
from nsq_spark.spark._offset import OFFSET_VERSION, BatchOffset
from nsq_spark.spark.options import NSQOptionError

from topic_fakes import fake_reader  # tests/spark: typed, checked by mypy

pytestmark = pytest.mark.unit

# Every form a release wrote, as pyspark put it in the offsets log (json.dumps of the dict
# the driver returned), oldest first: commits c226965, 73650c9, 884a41e, 2adc034.
WRITTEN = [
    # 0.1.0's first offsets: no "v", no "parts"
    '{"query": "9f2c", "batch": 0, "size": 0}',
    '{"query": "9f2c", "batch": 7, "size": 5000}',
    # "parts" and "v" (v 0: the query marker could not be written)
    '{"query": "9f2c", "batch": 0, "size": 0, "v": 2}',
    '{"query": "9f2c", "batch": 7, "size": 5000, "parts": 2, "v": 2}',
    '{"query": "9f2c", "batch": 7, "size": 5000, "parts": 2, "v": 0}',
    # "plan": several topics, or bytes capped
    '{"query": "9f2c", "batch": 8, "size": 900, "parts": 3, "v": 2, '
    '"plan": [["orders", 2, 800, null], ["refunds", 1, 100, null]]}',
    # "spool", the spoolPath planned with (today's form)
    '{"query": "9f2c", "batch": 9, "size": 5000, "parts": 2, "v": 2, "spool": "/mnt/spool"}',
    '{"query": "9f2c", "batch": 9, "size": 300, "parts": 2, "v": 2, "spool": "/mnt/spool", '
    '"plan": [["t", 2, 300, 600]]}',
    '{"query": "9f2c", "batch": 9, "size": 10, "parts": 1, "v": 0, '
    '"spool": "s3a://u:***@bucket/spool"}',
]


@pytest.mark.parametrize("text", WRITTEN)
def test_every_form_written_reads_back_and_is_written_back_byte_for_byte(text):
    offset = BatchOffset.from_json(text)
    assert offset.to_json() == text
    # pyspark hands the driver the parsed object: the same offset, the same object back
    assert BatchOffset.from_json(json.loads(text)) == offset
    assert offset.to_dict() == json.loads(text)
    assert list(offset.to_dict()) == list(json.loads(text))  # the key order too


def test_what_each_older_form_means():
    oldest = BatchOffset.from_json(WRITTEN[1])
    assert (oldest.parts, oldest.version, oldest.spool, oldest.plan) == (None,) * 4
    assert not oldest.marked and oldest.spool_changed("/elsewhere") is None
    assert BatchOffset.from_json(WRITTEN[3]).marked
    assert not BatchOffset.from_json(WRITTEN[4]).marked  # v 0: no marker promised
    today = BatchOffset.from_json(WRITTEN[6])
    assert today.spool_changed("/mnt/spool") is None
    assert today.spool_changed("/mnt/other") == "/mnt/spool"
    assert BatchOffset.initial("q").to_json() == '{"query": "q", "batch": 0, "size": 0, "v": 2}'
    assert BatchOffset.from_json(WRITTEN[7]).first_of_query() == BatchOffset.initial("9f2c")


def test_a_batch_without_parts_gets_num_partitions_or_what_its_spool_holds():
    old = BatchOffset.from_json(WRITTEN[1])
    asked: list[int] = []

    def in_spool() -> int:
        asked.append(1)
        return 3

    assert old.topic_plans("t", 2, in_spool) == (TopicPlan("t", 3, 5000, None),)
    assert old.topic_plans("t", 4, in_spool) == (TopicPlan("t", 4, 5000, None),)
    # a batch with parts never asks the spool
    asked.clear()
    assert BatchOffset.from_json(WRITTEN[3]).topic_plans("t", 9, in_spool) == (
        TopicPlan("t", 2, 5000, None),)
    assert asked == []


def test_a_batch_without_a_plan_read_by_a_query_on_several_topics_is_refused():
    with pytest.raises(NSQOptionError) as err:
        BatchOffset.from_json(WRITTEN[3]).topic_plans(None, 2, lambda: 0)
    msg = str(err.value)
    assert "micro-batch 7" in msg and "option(\"topic\"" in msg
    assert "new checkpointLocation" in msg
    # a recorded plan is what the batch reads, whatever the options say now
    planned = BatchOffset.from_json(WRITTEN[5])
    assert planned.topic_plans(None, 1, lambda: 0) == (
        TopicPlan("orders", 2, 800, None), TopicPlan("refunds", 1, 100, None))
    assert planned.topic_plans("other", 1, lambda: 0) == planned.plan


# -- properties --------------------------------------------------------------------------

names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1,
                max_size=12)
counts = st.integers(min_value=0, max_value=2**53)
topic_plans = st.builds(TopicPlan, names, st.integers(1, 10_000), counts,
                        st.none() | counts)
offsets = st.builds(
    BatchOffset, query=names, batch=counts, size=counts,
    parts=st.none() | st.integers(1, 10_000),
    version=st.none() | st.integers(0, OFFSET_VERSION),
    spool=st.none() | names,
    plan=st.none() | st.lists(topic_plans, min_size=1, max_size=4).map(tuple))


@given(offsets)
def test_a_round_trip_is_the_identity(offset):
    text = offset.to_json()
    assert BatchOffset.from_json(text) == offset
    assert BatchOffset.from_json(json.loads(text)) == offset
    assert BatchOffset.from_json(text).to_json() == text


@given(topic=names, batch=st.integers(1, 10**9), size=counts, parts=st.integers(1, 64),
       num_partitions=st.integers(1, 64), spool=names)
def test_every_older_form_of_a_batch_gives_the_same_tasks(topic, batch, size, parts,
                                                          num_partitions, spool):
    """The same one-topic batch as each release wrote it: the tasks are the same (the
    spool of a batch written before ``parts`` holds its partitions, and ``numPartitions``
    then was at most that)."""
    today = BatchOffset("q", batch, size, parts, OFFSET_VERSION, spool)
    forms = [
        {"query": "q", "batch": batch, "size": size},
        {"query": "q", "batch": batch, "size": size, "parts": parts, "v": 0},
        {"query": "q", "batch": batch, "size": size, "parts": parts, "v": 2},
        {"query": "q", "batch": batch, "size": size, "parts": parts, "v": 2,
         "plan": [[topic, parts, size, None]]},
        today.to_dict(),
    ]
    want = today.topic_plans(topic, num_partitions, lambda: 0)
    assert want == (TopicPlan(topic, parts, size, None),)
    for form in forms:
        got = BatchOffset.from_json(json.dumps(form)).topic_plans(
            topic, min(num_partitions, parts), lambda: parts)
        assert got == want, form


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 2**40) | st.floats(allow_nan=False) |
    st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["query", "batch", "size", "parts", "v", "spool", "plan", "x"]),
        inner, max_size=7),
    max_leaves=20)


@settings(max_examples=300)
@given(json_values)
def test_any_json_is_an_offset_that_round_trips_or_a_typed_error(value):
    try:
        offset = BatchOffset.from_json(json.dumps(value))
    except SparkCheckpointError as exc:
        assert "checkpointLocation" in str(exc)  # the fix is named
        return
    # nothing read is dropped or changed ("size" is in every offset written; one without
    # it reads as 0, as the driver always read it)
    assert offset.to_dict() == {"size": 0, **value}


@pytest.mark.parametrize("bad, names", [
    ("not json", "not JSON"),
    ("[1, 2]", "JSON object"),
    ('{"batch": 1}', "'query'"),
    ('{"query": "q"}', "'batch'"),
    ('{"query": "", "batch": 1}', "'query'"),
    ('{"query": "q", "batch": -1}', "'batch' -1"),
    ('{"query": "q", "batch": true}', "'batch' True"),
    ('{"query": "q", "batch": "3"}', "'batch' '3'"),
    ('{"query": "q", "batch": 1, "size": 1.5}', "'size' 1.5"),
    ('{"query": "q", "batch": 1, "parts": 0}', "'parts' 0"),
    ('{"query": "q", "batch": 1, "spool": 7}', "'spool' 7"),
    ('{"query": "q", "batch": 1, "plan": []}', "'plan' []"),
    ('{"query": "q", "batch": 1, "plan": [["t", 0, 1, null]]}', "['t', 0, 1, None]"),
    ('{"query": "q", "batch": 1, "plan": [["t", 1, 1]]}', "['t', 1, 1]"),
])
def test_a_damaged_offset_is_a_typed_error_naming_what_is_wrong_and_the_fix(bad, names):
    with pytest.raises(SparkCheckpointError) as err:
        BatchOffset.from_json(bad)
    assert isinstance(err.value, NSQError)
    msg = str(err.value)
    assert names in msg and "new checkpointLocation" in msg


def test_an_offset_of_a_newer_release_is_refused_naming_the_version_to_use():
    for bad, names in [('{"query": "q", "batch": 1, "v": 3}', "'v' 3"),
                       ('{"query": "q", "batch": 1, "v": 2, "epoch": 4}', "'epoch'")]:
        with pytest.raises(SparkCheckpointError) as err:
            BatchOffset.from_json(bad)
        msg = str(err.value)
        assert names in msg and "newer nsq-spark" in msg and "checkpointLocation" in msg


def test_a_huge_damaged_offset_is_quoted_short():
    with pytest.raises(SparkCheckpointError) as err:
        BatchOffset.from_json({"query": "q" * 100_000, "batch": -1})
    assert len(str(err.value)) < 1000


# -- the stream reader writes these forms and restarts from each (fakes of its port) -----

def reader(tmp_path, depths: dict[str, int], **options: str):
    return fake_reader(tmp_path / "spool", depths, **options)[0]


def test_the_stream_reader_writes_todays_form_byte_for_byte(tmp_path):
    r = reader(tmp_path, {"t": 100}, numPartitions="2")
    start = r.initialOffset()
    q, spool = start["query"], str(tmp_path / "spool")
    assert json.dumps(start) == f'{{"query": "{q}", "batch": 0, "size": 0, "v": 2}}'
    end = r.latestOffset(start, None)
    assert json.dumps(end) == (f'{{"query": "{q}", "batch": 1, "size": 100, "parts": 2, '
                               f'"v": 2, "spool": {json.dumps(spool)}}}')
    two = reader(tmp_path, {"a": 30, "b": 10}, numPartitions="2")
    end = two.latestOffset(start, None)
    assert json.dumps(end) == (f'{{"query": "{q}", "batch": 1, "size": 40, "parts": 2, '
                               f'"v": 2, "spool": {json.dumps(spool)}, '
                               '"plan": [["a", 1, 30, null], ["b", 1, 10, null]]}')


@pytest.mark.parametrize("text", WRITTEN)
def test_a_restart_from_every_form_written_goes_on(tmp_path, text):
    """The offset log's latest entry, in each form a release wrote: with nothing waiting
    it is handed back as the same text (Spark sees no new batch); with a backlog the
    next batch is planned in today's form; a batch it owes runs with its tasks."""
    topics = {"orders": 0, "refunds": 0} if "plan" in text and "orders" in text \
        else {"t": 0}
    r = reader(tmp_path, topics, numPartitions="2")
    logged = json.loads(text)
    assert json.dumps(r.latestOffset(logged, None)) == text
    for fake in r._subscription.handles.values():
        fake.depth = 10
    nxt = BatchOffset.from_json(r.latestOffset(json.loads(text), None))
    assert nxt.batch == logged["batch"] + 1 and nxt.query == logged["query"]
    assert nxt.size == 10 * len(topics) and nxt.marked and nxt.parts is not None
    assert nxt.spool == str(tmp_path / "spool")
    if logged["batch"] == 0:
        return
    # the driver died before the batch's commit: the restart runs it, as it was planned
    again = reader(tmp_path, topics, numPartitions="1")
    again._spool(logged["query"]).write_query_marker()
    before = {**logged, "batch": logged["batch"] - 1}
    tasks = again.partitions(before, logged)
    want = BatchOffset.from_json(text).topic_plans(
        "t" if "t" in topics else None, 1, lambda: 0)
    assert len(tasks) == sum(p.parts for p in want)
    assert [t.topic for t in tasks] == [p.topic for p in want for _ in range(p.parts)]
