"""The Reader: a full-spec NSQ consumer, pynsq-compatible, batch-oriented.

It ties together the connections (:mod:`nsq_spark.conn`), discovery
(:mod:`nsq_spark.lookupd`), and the pure policies (:mod:`nsq_spark.rdy`,
:mod:`nsq_spark.backoff`). Three ways to consume:

* **handler** (pynsq's way): ``Reader(topic, channel, message_handler=f, ...)`` then
  :func:`run`. ``f(message)`` may return True (FIN), False (REQ), None (FIN, see below), or
  an awaitable; it may be a coroutine function; it may call ``message.enable_async()`` and
  answer later, from any thread.
* **batch handler**: ``Reader(..., batch_handler=g)``: ``g(messages)`` gets every message
  of a read chunk at once (a list), for bulk writes downstream. True/None finishes, False
  requeues every message ``g`` did not answer itself; it may be a coroutine function.
* **pull**: no handler. ``reader.get_batch()`` / ``reader.iter_batches()`` run the IO loop
  on a daemon thread and hand out lists of messages; the caller answers them with
  ``reader.finish(msgs)`` / ``reader.requeue(msgs)`` (or per message). Nothing is
  finished automatically in pull mode. ``reader.get_blocks()`` hands out the same messages
  as :class:`~nsq_spark.protocol.MessageBlock` s instead (no object per message: the
  bytes received and the frame offsets), answered with ``finish_blocks`` /
  ``requeue_blocks``; the first pull call chooses between the two for the Reader's life.

Where pynsq and go-nsq differ, the choice made here:

* a handler returning None finishes the message (go-nsq: no error means success; pynsq
  raises on it and leaves the message to time out);
* the default requeue delay is ``requeue_delay * attempts`` seconds (pynsq), capped by
  ``max_requeue_delay`` (go-nsq, 15 min);
* backoff is go-nsq's exponential one (see :mod:`nsq_spark.backoff`), ``max_backoff_duration=0``
  turns it off;
* every lookupd is queried at each poll (see :mod:`nsq_spark.lookupd`); direct nsqd
  addresses are reconnected with exponential backoff and jitter (tenacity), discovered ones
  are found again by an early lookupd poll;
* closing answers everything: RDY 0 and CLS, in-flight handlers get ``drain_timeout``
  seconds to finish, what is still unanswered (and everything pulled but not answered) is
  requeued at once, so nsqd never has to time a message out.

Speed: the connection hands over every message of a read chunk at once; policies run
once per chunk; the per-message path is "call the handler, record the result, queue a
FIN", and FINs of a chunk go out in one write.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import signal
import threading
import time
import weakref
from collections import deque
from typing import Any, Awaitable, Callable, Iterable, Iterator, Sequence

from tenacity import AsyncRetrying, retry_if_exception_type, wait_exponential, wait_random

from .backoff import Action, Backoff
from .config import ConnectionConfig
from .conn import Connection
from .errors import AlreadyRespondedError, ConnectionClosedError, NSQError
from .lookupd import LookupdPoller, Producer, producer_address
from .message import Message
from .protocol import MessageBlock, check_channel, check_topic
from .rdy import ConnRdy, RdyPolicy

log = logging.getLogger(__name__)

__all__ = ["Reader", "run"]

_FIN, _REQ, _TOUCH = 0, 1, 2

# Closing: after CLOSE_WAIT, wait until nothing was received for CLOSE_QUIET seconds (at
# most CLOSE_QUIET_MAX), so that a message nsqd sent after it is requeued (see
# Reader._until_quiet).
CLOSE_QUIET = 0.02
CLOSE_QUIET_MAX = 0.5

MessageHandler = Callable[[Message], Any]
BatchHandler = Callable[[list[Message]], Any]

# Readers alive in this process (run() closes those of its loop on SIGINT/SIGTERM).
_READERS: "weakref.WeakSet[Reader]" = weakref.WeakSet()


class _Slot:
    """One nsqd connection of a Reader, and the Responder of the messages it delivered."""

    __slots__ = ("reader", "address", "host", "port", "conn", "rdy", "fins", "fin_blocks",
                 "reqs", "dirty", "outstanding", "__weakref__")

    def __init__(self, reader: "Reader", host: str, port: int, address: str) -> None:
        self.reader = reader
        self.host = host
        self.port = port
        self.address = address
        self.conn: Connection | None = None
        self.rdy: ConnRdy | None = None  # set once subscribed
        self.fins: list[bytes] = []  # FINs queued during this loop turn
        self.fin_blocks: list[MessageBlock] = []  # block FINs queued during this loop turn
        self.reqs: list[tuple[bytes, int]] = []  # REQs queued during this loop turn
        self.dirty = False
        # messages handed out of the loop's hands (async handlers, pulled): close() must
        # requeue those still unanswered
        self.outstanding: dict[bytes, Message] = {}

    # Responder protocol: any thread
    def on_finish(self, msg: Message) -> None:
        self.reader._respond(self, msg, _FIN, None, True)

    def on_requeue(self, msg: Message, delay_ms: int | None, backoff: bool) -> None:
        self.reader._respond(self, msg, _REQ, delay_ms, backoff)

    def on_touch(self, msg: Message) -> None:
        self.reader._respond(self, msg, _TOUCH, None, False)

    def __repr__(self) -> str:
        return f"<nsqd {self.address}>"


def _is_coroutine_function(f: Any) -> bool:
    return inspect.iscoroutinefunction(f) or inspect.iscoroutinefunction(
        getattr(f, "__call__", None))


class Reader:
    r"""Consumes ``topic``/``channel`` from nsqd instances given directly and/or found
    through nsqlookupd. Accepts pynsq 0.9's arguments with their meanings.

    Args:
        topic, channel: what to subscribe to (validated like nsqd does).
        message_handler: ``f(message)`` per message (see the module doc); may be set later
            with :meth:`set_message_handler` (pynsq), before :func:`run`.
        name: used in log lines (default ``topic:channel``).
        nsqd_tcp_addresses: ``host:port`` strings (or one string) to connect to directly;
            reconnected with exponential backoff and jitter when they drop.
        lookupd_http_addresses: nsqlookupd HTTP addresses (or one string) to poll.
        max_tries: messages delivered more often than this go to :meth:`giving_up`, then
            are finished (requeued if it raises); 0 means never give up.
        max_in_flight: the most messages in flight over all connections, spread evenly;
            0 starts paused (see :meth:`set_max_in_flight`).
        lookupd_poll_interval: seconds between lookupd polls.
        low_rdy_idle_timeout: seconds without a message after which a connection gives
            its RDY up, when ``max_in_flight`` is below the number of connections.
        max_backoff_duration: the longest backoff window in seconds; 0 turns backoff off.
        lookupd_poll_jitter: fraction (0..1) of the poll interval added at random.
        lookupd_connect_timeout, lookupd_request_timeout: seconds, per lookupd request.
        batch_handler: ``g(messages)`` per read chunk instead of ``message_handler``.
        dedup: a Deduplicator (:mod:`nsq_spark.dedup`): messages it has seen are finished
            without reaching the handler; a failed (requeued) message is erased from it so
            its redelivery is handled.
        dedup_key: the key function, or ``"id"`` / ``"body"``; default: the
            deduplicator's own ``key_func`` (its ``key=`` option), else
            :func:`nsq_spark.dedup.by_message_id`.
        max_requeue_delay: cap, in seconds, of the default requeue delay.
        backoff_multiplier: seconds of the first backoff window (doubling per level).
        rdy_redistribute_interval: seconds between RDY redistribution rounds.
        reconnect_initial, reconnect_max: seconds, the exponential reconnect backoff of
            direct nsqd addresses (plus up to ``reconnect_initial`` of jitter).
        drain_timeout: seconds :meth:`close` lets in-flight handlers finish before it
            requeues what is still unanswered.
        \*\*connection_options: :class:`~nsq_spark.config.ConnectionConfig` options, with
            pynsq's names (``heartbeat_interval``, ``snappy``, ``tls_v1``, ``auth_secret``,
            ``requeue_delay``, ...) and pynsq's units: ``heartbeat_interval``,
            ``msg_timeout`` and ``requeue_delay`` in seconds, ``output_buffer_timeout``
            in milliseconds.
    """

    def __init__(
            self,
            topic: str,
            channel: str,
            message_handler: MessageHandler | None = None,
            name: str | None = None,
            nsqd_tcp_addresses: Sequence[str] | str | None = None,
            lookupd_http_addresses: Sequence[str] | str | None = None,
            max_tries: int = 5,
            max_in_flight: int = 1,
            lookupd_poll_interval: float = 60,
            low_rdy_idle_timeout: float = 10,
            max_backoff_duration: float = 128,
            lookupd_poll_jitter: float = 0.3,
            lookupd_connect_timeout: float = 1,
            lookupd_request_timeout: float = 2,
            *,
            batch_handler: BatchHandler | None = None,
            dedup: Any = None,
            dedup_key: Any = None,
            max_requeue_delay: float = 15 * 60,
            backoff_multiplier: float = 1.0,
            rdy_redistribute_interval: float = 5.0,
            reconnect_initial: float = 1.0,
            reconnect_max: float = 60.0,
            drain_timeout: float = 5.0,
            **connection_options: Any) -> None:
        self.topic = check_topic(topic)
        self.channel = check_channel(channel)
        self.name = name or f"{self.topic}:{self.channel}"
        self.nsqd_tcp_addresses = _address_list(nsqd_tcp_addresses, "nsqd_tcp_addresses")
        self.lookupd_http_addresses = _address_list(lookupd_http_addresses,
                                                    "lookupd_http_addresses")
        if not self.nsqd_tcp_addresses and not self.lookupd_http_addresses:
            raise ValueError("Reader needs nsqd_tcp_addresses or lookupd_http_addresses "
                             "(e.g. nsqd_tcp_addresses=['127.0.0.1:4150'])")
        self._direct: list[tuple[str, int]] = [_split_hostport(a) for a in self.nsqd_tcp_addresses]
        if not isinstance(max_tries, int) or max_tries < 0:
            raise ValueError(f"max_tries must be an int >= 0 (0: never give up), got {max_tries!r}")
        self.max_tries = max_tries
        for label, value in (("lookupd_poll_interval", lookupd_poll_interval),
                             ("rdy_redistribute_interval", rdy_redistribute_interval),
                             ("reconnect_initial", reconnect_initial),
                             ("reconnect_max", reconnect_max)):
            if not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"{label} must be a positive number of seconds, got {value!r}")
        if not isinstance(max_requeue_delay, (int, float)) or max_requeue_delay < 0:
            raise ValueError(f"max_requeue_delay must be >= 0 seconds, got {max_requeue_delay!r}")
        if not isinstance(drain_timeout, (int, float)) or drain_timeout < 0:
            raise ValueError(f"drain_timeout must be >= 0 seconds, got {drain_timeout!r}")
        self.lookupd_poll_interval = lookupd_poll_interval
        self.lookupd_poll_jitter = lookupd_poll_jitter
        self.lookupd_connect_timeout = lookupd_connect_timeout
        self.lookupd_request_timeout = lookupd_request_timeout
        self.low_rdy_idle_timeout = low_rdy_idle_timeout
        self.max_backoff_duration = max_backoff_duration
        self.max_requeue_delay_ms = round(max_requeue_delay * 1000)
        self.rdy_redistribute_interval = rdy_redistribute_interval
        self.reconnect_initial = reconnect_initial
        self.reconnect_max = reconnect_max
        self.drain_timeout = drain_timeout

        self.config = ConnectionConfig.from_options(**connection_options)
        self.requeue_delay_ms = round(self.config.requeue_delay * 1000)
        self._policy = RdyPolicy(max_in_flight, low_rdy_idle_timeout)
        self._backoff = Backoff(max_backoff_duration, backoff_multiplier)
        if lookupd_http_addresses:
            # validates poll/jitter/timeouts now rather than on the loop
            LookupdPoller(self.lookupd_http_addresses, self.topic, lambda p: None,
                          lookupd_poll_interval, lookupd_poll_jitter,
                          lookupd_connect_timeout, lookupd_request_timeout)

        self._dedup = dedup
        self._dedup_key: Callable[[Message], Any] | None = None
        if dedup is not None:
            from .dedup import resolve_key  # only when used
            if not callable(getattr(dedup, "check_and_set", None)) or \
                    not callable(getattr(dedup, "erase", None)):
                raise TypeError("dedup must have check_and_set(key) and erase(key) "
                                "(see nsq_spark.dedup)")
            self._dedup_key = resolve_key(
                dedup_key if dedup_key is not None else getattr(dedup, "key_func", None))

        self.message_handler: MessageHandler | None = None
        self.batch_handler: BatchHandler | None = None
        if message_handler is not None and batch_handler is not None:
            raise ValueError("give message_handler or batch_handler, not both")
        if batch_handler is not None:
            if not callable(batch_handler):
                raise TypeError("batch_handler must be callable")
            self.batch_handler = batch_handler
            self._batch_coro = _is_coroutine_function(batch_handler)

        # state (loop thread only, unless noted)
        self._slots: dict[str, _Slot] = {}
        self._direct_keys = {producer_address(hp) for hp in self._direct}
        self._aloop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._thread: threading.Thread | None = None
        self._mode: str | None = None  # "handler", "pull"
        self._pull_blocks = False  # pull mode hands out MessageBlocks (get_blocks)
        self._started = False
        self._start_lock = threading.Lock()
        self._closing = False
        self._closed = False
        self._closed_event: asyncio.Event | None = None
        self._close_future: Any = None
        self._poller: LookupdPoller | None = None
        self._tasks: set[asyncio.Future[Any]] = set()
        self._redist: Any = None
        self._backoff_timer: asyncio.TimerHandle | None = None
        self._dirty: list[_Slot] = []
        self._flush_scheduled = False
        self._oks = 0
        self._fails = 0
        # cross-thread responses: appended by any thread, drained by one loop callback
        self._xq: deque[tuple[_Slot, Message, int, Any, bool]] = deque()
        self._x_scheduled = False
        # pull mode: lists of messages (or MessageBlocks), guarded by _pull_cond
        self._pull_q: deque[Any] = deque()
        self._pull_n = 0
        self._pull_cond = threading.Condition()
        # blocks queued or handed out and not answered (close() requeues them); guarded by
        # _pull_cond, as get_blocks splits blocks on the caller's thread
        self._blocks_out: set[MessageBlock] = set()
        # counters
        self.messages_received = 0
        self.finished = 0
        self.requeued = 0
        self.given_up = 0
        self.duplicates = 0
        self.dropped_responses = 0  # answers for a connection that had closed

        _READERS.add(self)
        if message_handler is not None:
            self.set_message_handler(message_handler)
        elif batch_handler is not None:
            self._schedule_start_on_current_loop()

    # ------------------------------------------------------------------------------------
    # pynsq-compatible surface

    def set_message_handler(self, message_handler: MessageHandler) -> None:
        """Set the per-message handler (pynsq); the Reader starts on the current IO loop."""
        if not callable(message_handler):
            raise TypeError("message_handler must be callable")
        if self._mode == "pull":
            raise NSQError(f"[{self.name}] this Reader is already in pull mode "
                           "(get_batch was called); make another Reader for a handler")
        self.message_handler = message_handler
        self._msg_coro = _is_coroutine_function(message_handler)
        self._schedule_start_on_current_loop()

    def process_message(self, message: Message) -> Any:
        """Runs the handler for one message (pynsq: override to change how it is called)."""
        return self.message_handler(message)  # type: ignore[misc]

    def preprocess_message(self, message: Message) -> Message:
        """pynsq hook: transform a message before validation (default: unchanged)."""
        return message

    def validate_message(self, message: Message) -> bool:
        """pynsq hook: False finishes the message without handling it (default: True)."""
        return True

    def giving_up(self, message: Message) -> None:
        """Called for a message delivered more than ``max_tries`` times, before it is
        finished. Override it to keep the message somewhere (default: a warning log); if it
        raises, the message is requeued instead (as in pynsq) and comes back here."""
        log.warning("[%s] giving up on message %s after %d tries (max_tries %d): %r",
                    self.name, message.id.decode("ascii", "replace"), message.attempts,
                    self.max_tries, message.body[:200])

    @property
    def max_in_flight(self) -> int:
        return self._policy.max_in_flight

    @property
    def total_rdy(self) -> int:
        return self._policy.total_rdy

    @property
    def conns(self) -> dict[str, Connection]:
        """``address -> Connection`` of the subscribed connections (pynsq)."""
        return {k: s.conn for k, s in list(self._slots.items())
                if s.conn is not None and s.rdy is not None}

    def is_starved(self) -> bool:
        """True when some connection has at least 85 % of its RDY count in flight: a
        batching handler should process what it buffered, because nsqd will not send more
        on that connection until messages are answered (the guide's definition)."""
        return self._policy.is_starved()

    def set_max_in_flight(self, max_in_flight: int) -> None:
        """Change ``max_in_flight`` at runtime (any thread); 0 pauses the Reader."""
        if not isinstance(max_in_flight, int) or isinstance(max_in_flight, bool) \
                or max_in_flight < 0:
            raise ValueError(f"max_in_flight must be an int >= 0, got {max_in_flight!r}")
        if self._aloop is None:
            self._policy.set_max_in_flight(max_in_flight)  # no connection yet
            return
        self._call_on_loop(lambda: self._apply(self._policy.set_max_in_flight(max_in_flight)))

    def connect_to_nsqd(self, host: str, port: int) -> None:
        """Connect to one more nsqd (pynsq); not reconnected if it drops."""
        self._call_on_loop(lambda: self._spawn(self._connect_once(host, int(port))))

    def query_lookupd(self) -> None:
        """Poll the lookupds now (pynsq)."""
        if self._poller is not None:
            self._call_on_loop(self._poller.trigger)

    # ------------------------------------------------------------------------------------
    # starting

    def _schedule_start_on_current_loop(self) -> None:
        if self._started or self._mode == "pull":
            return
        from tornado.ioloop import IOLoop
        try:
            asyncio.get_running_loop()
            running = True
        except RuntimeError:
            running = False
        if running:
            IOLoop.current().add_callback(self._start_on_current_loop)
        else:
            # pynsq's way: the reader starts when nsq.run() (or the IOLoop) starts
            _current_ioloop().add_callback(self._start_on_current_loop)

    def _start_on_current_loop(self) -> None:
        with self._start_lock:
            if self._started or self._closing or self._mode == "pull":
                return
            if self.message_handler is None and self.batch_handler is None:
                return
            self._started = True
            self._mode = "handler"
        self._bind_loop()
        self._spawn(self._start_async())

    def _bind_loop(self) -> None:
        self._aloop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._closed_event = asyncio.Event()
        self._pick_dispatch()

    def _pick_dispatch(self) -> None:
        """Choose the per-chunk path once, not per message."""
        if self._mode == "pull":
            self._dispatch = self._dispatch_pull
            return
        if self.batch_handler is not None:
            self._dispatch = self._dispatch_batch
            return
        # pynsq subclass hooks: only pay for them when they are overridden
        cls = type(self)
        hooks = (cls.preprocess_message is not Reader.preprocess_message
                 or cls.validate_message is not Reader.validate_message)
        if cls.process_message is not Reader.process_message or hooks:
            process = self.process_message
            if hooks:
                def call(m: Message) -> Any:
                    pm = self.preprocess_message(m)
                    if not self.validate_message(pm):
                        return True
                    return process(m)
            else:
                call = process
            self._call = call
            self._dispatch = self._dispatch_sync
        elif self._msg_coro:
            self._call = self.message_handler
            self._dispatch = self._dispatch_coro
        else:
            self._call = self.message_handler
            self._dispatch = self._dispatch_sync

    async def _start_async(self) -> None:
        log.info("[%s] starting reader for %s/%s (max_in_flight %d)", self.name, self.topic,
                 self.channel, self._policy.max_in_flight)
        from tornado.ioloop import PeriodicCallback
        self._redist = PeriodicCallback(self._tick, self.rdy_redistribute_interval * 1000)
        self._redist.start()
        for host, port in self._direct:
            self._spawn(self._keep_connected(host, port, first=True))
        if self.lookupd_http_addresses:
            self._poller = LookupdPoller(
                self.lookupd_http_addresses, self.topic, self._on_producers,
                self.lookupd_poll_interval, self.lookupd_poll_jitter,
                self.lookupd_connect_timeout, self.lookupd_request_timeout, name=self.name)
            self._poller.start()

    def _spawn(self, coro: Awaitable[Any]) -> "asyncio.Future[Any]":
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: "asyncio.Future[Any]") -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("[%s] internal task failed: %r", self.name, task.exception())

    def _call_on_loop(self, fn: Callable[[], Any]) -> None:
        if self._aloop is None:
            raise NSQError(f"[{self.name}] the Reader is not running yet (call nsq_spark.run(), "
                           "or use the pull API)")
        if threading.get_ident() == self._loop_thread:
            fn()
        else:
            self._aloop.call_soon_threadsafe(fn)

    # ------------------------------------------------------------------------------------
    # connections

    def _on_producers(self, producers: set[Producer]) -> None:
        if self._closing:
            return
        for host, port in producers:
            if producer_address((host, port)) not in self._slots:
                self._spawn(self._connect_quietly(host, port))

    async def _connect_quietly(self, host: str, port: int) -> None:
        try:
            await self._connect_once(host, port)
        except Exception as exc:  # the next lookupd poll tries again
            log.warning("[%s] cannot connect to nsqd %s:%s (will retry at the next lookupd "
                        "poll): %s", self.name, host, port, exc)

    async def _keep_connected(self, host: str, port: int, first: bool = False) -> None:
        """Connect to a direct nsqd address, retrying with exponential backoff and jitter."""
        addr = producer_address((host, port))
        if not first:
            await asyncio.sleep(self.reconnect_initial)
        retrying = AsyncRetrying(
            wait=(wait_exponential(multiplier=self.reconnect_initial, max=self.reconnect_max)
                  + wait_random(0, self.reconnect_initial)),
            retry=retry_if_exception_type(Exception),
            stop=lambda state: self._closing,
            before_sleep=lambda state: log.warning(
                "[%s] cannot connect to nsqd %s (attempt %d), retrying in %.1fs: %s",
                self.name, addr, state.attempt_number, state.next_action.sleep,
                state.outcome.exception()),
            reraise=True)
        try:
            async for attempt in retrying:
                with attempt:
                    if self._closing:
                        return
                    await self._connect_once(host, port)
        except Exception as exc:  # only when closing
            log.debug("[%s] stopped reconnecting to %s: %s", self.name, addr, exc)

    async def _connect_once(self, host: str, port: int) -> None:
        address = producer_address((host, port))
        if address in self._slots or self._closing:
            return
        slot = _Slot(self, host, port, address)
        self._slots[address] = slot
        deliver = functools.partial(self._on_blocks if self._pull_blocks else self._on_messages,
                                    slot)
        conn = Connection(host, port, self.config,
                          on_blocks=deliver if self._pull_blocks else None,
                          on_messages=None if self._pull_blocks else deliver,
                          on_close=functools.partial(self._on_conn_close, slot),
                          responder=slot)
        slot.conn = conn
        log.info("[%s] connecting to nsqd %s", self.name, address)
        try:
            await conn.connect()
            await asyncio.wait_for(conn.subscribe(self.topic, self.channel),
                                   self.config.response_timeout)
        except BaseException:
            if self._slots.get(address) is slot:
                del self._slots[address]
            slot.conn = None
            conn.abort()
            raise
        if self._closing or conn.closed:
            if self._slots.get(address) is slot:
                del self._slots[address]
            if not conn.closed:
                await conn.close()
            if self._closing:
                return
            raise ConnectionClosedError(f"nsqd at {address} closed the connection right "
                                        "after SUB")  # the caller retries
        if conn.max_rdy_count < self._policy.max_in_flight:
            log.info("[%s] nsqd %s max_rdy_count %d < max_in_flight %d: its share is capped",
                     self.name, address, conn.max_rdy_count, self._policy.max_in_flight)
        st, cmds = self._policy.add(address, max(1, conn.max_rdy_count), self._aloop.time(),
                                    handle=slot)
        slot.rdy = st
        self._apply(cmds)
        log.info("[%s] subscribed to nsqd %s (max_rdy_count %d)", self.name, address,
                 conn.max_rdy_count)

    def _on_conn_close(self, slot: _Slot, conn: Connection, exc: BaseException | None) -> None:
        address = slot.address
        if self._slots.get(address) is slot:
            del self._slots[address]
        if slot.rdy is not None:
            cmds = self._policy.remove(address)
            self._apply(cmds)
        # What it delivered and we did not answer yet: nsqd redelivers it after its
        # msg_timeout (if it still has it: a kill -9 can lose in-flight state), and our
        # answers would be refused now (message ids belong to the connection). Messages
        # already received are still handed out (pull queue, running handlers): handled at
        # least once beats dropped; their answers are counted in dropped_responses.
        lost = len(slot.outstanding)
        slot.outstanding.clear()
        if self._pull_blocks:
            with self._pull_cond:
                gone = [b for b in self._blocks_out if b.responder is slot]
                self._blocks_out.difference_update(gone)
            lost += sum(map(len, gone))
        slot.fins.clear()
        slot.fin_blocks.clear()
        slot.reqs.clear()
        if self._closing or slot.rdy is None:
            # never subscribed: _connect_once failed and its caller (the reconnect loop or
            # the next lookupd poll) retries; another loop here would double them each time
            return
        log.warning("[%s] connection to nsqd %s closed%s%s", self.name, address,
                    f": {exc}" if exc else "",
                    f" ({lost} messages were unanswered; nsqd redelivers them after their "
                    "timeout)" if lost else "")
        if address in self._direct_keys:
            self._spawn(self._keep_connected(slot.host, slot.port))
        elif self._poller is not None:
            self._poller.trigger()

    def _apply(self, cmds: Iterable[tuple[ConnRdy, int]] | None) -> None:
        if not cmds:
            return
        for st, n in cmds:
            conn = st.handle.conn
            if conn is not None and conn.state == "subscribed":
                try:
                    conn.send_rdy(n)
                except Exception as exc:
                    # called from the message callback too: a refused RDY must never keep
                    # the chunk already decoded from being dispatched
                    self._rdy_refused(st, conn, n, exc)

    def _rdy_refused(self, st: ConnRdy, conn: Connection, n: int, exc: Exception) -> None:
        limit = max(0, min(n, conn.max_rdy_count))
        log.error("[%s] nsqd %s: cannot send RDY %d (%s); sending RDY %d instead%s",
                  self.name, conn.address, n, exc, limit,
                  "; this connection gets no messages until nsqd's --max-rdy-count is "
                  "raised above 0" if limit == 0 else "")
        st.max_rdy_count = max(1, conn.max_rdy_count)  # the policy caps to it from now on
        try:
            conn.send_rdy(limit)
        except Exception:
            log.exception("[%s] nsqd %s: RDY %d failed too", self.name, conn.address, limit)

    def _tick(self) -> None:
        if not self._closing:
            self._apply(self._policy.tick(self._aloop.time()))

    # ------------------------------------------------------------------------------------
    # messages: the hot path

    def _delivered(self, slot: _Slot, n: int) -> None:
        """Count ``n`` messages received on ``slot`` and let the RDY policy react."""
        self.messages_received += n
        st = slot.rdy
        if st is not None:
            cmds = self._policy.on_messages(st, n, self._aloop.time())
            if cmds:
                self._apply(cmds)

    def _on_messages(self, slot: _Slot, conn: Connection, msgs: list[Message]) -> None:
        self._delivered(slot, len(msgs))
        if self._closing:
            # in transit when we sent CLS: give them straight back
            for m in msgs:
                m._responded = True
                slot.reqs.append((m.id, 0))
            self._mark(slot)
            self._flush()
            return
        if self._dedup is not None:
            msgs = self._drop_duplicates(slot, msgs)
            if not msgs:
                self._flush()
                return
        self._dispatch(slot, msgs)

    def _on_blocks(self, slot: _Slot, conn: Connection, blocks: list[MessageBlock]) -> None:
        """The pull-blocks twin of _on_messages: same RDY, closing and max_tries rules."""
        self._delivered(slot, sum(map(len, blocks)))
        if self._closing:
            for b in blocks:
                b._responded = True
                slot.reqs.extend([(mid, 0) for mid in b.ids()])
            self._mark(slot)
            self._flush()
            return
        max_tries = self.max_tries
        if max_tries and any(b.max_attempts > max_tries for b in blocks):
            kept: list[MessageBlock] = []
            for b in blocks:
                if b.max_attempts <= max_tries:
                    kept.append(b)
                    continue
                keep = [a <= max_tries for a in b.attempts()]
                for m, ok in zip(b.messages(), keep):
                    if not ok:
                        self._give_up(slot, m)
                kept.extend(b.select(keep))
            blocks = kept
            self._flush()
            if not blocks:
                return
        with self._pull_cond:
            self._blocks_out.update(blocks)
            self._pull_q.extend(blocks)
            self._pull_n += sum(map(len, blocks))
            self._pull_cond.notify()

    def _drop_duplicates(self, slot: _Slot, msgs: list[Message]) -> list[Message]:
        from .dedup import check_and_set_many
        key = self._dedup_key
        try:
            seen = check_and_set_many(self._dedup, [key(m) for m in msgs])  # type: ignore[misc]
        except Exception:
            log.exception("[%s] dedup check failed on %d messages from %s; handling them "
                          "anyway", self.name, len(msgs), slot.address)
            return msgs
        keep = []
        for m, dup in zip(msgs, seen):
            if dup:
                m._responded = True
                slot.fins.append(m.id)
                self.duplicates += 1
            else:
                keep.append(m)
        if len(keep) != len(msgs):
            self._mark(slot)
        return keep

    def _dispatch_sync(self, slot: _Slot, msgs: list[Message]) -> None:
        call = self._call
        fins = slot.fins
        fin = fins.append
        before = len(fins)
        max_tries = self.max_tries
        for m in msgs:
            if max_tries and m.attempts > max_tries:
                self._give_up(slot, m)
                continue
            try:
                r = call(m)
            except Exception:
                log.exception("[%s] handler failed on message %s from %s; requeueing",
                              self.name, m.id.decode("ascii", "replace"), slot.address)
                if not m._responded and not m._async:
                    m._responded = True
                    self._req_on_loop(slot, m, None, True)
                elif not m._responded:
                    slot.outstanding[m.id] = m
                continue
            if m._responded:
                continue
            if m._async:
                slot.outstanding[m.id] = m
                if r is not None and r is not True and r is not False:
                    self._await_result(slot, m, r)
                continue
            if r is True or r is None:
                m._responded = True
                fin(m.id)
            elif r is False:
                m._responded = True
                self._req_on_loop(slot, m, None, True)
            else:  # an awaitable (pynsq: a handler may return a Future or a coroutine)
                m._async = True
                slot.outstanding[m.id] = m
                self._await_result(slot, m, r)
        self._oks += len(fins) - before
        self._mark(slot)
        self._flush()

    def _dispatch_coro(self, slot: _Slot, msgs: list[Message]) -> None:
        max_tries = self.max_tries
        out = slot.outstanding
        for m in msgs:
            if max_tries and m.attempts > max_tries:
                self._give_up(slot, m)
                continue
            m._async = True  # pynsq: coroutine handlers are async; their result still counts
            out[m.id] = m
            self._spawn(self._run_coro(slot, m))
        self._mark(slot)
        self._flush()

    async def _run_coro(self, slot: _Slot, m: Message) -> None:
        try:
            r = await self._call(m)
        except Exception:
            log.exception("[%s] handler failed on message %s from %s; requeueing",
                          self.name, m.id.decode("ascii", "replace"), slot.address)
            r = False
        self._settle_one(slot, m, r)

    def _await_result(self, slot: _Slot, m: Message, r: Any) -> None:
        try:
            fut = _on_loop_future(r, self._aloop)
        except Exception:
            log.error("[%s] handler returned %r for message %s from %s: return True, False, "
                      "None or an awaitable; requeueing", self.name, r,
                      m.id.decode("ascii", "replace"), slot.address)
            self._settle_one(slot, m, False)
            return

        def done(f: "asyncio.Future[Any]") -> None:
            try:
                res = f.result()
            except Exception:
                log.exception("[%s] async handler failed on message %s from %s; requeueing",
                              self.name, m.id.decode("ascii", "replace"), slot.address)
                res = False
            self._settle_one(slot, m, res)
        fut.add_done_callback(done)

    def _settle_one(self, slot: _Slot, m: Message, r: Any) -> None:
        """The final result of an async handling: answer unless the handler did."""
        if m._responded:
            slot.outstanding.pop(m.id, None)
            return
        m._responded = True
        slot.outstanding.pop(m.id, None)
        if r is False:
            self._req_on_loop(slot, m, None, True)
        else:
            slot.fins.append(m.id)
            self._oks += 1
            self._mark(slot)
        self._schedule_flush()

    def _without_given_up(self, slot: _Slot, msgs: list[Message]) -> list[Message]:
        """``msgs`` less those over ``max_tries``, which go to giving_up() (then FIN)."""
        max_tries = self.max_tries
        if not max_tries or not any(m.attempts > max_tries for m in msgs):
            return msgs  # the common case: one pass, no copy
        keep = []
        for m in msgs:
            if m.attempts > max_tries:
                self._give_up(slot, m)
            else:
                keep.append(m)
        return keep

    def _dispatch_batch(self, slot: _Slot, msgs: list[Message]) -> None:
        msgs = self._without_given_up(slot, msgs)
        if not msgs:
            self._flush()
            return
        if self._batch_coro:
            out = slot.outstanding
            for m in msgs:
                out[m.id] = m
            self._spawn(self._run_batch_coro(slot, msgs))
            return
        try:
            r = self.batch_handler(msgs)  # type: ignore[misc]
        except Exception:
            log.exception("[%s] batch handler failed on %d messages from %s; requeueing "
                          "those it did not answer", self.name, len(msgs), slot.address)
            r = False
        if r is not None and r is not True and r is not False:
            out = slot.outstanding
            for m in msgs:
                out[m.id] = m
            self._spawn(self._await_batch(slot, msgs, r))
            return
        self._settle_batch(slot, msgs, r)

    async def _run_batch_coro(self, slot: _Slot, msgs: list[Message]) -> None:
        try:
            r = await self.batch_handler(msgs)  # type: ignore[misc]
        except Exception:
            log.exception("[%s] batch handler failed on %d messages from %s; requeueing "
                          "those it did not answer", self.name, len(msgs), slot.address)
            r = False
        self._settle_batch(slot, msgs, r)

    async def _await_batch(self, slot: _Slot, msgs: list[Message], r: Any) -> None:
        try:
            r = await _on_loop_future(r, self._aloop)
        except Exception:
            log.exception("[%s] batch handler failed on %d messages from %s (it must return "
                          "True, False, None or an awaitable); requeueing those it did not "
                          "answer", self.name, len(msgs), slot.address)
            r = False
        self._settle_batch(slot, msgs, r)

    def _settle_batch(self, slot: _Slot, msgs: list[Message], r: Any) -> None:
        out = slot.outstanding
        if r is False:
            for m in msgs:
                if not m._responded and not m._async:
                    m._responded = True
                    self._req_on_loop(slot, m, None, True)
                    out.pop(m.id, None)
                elif m._responded:
                    out.pop(m.id, None)
                else:
                    out[m.id] = m
        else:
            fins = slot.fins
            before = len(fins)
            if out:
                for m in msgs:
                    if not m._responded and not m._async:
                        m._responded = True
                        fins.append(m.id)
                        out.pop(m.id, None)
                    elif m._responded:
                        out.pop(m.id, None)
                    else:
                        out[m.id] = m
            else:
                fin = fins.append
                for m in msgs:
                    if not m._responded:
                        if m._async:
                            out[m.id] = m
                        else:
                            m._responded = True
                            fin(m.id)
            self._oks += len(fins) - before
        self._mark(slot)
        self._flush()

    def _dispatch_pull(self, slot: _Slot, msgs: list[Message]) -> None:
        n = len(msgs)
        msgs = self._without_given_up(slot, msgs)
        if len(msgs) != n:
            self._mark(slot)
            self._flush()
            if not msgs:
                return
        out = slot.outstanding
        for m in msgs:
            out[m.id] = m
        with self._pull_cond:
            self._pull_q.append(msgs)
            self._pull_n += len(msgs)
            self._pull_cond.notify()

    def _give_up(self, slot: _Slot, m: Message) -> None:
        self.given_up += 1
        try:
            self.giving_up(m)
        except Exception:
            # as pynsq: the message goes back to nsqd (finishing it would drop a message the
            # application failed to put aside); giving_up() gets it again next delivery
            log.exception("[%s] giving_up() failed for message %s from %s; requeueing it",
                          self.name, m.id.decode("ascii", "replace"), slot.address)
            if not m._responded:
                m._responded = True
                slot.outstanding.pop(m.id, None)
                self._req_on_loop(slot, m, None, True)
            return
        if not m._responded:
            m._responded = True
            slot.fins.append(m.id)
            slot.outstanding.pop(m.id, None)
            self._mark(slot)

    # ------------------------------------------------------------------------------------
    # responses

    def _respond(self, slot: _Slot, msg: Message, kind: int, delay: Any, backoff: bool) -> None:
        """Responder entry point, from any thread."""
        if threading.get_ident() == self._loop_thread:
            self._respond_on_loop(slot, msg, kind, delay, backoff)
            return
        loop = self._aloop
        if loop is None or loop.is_closed():
            raise NSQError(f"[{self.name}] the Reader is closed; message "
                           f"{msg.id.decode('ascii', 'replace')} will be redelivered by nsqd "
                           "after its timeout")
        self._xq.append((slot, msg, kind, delay, backoff))
        if not self._x_scheduled:
            self._x_scheduled = True
            try:
                loop.call_soon_threadsafe(self._drain_cross_thread)
            except RuntimeError:  # the loop closed meanwhile
                self._x_scheduled = False
                raise NSQError(f"[{self.name}] the Reader is closed; the message will be "
                               "redelivered by nsqd after its timeout") from None

    def _drain_cross_thread(self) -> None:
        self._x_scheduled = False  # first: an append racing with the drain schedules anew
        q = self._xq
        pop = q.popleft
        while q:
            slot, msg, kind, delay, backoff = pop()
            self._respond_on_loop(slot, msg, kind, delay, backoff)

    def _respond_on_loop(self, slot: _Slot, msg: Message, kind: int, delay: Any,
                         backoff: bool) -> None:
        if kind == _TOUCH:
            conn = slot.conn
            if conn is not None and not conn.closed:
                conn.touch(msg.id)
            return
        if slot.outstanding:
            slot.outstanding.pop(msg.id, None)
        if kind == _FIN:
            slot.fins.append(msg.id)
            self._oks += 1
            self._mark(slot)
        else:
            self._req_on_loop(slot, msg, delay, backoff)
        self._schedule_flush()

    def _req_on_loop(self, slot: _Slot, m: Message, delay: Any, backoff: bool) -> None:
        if delay is None or delay < 0:
            delay = min(self.requeue_delay_ms * m.attempts, self.max_requeue_delay_ms)
        slot.reqs.append((m.id, int(delay)))
        if backoff:
            self._fails += 1
        if self._dedup is not None:
            try:
                self._dedup.erase(self._dedup_key(m))  # type: ignore[misc]
            except Exception:
                log.exception("[%s] dedup erase failed for message %s from %s: its "
                              "redelivery may be dropped as a duplicate", self.name,
                              m.id.decode("ascii", "replace"), slot.address)
        self._mark(slot)

    def _mark(self, slot: _Slot) -> None:
        if not slot.dirty:
            slot.dirty = True
            self._dirty.append(slot)

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._aloop.call_soon(self._flush)  # type: ignore[union-attr]

    def _flush(self) -> None:
        """Send queued FIN/REQ (one buffer append per connection), update RDY bookkeeping,
        and feed the backoff policy one result."""
        self._flush_scheduled = False
        dirty, self._dirty = self._dirty, []
        policy = self._policy
        for slot in dirty:
            slot.dirty = False
            fins, reqs, fin_blocks = slot.fins, slot.reqs, slot.fin_blocks
            if not fins and not reqs and not fin_blocks:
                continue
            slot.fins = []
            slot.reqs = []
            slot.fin_blocks = []
            n_fin = len(fins) + (sum(map(len, fin_blocks)) if fin_blocks else 0)
            conn = slot.conn
            # counted by what the connection took: once its socket is closed (or close()
            # wrote its last buffer) it refuses, and those answers are dropped, not sent
            if conn is None or not conn.writable:
                self.dropped_responses += n_fin + len(reqs)
                continue
            if fins:
                conn.fin_many(fins)
            if fin_blocks:
                conn.fin_blocks(fin_blocks)
            self.finished += n_fin
            for mid, delay in reqs:
                conn.req(mid, delay)
            self.requeued += len(reqs)
            if slot.rdy is not None:
                policy.on_responses(slot.rdy, n_fin, len(reqs))
        fails, oks = self._fails, self._oks
        if fails or oks:
            self._fails = self._oks = 0
            if self._backoff.enabled:
                self._backoff_result(not fails)

    # ------------------------------------------------------------------------------------
    # backoff

    def _backoff_result(self, success: bool) -> None:
        decision = self._backoff.record(success)
        if decision.action is Action.NONE or self._closing:
            return
        if decision.action is Action.EXIT:
            log.info("[%s] backoff complete, resuming normal operation (%d connections)",
                     self.name, len(self._policy.conns))
            self._apply(self._policy.exit_backoff())
            return
        log.warning("[%s] backing off for %.2fs (level %d, %d connections)", self.name,
                    decision.duration, decision.level, len(self._policy.conns))
        self._apply(self._policy.enter_backoff())
        if self._backoff_timer is not None:
            self._backoff_timer.cancel()
        self._backoff_timer = self._aloop.call_later(  # type: ignore[union-attr]
            decision.duration, self._backoff_window_end)

    def _backoff_window_end(self) -> None:
        self._backoff_timer = None
        if self._closing:
            return
        if self._backoff.window_ended():
            log.info("[%s] backoff window over, testing the waters with RDY 1", self.name)
            self._apply(self._policy.test_waters())
        else:
            self._apply(self._policy.exit_backoff())

    # ------------------------------------------------------------------------------------
    # pull API

    def _ensure_pull(self, blocks: bool = False) -> None:
        if self._mode == "pull" and self._thread is not None and self._pull_blocks == blocks:
            return
        with self._start_lock:
            if self._mode == "handler" or self.message_handler is not None \
                    or self.batch_handler is not None:
                raise NSQError(f"[{self.name}] get_batch/iter_batches/get_blocks are for "
                               "Readers without a message_handler or batch_handler")
            if self._closing:
                raise NSQError(f"[{self.name}] the Reader is closed")
            if self._thread is not None:
                if self._pull_blocks != blocks:
                    has, asked = (("MessageBlocks (get_blocks)", "messages") if self._pull_blocks
                                  else ("messages (get_batch)", "MessageBlocks"))
                    raise NSQError(f"[{self.name}] this Reader hands out {has}; it cannot also "
                                   f"hand out {asked}: use one Reader for each")
                return
            if blocks and self._dedup is not None:
                raise NSQError(f"[{self.name}] dedup= works with get_batch and handlers; "
                               "get_blocks hands out raw blocks (deduplicate their ids "
                               "downstream, as the Spark connector does)")
            self._mode = "pull"
            self._pull_blocks = blocks
            self._started = True
            ready = threading.Event()
            errors: list[BaseException] = []

            def main() -> None:
                loop = asyncio.new_event_loop()
                asyncio.set_event_loop(loop)
                try:
                    async def body() -> None:
                        self._bind_loop()
                        ready.set()
                        await self._start_async()
                        assert self._closed_event is not None
                        await self._closed_event.wait()
                    loop.run_until_complete(body())
                except BaseException as exc:  # pragma: no cover - reported to the caller
                    errors.append(exc)
                    log.exception("[%s] reader loop failed", self.name)
                finally:
                    ready.set()
                    try:
                        pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
                        for t in pending:
                            t.cancel()
                        if pending:
                            loop.run_until_complete(asyncio.gather(*pending,
                                                                   return_exceptions=True))
                        loop.run_until_complete(loop.shutdown_asyncgens())
                        # the resolver's executor threads: join them, so that repeated
                        # start/stop leaves no thread behind
                        loop.run_until_complete(loop.shutdown_default_executor())
                    finally:
                        asyncio.set_event_loop(None)
                        loop.close()
                        with self._pull_cond:
                            self._closed = True
                            self._pull_cond.notify_all()

            self._thread = threading.Thread(target=main, name=f"nsq-reader[{self.name}]",
                                            daemon=True)
            self._thread.start()
            ready.wait()
            if errors:
                raise errors[0]

    def start(self, blocks: bool = False) -> "Reader":
        """Start a pull-mode Reader's background loop now (get_batch also does; with
        ``blocks=True``, for get_blocks)."""
        self._ensure_pull(blocks)
        return self

    def get_batch(self, max_messages: int = 1000, timeout: float = 1.0) -> list[Message]:
        """Up to ``max_messages`` messages, waiting at most ``timeout`` seconds for the
        first; ``[]`` if none came. Every returned message must be answered (``finish`` or
        ``requeue``, here or per message); nsqd sends no more than ``max_in_flight``
        unanswered messages."""
        if max_messages < 1:
            raise ValueError(f"max_messages must be >= 1, got {max_messages}")
        self._ensure_pull()
        cond = self._pull_cond
        with cond:
            if not self._wait_pulled(timeout):
                return []
            q = self._pull_q
            if self._pull_n <= max_messages:
                out = [m for b in q for m in b] if len(q) > 1 else q[0]
                q.clear()
                self._pull_n = 0
                return out
            out = []
            while len(out) < max_messages:
                b = q[0]
                need = max_messages - len(out)
                if len(b) <= need:
                    out.extend(b)
                    q.popleft()
                else:
                    out.extend(b[:need])
                    q[0] = b[need:]
            self._pull_n -= len(out)
            return out

    def _wait_pulled(self, timeout: float) -> bool:
        """With _pull_cond held: wait up to ``timeout`` s for something to hand out."""
        deadline = time.monotonic() + timeout
        while self._pull_n == 0:
            if self._closed or self._closing:
                return False
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self._pull_cond.wait(remaining)
        return True

    def get_blocks(self, max_messages: int = 10000, timeout: float = 1.0
                   ) -> list[MessageBlock]:
        """Like :meth:`get_batch`, but the messages come as MessageBlocks (no object per
        message), ``max_messages`` in all at most; ``[]`` if none came within ``timeout``
        seconds. Answer them with :meth:`finish_blocks` / :meth:`requeue_blocks`."""
        if max_messages < 1:
            raise ValueError(f"max_messages must be >= 1, got {max_messages}")
        self._ensure_pull(blocks=True)
        cond = self._pull_cond
        with cond:
            if not self._wait_pulled(timeout):
                return []
            q = self._pull_q
            out: list[MessageBlock] = []
            room = max_messages
            while q and room:
                b = q[0]
                if len(b) <= room:
                    out.append(q.popleft())
                    room -= len(b)
                else:
                    head, tail = b.split(room)
                    if b in self._blocks_out:  # else its connection closed meanwhile
                        self._blocks_out.discard(b)
                        self._blocks_out.update((head, tail))
                    q[0] = tail
                    out.append(head)
                    room = 0
            self._pull_n -= max_messages - room
            return out

    def finish_blocks(self, blocks: Iterable[MessageBlock]) -> None:
        """FIN every message of ``blocks`` (any thread)."""
        self._bulk_blocks(blocks, _FIN, None, True)

    def requeue_blocks(self, blocks: Iterable[MessageBlock], delay_ms: int | None = None,
                       backoff: bool = True) -> None:
        """REQ every message of ``blocks`` (any thread) after ``delay_ms`` milliseconds;
        None: the default policy, per message, as :meth:`requeue`."""
        self._bulk_blocks(blocks, _REQ, delay_ms, backoff)

    def _bulk_blocks(self, blocks: Iterable[MessageBlock], kind: int, delay: Any,
                     backoff: bool) -> None:
        blocks = list(blocks)
        if not blocks:
            return
        for b in blocks:
            if b._responded:
                raise AlreadyRespondedError(f"{b!r} was already answered; nothing of this "
                                            "call was sent")
            if not isinstance(b.responder, _Slot) or b.responder.reader is not self:
                raise NSQError(f"{b!r} was not delivered by this Reader")
        for b in blocks:
            b._responded = True
        self._to_loop(self._bulk_blocks_on_loop, blocks, kind, delay, backoff)

    def _bulk_blocks_on_loop(self, blocks: list[MessageBlock], kind: int, delay: Any,
                             backoff: bool) -> None:
        with self._pull_cond:
            self._blocks_out.difference_update(blocks)
        if kind == _FIN:
            for b in blocks:
                slot = b.responder
                slot.fin_blocks.append(b)  # type: ignore[union-attr]
                self._mark(slot)  # type: ignore[arg-type]
            self._oks += sum(map(len, blocks))
        else:
            for b in blocks:
                slot = b.responder
                if delay is None or delay < 0:
                    for m in b.messages():
                        self._req_on_loop(slot, m, None, backoff)  # type: ignore[arg-type]
                else:
                    slot.reqs.extend([(mid, int(delay)) for mid in b.ids()])  # type: ignore[union-attr]
                    if backoff:
                        self._fails += 1
                    self._mark(slot)  # type: ignore[arg-type]
        self._flush()

    def iter_batches(self, max_messages: int = 1000, timeout: float = 1.0
                     ) -> Iterator[list[Message]]:
        """Yield non-empty batches until none came for ``timeout`` seconds, or the Reader
        closed. Answer each batch before (or while) asking for the next."""
        while True:
            batch = self.get_batch(max_messages, timeout)
            if not batch:
                return
            yield batch

    def finish(self, messages: Iterable[Message]) -> None:
        """FIN many messages at once (any thread)."""
        self._bulk(messages, _FIN, None, True)

    def requeue(self, messages: Iterable[Message], delay_ms: int | None = None,
                backoff: bool = True) -> None:
        """REQ many messages at once (any thread) after ``delay_ms`` MILLISECONDS (unlike
        :meth:`Message.requeue`, whose pynsq ``delay`` is in seconds); None: the default
        policy (``requeue_delay * attempts`` seconds, capped by ``max_requeue_delay``)."""
        self._bulk(messages, _REQ, delay_ms, backoff)

    def _bulk(self, messages: Iterable[Message], kind: int, delay: Any, backoff: bool) -> None:
        msgs = list(messages)
        if not msgs:
            return
        for m in msgs:
            if m._responded:
                raise AlreadyRespondedError(
                    f"message {m.id!r} was already answered; nothing of this batch was sent")
            if not isinstance(m._responder, _Slot) or m._responder.reader is not self:
                raise NSQError(f"message {m.id!r} was not delivered by this Reader")
        for m in msgs:
            m._responded = True
        self._to_loop(self._bulk_on_loop, msgs, kind, delay, backoff)

    def _to_loop(self, fn: Callable[..., None], *args: Any) -> None:
        """Run a bulk answer on the loop: now if on its thread, else as a callback."""
        closed = (f"[{self.name}] the Reader is closed; these messages will be redelivered "
                  "by nsqd after their timeout")
        if self._aloop is None or self._aloop.is_closed():
            raise NSQError(closed)
        if threading.get_ident() == self._loop_thread:
            fn(*args)
        else:
            try:
                self._aloop.call_soon_threadsafe(fn, *args)
            except RuntimeError:
                raise NSQError(closed) from None

    def _bulk_on_loop(self, msgs: list[Message], kind: int, delay: Any, backoff: bool) -> None:
        if kind == _FIN:
            for m in msgs:
                slot = m._responder
                slot.outstanding.pop(m.id, None)  # type: ignore[union-attr]
                slot.fins.append(m.id)  # type: ignore[union-attr]
                self._mark(slot)  # type: ignore[arg-type]
            self._oks += len(msgs)
        else:
            for m in msgs:
                slot = m._responder
                slot.outstanding.pop(m.id, None)  # type: ignore[union-attr]
                self._req_on_loop(slot, m, delay, backoff)  # type: ignore[arg-type]
        self._flush()

    # ------------------------------------------------------------------------------------
    # stats

    def stats(self) -> dict[str, Any]:
        """Per connection RDY, in flight, finished, requeued; totals; backoff state."""
        if self._aloop is not None and not self._aloop.is_closed() \
                and threading.get_ident() != self._loop_thread and self._aloop.is_running():
            import concurrent.futures
            fut: concurrent.futures.Future[dict[str, Any]] = concurrent.futures.Future()

            def snap() -> None:
                try:
                    fut.set_result(self._stats())
                except BaseException as exc:  # pragma: no cover
                    fut.set_exception(exc)
            try:
                self._aloop.call_soon_threadsafe(snap)
                return fut.result(timeout=2.0)
            except Exception:
                pass
        return self._stats()

    def _stats(self) -> dict[str, Any]:
        conns = {}
        for address, slot in list(self._slots.items()):
            st = slot.rdy
            c = slot.conn
            conns[address] = {
                "state": c.state if c is not None else "connecting",
                "rdy": st.rdy if st else 0,
                "in_flight": st.in_flight if st else 0,
                "finished": st.finished if st else 0,
                "requeued": st.requeued if st else 0,
                "messages": c.messages_received if c is not None else 0,
                "max_rdy_count": st.max_rdy_count if st else None,
                # backoff is reader-wide (as in go-nsq/pynsq); shown per connection too
                "backoff": self._policy.mode,
                "last_message_age": (round(self._aloop.time() - st.last_msg_at, 3)
                                     if st and self._aloop and not self._aloop.is_closed()
                                     else None),
            }
        return {
            "name": self.name, "topic": self.topic, "channel": self.channel,
            "mode": self._mode, "max_in_flight": self._policy.max_in_flight,
            "total_rdy": self._policy.total_rdy, "in_flight": self._policy.in_flight,
            "rdy_mode": self._policy.mode, "backoff": self._backoff.state(),
            "messages_received": self.messages_received, "finished": self.finished,
            "requeued": self.requeued, "given_up": self.given_up,
            "duplicates": self.duplicates, "dropped_responses": self.dropped_responses,
            "pull_queued": self._pull_n, "connections": conns,
            "lookupd": ({"polls": self._poller.polls, "failing": dict(self._poller.failures)}
                        if self._poller else None),
        }

    # ------------------------------------------------------------------------------------
    # closing

    def close(self, timeout: float | None = None) -> Any:
        """Stop consuming and answer everything (see the module doc).

        From a thread other than the loop's (pull mode, scripts) it blocks until done (at
        most ``timeout`` seconds, default ``drain_timeout`` plus 10). On the loop thread
        (handler mode, e.g. inside a handler) it starts closing and returns a Future."""
        if self._aloop is None or not self._started:
            self._closing = self._closed = True
            with self._pull_cond:
                self._pull_cond.notify_all()
            return None
        if threading.get_ident() == self._loop_thread:
            if self._close_future is None:
                self._close_future = asyncio.ensure_future(self._aclose())
            return self._close_future
        if self._aloop.is_closed():
            return None
        import concurrent.futures
        wait = self.drain_timeout + 10 if timeout is None else timeout
        try:
            fut = asyncio.run_coroutine_threadsafe(self.aclose(), self._aloop)
        except RuntimeError:
            fut = None
        if fut is not None:
            try:
                fut.result(wait)
            except (concurrent.futures.TimeoutError, concurrent.futures.CancelledError):
                log.warning("[%s] close did not finish within %.1fs", self.name, wait)
        if self._thread is not None:
            self._thread.join(wait)
        return None

    async def aclose(self) -> None:
        """Close from a coroutine on the Reader's loop (or use :meth:`close`)."""
        if self._close_future is None:
            self._close_future = asyncio.ensure_future(self._aclose())
        await asyncio.shield(self._close_future)

    async def _aclose(self) -> None:
        self._closing = True
        log.info("[%s] closing (%d connections)", self.name, len(self._slots))
        with self._pull_cond:
            self._pull_cond.notify_all()
        if self._redist is not None:
            self._redist.stop()
        if self._backoff_timer is not None:
            self._backoff_timer.cancel()
            self._backoff_timer = None
        if self._poller is not None:
            await self._poller.stop()
        for task in list(self._tasks):  # pending connects and reconnect loops
            if not task.done() and task is not asyncio.current_task():
                code = getattr(task, "get_coro", lambda: None)()
                name = getattr(code, "__name__", "")
                if name in ("_keep_connected", "_connect_quietly", "_connect_once"):
                    task.cancel()
        slots = [s for s in self._slots.values() if s.conn is not None and s.rdy is not None]
        # 1. stop deliveries: RDY 0 and CLS (nsqd answers CLOSE_WAIT and sends no more)
        cls = []
        for s in slots:
            conn = s.conn
            if conn.state == "subscribed":  # type: ignore[union-attr]
                conn.send_rdy(0)  # type: ignore[union-attr]
                cls.append(conn.send_cls())  # type: ignore[union-attr]
        if cls:
            await asyncio.wait(cls, timeout=self.config.close_timeout)
            await self._until_quiet([s.conn for s in slots])  # type: ignore[misc]
        # 2. let in-flight handlers finish (handler mode); pulled messages are not waited for
        if self._mode == "handler":
            deadline = time.monotonic() + self.drain_timeout
            while any(s.outstanding for s in slots) and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            if self._xq:
                self._drain_cross_thread()
        else:
            # answers already on their way from other threads
            if self._xq:
                self._drain_cross_thread()
        # 3. requeue whatever is still unanswered, at once
        unhandled: list[Message] = []
        for s in slots:
            for m in list(s.outstanding.values()):
                if not m._responded:
                    m._responded = True
                    s.reqs.append((m.id, 0))
                    unhandled.append(m)
            s.outstanding.clear()
            self._mark(s)
        with self._pull_cond:
            blocks = [b for b in self._blocks_out if not b._responded]
            self._blocks_out.clear()
        for b in blocks:
            b._responded = True
            slot = b.responder
            slot.reqs.extend([(mid, 0) for mid in b.ids()])  # type: ignore[union-attr]
            self._mark(slot)  # type: ignore[arg-type]
        n_req = len(unhandled) + sum(map(len, blocks))
        if unhandled and self._dedup is not None:
            # never handled: a deduplicator that outlives this Reader must not take their
            # redelivery for a duplicate (and finish it unhandled)
            from .dedup import erase_many
            try:
                erase_many(self._dedup, [self._dedup_key(m) for m in unhandled])  # type: ignore[misc]
            except Exception:
                log.exception("[%s] dedup erase failed for %d messages requeued on close",
                              self.name, n_req)
        with self._pull_cond:
            self._pull_q.clear()
            self._pull_n = 0
        if n_req:
            log.info("[%s] requeued %d unanswered messages on close", self.name, n_req)
        self._flush()
        # 4. answers given from other threads up to now (bulk ones arrive as loop callbacks,
        # single ones through _xq): let the callbacks run, drain, flush, and only then close
        # the sockets (Connection.close still sends what is queued while it closes)
        await asyncio.sleep(0)
        if self._xq:
            self._drain_cross_thread()
        self._flush()
        closing = [s.conn.close() for s in list(self._slots.values()) if s.conn is not None]
        if closing:
            await asyncio.gather(*closing, return_exceptions=True)
        self._closed = True
        with self._pull_cond:
            self._pull_cond.notify_all()
        if self._closed_event is not None:
            self._closed_event.set()
        log.info("[%s] closed", self.name)

    async def _until_quiet(self, conns: list[Connection]) -> None:
        """After CLOSE_WAIT: read on until the connections are quiet for CLOSE_QUIET s.

        nsqd's message pump may have taken a message from the channel just before our
        RDY 0 and send it after CLOSE_WAIT. Received while closing, it is requeued at once
        (see _on_messages); received after the socket closed, nsqd would keep it in flight
        until its msg_timeout."""
        loop = self._aloop
        assert loop is not None
        deadline = loop.time() + CLOSE_QUIET_MAX
        while True:
            now = loop.time()
            wait = max((c.last_recv for c in conns), default=0.0) + CLOSE_QUIET - now
            if wait <= 0 or now >= deadline:
                return
            await asyncio.sleep(min(wait, deadline - now))

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> "Reader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"<Reader {self.name} mode={self._mode} conns={len(self._slots)} "
                f"max_in_flight={self._policy.max_in_flight}>")


# ---------------------------------------------------------------------------------------
# helpers


def _address_list(value: Any, label: str) -> list[str]:
    if not value:
        return []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple, set, frozenset)):
        raise TypeError(f"{label} must be a string or a list of strings, got {type(value).__name__}")
    out = []
    for a in value:
        if not isinstance(a, str) or not a.strip():
            raise ValueError(f"{label} entries must be non-empty 'host:port' strings, got {a!r}")
        out.append(a.strip())
    return out


def _split_hostport(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"nsqd address {address!r} must be 'host:port', e.g. '127.0.0.1:4150'")
    return host.strip("[]"), int(port)


def _on_loop_future(r: Any, loop: Any) -> "asyncio.Future[Any]":
    """A handler's awaitable result as a future whose callbacks run on ``loop``: a
    ``concurrent.futures.Future`` (``return executor.submit(...)``) would run them in the
    worker thread that completes it."""
    import concurrent.futures

    from tornado.gen import convert_yielded
    if isinstance(r, concurrent.futures.Future):
        return asyncio.wrap_future(r, loop=loop)
    return convert_yielded(r)


def _current_ioloop() -> Any:
    """This thread's IOLoop, made if there is none (newer Pythons no longer create an
    event loop implicitly outside a running one)."""
    import warnings

    from tornado.ioloop import IOLoop
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            return IOLoop.current()
        except RuntimeError:
            asyncio.set_event_loop(asyncio.new_event_loop())
            return IOLoop.current()


# ---------------------------------------------------------------------------------------
# run()


def run() -> None:
    """Run the current IO loop until SIGINT or SIGTERM (pynsq's ``nsq.run()``), then close
    every Reader on it cleanly (answer everything, CLS) and return. A second signal stops
    at once."""
    ioloop = _current_ioloop()
    aloop = ioloop.asyncio_loop  # type: ignore[attr-defined]
    stopping = False

    async def shutdown() -> None:
        readers = [r for r in list(_READERS) if r._aloop is aloop and not r._closed]
        await asyncio.gather(*(r.aclose() for r in readers), return_exceptions=True)
        ioloop.stop()

    def on_signal(signum: int) -> None:
        nonlocal stopping
        log.info("signal %s received, closing readers", signal.Signals(signum).name)
        if stopping:
            ioloop.stop()
            return
        stopping = True
        asyncio.ensure_future(shutdown())

    installed = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            aloop.add_signal_handler(sig, on_signal, sig)
            installed.append(sig)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread
            pass
    try:
        ioloop.start()
    finally:
        for sig in installed:
            aloop.remove_signal_handler(sig)
