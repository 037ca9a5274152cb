"""The replicated transport: each message on N distinct nsqds, done once W acknowledged.

``Producer(replicas=N, write_quorum=W)`` publishes through this transport. It drives the
pure planner (:mod:`.replicas`: which nsqds, substitution, the quorum) over the direct
transport's parts, talking to one chosen nsqd at a time
(:meth:`~.sync.BlockingPool.send_to`, :meth:`~.tcp.PipelinedPool.send_to`,
:meth:`~.http.HttpPublisher.pub_to`):

* **blocking** (``publish``/``mpublish`` over TCP): the copies go out one after the other
  from the calling thread over its plain sockets (N round trips, ~10 us each on a LAN: no
  hop to an IO thread), so the call returns when every replica answered or failed --
  with at least W acknowledged;
* **futures and asyncio** (and HTTP, whose client lives on the loop): the copies go out
  at once, and the call settles as soon as W acknowledged; the slower replicas (and any
  substitute for one that fails) go on in the background, bounded by
  ``publish_timeout``, and ``close()`` waits for them (bounded by ``close_timeout``).

One encoded command (or one list of MPUB commands, when ``max_mpub_bytes`` splits a
batch) is placed as a unit: an nsqd counts as a replica only when it acknowledged all of
it. A round that ends with fewer than W copies is retried with the one retry policy
(:mod:`.retry`: until ``retry_deadline``, within ``publish_timeout``), sending only to
nsqds that do not hold the message yet; the last failure is a
:class:`~nsq_spark.errors.ReplicationError` naming how many acknowledged, which nsqds
failed and the fix -- or, when every nsqd refused the message itself (a body over
nsqd's size limit), that refusal, as a publish without replicas raises it. A publish
that met W but not N copies (a replica down and no other nsqd to take its place) counts
in ``stats()["under_replicated"]`` (messages) and is logged (WARNING, at most every 30 s).

The spool's drain sends through :meth:`ReplicatedTransport.replicate`: one round, no
retry, the nsqds that already hold the batch given (see :mod:`nsq_spark.spool.drain`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from typing import Any, NamedTuple, Sequence

from nsq_spark.errors import NSQError, ReplicationError, is_transient

from .._log import get_logger
from .direct import DirectTransport
from .replicas import ReplicaChooser, ReplicaPlan
from .transport import publish_timed_out

log = get_logger("nsq_spark.producer")

__all__ = ["ReplicatedTransport"]

#: seconds between two WARNING logs about under-replicated publishes
_WARN_EVERY = 30.0


class _Payload(NamedTuple):
    """One publish, encoded once for every replica."""
    topic: str
    datas: list[bytes]         # encoded PUB/DPUB or MPUB command(s)
    body: bytes | None         # a single message's body (the HTTP path posts it as is)
    defer_ms: int | None
    messages: int


class ReplicatedTransport:
    """Each message on ``replicas`` distinct nsqds of ``direct``'s (see the module doc).

    Args:
        direct: the direct transport whose pools, loop, HTTP client, retry policy and
            counters this one drives (it owns them and closes them).
        replicas: N, 1 .. the number of nsqd.
        quorum: W, 1 .. N.
    """

    def __init__(self, direct: DirectTransport, *, replicas: int, quorum: int) -> None:
        self.direct = direct
        self.nsqd_tcp_addresses = direct.nsqd_tcp_addresses
        self.nsqd_http_addresses = direct.nsqd_http_addresses
        http = direct.http
        addresses = http.addresses if http is not None else direct.nsqd_tcp_addresses
        self.chooser = ReplicaChooser(addresses, replicas, quorum)   # ValueError: the facade
        self.replicas = replicas
        self.write_quorum = quorum
        self.under_replicated = 0          # messages acknowledged by W .. N-1 nsqds
        self._next_warning = 0.0
        self._background: set[asyncio.Task[Any]] = set()

    # -- which nsqd are healthy ------------------------------------------------------------

    def _healthy(self, address: str) -> bool:
        if self.direct.http is not None:
            return self.direct._stats.is_up(address) is not False
        return not self.direct.health.backing_off(address)

    # -- encoding (in the caller's thread: bad input fails at once) ----------------------

    def _pub(self, topic: str, body: bytes, defer_ms: int | None) -> _Payload:
        if self.direct.http is not None:
            self.direct._check_http_pub(topic, body)
            return _Payload(topic, [], bytes(body), defer_ms, 1)
        return _Payload(topic, [self.direct.encode_pub(topic, body, defer_ms)], None,
                        defer_ms, 1)

    def _mpub(self, topic: str, bodies: Sequence[bytes]) -> _Payload:
        datas = self.direct.encode_mpub(topic, bodies)
        return _Payload(topic, datas, None, None, len(bodies))

    # -- the outcome of a round -----------------------------------------------------------

    def _failure(self, plan: ReplicaPlan, failed: dict[str, BaseException],
                 p: _Payload) -> BaseException:
        """What a round short of its quorum raises: every nsqd's own refusal of the
        message, when that is what all of them answered (as without replicas), else a
        ReplicationError."""
        errors = list(failed.values())
        if errors and not plan.holders and not any(is_transient(e) for e in errors) \
                and len({type(e) for e in errors}) == 1:
            return errors[0]
        what = "a replicated publish" if p.messages == 1 else \
            f"a replicated publish of {p.messages} messages"
        return ReplicationError(sorted(plan.holders), failed, replicas=plan.replicas,
                                quorum=plan.quorum, candidates=len(self.chooser.addresses),
                                what=what)

    def _settled(self, plan: ReplicaPlan, failed: dict[str, BaseException],
                 p: _Payload) -> None:
        """A round that met its quorum ended: count (and say) when it made fewer than N
        copies."""
        if plan.complete:
            return
        self.under_replicated += p.messages
        now = time.monotonic()
        if now >= self._next_warning:
            self._next_warning = now + _WARN_EVERY
            causes = "; ".join(f"{a}: {e}" for a, e in failed.items()) or "none"
            log.warning("replicated publish to %r: %d of %d replicas hold it (write_quorum=%d "
                        "met; failed: %s); %d messages under-replicated so far. Give more "
                        "nsqd addresses than replicas so that a failed one is replaced, or "
                        "use spool_dir (it keeps each message until all %d have it)",
                        p.topic, len(plan.holders), plan.replicas, plan.quorum, causes,
                        self.under_replicated, plan.replicas)

    # -- blocking (TCP) -------------------------------------------------------------------

    def _deadline(self) -> float | None:
        timeout = self.direct.publish_timeout
        return None if timeout is None else time.monotonic() + timeout

    def _round(self, p: _Payload, holders: set[str], quorum: int | None,
               deadline: float | None, track: bool) -> None:
        """One round from this thread: the targets one after the other, a substitute for
        each failure. Raises when the quorum was not met."""
        plan = self.chooser.plan(self._healthy, frozenset(holders), quorum)
        failed: dict[str, BaseException] = {}
        queue = plan.start()
        pool = self.direct.blocking
        while queue:
            target = queue.pop(0)
            try:
                pool.send_to(target, p.datas, deadline)
            except Exception as exc:  # noqa: BLE001 - each replica's failure is reported
                failed[target] = exc
                sub = plan.failed(target)
                if sub is not None:
                    queue.append(sub)
            else:
                plan.acked(target)
        holders.update(plan.holders)
        if not plan.quorum_met:
            raise self._failure(plan, failed, p)
        if track:
            self._settled(plan, failed, p)

    def _blocking(self, p: _Payload, have: frozenset[str] = frozenset(),
                  quorum: int | None = None, tries: int | None = None,
                  track: bool = True) -> frozenset[str]:
        direct = self.direct
        direct.home.check_off_loop()
        deadline = self._deadline()
        holders = set(have)
        try:
            for attempt in direct.retry.retrying(
                    tries=tries, stopped=lambda: direct._closed, deadline=deadline,
                    on_retry=lambda _: direct._stats.retried()):
                with attempt:
                    self._round(p, holders, quorum, deadline, track)
        except Exception:
            direct._stats.failed(None, p.messages)
            raise
        return frozenset(holders)

    def publish(self, topic: str, body: bytes, defer_ms: int | None = None) -> None:
        p = self._pub(topic, body, defer_ms)
        if self.direct.http is not None:
            self.direct._wait(self._submit(p))
            return
        self._blocking(p)

    def mpublish(self, topic: str, bodies: Sequence[bytes]) -> None:
        p = self._mpub(topic, bodies)
        if self.direct.http is not None:
            self.direct._wait(self._submit(p))
            return
        self._blocking(p)

    # -- the spool's sender ------------------------------------------------------------

    def replicate(self, topic: str, bodies: Sequence[bytes], defer_ms: int | None = None,
                  have: frozenset[str] = frozenset(), need: int | None = None
                  ) -> frozenset[str]:
        """One round for the spool's drain (no retry; its drain retries): send the batch
        to the nsqds that do not hold it yet (``have``), substituting for failures; the
        nsqds holding it afterwards. Fewer than ``need`` (default: the write quorum)
        raise: a ReplicationError whose ``acked`` has the holders, or every nsqd's own
        refusal of the message."""
        if defer_ms is not None or len(bodies) == 1:
            p = self._pub(topic, bodies[0], defer_ms)
        else:
            p = self._mpub(topic, bodies)
        # (the drain keeps what is short of N and completes it: not under-replicated)
        if self.direct.http is not None:
            result: frozenset[str] = self.direct._wait(
                self._submit(p, have, need, tries=1, track=False))
            return result
        return self._blocking(p, have, need, tries=1, track=False)

    # -- futures and asyncio: the copies at once, settled at the quorum ------------------

    def _submit(self, p: _Payload, have: frozenset[str] = frozenset(),
                quorum: int | None = None, tries: int | None = None, track: bool = True
                ) -> concurrent.futures.Future[Any]:
        if self.direct._closed:
            raise NSQError("the producer is closed")
        return self.direct.home.submit(self._replicate(p, have, quorum, tries, track))

    async def _send(self, target: str, p: _Payload, until: float | None) -> None:
        direct = self.direct
        if direct.http is not None:
            if p.body is not None:
                send = direct.http.pub_to(target, p.topic, p.body, p.defer_ms)
            else:
                send = direct.http.mpub_to(target, p.topic, p.datas)
        else:
            send = direct.tcp.send_to(target, p.datas)
        if until is None:
            await send
            return
        left = until - time.monotonic()
        if left <= 0:
            send.close()
            raise publish_timed_out(direct.publish_timeout)
        try:
            await asyncio.wait_for(send, left)
        except asyncio.TimeoutError:
            raise publish_timed_out(direct.publish_timeout) from None

    async def _round_async(self, p: _Payload, holders: set[str], quorum: int | None,
                           until: float | None, track: bool) -> None:
        """One round on the loop: every target at once; returns once the quorum is met
        (the rest goes on in the background), raises once the round settled short."""
        plan = self.chooser.plan(self._healthy, frozenset(holders), quorum)
        failed: dict[str, BaseException] = {}
        loop = asyncio.get_running_loop()
        decided: asyncio.Future[None] = loop.create_future()

        def launch(target: str) -> None:
            task = asyncio.ensure_future(self._send(target, p, until))
            self._background.add(task)
            task.add_done_callback(lambda t: answered(target, t))

        def answered(target: str, task: "asyncio.Task[None]") -> None:
            self._background.discard(task)
            exc = asyncio.CancelledError() if task.cancelled() else task.exception()
            if exc is None:
                plan.acked(target)
            else:
                failed[target] = exc
                sub = plan.failed(target)
                if sub is not None:
                    launch(sub)
            holders.update(plan.holders)
            if not decided.done():
                if plan.quorum_met:
                    decided.set_result(None)
                elif plan.settled:
                    decided.set_exception(self._failure(plan, failed, p))
            if track and plan.settled and plan.quorum_met:
                self._settled(plan, failed, p)

        targets = plan.start()
        if not targets:   # nothing to send to (every nsqd holds it, or none is left)
            if plan.quorum_met:
                return
            raise self._failure(plan, failed, p)
        for target in targets:
            launch(target)
        await decided

    async def _replicate(self, p: _Payload, have: frozenset[str] = frozenset(),
                         quorum: int | None = None, tries: int | None = None,
                         track: bool = True) -> Any:
        direct = self.direct
        until = self._deadline()
        holders = set(have)
        try:
            async for attempt in direct.retry.async_retrying(
                    tries=tries, stopped=lambda: direct._closed, deadline=until,
                    on_retry=lambda _: direct._stats.retried()):
                with attempt:
                    await self._round_async(p, holders, quorum, until, track)
        except Exception:
            direct._stats.failed(None, p.messages)
            raise
        return frozenset(holders) if tries == 1 else b"OK"

    def publish_async(self, topic: str, body: bytes, defer_ms: int | None
                      ) -> concurrent.futures.Future[bytes]:
        return self._submit(self._pub(topic, body, defer_ms))

    def mpublish_async(self, topic: str, bodies: Sequence[bytes]
                       ) -> concurrent.futures.Future[Any]:
        return self._submit(self._mpub(topic, bodies))

    async def apublish(self, topic: str, body: bytes, defer_ms: int | None) -> None:
        if not self.direct.home.on_it():
            await asyncio.wrap_future(self.publish_async(topic, body, defer_ms))
            return
        await self._replicate(self._pub(topic, body, defer_ms))

    async def ampublish(self, topic: str, bodies: Sequence[bytes]) -> None:
        if not self.direct.home.on_it():
            await asyncio.wrap_future(self.mpublish_async(topic, bodies))
            return
        await self._replicate(self._mpub(topic, bodies))

    def publish_nowait(self, topic: str, body: bytes, defer_ms: int | None
                       ) -> "asyncio.Future[bytes]":
        if self.direct.home.loop is None:
            self.direct.home.bind_running()
        p = self._pub(topic, body, defer_ms)
        return asyncio.ensure_future(self._replicate(p))

    # -- state: the direct transport's, with the replication counters ----------------------

    def flush(self, timeout: float | None = None) -> bool:
        return True   # every blocking call already waited for its quorum

    def redrive(self) -> int:
        return self.direct.redrive()

    @property
    def published(self) -> int:
        return self.direct.published

    @property
    def last_error(self) -> BaseException | None:
        return None

    def pending_bytes(self) -> int:
        return 0

    def stats(self) -> dict[str, Any]:
        out = self.direct.stats()
        out.update(replicas=self.replicas, write_quorum=self.write_quorum,
                   under_replicated=self.under_replicated)
        return out

    # -- closing: the copies still on their way first ------------------------------------

    async def _settle_background(self) -> None:
        pending = list(self._background)
        if pending:
            await asyncio.wait(pending, timeout=self.direct.config.close_timeout)

    def close(self, timeout: float | None = None) -> None:
        loop = self.direct.home.loop
        if self._background and loop is not None and not loop.is_closed() \
                and loop.is_running():
            try:
                running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is not loop:   # (on the loop itself it cannot be waited for)
                try:
                    asyncio.run_coroutine_threadsafe(self._settle_background(), loop).result(
                        self.direct.config.close_timeout + 1.0)
                except Exception as exc:  # noqa: BLE001 - closing goes on
                    log.debug("replicated producer close: %s", exc)
        self.direct.close(timeout)

    async def aclose(self) -> None:
        await self._settle_background()
        await self.direct.aclose()

    async def enter_async(self) -> None:
        await self.direct.enter_async()

    async def exit_async(self) -> None:
        if self.direct.home.own_thread:
            await asyncio.to_thread(self.close)
        else:
            await self.aclose()
