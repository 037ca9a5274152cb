"""The driver's view of the nsqds: which nsqds carry the topic, whether any can be
reached, the channel created on each, and how many messages wait on the channel.

Discovery: with ``lookupdHttpAddresses`` the nsqds holding the topic (and their HTTP
ports) come from every lookupd's ``/lookup?topic=`` (parsed by the one lookupd parser,
:func:`nsq_spark._lookupd.parse_producer_records`); with ``nsqdTcpAddresses`` the driver
uses ``nsqdHttpAddresses`` if given.

The channel: a channel that does not exist has no depth, and nsqd copies a topic's
messages only into the channels that exist. So the driver creates the query's channel
(``POST /topic/create`` and ``/channel/create``) on every nsqd it knows, once per
nsqd and reader -- at query start and on every nsqd that appears later -- so that what
is published after the query starts waits on the channel and shows in its ``depth``.

The backlog of one nsqd is the channel's ``depth`` (memory + disk queue, excluding
in-flight and deferred messages, which come back to ``depth`` when they time out or
their delay ends) plus the topic's ``depth``: messages nsqd has not yet copied into the
channels, which a channel created a moment ago gets over the next seconds (nsqd copies a
disk-queued backlog gradually; the channel's depth alone would be a fraction of it).

Paused (``POST /channel/pause`` or ``/topic/pause``, nsqadmin's pause button): nsqd sends
nothing on a paused channel, and copies nothing from a paused topic into its channels.
``/stats`` says so (``"paused": true``), and what the driver plans on is the *fetchable*
backlog (:attr:`NsqdBacklog.fetchable`): nothing of an nsqd whose channel is paused, only
the channel's depth where the topic is paused. So a backlog that sits only on paused
channels or topics plans no batch: no task waits for messages nsqd will not send (the
driver knows it before any task starts; tasks that returned at once would still cost a
Spark job per trigger). The progress lists them (``paused``) and each trigger logs a
WARNING naming the topic, channel, nsqd and how many messages wait there (the same one
at most every ``WARN_EVERY`` seconds: with the default trigger, Spark asks every few
milliseconds while nothing comes).

Unreachable: an nsqd that answered ``/stats`` before (or that lookupd lists, or that
``nsqdHttpAddresses`` names) and does not answer now is listed in the progress
(``nsqdsUnreachable``, with what the attempt said) and logged (WARNING, likewise) until
it answers again; one that lookupd no longer lists is forgotten after
``FORGET_UNREACHABLE`` seconds (a decommissioned nsqd does not warn forever).

Several topics (``topics``, ``topicPattern``): :class:`Subscription` holds one
:class:`Nsqds` per topic (each creates the channel on its nsqds, measures its backlog and
reports its pauses, as for one topic) behind the :class:`TopicBacklog` port, and lists a
pattern's topics (:func:`list_topics`: lookupd ``/topics``, or the nsqds' ``/stats``) at
each measurement; :func:`combine` sums the topics' measurements for the progress.

Reachability (:func:`check_reachable`): at query start, and for every batch read, the
driver must reach at least one nsqd (a V2 handshake on a TCP address, an HTTP answer
from a listed or discovered nsqd) and, with lookupd, at least one lookupd must answer.
Otherwise :class:`~nsq_spark.errors.ConnectError` names every address tried and what
each answered, after at most ``HTTP_TIMEOUT`` / ``TCP_TIMEOUT`` per address (all asked
at once).
"""

from __future__ import annotations

import socket
import struct
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Protocol, TypeVar

from nsq_spark._addresses import parse_address, strip_userinfo
from nsq_spark.admin.client import LookupdClient, NsqdClient
from nsq_spark.admin.errors import AdminError
from nsq_spark.admin.model import ChannelStats, Lookup, TopicStats
from nsq_spark.admin.transport import shared_transport
from nsq_spark.errors import ConnectError
from nsq_spark._lookupd import LookupdError, lookup_answer_sync
from .._log import get_logger

log = get_logger(__name__)

HTTP_TIMEOUT = 2.0
TCP_TIMEOUT = 3.0
# Seconds Trigger.AvailableNow waits at most for nsqd to copy a topic's queue into a
# channel created a moment ago before it measures the backlog.
SETTLE_TIMEOUT = 15.0
# Seconds after which an nsqd that lookupd no longer lists and that does not answer is no
# longer reported as unreachable.
FORGET_UNREACHABLE = 600.0
# Seconds between two WARNINGs about the same pause or unreachable nsqd: with the default
# trigger Spark asks for the latest offset every 10 ms while there is no data, so "one per
# trigger" would be 100 lines a second. 10 s is Spark's own pace for progress events of
# an idle query (spark.sql.streaming.noDataProgressEventInterval), so each WARNING lines
# up with a progress that shows the same condition; a trigger of 10 s or more gets one
# WARNING per trigger.
WARN_EVERY = 10.0

T = TypeVar("T")


def _each(fn: Callable[[str], T], addresses: Iterable[str]) -> list[tuple[str, T | None, str]]:
    """``fn`` on every address at once: ``(address, result or None, error text)``."""
    addresses = list(addresses)
    if not addresses:
        return []

    def call(a: str) -> tuple[str, T | None, str]:
        try:
            return a, fn(a), ""
        except (OSError, ValueError, LookupdError, ConnectError, AdminError) as exc:
            return a, None, f"{type(exc).__name__}: {exc}"

    with ThreadPoolExecutor(max_workers=min(8, len(addresses))) as pool:
        return list(pool.map(call, addresses))


def _nsqd(http_address: str) -> NsqdClient:
    """A client of one nsqd on the process's shared connection pool (the driver asks at
    every trigger: no client of its own, no pool per call)."""
    return NsqdClient(http_address, timeout=HTTP_TIMEOUT, transport=shared_transport())


@dataclass
class LookupdAnswers:
    """What every lookupd said about a topic: the answer of each that answered, as the
    admin model has it (:class:`~nsq_spark.admin.model.Lookup`, the one definition of a
    ``/lookup`` answer), and what the attempt said for each other. Addresses without
    their user info (what is shown: never a password)."""

    answers: dict[str, Lookup] = field(default_factory=dict)  # lookupd -> its answer
    failed: dict[str, str] = field(default_factory=dict)  # lookupd -> error

    @property
    def answered(self) -> list[str]:
        """The lookupds that answered."""
        return list(self.answers)

    @property
    def nsqd_http(self) -> set[str]:
        """``host:http_port`` of every producer any of them lists."""
        return {p.http_address for found in self.answers.values() for p in found.producers
                if p.http_address}


def lookup(lookupd_http_addresses: list[str], topic: str) -> LookupdAnswers:
    """Ask every lookupd (at once) for the producers of ``topic``."""
    out = LookupdAnswers()
    for addr, found, err in _each(lambda a: lookup_answer_sync(a, topic, HTTP_TIMEOUT),
                                  lookupd_http_addresses):
        addr = strip_userinfo(addr)   # what is shown: never an address's password
        if found is None:
            log.for_lookupd(addr).warning("lookupd %s: /lookup failed: %s", addr, err)
            out.failed[addr] = err
            continue
        out.answers[addr] = found
    return out


def lookup_nsqd_http(lookupd_http_addresses: list[str], topic: str) -> set[str]:
    """``host:http_port`` of every nsqd any reachable lookupd lists for ``topic``."""
    return lookup(lookupd_http_addresses, topic).nsqd_http


def create_channel(http_address: str, topic: str, channel: str) -> None:
    """``POST /topic/create`` then ``/channel/create`` on one nsqd (both are no-ops when
    it exists; nsqd answers 404 to the second without the first); raises on error."""
    nsqd = _nsqd(http_address)
    nsqd.create_topic(topic)
    nsqd.create_channel(topic, channel)


@dataclass(frozen=True)
class Counts:
    """The four counts the backlog adds up for the query's topic and channel, on one nsqd
    or summed over nsqds (read from nsqd's answer, :class:`NsqdBacklog`)."""

    topic_depth: int = 0  # not yet copied into the channels
    depth: int = 0  # queued on the channel (memory + disk)
    in_flight: int = 0  # sent to a consumer, not yet FINished / requeued / timed out
    deferred: int = 0  # requeued with a delay, or published deferred

    def __add__(self, other: "Counts") -> "Counts":
        return Counts(self.topic_depth + other.topic_depth, self.depth + other.depth,
                      self.in_flight + other.in_flight, self.deferred + other.deferred)

    @property
    def backlog(self) -> int:
        return self.topic_depth + self.depth


@dataclass(frozen=True)
class NsqdBacklog:
    """One nsqd's ``/stats`` for the query's topic and channel: the topic as the admin
    model has it (:class:`~nsq_spark.admin.model.TopicStats` with its
    :class:`~nsq_spark.admin.model.ChannelStats`, the one definition of nsqd's answer;
    None when the nsqd has no such topic), read for the backlog."""

    topic: TopicStats | None
    channel_name: str

    @property
    def channel(self) -> ChannelStats | None:
        return None if self.topic is None else self.topic.channel(self.channel_name)

    @property
    def topic_paused(self) -> bool:
        return self.topic is not None and self.topic.paused

    @property
    def channel_paused(self) -> bool:
        return self.channel is not None and self.channel.paused

    @property
    def counts(self) -> Counts:
        if self.topic is None:
            return Counts()
        c = self.channel
        if c is None:
            return Counts(topic_depth=self.topic.depth)
        return Counts(self.topic.depth, c.depth, c.in_flight_count, c.deferred_count)

    @property
    def fetchable(self) -> int:
        """What a fetch task can get from this nsqd: nothing while the channel is paused
        (nsqd sends nothing on it), the channel's depth alone while the topic is paused
        (nsqd copies nothing more into its channels).

        The channel's in-flight count is part of it. Between micro-batches no fetch task
        runs, so what is in flight on the query's channel is held by the executors'
        paused cached Readers (sent by nsqd before it saw RDY 0 at a task's end,
        :mod:`.reader_cache`): the next task that takes such a Reader spools them first.
        Counted as depth alone, a query whose last task left some held would plan no
        batch for them (``Trigger.AvailableNow`` stopped short of its target). Another
        consumer on the same channel makes this count its in-flight messages too: at
        worst an empty batch."""
        if self.channel_paused:
            return 0
        counts = self.counts
        queued = counts.depth if self.topic_paused else counts.backlog
        return queued + counts.in_flight

    @property
    def paused(self) -> str | None:
        """``"channel"``, ``"topic"``, ``"topic+channel"`` or None."""
        both = [w for w, p in (("topic", self.topic_paused),
                               ("channel", self.channel_paused)) if p]
        return "+".join(both) or None


@dataclass(frozen=True)
class Paused:
    """An nsqd where the query's topic or channel is paused, and what waits there."""

    nsqd: str  # HTTP address
    what: str  # "channel", "topic" or "topic+channel"
    depth: int  # the topic's and the channel's depth there
    topic: str | None = None  # named when the query reads several topics (combine)

    def as_progress(self) -> dict[str, Any]:
        out = {"nsqd": self.nsqd, "paused": self.what, "depth": self.depth}
        if self.topic is not None:
            out["topic"] = self.topic
        return out


@dataclass(frozen=True)
class Backlog:
    """What the driver last measured, summed over the nsqds that answered."""

    counts: Counts
    nsqds: int  # nsqds asked
    answered: int  # nsqds that answered
    at: float  # time.time() of the measurement
    fetchable: int | None = None  # the backlog not held back by a pause (None: all of it)
    paused: tuple[Paused, ...] = ()
    unreachable: tuple[tuple[str, str], ...] = ()  # (nsqd HTTP address, what it said)

    def as_progress(self) -> dict[str, Any]:
        """For the query's progress (``latestOffset``) and the log."""
        return {"depth": self.counts.backlog,
                "fetchable": self.counts.backlog if self.fetchable is None else self.fetchable,
                "inFlight": self.counts.in_flight,
                "deferred": self.counts.deferred, "nsqds": self.nsqds,
                "nsqdsAnswered": self.answered,
                "paused": [p.as_progress() for p in self.paused],
                "nsqdsUnreachable": [{"nsqd": a, "error": e} for a, e in self.unreachable],
                "measuredAt": iso_millis(self.at)}


def iso_millis(at: float) -> str:
    """``at`` (epoch seconds) as Spark writes its progress timestamps: UTC, ISO 8601,
    milliseconds (``2026-11-23T00:01:02.345Z``)."""
    whole = int(at)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)) + \
        f".{int((at - whole) * 1000):03d}Z"


def nsqd_backlog(http_address: str, topic: str, channel: str) -> NsqdBacklog:
    """The topic's and channel's counts and pause flags on one nsqd; raises
    :class:`~nsq_spark.admin.errors.AdminError` (or OSError) when it does not answer
    (or not with nsqd's stats)."""
    found = _nsqd(http_address).stats(topic, include_clients=False).topic(topic)
    return NsqdBacklog(found, channel)


def probe_nsqd_tcp(address: str) -> None:
    """A V2 handshake (magic, ``IDENTIFY {}``) with one nsqd TCP address; raises
    ConnectError saying what answered instead (e.g. an HTTP port)."""
    from nsq_spark.protocol import FRAME_TYPE_ERROR, FRAME_TYPE_RESPONSE, MAGIC_V2, identify

    addr = parse_address(address, "nsqdTcpAddresses")
    with socket.create_connection((addr.host, addr.port), timeout=TCP_TIMEOUT) as sock:
        sock.sendall(MAGIC_V2 + identify({}))
        head = b""
        while len(head) < 8:
            got = sock.recv(8 - len(head))
            if not got:
                raise ConnectError(f"{address} closed the connection during the NSQ "
                                   "handshake; is it an nsqd TCP port?")
            head += got
    size, frame_type = struct.unpack(">ii", head)
    if head.startswith(b"HTTP") or not 4 <= size <= 1 << 20 or \
            frame_type not in (FRAME_TYPE_RESPONSE, FRAME_TYPE_ERROR):
        raise ConnectError(f"{address} does not speak the NSQ TCP protocol (answered "
                           f"{head!r}); is it nsqd's HTTP port instead of its TCP port "
                           "(4150 by default)?")


def _fail(what: str, tried: dict[str, str], fix: str) -> ConnectError:
    detail = "; ".join(f"{a}: {e}" for a, e in tried.items())
    return ConnectError(f"{what} ({detail}); {fix}")


class Nsqds:
    """The driver's handle on the nsqds of one reading query (see the module doc)."""

    def __init__(self, topic: str, channel: str, nsqd_tcp_addresses: list[str],
                 nsqd_http_addresses: list[str], lookupd_http_addresses: list[str]) -> None:
        self.topic = topic
        self.channel = channel
        self.nsqd_tcp = list(nsqd_tcp_addresses)
        self.nsqd_http = list(nsqd_http_addresses)
        self.lookupd_http = list(lookupd_http_addresses)
        self._channel_on: set[str] = set()  # nsqd HTTP addresses where the channel exists
        self.last: Backlog | None = None  # the latest measurement of backlog()
        # nsqd HTTP address -> when it first failed to answer (None: it answered last time)
        self._known: dict[str, float | None] = {a: None for a in self.nsqd_http}
        self._warned: dict[tuple[str, str], float] = {}  # (what, nsqd) -> when, time.time()

    @property
    def can_measure(self) -> bool:
        return bool(self.lookupd_http or self.nsqd_http)

    def _targets(self) -> tuple[list[str], LookupdAnswers | None]:
        if self.lookupd_http:
            found = lookup(self.lookupd_http, self.topic)
            return sorted(found.nsqd_http), found
        return list(self.nsqd_http), None

    def ensure_channel(self, targets: list[str]) -> dict[str, str]:
        """Create the channel on the nsqds of ``targets`` not done yet; the failures."""
        todo = [a for a in targets if a not in self._channel_on]
        failed: dict[str, str] = {}
        for addr, ok, err in _each(lambda a: create_channel(a, self.topic, self.channel), todo):
            if err:
                shown = strip_userinfo(addr)
                log.for_nsqd(shown).warning(
                    "nsqd %s: could not create channel %s/%s: %s", shown, self.topic,
                    self.channel, err)
                failed[shown] = err
            else:
                log.for_nsqd(addr).info(
                    "nsqd %s: channel %s/%s ready", addr, self.topic, self.channel)
                self._channel_on.add(addr)
        return failed

    def check_reachable(self, require_producer: bool) -> None:
        """At query start / for a batch read: raise ConnectError naming every address
        tried unless at least one nsqd answers (and, with lookupd, one lookupd). With
        ``require_producer`` a topic no lookupd knows a producer for is an error too.
        Creates the channel on every nsqd found."""
        if self.nsqd_tcp:
            probes = _each(probe_nsqd_tcp, self.nsqd_tcp)
            bad = {a: e for a, _, e in probes if e}
            if len(bad) == len(probes):
                raise _fail(f"no nsqd answered at nsqdTcpAddresses {self.nsqd_tcp}", bad,
                            "check that nsqd runs there and that these are its TCP ports "
                            "(4150 by default), reachable from the driver and executors")
            for a, e in bad.items():
                log.for_nsqd(a).warning("nsqd %s unreachable at query start: %s", a, e)
            if self.nsqd_http:
                failed = self.ensure_channel(self.nsqd_http)
                if len(failed) == len(self.nsqd_http):
                    raise _fail("no nsqd answered at nsqdHttpAddresses "
                                f"{[strip_userinfo(a) for a in self.nsqd_http]}",
                                failed, "these must be the same nsqds' HTTP ports "
                                "(4151 by default)")
            return
        found = lookup(self.lookupd_http, self.topic)
        if not found.answered:
            raise _fail("no nsqlookupd answered at lookupdHttpAddresses "
                        f"{[strip_userinfo(a) for a in self.lookupd_http]}",
                        found.failed, "check that nsqlookupd runs there and that these are "
                        "its HTTP ports (4161 by default)")
        if not found.nsqd_http:
            if require_producer:
                raise ConnectError(
                    f"no nsqd carries topic {self.topic!r} according to nsqlookupd "
                    f"{found.answered}: nothing to read; publish to the topic first, or "
                    "check that nsqd runs with --lookupd-tcp-address")
            log.warning("no nsqd carries topic %r yet according to %s; the query waits "
                        "for one", self.topic, found.answered)
            return
        failed = self.ensure_channel(sorted(found.nsqd_http))
        if len(failed) == len(found.nsqd_http):
            raise _fail(f"no nsqd that lookupd {found.answered} lists for topic "
                        f"{self.topic!r} answered", failed, "check that the nsqds' "
                        "broadcast addresses and HTTP ports are reachable from the driver")

    def backlog(self) -> int | None:
        """Messages a batch can fetch across nsqds (paused channels and topics held
        back: see the module doc); None when nothing can be asked. Creates the channel
        on nsqds seen for the first time; logs (WARNING) every pause and every known
        nsqd that does not answer."""
        if not self.can_measure:
            return None
        targets, found = self._targets()
        now = time.time()
        listed = set(targets)
        if found is not None and not found.answered:
            listed |= set(self._known)  # no lookupd answered: it cannot say who left
        asked = sorted(listed | set(self._known))
        if not asked:
            self.last = Backlog(Counts(), 0, 0, now, 0)
            return 0  # no nsqd has the topic yet
        if targets:
            self.ensure_channel(targets)
        answers: list[tuple[str, NsqdBacklog]] = []
        unreachable: list[tuple[str, str]] = []
        for addr, got, err in _each(lambda a: nsqd_backlog(a, self.topic, self.channel), asked):
            if got is not None:
                self._known[addr] = None
                if addr in targets:  # what the fetch tasks find (through lookupd)
                    answers.append((addr, got))
                elif addr not in listed:  # answers, but lookupd no longer lists it: it left
                    del self._known[addr]
                continue
            since = self._known.get(addr) or now
            if addr not in listed and now - since > FORGET_UNREACHABLE:
                log.for_nsqd(addr).warning(
                    "nsq source %s/%s: forgetting nsqd %s: it has not answered for "
                    "%.0f s and lookupd no longer lists it", self.topic,
                    self.channel, addr, now - since)
                del self._known[addr]
                continue
            self._known[addr] = since
            unreachable.append((addr, err))
            if self._warn_now(("unreachable", addr), now):
                log.for_nsqd(addr).warning(
                    "nsq source %s/%s: nsqd %s does not answer (%s)%s; what waits "
                    "on it is read once it is back", self.topic, self.channel, addr,
                    err, "" if addr in listed else ", and lookupd no longer lists it")
        paused = tuple(Paused(a, st.paused, st.counts.backlog)
                       for a, st in answers if st.paused is not None)
        for p in paused:
            if not self._warn_now((p.what, p.nsqd), now):
                continue
            log.for_nsqd(p.nsqd).warning(
                "nsq source %s/%s: the %s is paused on nsqd %s, where %d messages "
                "wait; no batch reads them until it is unpaused (nsqadmin, or "
                "POST /%s/unpause on nsqd)", self.topic, self.channel, p.what,
                p.nsqd, p.depth, p.what.split("+")[-1])
        current = {(p.what, p.nsqd) for p in paused} | {("unreachable", a)
                                                        for a, _ in unreachable}
        self._warned = {k: t for k, t in self._warned.items() if k in current}
        total = sum((st.counts for _, st in answers), Counts())
        fetchable = sum(st.fetchable for _, st in answers)
        self.last = Backlog(total, len(targets), len(answers), now, fetchable, paused,
                            tuple(unreachable))
        return fetchable

    def _warn_now(self, key: tuple[str, str], now: float) -> bool:
        """Whether to log the WARNING about ``key`` now: a new condition at once, a lasting
        one every ``WARN_EVERY`` seconds."""
        last = self._warned.get(key)
        if last is not None and now - last < WARN_EVERY:
            return False
        self._warned[key] = now
        return True

    def settled_backlog(self, timeout: float = SETTLE_TIMEOUT) -> int | None:
        """The backlog once nsqd has copied the topic's queue into the channels (at most
        ``timeout`` seconds): while it copies, a message or two is in neither count, and
        ``Trigger.AvailableNow`` would stop short of them. A channel created a moment ago
        on a disk-queued backlog is the case this waits for."""
        if not self.can_measure:
            return None
        deadline = time.monotonic() + timeout
        while True:
            targets, _ = self._targets()
            if not targets:
                return 0
            self.ensure_channel(targets)
            got = [st for _, st, _ in _each(
                lambda a: nsqd_backlog(a, self.topic, self.channel), targets) if st]
            # a paused topic copies nothing: waiting for its depth to settle is in vain
            if not any(st.counts.topic_depth and not st.topic_paused for st in got) or \
                    time.monotonic() >= deadline:
                return sum(st.fetchable for st in got)
            time.sleep(0.2)


def list_topics(lookupd_http_addresses: list[str], nsqd_http_addresses: list[str]
                ) -> tuple[list[str], dict[str, str]]:
    """Every topic the lookupds list (``/topics``), or with no lookupd the nsqds
    (``/stats``), asked at once: the sorted union and ``{address: error}`` of those that
    did not answer. ``topicPattern`` is matched against it at every trigger."""
    def from_lookupd(address: str) -> list[str]:
        return LookupdClient(address, timeout=HTTP_TIMEOUT,
                             transport=shared_transport()).topics()

    def from_nsqd(address: str) -> list[str]:
        return [t.name for t in _nsqd(address).stats(include_clients=False).topics if t.name]

    ask, where = (from_lookupd, lookupd_http_addresses) if lookupd_http_addresses else \
        (from_nsqd, nsqd_http_addresses)
    found: set[str] = set()
    failed: dict[str, str] = {}
    for addr, names, err in _each(ask, where):
        if names is None:
            failed[strip_userinfo(addr)] = err
        else:
            found.update(names)
    return sorted(found), failed


class TopicBacklog(Protocol):
    """What the driver needs of one topic's nsqds (:class:`Nsqds`; fakes in tests)."""

    last: Backlog | None

    def check_reachable(self, require_producer: bool) -> None: ...

    def backlog(self) -> int | None: ...

    def settled_backlog(self) -> int | None: ...


class Subscription:
    """The topics of one reading query (``topic``, ``topics`` or ``topicPattern``) and the
    driver's :class:`TopicBacklog` of each, made by ``handle`` when a topic is first seen.

    A pattern is matched (``re.fullmatch``) against :func:`list_topics` at every call of
    :meth:`topics`; when no lookupd (nsqd) answers, the topics matched last time stand (a
    transient fault, logged every ``WARN_EVERY`` seconds at most)."""

    def __init__(self, topics: tuple[str, ...], pattern: str | None,
                 lookupd_http_addresses: list[str], nsqd_http_addresses: list[str],
                 handle: Callable[[str], TopicBacklog]) -> None:
        import re

        self.fixed = tuple(topics)
        self.pattern = re.compile(pattern) if pattern is not None else None
        self.lookupd_http = list(lookupd_http_addresses)
        self.nsqd_http = list(nsqd_http_addresses)
        self._handle = handle
        self.handles: dict[str, TopicBacklog] = {t: handle(t) for t in self.fixed}
        self._matched: list[str] = []
        self._warned_at = 0.0

    def describe(self) -> str:
        if self.pattern is not None:
            return f"topics matching {self.pattern.pattern!r}"
        return ",".join(self.fixed)

    def topics(self) -> list[str]:
        """The topics now: the fixed ones, or those the pattern matches."""
        if self.pattern is None:
            names = list(self.fixed)
        else:
            listed, failed = list_topics(self.lookupd_http, self.nsqd_http)
            if failed and not listed and self._matched:
                now = time.time()
                if now - self._warned_at >= WARN_EVERY:
                    self._warned_at = now
                    log.warning("nsq source: could not list the topics for %s (%s); "
                                "going on with %s", self.describe(),
                                "; ".join(f"{a}: {e}" for a, e in failed.items()),
                                ",".join(self._matched))
                names = list(self._matched)
            else:
                names = [t for t in listed if self.pattern.fullmatch(t)]
                if names != self._matched:
                    log.info("nsq source: %s: %s", self.describe(), ",".join(names) or "none")
                self._matched = names
        for name in names:
            if name not in self.handles:
                self.handles[name] = self._handle(name)
        return names

    def check_reachable(self, require_producer: bool) -> None:
        """:meth:`Nsqds.check_reachable` for each topic: raises only when every topic
        fails (the first error), or, with ``require_producer``, when a pattern matches
        nothing."""
        if self.pattern is not None:
            listed, failed = list_topics(self.lookupd_http, self.nsqd_http)
            if failed and not listed:
                where = "lookupdHttpAddresses" if self.lookupd_http else "nsqdHttpAddresses"
                raise _fail(f"could not list the topics for {self.describe()} at {where}",
                            failed, "check that these are the HTTP ports of running "
                            "nsqlookupd (nsqd) processes, reachable from the driver")
        names = self.topics()
        if not names:
            if require_producer:
                raise ConnectError(f"no topic matches topicPattern {self.pattern.pattern!r}"
                                   if self.pattern is not None else "no topic given")
            return
        errors: list[ConnectError] = []
        for name in names:
            try:
                self.handles[name].check_reachable(require_producer)
            except ConnectError as exc:
                errors.append(exc)
                if len(names) > 1:
                    log.warning("nsq source: topic %s: %s", name, exc)
        if errors and (len(errors) == len(names) or len(names) == 1):
            raise errors[0]

    def backlogs(self) -> dict[str, int | None]:
        """Each current topic's fetchable backlog (None: cannot be measured)."""
        return {name: self.handles[name].backlog() for name in self.topics()}

    def settled_backlog(self) -> int | None:
        """The sum of :meth:`Nsqds.settled_backlog` over the current topics."""
        got = [self.handles[name].settled_backlog() for name in self.topics()]
        if any(g is None for g in got):
            return None
        return sum(g or 0 for g in got)

    def measured(self) -> dict[str, Backlog]:
        """The latest measurement of each topic that has one."""
        return {name: h.last for name, h in self.handles.items() if h.last is not None}


def combine(measured: dict[str, Backlog]) -> Backlog | None:
    """One :class:`Backlog` for several topics: counts summed, ``nsqds`` the most any
    topic has, the pauses of each (their depth per topic), an unreachable nsqd once."""
    if not measured:
        return None
    if len(measured) == 1:
        return next(iter(measured.values()))
    items = list(measured.values())
    unreachable: dict[str, str] = {}
    for b in items:
        for addr, err in b.unreachable:
            unreachable.setdefault(addr, err)
    return Backlog(sum((b.counts for b in items), Counts()),
                   max(b.nsqds for b in items), max(b.answered for b in items),
                   max(b.at for b in items),
                   sum(b.counts.backlog if b.fetchable is None else b.fetchable
                       for b in items),
                   tuple(replace(p, topic=name) for name, b in measured.items()
                         for p in b.paused), tuple(unreachable.items()))



__all__ = ["Backlog", "Counts", "LookupdAnswers", "NsqdBacklog", "Nsqds", "Paused",
           "Subscription", "TopicBacklog", "combine", "create_channel", "list_topics", "lookup",
           "lookup_nsqd_http", "nsqd_backlog", "probe_nsqd_tcp"]
