"""The timer glue of the pure backoff policy (:mod:`nsq_spark.backoff`).

:meth:`BackoffTimer.record` takes the one result per loop turn the answers ledger gives,
asks the policy, and turns its decision into RDY commands (through ``apply``) and a window
timer on the loop: RDY 0 everywhere for the window, then RDY 1 on one connection to test
the waters, or everyone back to their share. Nothing happens once ``closing`` is set.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, Callable, Iterable

from ..backoff import Action, Backoff

if TYPE_CHECKING:
    from .._loop import LoopBridge
    from ..rdy import ConnRdy, RdyPolicy

# a child of the Reader's historical logger: its level and handlers still apply
log = logging.getLogger("nsq_spark.reader.backoff_timer")

__all__ = ["BackoffTimer"]


class BackoffTimer:
    def __init__(self, backoff: Backoff, policy: "RdyPolicy",
                 apply: Callable[[Iterable[tuple["ConnRdy", int]] | None], None],
                 bridge: "LoopBridge", name: str) -> None:
        self.backoff = backoff
        self.policy = policy
        self.apply = apply
        self.bridge = bridge
        self.name = name
        self.closing = False
        self._timer: asyncio.TimerHandle | None = None

    def record(self, success: bool) -> None:
        if not self.backoff.enabled:
            return
        decision = self.backoff.record(success)
        if decision.action is Action.NONE or self.closing:
            return
        if decision.action is Action.EXIT:
            log.info("[%s] backoff complete, resuming normal operation (%d connections)",
                     self.name, len(self.policy.conns))
            self.apply(self.policy.exit_backoff())
            return
        log.warning("[%s] backing off for %.2fs (level %d, %d connections)", self.name,
                    decision.duration, decision.level, len(self.policy.conns))
        self.apply(self.policy.enter_backoff())
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.bridge.call_later(decision.duration, self._window_end)

    def _window_end(self) -> None:
        self._timer = None
        if self.closing:
            return
        if self.backoff.window_ended():
            log.info("[%s] backoff window over, testing the waters with RDY 1", self.name)
            self.apply(self.policy.test_waters())
        else:
            self.apply(self.policy.exit_backoff())

    def stop(self) -> None:
        self.closing = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def state(self) -> dict[str, Any]:
        return self.backoff.state()
