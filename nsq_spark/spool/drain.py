"""The publish spool's drain: one thread that sends a :class:`~.store.SegmentStore`'s
records to nsqd in order and acknowledges them in the store.

It reads the oldest unacknowledged batch (consecutive records of one topic, or one
deferred record), sends it through a *sender* (an ordinary, non-spooling
:class:`nsq_spark.Producer`, handed in: this module does not import it),
reads the next batch during the round trip, and advances the segment's watermark when
nsqd answered ``OK``. Failures follow the one classification
(:func:`nsq_spark.errors.is_transient`): a transient one is retried without end (the
spool keeps every message until nsqd takes it) with the one retry policy
(:class:`nsq_spark.publish.retry.RetryPolicy`, unbounded); a permanent one (bad topic,
body too big, refused AUTH, ...) is narrowed down to the refused message(s), which go to
``rejected/`` and to ``on_rejected``, while the rest of the batch flows on.

Delivery is at least once: a batch is sent again when its answer was lost or the process
died before the watermark was written -- at most one batch per failure, since one batch
is on the wire at a time.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from typing import Any, Callable, Protocol, Sequence

from tenacity import RetryCallState, Retrying

from nsq_spark.errors import is_transient
from nsq_spark.publish.retry import RetryPolicy

from .format import wrap_envelope
from .store import Batch, SegmentStore

log = logging.getLogger("nsq_spark.publish_spool")

__all__ = ["SpoolDrain", "Sender"]


class Sender(Protocol):
    """What the drain needs of a producer (``mpublish_async`` is used when present)."""

    def publish(self, topic: str, body: bytes, defer_ms: int | None = None) -> Any: ...

    def mpublish(self, topic: str, bodies: Sequence[bytes]) -> Any: ...

    def close(self) -> Any: ...


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
    """

    def __init__(self, store: SegmentStore, sender: Sender, *,
                 retry: RetryPolicy, message_id_digest: bool = False, batch_size: int = 1000,
                 batch_bytes: int = 1 << 20, rescan_interval: float = 1.0,
                 on_rejected: Callable[[str, bytes, BaseException], None] | None = None
                 ) -> None:
        self._store = store
        self.retry = retry
        self.message_id_digest = message_id_digest
        self.batch_size = batch_size
        self.batch_bytes = batch_bytes
        self.rescan_interval = rescan_interval
        self.on_rejected = on_rejected
        self.sender: Any = sender
        self.last_error: BaseException | None = None
        self.sent_messages = 0
        self.sent_bytes = 0
        self.retries = 0
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"nsq-spool-drain {store.directory}")

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        """New records are in the store."""
        self._wake.set()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until the store holds nothing unacknowledged; True if so in time."""
        self._wake.set()
        return self._store.wait_empty(timeout)

    def stop(self) -> None:
        """Stop the thread (an unacknowledged batch is sent again by the next drain) and
        close the sender."""
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join()
        sender, self.sender = self.sender, None
        if sender is not None:
            try:
                sender.close()
            except Exception as exc:  # noqa: BLE001 - closing goes on
                log.debug("spool %s: closing the producer: %s", self._store.directory, exc)

    # -- the thread --------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._drain()
        except Exception:  # pragma: no cover - a bug; keep the spool, say so loudly
            log.exception("spool %s: the drain thread failed; unsent messages stay in the "
                          "spool for the next start", self._store.directory)

    def _retrying(self) -> Retrying:
        return self.retry.retrying(stop_event=self._stop, on_retry=self._log_retry)

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
                self.last_error = first
                nxt = None
                failure: BaseException | None = first
                if is_transient(first):
                    try:
                        self.retries += 1
                        retrying(self._send_batch, batch)
                        failure = None
                    except Exception as exc:
                        failure = exc
                if failure is not None:
                    if self._stop.is_set():
                        return
                    # permanent: find the culprit(s) one by one, keep the rest flowing
                    self._send_singly(batch, retrying, failure)
                    batch = None
                    continue
            self._sent(batch)
            store.ack(batch)
            batch = nxt

    def _sent(self, batch: Batch) -> None:
        self.last_error = None
        self.sent_messages += len(batch.bodies)
        self.sent_bytes += sum(map(len, batch.bodies))

    def _bodies(self, batch: Batch) -> list[bytes]:
        if self.message_id_digest:
            return [wrap_envelope(b) for b in batch.bodies]
        return batch.bodies

    def _sender(self) -> Any:
        if self.sender is None:
            raise RuntimeError("the spool drain was stopped")  # pragma: no cover - a bug
        return self.sender

    def _start_send(self, batch: Batch) -> "concurrent.futures.Future[Any] | None":
        """Send without waiting when the sender can (``mpublish_async``); else send
        synchronously and return None."""
        sender = self._sender()
        if batch.defer_ms is None and len(batch.bodies) > 1 and hasattr(sender, "mpublish_async"):
            fut: concurrent.futures.Future[Any] = sender.mpublish_async(batch.topic,
                                                                        self._bodies(batch))
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
            self.last_error = exc
            raise

    def _send_singly(self, batch: Batch, retrying: Retrying, first_exc: BaseException) -> None:
        if len(batch.bodies) == 1:
            self._reject(batch, 0, first_exc)
            self._store.ack(batch)
            return
        # the whole MPUB was refused: send one at a time to find which message is bad
        for i, body in enumerate(batch.bodies):
            one = Batch(batch.segment, batch.topic, [body], batch.defer_ms, batch.end)
            try:
                retrying(self._send_batch, one)
            except Exception as exc:
                if self._stop.is_set():
                    return   # nothing acked: the whole batch is sent again next time
                self._reject(batch, i, exc)
            else:
                self._sent(one)
        self._store.ack(batch)

    def _reject(self, batch: Batch, index: int, exc: BaseException) -> None:
        self._store.reject(batch, index, exc)
        if self.on_rejected is not None:
            try:
                self.on_rejected(batch.topic, batch.bodies[index], exc)
            except Exception:
                log.exception("spool on_rejected callback failed")

    def _log_retry(self, state: RetryCallState) -> None:
        self.retries += 1
        exc = state.outcome.exception() if state.outcome else None
        level = logging.WARNING if state.attempt_number in (1, 10) or \
            state.attempt_number % 100 == 0 else logging.DEBUG
        log.log(level, "spool %s: sending failed (attempt %d): %s; the messages stay in the "
                "spool and are retried", self._store.directory, state.attempt_number, exc)
