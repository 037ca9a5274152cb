"""The connection pool of a consumer: direct nsqd addresses and lookupd discovery,
connect + SUB, the RDY commands of the policy applied to sockets, per-connection close.

* Direct addresses are connected at start and reconnected with exponential backoff and
  jitter (tenacity) when they drop; ``connect_to`` (pynsq's ``connect_to_nsqd``) connects
  once; a dropped connection that is not direct makes the poller poll early.
* Discovery is the owner's (pynsq's) path, handed in as two callables
  (:class:`QueryLookupd`, :class:`ConnectToNsqd`), so that a subclass override or an
  assigned hook decides: every scheduled or triggered poll calls ``query_lookupd()``
  (whose default is :meth:`Pool.poll_lookupd`: one query of every lookupd); the records
  of a poll are chosen by :func:`~nsq_spark._consumer.discovery.choose_producers`
  (topology preference, then the ``discovery_filter``), at most ``max_producers`` of them
  are kept (one WARNING names what was skipped, again only when that changes: a lookupd
  listing thousands of nsqds must not make thousands of connections, nor thousands of
  log lines), and each one kept goes through ``connect_to_nsqd(host, port)`` (whose
  default is :meth:`Pool.connect_to`). A poll may report its records more than once (as
  each lookupd answers: see :mod:`nsq_spark._lookupd`); connecting is idempotent.
* Run-time controls (go-nsq's): :meth:`Pool.disconnect_from` closes one connection and
  takes its address off the direct list (it is not reconnected from there; a lookupd
  that lists it makes the next poll find it again, as in go-nsq, unless the
  ``discovery_filter`` or a ``connect_to_nsqd`` override leaves it out);
  :meth:`Pool.connect_to_lookupd` / :meth:`Pool.disconnect_from_lookupd` change the
  lookupds polled (the last one cannot go when there is no direct address: nothing would
  find nsqds any more). Two deliberate differences from go-nsq, which accepts only direct
  addresses in ``DisconnectFromNSQD`` and never lets the last lookupd go: a discovered
  connection may be closed too, and the last lookupd may go when direct addresses
  remain.
* Connections are made by the ``connect`` factory (:mod:`~nsq_spark._consumer.connection_port`:
  what the consumer needs of a connection; default: the real one), and recorded by the
  answers ledger (:class:`~nsq_spark._consumer.answers.Link`, written by the ledger only).
* A subscribed connection is added to the :class:`~nsq_spark._consumer.rdy.RdyPolicy`; a
  periodic tick redistributes RDY. A RDY that nsqd's ``max_rdy_count`` refuses is lowered
  to it.
* Every read chunk is counted (``messages_received``, the policy's arrival rule) and
  handed to the ``deliveries`` port (the intake gate): ``on_messages(link, messages)`` /
  ``on_blocks(link, blocks)``.
* The last failure to connect or subscribe to each nsqd is kept until it subscribes
  (:meth:`Pool.connect_error_stats`, in ``Reader.stats()["connect_errors"]``), so that a
  caller who waited in vain can say why (AUTH refused, TLS verification failed, refused).
* Two hooks of the owner (pynsq's Reader methods): ``on_heartbeat(conn)`` after every
  heartbeat of a connection, and ``disabled()``: while it returns True every connection is
  held at RDY 0 (checked at each RDY change and each tick); the RDY the policy wanted is
  sent when it returns False again.
* Closing is two steps the owner orders: :meth:`Pool.stop_deliveries` (RDY 0 and CLS, read
  on until quiet) and :meth:`Pool.close_all`; no connect starts once the consumer's
  :class:`~nsq_spark._consumer.lifecycle.Lifecycle` is closing.

The pool is handed its collaborators (policy, ledger, lifecycle, loop bridge, task group,
ports, callbacks) and never imports its owner.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Iterable, Protocol, Sequence

from tenacity import AsyncRetrying, retry_if_exception_type, wait_exponential, wait_random

from .._log import get_logger
from .._addresses import redact_userinfo, strip_userinfo
from ..errors import ConfigError, ConnectionClosedError, NotConnectedError, is_transient
from .._handshake import ConnState
from .._lookupd import ProducerInfo, lookupd_index, producer_address
from .connection_port import ConnectNsqd, ConsumerConnection, connect_nsqd
from .discovery import DiscoveryFilter, DiscoveryFilterError, choose_producers

if TYPE_CHECKING:
    from .._loop import LoopBridge, TaskGroup
    from .._addresses import Address
    from ..config import ConnectionConfig, ReaderOptions
    from ..message import Message
    from ..protocol import MessageBlock
    from .answers import Answers, Link
    from .lifecycle import Lifecycle
    from .rdy import ConnRdy, RdyPolicy

# a child of the Reader's historical logger: its level and handlers still apply
log = get_logger("nsq_spark.reader.pool")

__all__ = ["Pool", "Deliveries", "Pulled", "Poller", "MakePoller", "QueryLookupd", "ConnectToNsqd",
           "CLOSE_QUIET", "CLOSE_QUIET_MAX"]

# Closing: after CLOSE_WAIT, wait until nothing was received for CLOSE_QUIET seconds (at
# most CLOSE_QUIET_MAX), so that a message nsqd sent after it is requeued (see
# Pool._until_quiet).
CLOSE_QUIET = 0.02
CLOSE_QUIET_MAX = 0.5


class Deliveries(Protocol):
    """Where the pool hands every read chunk (the intake gate), on the loop thread."""

    def on_messages(self, link: "Link", msgs: list["Message"]) -> None: ...

    def on_blocks(self, link: "Link", blocks: list["MessageBlock"]) -> None: ...


class Pulled(Protocol):
    """What a puller was handed of a connection, or waits to be handed, outside the
    ledger's record: the pull queue (:class:`~nsq_spark._consumer.pull.PullQueue`), on the
    loop thread. The pool asks it when one connection closes."""

    def take_queued(self, link: "Link") -> tuple[list["Message"], list["MessageBlock"]]:
        """Closing ``link`` on purpose: its messages and blocks not handed out yet leave
        the queue (the pool requeues them)."""
        ...

    def holds_blocks(self, link: "Link") -> bool:
        """Blocks of ``link`` handed out and not answered yet."""
        ...

    def take_unanswered_blocks(self, link: "Link") -> list["MessageBlock"]:
        """Closing ``link`` on purpose: its blocks not answered, forgotten here (the pool
        requeues them)."""
        ...

    def drop_link(self, link: "Link") -> int:
        """``link``'s connection closed: forget its blocks; how many messages they held
        (for the log)."""
        ...


class Poller(Protocol):
    """What the pool needs of a lookupd poller (:class:`~nsq_spark._lookupd.LookupdPoller`).
    Once made, it keeps the list of the lookupds polled (the pool keeps none then)."""

    polls: int
    failures: dict[str, str]
    addresses: list[str]

    def start(self) -> None: ...

    def trigger(self) -> None: ...

    def poll_once(self) -> Awaitable[Any]: ...

    def add_address(self, address: str) -> bool:
        """Poll ``address`` too; False if it is polled already (the same lookupd)."""
        ...

    def remove_address(self, address: str) -> bool:
        """Stop polling ``address``; False if it was not polled."""
        ...

    def stop(self) -> Awaitable[None]: ...


class MakePoller(Protocol):
    """Makes the lookupd poller of ``addresses`` (the owner binds topic, intervals and
    timeouts): it reports each poll's producer records to ``on_records`` and runs
    ``poll()`` for each scheduled or triggered poll."""

    def __call__(self, addresses: list[str],
                 on_records: Callable[[list[ProducerInfo]], Any],
                 poll: Callable[[], Any]) -> Poller: ...


class QueryLookupd(Protocol):
    """The owner's ``query_lookupd()`` (pynsq): one poll; may return an awaitable."""

    def __call__(self) -> Any: ...


class ConnectToNsqd(Protocol):
    """The owner's ``connect_to_nsqd(host, port)`` (pynsq), called per chosen producer."""

    def __call__(self, host: str, port: int) -> Any: ...


class Pool:
    """The connections of one consumer (see the module doc).

    Args:
        deliveries: gets every read chunk (the intake gate).
        connect: makes a connection (:class:`~.connection_port.ConnectNsqd`); default: the
            real :class:`nsq_spark._conn.Connection`.
        pulled: the pull queue (:class:`Pulled`): what it holds of a connection is taken
            out and requeued when that connection closes on purpose, and forgotten when
            a connection is lost.
        on_heartbeat, disabled: pynsq's Reader hooks (see the module doc).
        lookupd: lookupd HTTP addresses polled from start (more may be added at run time).
        make_poller: makes the lookupd poller (:class:`MakePoller`); None: no lookupd
            can be polled.
        query_lookupd, connect_to_nsqd: the owner's discovery path (see the module doc);
            default: :meth:`poll_lookupd` and :meth:`connect_to`.
        options: the Reader's options (:class:`~nsq_spark.config.ReaderOptions`): the
            RDY redistribution interval, the reconnect backoff of direct addresses and
            ``lookupd_max_producers``, the most producers of one poll connected to (see
            the module doc). ``config``'s ``topology_zone`` and ``topology_region`` and
            ``discovery_filter`` choose each poll's producers
            (:mod:`~nsq_spark._consumer.discovery`).
    """

    def __init__(self, *, topic: str, channel: str, config: "ConnectionConfig",
                 policy: "RdyPolicy[Link]", answers: "Answers", lifecycle: "Lifecycle",
                 bridge: "LoopBridge", tasks: "TaskGroup", name: str,
                 direct: Sequence["Address"],
                 make_poller: MakePoller | None, options: "ReaderOptions",
                 deliveries: Deliveries, pulled: Pulled,
                 connect: ConnectNsqd = connect_nsqd,
                 on_heartbeat: Callable[[Any], Any] | None = None,
                 disabled: Callable[[], bool] | None = None,
                 lookupd: Sequence[str] = (),
                 query_lookupd: QueryLookupd | None = None,
                 connect_to_nsqd: ConnectToNsqd | None = None,
                 discovery_filter: DiscoveryFilter | None = None) -> None:
        self.topic = topic
        self.channel = channel
        self.config = config
        self.policy = policy
        self.answers = answers
        self.lifecycle = lifecycle
        self.bridge = bridge
        self.tasks = tasks
        self.name = name
        self._log = log.bind(reader=name, topic=topic, channel=channel)
        self.direct = [(a.host, a.port) for a in direct]
        self._direct_keys = {producer_address(hp) for hp in self.direct}
        self.make_poller = make_poller
        self.rdy_redistribute_interval = options.rdy_redistribute_interval
        self.reconnect_initial = options.reconnect_initial
        self.reconnect_max = options.reconnect_max
        self.deliveries = deliveries
        self.connect = connect
        self.pulled = pulled
        self.on_heartbeat = on_heartbeat
        self.disabled = disabled
        self._held: dict["ConnRdy[Link]", int] = {}  # RDY held back while disabled()
        self.blocks = False  # deliver MessageBlocks (set before start)
        self.links: dict[str, "Link"] = {}
        # nsqd address -> the last connect/SUB failure, until it subscribes
        self.connect_errors: dict[str, BaseException] = {}
        self.messages_received = 0
        # the lookupds to poll while there is no poller; the poller keeps them once made
        self._lookupd = list(lookupd)
        self.query_lookupd: QueryLookupd = query_lookupd or self.poll_lookupd
        self.connect_to_nsqd: ConnectToNsqd = connect_to_nsqd or self.connect_to
        self.topology_zone = config.topology_zone
        self.topology_region = config.topology_region
        self.discovery_filter = discovery_filter
        self.max_producers = options.lookupd_max_producers
        self._skipped: tuple[str, ...] = ()  # what the cap left out, as last warned
        self.poller: Poller | None = None
        self._started = False
        self._disconnecting: set[str] = set()  # closed on purpose (disconnect_from)
        # address -> the graceful closing disconnect_from started, while it runs: a
        # second call joins it instead of cutting it short
        self._closings: dict[str, "asyncio.Future[Any]"] = {}
        self._redist: Any = None

    # -- starting and connecting (loop thread) ------------------------------------------

    def start(self) -> None:
        from tornado.ioloop import PeriodicCallback
        self._redist = PeriodicCallback(self._tick, self.rdy_redistribute_interval * 1000)
        self._redist.start()
        self._started = True
        for host, port in self.direct:
            self.tasks.spawn(self._keep_connected(host, port, first=True), "connect")
        if self._lookupd:
            self._start_poller()

    def _start_poller(self) -> None:
        if self.make_poller is None:
            raise ConfigError(f"[{self.name}] this consumer cannot poll nsqlookupd")
        self.poller = self.make_poller(self._lookupd, self._on_records,
                                       self._scheduled_poll)
        self._lookupd = []  # the poller's list is the one from now on
        self.poller.start()

    def connect_to(self, host: str, port: int) -> None:
        """Connect to ``host:port`` unless connected or connecting (failures are logged;
        a lookupd poll that lists it again tries again)."""
        if producer_address((host, port)) not in self.links and not self.lifecycle.closing:
            self.tasks.spawn(self._connect_quietly(host, port), "connect")

    def poll_lookupd(self) -> "asyncio.Future[Any] | None":
        """Query every lookupd now (the default ``query_lookupd``); the poll's Future, or
        None when no lookupd is polled."""
        if self.poller is None or self.lifecycle.closing:
            return None
        return self.tasks.spawn(self.poller.poll_once(), "poll")

    def subscribed(self) -> list["Link"]:
        return [s for s in list(self.links.values()) if s.conn is not None and s.subscribed]

    def _scheduled_poll(self) -> Any:
        if self.lifecycle.closing:
            return None
        return self.query_lookupd()

    def _on_records(self, records: list[ProducerInfo]) -> None:
        """One poll's producers: choose, then the owner's connect_to_nsqd for each."""
        if self.lifecycle.closing:
            return
        try:
            chosen = choose_producers(records, zone=self.topology_zone,
                                      region=self.topology_region,
                                      discovery_filter=self.discovery_filter)
        except DiscoveryFilterError as exc:
            self._log.error("[%s] %s; connecting to none of this poll's %d producers",
                            self.name, exc, len(records))
            return
        except Exception:
            self._log.exception("[%s] discovery_filter raised; connecting to none of this "
                                "poll's %d producers", self.name, len(records))
            return
        chosen = self._capped(chosen)
        for record in chosen:
            try:
                self.connect_to_nsqd(record.host, record.tcp_port)
            except Exception:
                self._log.exception("[%s] connect_to_nsqd(%r, %d) raised", self.name,
                                    record.host, record.tcp_port)

    def _capped(self, chosen: list[ProducerInfo]) -> list[ProducerInfo]:
        """At most ``max_producers`` of ``chosen``; one WARNING when what is skipped
        changes."""
        skipped = tuple(producer_address(r.producer) for r in chosen[self.max_producers:])
        if skipped != self._skipped:
            self._skipped = skipped
            if skipped:
                first = ", ".join(skipped[:5])
                more = f" and {len(skipped) - 5:,} more" if len(skipped) > 5 else ""
                self._log.warning(
                    "[%s] lookupd lists %s nsqds for topic %s; connecting to the first %s "
                    "(lookupd_max_producers=%d) and skipping %s: %s%s (raise "
                    "lookupd_max_producers if the topic really is on that many nsqds)",
                    self.name, f"{len(chosen):,}", self.topic,
                    f"{self.max_producers:,}", self.max_producers, f"{len(skipped):,}",
                    first, more)
        return chosen[:self.max_producers]

    # -- run-time controls (loop thread) ------------------------------------------------

    def disconnect_from(self, host: str, port: int) -> "asyncio.Future[Any] | None":
        """Take ``host:port`` off the direct list and close its connection gracefully (RDY
        0, CLS, its unanswered messages requeued). Raises NotConnectedError when it is
        neither direct nor connected. Returns the closing's Future (None: nothing open).

        Idempotent while the closing runs: a second call returns the same Future (the
        one closing goes on, with its ``close_timeout`` for handed-out messages); once
        closed, the address is neither direct nor connected (NotConnectedError)."""
        address = producer_address((host, port))
        closing = self._closings.get(address)
        if closing is not None:
            return closing
        direct = address in self._direct_keys
        link = self.links.get(address)
        if not direct and link is None:
            raise NotConnectedError(
                f"[{self.name}] not connected to nsqd {address} (connected: "
                f"{sorted(self.links) or 'none'}): give one of those addresses")
        if direct:
            self._direct_keys.discard(address)
            self.direct = [hp for hp in self.direct if producer_address(hp) != address]
        if link is None:
            return None  # a reconnect loop, if any, sees it is no longer direct and stops
        # marked now, not when the task first runs: a second call finds the closing
        if link.conn is not None:
            self._disconnecting.add(address)
        fut = self.tasks.spawn(self._close_link(link), "disconnect")
        self._closings[address] = fut
        fut.add_done_callback(lambda f: self._closings.pop(address, None)
                              if self._closings.get(address) is f else None)
        return fut

    async def _close_link(self, link: "Link") -> None:
        conn = link.conn
        if conn is None:
            return
        self._log.for_nsqd(link.address).info("[%s] disconnecting from nsqd %s", self.name,
                                              link.address)
        if conn.state is ConnState.SUBSCRIBED:
            # quiet (the state is CLOSING from now on: no RDY is sent to it any more); the
            # policy gives its share to the others when it has closed
            await self._quiesce([link])
            # what waits in the pull queue is handed out no more (a REQ'd message handed
            # out would make the puller's finish() of its whole batch fail)
            queued, queued_blocks = self.pulled.take_queued(link)
            # what was handed out gets close_timeout s to be answered (the queued messages
            # stay in the ledger's record, answerable by nobody, until the requeue below)
            deadline = self.bridge.time() + self.config.close_timeout
            while (len(link.outstanding) > len(queued) or self.pulled.holds_blocks(link)) \
                    and self.bridge.time() < deadline:
                await asyncio.sleep(0.01)
            # a straggler queued meanwhile leaves the queue too (its messages are in the
            # ledger's record: requeued below with the rest)
            _, late_blocks = self.pulled.take_queued(link)
            blocks = queued_blocks + late_blocks + self.pulled.take_unanswered_blocks(link)
            if self.answers.requeue_outstanding([link], blocks):
                self.answers.flush()
        await conn.close()

    @property
    def lookupd_addresses(self) -> list[str]:
        """The lookupds polled (a copy, without user info): the poller's list, or the
        pool's while there is no poller."""
        poller = self.poller
        if poller is not None:
            return list(poller.addresses)
        return [strip_userinfo(a.strip()) for a in self._lookupd]

    def connect_to_lookupd(self, address: str) -> bool:
        """Poll ``address`` too (a poll follows soon); False if it is polled already."""
        poller = self.poller
        if poller is not None:
            if not poller.add_address(address):
                return False
            if not self.lifecycle.closing:
                poller.trigger()
            return True
        if lookupd_index(self._lookupd, address, self.topic) is not None:
            return False
        self._lookupd.append(address)
        if self._started and not self.lifecycle.closing:
            self._start_poller()  # polls at once
        return True

    def disconnect_from_lookupd(self, address: str) -> None:
        """Stop polling ``address`` (NotConnectedError if it is not polled; ConfigError
        for the last one when there is no direct nsqd address)."""
        polled = self.lookupd_addresses
        i = lookupd_index(polled, address, self.topic)
        if i is None:
            raise NotConnectedError(
                f"[{self.name}] lookupd {redact_userinfo(address)!r} is not polled (polled: "
                f"{polled or 'none'}): give one of those addresses")
        if len(polled) == 1 and not self.direct:
            raise ConfigError(
                f"[{self.name}] cannot disconnect from the only lookupd "
                f"({redact_userinfo(address)!r}) of a "
                "consumer without nsqd_tcp_addresses: connect_to_lookupd() another one first")
        poller = self.poller
        if poller is None:
            del self._lookupd[i]
            return
        poller.remove_address(address)
        if not poller.addresses:
            self.poller = None  # poll_lookupd starts no poll from now on
            self.tasks.cancel("poll")  # now: none of them sends a request any more
            self.tasks.spawn(self._stop_poller(poller), "disconnect")

    async def _stop_poller(self, poller: Poller) -> None:
        """Explicit polls (``query_lookupd()`` from any thread) end first, then the
        poller stops and closes its HTTP client: a poll running after the client was
        released would make a new one that nothing closes."""
        await self.tasks.cancel_and_wait("poll")
        await poller.stop()

    async def _connect_quietly(self, host: str, port: int) -> None:
        address = producer_address((host, port))
        before = self.connect_errors.get(address)
        try:
            await self._connect_once(host, port)
        except Exception as exc:  # the next lookupd poll tries again
            # a WARNING when it starts failing (or fails otherwise), not at every poll: a
            # lookupd listing many dead nsqds must not write a line for each, each poll
            same = before is not None and str(before) == str(exc)
            self._log.for_nsqd(address).log(
                logging.DEBUG if same else logging.WARNING,
                "[%s] cannot connect to nsqd %s:%s (will retry at the next lookupd "
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
            stop=lambda state: self.lifecycle.closing or addr not in self._direct_keys,
            before_sleep=lambda state: self._log.for_nsqd(addr).warning(
                "[%s] cannot connect to nsqd %s (attempt %d), retrying in %.1fs: %s",
                self.name, addr, state.attempt_number,
                state.next_action.sleep if state.next_action else 0.0,
                state.outcome.exception() if state.outcome else None),
            reraise=True)
        try:
            async for attempt in retrying:
                with attempt:
                    if self.lifecycle.closing or addr not in self._direct_keys:
                        return  # closing, or disconnect_from() took it off the list
                    await self._connect_once(host, port)
        except Exception as exc:  # only when closing
            self._log.for_nsqd(addr).debug(
                "[%s] stopped reconnecting to %s: %s", self.name, addr, exc)

    async def _connect_once(self, host: str, port: int) -> None:
        address = producer_address((host, port))
        if address in self.links or self.lifecycle.closing:
            return
        answers = self.answers
        link = answers.link(host, port, address)
        self.links[address] = link
        blocks = self.blocks
        conn = self.connect(
            host, port, self.config,
            on_messages=None if blocks else functools.partial(self._deliver, link),
            on_blocks=functools.partial(self._deliver_blocks, link) if blocks else None,
            on_close=functools.partial(self._on_conn_close, link),
            on_heartbeat=self._heartbeat, responder=link)
        answers.attach(link, conn)
        self._log.for_nsqd(address).info("[%s] connecting to nsqd %s", self.name, address)
        try:
            await conn.connect()
            await asyncio.wait_for(conn.subscribe(self.topic, self.channel),
                                   self.config.response_timeout)
        except BaseException as exc:
            if self.links.get(address) is link:
                del self.links[address]
            answers.attach(link, None)
            conn.abort()
            if isinstance(exc, Exception):
                self.connect_errors[address] = exc
            raise
        if self.lifecycle.closing or conn.closed:
            if self.links.get(address) is link:
                del self.links[address]
            if not conn.closed:
                await conn.close()
            if self.lifecycle.closing:
                return
            raise ConnectionClosedError(f"nsqd at {address} closed the connection right "
                                        "after SUB")  # the caller retries
        policy = self.policy
        if conn.max_rdy_count < policy.max_in_flight:
            self._log.for_nsqd(address).info(
                "[%s] nsqd %s max_rdy_count %d < max_in_flight %d: its share is capped",
                self.name, address, conn.max_rdy_count, policy.max_in_flight)
        st, cmds = policy.add(address, max(1, conn.max_rdy_count), self.bridge.time(),
                              handle=link)
        answers.subscribed(link, st)
        self.connect_errors.pop(address, None)
        self.apply(cmds)
        self._log.for_nsqd(address).info(
            "[%s] subscribed to nsqd %s (max_rdy_count %d)", self.name, address,
            conn.max_rdy_count)

    def _heartbeat(self, conn: Any) -> None:
        # the owner's hook is looked up at each heartbeat (every 30 s by default), not at
        # connect time: a hook assigned while connections are open applies to them too
        hook = self.on_heartbeat
        if hook is not None:
            hook(conn)

    # -- deliveries: once per read chunk ------------------------------------------------

    def _deliver(self, link: "Link", msgs: list["Message"]) -> None:
        n = len(msgs)
        self.messages_received += n
        cmds = self.policy.on_arrival(link.rdy, n, self.bridge.time())
        if cmds:
            self.apply(cmds)
        self.deliveries.on_messages(link, msgs)

    def _deliver_blocks(self, link: "Link", blocks: list["MessageBlock"]) -> None:
        n = sum(map(len, blocks))
        self.messages_received += n
        cmds = self.policy.on_arrival(link.rdy, n, self.bridge.time())
        if cmds:
            self.apply(cmds)
        self.deliveries.on_blocks(link, blocks)

    def _on_conn_close(self, link: "Link", exc: BaseException | None) -> None:
        address = link.address
        if self.links.get(address) is link:
            del self.links[address]
        if link.subscribed:
            self.apply(self.policy.remove(address))
        # What it delivered and we did not answer yet: nsqd redelivers it after its
        # msg_timeout (if it still has it: a kill -9 can lose in-flight state), and our
        # answers would be refused now (message ids belong to the connection). Messages
        # already handed out stay so (pull queue, running handlers): handled at least once
        # beats dropped; their answers are counted in dropped_responses.
        lost = self.answers.forget_link(link) + self.pulled.drop_link(link)
        if address in self._disconnecting:
            self._disconnecting.discard(address)
            self._log.for_nsqd(address).info(
                "[%s] disconnected from nsqd %s%s", self.name, address,
                f" ({lost} messages were unanswered)" if lost else "")
            if self.poller is not None and not self.lifecycle.closing:
                self.poller.trigger()  # go-nsq: a lookupd that lists it finds it again
            return
        if self.lifecycle.closing or not link.subscribed:
            # never subscribed: _connect_once failed and its caller (the reconnect loop or
            # the next lookupd poll) retries; another loop here would double them each time
            return
        self._log.for_nsqd(address).warning(
            "[%s] connection to nsqd %s closed%s%s", self.name, address,
            f": {exc}" if exc else "",
            f" ({lost} messages were unanswered; nsqd redelivers them after their "
            "timeout)" if lost else "")
        if address in self._direct_keys:
            self.tasks.spawn(self._keep_connected(link.host, link.port), "connect")
        elif self.poller is not None:
            self.poller.trigger()

    # -- RDY ----------------------------------------------------------------------------

    def apply(self, cmds: Iterable[tuple["ConnRdy[Link]", int]] | None) -> None:
        """Send the policy's RDY commands."""
        if not cmds:
            return
        paused = self._is_disabled()
        for st, n in cmds:
            conn = st.handle.conn if st.handle is not None else None
            if paused:  # remember what the policy wants; nsqd gets RDY 0 (once)
                if n > 0:
                    self._held[st] = n
                else:
                    self._held.pop(st, None)
                n = 0
                if conn is not None and conn.rdy_count == 0:
                    continue
            if conn is not None and conn.state is ConnState.SUBSCRIBED:
                try:
                    conn.send_rdy(n)
                except Exception as exc:
                    # called from the delivery callback too: a refused RDY must never keep
                    # the chunk already decoded from being dispatched
                    self._rdy_refused(st, conn, n, exc)

    def _rdy_refused(self, st: "ConnRdy[Link]", conn: ConsumerConnection, n: int,
                     exc: Exception) -> None:
        limit = max(0, min(n, conn.max_rdy_count))
        self._log.for_nsqd(conn.address).error(
            "[%s] nsqd %s: cannot send RDY %d (%s); sending RDY %d instead%s",
            self.name, conn.address, n, exc, limit,
            "; this connection gets no messages until nsqd's --max-rdy-count is "
            "raised above 0" if limit == 0 else "")
        st.max_rdy_count = max(1, conn.max_rdy_count)  # the policy caps to it from now on
        try:
            conn.send_rdy(limit)
        except Exception:
            self._log.for_nsqd(conn.address).exception(
                "[%s] nsqd %s: RDY %d failed too", self.name, conn.address, limit)

    def _is_disabled(self) -> bool:
        if self.disabled is None:
            return False
        try:
            return bool(self.disabled())
        except Exception:
            self._log.exception("[%s] disabled() raised; taken as False", self.name)
            return False

    def _tick(self) -> None:
        if self.lifecycle.closing:
            return
        if self._is_disabled():
            # disabled while connections have RDY: take it back (and remember it)
            self.apply([(link.rdy, link.conn.rdy_count) for link in self.subscribed()
                        if link.conn is not None and link.conn.rdy_count > 0])
        elif self._held:
            held, self._held = self._held, {}
            self.apply([(st, n) for st, n in held.items()
                        if st.handle is not None and st.handle.conn is not None])
        self.apply(self.policy.tick(self.bridge.time()))

    def connection_stats(self) -> dict[str, dict[str, Any]]:
        """Per connection: state, RDY, in flight, answers, messages, last message age."""
        out = {}
        now = self.bridge.time() if self.bridge.usable else None
        for address, link in list(self.links.items()):
            st = link.rdy if link.subscribed else None
            c = link.conn
            out[address] = {
                # plain strings, as before ConnState (users compare and serialize them)
                "state": c.state.value if c is not None else ConnState.CONNECTING.value,
                "rdy": st.rdy if st else 0,
                "in_flight": st.in_flight if st else 0,
                "finished": st.finished if st else 0,
                "requeued": st.requeued if st else 0,
                "messages": c.messages_received if c is not None else 0,
                "max_rdy_count": st.max_rdy_count if st else None,
                # ms, from nsqd's IDENTIFY answer (None before it): how long nsqd keeps a
                # message delivered here in flight before it sends it elsewhere
                "msg_timeout": c.msg_timeout if c is not None and st else None,
                # backoff is reader-wide (as in go-nsq/pynsq); shown per connection too
                "backoff": self.policy.mode,
                "last_message_age": (round(now - st.last_msg_at, 3)
                                     if st and now is not None else None),
            }
        return out

    def connect_error_stats(self) -> dict[str, dict[str, Any]]:
        """Per nsqd not subscribed now: its last failure and whether a retry can fix it."""
        return {address: {"error": f"{type(exc).__name__}: {exc}",
                          "transient": is_transient(exc)}
                for address, exc in list(self.connect_errors.items())}

    def lookupd_stats(self) -> dict[str, Any] | None:
        poller = self.poller
        return {"polls": poller.polls, "failing": dict(poller.failures)} if poller else None

    # -- closing ------------------------------------------------------------------------

    async def stop_deliveries(self) -> list["Link"]:
        """No more connects or polls (the lifecycle is closing already); RDY 0 and CLS on
        every subscribed connection, then read on until they are quiet. Returns the
        subscribed links."""
        if self._redist is not None:
            self._redist.stop()
        if self.poller is not None:
            await self._stop_poller(self.poller)
        self.tasks.cancel("connect")  # pending connects and reconnect loops
        links = self.subscribed()
        await self._quiesce(links)
        return links

    async def _quiesce(self, links: list["Link"]) -> None:
        """RDY 0 and CLS on each of ``links`` still subscribed (nsqd answers CLOSE_WAIT
        and sends no more), at most ``close_timeout`` s for the answers, then read on
        until they are quiet. The one closing sequence of a connection, for all of them
        (closing) or one (:meth:`disconnect_from`)."""
        cls: dict[asyncio.Future[bytes], str] = {}
        for link in links:
            conn = link.conn
            if conn is not None and conn.state is ConnState.SUBSCRIBED:
                conn.send_rdy(0)
                cls[asyncio.ensure_future(conn.send_cls())] = link.address
        if not cls:
            return
        _, late = await asyncio.wait(cls, timeout=self.config.close_timeout)
        for fut, address in cls.items():
            if fut in late:
                fut.cancel()  # the connection ignores an answer to a cancelled command
                self._log.for_nsqd(address).debug("[%s] CLS to %s: no answer within %ss",
                                                  self.name, address,
                                                  self.config.close_timeout)
            elif fut.exception() is not None:
                self._log.for_nsqd(address).debug("[%s] CLS to %s: %s", self.name, address,
                                                  fut.exception())
        await self._until_quiet([link.conn for link in links if link.conn is not None])

    async def _until_quiet(self, conns: list[ConsumerConnection]) -> None:
        """After CLOSE_WAIT: read on until the connections are quiet for CLOSE_QUIET s.

        nsqd's message pump may have taken a message from the channel just before our
        RDY 0 and send it after CLOSE_WAIT. Received while closing, it is requeued at once
        (the intake gate); received after the socket closed, nsqd would keep it in flight
        until its msg_timeout."""
        time_ = self.bridge.time
        deadline = time_() + CLOSE_QUIET_MAX
        while True:
            now = time_()
            wait = max((c.last_recv for c in conns), default=0.0) + CLOSE_QUIET - now
            if wait <= 0 or now >= deadline:
                return
            await asyncio.sleep(min(wait, deadline - now))

    async def close_all(self) -> None:
        closing = [s.conn.close() for s in list(self.links.values()) if s.conn is not None]
        if closing:
            await asyncio.gather(*closing, return_exceptions=True)
