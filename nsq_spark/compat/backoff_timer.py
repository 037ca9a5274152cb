"""pynsq's ``BackoffTimer``: an interval between ``min_interval`` and ``max_interval`` that
each ``failure()`` raises and each ``success()`` lowers, in two parts: a short one (the
``ratio`` share of the range, filled in ``short_length`` steps) that reacts fast, and a
long one (the rest, in ``long_length`` steps) that remembers a long run of failures.

The arithmetic is decimal, so ``get_interval()`` gives the same numbers as pynsq's.

This is the one ``BackoffTimer`` of the library. The Reader does not use it: its backoff is
go-nsq's exponential policy, :class:`nsq_spark._consumer.backoff.Backoff`, run on the loop
by :class:`nsq_spark._consumer.backoff.BackoffWindows` (which was also called
``BackoffTimer`` once, although it shares nothing with this one but the name: it turns
policy decisions into RDY commands and a timer, where this class computes an interval).
pynsq's behaviour differs in kind (a linear two-speed interval, no windows, no RDY), so
the two are not one class with a switch; this one is here for programs that use pynsq's
timer directly.
"""

from __future__ import annotations

from decimal import Decimal

from ..errors import ConfigError

__all__ = ["BackoffTimer"]

_ZERO = Decimal(0)


def _decimal(value: object, param: str) -> Decimal:
    if isinstance(value, Decimal):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return Decimal(str(value))  # str: 0.1 is 0.1, not its binary approximation
    raise ConfigError(f"BackoffTimer {param} must be a number of seconds, not {value!r}")


class BackoffTimer:
    """Exponential-ish backoff interval with pynsq's interface: ``success()``,
    ``failure()``, ``get_interval()`` (seconds, float)."""

    def __init__(self, min_interval: float | Decimal, max_interval: float | Decimal,
                 ratio: float = .25, short_length: int = 10, long_length: int = 250) -> None:
        self.min_interval = _decimal(min_interval, "min_interval")
        self.max_interval = _decimal(max_interval, "max_interval")
        if self.max_interval < self.min_interval:
            raise ConfigError(f"BackoffTimer max_interval {max_interval} is below "
                              f"min_interval {min_interval}")
        share = _decimal(ratio, "ratio")
        span = self.max_interval - self.min_interval
        self.max_short_timer = span * share
        self.max_long_timer = span * (1 - share)
        self.short_unit = self.max_short_timer / _decimal(short_length, "short_length")
        self.long_unit = self.max_long_timer / _decimal(long_length, "long_length")
        self.short_interval = _ZERO
        self.long_interval = _ZERO
        self.update_interval()

    def success(self) -> None:
        """One success: both parts shrink by one step (never below zero)."""
        if self.interval == 0.0:
            return
        self.short_interval = max(self.short_interval - self.short_unit, _ZERO)
        self.long_interval = max(self.long_interval - self.long_unit, _ZERO)
        self.update_interval()

    def failure(self) -> None:
        """One failure: both parts grow by one step (up to their share of the range)."""
        self.short_interval = min(self.short_interval + self.short_unit, self.max_short_timer)
        self.long_interval = min(self.long_interval + self.long_unit, self.max_long_timer)
        self.update_interval()

    def update_interval(self) -> None:
        self.interval = float(self.min_interval + self.short_interval + self.long_interval)

    def get_interval(self) -> float:
        """The current interval in seconds."""
        return self.interval
