"""``Trigger.AvailableNow`` for the ``nsq`` stream source: how far the run goes and when it
is done. Pure: the driver (:mod:`.datasource`) measures the backlog and reads what each
batch fetched from its spool; this decides.

Spark calls ``prepareForTriggerAvailableNow`` once, then ``latestOffset`` until it returns
its start (no new batch). nsq has no offsets to read up to, so the target is a count:

* the backlog measured at the start (:meth:`AvailableNow.start`; ``settled_backlog``, once
  nsqd has copied the topic's queue into a new channel) is the target;
* each batch may plan at most what is left of it, the target less what the batches of
  this run really fetched (fetch tasks may take less than planned: messages in flight
  with another consumer, a byte cap);
* only a batch planned in this run counts: one run again from the checkpoint (a failed
  batch) fetched before the target was measured, so its rows are not part of it
  (counting them stopped the run one batch short);
* the run is done when nothing is left, or after two batches in a row that fetched
  nothing (the backlog may sit in flight with another consumer); without a measurement
  (no lookupd nor ``nsqdHttpAddresses``) there is no target, and one empty batch ends it.

``minMessagesPerTrigger`` does not apply (waiting for more would never end the run).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

__all__ = ["AvailableNow", "Next"]

# batches in a row that fetched nothing before a run with a target gives up
EMPTY_BATCHES_TO_STOP = 2


@dataclass(frozen=True)
class Next:
    """What the next ``latestOffset`` may plan: ``done`` (no batch: the run ends), or at
    most ``cap`` messages (None: the run adds no cap of its own)."""

    done: bool
    cap: int | None = None


DONE = Next(True)


@dataclass(frozen=True)
class AvailableNow:
    """One AvailableNow run. Immutable: each step returns the run's next state."""

    target: int | None  # the backlog at the start; None: it could not be measured
    fetched: int = 0  # messages the batches planned in this run took
    empty: int = 0  # batches in a row, the latest last, that took nothing
    planned: frozenset[int] = field(default_factory=frozenset)  # batches planned in this run
    counted: frozenset[int] = field(default_factory=frozenset)  # batches whose rows are in

    @classmethod
    def start(cls, backlog: int | None) -> "AvailableNow":
        """The run whose target is ``backlog`` (measured at
        ``prepareForTriggerAvailableNow``; None: not measurable)."""
        return cls(None if backlog is None else max(0, backlog))

    def plans(self, batch: int) -> "AvailableNow":
        """``batch`` was planned in this run: its rows will count."""
        return replace(self, planned=self.planned | {batch})

    def counts(self, batch: int) -> bool:
        """Whether what ``batch`` fetched is still to be counted (planned in this run,
        not counted yet): the driver reads its spool only then."""
        return batch in self.planned and batch not in self.counted

    def ran(self, batch: int, rows: int) -> "AvailableNow":
        """``batch`` ended having taken ``rows`` messages (rows, and copies of publishes
        already rows: the backlog counts every copy). Counted once; a batch not planned
        in this run is not counted."""
        if not self.counts(batch):
            return self
        rows = max(0, rows)
        return replace(self, fetched=self.fetched + rows,
                       empty=0 if rows else self.empty + 1,
                       counted=self.counted | {batch})

    @property
    def left(self) -> int | None:
        """What is left of the target (None: no target)."""
        return None if self.target is None else max(0, self.target - self.fetched)

    def next(self, measured: bool) -> Next:
        """What the next batch may plan; ``measured``: the backlog could be measured at
        this trigger (when it could not, a batch runs, uncapped, until one takes
        nothing)."""
        if not measured:
            return DONE if self.empty else Next(False)
        if self.target is None:
            return Next(False)
        left = self.target - self.fetched
        if left <= 0 or self.empty >= EMPTY_BATCHES_TO_STOP:
            return DONE
        return Next(False, left)
