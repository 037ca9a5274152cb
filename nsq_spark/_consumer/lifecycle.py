"""The one lifecycle value of a consumer: running -> closing -> closed.

The Reader creates it and hands it to its parts, which read it: the intake gate requeues
what arrives once closing, the pool stops connecting, the backoff windows stop, the pull
queue hands nothing more out. Only the Reader moves it, and only forwards (a closed
consumer never runs again), so there is one answer to "is it closing?" instead of one flag
per part set together.
"""

from __future__ import annotations

import enum
from typing import Callable

__all__ = ["Lifecycle", "Phase"]


class Phase(enum.Enum):
    RUNNING = "running"  # also before start: nothing is closing
    CLOSING = "closing"  # close() began: no more deliveries, no more connects
    CLOSED = "closed"    # every connection closed, everything answered


class Lifecycle:
    """A consumer's phase; the parts read :attr:`closing`.

    ``wake`` is called after every :meth:`begin_closing` and :meth:`finish_closing` (the
    Reader hands in its pull queue's wake-up, so getters blocked on the phase see it); a
    call that moved nothing wakes too, which is harmless."""

    __slots__ = ("phase", "_wake")

    def __init__(self, wake: Callable[[], None] | None = None) -> None:
        self.phase = Phase.RUNNING
        self._wake = wake

    @property
    def closing(self) -> bool:
        """CLOSING or CLOSED."""
        return self.phase is not Phase.RUNNING

    @property
    def closed(self) -> bool:
        return self.phase is Phase.CLOSED

    def begin_closing(self) -> None:
        """RUNNING -> CLOSING (a no-op once closing or closed), then wake."""
        if self.phase is Phase.RUNNING:
            self.phase = Phase.CLOSING
        if self._wake is not None:
            self._wake()

    def finish_closing(self) -> None:
        """-> CLOSED, from any phase (a Reader closed before it started skips CLOSING), then
        wake."""
        self.phase = Phase.CLOSED
        if self._wake is not None:
            self._wake()

    def __repr__(self) -> str:
        return f"<Lifecycle {self.phase.value}>"
