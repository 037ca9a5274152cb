"""The spooled transport: every call appends to a durable local spool and returns; a drain
thread sends the spool to nsqd through a sender and keeps each message until nsqd
acknowledged it (the promise and the on-disk format: :mod:`nsq_spark.spool`).

It composes a :class:`~nsq_spark.spool._store.SegmentStore` and a
:class:`~nsq_spark.spool._drain.SpoolDrain`; the sender is a
:class:`~nsq_spark.spool._drain.Sender` (by default a :class:`~.direct.DirectTransport`,
built by the facade). Appends apply the direct path's body and topic checks, in its
order, so both modes accept, and refuse with the same error, the same calls.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from typing import Any, Iterable, Sequence

from nsq_spark import protocol
from nsq_spark.config import ProducerOptions
from nsq_spark.errors import InvalidBodyError
from nsq_spark.spool._drain import Sender, SpoolDrain
from nsq_spark.spool._format import SpoolError
from nsq_spark.spool._store import SegmentStore, SpoolStats

from .._retry import RetryPolicy
from .transport import done_future

__all__ = ["SpooledTransport"]

Record = tuple[str, bytes, "int | None"]


def _body(body: Any, max_size: int | None, what: str) -> bytes:
    """The one body rule (the direct path applies the same ``protocol._check_body``
    while encoding)."""
    protocol._check_body(body, max_size, what)
    return body if isinstance(body, bytes) else bytes(body)


class SpooledTransport:
    """A spool directory and the thread that drains it (see the module doc).

    Args:
        options: the Producer's options (:class:`~nsq_spark.config.ProducerOptions`):
            ``spool_dir``, the spool directory (created if missing); ``max_msg_size``,
            over which bodies raise InvalidBodyError before they are spooled;
            ``retry_max_wait``, the cap of the drain's backoff between attempts, seconds;
            the store's options (``spool_fsync``, ``spool_max_bytes``, ``spool_full``,
            ``spool_block_timeout``, ``on_corrupt``:
            :class:`~nsq_spark.spool._store.SegmentStore`) and the drain's
            (``message_id_digest``, ``batch_size``, ``batch_bytes``, ``rescan_interval``,
            ``on_rejected``, ``on_error``: :class:`~nsq_spark.spool._drain.SpoolDrain`).
        sender: what the drain sends through; closed with this transport (and at once if
            the store cannot be opened).
    """

    def __init__(self, options: ProducerOptions, sender: Sender) -> None:
        assert options.spool_dir is not None
        self.max_msg_size = options.max_msg_size
        self._closed = False
        self._lock = threading.Lock()   # close() from two threads closes once
        try:
            self.store = SegmentStore(options.spool_dir, fsync=options.spool_fsync,
                                      max_bytes=options.spool_max_bytes,
                                      full=options.spool_full,
                                      block_timeout=options.spool_block_timeout,
                                      on_corrupt=options.on_corrupt)
        except BaseException:
            sender.close()
            raise
        self.spool_dir = self.store.directory
        # the spool retries without end (and without losing anything): no deadline, no count
        self.drain = SpoolDrain(
            self.store, sender,
            retry=RetryPolicy(max_tries=None, deadline=None, wait=0.05,
                              max_wait=options.retry_max_wait),
            message_id_digest=options.message_id_digest, batch_size=options.batch_size,
            batch_bytes=options.batch_bytes, rescan_interval=options.rescan_interval,
            on_rejected=options.on_rejected, on_error=options.on_error)
        self._sender = sender
        self._rejected_seen = 0   # rejections already reported by flush()
        # take over leftovers now, so that flush() right after start covers them
        self.store.claim_orphans()
        self.drain.start()

    # -- appending ---------------------------------------------------------------------

    def _records(self, topic: str, bodies: Iterable[Any], defer_ms: int | None,
                 many: bool) -> list[Record]:
        """The direct path's checks (``protocol.check_topic``/``_check_body``), in its
        order (PUB: body first, MPUB: topic first); a bytes topic is spooled as its str."""
        if many:   # named as protocol.mpub names them
            topic = protocol.check_topic(topic)
            records = [(topic, _body(b, self.max_msg_size, f"message body #{i}"), defer_ms)
                       for i, b in enumerate(bodies)]
            if not records:
                raise InvalidBodyError("mpublish needs at least one message body")
            return records
        (body,) = bodies
        body = _body(body, self.max_msg_size, "message body")
        return [(protocol.check_topic(topic), body, defer_ms)]

    def _append(self, records: list[Record]) -> None:
        if self._closed:
            raise SpoolError("this Producer is closed; create a new one")
        self.store.append(records)
        self.drain.wake()

    def publish(self, topic: str, body: bytes, defer_ms: int | None) -> None:
        self._append(self._records(topic, (body,), defer_ms, False))

    def mpublish(self, topic: str, bodies: Sequence[bytes]) -> None:
        self._append(self._records(topic, bodies, None, True))

    def publish_async(self, topic: str, body: bytes, defer_ms: int | None
                      ) -> concurrent.futures.Future[bytes]:
        records = self._records(topic, (body,), defer_ms, False)   # bad input raises here
        return done_future(lambda: self._append(records))

    def mpublish_async(self, topic: str, bodies: Sequence[bytes]
                       ) -> concurrent.futures.Future[Any]:
        records = self._records(topic, bodies, None, True)
        return done_future(lambda: self._append(records))

    async def apublish(self, topic: str, body: bytes, defer_ms: int | None) -> None:
        records = self._records(topic, (body,), defer_ms, False)
        await asyncio.to_thread(self._append, records)   # an fsync must not stall the loop

    async def ampublish(self, topic: str, bodies: Sequence[bytes]) -> None:
        records = self._records(topic, bodies, None, True)
        await asyncio.to_thread(self._append, records)

    def publish_nowait(self, topic: str, body: bytes, defer_ms: int | None
                       ) -> "asyncio.Future[bytes]":
        # Outside a running loop this raises RuntimeError before anything is spooled, as
        # the direct path does. The future is settled here, not a loop turn later
        # (asyncio.wrap_future would be): done() is true on return.
        fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        records = self._records(topic, (body,), defer_ms, False)   # bad input raises here
        try:
            self._append(records)
        except BaseException as exc:  # noqa: BLE001 - handed over, as publish_async does
            fut.set_exception(exc)
        else:
            fut.set_result(b"OK")
        return fut

    # -- flush, redrive --------------------------------------------------------------------

    def flush(self, timeout: float | None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not self.drain.flush(left):
                return False
            # A store holds at most max_claimed leftover segments at a time (crashed
            # producers' files, or what redrive() put back): the queue is empty only
            # when no unlocked segment is left to claim. Segments another live producer
            # holds are that producer's to flush.
            if self.store.claim_orphans() == 0:
                break
            self.drain.wake()
        # on_rejected has been told of what flush reports, unless a callback blocks:
        # then the time given, no more (on_error is not waited for)
        self.drain.callbacks.wait_idle(
            None if deadline is None else max(0.0, deadline - time.monotonic()),
            "on_rejected")
        rejected = self.store.stats.rejected
        fresh, self._rejected_seen = rejected - self._rejected_seen, rejected
        return fresh == 0

    def redrive(self) -> int:
        moved = self.store.redrive().messages
        self.store.claim_orphans()
        self.drain.wake()
        return moved

    # -- state ---------------------------------------------------------------------------

    @property
    def spool_stats(self) -> SpoolStats:
        return self.store.stats

    @property
    def published(self) -> int:
        """The sender's acknowledged commands (0 for a sender that does not count)."""
        return int(getattr(self._sender, "published", 0))

    @property
    def last_error(self) -> BaseException | None:
        return self.drain.last_error

    def pending_bytes(self) -> int:
        return self.store.pending()

    def stats(self) -> dict[str, Any]:
        drain, store, st = self.drain, self.store, self.store.stats
        stats_of = getattr(self._sender, "stats", None)
        inner = stats_of() if callable(stats_of) else None
        return {
            "messages": drain.sent_messages, "bytes": drain.sent_bytes,
            "retries": drain.retries, "errors": st.rejected,
            "nsqd": inner.get("nsqd", {}) if isinstance(inner, dict) else {},
            "spool_pending": store.pending_messages(), "spool_pending_bytes": store.pending(),
            "spool_dir": str(self.spool_dir), "appended": st.appended, "acked": st.acked,
            "rejected": st.rejected, "pending_bytes": store.pending(),
            "bytes_on_disk": store.bytes_on_disk, "orphans_claimed": st.orphans_claimed,
            "segments_deleted": st.segments_deleted, "fsyncs": st.fsyncs,
            "corrupt_segments": [str(c) for c in st.corrupt_segments],
            "redriven": st.redriven, "awaiting_replicas": drain.awaiting_replicas,
            **drain.health_dict(),
            "producer": inner,
        }

    # -- closing -------------------------------------------------------------------------

    def close(self, timeout: float | None = None) -> None:
        """Try for ``timeout`` seconds (default 5) to send what the spool holds; the rest
        stays on disk for the next start. Safe to call twice."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self.store.forked:
            return   # a forked copy: the parent owns the spool, the IO threads are not here
        wait = 5.0 if timeout is None else timeout
        deadline = time.monotonic() + wait
        try:
            if wait > 0:
                self.drain.flush(wait)
        finally:
            # a user callback that blocks gets what is left of the timeout, no more
            self.drain.stop(callbacks_timeout=max(0.0, deadline - time.monotonic()))
            self.store.close()

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)

    async def enter_async(self) -> None:
        return None

    async def exit_async(self) -> None:
        await asyncio.to_thread(self.close)
