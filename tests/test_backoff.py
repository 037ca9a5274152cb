"""Backoff policy: exponential windows with a cap, one result per window, testing the
waters, recovery, and the off switch."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import random

from nsq_spark.config import BACKOFF_STRATEGIES, check_reader_options
from nsq_spark.errors import ConfigError
from nsq_spark._consumer.backoff import Action, Backoff, Decision, exponential, full_jitter

pytestmark = pytest.mark.unit


def test_exponential():
    assert exponential(0, 1, 100) == 0
    assert [exponential(k, 1, 100) for k in range(1, 9)] == [1, 2, 4, 8, 16, 32, 64, 100]
    assert exponential(3, 0.5, 100) == 2
    assert exponential(10**6, 1, 7) == 7  # no overflow


@pytest.mark.parametrize("kwargs,match", [
    ({"max_backoff_duration": -1}, "max_backoff_duration"),
    ({"multiplier": 0}, "multiplier"),
])
def test_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Backoff(**kwargs)


def test_success_at_level_zero_changes_nothing():
    b = Backoff()
    assert b.record(True) == Decision(Action.NONE)
    assert not b.active


def test_failure_opens_a_window_and_results_inside_are_ignored():
    b = Backoff(max_backoff_duration=128)
    d = b.record(False)
    assert d == Decision(Action.BACKOFF, 1.0, 1)
    assert b.active and b.in_window
    # a burst of failures (messages already in flight) counts once
    for _ in range(100):
        assert b.record(False).action is Action.NONE
        assert b.record(True).action is Action.NONE
    assert b.level == 1
    assert b.window_ended() is True  # test the waters
    assert not b.in_window


def test_levels_grow_then_cap_and_recover_one_success_per_window():
    b = Backoff(max_backoff_duration=10, multiplier=1)
    durations = []
    for _ in range(8):
        d = b.record(False)
        assert d.action is Action.BACKOFF
        durations.append(d.duration)
        assert b.window_ended()
    assert durations == [1, 2, 4, 8, 10, 10, 10, 10]
    assert b.level == b.max_level == 5
    # recovery: each success shrinks the window; the last one exits backoff
    d = b.record(True)
    assert d == Decision(Action.BACKOFF, 8.0, 4)
    assert b.record(True).action is Action.NONE  # inside the window: ignored
    b.window_ended()
    assert b.record(True) == Decision(Action.BACKOFF, 4.0, 3)
    b.window_ended()
    assert b.record(True) == Decision(Action.BACKOFF, 2.0, 2)
    b.window_ended()
    assert b.record(True) == Decision(Action.BACKOFF, 1.0, 1)
    b.window_ended()
    assert b.record(True) == Decision(Action.EXIT)
    assert not b.active
    assert b.window_ended() is False  # a stale timer after exit: nothing to test


def test_cap_below_multiplier_still_backs_off():
    b = Backoff(max_backoff_duration=0.5, multiplier=1)
    assert b.record(False) == Decision(Action.BACKOFF, 0.5, 1)
    b.window_ended()
    assert b.record(False) == Decision(Action.BACKOFF, 0.5, 1)
    b.window_ended()
    assert b.record(True) == Decision(Action.EXIT)


def test_zero_turns_backoff_off():
    b = Backoff(max_backoff_duration=0)
    assert not b.enabled
    for _ in range(5):
        assert b.record(False).action is Action.NONE
    assert not b.active


def test_reset_and_state():
    b = Backoff(max_backoff_duration=5, multiplier=0.1)
    b.record(False)
    assert b.state() == {"level": 1, "in_window": True, "duration": 0.1, "enabled": True,
                         "strategy": "exponential"}
    b.reset()
    assert b.state() == {"level": 0, "in_window": False, "duration": 0.0, "enabled": True,
                         "strategy": "exponential"}


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["ok", "fail", "end"]), max_size=60),
       st.floats(0.01, 300), st.floats(0.001, 10))
def test_invariants(events, cap, mult):
    b = Backoff(max_backoff_duration=cap, multiplier=mult)
    for e in events:
        before = (b.level, b.in_window)
        if e == "end":
            assert b.window_ended() == (b.level > 0)
            continue
        d = b.record(e == "ok")
        if before[1]:
            assert d.action is Action.NONE and (b.level, b.in_window) == before
        if d.action is Action.BACKOFF:
            assert 0 < d.duration <= cap
            assert b.in_window and b.level >= 1
        if d.action is Action.EXIT:
            assert b.level == 0 and before[0] == 1
        assert 0 <= b.level <= b.max_level
        assert abs(b.level - before[0]) <= 1  # one result per call moves one level at most


def test_the_old_import_path_still_gives_the_same_objects():
    """nsq_spark.backoff is a re-export shim for users (the policy moved into consumer/)."""
    import nsq_spark.backoff as old
    import nsq_spark._consumer.backoff as new

    for name in ("Backoff", "Decision", "Action", "exponential"):
        assert getattr(old, name) is getattr(new, name), name


# -- backoff_strategy: go-nsq's exponential and full-jitter strategies --------------------

def test_the_strategy_names_the_reader_accepts_are_the_ones_computed():
    for name in BACKOFF_STRATEGIES:
        assert Backoff(strategy=name).strategy == name
    with pytest.raises(ValueError, match="backoff_strategy"):
        Backoff(strategy="linear")


@given(level=st.integers(1, 40), mult=st.floats(0.001, 10), cap=st.floats(0.001, 3600),
       seed=st.integers(0, 2**32))
def test_full_jitter_is_between_zero_and_the_exponential_duration(level, mult, cap, seed):
    d = full_jitter(level, mult, cap, random.Random(seed))
    assert 0 <= d < exponential(level, mult, cap) or d == 0


def test_full_jitter_spreads_durations_over_the_whole_window():
    rng = random.Random(7)
    draws = [full_jitter(4, 1.0, 100, rng) for _ in range(2000)]  # window of 8 s
    assert min(draws) < 0.5 and max(draws) > 7.5  # not a fixed point, not a narrow band
    assert 3.6 < sum(draws) / len(draws) < 4.4  # uniform: the mean is half the window


def test_full_jitter_windows_are_random_but_the_levels_follow_the_exponential_rule():
    exp, jit = Backoff(10, 1), Backoff(10, 1, strategy="full_jitter", rng=random.Random(1))
    levels, durations = [], []
    for _ in range(8):
        d_exp, d_jit = exp.record(False), jit.record(False)
        assert d_jit.action is Action.BACKOFF
        assert d_jit.level == d_exp.level  # same level, same cap: same recovery
        assert 0 <= d_jit.duration <= d_exp.duration
        levels.append(d_jit.level)
        durations.append(d_jit.duration)
        exp.window_ended()
        jit.window_ended()
    assert levels == [1, 2, 3, 4, 5, 5, 5, 5]
    assert len(set(durations)) == len(durations)  # each window drawn anew
    assert jit.state()["strategy"] == "full_jitter"
    assert jit.state()["duration"] == 10  # the envelope, not a draw


def test_the_same_seed_gives_the_same_windows():
    def windows(seed: int) -> list[float]:
        b = Backoff(60, 1, strategy="full_jitter", rng=random.Random(seed))
        out = []
        for _ in range(5):
            out.append(b.record(False).duration)
            b.window_ended()
        return out
    assert windows(3) == windows(3) != windows(4)


def _reader_options(**changes):
    """The Reader's own defaults (read from its signature: an option added to the Reader
    needs no edit here), with ``changes``."""
    import inspect

    from nsq_spark._consumer.reader import Reader

    base = {name: p.default for name, p in inspect.signature(Reader).parameters.items()
            if p.default is not inspect.Parameter.empty}
    base.update(changes)
    return base


def test_the_reader_refuses_an_unknown_strategy_naming_the_choices():
    check_reader_options(_reader_options(backoff_strategy="full_jitter"))
    with pytest.raises(ConfigError, match=r"backoff_strategy='full-jitter': did you mean "
                                          r"'full_jitter'\? give one of 'exponential', "
                                          r"'full_jitter'"):
        check_reader_options(_reader_options(backoff_strategy="full-jitter"))
    with pytest.raises(ConfigError, match="backoff_strategy=None"):
        check_reader_options(_reader_options(backoff_strategy=None))


@pytest.mark.parametrize("name,bad,match", [
    ("low_rdy_timeout", 0, "low_rdy_timeout=0"),
    ("low_rdy_timeout", -1, "low_rdy_timeout"),
    ("low_rdy_timeout", "30", "low_rdy_timeout"),
    ("low_rdy_timeout", float("inf"), "low_rdy_timeout"),
    ("concurrency", 0, "concurrency=0"),
    ("concurrency", 2.0, "concurrency"),
    ("concurrency", True, "concurrency"),
    ("concurrency", 1025, "concurrency=1025"),
])
def test_the_reader_bounds_low_rdy_timeout_and_concurrency(name, bad, match):
    with pytest.raises(ConfigError, match=match):
        check_reader_options(_reader_options(**{name: bad}))
    check_reader_options(_reader_options(low_rdy_timeout=30, concurrency=1024))
