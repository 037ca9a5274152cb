"""Which nsqd a publish tries, and in which order: the strategy and each nsqd's health.

Both connection pools (the pipelined one on the event loop, :mod:`.tcp`, and the blocking
one in the callers' threads, :mod:`.sync`) ask this one object, so they agree on the rule:

* **order**: ``"failover"`` tries the nsqd in the configured order; ``"round_robin"``
  starts each call one nsqd further along (and picks among the connected ones in turn).
* **backing off**: an nsqd whose connect failed is skipped for an exponential backoff
  (``retry_wait * 2**n``, capped at ``retry_max_wait``, ``n`` the failures in a row); one
  whose open connection broke is skipped for ``retry_wait``. A success ends it. When every
  nsqd is backing off, all are tried all the same (a caller is waiting).
* **up and down**: each transition is recorded in :class:`~.stats.PublishStats`, which
  logs it once (WARNING down, INFO up again).

Thread-safe enough for its use: the blocking path calls it from many threads; a race
between two updates of one nsqd's backoff only changes when it is tried next.
"""

from __future__ import annotations

import itertools
import time
from typing import Callable, Sequence, TypeVar

from .stats import PublishStats

__all__ = ["NsqdHealth"]

T = TypeVar("T")


class NsqdHealth:
    """The strategy order over ``order`` and the backoff of each nsqd in it.

    Args:
        order: the nsqd addresses (``"host:port"``) in the configured order.
        strategy: ``"round_robin"`` or ``"failover"``.
        retry_wait: seconds a broken nsqd is skipped (the base of the connect backoff).
        retry_max_wait: cap of the connect backoff, seconds.
        stats: where up/down transitions are recorded (and logged).
        clock: monotonic seconds (the event loop's clock is ``time.monotonic`` too).
    """

    def __init__(self, order: Sequence[str], strategy: str, *, retry_wait: float,
                 retry_max_wait: float, stats: PublishStats,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.addresses = list(order)
        self.strategy = strategy
        self.retry_wait = retry_wait
        self.retry_max_wait = retry_max_wait
        self.stats = stats
        self.clock = clock
        self._down_until: dict[str, float] = {}
        self._failures: dict[str, int] = {}
        self._rr = itertools.count()

    # -- order -------------------------------------------------------------------------

    def order(self) -> list[str]:
        """The nsqd to try for one call, first choice first."""
        addrs = self.addresses
        if self.strategy == "failover" or len(addrs) == 1:
            return addrs
        k = next(self._rr) % len(addrs)
        return addrs[k:] + addrs[:k]

    def choose(self, live: Sequence[T]) -> T:
        """One of ``live`` (connections, in the configured order, at least one): the
        first for failover, the next in turn for round robin."""
        if self.strategy == "failover" or len(live) == 1:
            return live[0]
        return live[next(self._rr) % len(live)]

    def candidates(self, order: Sequence[str] | None = None) -> list[str]:
        """``order`` (default: the configured one) without the nsqd backing off; all of
        them when every one is."""
        keys = self.addresses if order is None else order
        now = self.clock()
        down = self._down_until
        return [a for a in keys if down.get(a, 0.0) <= now] or list(keys)

    def backing_off(self, address: str) -> bool:
        return self._down_until.get(address, 0.0) > self.clock()

    # -- transitions -----------------------------------------------------------------

    def connect_failed(self, address: str, exc: BaseException, report: bool = True) -> None:
        """A connect to ``address`` failed: back off exponentially. ``report=False``
        while closing (a refused connect then says nothing about nsqd)."""
        n = self._failures.get(address, 0) + 1
        self._failures[address] = n
        self._down_until[address] = self.clock() + min(self.retry_max_wait,
                                                       self.retry_wait * 2 ** n)
        if report:
            self.stats.down(address, exc)

    def connection_lost(self, address: str, exc: BaseException) -> None:
        """An open connection to ``address`` broke: skip it for ``retry_wait``."""
        self._down_until[address] = self.clock() + self.retry_wait
        self.stats.down(address, exc)

    def connected(self, address: str) -> None:
        """``address`` answered: no backoff, and up again if it was down."""
        self._failures.pop(address, None)
        self._down_until.pop(address, None)
        self.stats.up(address)

    def forget(self) -> None:
        """Start over (the pool's event loop is gone)."""
        self._down_until.clear()
        self._failures.clear()
