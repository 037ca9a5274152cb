"""nsq-spark stat's view (nsq_spark.admin.stat) without IO: rows summed over nsqds, rates
from one interval to the next, never negative, and its text and JSON forms."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsq_spark.admin.calls import parse_nsqd_stats
from nsq_spark.admin.model import ChannelStats, NsqdStats, TopicStats
from nsq_spark.admin.stat import StatView, format_text

pytestmark = pytest.mark.unit

RECORDED = parse_nsqd_stats((Path(__file__).parent / "data" / "admin" /
                             "nsqd_stats.json").read_bytes())


def nsqd(messages: int, depth: int = 0, requeued: int = 0, paused: bool = False,
         topic: str = "t", channel: str = "c", start_time: int = 0) -> NsqdStats:
    return NsqdStats("1.3.0", "OK", start_time, (TopicStats(topic, 0, 0, messages, 0, False, (
        ChannelStats(channel, depth, 0, 1, 0, messages, requeued, 0, 1, paused),)),))


def test_rows_sum_the_nsqds_and_rates_come_from_the_second_interval():
    view = StatView("t", "c")
    first = view.update(100.0, {"a:1": nsqd(10, depth=3), "b:1": nsqd(5, depth=1)})
    (row,) = first.rows
    assert (row.messages, row.depth, row.in_flight, row.client_count, row.nsqds) == \
        (15, 4, 2, 2, ("a:1", "b:1"))
    assert row.message_rate is None and first.seconds is None
    second = view.update(102.0, {"a:1": nsqd(20, requeued=4), "b:1": nsqd(9)})
    (row,) = second.rows
    assert (second.seconds, row.message_rate, row.requeue_rate, row.timeout_rate) == \
        (2.0, 7.0, 2.0, 0.0)


def test_a_counter_that_went_down_or_an_nsqd_that_left_gives_no_rate():
    view = StatView()
    view.update(0.0, {"a:1": nsqd(100), "b:1": nsqd(5)})
    (row,) = view.update(1.0, {"a:1": nsqd(3), "b:1": nsqd(6)}).rows  # a restarted
    assert row.message_rate is None
    (row,) = view.update(2.0, {"a:1": nsqd(4)}, {"b:1": "refused"}).rows  # b left
    assert row.message_rate is None and row.nsqds == ("a:1",)
    assert view.update(3.0, {"a:1": nsqd(6)}).rows[0].message_rate == 2.0


def test_one_nsqd_restarting_while_another_grows_gives_no_rate():
    # the sum grows (100+5 -> 3+150), but a's counters began anew: no rate, not 48/s
    view = StatView()
    view.update(0.0, {"a:1": nsqd(100, start_time=1000), "b:1": nsqd(5, start_time=1000)})
    (row,) = view.update(1.0, {"a:1": nsqd(3, start_time=1500),
                               "b:1": nsqd(150, start_time=1000)}).rows
    assert row.message_rate is None and row.messages == 153
    # the next interval compares with a's new start: both nsqds' growth, summed
    (row,) = view.update(2.0, {"a:1": nsqd(13, start_time=1500),
                               "b:1": nsqd(160, start_time=1000)}).rows
    assert row.message_rate == 20.0


def test_a_restarted_nsqd_with_a_higher_count_than_before_gives_no_rate():
    view = StatView()
    view.update(0.0, {"a:1": nsqd(10, requeued=1, start_time=1000)})
    (row,) = view.update(1.0, {"a:1": nsqd(500, requeued=9, start_time=1001)}).rows
    assert (row.message_rate, row.requeue_rate, row.timeout_rate) == (None, None, None)
    (row,) = view.update(2.0, {"a:1": nsqd(510, requeued=9, start_time=1001)}).rows
    assert (row.message_rate, row.requeue_rate) == (10.0, 0.0)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 10**9), st.integers(0, 10**6),
                          st.floats(0.001, 100)), min_size=1, max_size=8))
def test_rates_are_never_negative(samples):
    view = StatView()
    at = 0.0
    for messages, requeued, step in samples:
        at += step
        for row in view.update(at, {"a:1": nsqd(messages, requeued=requeued)}).rows:
            for rate in (row.message_rate, row.requeue_rate, row.timeout_rate):
                assert rate is None or rate >= 0


def test_recorded_stats_show_every_channel_with_clients_and_the_pause():
    interval = StatView().update(0.0, {"n:4151": RECORDED})
    assert [(r.topic, r.channel, r.depth, r.in_flight, r.paused) for r in interval.rows] == \
        [("orders", "audit", 5, 0, True), ("orders", "billing", 12, 2, False)]
    text = format_text(interval, clients=True)
    assert "[channel paused]" in text.splitlines()[1]
    assert "rdy 1 inflight 2" in text
    doc = json.loads(interval.as_json())
    assert doc["channels"][1]["clients"][0]["nsqd"] == "n:4151"


def test_a_topic_without_channels_is_a_row_of_its_own():
    lone = NsqdStats("1.3.0", "OK", 0, (TopicStats("lone", 7, 0, 7, 0, True, ()),))
    (row,) = StatView().update(0.0, {"n:1": lone}).rows
    assert (row.topic, row.channel, row.depth, row.topic_paused) == ("lone", None, 7, True)
    assert "lone (no channel)" in format_text(StatView().update(0.0, {"n:1": lone}))


def test_nothing_to_show_and_unreachable_nsqds_are_said():
    text = format_text(StatView("x").update(0.0, {}, {"n:1": "refused"}), header=False)
    assert "nothing to show" in text and "nsqd n:1 did not answer: refused" in text
