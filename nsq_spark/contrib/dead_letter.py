"""A ``giving_up`` handler that sends given-up messages to a dead-letter topic.

A Reader hands a message delivered more than ``max_tries`` times to its ``giving_up``
hook; the default logs it and FINishes it, so the message is gone. :class:`DeadLetter`
instead republishes it, with why and how often it failed, to a dead-letter topic through
a :class:`~nsq_spark._publish.producer.Producer`, and answers the original only once that
copy is safe::

    dead = DeadLetter("orders.dead", nsqd_tcp_addresses="127.0.0.1:4150")
    reader = Reader("orders", "billing", dead.watch(handle), max_tries=5, ...)
    dead.attach(reader)      # reader.giving_up = dead; source topic/channel from reader

The rule, so that nothing is dropped:

* the message is FINished only after nsqd acknowledged the dead-letter publish, or, with
  ``spool_dir``, once the record is durably in the local spool (the spool then delivers
  it, see :mod:`nsq_spark.spool`);
* if the publish fails (the dead-letter nsqd is down, the record is refused, the producer
  is closed) the message is REQueued (without backoff: the handler did not fail, the
  dead-letter path did), the failure is logged at ERROR with the nsqd address(es), and
  the next delivery comes back here (its attempts are still over ``max_tries``);
* the publish is asynchronous (:meth:`Message.enable_async`): the Reader's loop is not
  blocked while nsqd answers. With ``spool_dir`` there is no answer to wait for, but the
  append to the spool (and its fsync, per the producer's ``spool_fsync``) happens inside
  the hook, on the Reader's loop: about 0.25 ms per give-up with ``"always"`` on a local
  disk of this machine class, under 10 us with ``"never"``; and a full spool
  (``spool_full="block"``) holds the loop until it has room: without limit for the
  producer DeadLetter builds, up to ``spool_block_timeout`` for a Producer you give (then
  the message is requeued). The message is FINished after that append returns. Keep
  the producer's ``publish_timeout`` below nsqd's ``--msg-timeout`` (default 60 s; ours
  defaults to 10 s), or nsqd may time the original out and redeliver it while its copy
  is still being published: NSQ is at-least-once, and so is the dead-letter topic (a
  record may be stored twice; its ``id`` tells).

The reason: the last exception the handler raised for this message (or "handler returned
False") when this process saw it, through :meth:`DeadLetter.watch`; else ``"max_tries"``
(a reason is remembered in memory only, for at most ``remember_reasons`` messages).

Record format (:class:`DeadLetterRecord`, one decision, in this module only)::

    nsq-dead-letter/1 {"id": ..., "attempts": ..., "reason": ..., ...}\\n<original body>

a fixed ASCII prefix, one line of JSON (the header: ``json.dumps`` escapes every newline,
so the first ``\\n`` ends it), then the original body byte for byte. Why not JSON with a
base64 body: the body stays unchanged (no 33 % growth that could push a message accepted
at nsqd's ``--max-msg-size`` over it; a redrive is a slice, not a decode), a text body
stays readable in ``nsq_tail``, and the header is still plain JSON for any tool. The
header's field names are the Spark source's column names where they mean the same (``id``,
``attempts``, ``timestamp``, ``nsqd_address``, ``topic``, ``channel``; the Spark source
writes its own dead letters as Arrow files with those columns, see ``deadLetterPath``),
plus ``reason`` and ``given_up_at``. :func:`read_dead_letter` reads a record back.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import json
import os
import threading
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence, TypeVar

from nsq_spark import _validate as validate
from nsq_spark._log import get_logger
from nsq_spark._consumer.handlers import is_coroutine_function
from nsq_spark.errors import ConfigError, NSQError
from nsq_spark.protocol import check_channel, check_topic

if TYPE_CHECKING:
    from nsq_spark.message import Message

log = get_logger("nsq_spark.contrib.dead_letter")

__all__ = ["DeadLetter", "DeadLetterRecord", "DeadLetterFormatError", "DeadLetterPublisher",
           "read_dead_letter", "MAGIC", "MAX_REASON_CHARS", "MAX_REMEMBERED_REASONS"]

#: what every record starts with; the ``1`` is the format's version.
MAGIC = b"nsq-dead-letter/1 "

#: a reason longer than this many characters is cut (a traceback-sized exception message
#: must not push the record over nsqd's ``--max-msg-size``).
MAX_REASON_CHARS = 1000

#: the most messages whose last handler failure :class:`DeadLetter` remembers.
MAX_REMEMBERED_REASONS = 1_000_000

_HEADER_FIELDS: dict[str, type | tuple[type, ...]] = {"id": str, "attempts": int, "reason": str, "topic": (str, type(None)),
                  "channel": (str, type(None)), "nsqd_address": (str, type(None)),
                  "timestamp": int, "given_up_at": int}

H = TypeVar("H", bound=Callable[..., Any])


class DeadLetterFormatError(NSQError, ValueError):
    """Bytes given to :func:`read_dead_letter` are not a dead-letter record (or a damaged
    one): the message says what is wrong."""


@dataclasses.dataclass(frozen=True)
class DeadLetterRecord:
    """One given-up message, as published to the dead-letter topic.

    Attributes:
        id: the original message id (16 hex characters), as nsqd assigned it.
        attempts: deliveries of the original when it was given up.
        reason: the handler's last failure (``"ValueError: ..."``), ``"handler returned
            False"``, or ``"max_tries"`` when not known.
        topic, channel: where the original was consumed (None if not given).
        nsqd_address: ``host:port`` of the nsqd that delivered the original (None if
            unknown).
        timestamp: when nsqd first received the original, nanoseconds since the epoch.
        given_up_at: when it was given up, nanoseconds since the epoch.
        body: the original body, unchanged.
    """

    id: str
    attempts: int
    reason: str
    topic: str | None
    channel: str | None
    nsqd_address: str | None
    timestamp: int
    given_up_at: int
    body: bytes

    @classmethod
    def from_message(cls, message: "Message", reason: str, topic: str | None = None,
                     channel: str | None = None, given_up_at: int | None = None
                     ) -> "DeadLetterRecord":
        """The record of ``message`` (``given_up_at`` default: now)."""
        return cls(id=message.id.decode("ascii", "replace"), attempts=message.attempts,
                   reason=reason[:MAX_REASON_CHARS], topic=topic, channel=channel,
                   nsqd_address=message.nsqd_address, timestamp=message.timestamp,
                   given_up_at=time.time_ns() if given_up_at is None else given_up_at,
                   body=bytes(message.body))

    def encode(self) -> bytes:
        """The bytes published: :data:`MAGIC`, the JSON header line, the body."""
        header = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                  if f.name != "body"}
        # ensure_ascii: the header is one line of ASCII whatever the reason says
        return b"".join((MAGIC, json.dumps(header, separators=(",", ":")).encode("ascii"),
                         b"\n", self.body))

    @classmethod
    def decode(cls, data: bytes | bytearray | memoryview) -> "DeadLetterRecord":
        """The record in ``data`` (a dead-letter message's body); DeadLetterFormatError
        if it is not one."""
        raw = bytes(data)
        if not raw.startswith(MAGIC):
            raise DeadLetterFormatError(
                f"not a dead-letter record: it does not start with {MAGIC!r} (it starts "
                f"{raw[:24]!r}); read only messages of a topic DeadLetter publishes to")
        end = raw.find(b"\n", len(MAGIC))
        if end < 0:
            raise DeadLetterFormatError("damaged dead-letter record: its header line has no "
                                        "end (no newline after the JSON header)")
        try:
            header = json.loads(raw[len(MAGIC):end])
        except ValueError as exc:
            raise DeadLetterFormatError(f"damaged dead-letter record: its header is not "
                                        f"JSON ({exc})") from None
        if not isinstance(header, dict):
            raise DeadLetterFormatError("damaged dead-letter record: its header is not a "
                                        "JSON object")
        for name, kind in _HEADER_FIELDS.items():
            value = header.get(name)
            if not isinstance(value, kind) or isinstance(value, bool):
                raise DeadLetterFormatError(
                    f"damaged dead-letter record: header field {name!r} is {value!r}, "
                    f"expected {getattr(kind, '__name__', 'a string or null')}")
        return cls(body=raw[end + 1:], **{k: header[k] for k in _HEADER_FIELDS})


def read_dead_letter(data: bytes | bytearray | memoryview) -> DeadLetterRecord:
    """Read a dead-letter message's body back into a :class:`DeadLetterRecord`
    (``record.body`` is the original body; republish it to ``record.topic`` to redrive).
    Raises DeadLetterFormatError for anything else."""
    return DeadLetterRecord.decode(data)


class DeadLetterPublisher(Protocol):
    """What :class:`DeadLetter` needs of a producer (a
    :class:`~nsq_spark._publish.producer.Producer` is one)."""

    @property
    def nsqd_tcp_addresses(self) -> Sequence[str]: ...

    @property
    def nsqd_http_addresses(self) -> Sequence[str]: ...

    def publish_async(self, topic: str, body: bytes, defer_ms: int | None = None
                      ) -> "concurrent.futures.Future[bytes]": ...

    def close(self, timeout: float | None = None) -> None: ...


class DeadLetter:
    """A Reader's ``giving_up`` hook that republishes given-up messages to ``topic``.

    Args:
        topic: the dead-letter topic (a valid nsqd topic name).
        producer: publish through this producer (anything with ``publish_async``, see
            :class:`DeadLetterPublisher`); it stays yours: :meth:`close` leaves it open.
            Give it, or ``nsqd_tcp_addresses``.
        nsqd_tcp_addresses: build a Producer to these nsqd (``"host:port"``, a list, or
            a comma-separated string); :meth:`close` closes it.
        spool_dir: with ``nsqd_tcp_addresses``: spool through this directory (the message
            is then FINished once its record is durably in the spool; the spool delivers
            it even across restarts). Default None: FIN after nsqd's acknowledgement.
        source_topic, source_channel: written into each record (:meth:`attach` fills them
            from the Reader). Default None.
        publish_timeout: seconds one dead-letter publish of the built producer may take,
            retries included; default 10, more than 0 and at most 3600. Keep it below
            nsqd's ``--msg-timeout``. Refused together with ``producer`` (set it on that
            Producer).
        requeue_delay: seconds before nsqd redelivers a message whose dead-letter publish
            failed; default None: the Reader's default (``requeue_delay * attempts``,
            capped by ``max_requeue_delay``); 0 to at most 3600.
        remember_reasons: how many messages' last handler failure :meth:`watch` keeps
            (oldest forgotten first); default 10000, 0 (keep none: the reason is then
            always ``"max_tries"``) to :data:`MAX_REMEMBERED_REASONS`.

    Attributes:
        dead_lettered: messages whose record was acknowledged (or spooled) and that were
            FINished.
        failed: dead-letter publishes that failed (each message was requeued).
    """

    def __init__(self, topic: str, producer: DeadLetterPublisher | None = None, *,
                 nsqd_tcp_addresses: str | Sequence[str] | None = None,
                 spool_dir: str | os.PathLike[str] | None = None,
                 source_topic: str | None = None, source_channel: str | None = None,
                 publish_timeout: float | None = None, requeue_delay: float | None = None,
                 remember_reasons: int = 10_000) -> None:
        self.topic: str = check_topic(topic)
        self.source_topic: str | None = (None if source_topic is None
                                         else check_topic(source_topic))
        self.source_channel: str | None = (None if source_channel is None
                                           else check_channel(source_channel))
        self.requeue_delay: float | None = validate.seconds(
            requeue_delay, "requeue_delay", lo_open=False, hi=3600,
            none="the Reader's default delay")
        self.remember_reasons: int = validate.integer(
            remember_reasons, "remember_reasons", lo=0, hi=MAX_REMEMBERED_REASONS)
        if (producer is None) == (nsqd_tcp_addresses is None):
            raise ConfigError("DeadLetter needs producer=<a Producer> or "
                              "nsqd_tcp_addresses=<host:port list> (one of them), e.g. "
                              "DeadLetter('orders.dead', nsqd_tcp_addresses='127.0.0.1:4150')")
        if producer is not None and (spool_dir is not None or publish_timeout is not None):
            raise ConfigError("spool_dir and publish_timeout build DeadLetter's own producer; "
                              "with producer= set them on that Producer instead")
        self.owns_producer: bool = producer is None
        if producer is None:
            from nsq_spark._publish.producer import Producer

            timeout = validate.seconds(10.0 if publish_timeout is None else publish_timeout,
                                       "publish_timeout", hi=3600)
            producer = Producer(nsqd_tcp_addresses, spool_dir=spool_dir,
                                publish_timeout=timeout, retry_deadline=timeout)
        self.producer: DeadLetterPublisher = producer
        self.dead_lettered = 0
        self.failed = 0
        self._lock = threading.Lock()
        self._reasons: OrderedDict[tuple[str | None, bytes], str] = OrderedDict()

    def __repr__(self) -> str:
        return (f"<DeadLetter {self.source_topic}/{self.source_channel} -> {self.topic} "
                f"via {self._nsqd()}>")

    # -- wiring --------------------------------------------------------------------------

    def attach(self, reader: Any) -> "DeadLetter":
        """Make this the ``giving_up`` hook of ``reader`` (a Reader, or anything with
        ``topic``, ``channel`` and an assignable ``giving_up``); records then name the
        reader's topic and channel unless given. Returns self."""
        if self.source_topic is None:
            self.source_topic = reader.topic
        if self.source_channel is None:
            self.source_channel = reader.channel
        reader.giving_up = self
        return self

    def watch(self, handler: H) -> H:
        """Wrap a message handler (plain, ``async def``, or an object with an ``async def
        __call__``) so that its last failure for a message -- an exception, or returning
        False -- becomes that message's reason when it is given up. The wrapper returns or
        raises what ``handler`` does."""
        # the consumer's own test (it looks at __call__ too): a wrapper that only called
        # an async __call__ would see a coroutine, never the failure inside it
        if is_coroutine_function(handler):
            @functools.wraps(handler)
            async def watched_async(message: "Message") -> Any:
                try:
                    result = await handler(message)
                except Exception as exc:
                    self._note_outcome(message, raised=exc)
                    raise
                self._note_outcome(message, result)
                return result
            return watched_async  # type: ignore[return-value]

        @functools.wraps(handler)
        def watched(message: "Message") -> Any:
            try:
                result = handler(message)
            except Exception as exc:
                self._note_outcome(message, raised=exc)
                raise
            self._note_outcome(message, result)
            return result
        return watched  # type: ignore[return-value]

    def _note_outcome(self, message: "Message", result: Any = None,
                      raised: Exception | None = None) -> None:
        # the one rule of both wrappers: an exception, or a False result, is a failure
        if raised is not None:
            self.note_failure(message, raised)
        elif result is False:
            self.note_failure(message, "handler returned False")

    def note_failure(self, message: "Message", reason: BaseException | str) -> None:
        """Remember why handling ``message`` failed (for handlers :meth:`watch` cannot
        wrap, e.g. batch handlers)."""
        if not self.remember_reasons:
            return
        text = reason if isinstance(reason, str) else f"{type(reason).__name__}: {reason}"
        key = (message.nsqd_address, message.id)
        with self._lock:
            reasons = self._reasons
            reasons[key] = text[:MAX_REASON_CHARS]
            reasons.move_to_end(key)
            while len(reasons) > self.remember_reasons:
                reasons.popitem(last=False)

    def reason_for(self, message: "Message") -> str:
        """The reason a record of ``message`` would carry now."""
        with self._lock:
            return self._reasons.get((message.nsqd_address, message.id), "max_tries")

    # -- the hook ----------------------------------------------------------------------------

    def __call__(self, message: "Message") -> None:
        """The ``giving_up`` hook: publish the record, then FIN (or REQ if that failed)."""
        record = DeadLetterRecord.from_message(message, self.reason_for(message),
                                               self.source_topic, self.source_channel)
        message.enable_async()  # answered below, once the publish is settled
        try:
            future = self.producer.publish_async(self.topic, record.encode())
        except Exception as exc:  # bad input, a closed producer, a full spool ("raise")
            self._failed(message, exc)
            return
        future.add_done_callback(lambda f: self._settle(message, f))

    def _settle(self, message: "Message", future: "concurrent.futures.Future[bytes]") -> None:
        # on the producer's IO thread (or here, when the spool settled it at once)
        exc = (NSQError("the dead-letter publish was cancelled") if future.cancelled()
               else future.exception())
        if exc is not None:
            self._failed(message, exc)
            return
        with self._lock:
            self.dead_lettered += 1
            self._reasons.pop((message.nsqd_address, message.id), None)
        try:
            message.finish()
        except NSQError as fin_exc:  # the Reader closed meanwhile: nsqd redelivers it
            log.for_nsqd(message.nsqd_address or "unknown").warning(
                "message %s is on dead-letter topic %r but could not be finished "
                "(%s); nsqd will deliver it again, and it will be dead-lettered "
                "twice", message.id.decode("ascii", "replace"), self.topic, fin_exc)

    def _failed(self, message: "Message", exc: BaseException) -> None:
        with self._lock:
            self.failed += 1
        log.for_nsqd(message.nsqd_address or "unknown").error(
            "could not publish message %s (attempts %d, from %s) to dead-letter topic "
            "%r via nsqd %s: %s; requeueing it (it comes back here on its next "
            "delivery)", message.id.decode("ascii", "replace"), message.attempts,
            message.nsqd_address, self.topic, self._nsqd(), exc)
        try:
            message.requeue(self.requeue_delay, backoff=False)
        except NSQError as req_exc:  # the Reader closed meanwhile: nsqd redelivers it
            log.for_nsqd(message.nsqd_address or "unknown").warning(
                "message %s could not be requeued either (%s); nsqd will deliver "
                "it again after its timeout", message.id.decode("ascii", "replace"), req_exc)

    def _nsqd(self) -> str:
        p = self.producer
        return ",".join([*p.nsqd_tcp_addresses, *p.nsqd_http_addresses]) or "?"

    # -- closing ------------------------------------------------------------------------

    def close(self, timeout: float | None = None) -> None:
        """Close the producer if this object built it (a given one stays open)."""
        if self.owns_producer:
            self.producer.close(timeout)

    def __enter__(self) -> "DeadLetter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
