"""The one lifecycle value of a consumer: running -> closing -> closed.

The Reader creates it and hands it to its parts, which read it: the intake gate requeues
what arrives once closing, the pool stops connecting, the backoff windows stop, the pull
queue hands nothing more out. Only the Reader moves it, and only forwards (a closed
consumer never runs again), so there is one answer to "is it closing?" instead of one flag
per part set together.
"""

from __future__ import annotations

import enum

__all__ = ["Lifecycle", "Phase"]


class Phase(enum.Enum):
    RUNNING = "running"  # also before start: nothing is closing
    CLOSING = "closing"  # close() began: no more deliveries, no more connects
    CLOSED = "closed"    # every connection closed, everything answered


class Lifecycle:
    """A consumer's phase; the parts read :attr:`closing` (a plain attribute: the intake
    gate reads it once per read chunk)."""

    __slots__ = ("phase", "closing")

    def __init__(self) -> None:
        self.phase = Phase.RUNNING
        self.closing = False  # CLOSING or CLOSED

    @property
    def closed(self) -> bool:
        return self.phase is Phase.CLOSED

    def begin_closing(self) -> None:
        """RUNNING -> CLOSING (a no-op once closing or closed)."""
        if self.phase is Phase.RUNNING:
            self.phase = Phase.CLOSING
            self.closing = True

    def finish_closing(self) -> None:
        """-> CLOSED, from any phase (a Reader closed before it started skips CLOSING)."""
        self.phase = Phase.CLOSED
        self.closing = True

    def __repr__(self) -> str:
        return f"<Lifecycle {self.phase.value}>"
