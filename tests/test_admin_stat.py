"""nsq-spark stat's view (nsq_spark.admin.stat) without IO: rows summed over nsqds, rates
from one interval to the next, never negative, and its text and JSON forms; and the
command's rounds with lookupd, nsqd and the clocks faked."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsq_spark import cli
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


class _Clock:
    """cli's ``time`` for a stat run without waiting: ``time()`` steps back an hour (an
    NTP step) after the first view, ``monotonic()`` advances 2 s a view."""

    def __init__(self):
        self.views = 0

    def time(self):
        return 1_700_000_000.0 - (3600.0 if self.views > 0 else 0.0)

    def monotonic(self):
        return 100.0 + 2.0 * self.views

    def sleep(self, seconds):
        self.views += 1

    def strftime(self, *a):
        return time.strftime(*a)

    def gmtime(self, *a):
        return time.gmtime(*a)


def _fake_stat_run(monkeypatch, listed):
    """``nsq-spark stat --lookupd-http-address`` with lookupd and nsqd faked: lookupd lists
    ``listed[i]`` nsqds in view i; nsqd's message count grows 10 a view."""
    from nsq_spark.admin import LookupdClient, NsqdClient
    from nsq_spark.admin.model import (ChannelStats, Lookup, LookupdProducer, NsqdStats,
                                       TopicStats)

    clock = _Clock()
    monkeypatch.setattr(cli.stat, "time", clock)
    monkeypatch.setattr(LookupdClient, "lookup", lambda self, topic: Lookup(producers=tuple(
        LookupdProducer("127.0.0.1", 4150, 4151) for _ in range(listed[clock.views]))))
    monkeypatch.setattr(NsqdClient, "stats", lambda self, *a, **k: NsqdStats(
        "1.3.0", "OK", 0, (TopicStats("t", 0, 0, 0, 0, False, (ChannelStats(
            "c", 0, 0, 0, 0, 10 * clock.views, 0, 0, 1, False),)),)))
    out, err = io.BytesIO(), io.StringIO()
    rc = cli.main(["stat", "--lookupd-http-address", "127.0.0.1:4161", "--topic", "t",
                   "--json", "--count", str(len(listed))], stdout=out, stderr=err)
    return rc, out.getvalue().decode(), err.getvalue()


def test_stat_rates_use_the_monotonic_clock_not_a_stepped_wall_clock(monkeypatch):
    rc, out, err = _fake_stat_run(monkeypatch, [1, 1])
    assert (rc, err) == (0, "")
    first, second = (json.loads(line) for line in out.splitlines())
    # time.time() went back an hour: the view's time says so, the rate does not care
    assert (first["time"], second["time"]) == ("2023-11-14T22:13:20Z", "2023-11-14T21:13:20Z")
    assert second["interval_seconds"] == 2.0
    assert second["channels"][0]["message_rate"] == 5.0


def test_stat_goes_on_when_lookupd_lists_no_nsqd_mid_run(monkeypatch):
    # the one nsqd restarted and lookupd dropped it for a view: said, not an exit 1
    rc, out, err = _fake_stat_run(monkeypatch, [1, 0, 1])
    assert (rc, err) == (0, "")
    views = [json.loads(line) for line in out.splitlines()]
    assert [len(v["channels"]) for v in views] == [1, 0, 1]
    assert [len(v["notes"]) for v in views] == [0, 1, 0]
    assert "lists no nsqd for topic 't' for now" in views[1]["notes"][0]


def test_stat_fails_its_first_view_when_lookupd_lists_no_nsqd(monkeypatch):
    rc, out, err = _fake_stat_run(monkeypatch, [0, 1])
    assert rc == cli.EXIT_ERROR and out == ""
    assert "lists no nsqd for topic 't' (is the name right?" in err


def test_stat_table_says_lookupd_lists_no_nsqd_for_now():
    from nsq_spark.admin.stat import StatView, format_text

    text = format_text(StatView("t").update(0.0, {}, notes=("lists no nsqd for now",)))
    assert "lists no nsqd for now" in text and "nothing to show" not in text


def test_the_interval_is_measured_on_the_monotonic_clock_given():
    view = StatView("t", "c")
    view.update(1000.0, {"a:1": nsqd(10)}, monotonic=50.0)
    # the wall clock stepped back an hour; 4 s passed on the monotonic one
    second = view.update(1000.0 - 3600, {"a:1": nsqd(30)}, monotonic=54.0)
    assert (second.at, second.seconds, second.rows[0].message_rate) == (-2600.0, 4.0, 5.0)
