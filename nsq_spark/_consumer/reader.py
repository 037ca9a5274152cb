"""The Reader: a full-spec NSQ consumer, pynsq-compatible, batch-oriented.

Four ways to consume:

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
* **asyncio iteration**: no handler, no thread. ``async for message in reader`` and
  ``async for batch in reader.batches(n, timeout)`` on the running loop, answered like
  pulled messages (see :mod:`nsq_spark._consumer.aiter`).

In flight means what the guide and pynsq mean: a message is in flight from the moment it
is handed to a handler (or queued for a puller) until it is answered, and
:meth:`Reader.is_starved` follows from it: the guide's batching pattern (buffer with
``enable_async()``, finish the buffer when ``reader.is_starved()``) gets batches of about
85 % of the connection's RDY.

Where pynsq and go-nsq differ, the choice made here:

* a handler returning None finishes the message (go-nsq: no error means success; pynsq
  raises on it and leaves the message to time out);
* the default requeue delay is ``requeue_delay * attempts`` seconds (pynsq), capped by
  ``max_requeue_delay`` (go-nsq, 15 min);
* backoff is exponential as go-nsq's, its first window ``backoff_multiplier`` seconds
  (go-nsq's is twice its multiplier: see :mod:`nsq_spark._consumer.backoff`),
  ``max_backoff_duration=0`` turns it off;
* every lookupd is queried at each poll (see :mod:`nsq_spark._lookupd`); direct nsqd
  addresses are reconnected with exponential backoff and jitter (tenacity), discovered ones
  are found again by an early lookupd poll;
* pynsq's hooks (``process_message``, ``preprocess_message``, ``validate_message``,
  ``heartbeat``, ``disabled``) count whether a subclass overrides them or a program
  assigns them on the instance (``r.validate_message = f``), before or after start: the
  strategy is chosen again when one is assigned, so no hook costs anything per message
  unless set; ``query_lookupd()`` and ``connect_to_nsqd()`` are the discovery path (each
  poll calls the first, each producer chosen goes through the second: see
  :mod:`~nsq_spark._consumer.discovery`), and go-nsq's run-time controls are here
  (``disconnect_from_nsqd``, ``connect_to_lookupd``, ``disconnect_from_lookupd``);
* closing answers everything: RDY 0 and CLS, in-flight handlers get ``drain_timeout``
  seconds to finish, what is still unanswered (and everything pulled but not answered) is
  requeued at once, so nsqd never has to time a message out.

The Reader is a facade: it validates, keeps pynsq's signature and hooks, wires the parts
and orders closing; it is not on the way of a message (the pool hands every read chunk to
the intake gate, which hands what passes to the strategy or the pull queue chosen at
start). The parts are handed their collaborators and never import it:
:mod:`~nsq_spark._consumer.pool` (connections, RDY, discovery; it makes connections through
the port of :mod:`~nsq_spark._consumer.connection_port`),
:mod:`~nsq_spark._consumer.discovery` (which discovered nsqds to connect to: pure),
:mod:`~nsq_spark._consumer.intake` (the gate every delivery passes),
:mod:`~nsq_spark._consumer.dedup_gate`,
:mod:`~nsq_spark._consumer.answers` (the ledger of each connection: FIN/REQ/TOUCH, in
flight; the only writer of it), :mod:`~nsq_spark._consumer.handlers` (strategies),
:mod:`~nsq_spark._consumer.pull`, :mod:`~nsq_spark._consumer.aiter`,
:mod:`~nsq_spark._consumer.rdy` and :mod:`~nsq_spark._consumer.backoff` (the pure policies
and the backoff windows), :mod:`~nsq_spark._consumer.lifecycle` (the one "closing?" value
the parts read), :mod:`~nsq_spark._consumer.instrument` (OpenTelemetry, made only when
``telemetry`` is given), :mod:`~nsq_spark._consumer.run`, and :mod:`nsq_spark._loop` (threads <->
loop).

Speed: the connection hands over every message of a read chunk at once; policies run
once per chunk; the per-message path is "count it in flight, call the handler, record the
result, queue a FIN", and FINs of a chunk go out in one write.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Iterable, Iterator, Sequence

from .._log import get_logger
from .._loop import LoopBridge, TaskGroup, current_ioloop, start_loop_thread
from .. import _validate as validate
from .._addresses import (parse_address, parse_address_list, parse_http_address,
                         parse_http_address_list, redact_userinfo)
from .._options import documented
from ..config import READER, ConnectionConfig, ReaderOptions
from ..errors import ConfigError, NSQError
from .._lookupd import LookupdPoller, ProducerInfo, producer_address
from ..message import Message
from ..protocol import MessageBlock, check_channel, check_topic
from ..telemetry import checked as checked_telemetry
from . import handlers, pull
from .aiter import AsyncIteration
from .answers import FIN, REQ, Answers, Link
from .backoff import Backoff, BackoffWindows
from .connection_port import ConnectNsqd, ConsumerConnection, connect_nsqd
from .dedup_gate import DedupGate
from .discovery import DiscoveryFilter, check_discovery_filter
from .instrument import ConsumerInstrument
from .intake import Intake, MessageSink
from .lifecycle import Lifecycle
from .pool import Pool
from .pull import PullQueue, ReceivedPullQueue
from .rdy import RdyPolicy
from .run import register

if TYPE_CHECKING:
    from .._conn import Connection
    from ..dedup.base import ClaimingDeduplicator, Deduplicator, KeyFunc
    from ..telemetry import Telemetry

log = get_logger("nsq_spark.reader")

__all__ = ["Reader"]

#: seconds a run-time control (disconnect_from_nsqd, connect_to_lookupd, ...) called from
#: another thread waits for the IO loop to run it
CONTROL_TIMEOUT = 10.0

MessageHandler = Callable[[Message], Any]
BatchHandler = Callable[[list[Message]], Any]

#: the options' defaults: each is its row's (nsq_spark.config.ReaderOptions)
_R = ReaderOptions()


@documented(READER, before=r"\*\*connection_options")
class Reader:
    r"""Consumes ``topic``/``channel`` from nsqd instances given directly and/or found
    through nsqlookupd. Accepts pynsq 0.9's arguments with their meanings.

    The arguments that are values (``max_tries``, ``max_in_flight``, the lookupd, RDY,
    backoff and reconnect timings, ...) are the rows of
    :class:`~nsq_spark.config.ReaderOptions`, which bound and document each one; their
    descriptions follow the other arguments' below.

    Args:
        topic, channel: what to subscribe to (validated like nsqd does).
        message_handler: ``f(message)`` per message (see the module doc); may be set later
            with :meth:`set_message_handler` (pynsq), before :func:`run`.
        name: used in log lines (default ``topic:channel``).
        nsqd_tcp_addresses: ``host:port`` strings (a list, or one comma-separated string)
            to connect to directly; reconnected with exponential backoff and jitter.
        lookupd_http_addresses: nsqlookupd HTTP addresses (``host:port`` or URLs) to poll.
        batch_handler: ``g(messages)`` per read chunk instead of ``message_handler``.
        dedup: a deduplicator (:mod:`nsq_spark.dedup`), used as claim, then commit: each
            message's key is claimed (a lease of the connection's ``msg_timeout``) before
            the handler sees it, committed when it was handled (finished), released when
            it is requeued. A message whose key is committed is finished without
            reaching the handler (``duplicates``); one whose key another consumer holds
            a live claim on is requeued for about what is left of that lease, without
            backoff, and not counted toward ``max_tries`` (``held``); a consumer killed
            inside its handler loses nothing: its claim ends with the lease. A
            deduplicator with only ``check_and_set`` / ``erase`` is adapted
            (:func:`nsq_spark.dedup.claiming` says what it then promises).
        dedup_key: the key function, or ``"id"`` / ``"publish_id"`` / ``"body"``;
            default: the deduplicator's own ``key_func`` (its ``key=`` option), else
            :func:`nsq_spark.dedup.by_message_id`. ``"publish_id"`` is the key for a
            replicated topic (``Producer(replicas=N)``): the copies of one publish on
            several nsqds are one message.
        connection_factory: makes each nsqd connection
            (:class:`~nsq_spark._consumer.connection_port.ConnectNsqd`); default: a real
            :class:`~nsq_spark._conn.Connection`. For tests and instrumentation.
        discovery_filter: ``f(records) -> records``, go-nsq's ``DiscoveryFilter``: called
            at the end of each lookupd poll with the producers found, and before that
            each time a lookupd's answer adds some while others have not answered
            (:class:`~nsq_spark._lookupd.ProducerInfo` records, topology-preferred order),
            it returns those to connect to (keep, drop, reorder); default None: all of
            them. A result that is not such records is logged as a
            :class:`~nsq_spark._consumer.discovery.DiscoveryFilterError` and that poll
            connects to none; connections already open stay. See
            :mod:`~nsq_spark._consumer.discovery`.
        topology_zone, topology_region: (connection options, see
            :class:`~nsq_spark.config.ConnectionConfig`; default None: no preference) this
            consumer's zone and region, sent in IDENTIFY; discovery also orders the
            producers lookupd reports: same zone first, then same region, then the rest.
            That order is all it changes (what ``discovery_filter`` sees and the order of
            the ``connect_to_nsqd`` calls): it never drops a producer, every chosen one is
            connected, and ``max_in_flight`` is shared equally among all connections. To
            connect to same-zone nsqds only, give a ``discovery_filter`` that keeps the
            records whose ``topology_zone`` is yours when there are any (example in
            docs/discovery.md).
        telemetry: a :class:`~nsq_spark.telemetry.Telemetry`: OpenTelemetry metrics and
            spans of this Reader (``process``/``receive`` spans linked to the producers'
            send spans, ``message.body`` freed of the traced envelope). Pulled messages
            are counted and get their ``receive`` span when ``get_batch`` /
            ``iter_batches`` / ``async for`` hands them out, not when they arrive.
            ``get_blocks``: each hand-out is counted and gets a ``receive`` span, without
            links, and the blocks' bodies are *not* opened (a traced envelope stays in the
            bytes). Default None: not instrumented, and nothing of it on the delivery or
            pull path.
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
            max_tries: int = _R.max_tries,
            max_in_flight: int = _R.max_in_flight,
            lookupd_poll_interval: float = _R.lookupd_poll_interval,
            low_rdy_idle_timeout: float = _R.low_rdy_idle_timeout,
            max_backoff_duration: float = _R.max_backoff_duration,
            lookupd_poll_jitter: float = _R.lookupd_poll_jitter,
            lookupd_connect_timeout: float = _R.lookupd_connect_timeout,
            lookupd_request_timeout: float = _R.lookupd_request_timeout,
            *,
            batch_handler: BatchHandler | None = None,
            dedup: "ClaimingDeduplicator | Deduplicator | None" = None,
            dedup_key: KeyFunc | str | None = None,
            max_requeue_delay: float = _R.max_requeue_delay,
            backoff_multiplier: float = _R.backoff_multiplier,
            rdy_redistribute_interval: float = _R.rdy_redistribute_interval,
            reconnect_initial: float = _R.reconnect_initial,
            reconnect_max: float = _R.reconnect_max,
            drain_timeout: float = _R.drain_timeout,
            connection_factory: ConnectNsqd | None = None,
            backoff_strategy: str = _R.backoff_strategy,
            low_rdy_timeout: float | None = _R.low_rdy_timeout,
            concurrency: int = _R.concurrency,
            discovery_filter: DiscoveryFilter | None = None,
            telemetry: "Telemetry | None" = None,
            open_envelopes: bool = _R.open_envelopes,
            lookupd_max_producers: int = _R.lookupd_max_producers,
            lookupd_authorization: bool = _R.lookupd_authorization,
            **connection_options: Any) -> None:
        self.topic = check_topic(topic)
        self.channel = check_channel(channel)
        self.name = name or f"{self.topic}:{self.channel}"
        self._log = log.bind(reader=self.name, topic=self.topic, channel=self.channel)
        direct = parse_address_list(nsqd_tcp_addresses, "nsqd_tcp_addresses")
        lookupd = parse_http_address_list(
            lookupd_http_addresses, "lookupd_http_addresses", "127.0.0.1:4161")
        if not direct and not lookupd:
            raise ConfigError("Reader needs nsqd_tcp_addresses or lookupd_http_addresses "
                             "(e.g. nsqd_tcp_addresses=['127.0.0.1:4150'])")
        # every option, by its row (the one rule); the parts are handed these
        self._options = options = ReaderOptions.of(locals())
        self.max_tries = options.max_tries
        self.lookupd_poll_interval = options.lookupd_poll_interval
        self.lookupd_poll_jitter = options.lookupd_poll_jitter
        # pynsq's round-robin index of the lookupd to query next: we query all of them at
        # each poll; an override of query_lookupd that polls one at a time uses it
        self.lookupd_query_index = 0
        self.lookupd_connect_timeout = options.lookupd_connect_timeout
        self.lookupd_request_timeout = options.lookupd_request_timeout
        self.rdy_redistribute_interval = options.rdy_redistribute_interval
        self.reconnect_initial = options.reconnect_initial
        self.reconnect_max = options.reconnect_max
        self.low_rdy_idle_timeout = options.low_rdy_idle_timeout
        self.max_backoff_duration = options.max_backoff_duration
        self.max_requeue_delay_ms = round(options.max_requeue_delay * 1000)
        self.drain_timeout = options.drain_timeout
        self.config = ConnectionConfig.from_options(**connection_options)
        self.requeue_delay_ms = round(self.config.requeue_delay * 1000)

        self.lookupd_max_producers = options.lookupd_max_producers
        self.lookupd_authorization = options.lookupd_authorization
        # go-nsq's LookupdAuthorization: the AUTH secret as a bearer to lookupd
        lookupd_secret = self.config.auth_secret if self.lookupd_authorization else None

        def make_poller(addresses: list[str], on_records: Callable[[list[ProducerInfo]], Any],
                        poll: Callable[[], Any]) -> LookupdPoller:
            return LookupdPoller(
                addresses, self.topic, lambda producers: None, options.lookupd_poll_interval,
                options.lookupd_poll_jitter, options.lookupd_connect_timeout,
                options.lookupd_request_timeout, name=self.name, on_records=on_records,
                poll=poll, auth_secret=lookupd_secret)
        check_discovery_filter(discovery_filter)

        # chosen once: an instrument, or nothing on the delivery path
        telemetry = checked_telemetry(telemetry, "Reader")
        self._instrument = None if telemetry is None else ConsumerInstrument(
            telemetry, self.topic, self.channel)
        self._dedup = dedup_gate = DedupGate.build(dedup, dedup_key, self.name)
        self._dedup_key = dedup_gate.key if dedup_gate is not None else None

        if message_handler is not None and batch_handler is not None:
            raise ValueError("give message_handler or batch_handler, not both")
        if batch_handler is not None and not callable(batch_handler):
            raise TypeError("batch_handler must be callable")
        self.message_handler: MessageHandler | None = None
        self.batch_handler: BatchHandler | None = batch_handler

        # the parts
        # every move of the phase wakes the pull queue's getters (built below, before any
        # move can happen)
        self._lifecycle = lifecycle = Lifecycle(wake=lambda: self._pull.wake())
        self._bridge = LoopBridge(f"[{self.name}] the Reader is closed; these messages will "
                                  "be redelivered by nsqd after their timeout")
        self._tasks = TaskGroup(self.name)
        self._policy: RdyPolicy[Link] = RdyPolicy(options.max_in_flight,
                                                  options.low_rdy_idle_timeout,
                                                  low_rdy_timeout=options.low_rdy_timeout)
        self._backoff = Backoff(options.max_backoff_duration, options.backoff_multiplier,
                                options.backoff_strategy)
        self.concurrency = options.concurrency
        # the handler the threads would call: a subclass's process_message override too
        handlers.check_concurrency(self.concurrency, message_handler=message_handler,
                                   batch_handler=batch_handler,
                                   process=_overridden(self, "process_message"))
        for hook in handlers.SYNC_HOOKS:   # a subclass's override (instance ones: below)
            handlers.check_sync_hook(hook, _overridden(self, hook))
        self._strategy: handlers.Strategy | None = None
        self._retired_strategies: list[handlers.Strategy] = []
        self._answers = Answers(self._bridge, self.name, self.requeue_delay_ms,
                                self.max_requeue_delay_ms, dedup=dedup_gate)
        self._intake = Intake(self._answers, lifecycle, options.max_tries,
                              lambda m: self.giving_up(m), self.name, dedup_gate,
                              options.open_envelopes)
        # instrumented: the queue reports what it hands out (receive spans, counts); else
        # the plain queue, nothing of telemetry on the pull path
        self._pull = PullQueue(self._answers, lifecycle) if self._instrument is None else \
            ReceivedPullQueue(self._answers, lifecycle, self._instrument.received,
                              self._instrument.received_blocks)
        self._aiter = AsyncIteration(self._pull, self._bridge,
                                     lambda: self._ensure_pull(here=True), self.name)
        self._pool = Pool(topic=self.topic, channel=self.channel, config=self.config,
                          policy=self._policy, answers=self._answers, lifecycle=lifecycle,
                          bridge=self._bridge, tasks=self._tasks, name=self.name,
                          direct=direct, make_poller=make_poller, options=options,
                          deliveries=self._intake, pulled=self._pull,
                          connect=connection_factory or connect_nsqd,
                          on_heartbeat=_overridden(self, "heartbeat"),
                          disabled=_overridden(self, "disabled"),
                          lookupd=lookupd,
                          # pynsq's discovery path: looked up at each call, so that a
                          # subclass override or an assigned method decides
                          query_lookupd=lambda: self.query_lookupd(),
                          connect_to_nsqd=lambda host, port: self.connect_to_nsqd(host, port),
                          discovery_filter=discovery_filter)
        self._backoff_windows = BackoffWindows(self._backoff, self._policy, self._pool.apply,
                                               self._bridge, lifecycle, self.name)
        self._answers.on_result = self._backoff_windows.record

        self._mode: str | None = None  # "handler", "pull"
        self._started = False
        self._closed_event = asyncio.Event()  # binds to no loop until waited on
        self._close_future: Any = None
        self._thread: Any = None
        self._start_lock = threading.Lock()  # two threads' first get_batch: one loop
        register(self)
        if message_handler is not None:
            self.set_message_handler(message_handler)
        elif batch_handler is not None:
            self._schedule_start()

    # ------------------------------------------------------------------------------------
    # pynsq-compatible surface

    def __setattr__(self, name: str, value: Any) -> None:
        # pynsq programs assign hooks on the instance (``r.validate_message = f``), before
        # or after start; the part that calls the hook is re-wired then, so the hot path
        # keeps choosing once and pays nothing for a hook nobody set
        # refused here, in the caller's thread, not later on the loop
        if name == "process_message" and "concurrency" in vars(self):
            handlers.check_concurrency(self.concurrency, message_handler=self.message_handler,
                                       batch_handler=self.batch_handler, process=value)
        elif name in handlers.SYNC_HOOKS:
            handlers.check_sync_hook(name, value)
        object.__setattr__(self, name, value)
        if name in HOOKS and "_pool" in vars(self):
            self._rewire_hook(name)

    def __delattr__(self, name: str) -> None:
        object.__delattr__(self, name)
        if name in HOOKS and "_pool" in vars(self):
            self._rewire_hook(name)  # back to the class's hook

    def _rewire_hook(self, name: str) -> None:
        hook = _overridden(self, name)
        if name == "heartbeat":
            self._pool.on_heartbeat = hook  # read at each heartbeat
        elif name == "disabled":
            self._pool.disabled = hook  # read at each RDY change and tick
        elif self._mode == "handler" and self._started:
            self._call_on_loop(self._install_strategy)
        # before start: _choose_strategy() reads the hooks when the Reader starts

    def set_message_handler(self, message_handler: MessageHandler) -> None:
        """Set the per-message handler (pynsq); the Reader starts on the current IO loop."""
        if not callable(message_handler):
            raise TypeError("message_handler must be callable")
        if self._mode in ("pull", "async"):
            raise NSQError(f"[{self.name}] this Reader is already pulled (get_batch or async "
                           "for); make another Reader for a handler")
        handlers.check_concurrency(self.concurrency, message_handler=message_handler,
                                   batch_handler=None,
                                   process=_overridden(self, "process_message"))
        self.message_handler = message_handler
        self._schedule_start()

    def process_message(self, message: Message) -> Any:
        """Runs the handler for one message (pynsq: override to change how it is called)."""
        assert self.message_handler is not None
        return self.message_handler(message)

    def preprocess_message(self, message: Message) -> Message:
        """pynsq hook: transform a message before validation (default: unchanged)."""
        return message

    def validate_message(self, message: Message) -> bool:
        """pynsq hook: False finishes the message without handling it (default: True)."""
        return True

    def giving_up(self, message: Message) -> None:
        """pynsq hook for a message delivered more than ``max_tries`` times, before it is
        finished (default: a warning log); if it raises, the message is requeued instead."""
        self._log.warning("[%s] giving up on message %s after %d tries (max_tries %d): %r",
                          self.name, message.id.decode("ascii", "replace"), message.attempts,
                          self.max_tries, message.body[:200])

    def heartbeat(self, conn: Connection) -> None:
        """pynsq hook: called after every heartbeat of a connection (already answered)."""

    @classmethod
    def disabled(cls) -> bool:
        """pynsq hook (deprecated there: prefer ``set_max_in_flight(0)``): while it returns
        True, every connection is held at RDY 0 (checked at each RDY change and tick)."""
        return False

    @property
    def max_in_flight(self) -> int:
        return self._policy.max_in_flight

    @property
    def total_rdy(self) -> int:
        return self._policy.total_rdy

    @property
    def conns(self) -> dict[str, ConsumerConnection]:
        """``address -> Connection`` of the subscribed connections (pynsq)."""
        return {s.address: s.conn for s in self._pool.subscribed() if s.conn is not None}

    def is_starved(self) -> bool:
        """True when some connection has at least 85 % of its RDY count in flight (handed
        to the application, not answered): a batching handler should process what it
        buffered, because nsqd sends no more on that connection until messages are
        answered (the guide's definition)."""
        return self._policy.is_starved()

    def set_max_in_flight(self, max_in_flight: int) -> None:
        """Change ``max_in_flight`` at runtime (any thread); 0 pauses the Reader."""
        if not isinstance(max_in_flight, int) or isinstance(max_in_flight, bool) \
                or max_in_flight < 0:
            raise ValueError(f"max_in_flight must be an int >= 0, got {max_in_flight!r}")
        if not self._bridge.bound:
            self._policy.set_max_in_flight(max_in_flight)  # no connection yet
            return
        self._call_on_loop(lambda: self._pool.apply(self._policy.set_max_in_flight(max_in_flight)))

    @property
    def nsqd_tcp_addresses(self) -> "Addresses":
        """The direct nsqd addresses (``host:port``): reconnected when they drop.

        A snapshot, immutable (a tuple that also compares equal to a list of the same
        addresses): pynsq's ``r.nsqd_tcp_addresses.append(a)`` and assigning it raise
        :class:`~nsq_spark.errors.ConfigError` naming :meth:`connect_to_nsqd` /
        :meth:`disconnect_from_nsqd`, which change what the Reader connects to."""
        return Addresses((producer_address(hp) for hp in self._pool.direct),
                         _NSQD_CONTROLS)

    @nsqd_tcp_addresses.setter
    def nsqd_tcp_addresses(self, value: Any) -> None:
        raise ConfigError(f"[{self.name}] nsqd_tcp_addresses is read-only: "
                          f"{_NSQD_CONTROLS}")

    @property
    def lookupd_http_addresses(self) -> "Addresses":
        """The nsqlookupd HTTP addresses polled; a snapshot, immutable as
        :attr:`nsqd_tcp_addresses` (change them with :meth:`connect_to_lookupd` /
        :meth:`disconnect_from_lookupd`: ``append`` and assignment raise ConfigError
        saying so)."""
        return Addresses(self._pool.lookupd_addresses, _LOOKUPD_CONTROLS)

    @lookupd_http_addresses.setter
    def lookupd_http_addresses(self, value: Any) -> None:
        raise ConfigError(f"[{self.name}] lookupd_http_addresses is read-only: "
                          f"{_LOOKUPD_CONTROLS}")

    def connect_to_nsqd(self, host: str, port: int) -> None:
        """Connect to one more nsqd (pynsq), unless connected already; not reconnected if
        it drops (a lookupd that lists it finds it again).

        It is the discovery path: every producer a lookupd poll chooses goes through it,
        so a subclass override that returns without calling it keeps that nsqd out."""
        validate.text(host, "host", nonempty=True)
        validate.integer(port, "port", lo=1, hi=65535, hint="nsqd's TCP port, e.g. 4150")
        self._call_on_loop(lambda: self._pool.connect_to(host, port))

    def query_lookupd(self) -> Any:
        """Poll every lookupd now (pynsq); no-op before the Reader runs or without lookupd.

        It is the discovery path: the lookupd poller calls it for each scheduled (every
        ``lookupd_poll_interval`` plus jitter) or early poll, so a subclass override
        decides whether and how to poll; the producers found go through
        :meth:`connect_to_nsqd`. On the Reader's loop it returns the poll's Future."""
        if not self._bridge.bound:
            return None
        if self._bridge.on_loop_thread():
            return self._pool.poll_lookupd()
        self._call_on_loop(self._pool.poll_lookupd)
        return None

    def disconnect_from_nsqd(self, address: str) -> None:
        """Close the connection to nsqd ``address`` (``"host:port"``, any thread), go-nsq's
        ``DisconnectFromNSQD``: RDY 0 and CLS, in-flight messages (and MessageBlocks)
        get ``close_timeout`` seconds to be answered, the rest is requeued; what it
        delivered that still waits for ``get_batch`` / ``get_blocks`` is requeued at once
        and never handed out. A direct address is taken off
        :attr:`nsqd_tcp_addresses` and not reconnected; a lookupd that lists the nsqd
        makes the next poll connect to it again (as go-nsq does), unless
        ``discovery_filter`` or a :meth:`connect_to_nsqd` override leaves it out. Unlike
        go-nsq, a connection found through lookupd may be closed this way too.

        Idempotent while that closing runs: calling it again for the same address joins
        the closing in progress (nothing is cut short: handed-out messages keep their
        ``close_timeout``); once the connection has closed, the address is unknown
        (NotConnectedError, below).

        Raises :class:`~nsq_spark.errors.InvalidAddressError` for a malformed address and
        :class:`~nsq_spark.errors.NotConnectedError` when the Reader neither has it as a
        direct address nor is connected to it."""
        a = parse_address(address, "address")
        self._on_loop_result(lambda: self._pool.disconnect_from(a.host, a.port),
                             f"disconnect_from_nsqd({address!r})")

    def connect_to_lookupd(self, address: str) -> bool:
        """Poll one more nsqlookupd (``host:port`` or URL, any thread, before or after
        start), go-nsq's ``ConnectToNSQLookupd``; a running Reader polls soon. False if
        it is polled already. :class:`~nsq_spark.errors.InvalidAddressError` for a
        malformed address."""
        parse_http_address(address, "address", "127.0.0.1:4161")
        return bool(self._on_loop_result(lambda: self._pool.connect_to_lookupd(address),
                                         f"connect_to_lookupd({redact_userinfo(address)!r})"))

    def disconnect_from_lookupd(self, address: str) -> None:
        """Stop polling an nsqlookupd (any thread), go-nsq's ``DisconnectFromNSQLookupd``;
        connections it found stay. :class:`~nsq_spark.errors.NotConnectedError` if it is
        not polled; :class:`~nsq_spark.errors.ConfigError` for the last one of a Reader
        without ``nsqd_tcp_addresses`` (nothing would find nsqds any more; go-nsq refuses
        the last one even with direct addresses)."""
        parse_http_address(address, "address", "127.0.0.1:4161")
        self._on_loop_result(lambda: self._pool.disconnect_from_lookupd(address),
                             f"disconnect_from_lookupd({redact_userinfo(address)!r})")

    def _on_loop_result(self, fn: Callable[[], Any], control: str) -> Any:
        # on the loop (or here before start / on the loop's thread), once; the pool's
        # typed errors reach the caller. Never off the loop while it runs: the pool's
        # lists and tasks are the loop's.
        return self._bridge.result_on_loop(fn, CONTROL_TIMEOUT, (
            f"[{self.name}] {control} was not applied: the Reader's IO loop did not run "
            f"it within {CONTROL_TIMEOUT:g}s, so it is blocked (e.g. by a blocking "
            "message_handler on the loop thread: give the Reader concurrency=N to run it "
            "on N threads); try again once the loop is free"))

    def _call_on_loop(self, fn: Callable[[], Any]) -> None:
        if not self._bridge.bound:
            raise NSQError(f"[{self.name}] the Reader is not running yet (call nsq_spark.run(), "
                           "or use the pull API)")
        self._bridge.call(fn)

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The event loop the Reader runs on (None before it starts)."""
        return self._bridge.loop

    # ------------------------------------------------------------------------------------
    # starting

    def _schedule_start(self) -> None:
        # pynsq's way: on the current IO loop, once it runs (nsq.run())
        if not self._started and self._mode != "pull":
            current_ioloop().add_callback(self._start_handler_mode)

    def _start_handler_mode(self) -> None:
        if self._started or self._lifecycle.closing or self._mode == "pull":
            return
        if self.message_handler is None and self.batch_handler is None:
            return
        self._started = True
        self._mode = "handler"
        self._install_strategy()
        self._start_here()

    def _install_strategy(self) -> None:
        """Choose the handler strategy (at start, and again when a hook is assigned) and
        route deliveries to it; a replaced one is closed after what it was handed."""
        previous, self._strategy = self._strategy, self._choose_strategy()
        if previous is not None:
            previous.close()  # a handler pool finishes its queue, then its threads exit
            # kept, so that close() stops it too from starting what it still has queued
            # (hooks are re-assigned a handful of times in a Reader's life, not per message)
            self._retired_strategies.append(previous)
        deliveries: MessageSink = self._strategy
        if self._instrument is not None:
            deliveries = self._instrument.deliveries(deliveries)
        self._intake.to_messages = deliveries

    def _start_here(self) -> None:
        self._bridge.bind()
        self._log.info("[%s] starting reader for %s/%s (max_in_flight %d)", self.name, self.topic,
                       self.channel, self._policy.max_in_flight)
        self._pool.start()

    def _choose_strategy(self) -> handlers.Strategy:
        """Once, not per message; pynsq's subclass hooks cost only when overridden."""
        return handlers.choose(
            message_handler=self.message_handler, batch_handler=self.batch_handler,
            process=_overridden(self, "process_message"),
            preprocess=_overridden(self, "preprocess_message"),
            validate=_overridden(self, "validate_message"),
            answers=self._answers, bridge=self._bridge, tasks=self._tasks, name=self.name,
            concurrency=self.concurrency, instrument=self._instrument)

    # ------------------------------------------------------------------------------------
    # pull API

    def _ensure_pull(self, blocks: bool = False, here: bool = False) -> None:
        if self._thread is not None and not here and self._pool.blocks == blocks:
            return
        with self._start_lock:
            self._start_pull(blocks, here)

    def _start_pull(self, blocks: bool, here: bool = False) -> None:
        if self._mode == "handler" or self.message_handler is not None \
                or self.batch_handler is not None:
            raise NSQError(f"[{self.name}] get_batch/iter_batches/get_blocks/async for are "
                           "for Readers without a message_handler or batch_handler")
        if self._lifecycle.closing:
            raise NSQError(f"[{self.name}] the Reader is closed")
        if self._started:
            if self._pool.blocks == blocks and (self._mode == "async") == here:
                return  # another thread started it meanwhile
            raise NSQError(f"[{self.name}] pulled one way only (get_batch, MessageBlocks by "
                           "get_blocks, or async for: the first call's): one Reader per way")
        if blocks and self._dedup is not None:
            raise NSQError(f"[{self.name}] dedup= works with get_batch and handlers; "
                           "get_blocks hands out raw blocks (deduplicate their ids "
                           "downstream, as the Spark connector does)")
        self._mode = "async" if here else "pull"
        self._pool.blocks = blocks
        self._started = True
        # telemetry, if any, counts at the hand-out (ReceivedPullQueue), not here
        self._intake.to_messages = self._pull.put_messages
        self._intake.to_blocks = self._pull.put_blocks
        if here:  # asyncio iteration: on the caller's running loop, no thread
            self._start_here()
        else:
            self._thread = start_loop_thread(self._start_here, self._until_closed,
                                             f"nsq-reader[{self.name}]", self._on_thread_exit)

    async def _until_closed(self) -> None:
        await self._closed_event.wait()

    def _on_thread_exit(self) -> None:
        self._lifecycle.finish_closing()

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
        pull.check_max_messages(max_messages)
        self._ensure_pull()
        return self._pull.get_messages(max_messages, timeout)

    def get_blocks(self, max_messages: int = 10000, timeout: float = 1.0, *,
                   max_bytes: int | None = None) -> list[MessageBlock]:
        """Like :meth:`get_batch`, but the messages come as MessageBlocks (no object per
        message), ``max_messages`` in all at most; ``[]`` if none came within ``timeout``
        seconds. ``max_bytes``: no more messages once their bodies reach this many bytes
        (the one that reaches it is the last taken; the rest stay queued for the next
        call). Answer them with :meth:`finish_blocks` / :meth:`requeue_blocks`."""
        pull.check_max_messages(max_messages)
        if max_bytes is not None:
            validate.integer(max_bytes, "max_bytes", lo=1, none="no byte limit")
        self._ensure_pull(blocks=True)
        return self._pull.get_blocks(max_messages, timeout, max_bytes)

    def iter_batches(self, max_messages: int = 1000, timeout: float = 1.0
                     ) -> Iterator[list[Message]]:
        """Yield non-empty batches until none came for ``timeout`` seconds, or the Reader
        closed. Answer each batch before (or while) asking for the next."""
        return pull.iter_batches(self.get_batch, max_messages, timeout)

    def __aiter__(self) -> AsyncIterator[Message]:
        """``async for message in reader`` on the running loop (:mod:`~.aiter`)."""
        return self._aiter.messages()

    def batches(self, max_messages: int = 1000, timeout: float = 1.0) -> AsyncIterator[list[Message]]:
        """``async for batch in reader.batches(...)``: lists, see :mod:`~.aiter`."""
        return self._aiter.batches(max_messages, timeout)

    def finish(self, messages: Iterable[Message]) -> None:
        """FIN many messages at once (any thread)."""
        self._answers.bulk(messages, FIN, None, True)

    def requeue(self, messages: Iterable[Message], delay_ms: int | None = None,
                backoff: bool = True) -> None:
        """REQ many messages at once (any thread) after ``delay_ms`` MILLISECONDS (unlike
        :meth:`Message.requeue`, whose pynsq ``delay`` is in seconds); None: the default
        policy (``requeue_delay * attempts`` seconds, capped by ``max_requeue_delay``)."""
        self._answers.bulk(messages, REQ, delay_ms, backoff)

    def finish_blocks(self, blocks: Iterable[MessageBlock]) -> None:
        """FIN every message of ``blocks`` (any thread)."""
        self._answers.bulk_blocks(blocks, FIN, None, True, self._pull.answered_blocks)

    def requeue_blocks(self, blocks: Iterable[MessageBlock], delay_ms: int | None = None,
                       backoff: bool = True) -> None:
        """REQ every message of ``blocks`` (any thread) after ``delay_ms`` milliseconds;
        None: the default policy, per message, as :meth:`requeue`."""
        self._answers.bulk_blocks(blocks, REQ, delay_ms, backoff, self._pull.answered_blocks)

    def split_blocks(self, blocks: Iterable[MessageBlock], chosen: Sequence[bool]
                     ) -> tuple[list[MessageBlock], list[MessageBlock]]:
        """Blocks handed out by :meth:`get_blocks`, cut in two so that their parts can be
        answered apart (any thread): ``(the chosen messages, the others)``, as blocks,
        ``chosen`` holding one flag per message of ``blocks`` in order. From then on the
        Reader tracks the parts instead of ``blocks`` (``close()`` requeues the parts left
        unanswered); answer the parts, never ``blocks``. AlreadyRespondedError for a
        block answered already."""
        return self._pull.split_blocks(list(blocks), chosen)

    # ------------------------------------------------------------------------------------
    # stats

    # counters (read from any thread)
    messages_received = property(lambda self: self._pool.messages_received)
    finished = property(lambda self: self._answers.finished)
    requeued = property(lambda self: self._answers.requeued)
    given_up = property(lambda self: self._intake.given_up)
    duplicates = property(lambda self: self._dedup.duplicates if self._dedup else 0)
    #: copies requeued because another consumer held a live claim on their key (dedup)
    held = property(lambda self: self._dedup.held if self._dedup else 0)
    dropped_responses = property(lambda self: self._answers.dropped_responses)

    def stats(self) -> dict[str, Any]:
        """Per connection RDY, in flight, finished, requeued; totals; backoff state."""
        return self._bridge.result(self._stats, timeout=2.0)

    def _stats(self) -> dict[str, Any]:
        return _stats_of(self)

    # ------------------------------------------------------------------------------------
    # closing

    def close(self, timeout: float | None = None) -> Any:
        """Stop consuming and answer everything (see the module doc).

        From a thread other than the loop's (pull mode, scripts) it blocks until done (at
        most ``timeout`` seconds, default ``drain_timeout`` plus 10). On the loop thread
        (handler mode, e.g. inside a handler) it starts closing and returns a Future."""
        bridge = self._bridge
        if not bridge.bound or not self._started:
            self._lifecycle.finish_closing()
            return None
        if bridge.on_loop_thread():
            self._lifecycle.begin_closing()  # at once: iterators hand nothing more out
            if self._close_future is None:
                self._close_future = asyncio.ensure_future(self._aclose())
            return self._close_future
        if not bridge.usable:
            return None
        wait = self.drain_timeout + 10 if timeout is None else timeout
        if not bridge.run_coroutine(self.aclose(), wait):
            self._log.warning("[%s] close did not finish within %.1fs", self.name, wait)
        if self._thread is not None:
            self._thread.join(wait)
        return None

    async def aclose(self) -> None:
        """Close from a coroutine on the Reader's loop (or use :meth:`close`)."""
        if self._close_future is None:
            self._close_future = asyncio.ensure_future(self._aclose())
        await asyncio.shield(self._close_future)

    async def _aclose(self) -> None:
        answers = self._answers
        self._lifecycle.begin_closing()  # the parts read it: no deliveries, connects, windows
        self._log.info("[%s] closing (%d connections)", self.name, len(self._pool.links))
        self._backoff_windows.stop()
        # 1. stop deliveries: RDY 0 and CLS (nsqd answers CLOSE_WAIT and sends no more)
        links = await self._pool.stop_deliveries()
        # 2. let in-flight handlers finish (handler mode); pulled messages are not waited for
        if self._mode == "handler":
            deadline = time.monotonic() + self.drain_timeout
            while any(s.outstanding for s in links) and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
        # a handler pool, current or replaced by a hook's re-assignment, starts no more
        # queued messages from here on (its workers exit at the end of its queue): step 3
        # requeues them, never both
        for strategy in (*self._retired_strategies,
                         *([self._strategy] if self._strategy is not None else [])):
            strategy.close(skip_queued=True)
        answers.drain_cross_thread()  # answers already on their way from other threads
        # 3. requeue whatever is still unanswered, at once
        n_req = answers.requeue_outstanding(links, self._pull.take_unanswered_blocks())
        if n_req:
            self._log.info("[%s] requeued %d unanswered messages on close", self.name, n_req)
        answers.flush()
        # 4. answers given from other threads up to now (bulk ones arrive as loop callbacks,
        # single ones through the ledger's queue): let the callbacks run, drain, flush, and
        # only then close the sockets (Connection.close still sends what is queued)
        await asyncio.sleep(0)
        answers.drain_cross_thread()
        answers.flush()
        await self._pool.close_all()
        self._lifecycle.finish_closing()
        self._closed_event.set()
        self._log.info("[%s] closed", self.name)

    @property
    def closed(self) -> bool:
        return self._lifecycle.closed

    def __enter__(self) -> "Reader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"<Reader {self.name} mode={self._mode} conns={len(self._pool.links)} "
                f"max_in_flight={self._policy.max_in_flight}>")


def _stats_of(r: Reader) -> dict[str, Any]:
    """Reader.stats() (on the loop thread)."""
    return {
        "name": r.name, "topic": r.topic, "channel": r.channel,
        "mode": r._mode, "max_in_flight": r._policy.max_in_flight,
        "total_rdy": r._policy.total_rdy, "in_flight": r._policy.in_flight,
        "rdy_mode": r._policy.mode, "backoff": r._backoff.state(),
        "messages_received": r.messages_received, "finished": r.finished,
        "requeued": r.requeued, "given_up": r.given_up,
        "duplicates": r.duplicates, "held": r.held,
        "dropped_responses": r.dropped_responses,
        "damaged_envelopes": r._intake.damaged_envelopes,
        "pull_queued": r._pull.queued, "connections": r._pool.connection_stats(),
        "lookupd": r._pool.lookupd_stats(),
        "connect_errors": r._pool.connect_error_stats(),
    }


_NSQD_CONTROLS = ("to change the nsqds a running Reader reads, call "
                  "reader.connect_to_nsqd(host, port) / reader.disconnect_from_nsqd('host:port')")
_LOOKUPD_CONTROLS = ("to change the lookupds polled, call reader.connect_to_lookupd(address) "
                     "/ reader.disconnect_from_lookupd(address)")


class Addresses(tuple[str, ...]):
    """An immutable snapshot of a Reader's addresses (:attr:`Reader.nsqd_tcp_addresses`,
    :attr:`Reader.lookupd_http_addresses`). pynsq's were lists that a program could
    change in place (``r.lookupd_http_addresses.append(a)``); changing this snapshot
    could not change the Reader, so the list methods raise
    :class:`~nsq_spark.errors.ConfigError` naming the run-time control to call. It
    compares equal to a list or tuple of the same addresses."""

    _controls: str

    def __new__(cls, addresses: Iterable[str] = (), controls: str = "") -> "Addresses":
        self = super().__new__(cls, addresses)
        self._controls = controls
        return self

    def __getnewargs__(self) -> tuple[tuple[str, ...], str]:
        # copy, deepcopy and pickle rebuild it with its controls
        return (tuple(self), self._controls)

    # pynsq's were lists: a new list from them works as it did there
    def __add__(self, other: Iterable[str]) -> list[str]:  # type: ignore[override]
        return [*self, *other]

    def __radd__(self, other: Iterable[str]) -> list[str]:
        return [*other, *self]

    def copy(self) -> list[str]:
        """A plain list of the addresses (pynsq's ``list.copy``)."""
        return list(self)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, list):
            other = tuple(other)
        return tuple.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = tuple.__hash__

    def _read_only(self, *args: Any, **kwargs: Any) -> Any:
        raise ConfigError(f"a Reader's addresses are a read-only snapshot: {self._controls}")

    append = extend = insert = remove = pop = clear = sort = reverse = _read_only
    __setitem__ = __delitem__ = __iadd__ = _read_only


#: pynsq's hooks a program may override in a subclass or assign on an instance
#: (``r.validate_message = f``); assigning one re-wires the part that calls it.
HOOKS = frozenset({"process_message", "preprocess_message", "validate_message",
                   "heartbeat", "disabled"})


def _overridden(reader: Reader, name: str) -> Callable[..., Any] | None:
    """``reader.<name>`` if it is set on the instance or a subclass overrides Reader's,
    else None (so that a hook nobody set costs nothing per message)."""
    if name in vars(reader):
        hook: Callable[..., Any] = vars(reader)[name]
        return hook
    owner = next(c for c in type(reader).__mro__ if name in vars(c))
    return None if owner is Reader else getattr(reader, name)
