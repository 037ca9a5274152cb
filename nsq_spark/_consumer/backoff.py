"""Backoff policy: pure logic, no clock, no loop.

When message handling fails (a requeue with ``backoff=True``), a consumer slows down for
everyone's sake: RDY 0 on every connection for a window whose length grows exponentially
with the backoff level, then RDY 1 on one connection to "test the waters". A success
lowers the level, a failure raises it; at level 0 the consumer returns to full speed.

Only one result counts per window: results that arrive while a window is open (messages
that were already in flight when it opened) are ignored, so a burst of failures raises the
level by one, not by the burst's size (go-nsq's rule, and the guide's).

Durations follow the shape of go-nsq's two strategies (``backoff_strategy``, the names
in :data:`nsq_spark.config.BACKOFF_STRATEGIES`): ``"exponential"``, ``multiplier * 2 **
(level - 1)`` seconds capped at ``max_backoff_duration`` (the default), or
``"full_jitter"``, a uniformly random duration in ``[0, that)`` drawn from the injected
random source. The level stops growing once the exponential duration reaches the cap,
whichever the strategy, so recovering from the worst case takes a bounded number of
successes. Setting ``max_backoff_duration`` to 0 turns backoff off.

Deliberate differences (the formula is ours; the numbers below are checked against the
sources):

* go-nsq's ``ExponentialStrategy.Calculate(attempt)`` is ``BackoffMultiplier *
  2^attempt`` and its first window is attempt 1: ``2 * BackoffMultiplier`` (2 s by
  default). Ours is ``multiplier * 2 ** (level - 1)``: the first window is
  ``backoff_multiplier`` itself (1 s by default), every window half of go-nsq's at the
  same level, so that the option reads as "the first window". ``backoff_multiplier=2``
  gives go-nsq's windows.
* go-nsq's ``FullJitterStrategy`` draws ``rand.Intn(BackoffMultiplier * 2^attempt)``,
  below the uncapped power of two, and caps after; we draw below the capped one (a
  uniform draw up to the cap, AWS's definition of full jitter), and below half of
  go-nsq's bound at the same level, as above.
* pynsq follows neither: its ``BackoffTimer`` is a two-speed linear timer (with
  ``max_backoff_duration=128``, the first window is 3.584 s, then 7.168 s, ...); its
  first window is not what ours follows either.

The Reader feeds it at most one result per batch of responses (:meth:`Backoff.record`)
and acts on the returned :class:`Decision`.

:class:`BackoffWindows` is the policy's glue to the loop: it takes the one result per loop
turn the answers ledger gives, asks the policy, and turns its decision into RDY commands
(through ``apply``) and a window timer: RDY 0 everywhere for the window, then RDY 1 on one
connection to test the waters, or everyone back to their share. Nothing happens once the
consumer's :class:`~nsq_spark._consumer.lifecycle.Lifecycle` is closing. (It was called
``BackoffTimer``, a name it shared with pynsq's interval arithmetic,
:class:`nsq_spark.compat.backoff_timer.BackoffTimer`, which is a different thing: the one
``BackoffTimer`` is pynsq's.)
"""

from __future__ import annotations

import enum
import random
from typing import TYPE_CHECKING, Any, Callable, Iterable
from .._log import get_logger

from ..config import BACKOFF_STRATEGIES

if TYPE_CHECKING:
    import asyncio

    from .._loop import LoopBridge
    from .lifecycle import Lifecycle
    from .rdy import ConnRdy, RdyPolicy

# a child of the Reader's historical logger: its level and handlers still apply
log = get_logger("nsq_spark.reader.backoff_timer")

__all__ = ["Backoff", "BackoffWindows", "Decision", "Action", "exponential", "full_jitter"]


class Action(enum.Enum):
    NONE = "none"  # nothing changes
    BACKOFF = "backoff"  # open a window: RDY 0 everywhere for `duration` seconds
    EXIT = "exit"  # back to normal: every connection to its share of max_in_flight


class Decision:
    __slots__ = ("action", "duration", "level")

    def __init__(self, action: Action, duration: float = 0.0, level: int = 0) -> None:
        self.action = action
        self.duration = duration
        self.level = level

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Decision) and other.action is self.action
                and other.duration == self.duration and other.level == self.level)

    def __repr__(self) -> str:
        return f"Decision({self.action.name}, duration={self.duration}, level={self.level})"


NOTHING = Decision(Action.NONE)


def exponential(level: int, multiplier: float, cap: float) -> float:
    """Seconds of backoff at ``level`` (>= 1): ``multiplier * 2**(level-1)``, at most ``cap``
    (go-nsq's is ``multiplier * 2**level``: see the module doc)."""
    if level <= 0:
        return 0.0
    # min() before the power would overflow for absurd levels; the level is bounded anyway
    return min(cap, multiplier * (2.0 ** min(level - 1, 1000)))


def full_jitter(level: int, multiplier: float, cap: float, rng: random.Random) -> float:
    """Seconds of backoff at ``level`` by full jitter: uniform in ``[0, exponential)``."""
    return rng.random() * exponential(level, multiplier, cap)


def _exponential(level: int, multiplier: float, cap: float, rng: random.Random) -> float:
    return exponential(level, multiplier, cap)


# the strategy's name (the Reader's backoff_strategy=) -> seconds at a level
_DURATIONS: dict[str, Callable[[int, float, float, random.Random], float]] = {
    "exponential": _exponential, "full_jitter": full_jitter}
assert set(_DURATIONS) == set(BACKOFF_STRATEGIES), "config names a strategy nobody computes"


class Backoff:
    """Backoff state of one Reader.

    Args:
        max_backoff_duration: the longest window in seconds; 0 turns backoff off.
        multiplier: the first window's length in seconds (go-nsq's ``BackoffMultiplier``).
        strategy: ``"exponential"`` or ``"full_jitter"`` (see the module doc).
        rng: the random source of ``"full_jitter"`` (injected for tests).
    """

    def __init__(self, max_backoff_duration: float = 128.0, multiplier: float = 1.0,
                 strategy: str = "exponential", rng: random.Random | None = None) -> None:
        if max_backoff_duration < 0:
            raise ValueError("max_backoff_duration must be >= 0 seconds (0 turns backoff off), "
                             f"got {max_backoff_duration}")
        if multiplier <= 0:
            raise ValueError(f"backoff multiplier must be > 0 seconds, got {multiplier}")
        if strategy not in _DURATIONS:
            raise ValueError(f"backoff_strategy must be one of {sorted(_DURATIONS)}, "
                             f"got {strategy!r}")
        self.max_backoff_duration = float(max_backoff_duration)
        self.multiplier = float(multiplier)
        self.strategy = strategy
        self._duration = _DURATIONS[strategy]
        self.rng = rng or random.Random()
        self.level = 0
        self.in_window = False  # a window is open: results are ignored until window_ended()
        # highest level worth reaching: the first whose duration hits the cap
        self.max_level = 1
        while exponential(self.max_level, self.multiplier, float("inf")) < self.max_backoff_duration:
            self.max_level += 1

    @property
    def enabled(self) -> bool:
        return self.max_backoff_duration > 0

    @property
    def active(self) -> bool:
        """In backoff (inside a window or testing the waters between windows)."""
        return self.level > 0 or self.in_window

    def duration(self, level: int | None = None) -> float:
        """Seconds of the window at ``level`` (default: the current one), by the strategy
        (``"full_jitter"``: a new draw at every call)."""
        return self._duration(self.level if level is None else level, self.multiplier,
                              self.max_backoff_duration, self.rng)

    def record(self, success: bool) -> Decision:
        """One result: ``True`` for a success (FIN), ``False`` for a failure (REQ with backoff).

        A requeue with ``backoff=False`` is no result at all: don't call this for it.
        """
        if not self.enabled or self.in_window:
            return NOTHING
        if success:
            if self.level == 0:
                return NOTHING
            self.level -= 1
            if self.level == 0:
                return Decision(Action.EXIT)
        elif self.level < self.max_level:
            self.level += 1
        self.in_window = True
        return Decision(Action.BACKOFF, self.duration(), self.level)

    def window_ended(self) -> bool:
        """The window's timer fired. Returns True when a connection should test the waters
        (RDY 1); False when backoff ended meanwhile (reset) or was never on."""
        self.in_window = False
        return self.level > 0

    def reset(self) -> None:
        """Forget all backoff (e.g. on close)."""
        self.level = 0
        self.in_window = False

    def state(self) -> dict[str, object]:
        # the window's envelope: with full jitter, the longest the window can be
        return {"level": self.level, "in_window": self.in_window,
                "duration": exponential(self.level, self.multiplier,
                                        self.max_backoff_duration) if self.level else 0.0,
                "enabled": self.enabled, "strategy": self.strategy}


class BackoffWindows:
    """Runs the :class:`Backoff` policy's windows on the loop (see the module doc)."""

    def __init__(self, backoff: Backoff, policy: "RdyPolicy[Any]",
                 apply: Callable[[Iterable[tuple["ConnRdy[Any]", int]] | None], None],
                 bridge: "LoopBridge", lifecycle: "Lifecycle", name: str) -> None:
        self.backoff = backoff
        self.policy = policy
        self.apply = apply
        self.bridge = bridge
        self.lifecycle = lifecycle
        self.name = name
        self._log = log.bind(reader=name)
        self._timer: asyncio.TimerHandle | None = None

    def record(self, success: bool) -> None:
        if not self.backoff.enabled:
            return
        decision = self.backoff.record(success)
        if decision.action is Action.NONE or self.lifecycle.closing:
            return
        if decision.action is Action.EXIT:
            self._log.info("[%s] backoff complete, resuming normal operation (%d connections)",
                           self.name, len(self.policy.conns))
            self.apply(self.policy.exit_backoff())
            return
        self._log.warning("[%s] backing off for %.2fs (level %d, %d connections)", self.name,
                          decision.duration, decision.level, len(self.policy.conns))
        self.apply(self.policy.enter_backoff())
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.bridge.call_later(decision.duration, self._window_end)

    def _window_end(self) -> None:
        self._timer = None
        if self.lifecycle.closing:
            return
        if self.backoff.window_ended():
            self._log.info("[%s] backoff window over, testing the waters with RDY 1", self.name)
            self.apply(self.policy.test_waters())
        else:
            self.apply(self.policy.exit_backoff())

    def stop(self) -> None:
        """Closing: cancel the window's timer (the lifecycle keeps new ones from starting)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def state(self) -> dict[str, Any]:
        return self.backoff.state()
