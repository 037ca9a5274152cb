"""The Spark source's ``trace_parent`` column and inner bodies, from MessageBlocks and
from Messages alike; older spool chunks without the column; and the driver-side count of
a query's consumed messages from its progress. No Spark, no sockets."""

from __future__ import annotations

import json

import pytest

pa = pytest.importorskip("pyarrow")
pytest.importorskip("numpy")

from opentelemetry.sdk.metrics import MeterProvider  # noqa: E402
from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402

from conn_helpers import message_blocks  # noqa: E402
from nsq_spark.spark.progress import lag_fields  # noqa: E402
from nsq_spark.spark._schema import (SCHEMA_DDL, arrow_schema, blocks_to_batch,  # noqa: E402
                                    conform, messages_to_batch)
from nsq_spark.spark._spool import BatchSummary  # noqa: E402
from nsq_spark.spool._format import wrap_envelope  # noqa: E402
from nsq_spark.spark.instrument import ProgressInstrument  # noqa: E402
from nsq_spark.telemetry import Telemetry  # noqa: E402

pytestmark = pytest.mark.unit

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


blocks = message_blocks


def test_the_schema_ends_with_a_nullable_trace_parent_string_and_publish_id():
    assert SCHEMA_DDL.endswith(", trace_parent string, publish_id binary")
    field = arrow_schema().field("trace_parent")
    assert field.type == pa.string() and field.nullable
    field = arrow_schema().field("publish_id")
    assert field.type == pa.binary() and field.nullable


def test_traced_bodies_are_opened_and_their_traceparent_is_a_column_from_blocks_and_messages():
    v1 = wrap_envelope(b"digest only")
    bodies = [wrap_envelope(b"inner-0", PARENT), b"plain", v1, wrap_envelope(b"", PARENT, "a=b")]
    bs = blocks(bodies)
    for rb in (blocks_to_batch(bs, "t", "c"),
               messages_to_batch([m for b in bs for m in b.messages()], "t", "c")):
        assert rb.schema == arrow_schema()
        assert rb.column("body").to_pylist() == [b"inner-0", b"plain", v1, b""]
        assert rb.column("trace_parent").to_pylist() == [PARENT, None, None, PARENT]


def test_a_batch_without_traced_bodies_gets_a_null_column_and_its_bodies_untouched():
    bs = blocks([b"a", b"b" * 100, wrap_envelope(b"c")])
    rb = blocks_to_batch(bs, "t", "c")
    assert rb.column("trace_parent").null_count == 3
    assert rb.column("body").to_pylist() == [b"a", b"b" * 100, wrap_envelope(b"c")]


def test_a_chunk_spooled_before_the_columns_existed_gets_them_null():
    rb = blocks_to_batch(blocks([b"x", b"y"]), "t", "c")
    for old in (rb.drop_columns(["trace_parent", "publish_id"]),
                rb.drop_columns(["publish_id"])):
        assert conform(old).equals(rb)
    assert conform(rb) is rb


def progress(batch: int, rows: int, topic: str = "orders", channel: str = "audit",
             query_id: str = "q-1", run_id: str = "run-1") -> str:
    """A query progress as pyspark 4.2+ reports the nsq source (its latestOffset JSON)."""
    latest = {"topic": topic, "channel": channel, "batch": batch + 1,
              **lag_fields(5, 0, 0, batch, BatchSummary(rows=rows, partitions=2), 0.0)}
    return json.dumps({"id": query_id, "runId": run_id,
                       "sources": [{"description": "nsq", "latestOffset": json.dumps(latest)},
                                   {"description": "other", "latestOffset": "{}"}]})


def test_the_driver_counts_each_batch_of_the_progress_once():
    reader = InMemoryMetricReader()
    t = ProgressInstrument(Telemetry(MeterProvider(metric_readers=[reader])))
    assert t.record(progress(3, 120)) == 120
    assert t.record(progress(3, 120)) == 0      # the same batch reported again
    assert t.record(progress(4, 0)) == 0        # an empty batch counts nothing
    assert t.record(progress(5, 30)) == 30
    (metric,) = [m for rm in reader.get_metrics_data().resource_metrics
                 for sm in rm.scope_metrics for m in sm.metrics]
    assert metric.name == "messaging.client.consumed.messages"
    (point,) = metric.data.data_points
    assert point.value == 150
    assert dict(point.attributes) == {
        "messaging.system": "nsq", "messaging.operation.name": "receive",
        "messaging.operation.type": "receive", "messaging.destination.name": "orders",
        "messaging.consumer.group.name": "audit"}


def test_a_restarted_query_and_a_second_query_on_the_same_channel_count_their_batches():
    reader = InMemoryMetricReader()
    t = ProgressInstrument(Telemetry(MeterProvider(metric_readers=[reader])))
    assert t.record(progress(7, 10)) == 10
    # restarted on a fresh checkpoint: a new run, batch ids from 0 again
    assert t.record(progress(0, 4, run_id="run-2")) == 4
    assert t.record(progress(1, 5, run_id="run-2")) == 5
    assert t.record(progress(1, 5, run_id="run-2")) == 0   # reported again
    # another query on the same topic and channel, behind the first
    assert t.record(progress(2, 3, query_id="q-2")) == 3
    assert t.record(progress(8, 1)) == 1   # the first query goes on
    (point,) = [p for rm in reader.get_metrics_data().resource_metrics
                for sm in rm.scope_metrics for m in sm.metrics for p in m.data.data_points]
    assert point.value == 23
    t.forget_query("q-1")
    assert {k[0] for k in t._recorded_batches} == {"q-2"}


def test_older_batches_reported_again_count_nothing():
    # a loop re-reading recentProgress, or a listener and lastProgress both reporting:
    # batch numbers only grow within a run, so an older batch was counted already
    t = ProgressInstrument(Telemetry(MeterProvider(metric_readers=[InMemoryMetricReader()])))
    recent = [progress(0, 10), progress(1, 10), progress(2, 10)]
    assert [sum(t.record(p) for p in recent) for _ in range(3)] == [30, 0, 0]
    assert t.record(progress(1, 10)) == 0


def test_telemetry_record_progress_still_counts_for_one_release_and_says_what_replaces_it():
    reader = InMemoryMetricReader()
    t = Telemetry(MeterProvider(metric_readers=[reader]))
    with pytest.warns(DeprecationWarning, match="nsq_spark.spark.ProgressInstrument"):
        assert t.record_progress(progress(0, 7)) == 7
    with pytest.warns(DeprecationWarning, match="ProgressInstrument"):
        assert t.record_progress(progress(0, 7)) == 0   # one instrument: counted once
    with pytest.warns(DeprecationWarning):
        t.forget_query("q-1")
    with pytest.warns(DeprecationWarning):
        assert t.record_progress(progress(0, 7)) == 7   # forgotten: counted again
    (point,) = [p for rm in reader.get_metrics_data().resource_metrics
                for sm in rm.scope_metrics for m in sm.metrics for p in m.data.data_points]
    assert point.value == 14


def test_a_progress_instrument_takes_a_telemetry_only():
    from nsq_spark.errors import ConfigError

    with pytest.raises(ConfigError, match="ProgressInstrument\\(Telemetry\\(\\)\\)"):
        ProgressInstrument(object())  # type: ignore[arg-type]


def test_bodies_that_only_look_traced_stay_as_they_are():
    from nsq_spark.spool._format import TRACED_ENVELOPE_MAGIC, TRACEPARENT_ONLY_HEAD

    # the usual envelope's head, but cut short inside the traceparent: not one of ours
    head_only = TRACED_ENVELOPE_MAGIC + bytes(16) + TRACEPARENT_ONLY_HEAD + b"00-abc"
    bodies = [b"\x00abc", b"\x00NID", b"\x00NID\x02 cut short", b"x", b"", head_only]
    rb = blocks_to_batch(blocks(bodies), "t", "c")
    assert rb.column("body").to_pylist() == bodies
    assert rb.column("trace_parent").null_count == len(bodies)
    # with only usual heads among the traced rows (the column-wide path), alone or beside
    # a real envelope
    for chunk, parents in (([head_only], [None]),
                           ([head_only, wrap_envelope(b"p", PARENT)], [None, PARENT])):
        rb = blocks_to_batch(blocks(chunk), "t", "c")
        assert rb.column("body").to_pylist() == [head_only, b"p"][:len(chunk)]
        assert rb.column("trace_parent").to_pylist() == parents


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from nsq_spark.spool._format import TRACED_ENVELOPE_MAGIC, open_traced_envelope  # noqa: E402


def test_a_cut_traced_envelope_with_a_whole_head_stays_whole_in_the_column_path():
    whole = wrap_envelope(b"payload", PARENT)
    cut = whole[:-3]   # the usual head and traceparent, a cut inner body: digest fails
    rb = blocks_to_batch(blocks([cut, whole]), "t", "c")
    assert rb.column("body").to_pylist() == [cut, b"payload"]
    assert rb.column("trace_parent").to_pylist() == [None, PARENT]

_body = st.one_of(st.binary(max_size=40),
                  st.binary(max_size=40).map(lambda b: wrap_envelope(b"p" + b, PARENT)),
                  # envelopes cut short anywhere: the column path must leave them as the
                  # one rule (open_traced_envelope) does
                  st.tuples(st.binary(max_size=8), st.integers(0, 120)).map(
                      lambda t: wrap_envelope(b"p" + t[0], PARENT)[:t[1]]),
                  st.binary(max_size=40).map(lambda b: b"\x00" + b),
                  st.binary(max_size=40).map(lambda b: TRACED_ENVELOPE_MAGIC + b))


@settings(max_examples=200, deadline=None)
@given(st.lists(_body, max_size=30))
def test_any_mix_of_bodies_comes_out_opened_the_same_from_blocks_and_messages(bodies):
    bs = blocks(bodies)
    from_blocks = blocks_to_batch(bs, "t", "c")
    from_messages = messages_to_batch([m for b in bs for m in b.messages()], "t", "c")
    assert from_blocks.equals(from_messages)
    opened = [open_traced_envelope(b) for b in bodies]
    # a version-2 body: the one rule's body (cut short: unchanged; without a traceparent:
    # opened all the same); anything else, version-1 envelopes too, stays as it is
    assert from_blocks.column("body").to_pylist() == [
        o.body if b.startswith(TRACED_ENVELOPE_MAGIC) else b for o, b in zip(opened, bodies)]
    assert from_blocks.column("trace_parent").to_pylist() == [o.traceparent for o in opened]
