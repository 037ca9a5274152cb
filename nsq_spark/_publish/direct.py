"""The direct transport: every call talks to nsqd, over TCP or nsqd's HTTP API.

Three paths, one per kind of caller, built once:

* blocking ``publish``/``mpublish``: :class:`~.sync.BlockingPool`, plain sockets from the
  calling thread (no hop to an IO thread: that would cost ten times the round trip);
* futures and asyncio: :class:`~.tcp.PipelinedPool` on the loop :class:`~nsq_spark._loop.
  LoopHome` chooses (the caller's running loop, or an IO thread of our own);
* ``nsqd_http_addresses``: :class:`~.http.HttpPublisher` on that same loop, the blocking
  calls waiting for its future.

Both TCP pools ask one :class:`~.health.NsqdHealth` which nsqd to try. Commands are
encoded in the caller's thread, so bad input fails at once, before anything is sent.
This transport is also the spool's default sender (:class:`nsq_spark.spool._drain.Sender`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Any, Sequence

from nsq_spark import protocol
from nsq_spark._loop import LoopHome
from nsq_spark._addresses import Address
from nsq_spark.config import ConnectionConfig, ProducerOptions
from nsq_spark.errors import ConfigError, NSQError

from .._log import get_logger
from .health import NsqdHealth
from .http import HttpPublisher
from .._retry import RetryPolicy
from .stats import PublishStats
from .sync import BlockingPool
from .tcp import PipelinedPool
from .transport import all_of, publish_timed_out, within

log = get_logger("nsq_spark.producer")

__all__ = ["DirectTransport"]


class DirectTransport:
    """Publishing straight to nsqd (see the module doc).

    Args:
        tcp: the nsqd TCP addresses in the configured order (or none, with ``http``).
        http: ``(scheme, address, path prefix)`` per nsqd HTTP endpoint (or none).
        config: connection options.
        options: the Producer's options (:class:`~nsq_spark.config.ProducerOptions`):
            ``strategy``; the retry policy of every path (``max_tries``,
            ``retry_deadline``, ``retry_wait``, ``retry_max_wait``); ``publish_timeout``,
            the seconds one call may take in all (None: the retry policy bounds);
            ``max_msg_size``, over which bodies raise InvalidBodyError before sending (None:
            no check here); ``max_mpub_bytes``, over which an MPUB body is split into
            several MPUBs; ``blocking_connections``, the sockets per nsqd the blocking
            callers share.
        stats: the counters.
    """

    def __init__(self, tcp: Sequence[Address], http: Sequence[tuple[str, Address, str]],
                 config: ConnectionConfig, options: ProducerOptions, *,
                 stats: PublishStats) -> None:
        retry = RetryPolicy(options.max_tries, options.retry_deadline, options.retry_wait,
                            options.retry_max_wait)
        publish_timeout = options.publish_timeout
        addresses: dict[str, Address] = {str(a): a for a in tcp}
        self.nsqd_tcp_addresses = list(addresses)
        self.nsqd_http_addresses = [f"{s}://{a}{p}" for s, a, p in http]
        self.config = config
        self.publish_timeout = publish_timeout
        self.max_msg_size = options.max_msg_size
        self.max_mpub_bytes = options.max_mpub_bytes
        self.retry = retry
        self._stats = stats
        self._closed = False
        self.home = LoopHome("producer", closed=lambda: self._closed, on_lost=self._forget,
                             async_hint="await producer.apublish(...)")
        self.http = HttpPublisher(http, config, retry, stats,
                                  lambda: self._closed) if http else None
        self.health = health = NsqdHealth(self.nsqd_tcp_addresses, options.strategy,
                                          retry_wait=retry.wait,
                                          retry_max_wait=retry.max_wait, stats=stats)
        self.tcp = PipelinedPool(
            addresses, config, health=health, retry=retry, stats=stats,
            loop=self.home.current, stopped=lambda: self._closed, timeout=publish_timeout)
        self.blocking = BlockingPool(
            addresses, config, health=health,
            connections_per_nsqd=options.blocking_connections,
            retry=retry, stats=stats, stopped=lambda: self._closed, timeout=publish_timeout)

    def _forget(self) -> None:
        """The caller's loop we were bound to has ended: drop what lived on it."""
        self.tcp.forget()
        if self.http is not None:
            self.http.forget()

    # -- encoding (in the caller's thread: bad input fails at once) ----------------------

    def encode_pub(self, topic: str, body: bytes, defer_ms: int | None) -> bytes:
        if defer_ms:
            return protocol.dpub(topic, int(defer_ms), body, self.max_msg_size)
        return protocol.pub(topic, body, self.max_msg_size)

    def encode_mpub(self, topic: str, bodies: Sequence[bytes]) -> list[bytes]:
        """MPUB commands for ``bodies``: one, or several when over ``max_mpub_bytes``."""
        if not isinstance(bodies, (list, tuple)):
            bodies = list(bodies)
        try:
            total = sum(map(len, bodies)) + 4 * len(bodies) + 4 if bodies else 0
        except TypeError:
            total = 0  # protocol.mpub names the offending body
        if total <= self.max_mpub_bytes:
            return [protocol.mpub(topic, bodies, self.max_msg_size)]
        return [protocol.mpub(topic, batch, self.max_msg_size)
                for batch in protocol.split_bodies(bodies, self.max_mpub_bytes)]

    def _check_http_pub(self, topic: str, body: bytes) -> None:
        protocol._check_body(body, self.max_msg_size)
        protocol.check_topic(topic)

    # -- blocking ------------------------------------------------------------------------

    def publish(self, topic: str, body: bytes, defer_ms: int | None = None) -> None:
        if self.http is not None:
            self._wait(self.publish_async(topic, body, defer_ms))
            return
        data = self.encode_pub(topic, body, defer_ms)
        self.home.check_off_loop()
        self.blocking.command(data)

    def mpublish(self, topic: str, bodies: Sequence[bytes]) -> None:
        if self.http is not None:
            self._wait(self.mpublish_async(topic, bodies))
            return
        for data in self.encode_mpub(topic, bodies):
            self.home.check_off_loop()
            self.blocking.command(data)

    def _wait(self, fut: concurrent.futures.Future[Any]) -> Any:
        # the future itself ends at publish_timeout; the margin lets its own error, which
        # names the last failure, arrive first
        timeout = None if self.publish_timeout is None else self.publish_timeout + 1.0
        try:
            return fut.result(timeout)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise publish_timed_out(self.publish_timeout) from None

    # -- futures ---------------------------------------------------------------------------

    def publish_async(self, topic: str, body: bytes, defer_ms: int | None = None
                      ) -> concurrent.futures.Future[bytes]:
        if self.http is not None:
            self._check_http_pub(topic, body)
            return self.home.submit(within(self.http.pub(topic, body, defer_ms),
                                           self.publish_timeout))
        return self._submit(self.encode_pub(topic, body, defer_ms))

    def mpublish_async(self, topic: str, bodies: Sequence[bytes]
                       ) -> concurrent.futures.Future[Any]:
        datas = self.encode_mpub(topic, bodies)
        if self.http is not None:
            return self.home.submit(within(self.http.mpub(topic, datas), self.publish_timeout))
        if len(datas) == 1:
            return self._submit(datas[0])
        return all_of([self._submit(d) for d in datas])

    def _submit(self, data: bytes) -> concurrent.futures.Future[bytes]:
        if self._closed:
            raise NSQError("the producer is closed")
        self.home.for_threads()
        return self.tcp.submit(data)

    # -- asyncio -----------------------------------------------------------------------

    async def apublish(self, topic: str, body: bytes, defer_ms: int | None = None) -> None:
        if not self.home.on_it():   # the producer lives on another loop: hop there
            await asyncio.wrap_future(self.publish_async(topic, body, defer_ms))
            return
        if self.http is not None:
            self._check_http_pub(topic, body)
            await within(self.http.pub(topic, body, defer_ms), self.publish_timeout)
            return
        await self.tcp.command_future(self.encode_pub(topic, body, defer_ms))

    async def ampublish(self, topic: str, bodies: Sequence[bytes]) -> None:
        if not self.home.on_it():
            await asyncio.wrap_future(self.mpublish_async(topic, bodies))
            return
        datas = self.encode_mpub(topic, bodies)
        if self.http is not None:
            await within(self.http.mpub(topic, datas), self.publish_timeout)
            return
        if len(datas) == 1:
            await self.tcp.command_future(datas[0])
        else:
            await asyncio.gather(*(self.tcp.command_future(d) for d in datas))

    def publish_nowait(self, topic: str, body: bytes, defer_ms: int | None = None
                       ) -> "asyncio.Future[bytes]":
        if self.home.loop is None:
            self.home.bind_running()
        return self.tcp.command_future(self.encode_pub(topic, body, defer_ms))

    # -- state ---------------------------------------------------------------------------

    def flush(self, timeout: float | None = None) -> bool:
        return True   # every blocking call already waited for nsqd

    def redrive(self) -> int:
        raise ConfigError("redrive() moves a spool's rejected messages back: this Producer "
                          "has no spool_dir (give Producer(..., spool_dir=path))")

    @property
    def published(self) -> int:
        return self._stats.commands

    @property
    def last_error(self) -> BaseException | None:
        return None   # a direct call raises its failure to its caller

    def pending_bytes(self) -> int:
        return 0

    def stats(self) -> dict[str, Any]:
        out = self._stats.snapshot()
        out["published"] = out["commands"]
        out["connected"] = sorted(self.tcp.connected() | self.blocking.connected())
        out["down"] = {a: d["last_error"] for a, d in out["nsqd"].items() if d["up"] is False}
        return out

    # -- closing -------------------------------------------------------------------------

    async def _close_on_loop(self) -> None:
        self._closed = True
        await self.tcp.close()
        if self.http is not None:
            self.http.close()

    def close(self, timeout: float | None = None) -> None:
        self._closed = True
        self.blocking.close()
        self.home.shutdown(self._close_on_loop, timeout if timeout is not None
                           else self.config.close_timeout + 5)

    async def aclose(self) -> None:
        self._closed = True
        self.blocking.close()
        await self._close_on_loop()

    async def enter_async(self) -> None:
        self.home.bind_running()

    async def exit_async(self) -> None:
        if self.home.own_thread:
            await asyncio.to_thread(self.close)
        else:
            await self.aclose()
