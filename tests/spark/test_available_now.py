"""Trigger.AvailableNow's plan (``nsq_spark.spark._available_now``): it never plans beyond
its target, never plans backwards, always ends; then the stream reader driven through a
whole run with fakes of its port (no Spark session, no sockets)."""

from __future__ import annotations

import tempfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsq_spark.spark._available_now import DONE, AvailableNow, Next

from topic_fakes import fake_reader  # tests/spark: typed, checked by mypy

pytestmark = pytest.mark.unit


def test_the_target_caps_each_batch_by_what_is_left():
    run = AvailableNow.start(1000)
    assert run.next(measured=True) == Next(False, 1000)
    run = run.plans(1).ran(1, 600)
    assert run.next(measured=True) == Next(False, 400) and run.left == 400
    run = run.plans(2).ran(2, 400)
    assert run.next(measured=True) == DONE and run.left == 0


def test_a_batch_counts_once_and_only_when_planned_in_this_run():
    run = AvailableNow.start(100)
    # batch 1 comes from the checkpoint (a failed batch run again): fetched before the
    # target was measured, so its rows are not part of it
    assert not run.counts(1) and run.ran(1, 50) == run
    run = run.plans(2)
    assert run.counts(2)
    once = run.ran(2, 30)
    assert not once.counts(2) and once.ran(2, 30) == once and once.fetched == 30


def test_two_empty_batches_in_a_row_end_a_run_with_a_target():
    run = AvailableNow.start(100).plans(1).ran(1, 0)
    assert run.next(True) == Next(False, 100)  # one may be bad luck (in flight elsewhere)
    assert run.plans(2).ran(2, 5).plans(3).ran(3, 0).next(True) == Next(False, 95)
    assert run.plans(2).ran(2, 0).next(True) == DONE


def test_without_a_measurement_one_empty_batch_ends_the_run_and_nothing_caps_it():
    run = AvailableNow.start(None)
    assert run.next(False) == Next(False) and run.next(True) == Next(False)
    run = run.plans(1).ran(1, 10_000)
    assert run.next(False) == Next(False)
    assert run.plans(2).ran(2, 0).next(False) == DONE
    # a target, but nsqd not answering at this trigger: uncapped until a batch is empty
    assert AvailableNow.start(5).plans(1).ran(1, 1).next(False) == Next(False)


def test_an_empty_backlog_at_start_plans_nothing():
    assert AvailableNow.start(0).next(True) == DONE
    assert AvailableNow.start(-3).target == 0


# -- properties: the run driven as the driver drives it --------------------------------

@settings(max_examples=300)
@given(target=st.integers(0, 2_000), extra=st.integers(0, 2_000),
       max_rows=st.none() | st.integers(1, 500),
       taken=st.lists(st.floats(0, 1), min_size=1, max_size=50),
       measured=st.lists(st.booleans(), min_size=1, max_size=50))
def test_the_plan_never_passes_its_target_never_goes_back_and_ends(target, extra, max_rows,
                                                                   taken, measured):
    """``target`` waits at the start, ``extra`` is published during the run; each batch
    takes a drawn fraction of what it planned (the rest in flight elsewhere); nsqd answers
    or not at each trigger (a measured trigger always follows the last drawn one)."""
    run = AvailableNow.start(target)
    waiting = target + extra  # on nsqd
    batch, fetched, left_before = 0, 0, run.left
    # any first triggers, then measured ones: two empty in a row end it, else one more taken
    limit = len(measured) + 2 * target + 3
    for i in range(limit + 1):
        assert i < limit, "the run did not end"
        answered = measured[i] if i < len(measured) else True
        step = run.next(answered)
        if step.done:
            break
        assert step.cap is None or step.cap >= 1
        if answered:
            # never beyond the target: what it may plan plus what was taken
            assert step.cap is not None and fetched + step.cap <= target
            size = min(waiting, step.cap, max_rows or step.cap)
        else:
            size = min(waiting, max_rows) if max_rows else waiting
        if size == 0:
            break  # the driver plans no batch: Spark ends the run
        batch += 1
        run = run.plans(batch)
        rows = int(size * taken[i % len(taken)])
        run = run.ran(batch, rows)
        waiting -= rows
        fetched += rows
        assert run.fetched == fetched  # never counted backwards, nor twice
        assert run.left is not None and left_before is not None
        assert run.left <= left_before  # what is left never grows
        left_before = run.left
    if all(measured):
        assert fetched <= target


# -- the stream reader following the plan, with fakes of its port -------------------------

# a few dozen batches per run at most: each costs a spool on disk
@settings(max_examples=20, deadline=None)
@given(depth=st.integers(0, 600), max_rows=st.integers(100, 1_000),
       taken=st.lists(st.sampled_from([0.0, 0.25, 0.5, 1.0]), min_size=1, max_size=8),
       replay=st.booleans())
def test_the_stream_reader_runs_available_now_to_its_end(depth, max_rows, taken, replay):
    """Spark's calls of an AvailableNow run (latestOffset, partitions, the tasks, commit,
    in its order): batch numbers go up by one, no batch plans beyond what is left of the
    target, the run ends by handing back its start; a batch replayed from the checkpoint
    is read but not counted."""
    from pyspark.sql.streaming.datasource import ReadMaxRows

    with tempfile.TemporaryDirectory() as tmp:
        first, _ = fake_reader(tmp, {"t": depth + 50}, maxMessagesPerTrigger=str(max_rows))
        start = first.initialOffset()
        end = first.latestOffset(start, ReadMaxRows(max_rows))
        r, fakes = fake_reader(tmp, {"t": depth}, maxMessagesPerTrigger=str(max_rows))
        fake = fakes["t"]
        if replay:  # the first run's batch 1, logged and not committed, runs again
            r.prepareForTriggerAvailableNow()
            for p in r.partitions(start, end):
                r._spool(p.query).partition(p.batch, p.index).complete(1, 1)
        else:
            end = start
            r.prepareForTriggerAvailableNow()
        fetched = 0
        for i in range(2 * depth + 4):
            nxt = r.latestOffset(end, ReadMaxRows(max_rows))
            if nxt == end:
                break
            assert nxt["batch"] == end["batch"] + 1 and nxt["query"] == end["query"]
            assert fetched + nxt["size"] <= depth and nxt["size"] <= max_rows
            r.commit(end)
            parts = r.partitions(end, nxt)
            rows = int(nxt["size"] * taken[i % len(taken)])
            for k, p in enumerate(parts):  # the rows over the tasks
                share = rows // len(parts) + (1 if k < rows % len(parts) else 0)
                r._spool(p.query).partition(p.batch, p.index).complete(1, share)
            fake.depth -= rows
            fetched += rows
            end = nxt
        else:
            pytest.fail("the run did not end")
        assert r._available_now is not None and r._available_now.fetched == fetched
        assert fetched <= depth
