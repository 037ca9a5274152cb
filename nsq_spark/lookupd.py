"""Discovery of the nsqd that carry a topic, by polling nsqlookupd over HTTP.

At start every lookupd is queried at once (concurrently), then again every
``poll_interval`` seconds plus a random jitter of up to ``poll_jitter * poll_interval``
(so that many readers restarted together spread their queries; an nsqd that appears is
found within ``poll_interval * (1 + poll_jitter)``). The producers of all lookupd are
united by ``broadcast_address:tcp_port``. A lookupd that is down, slow, or answers
garbage is logged and skipped; the others still count. A topic unknown to a lookupd
(``404 TOPIC_NOT_FOUND``) is an empty answer, not an error.

pynsq and go-nsq query one lookupd per interval, round-robin; we query all of them each
time, as the "Building Client Libraries" guide describes, so that one lookupd being down
never delays discovery.

The pure parts (:func:`lookup_url`, :func:`parse_lookup_response`, :func:`next_poll_delay`)
carry the logic and are unit-tested alone; :class:`LookupdPoller` does the IO on tornado's
``AsyncHTTPClient`` with tenacity retrying transport errors once.
"""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any, Callable, Iterable, NamedTuple
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_random
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from ._log import get_logger
from .addresses import parse_http_address
from .errors import NSQError

log = get_logger(__name__)

__all__ = ["LookupdError", "LookupdPoller", "ProducerAddress", "ProducerInfo", "lookup_url",
           "lookup_sync", "parse_lookup_response", "parse_producer_records", "next_poll_delay",
           "producer_address"]

#: ``(broadcast_address, tcp_port)``: how producers are told apart and united.
ProducerAddress = tuple[str, int]
#: The old name of :data:`ProducerAddress`, kept for users; it is not ``nsq_spark.Producer``
#: (the publisher), hence the new name.
Producer = ProducerAddress

ACCEPT = "application/vnd.nsq; version=1.0"


class LookupdError(NSQError):
    """A lookupd answered something that is not a lookup response."""


def lookup_url(address: str, topic: str) -> str:
    """The ``/lookup`` URL for ``topic`` at ``address``.

    ``address`` may be ``host:port``, ``http(s)://host:port``, or carry its own path (then
    kept, pynsq-style) and query parameters (kept, ``topic`` replaced).
    """
    address = address.strip() if isinstance(address, str) else address
    # the one address rule (query parameters are allowed here, and kept)
    parse_http_address(address.partition("?")[0] if isinstance(address, str) else address,
                       "lookupd HTTP address", "127.0.0.1:4161")
    if "://" not in address:
        address = "http://" + address
    scheme, netloc, path, query, fragment = urlsplit(address)
    if not path or path == "/":
        path = "/lookup"
    params = [(k, v) for k, v in parse_qsl(query, keep_blank_values=True) if k != "topic"]
    params.append(("topic", topic))
    return urlunsplit((scheme, netloc, path, urlencode(params), fragment))


def producer_address(producer: ProducerAddress) -> str:
    """``host:port`` (IPv6 hosts in brackets)."""
    host, port = producer
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{port}"


class ProducerInfo(NamedTuple):
    """One nsqd as a lookupd lists it: where to connect (TCP) and where its HTTP API is."""

    host: str
    tcp_port: int
    http_port: int | None

    @property
    def producer(self) -> ProducerAddress:
        return (self.host, self.tcp_port)

    @property
    def http_address(self) -> str | None:
        """``host:http_port`` (IPv6 in brackets), or None if lookupd did not say."""
        return None if self.http_port is None else producer_address((self.host, self.http_port))


def _port(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536:
        return None
    return value


def parse_producer_records(body: bytes | str, source: str = "lookupd") -> list[ProducerInfo]:
    """The producers in a ``/lookup`` (or ``/nodes``) answer, nsqlookupd >= 1.0 or the
    older form with a ``data`` envelope. Raises :class:`LookupdError` if the answer is
    not such a response at all; single malformed producer entries are skipped with a
    warning. The one parser of lookupd answers: discovery, the Spark driver and the Spark
    sink all use it."""
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise LookupdError(f"{source} answered something that is not JSON ({exc}): "
                           f"{_preview(body)}; is this address an nsqlookupd HTTP port?") from None
    if isinstance(doc, dict) and "producers" not in doc and isinstance(doc.get("data"), dict):
        doc = doc["data"]  # pre-1.0 envelope: {"status_code":200,"data":{"producers":[...]}}
    producers = doc.get("producers") if isinstance(doc, dict) else None
    if not isinstance(producers, list):
        raise LookupdError(f"{source} answered JSON without a 'producers' list: "
                           f"{_preview(body)}; is this address an nsqlookupd HTTP port?")
    out: list[ProducerInfo] = []
    for p in producers:
        if not isinstance(p, dict):
            log.for_lookupd(source).warning(
                "%s: skipping a producer that is not an object: %r", source, p)
            continue
        host = p.get("broadcast_address") or p.get("address")
        port = _port(p.get("tcp_port"))
        if not isinstance(host, str) or not host or port is None:
            log.for_lookupd(source).warning(
                "%s: skipping a producer without broadcast_address/tcp_port: %r",
                source, p)
            continue
        out.append(ProducerInfo(host, port, _port(p.get("http_port"))))
    return out


def parse_lookup_response(body: bytes | str, source: str = "lookupd") -> list[ProducerAddress]:
    """The ``(broadcast_address, tcp_port)`` of every producer in a ``/lookup`` answer
    (see :func:`parse_producer_records`)."""
    return [r.producer for r in parse_producer_records(body, source)]


def lookup_sync(address: str, topic: str, timeout: float = 2.0,
                path: str = "/lookup") -> list[ProducerInfo]:
    """One blocking ``/lookup?topic=`` (or ``/nodes`` with ``path="/nodes"``) request:
    the producers; ``[]`` for a topic the lookupd does not know. Raises ``OSError`` for
    transport errors and :class:`LookupdError` for an answer that is not a lookup
    response. For code without an event loop (the Spark driver and sink)."""
    import urllib.error
    import urllib.request

    url = lookup_url(address, topic)
    if path != "/lookup":
        scheme, netloc, _, _, _ = urlsplit(url)
        url = urlunsplit((scheme, netloc, path, "", ""))
    req = urllib.request.Request(url, headers={"Accept": ACCEPT})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            body = resp.read()
    except urllib.error.HTTPError as exc:
        if exc.code == 404 and b"TOPIC_NOT_FOUND" in (exc.read() or b""):
            return []
        raise
    return parse_producer_records(body, url)


def next_poll_delay(interval: float, jitter: float, rng: random.Random | None = None) -> float:
    """Seconds until the next poll: ``interval`` plus up to ``jitter * interval``."""
    r = (rng or random).random()
    return interval * (1.0 + jitter * r)


def _preview(body: bytes | str, n: int = 120) -> str:
    text = body if isinstance(body, str) else body[:n].decode("utf-8", "replace")
    return repr(text[:n] + ("..." if len(body) > n else ""))


def _transport_error(exc: BaseException) -> bool:
    """Worth one retry: refused/reset connections, timeouts (599) and 5xx."""
    if isinstance(exc, HTTPClientError):
        return exc.code >= 500
    return isinstance(exc, OSError)


class LookupdPoller:
    """Polls every lookupd for ``topic`` and reports the union of producers.

    Args:
        addresses: lookupd HTTP addresses (``host:port`` or URLs).
        topic: the topic to look up.
        on_producers: called on the IO loop with the set of producers after each poll
            (also when it is empty; the caller decides what is new).
        poll_interval: seconds between polls (pynsq's ``lookupd_poll_interval``).
        poll_jitter: fraction of ``poll_interval`` added at random to each wait
            (pynsq's ``lookupd_poll_jitter``), 0..1.
        connect_timeout, request_timeout: per request, seconds (pynsq's
            ``lookupd_connect_timeout`` / ``lookupd_request_timeout``).
        attempts: tries per lookupd and poll for transport errors (tenacity).
        name: prefix for log lines.
    """

    def __init__(self, addresses: Iterable[str], topic: str,
                 on_producers: Callable[[set[ProducerAddress]], Any],
                 poll_interval: float = 60, poll_jitter: float = 0.3,
                 connect_timeout: float = 1, request_timeout: float = 2,
                 attempts: int = 2, name: str = "", rng: random.Random | None = None) -> None:
        self.addresses = list(addresses)
        if not self.addresses:
            raise ValueError("LookupdPoller needs at least one lookupd HTTP address")
        self.urls = [lookup_url(a, topic) for a in self.addresses]
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
        self._client: AsyncHTTPClient | None = None
        self._task: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None

    # -- one poll -----------------------------------------------------------------------

    async def query(self, url: str) -> list[ProducerAddress]:
        """One lookupd's producers; raises on transport errors and garbage."""
        if self._client is None:
            # our own instance, closed in stop(): a Reader may start and stop many times
            self._client = AsyncHTTPClient(force_instance=True)
        req = HTTPRequest(url, method="GET", headers={"Accept": ACCEPT},
                          connect_timeout=self.connect_timeout,
                          request_timeout=self.request_timeout)
        async for attempt in AsyncRetrying(stop=stop_after_attempt(self.attempts),
                                           wait=wait_random(0.05, 0.25),
                                           retry=retry_if_exception(_transport_error),
                                           reraise=True):
            with attempt:
                try:
                    resp = await self._client.fetch(req)
                except HTTPClientError as exc:
                    if exc.code == 404 and exc.response is not None and \
                            b"TOPIC_NOT_FOUND" in (exc.response.body or b""):
                        return []  # nothing published to this topic yet
                    raise
        return parse_lookup_response(resp.body, url)

    async def poll_once(self) -> set[ProducerAddress]:
        """Query every lookupd concurrently; the union of what the healthy ones said."""
        results = await asyncio.gather(*(self.query(u) for u in self.urls),
                                       return_exceptions=True)
        producers: set[ProducerAddress] = set()
        for url, res in zip(self.urls, results):
            if isinstance(res, BaseException):
                if isinstance(res, asyncio.CancelledError):
                    raise res
                msg = f"{type(res).__name__}: {res}"
                if self.failures.get(url) != msg:  # log a change of state, not every poll
                    self._log.for_lookupd(url).warning(
                        "[%s] lookupd %s skipped: %s", self.name, url, msg)
                self.failures[url] = msg
                continue
            if url in self.failures:
                self._log.for_lookupd(url).info("[%s] lookupd %s answers again", self.name, url)
                del self.failures[url]
            producers.update(res)
        self.polls += 1
        self.last_producers = producers
        self.on_producers(producers)
        return producers

    # -- the loop -----------------------------------------------------------------------

    def start(self) -> None:
        """Poll now, then forever with jitter (on the running asyncio loop)."""
        if self._task is None:
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
                await self.poll_once()
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
        """Stop polling and release the HTTP client."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        if self._client is not None:
            self._client.close()
            self._client = None
