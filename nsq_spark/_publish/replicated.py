"""The replicated transport: each message on N distinct nsqds, done once W acknowledged.

``Producer(replicas=N, write_quorum=W)`` publishes through this transport. It drives the
pure planner (:mod:`.replicas`: which nsqds, substitution, the quorum) over the direct
transport's parts, talking to one chosen nsqd at a time
(:meth:`~.sync.BlockingPool.send_to`, :meth:`~.tcp.PipelinedPool.send_to`,
:meth:`~.http.HttpPublisher.pub_to`):

* **blocking** (``publish``/``mpublish`` over TCP): the copies go out one after the other
  from the calling thread over its plain sockets (N round trips, ~10 us each on a LAN: no
  hop to an IO thread), so the call returns when every replica answered or failed --
  with at least W acknowledged. Once W hold it, a replica that is backing off after a
  failure is skipped rather than waited for (a frozen nsqd would hold every call up for
  ``response_timeout``);
* **futures and asyncio** (and HTTP, whose client lives on the loop): the copies go out
  at once, and the call settles as soon as W acknowledged (or ``publish_timeout``
  passed); the slower replicas (and any substitute for one that fails) go on in the
  background, each answer bounded by ``response_timeout``, and ``close()`` waits for
  them (bounded by ``close_timeout``).

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
retry, the nsqds that already hold the batch given (see :mod:`nsq_spark.spool._drain`).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import functools
import threading
import time
from typing import Any, Callable, NamedTuple, Sequence

from nsq_spark.errors import ConnectError, NSQError, ReplicationError, is_transient

from .._log import get_logger
from .direct import DirectTransport
from .health import NsqdHealth
from .replicas import ReplicaChooser, ReplicaPlan
from .transport import publish_timed_out

log = get_logger("nsq_spark.producer")

__all__ = ["ReplicatedTransport"]

#: seconds between two WARNING logs about under-replicated publishes
_WARN_EVERY = 30.0


class _Payload(NamedTuple):
    """One publish, encoded once for every replica."""
    topic: str
    datas: tuple[bytes, ...]   # encoded PUB/DPUB or MPUB command(s) (a tuple: the
                               # garbage collector stops tracking it)
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
        # which nsqd are backing off after a failure: the TCP pools' own record, or one
        # kept here for the HTTP endpoints
        self._health = direct.health if http is None else NsqdHealth(
            addresses, "round_robin", retry_wait=direct.retry.wait,
            retry_max_wait=direct.retry.max_wait, stats=direct._stats)
        self._lock = threading.Lock()      # the counters, from threads and the loop
        self.replicas = replicas
        self.write_quorum = quorum
        self.under_replicated = 0          # messages acknowledged by W .. N-1 nsqds
        self._next_warning = 0.0
        self._background: set[asyncio.Task[Any]] = set()   # slow-path sends on the loop
        self._unsettled = 0                                # publishes with copies out
        self._inbox: collections.deque[tuple[Any, ...]] = collections.deque()
        self._inbox_scheduled = False
        self._by_deadline: collections.deque[_Publish] = collections.deque()
        self._sweeper: asyncio.TimerHandle | None = None

    # -- which nsqd are healthy ------------------------------------------------------------

    def _healthy(self, address: str) -> bool:
        return not self._health.backing_off(address)

    def _copy_landed(self, target: str, exc: BaseException | None) -> None:
        """HTTP: a copy's outcome is the nsqd's health (over TCP the pools record it as
        they connect), so that a failed nsqd is tried last, and again after its backoff."""
        if self.direct.http is None:
            return
        if exc is None:
            self._health.connected(target)
        elif is_transient(exc):
            self._health.connect_failed(target, exc)

    # -- encoding (in the caller's thread: bad input fails at once) ----------------------

    def _pub(self, topic: str, body: bytes, defer_ms: int | None) -> _Payload:
        if self.direct.http is not None:
            self.direct._check_http_pub(topic, body)
            return _Payload(topic, (), bytes(body), defer_ms, 1)
        return _Payload(topic, (self.direct.encode_pub(topic, body, defer_ms),), None,
                        defer_ms, 1)

    def _mpub(self, topic: str, bodies: Sequence[bytes]) -> _Payload:
        datas = tuple(self.direct.encode_mpub(topic, bodies))
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
        now = time.monotonic()
        with self._lock:
            self.under_replicated += p.messages
            warn = now >= self._next_warning
            if warn:
                self._next_warning = now + _WARN_EVERY
        if warn:
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

    def _round(self, p: _Payload, have: frozenset[str], quorum: int | None,
               deadline: float | None, track: bool) -> ReplicaPlan:
        """One round from this thread: the targets one after the other, a substitute for
        each failure; the plan, once it met its quorum (else its failure is raised)."""
        plan = self.chooser.plan(self._healthy, have, quorum)
        failed: dict[str, BaseException] | None = None
        queue = plan.start()
        pool = self.direct.blocking
        while queue:
            target = queue.pop(0)
            if plan.quorum_met and not self._healthy(target):
                # one after the other, a replica that just failed (a frozen nsqd: up to
                # response_timeout) would hold every call up; once the quorum holds it,
                # it is skipped while it backs off (the spool's drain completes it later)
                exc: BaseException = ConnectError(
                    f"nsqd at {target} is backing off after a failure: skipped, the "
                    "write quorum was met")
            else:
                try:
                    pool.send_to(target, p.datas, deadline)
                except Exception as error:  # noqa: BLE001 - each replica's is reported
                    exc = error
                else:
                    plan.acked(target)
                    continue
            if failed is None:
                failed = {}
            failed[target] = exc
            sub = plan.failed(target)
            if sub is not None:
                queue.append(sub)
        if not plan.quorum_met:
            raise self._failure(plan, failed or {}, p)
        if track and not plan.complete:
            self._settled(plan, failed or {}, p)
        return plan

    def _blocking(self, p: _Payload, have: frozenset[str] = frozenset(),
                  quorum: int | None = None, tries: int | None = None,
                  track: bool = True) -> ReplicaPlan:
        """The rounds from this thread: the first without the retry machinery (~20 us
        to set up), the next ones with the retry policy, each to the nsqds that do not
        hold the message yet; the last round's plan once the quorum holds it."""
        direct = self.direct
        direct.home.check_off_loop()
        deadline = self._deadline()
        try:
            try:
                return self._round(p, have, quorum, deadline, track)
            except Exception as exc:
                if tries == 1 or not is_transient(exc) or direct._closed or (
                        deadline is not None and time.monotonic() >= deadline):
                    raise
                have = _holders(exc, have)
                direct._stats.retried()
            for attempt in direct.retry.retrying(
                    tries=None if tries is None else tries - 1,
                    stopped=lambda: direct._closed, deadline=deadline,
                    on_retry=lambda _: direct._stats.retried()):
                with attempt:
                    try:
                        return self._round(p, have, quorum, deadline, track)
                    except Exception as exc:
                        have = _holders(exc, have)
                        raise
        except Exception:
            direct._stats.failed(None, p.messages)
            raise
        raise AssertionError("unreachable: retrying ends with a result or an error")

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
        return self._blocking(p, have, need, tries=1, track=False).holders

    # -- futures and asyncio: the copies at once, settled at the quorum ------------------
    #
    # On the fast path a publish is no coroutine, no task and no timer: a _Publish writes
    # the command on each replica's open connection with a small waiter (_Copy) and counts
    # the answers as they come; one deadline FIFO and one timer bound them all (every
    # publish has the same publish_timeout), and threads hand publishes over through one
    # inbox drained once per loop wakeup, as the pipelined pool does. Few objects stay
    # alive per publish in flight: with thousands in flight, a coroutine, a tenacity loop
    # and closures per publish cost 65 us of CPU a publish, most of it in the garbage
    # collector walking them, against 18 us this way (bench_publish --replication). A
    # round short of its quorum goes on in a coroutine with the retry policy (slow path).

    def _submit(self, p: _Payload, have: frozenset[str] = frozenset(),
                quorum: int | None = None, tries: int | None = None, track: bool = True
                ) -> concurrent.futures.Future[Any]:
        """From a thread: a future of b"OK" (or, with ``tries=1``, the spool's, of the
        nsqds holding it)."""
        direct = self.direct
        if direct._closed:
            raise NSQError("the producer is closed")
        loop = direct.home.for_threads()
        cfut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._inbox.append((p, cfut, have, quorum, tries, track))
        if not self._inbox_scheduled:   # many callers, one wakeup
            self._inbox_scheduled = True
            loop.call_soon_threadsafe(self._drain_inbox)
        return cfut

    def _drain_inbox(self) -> None:
        self._inbox_scheduled = False
        inbox = self._inbox
        while inbox:
            p, cfut, have, quorum, tries, track = inbox.popleft()
            if cfut.set_running_or_notify_cancel():
                _Publish(self, p, cfut, have, quorum, tries, track).start()

    def _on_loop(self, p: _Payload) -> "asyncio.Future[bytes]":
        fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        _Publish(self, p, fut).start()
        return fut

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
        await self._on_loop(self._pub(topic, body, defer_ms))

    async def ampublish(self, topic: str, bodies: Sequence[bytes]) -> None:
        if not self.direct.home.on_it():
            await asyncio.wrap_future(self.mpublish_async(topic, bodies))
            return
        await self._on_loop(self._mpub(topic, bodies))

    def publish_nowait(self, topic: str, body: bytes, defer_ms: int | None
                       ) -> "asyncio.Future[bytes]":
        if self.direct.home.loop is None:
            self.direct.home.bind_running()
        return self._on_loop(self._pub(topic, body, defer_ms))

    # -- publish_timeout: one FIFO of deadlines, one timer -------------------------------

    def _watch(self, pub: "_Publish") -> None:
        queue = self._by_deadline
        while queue and queue[0].done:   # decided ones leave from the front
            queue.popleft()
        queue.append(pub)
        if self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().call_at(queue[0].deadline,
                                                               self._sweep)

    def _sweep(self) -> None:
        self._sweeper = None
        queue = self._by_deadline
        loop = asyncio.get_running_loop()
        now = loop.time()
        while queue and (queue[0].done or queue[0].deadline <= now):
            pub = queue.popleft()
            if not pub.done:
                pub.timed_out()
        if queue:
            self._sweeper = loop.call_at(queue[0].deadline, self._sweep)

    # -- after a round short of its quorum: the retry policy, in a coroutine ---------------

    async def _retry(self, p: _Payload, have: frozenset[str], quorum: int | None,
                     tries: int | None, track: bool, until: float | None
                     ) -> frozenset[str]:
        direct = self.direct
        loop = asyncio.get_running_loop()
        holders = have
        async for attempt in direct.retry.async_retrying(
                tries=tries, stopped=lambda: direct._closed, deadline=until,
                on_retry=lambda _: direct._stats.retried()):
            with attempt:
                fut: asyncio.Future[frozenset[str]] = loop.create_future()
                _Publish(self, p, fut, holders, quorum, 1, track, inner=True).start()
                try:
                    if until is None:
                        holders = await fut
                    else:
                        holders = await asyncio.wait_for(
                            asyncio.shield(fut), max(0.0, until - time.monotonic()))
                except ReplicationError as exc:
                    holders = frozenset(exc.acked)
                    raise
                except asyncio.TimeoutError:
                    raise publish_timed_out(direct.publish_timeout) from None
        return holders

    # -- one replica, on the loop --------------------------------------------------------

    async def _send(self, target: str, p: _Payload) -> None:
        """The slow path to one nsqd: connect (or reconnect) first; HTTP always."""
        http = self.direct.http
        if http is None:
            await self.direct.tcp.send_to(target, p.datas)
        elif p.body is not None:
            await http.pub_to(target, p.topic, p.body, p.defer_ms)
        else:
            await http.mpub_to(target, p.topic, p.datas)

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
        """Wait (up to ``close_timeout``) for the rounds that returned at their quorum
        while their other copies were still on the way."""
        deadline = time.monotonic() + self.direct.config.close_timeout
        while (self._unsettled or self._background) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    def close(self, timeout: float | None = None) -> None:
        loop = self.direct.home.loop
        if (self._unsettled or self._background or self._inbox) and loop is not None \
                and not loop.is_closed() and loop.is_running():
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



def _holders(exc: BaseException, have: frozenset[str]) -> frozenset[str]:
    """The nsqds holding a message after a failed round: the ReplicationError's, or those
    it had (the round raised every nsqd's own refusal: none took it)."""
    return frozenset(exc.acked) if isinstance(exc, ReplicationError) else have


class _Copy:
    """The waiter of one copy on an open connection (``Connection.command_into``)."""

    __slots__ = ("pub", "target")

    def __init__(self, pub: "_Publish", target: str) -> None:
        self.pub = pub
        self.target = target

    def done(self) -> bool:
        return False

    def exception(self) -> None:
        return None

    def set_result(self, _: bytes) -> None:
        self.pub.copy_acked(self.target, True)

    def set_exception(self, exc: BaseException) -> None:
        self.pub.copy_failed(self.target, exc, True)


class _Publish:
    """One publish on the loop, driven by its copies' answers (see the section above):
    ``future`` (asyncio or concurrent) is settled once, at the quorum (b"OK", or the
    holders for ``tries=1``) or with the failure; the copies still on their way go on,
    counted in the owner's ``_unsettled`` until they answer."""

    __slots__ = ("owner", "p", "plan", "future", "quorum", "tries", "track", "inner",
                 "deadline", "failed", "done", "settled")

    def __init__(self, owner: ReplicatedTransport, p: _Payload, future: Any,
                 have: frozenset[str] = frozenset(), quorum: int | None = None,
                 tries: int | None = None, track: bool = True, inner: bool = False) -> None:
        self.owner = owner
        self.p = p
        self.future = future
        self.quorum = quorum
        self.tries = tries
        self.track = track
        self.inner = inner                   # a round of _retry: it bounds and counts
        self.plan = owner.chooser.plan(owner._healthy, have, quorum)
        self.failed: dict[str, BaseException] | None = None
        self.done = False
        self.settled = False
        self.deadline = 0.0                  # loop time (0: none)

    def start(self) -> None:
        owner = self.owner
        owner._unsettled += 1
        timeout = owner.direct.publish_timeout
        if timeout is not None and not self.inner:
            self.deadline = asyncio.get_running_loop().time() + timeout
            owner._watch(self)
        for target in self.plan.start():
            self._launch(target)
        self._check()

    def _launch(self, target: str) -> None:
        owner = self.owner
        datas = self.p.datas
        if owner.direct.http is None and len(datas) == 1:
            conn = owner.direct.tcp.open_connection(target)
            if conn is not None:   # the fast path: write it, count the answer
                conn.command_into(datas[0], _Copy(self, target))
                return
        task = asyncio.ensure_future(owner._send(target, self.p))
        owner._background.add(task)
        task.add_done_callback(functools.partial(self._slow_answered, target))

    def _slow_answered(self, target: str, task: "asyncio.Task[None]") -> None:
        self.owner._background.discard(task)
        exc = asyncio.CancelledError() if task.cancelled() else task.exception()
        self.owner._copy_landed(target, exc)
        if exc is None:
            self.copy_acked(target, False)
        else:
            self.copy_failed(target, exc, False)

    def copy_acked(self, target: str, fast: bool) -> None:
        if fast:
            self.owner.direct._stats.acked_on_loop(self.p.datas[0], target)
        self.plan.acked(target)
        self._check()

    def copy_failed(self, target: str, exc: BaseException, fast: bool) -> None:
        owner = self.owner
        if fast and is_transient(exc) and not owner.direct._closed:
            # the connection was open and broke (nsqd restarted): once more through the
            # slow path, which reconnects
            owner.direct._stats.retried()
            task = asyncio.ensure_future(owner._send(target, self.p))
            owner._background.add(task)
            task.add_done_callback(functools.partial(self._slow_answered, target))
            return
        if self.failed is None:
            self.failed = {}
        self.failed[target] = exc
        sub = self.plan.failed(target)
        if sub is not None:
            self._launch(sub)
        self._check()

    def _check(self) -> None:
        plan = self.plan
        if not self.done:
            if plan.quorum_met:
                self._decide(None)
            elif plan.settled:
                self._decide(self.owner._failure(plan, self.failed or {}, self.p))
        if plan.settled and not self.settled:
            self.settled = True
            self.owner._unsettled -= 1
            if self.track and plan.quorum_met and not plan.complete:
                self.owner._settled(plan, self.failed or {}, self.p)

    def timed_out(self) -> None:
        """publish_timeout passed before the quorum: the copies on their way count as
        failed (they may still land: at-least-once)."""
        if self.done:
            return
        failed = dict(self.failed or {})
        for target in self.plan.in_flight:
            failed[target] = publish_timed_out(self.owner.direct.publish_timeout)
        self._decide(self.owner._failure(self.plan, failed, self.p), final=True)

    def _decide(self, exc: BaseException | None, final: bool = False) -> None:
        self.done = True
        owner = self.owner
        direct = owner.direct
        if exc is None:
            self._resolve(None)
            return
        if not final and self.tries != 1 and is_transient(exc) and not direct._closed:
            loop = asyncio.get_running_loop()
            left = None if not self.deadline else self.deadline - loop.time()
            if left is None or left > 0:
                direct._stats.retried()
                until = None if left is None else time.monotonic() + left
                task = asyncio.ensure_future(owner._retry(
                    self.p, self.plan.holders, self.quorum,
                    None if self.tries is None else self.tries - 1, self.track, until))
                owner._background.add(task)
                task.add_done_callback(self._retried)
                return
        if not self.inner:
            direct._stats.failed(None, self.p.messages)
        self._resolve(exc)

    def _retried(self, task: "asyncio.Task[frozenset[str]]") -> None:
        self.owner._background.discard(task)
        exc = asyncio.CancelledError() if task.cancelled() else task.exception()
        if exc is not None:
            self.owner.direct._stats.failed(None, self.p.messages)
        self._resolve(exc, None if exc is not None else task.result())

    def _resolve(self, exc: BaseException | None, holders: frozenset[str] | None = None
                 ) -> None:
        fut = self.future
        try:
            if exc is not None:
                fut.set_exception(exc)
            elif self.tries == 1:
                fut.set_result(self.plan.holders if holders is None else holders)
            else:
                fut.set_result(b"OK")
        except (asyncio.InvalidStateError, concurrent.futures.InvalidStateError):
            pass   # cancelled by its caller
