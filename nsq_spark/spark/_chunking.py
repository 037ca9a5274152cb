"""The fetch task's decisions, without IO: when to cut a chunk, how long to wait, when to
drain, settle and stop.

A streaming fetch task (:class:`nsq_spark.spark._fetch.FetchTask`) takes messages from a
Reader, cuts them into chunks, writes each chunk durably in a writer thread and FINishes
it once it is durable. What it does next depends only on counts and times, so the choice
lives here, like :class:`nsq_spark.rdy.RdyPolicy`: the task tells the planner what
happened (:meth:`ChunkPlanner.fetched`, :meth:`~ChunkPlanner.drained`,
:meth:`~ChunkPlanner.cut`, :meth:`~ChunkPlanner.settled`), with the clock's reading, and
asks :meth:`~ChunkPlanner.next` what to do; it gets a :class:`Step`:

``FETCH``   take up to ``want`` messages from the Reader, waiting at most ``timeout`` s
            (``first``: the first wait of a batch nsqd reported -- the task checks that
            it is subscribed when nothing came);
``CUT``     the pending messages become a chunk and go to a writer;
``SETTLE``  wait for the oldest chunk in the writers to be durable, then FIN it (before
            the FIN, :meth:`~ChunkPlanner.in_flight_cap` says how far to lower
            max_in_flight so that nsqd sends nothing beyond the share);
``DRAIN``   the end is decided: set RDY 0 and take only what the Reader already holds
            (no wait: see below), and with a byte share none once it is reached;
``FINISH``  every chunk is settled and nothing is pending: seal and complete.

Why no timed wait at the end (the old ``DRAIN_WAIT`` of 100 ms per task): the end of a
task's share is decided from what nsqd has told us -- the share reached, an idle
timeout, ``maxFetchPeriod`` -- and the drain takes what has arrived, nothing more.
Messages nsqd sent before it saw RDY 0 are in flight to this consumer: with the
executor's Reader cache (:mod:`.reader_cache`) they stay un-FINished in the cached
Reader and are the first thing the next task of the partition takes; a Reader closed
(no cache, an idle cache entry, a failed task) requeues them; an executor that dies
leaves them to nsqd's ``msg_timeout`` (redelivered, never lost). Waiting for them
would cost every task 100 ms to save a redelivery that the cache makes rare.

The byte share (``maxBytesPerTrigger``) is held like the message share, and tighter:
the task takes messages (``FETCH`` and ``DRAIN`` pass :meth:`~ChunkPlanner.bytes_wanted`
to the Reader's ``get_blocks(max_bytes=...)``) only until their bodies reach the share,
so the message that reaches it is the last one -- at most one message over per task,
whatever the sizes. What nsqd sent beyond it stays un-FINished in the Reader (the cached
Reader hands it to the next task first; a Reader closed requeues it). So that little is
sent beyond it, RDY follows the byte share as it follows the message share
(:meth:`~ChunkPlanner.in_flight_cap`): what is taken and not FINished, plus the bytes
left over the mean body size seen so far -- 1 before the first body is seen (one round
trip per task to learn the size: a byte-capped query pays it, no other).

Invariants (property-tested in tests/spark/test_chunking.py): a chunk never holds more
than ``chunk_size`` messages, except for what the drain adds to the last one; at most
``max_jobs`` chunks are in the writers; the task finishes only with nothing pending and
nothing unsettled; it drains once, before it finishes; no wait goes past
``maxFetchPeriod``, and none past ``FLUSH_INTERVAL`` after a pending message arrived.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["Action", "ChunkPlanner", "Step", "body_bytes"]


class Action(enum.Enum):
    FETCH = "fetch"
    CUT = "cut"
    SETTLE = "settle"
    DRAIN = "drain"
    FINISH = "finish"


@dataclass(frozen=True)
class Step:
    action: Action
    want: int = 0  # FETCH: at most this many messages
    timeout: float = 0.0  # FETCH: seconds to wait at most
    first: bool = False  # FETCH: the first wait of a batch nsqd reported


def body_bytes(offsets: "object", count: int, body_at: int) -> int:
    """Bytes of the bodies of a MessageBlock's ``count`` frames (the frames back to back,
    less each frame's header): no look at the bytes themselves."""
    off = offsets  # array("i") of count + 1 boundaries
    return int(off[count] - off[0]) - count * body_at  # type: ignore[index]


class ChunkPlanner:
    """The decisions of one fetch task (module docstring). Times are the task's
    monotonic clock readings, passed in; nothing here reads a clock or does IO.

    ``share``: messages this run may take (None: until idle or ``max_fetch_period``);
    ``byte_share``: body bytes (None: no cap); both are targets -- a chunk may end a
    little above, with what the Reader held when it was reached. ``expecting``: the
    driver saw a backlog, so the first wait allows ``first_wait`` for discovery and
    connect instead of ``idle_timeout``.
    """

    def __init__(self, *, now: float, chunk_size: int, max_jobs: int,
                 share: int | None, byte_share: int | None, idle_timeout: float,
                 max_fetch_period: float, flush_interval: float, first_wait: float,
                 writer_poll: float, expecting: bool, max_in_flight: int,
                 connections: int = 1) -> None:
        if chunk_size < 1 or max_jobs < 1:
            raise ValueError(f"chunk_size ({chunk_size}) and max_jobs ({max_jobs}) must "
                             "be >= 1")
        self.chunk_size = chunk_size
        self.max_jobs = max_jobs
        self.share = share
        self.byte_share = byte_share
        self.idle_timeout = idle_timeout
        self.flush_interval = flush_interval
        self.first_wait = first_wait
        self.writer_poll = writer_poll
        self.max_in_flight = max_in_flight
        # nsqd connections of the Reader: a byte share's RDY is at least one each while
        # it takes more (the Reader gives a connection nothing below one RDY each)
        self.connections = max(1, connections)
        self.deadline = now + max_fetch_period
        self.expecting = expecting
        # messages and body bytes waiting to be cut; when the oldest of them arrived
        self.pending = 0
        self.pending_bytes = 0
        self.first_at = 0.0
        # chunks cut and not settled (in the writers), oldest first: their sizes
        self.jobs: list[int] = []
        self.taken = 0  # messages cut into chunks by this run
        self.taken_bytes = 0
        self.finished = 0  # messages FINished (settled) by this run
        self.idle = False
        self.paused = False  # drained: RDY is 0 from then on
        self.oldest_durable = False  # the IO side's look at the oldest writer job
        self._cut_now = False  # starved: cut without waiting to fill the chunk

    # -- what the loop reports ----------------------------------------------------------

    def fetched(self, n: int, nbytes: int, now: float, waited: float, starved: bool
                ) -> None:
        """A FETCH returned ``n`` messages (``nbytes`` of bodies) after asking for up
        to ``waited`` seconds; ``starved``: the Reader says nsqd sends no more until a
        FIN (``Reader.is_starved``)."""
        if n:
            self.expecting = False
            self._add(n, nbytes, now)
            if self.jobs or not starved:
                return
            # nsqd's --max-rdy-count (or several nsqds) keep the window below
            # maxInFlight: nothing more comes until these are FINished
            self._cut_now = True
        elif self.jobs and waited <= self.writer_poll:
            return  # only polled for the writers: not idle
        elif not self.pending or waited >= self.idle_wait():
            self.idle = True

    def drained(self, n: int, nbytes: int, now: float) -> None:
        """The DRAIN took ``n`` messages the Reader held (RDY is 0 from now on)."""
        self.paused = True
        if n:
            self._add(n, nbytes, now)

    def cut(self) -> tuple[int, int]:
        """The pending messages went to a writer as one chunk: its messages and bytes."""
        n, nbytes = self.pending, self.pending_bytes
        if not n:
            raise ValueError("cut() with nothing pending")
        self.jobs.append(n)
        self.taken += n
        self.taken_bytes += nbytes
        self.pending = self.pending_bytes = 0
        self._cut_now = False
        return n, nbytes

    def settled(self) -> int:
        """The oldest chunk is durable and FINished: its messages."""
        if not self.jobs:
            raise ValueError("settled() with no chunk in the writers")
        n = self.jobs.pop(0)
        self.finished += n
        self.oldest_durable = False
        return n

    def rdy_cap_before_fin(self, n: int) -> int | None:
        """Before FINishing the oldest chunk's ``n`` messages: the max_in_flight to set so
        that nsqd may send no more than what is left of the shares (None: leave it as
        it is, at ``max_in_flight``). After the drain RDY stays 0."""
        cap = self.in_flight_cap(n)
        return cap if cap is not None and cap < self.max_in_flight else None

    def in_flight_cap(self, finishing: int = 0) -> int | None:
        """The max_in_flight that lets nsqd send no more than what is left of the shares
        (at most ``max_in_flight``), once ``finishing`` more messages are FINished; None
        without a share, and after the drain (RDY stays 0).

        Message share: every message not FINished yet counts, taken or still to come
        (``share - finished``). Byte share: those taken and not FINished, plus the bytes
        left over the mean body size seen (1 message before any is seen; at least one
        per connection while the share takes more; 0 once it is reached): nsqd sends
        about what the share still takes."""
        if self.paused:
            return None
        caps = []
        if self.share is not None:
            caps.append(max(0, self.share - self.finished - finishing))
        if self.byte_share is not None:
            unfinished = max(0, self.taken + self.pending - self.finished - finishing)
            more = self.messages_for_bytes()
            caps.append(unfinished + (max(more, self.connections) if more else 0))
        return min(min(caps), self.max_in_flight) if caps else None

    def bytes_wanted(self) -> int | None:
        """Body bytes the task may still take (a message is taken whole: the one that
        reaches this is the last); None without a byte share."""
        if self.byte_share is None:
            return None
        return max(0, self.byte_share - self.taken_bytes - self.pending_bytes)

    def messages_for_bytes(self) -> int:
        """About how many more messages the byte share takes: the bytes left over the
        mean body size seen (rounded up; 1 before any body is seen)."""
        left = self.bytes_wanted()
        if not left:
            return 0
        seen = self.taken + self.pending
        if not seen:
            return 1
        mean = max(1, (self.taken_bytes + self.pending_bytes) // seen)
        return -(-left // mean)

    # -- what to do next ----------------------------------------------------------------

    def share_reached(self) -> bool:
        """The messages or the body bytes taken (cut and pending) reached their share."""
        if self.share is not None and self.taken + self.pending >= self.share:
            return True
        return self.byte_share is not None \
            and self.taken_bytes + self.pending_bytes >= self.byte_share

    def want(self) -> int:
        """Messages the next FETCH may take: the chunk's room, within the shares."""
        if self.share_reached():
            return 0
        want = self.chunk_size - self.pending
        if self.share is not None:
            want = min(want, self.share - self.taken - self.pending)
        return want

    def next(self, now: float) -> Step:
        if self.jobs and self.oldest_durable:
            return Step(Action.SETTLE)  # FIN it now: nsqd refills the window meanwhile
        want = self.want()
        stop = self.idle or now >= self.deadline or self.share_reached()
        if stop and not self.paused:
            return Step(Action.DRAIN)
        flush_due = bool(self.pending) and now - self.first_at >= self.flush_interval
        if not stop and want > 0 and not flush_due and not self._cut_now:
            idle_wait = self.idle_wait()
            wait = min(idle_wait, max(0.0, self.deadline - now))
            if self.pending:
                wait = min(wait, max(0.0, self.first_at + self.flush_interval - now))
            if self.jobs:
                wait = min(wait, self.writer_poll)  # come back for the writers soon
            return Step(Action.FETCH, want=want, timeout=wait,
                        first=self.expecting and not self.jobs)
        if self.pending:
            if len(self.jobs) >= self.max_jobs:
                return Step(Action.SETTLE)  # the window is full: wait for the oldest
            return Step(Action.CUT)
        if self.jobs:
            return Step(Action.SETTLE)
        return Step(Action.FINISH)

    # -- internals ------------------------------------------------------------------------

    def idle_wait(self) -> float:
        if self.expecting:  # nsqd reported these messages: allow for discovery+connect
            return max(self.idle_timeout, self.first_wait)
        return self.idle_timeout

    def _add(self, n: int, nbytes: int, now: float) -> None:
        if not self.pending:
            self.first_at = now
        self.pending += n
        self.pending_bytes += nbytes
