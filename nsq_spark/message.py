"""The NSQ message as handed to applications (pynsq-compatible surface).

A :class:`Message` is built once per delivered message on the hot path, so it is a plain
``__slots__`` object with a cheap constructor; the response methods delegate to a
:class:`Responder` (the Reader's link to one connection, or a bare Connection) that knows
how to send FIN/REQ/TOUCH.

The state the consumer machinery shares with the application is public, so no part of
the library reaches into privates: ``responder``, ``responded`` (answered, by whoever:
the application or the consumer) and ``delegated`` (the application called
:meth:`Message.enable_async` and answers itself). Plain attributes, not methods: the
consumer reads and sets them once per message on its hot path.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from .errors import AlreadyRespondedError, NSQError


def _is_number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


@runtime_checkable
class Responder(Protocol):
    """What answers nsqd for a message. Implementations must accept calls from any thread
    (they hop onto their IO loop themselves)."""

    address: str

    def on_finish(self, msg: "Message") -> None: ...

    def on_requeue(self, msg: "Message", delay_ms: int | None, backoff: bool) -> None:
        """REQ after ``delay_ms`` milliseconds (None: the responder's default policy)."""

    def on_touch(self, msg: "Message") -> None: ...


class Message:
    """One message delivered by nsqd.

    Attributes:
        id: the 16 ASCII (hex) bytes nsqd assigned; FIN/REQ/TOUCH use it verbatim.
        body: the payload.
        timestamp: when nsqd received it, nanoseconds since the epoch.
        attempts: delivery attempts so far (1 on first delivery).
        publish_id: the 16-byte identifier of the publish this message is a copy of, when
            its publisher stamped one (``Producer(publish_ids=True)`` or ``replicas``:
            the publish envelope, :mod:`nsq_spark.envelope`); every copy of one publish
            (replicas on other nsqds, retries, redeliveries) has the same. None for a
            plain body and for a damaged envelope (whose body is then handed over whole).
            The Reader opens the envelope before the handler sees the message, so
            ``body`` is the body that was published.
        trace: ``(traceparent, tracestate)`` a publish envelope carried, else None.
        dedup_key: the key a Reader's deduplicator claimed the message under
            (``Reader(dedup=...)``), set before the handler sees it; its commit or
            release uses this key whatever the handler does to the message. Unset (an
            AttributeError) without dedup: ``getattr(message, "dedup_key", None)``.

    Equality and hashing are by identity, as in pynsq: messages can be kept in sets and
    as dict keys (e.g. a batch of pending ones); compare ``(id, body, timestamp,
    attempts)`` to compare contents.
    """

    __slots__ = ("id", "body", "timestamp", "attempts", "responder", "responded", "delegated",
                 "publish_id", "trace", "dedup_key")

    # left unset by __init__ (a slot costs nothing until set): only the dedup gate sets it
    dedup_key: "bytes | str"

    def __init__(self, id: bytes, body: bytes, timestamp: int, attempts: int,
                 responder: Responder | None = None) -> None:
        self.id = id
        self.body = body
        self.timestamp = timestamp
        self.attempts = attempts
        self.responder = responder
        self.responded = False  # FIN or REQ was sent or queued (touch does not count)
        self.delegated = False  # enable_async(): the handler's return value is ignored
        self.publish_id: bytes | None = None  # set when a publish envelope is opened
        self.trace: tuple[str, str | None] | None = None

    # earlier private spellings, kept for code written against them
    @property
    def _responder(self) -> Responder | None:
        return self.responder

    @property
    def _responded(self) -> bool:
        return self.responded

    @property
    def _async(self) -> bool:
        return self.delegated

    # -- pynsq-compatible API ---------------------------------------------------------------

    def finish(self) -> None:
        """Tell nsqd the message was processed (FIN). Raises if already responded."""
        responder = self._respond("finish")
        responder.on_finish(self)

    def requeue(self, delay: float | None = None, backoff: bool = True, *,
                delay_ms: int | None = None) -> None:
        """Give the message back to nsqd (REQ) for redelivery after ``delay`` SECONDS (int
        or float), as in pynsq; None or -1 (pynsq's "not given"): the responder's default,
        ``requeue_delay * attempts`` seconds capped by ``max_requeue_delay``. Or give
        ``delay_ms`` in milliseconds instead (not both). ``backoff`` lets the Reader count
        this as a failure for its backoff policy. Raises if already responded."""
        if delay_ms is not None:
            if delay is not None:
                raise TypeError("requeue() takes delay (seconds) or delay_ms (milliseconds), "
                                "not both")
            if not _is_number(delay_ms) or delay_ms < 0:
                raise ValueError(f"requeue(delay_ms=...) must be >= 0 milliseconds, not "
                                 f"{delay_ms!r}")
            ms: int | None = int(delay_ms)
        elif delay is None or (_is_number(delay) and delay < 0):
            ms = None  # pynsq's delay=-1: the attempt-based default
        elif _is_number(delay):
            ms = round(delay * 1000)  # the one seconds -> milliseconds conversion
        else:
            raise TypeError(f"requeue(delay=...) takes seconds (int or float), not {delay!r}")
        responder = self._respond("requeue")
        responder.on_requeue(self, ms, backoff)

    def touch(self) -> None:
        """Reset nsqd's timeout for this in-flight message (TOUCH)."""
        if self.responded:
            raise AlreadyRespondedError(f"message {self.id!r} was already responded to; cannot touch it")
        if self.responder is None:
            raise NSQError(f"message {self.id!r} has no connection to answer on (decoded by hand?)")
        self.responder.on_touch(self)

    def enable_async(self) -> None:
        """Take over responding: the handler's return value is then ignored by the Reader."""
        self.delegated = True

    def is_async(self) -> bool:
        return self.delegated

    def has_responded(self) -> bool:
        return self.responded

    @property
    def nsqd_address(self) -> str | None:
        """``"host:port"`` of the nsqd that delivered this message (None if unknown)."""
        r = self.responder
        return r.address if r is not None else None

    # -- helpers ----------------------------------------------------------------------------

    def _respond(self, what: str) -> Responder:
        if self.responded:
            raise AlreadyRespondedError(
                f"message {self.id!r} was already responded to; cannot {what} it again")
        responder = self.responder
        if responder is None:
            raise NSQError(f"message {self.id!r} has no connection to answer on (decoded by hand?)")
        self.responded = True
        return responder

    def __repr__(self) -> str:
        return (f"Message(id={self.id!r}, attempts={self.attempts}, timestamp={self.timestamp}, "
                f"body={self.body[:32]!r}{'...' if len(self.body) > 32 else ''})")
