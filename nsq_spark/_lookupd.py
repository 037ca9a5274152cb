"""Discovery of the nsqd that carry a topic, by polling nsqlookupd over HTTP.

At start every lookupd is queried at once (concurrently), then again every
``poll_interval`` seconds plus a random jitter of up to ``poll_jitter * poll_interval``
(so that many readers restarted together spread their queries; an nsqd that appears is
found within ``poll_interval * (1 + poll_jitter)``). The producers of all lookupd are
united by ``broadcast_address:tcp_port``. A lookupd that is down, slow, or answers
garbage is logged and skipped; the others still count. A topic unknown to a lookupd
(``404 TOPIC_NOT_FOUND``) is an empty answer, not an error.

A slow lookupd never holds back what the others answered: each request is bounded as a
whole (``request_timeout`` seconds for the whole answer however slowly it comes, its body
within the ``"lookup"`` size limit: :mod:`nsq_spark.admin.transport`), and the producers
of each answer are reported as it arrives (``on_records`` is called when an answer adds
producers while other lookupds have not answered yet, and once more with the union when
the poll ends), so the first healthy answer is connected to at once, at start-up and
after :meth:`LookupdPoller.add_address` alike.

pynsq and go-nsq query one lookupd per interval, round-robin; we query all of them each
time, as the "Building Client Libraries" guide describes, so that one lookupd being down
never delays discovery.

Authorization (go-nsq's ``LookupdAuthorization``): a lookupd address with user info
(``http://user:password@host:4161``) sends it as ``Authorization: Basic``; any other gets
``Authorization: Bearer <auth_secret>`` when the poller is given an ``auth_secret`` (the
Reader gives its AUTH secret unless ``lookupd_authorization=False``, as go-nsq sends
``Config.AuthSecret`` by default). An address is kept and shown without its user info.

The pure parts (:func:`lookup_url`, :func:`next_poll_delay`, and lookupd's answers read by
the admin client's call layer, :func:`nsq_spark.admin.calls.parse_producers`, the one
parser of them) carry the logic and are unit-tested alone; :class:`LookupdPoller` and
:func:`lookup_sync` send their requests through the admin client's transports (the
HTTP path of discovery, the admin clients and the Spark driver; publishing over HTTP,
:mod:`nsq_spark._publish.http`, still uses tornado's client, see there), the poller with
tenacity retrying once what
:func:`nsq_spark.errors.is_transient` calls transient (no answer, HTTP 500/502/503/504).
"""

from __future__ import annotations

import asyncio
import inspect
import random
from typing import Any, Callable, Iterable, NamedTuple, Sequence
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_random

from ._log import get_logger
from ._addresses import parse_http_address, strip_userinfo
from .admin import calls
from .admin.calls import ACCEPT as ACCEPT  # moved there; importable here as before
from .admin.calls import read_answer
from .admin.client import authorization
from .admin.errors import HTTPStatusError, LookupdError
from .admin.model import Lookup, LookupdProducer
from .admin.transport import AsyncHttpTransport, AsyncTransport, Transport, answer_limit, \
    shared_transport
from .errors import PollerStoppedError, is_transient

log = get_logger("nsq_spark.lookupd")  # the name users filter on (docs/logging.md), not the module's

__all__ = ["LookupdError", "LookupdPoller", "ProducerAddress", "ProducerInfo", "lookup_url",
           "lookup_sync", "lookup_answer_sync", "lookupd_index", "parse_lookup_response", "parse_producer_records", "next_poll_delay",
           "producer_address"]

#: ``(broadcast_address, tcp_port)``: how producers are told apart and united.
ProducerAddress = tuple[str, int]
#: The old name of :data:`ProducerAddress`, kept for users; it is not ``nsq_spark.Producer``
#: (the publisher), hence the new name.
Producer = ProducerAddress

def lookup_url(address: str, topic: str) -> str:
    """The ``/lookup`` URL for ``topic`` at ``address``.

    ``address`` may be ``host:port``, ``http(s)://host:port``, or carry its own path (then
    kept, pynsq-style) and query parameters (kept, ``topic`` replaced). User info is
    left out of the URL (it is sent as a header: :func:`lookupd_authorization`).
    """
    address = address.strip() if isinstance(address, str) else address
    # the one address rule (query parameters are allowed here, and kept)
    parse_http_address(address.partition("?")[0] if isinstance(address, str) else address,
                       "lookupd HTTP address", "127.0.0.1:4161")
    address = strip_userinfo(address)
    if "://" not in address:
        address = "http://" + address
    scheme, netloc, path, query, fragment = urlsplit(address)
    if not path or path == "/":
        path = "/lookup"
    params = [(k, v) for k, v in parse_qsl(query, keep_blank_values=True) if k != "topic"]
    params.append(("topic", topic))
    return urlunsplit((scheme, netloc, path, urlencode(params), fragment))


def lookupd_index(addresses: Sequence[str], address: str, topic: str) -> int | None:
    """Where ``address`` is in ``addresses`` as the same lookupd (the same ``/lookup`` URL
    for ``topic``: ``h:4161`` and ``http://h:4161/`` are one), or None. The one rule for
    "is this lookupd polled already?"."""
    url = lookup_url(address, topic)
    for i, known in enumerate(addresses):
        if lookup_url(known, topic) == url:
            return i
    return None


def producer_address(producer: ProducerAddress) -> str:
    """``host:port`` (IPv6 hosts in brackets)."""
    host, port = producer
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{port}"


class ProducerInfo(NamedTuple):
    """One nsqd as a lookupd lists it: where to connect (TCP) and where its HTTP API is,
    and the topology hints of nsqd's topology-aware consumption when lookupd reports them
    (``topology_zone`` / ``topology_region``: an experiment on nsq's main branch; None
    from nsqlookupd v1.3.0)."""

    host: str
    tcp_port: int
    http_port: int | None
    topology_zone: str | None = None
    topology_region: str | None = None

    @property
    def producer(self) -> ProducerAddress:
        return (self.host, self.tcp_port)

    @property
    def http_address(self) -> str | None:
        """``host:http_port`` (IPv6 in brackets), or None if lookupd did not say."""
        return None if self.http_port is None else producer_address((self.host, self.http_port))


def parse_producer_records(body: bytes | str, source: str = "lookupd") -> list[ProducerInfo]:
    """The producers in a ``/lookup`` (or ``/nodes``) answer, nsqlookupd >= 1.0 or the
    older form with a ``data`` envelope. Raises :class:`LookupdError` if the answer is
    not such a response at all; single malformed producer entries are skipped with a
    warning. Read by :func:`nsq_spark.admin.calls.parse_producers`, the one parser of
    lookupd answers (discovery, the Spark driver and sink, the admin client)."""
    return [_record(p) for p in calls.parse_producers(body, source)]


def _record(p: LookupdProducer) -> ProducerInfo:
    return ProducerInfo(p.broadcast_address, p.tcp_port, p.http_port, p.topology_zone,
                        p.topology_region)


def parse_lookup_response(body: bytes | str, source: str = "lookupd") -> list[ProducerAddress]:
    """The ``(broadcast_address, tcp_port)`` of every producer in a ``/lookup`` answer
    (see :func:`parse_producer_records`)."""
    return [r.producer for r in parse_producer_records(body, source)]


def lookup_sync(address: str, topic: str, timeout: float = 2.0,
                path: str = "/lookup", transport: Transport | None = None,
                auth_secret: str | bytes | None = None) -> list[ProducerInfo]:
    """One blocking ``/lookup?topic=`` (or ``/nodes`` with ``path="/nodes"``) request
    within ``timeout`` seconds as a whole: the producers; ``[]`` for a topic the lookupd
    does not know. ``address``'s user info, else ``auth_secret``, is sent as
    ``Authorization`` (see the module doc). Raises an
    :class:`~nsq_spark.admin.errors.AdminError`: ``NodeUnreachableError`` (an
    ``OSError``) when the lookupd does not answer, ``AdminTLSError`` when the HTTPS
    handshake fails, ``UnexpectedAnswerError`` for an answer that is not HTTP, and
    :class:`LookupdError` for an answer that is not a lookup response (a non-2xx status
    included); callers that skip a failing lookupd catch ``AdminError``. For code
    without an event loop (the Spark driver and sink); ``transport`` defaults to the
    process's shared one."""
    return [_record(p) for p in lookup_answer_sync(address, topic, timeout, path, transport,
                                                   auth_secret).producers]


def lookup_answer_sync(address: str, topic: str, timeout: float = 2.0,
                       path: str = "/lookup", transport: Transport | None = None,
                       auth_secret: str | bytes | None = None) -> Lookup:
    """:func:`lookup_sync`'s request, its answer as the admin model has it (the one
    definition of a ``/lookup`` answer: :class:`~nsq_spark.admin.model.Lookup`, the
    topic's channels and producers); the same errors."""
    url = lookup_url(address, topic)
    if path != "/lookup":
        scheme, netloc, _, _, _ = urlsplit(url)
        url = urlunsplit((scheme, netloc, path, "", ""))
    call = calls.lookup(url)
    answer = (transport or shared_transport()).request(
        call.method, call.url, timeout, max_bytes=answer_limit(call.answer),
        authorization=authorization(address, auth_secret))
    try:
        found: Lookup = read_answer(call, answer)
    except HTTPStatusError as exc:
        raise LookupdError(str(exc)) from exc
    return found


def next_poll_delay(interval: float, jitter: float, rng: random.Random | None = None) -> float:
    """Seconds until the next poll: ``interval`` plus up to ``jitter * interval``."""
    r = (rng or random).random()
    return interval * (1.0 + jitter * r)


class LookupdPoller:
    """Polls every lookupd for ``topic`` and reports the union of producers.

    Args:
        addresses: lookupd HTTP addresses (``host:port`` or URLs).
        topic: the topic to look up.
        on_producers: called on the IO loop with the set of producers after each poll
            (also when it is empty; the caller decides what is new).
            Unlike ``on_records``, once per poll, when it ends.
        poll_interval: seconds between polls (pynsq's ``lookupd_poll_interval``).
        poll_jitter: fraction of ``poll_interval`` added at random to each wait
            (pynsq's ``lookupd_poll_jitter``), 0..1.
        connect_timeout, request_timeout: per request, seconds (pynsq's
            ``lookupd_connect_timeout`` / ``lookupd_request_timeout``):
            ``request_timeout`` bounds the whole request, however slowly a lookupd
            answers.
        attempts: tries per lookupd and poll for transport errors (tenacity).
        name: prefix for log lines.
        on_records: if given, also called with the union of the producer records
            (:class:`ProducerInfo`, first seen first, one per producer) so far: when an
            answer adds producers while other lookupds have not answered yet, and when
            the poll ends (so a slow lookupd never holds back what the others said).
        poll: if given, what each scheduled or triggered poll runs instead of
            :meth:`poll_once` (the consumer hands its owner's ``query_lookupd``, so that
            an override decides); an awaitable result is awaited.
        transport: the :class:`~nsq_spark.admin.transport.AsyncTransport` to send
            through (default: a transport of the poller's own, made at the first poll
            and closed by :meth:`stop`; one given here is the caller's to close).
        auth_secret: sent as ``Authorization: Bearer`` to every lookupd whose address
            has no user info (see the module doc); default None: not sent.
        max_answer_bytes: the size limit of a lookupd's answer (default None: the
            ``"lookup"`` limit of :data:`~nsq_spark.admin.transport.ANSWER_LIMITS`).

    Once :meth:`stop` began, a query (:meth:`poll_once`, :meth:`query_records`, e.g. an
    explicit poll racing with the stop) raises :class:`~nsq_spark.errors.PollerStoppedError`
    instead of making an HTTP client nothing would close; :meth:`start` polls again.
    """

    def __init__(self, addresses: Iterable[str], topic: str,
                 on_producers: Callable[[set[ProducerAddress]], Any],
                 poll_interval: float = 60, poll_jitter: float = 0.3,
                 connect_timeout: float = 1, request_timeout: float = 2,
                 attempts: int = 2, name: str = "", rng: random.Random | None = None,
                 on_records: Callable[[list[ProducerInfo]], Any] | None = None,
                 poll: Callable[[], Any] | None = None,
                 transport: AsyncTransport | None = None,
                 auth_secret: str | bytes | None = None,
                 max_answer_bytes: int | None = None) -> None:
        given = list(addresses)
        if not given:
            raise ValueError("LookupdPoller needs at least one lookupd HTTP address")
        self.auth_secret = auth_secret
        self.max_answer_bytes = max_answer_bytes
        #: the lookupds polled, as given but without user info
        self.addresses = [strip_userinfo(a.strip()) for a in given]
        self.urls = [lookup_url(a, topic) for a in given]
        #: url -> its Authorization header (None: none)
        self._authorization = {u: authorization(a.strip(), auth_secret)
                               for u, a in zip(self.urls, given)}
        if poll_interval <= 0:
            raise ValueError(f"lookupd_poll_interval must be > 0 seconds, got {poll_interval}")
        if not 0 <= poll_jitter <= 1:
            raise ValueError(f"lookupd_poll_jitter must be between 0 and 1, got {poll_jitter}")
        if connect_timeout <= 0 or request_timeout <= 0:
            raise ValueError("lookupd_connect_timeout and lookupd_request_timeout must be > 0 seconds")
        if attempts < 1:
            raise ValueError(f"attempts must be >= 1, got {attempts}")
        self.topic = topic
        self.on_producers = on_producers
        self.on_records = on_records
        self.poll = poll
        self.poll_interval = float(poll_interval)
        self.poll_jitter = float(poll_jitter)
        self.connect_timeout = float(connect_timeout)
        self.request_timeout = float(request_timeout)
        self.attempts = attempts
        self.name = name or topic
        self._log = log.bind(reader=self.name, topic=topic)
        self.rng = rng or random.Random()
        self.polls = 0  # completed polls (for stats and tests)
        self.last_producers: set[ProducerAddress] = set()
        self.failures: dict[str, str] = {}  # url -> last error, cleared on success
        self._own_transport = transport is None
        self._transport: AsyncTransport | None = transport
        self._task: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._stopped = False  # stop() began: no query, no new transport

    # -- one poll -----------------------------------------------------------------------

    async def query(self, url: str) -> list[ProducerAddress]:
        """One lookupd's producers; raises on transport errors and garbage."""
        return [r.producer for r in await self.query_records(url)]

    async def query_records(self, url: str) -> list[ProducerInfo]:
        """One lookupd's producer records; raises on transport errors and garbage, and
        :class:`~nsq_spark.errors.PollerStoppedError` once :meth:`stop` began."""
        self._check_running()
        transport = self._transport
        if transport is None:
            # our own client, closed in stop(): a Reader may start and stop many times
            transport = self._transport = AsyncHttpTransport(
                connect_timeout=self.connect_timeout)
        call = calls.lookup(url)
        limit = answer_limit(call.answer, self.max_answer_bytes)
        auth = self._authorization.get(url)
        async for attempt in AsyncRetrying(stop=stop_after_attempt(self.attempts),
                                           wait=wait_random(0.05, 0.25),
                                           retry=retry_if_exception(is_transient),
                                           reraise=True):
            with attempt:
                self._check_running()  # a retry after stop() began: its client is closed
                answer = await transport.request(call.method, call.url,
                                                 self.request_timeout, max_bytes=limit,
                                                 authorization=auth)
                # an unknown topic (404 TOPIC_NOT_FOUND) is an empty lookup
                found = read_answer(call, answer)
        return [_record(p) for p in found.producers]

    def _check_running(self) -> None:
        if self._stopped:
            raise PollerStoppedError(
                f"[{self.name}] the lookupd poller is stopped (its consumer closed or its "
                "last lookupd was disconnected): no query is sent; start() it again, or "
                "use Reader.connect_to_lookupd() to poll a lookupd again")

    async def poll_once(self) -> set[ProducerAddress]:
        """Query every lookupd concurrently; the union of what the healthy ones said.
        Each answer's producers are reported as it arrives (see ``on_records``)."""
        self._check_running()
        urls = list(self.urls)  # add_address/remove_address may run meanwhile
        tasks = {asyncio.ensure_future(self.query_records(u)): u for u in urls}
        producers: set[ProducerAddress] = set()
        records: list[ProducerInfo] = []
        pending = set(tasks)
        try:
            while pending:
                done, pending = await asyncio.wait(pending,
                                                   return_when=asyncio.FIRST_COMPLETED)
                added = False
                for task in sorted(done, key=lambda t: urls.index(tasks[t])):
                    added |= self._take(tasks[task], task, producers, records)
                if added and pending and self.on_records is not None:
                    # a slow lookupd must not hold back what this one said
                    self.on_records(list(records))
        finally:
            for task in pending:  # cancelled (stop(), or a failing callback)
                task.cancel()
        self.polls += 1
        self.last_producers = producers
        self.on_producers(producers)
        if self.on_records is not None:
            self.on_records(records)
        return producers

    def _take(self, url: str, task: "asyncio.Future[list[ProducerInfo]]",
              producers: set[ProducerAddress], records: list[ProducerInfo]) -> bool:
        """One lookupd's answer (or failure) into the poll's union; True if it added a
        producer."""
        if task.cancelled():
            raise asyncio.CancelledError()
        exc = task.exception()
        if exc is not None:
            if isinstance(exc, PollerStoppedError):
                raise exc
            msg = f"{type(exc).__name__}: {exc}"
            if self.failures.get(url) != msg:  # log a change of state, not every poll
                self._log.for_lookupd(url).warning(
                    "[%s] lookupd %s skipped: %s", self.name, url, msg)
            self.failures[url] = msg
            return False
        if url in self.failures:
            self._log.for_lookupd(url).info("[%s] lookupd %s answers again", self.name, url)
            del self.failures[url]
        added = False
        for record in task.result():
            if record.producer not in producers:
                producers.add(record.producer)
                records.append(record)
                added = True
        return added

    def add_address(self, address: str) -> bool:
        """Poll ``address`` too from the next poll on; False if it is polled already."""
        if lookupd_index(self.addresses, address, self.topic) is not None:
            return False
        url = lookup_url(address, self.topic)
        self.addresses.append(strip_userinfo(address.strip()))
        self.urls.append(url)
        self._authorization[url] = authorization(address.strip(), self.auth_secret)
        return True

    def remove_address(self, address: str) -> bool:
        """Stop polling ``address``; False if it was not polled."""
        i = lookupd_index(self.addresses, address, self.topic)
        if i is None:
            return False
        self.failures.pop(self.urls[i], None)
        self._authorization.pop(self.urls[i], None)
        del self.urls[i], self.addresses[i]
        return True

    # -- the loop -----------------------------------------------------------------------

    def start(self) -> None:
        """Poll now, then forever with jitter (on the running asyncio loop)."""
        if self._task is None:
            self._stopped = False
            self._wake = asyncio.Event()
            self._task = asyncio.ensure_future(self._run())

    def trigger(self) -> None:
        """Poll again soon (e.g. a connection to a discovered nsqd closed)."""
        if self._wake is not None:
            self._wake.set()

    async def _run(self) -> None:
        assert self._wake is not None
        while True:
            try:
                if self.poll is None:
                    await self.poll_once()
                else:
                    result = self.poll()
                    if inspect.isawaitable(result):
                        await result
            except asyncio.CancelledError:
                raise
            except Exception:  # on_producers failed: keep polling
                self._log.exception("[%s] lookupd poll failed", self.name)
            delay = next_poll_delay(self.poll_interval, self.poll_jitter, self.rng)
            try:
                await asyncio.wait_for(self._wake.wait(), delay)
                # triggered: wait a little (jittered) so a burst of closes makes one poll
                await asyncio.sleep(min(1.0, self.poll_interval) * (0.5 + self.rng.random()))
            except asyncio.TimeoutError:
                pass
            self._wake.clear()

    async def stop(self) -> None:
        """Stop polling and release the HTTP client. From its first step on, no query
        runs nor makes a client (:class:`~nsq_spark.errors.PollerStoppedError`); cancel
        explicit polls of :meth:`poll_once` before, as the consumer's pool does."""
        self._stopped = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        if self._transport is not None and self._own_transport:
            transport, self._transport = self._transport, None
            await transport.aclose()
