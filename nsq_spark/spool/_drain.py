"""The publish spool's drain: one thread that sends a :class:`~.store.SegmentStore`'s
records to nsqd in order and acknowledges them in the store.

It reads the oldest unacknowledged batch (consecutive records of one topic, or one
deferred record), sends it through a *sender* (the :class:`Sender` port: by default the Producer's
direct transport, handed in: this module imports neither),
reads the next batch during the round trip, and advances the segment's watermark when
nsqd answered ``OK``.

Failures follow the spool's own rule, :func:`refused` (below), not the direct path's
:func:`nsq_spark.errors.is_transient`. A direct ``publish()`` has a caller waiting: a
refused AUTH or a TLS certificate that does not verify should fail that call at once,
and the caller decides. The spool has already told its caller "accepted"; its promise is
that the message reaches nsqd or stays on disk. So only a refusal *of that message* by
nsqd -- which no retry can change -- takes a message out of the queue (to ``rejected/``
and ``on_rejected``, after the batch is narrowed down to the refused message(s), while
the rest flows on). Everything else (nsqd unreachable, the wrong port, AUTH refused or
its server down, TLS, protocol garbage, ``E_PUB_FAILED``, an unexpected exception) is a
failure of the connection, not of the message: retried for as long as the drain runs,
with the one retry policy (:class:`nsq_spark._retry.RetryPolicy`, unbounded,
backoff capped), and made loud: :attr:`SpoolDrain.health` turns ``"failing"``, an ERROR
log names the cause (when it starts and while it goes on, at most once every
:data:`LOG_EVERY` seconds, and a WARNING when delivery resumes) and ``on_error`` is
called with each ERROR.

Delivery is at least once: a batch is sent again when its answer was lost or the process
died before the watermark was written -- at most one batch per failure, since one batch
is on the wire at a time.

**Replicas** (a sender with ``replicate``: ``Producer(replicas=N, write_quorum=W,
spool_dir=...)``). Nothing leaves the disk before N distinct nsqds acknowledged it. Each
batch is sent to N nsqds (:meth:`~nsq_spark._publish.replicated.ReplicatedTransport.
replicate`: the replica planner picks them and substitutes for failures), retried as
above -- only to nsqds that do not hold it yet -- until W hold it; then the drain moves on
to the next batch, and the batch stays *out*: its bodies are let go (read from disk
again when needed), the nsqds holding it are remembered, and the drain keeps completing
it (at most every ``retry_max_wait``, oldest first, with a substitute when more nsqd are
known than replicas, else the same nsqd once it is back). The segment's watermark
advances over out batches in read order, each once all N have it, so a replica that was
down gets every message it missed when it returns, and :meth:`SpoolDrain.flush` waits
for all N. The nsqds holding an out batch are kept in memory only: after a crash the
batches past the watermark are sent again to N nsqds (duplicates of one publish carry
one publish id). At most :data:`MAX_OUT` batches are out at once; past that the drain
only completes replicas until some are done. A batch nsqd refuses is narrowed down as
above, each message then kept until all N have it (or it is refused for good).
"""

from __future__ import annotations

import collections
import concurrent.futures
import threading
import time
from typing import Any, Callable, Protocol, Sequence

from tenacity import RetryCallState, Retrying

from nsq_spark.errors import (InvalidBodyError, InvalidNameError, NSQServerError,
                              ReplicationError)
from nsq_spark._retry import RetryPolicy

from .._log import get_logger
from ._format import SpoolError, wrap_envelope
from ._store import Batch, SegmentStore

log = get_logger("nsq_spark.publish_spool")

__all__ = ["Callbacks", "SpoolDrain", "Sender", "ReplicaSender", "refused", "REFUSAL_CODES",
           "LOG_EVERY", "MAX_OUT"]

#: nsqd's answers to PUB/MPUB/DPUB that refuse the message itself: a bad topic, a body
#: that is empty, too big or malformed, a defer out of range. Another attempt gets the
#: same answer.
REFUSAL_CODES = frozenset({"E_BAD_TOPIC", "E_BAD_MESSAGE", "E_BAD_BODY", "E_INVALID"})

#: seconds between two ERROR logs (and ``on_error`` calls) while sending keeps failing
LOG_EVERY = 30.0

#: batches a replicated drain keeps out (on the write quorum, not yet on every replica)
#: at once: about 200 bytes of memory each, the bodies stay on disk
MAX_OUT = 65536
#: out batches one pass of completing replicas takes, before the drain reads on
_FILL_PASS = 64


def refused(exc: BaseException) -> bool:
    """The spool's rule: True when nsqd (or the client, checking the same rule before
    sending) refused *this message* for a reason no retry can fix -- the message then
    leaves the queue for ``rejected/``. False for every other failure, which the drain
    retries without end: see the module doc for why this differs from
    :func:`nsq_spark.errors.is_transient`.

    The same codes also answer the handshake ("IDENTIFY failed to decode JSON body",
    "AUTH invalid body size") and a connection that must upgrade to TLS first ("cannot
    PUB in current state (TLS required)"): those are about the connection, not the
    message, and are retried."""
    if isinstance(exc, (InvalidNameError, InvalidBodyError)):
        return True
    if isinstance(exc, NSQServerError) and exc.code in REFUSAL_CODES:
        text = exc.description
        return not (text.startswith(_HANDSHAKE) or "current state" in text)
    return False


_HANDSHAKE = ("IDENTIFY", "AUTH")


def _retryable(exc: BaseException) -> bool:
    return not refused(exc)


class Callbacks:
    """The user's callbacks, on a thread of their own (started at the first call), in
    order; what one raises is logged. At most ``limit`` wait: past that a call is not
    queued, and a WARNING says so once per episode (what the callback would have been told
    is in the log and ``stats()`` anyway; a rejected message is in ``rejected/``)."""

    def __init__(self, name: str, logger: Any, limit: int = 10_000) -> None:
        self.name = name
        self._log = logger
        self.limit = limit
        self._queue: collections.deque[tuple[str, Callable[..., Any], tuple[Any, ...]]] = \
            collections.deque()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._pending: collections.Counter[str] = collections.Counter()  # queued + running
        self._closed = False
        self.dropped = 0

    def call(self, what: str, fn: Callable[..., Any], *args: Any) -> None:
        """Queue ``fn(*args)``; ``what`` names it in the log."""
        with self._cond:
            if self._closed:
                return
            if len(self._queue) >= self.limit:
                self.dropped += 1
                if self.dropped == 1:
                    self._log.warning("%s: %d callbacks wait for one that does not return; "
                                      "%s and the next are not queued", self.name,
                                      len(self._queue), what)
                return
            self._queue.append((what, fn, args))
            self._pending[what] += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name=f"nsq-spool-callbacks {self.name}")
                self._thread.start()
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if not self._queue:
                    return
                what, fn, args = self._queue.popleft()
            try:
                fn(*args)
            except Exception:  # a user callback must not stop the others
                self._log.exception("%s: the %s callback failed", self.name, what)
            finally:
                with self._cond:
                    self._pending[what] -= 1
                    if not self._queue:
                        self.dropped = 0
                    self._cond.notify_all()

    def wait_idle(self, timeout: float | None, what: str | None = None) -> bool:
        """Wait until every callback queued (of kind ``what``, or all) ran; False if one
        still waits or runs after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while (self._pending[what] if what is not None else
                   sum(self._pending.values())):
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def close(self, timeout: float) -> None:
        """Run what is queued for at most ``timeout`` seconds, then leave the thread (a
        daemon) to a callback that does not return, with a WARNING."""
        if not self.wait_idle(timeout):
            self._log.warning("%s: a callback still runs after %.1f s; not waited for "
                              "(it goes on in its own thread)", self.name, timeout)
        with self._cond:
            self._closed = True
            self._cond.notify_all()


class Sender(Protocol):
    """What the drain needs of what it sends through: a direct transport, a Producer
    without spool, or a test's fake. A ``mpublish_async`` returning a
    ``concurrent.futures.Future`` is used when present (the next batch is read during the
    round trip); ``stats()`` returning a dict, when present, is shown in the Producer's
    ``stats()["producer"]``; ``published`` (an int) is its ``published``."""

    def publish(self, topic: str, body: bytes, defer_ms: int | None = None) -> Any: ...

    def mpublish(self, topic: str, bodies: Sequence[bytes]) -> Any: ...

    def close(self) -> Any: ...


class ReplicaSender(Sender, Protocol):
    """A sender that places each batch on several nsqds (the replicated transport): the
    drain then keeps every batch until all ``replicas`` hold it."""

    replicas: int
    write_quorum: int

    def replicate(self, topic: str, bodies: Sequence[bytes], defer_ms: int | None = None,
                  have: frozenset[str] = frozenset(), need: int | None = None
                  ) -> frozenset[str]: ...


class _Out:
    """A batch on the write quorum, kept until every replica holds it."""

    __slots__ = ("batch", "holders", "rejected", "done")

    def __init__(self, batch: Batch, holders: frozenset[str], done: bool,
                 rejected: int = 0) -> None:
        self.batch = batch
        self.holders = holders
        self.done = done
        self.rejected = rejected


class SpoolDrain:
    """The thread that empties ``store`` into nsqd through ``sender``.

    Args:
        store: the segment store to read and acknowledge.
        sender: the producer that talks to nsqd (closed by :meth:`stop`).
        retry: the retry policy (``max_tries=None``: retried until stopped).
        message_id_digest: wrap each body in the message-id envelope before sending.
        batch_size / batch_bytes: bounds of one MPUB from the spool.
        rescan_interval: seconds between two looks for leftover segments.
        on_rejected: ``(topic, body, exc)`` for a message nsqd refused for good.
        on_error: ``(exc)`` when sending starts failing, then while it keeps failing --
            with the ERROR log, at most once every ``log_every`` seconds in all, so a
            flapping connection does not flood (runs on the callbacks' thread, see the
            module doc).
        log_every: seconds between two ERROR logs / ``on_error`` calls while failing.
    """

    def __init__(self, store: SegmentStore, sender: Sender, *,
                 retry: RetryPolicy, message_id_digest: bool = False, batch_size: int = 1000,
                 batch_bytes: int = 1 << 20, rescan_interval: float = 1.0,
                 on_rejected: Callable[[str, bytes, BaseException], None] | None = None,
                 on_error: Callable[[BaseException], None] | None = None,
                 log_every: float = LOG_EVERY) -> None:
        self._store = store
        self._log = log.bind(spool=str(store.directory))
        self.retry = retry
        self.message_id_digest = message_id_digest
        self.batch_size = batch_size
        self.batch_bytes = batch_bytes
        self.rescan_interval = rescan_interval
        self.on_rejected = on_rejected
        self.on_error = on_error
        self.log_every = log_every
        self.sender: Sender | None = sender
        self.callbacks = Callbacks(f"spool {store.directory}", self._log)
        self.last_error: BaseException | None = None
        # health: "ok" or "failing" (nsqd has not taken a batch since failing_since)
        self.failing_since: float | None = None    # time.time() of the first failure
        self.consecutive_failures = 0
        self._failing_mono = 0.0
        self._next_report = 0.0
        self._reported = False   # this episode was reported at ERROR
        self.sent_messages = 0
        self.sent_bytes = 0
        self.retries = 0
        self._wake = threading.Event()
        self._stop = threading.Event()
        #: messages on the write quorum but not yet on every replica (replicated drain)
        self.awaiting_replicas = 0
        # chosen once: a sender that replicates gets the drain that keeps batches out
        self._replicas: ReplicaSender | None = sender if callable(
            getattr(sender, "replicate", None)) else None   # type: ignore[assignment]
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"nsq-spool-drain {store.directory}")

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        """New records are in the store."""
        self._wake.set()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until the store holds nothing unacknowledged; True if so in time. (A
        refused message leaves the queue too: the Producer's flush says so.)"""
        self._wake.set()
        return self._store.wait_empty(timeout)

    @property
    def health(self) -> str:
        """``"ok"``, or ``"failing"`` while the last attempt to send failed."""
        return "ok" if self.failing_since is None else "failing"

    def health_dict(self) -> dict[str, Any]:
        """The health state for ``stats()``: ``health``, ``last_error`` (the cause),
        ``failing_since`` (epoch seconds or None), ``consecutive_failures``."""
        err = self.last_error
        return {"health": self.health,
                "last_error": None if err is None else f"{type(err).__name__}: {err}",
                "failing_since": self.failing_since,
                "consecutive_failures": self.consecutive_failures}

    # -- health ------------------------------------------------------------------------

    def _failed(self, exc: BaseException) -> None:
        """One failed attempt that is not a refusal of the message."""
        self.last_error = exc
        self.consecutive_failures += 1
        now = time.monotonic()
        if self.failing_since is None:
            self.failing_since = time.time()
            self._failing_mono = now
        # at most one report per log_every, across episodes too: a connection that
        # flaps every second must not log an ERROR every second
        if now < self._next_report:
            return
        self._next_report = now + self.log_every
        self._reported = True
        pending = self._store.pending()
        self._log.error("spool %s: nsqd does not take messages: %s: %s (%d failed attempts over "
                        "%.0f s); %d bytes stay in the spool and are retried, nothing is dropped",
                        self._store.directory, type(exc).__name__, exc, self.consecutive_failures,
                        now - self._failing_mono, pending)
        if self.on_error is not None:
            # never on this thread: a callback that blocks must not stop the sending
            self.callbacks.call("on_error", self.on_error, exc)

    def _recovered(self) -> None:
        if self._reported:
            self._reported = False
            self._log.warning("spool %s: nsqd takes messages again after %d failed attempts over "
                              "%.1f s", self._store.directory, self.consecutive_failures,
                              time.monotonic() - self._failing_mono)
        self.failing_since = None
        self.consecutive_failures = 0
        self.last_error = None

    def stop(self, callbacks_timeout: float = 5.0) -> None:
        """Stop the thread (an unacknowledged batch is sent again by the next drain) and
        close the sender; the callbacks queued get ``callbacks_timeout`` seconds more."""
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join()
        self.callbacks.close(callbacks_timeout)
        sender, self.sender = self.sender, None
        if sender is not None:
            try:
                sender.close()
            except Exception as exc:  # noqa: BLE001 - closing goes on
                self._log.debug("spool %s: closing the producer: %s", self._store.directory, exc)

    # -- the thread --------------------------------------------------------------------

    def _run(self) -> None:
        try:
            if self._replicas is not None:
                self._drain_replicated(self._replicas)
            else:
                self._drain()
        except Exception:  # pragma: no cover - a bug; keep the spool, say so loudly
            self._log.exception("spool %s: the drain thread failed; unsent messages stay in the "
                                "spool for the next start", self._store.directory)

    def _retrying(self) -> Retrying:
        return self.retry.retrying(stop_event=self._stop, on_retry=self._log_retry,
                                   retry_if=_retryable)

    def _drain(self) -> None:
        store = self._store
        retrying = self._retrying()
        next_scan = time.monotonic() + self.rescan_interval
        batch: Batch | None = None
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= next_scan:
                store.claim_orphans()
                next_scan = now + self.rescan_interval
            if batch is None:
                batch = store.next_batch(self.batch_size, self.batch_bytes)
            if batch is None:
                self._wake.wait(max(0.0, next_scan - time.monotonic()))
                self._wake.clear()
                continue
            nxt = None
            try:
                fut = self._start_send(batch)
                if fut is not None:
                    # read the next batch while this one is on the wire: one batch is
                    # still sent at a time, so a crash duplicates at most one batch
                    nxt = store.next_batch(self.batch_size, self.batch_bytes, after=batch)
                    while not fut.done():
                        if self._stop.is_set():
                            return   # unacknowledged: sent again later (maybe twice)
                        concurrent.futures.wait([fut], timeout=0.1)
                    fut.result()
            except Exception as first:
                nxt = None
                failure: BaseException | None = first
                if not refused(first):
                    self._failed(first)
                    try:
                        self.retries += 1
                        retrying(self._send_batch, batch)
                        failure = None
                    except Exception as exc:
                        failure = exc
                if failure is not None:
                    if self._stop.is_set():
                        return
                    # refused: find the culprit(s) one by one, keep the rest flowing
                    self._send_singly(batch, retrying, failure)
                    batch = None
                    continue
            self._sent(batch)
            store.ack(batch)
            batch = nxt

    # -- the replicated drain --------------------------------------------------------------

    def _drain_replicated(self, sender: ReplicaSender) -> None:
        store = self._store
        retrying = self._retrying()
        out: collections.deque[_Out] = collections.deque()
        next_scan = time.monotonic() + self.rescan_interval
        fill_at = 0.0
        fill_failures = 0
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= next_scan:
                store.claim_orphans()
                next_scan = now + self.rescan_interval
            if self.awaiting_replicas and now >= fill_at:
                if self._fill(sender, out):
                    fill_failures = 0
                    fill_at = 0.0
                else:   # the missing nsqd is still away: back off, the stream goes on
                    fill_failures += 1
                    fill_at = now + min(self.retry.max_wait, 0.05 * 2 ** min(fill_failures, 16))
            self._ack_done(out)
            batch = store.read_unsent(self.batch_size, self.batch_bytes) \
                if len(out) < MAX_OUT else None
            if batch is None:
                wake_at = next_scan if not self.awaiting_replicas else min(next_scan, fill_at)
                self._wake.wait(max(0.0, wake_at - time.monotonic()))
                self._wake.clear()
                continue
            entry = self._place(sender, batch, retrying)
            if entry is None:
                return   # stopped: what is out or unsent stays on disk for the next drain
            out.append(entry)
            if not entry.done:
                self.awaiting_replicas += entry.batch.count
            self._ack_done(out)

    def _ack_done(self, out: "collections.deque[_Out]") -> None:
        """Advance the watermarks over the batches every replica holds, in read order."""
        while out and out[0].done:
            entry = out.popleft()
            self._store.ack(entry.batch, rejected=entry.rejected)

    def _place(self, sender: ReplicaSender, batch: Batch, retrying: Retrying) -> _Out | None:
        """Send ``batch`` until the write quorum holds it (retrying without end, only to
        nsqds that do not hold it); a refused batch is narrowed down. None when stopped."""
        holders: frozenset[str] = frozenset()

        def attempt() -> None:
            nonlocal holders
            try:
                holders = sender.replicate(batch.topic, batch.bodies, batch.defer_ms, holders)
            except ReplicationError as exc:
                holders = frozenset(exc.acked)
                if not refused(exc):
                    self.last_error = exc
                raise

        try:
            attempt()
        except Exception as first:
            failure: BaseException | None = first
            if not refused(first):
                self._failed(first)
                try:
                    self.retries += 1
                    retrying(attempt)
                    failure = None
                except Exception as exc:
                    failure = exc
            if failure is not None:
                if self._stop.is_set():
                    return None
                return self._place_singly(sender, batch, retrying, failure)
        self._sent(batch)
        done = len(holders) >= sender.replicas
        if not done:
            batch.bodies = []   # out until every replica has it: read again when needed
        return _Out(batch, holders, done)

    def _place_singly(self, sender: ReplicaSender, batch: Batch, retrying: Retrying,
                      first_exc: BaseException) -> _Out | None:
        """``batch`` was refused: each message on its own, until every replica holds it
        or nsqd refuses it for good (to ``rejected/``). None when stopped."""
        rejected = 0
        for i, body in enumerate(batch.bodies):
            one = Batch(batch.segment, batch.topic, [body], batch.defer_ms, batch.end)
            exc: BaseException | None = first_exc if len(batch.bodies) == 1 else None
            if exc is None:
                try:
                    retrying(lambda: sender.replicate(one.topic, one.bodies, one.defer_ms,
                                                      need=sender.replicas))
                except Exception as failure:
                    exc = failure
            if exc is None:
                self._sent(one)
                continue
            if self._stop.is_set():
                return None
            while not self._reject(batch, i, exc):   # kept in the queue until written
                if self._stop.is_set():
                    return None
            rejected += 1
        return _Out(batch, frozenset(), True, rejected)

    def _fill(self, sender: ReplicaSender, out: "collections.deque[_Out]") -> bool:
        """Complete the replicas of the oldest out batches (a pass of at most
        ``_FILL_PASS``); False when a batch made no progress (its missing nsqd is still
        away)."""
        done = 0
        for entry in list(out):
            if entry.done:
                continue
            if done >= _FILL_PASS or self._stop.is_set():
                return True
            b = entry.batch
            try:
                bodies = self._store.reread(b)
                holders = sender.replicate(b.topic, bodies, b.defer_ms, entry.holders,
                                           need=sender.replicas)
            except ReplicationError as exc:
                holders = frozenset(exc.acked)
                if len(holders) <= len(entry.holders):
                    self._log.debug("spool %s: completing replicas: %s", self._store.directory,
                                    exc)
                    return False
            except Exception as exc:  # noqa: BLE001 - retried on the next pass
                self._log.debug("spool %s: completing replicas: %s", self._store.directory, exc)
                return False
            entry.holders = holders
            done += 1
            if len(holders) >= sender.replicas:
                entry.done = True
                self.awaiting_replicas -= b.count
        return True

    def _sent(self, batch: Batch) -> None:
        if self.failing_since is not None or self.last_error is not None:
            self._recovered()
        self.sent_messages += len(batch.bodies)
        self.sent_bytes += sum(map(len, batch.bodies))

    def _bodies(self, batch: Batch) -> list[bytes]:
        if self.message_id_digest:
            return [wrap_envelope(b) for b in batch.bodies]
        return batch.bodies

    def _sender(self) -> Sender:
        if self.sender is None:
            raise RuntimeError("the spool drain was stopped")  # pragma: no cover - a bug
        return self.sender

    def _start_send(self, batch: Batch) -> "concurrent.futures.Future[Any] | None":
        """Send without waiting when the sender can (``mpublish_async``); else send
        synchronously and return None."""
        send_async = getattr(self._sender(), "mpublish_async", None)
        if batch.defer_ms is None and len(batch.bodies) > 1 and send_async is not None:
            fut: concurrent.futures.Future[Any] = send_async(batch.topic, self._bodies(batch))
            return fut
        self._send_batch(batch)
        return None

    def _send_batch(self, batch: Batch) -> None:
        sender = self._sender()
        bodies = self._bodies(batch)
        try:
            if batch.defer_ms is not None:
                sender.publish(batch.topic, bodies[0], defer_ms=batch.defer_ms)
            elif len(bodies) == 1:
                sender.publish(batch.topic, bodies[0])
            else:
                sender.mpublish(batch.topic, bodies)
        except Exception as exc:
            if not refused(exc):
                self.last_error = exc
            raise

    def _send_singly(self, batch: Batch, retrying: Retrying, first_exc: BaseException) -> None:
        """``batch`` was refused: send its messages one at a time (when more than one),
        move the refused ones to ``rejected/``, acknowledge the batch."""
        rejected = 0
        if len(batch.bodies) == 1:
            if not self._reject(batch, 0, first_exc):
                return
            rejected = 1
        else:
            for i, body in enumerate(batch.bodies):
                one = Batch(batch.segment, batch.topic, [body], batch.defer_ms, batch.end)
                try:
                    retrying(self._send_batch, one)
                except Exception as exc:
                    if self._stop.is_set():
                        return   # nothing acked: the whole batch is sent again next time
                    if not self._reject(batch, i, exc):
                        return   # kept: the batch is read again (the sent part resent)
                    rejected += 1
                else:
                    self._sent(one)
        self._store.ack(batch, rejected=rejected)

    def _reject(self, batch: Batch, index: int, exc: BaseException) -> bool:
        """Move a refused message to ``rejected/``; False (and the message stays queued,
        retried after a backoff) when that cannot be written, e.g. on a full disk."""
        try:
            self._store.reject(batch, index, exc)
        except SpoolError as err:
            self._failed(err)
            self._stop.wait(min(self.retry.max_wait, 1.0))
            return False
        if self.on_rejected is not None:
            self.callbacks.call("on_rejected", self.on_rejected, batch.topic,
                                batch.bodies[index], exc)
        return True

    def _log_retry(self, state: RetryCallState) -> None:
        self.retries += 1
        exc = state.outcome.exception() if state.outcome else None
        if exc is not None:
            self._failed(exc)   # the ERROR log, rate-limited, is there
        self._log.debug("spool %s: sending failed (attempt %d): %s; the messages stay in the "
                        "spool and are retried", self._store.directory, state.attempt_number, exc)
