"""Which nsqds get the copies of a replicated publish, and when it is done: a pure planner.

``Producer(replicas=N, write_quorum=W)`` puts each message -- each MPUB batch as one unit
-- on N distinct nsqds of the K it was given, and counts the publish done once W of them
acknowledged it. This module decides *which* nsqds and *when*, without a socket, a clock
or a thread (like :mod:`nsq_spark.rdy`); the IO loops of :mod:`.replicated` drive it and
the spool's drain reuses it to complete what a down nsqd missed.

How the replicas are picked (so that the load spreads):

* **healthy first**: the nsqds not backing off after a failure come first, in the
  configured order; the unhealthy ones after them, tried only when no healthy one is
  left (one may be back, and a caller is waiting);
* **rotation**: the first replica rotates over the healthy nsqds, one step per publish;
  the other N-1 are the next ones in that order (wrapping around). With all K healthy,
  each nsqd is the first replica of 1/K of the messages and holds N/K of them;
* **substitution**: an nsqd that fails is replaced by the next one in the order that this
  message has not been sent to; no nsqd is sent one message twice in one round;
* **holders count**: nsqds that already hold the message (``have``: what an earlier
  round placed, e.g. the spool retrying a batch) count towards the N replicas and are
  never sent it again.

A :class:`ReplicaPlan` is one round for one message: :meth:`~ReplicaPlan.start` names the
first targets, :meth:`~ReplicaPlan.acked` and :meth:`~ReplicaPlan.failed` report each
answer (a failure may name a substitute to send to), and the properties say where the
round stands: ``quorum_met`` (W hold it: the publish may return), ``complete`` (N hold
it), ``hopeless`` (W can no longer be reached in this round), ``settled`` (nothing in
flight and nothing left to send). Whether to run another round after a hopeless one is
the retry policy's call (:mod:`.retry`), not the planner's.
"""

from __future__ import annotations

import itertools
from typing import Callable, Mapping, Sequence

__all__ = ["ReplicaChooser", "ReplicaPlan", "default_quorum"]


def default_quorum(replicas: int) -> int:
    """The write quorum when none is given: a majority of the replicas, ``N // 2 + 1``
    (1 of 1, 2 of 2, 2 of 3, 3 of 4). An acknowledged message then survives the loss of
    any ``W - 1`` hosts, and with N >= 3 one slow or down replica does not hold a
    publish up."""
    return replicas // 2 + 1


class ReplicaPlan:
    """One round of placing one message on its replicas (see the module doc).

    Args:
        order: the candidates, first choice first (holders already left out); kept, not
            copied.
        replicas: N, the copies wanted in all (holders included).
        quorum: W, the copies needed for the publish to count (holders included).
        have: the nsqds that already hold the message.
        index: a bit number per nsqd (the chooser's; default: numbered here). Holders and
            sends in flight are bit masks, not sets: a publish keeps this object alive
            until its answers come, and the fewer containers it holds the less the garbage
            collector has to walk with thousands in flight (measured: bench_publish
            --replication).
    """

    __slots__ = ("replicas", "quorum", "_order", "_next", "_index", "_holders", "_held",
                 "_in_flight", "_flying", "_failed", "_started")

    def __init__(self, order: Sequence[str], replicas: int, quorum: int,
                 have: frozenset[str] = frozenset(),
                 index: Mapping[str, int] | None = None) -> None:
        self.replicas = replicas
        self.quorum = quorum
        self._order = order
        self._next = 0                       # the next candidate not yet sent to
        if index is None:
            index = {a: i for i, a in enumerate([*have, *order])}
        self._index = index
        held = 0
        for a in have:
            held |= 1 << index[a]
        self._holders = held                 # bit mask
        self._held = len(have)
        self._in_flight = 0                  # bit mask
        self._flying = 0
        self._failed: list[str] | None = None
        self._started = False

    # -- driving it ----------------------------------------------------------------------

    def start(self) -> list[str]:
        """The nsqds to send to now: as many as copies are missing (fewer when fewer
        candidates are left). Called once."""
        if self._started:
            raise RuntimeError("ReplicaPlan.start() is called once per round")
        self._started = True
        want = self.replicas - self._held
        order = self._order
        take = min(max(0, want), len(order))
        out = list(order[:take])
        self._next = take
        index = self._index
        for a in out:
            self._in_flight |= 1 << index[a]
        self._flying = take
        return out

    def _land(self, target: str) -> None:
        bit = 1 << self._index[target]
        if not self._in_flight & bit:
            raise KeyError(f"{target} was not sent to (a bug of the driver)")
        self._in_flight &= ~bit
        self._flying -= 1

    def acked(self, target: str) -> None:
        """``target`` acknowledged the message."""
        self._land(target)
        self._holders |= 1 << self._index[target]
        self._held += 1

    def failed(self, target: str) -> str | None:
        """``target`` failed: the substitute to send to now, if a candidate is left and a
        copy is still missing; else None."""
        self._land(target)
        if self._failed is None:
            self._failed = []
        self._failed.append(target)
        if self._held + self._flying >= self.replicas or self._next >= len(self._order):
            return None
        sub = self._order[self._next]
        self._next += 1
        self._in_flight |= 1 << self._index[sub]
        self._flying += 1
        return sub

    # -- where it stands -------------------------------------------------------------------

    def _named(self, mask: int) -> frozenset[str]:
        return frozenset(a for a, i in self._index.items() if mask >> i & 1)

    @property
    def holders(self) -> frozenset[str]:
        """The nsqds holding the message (given as ``have`` or acknowledged)."""
        return self._named(self._holders)

    @property
    def held(self) -> int:
        """How many nsqds hold the message."""
        return self._held

    @property
    def failures(self) -> tuple[str, ...]:
        """The nsqds that failed in this round, in the order they did."""
        return () if self._failed is None else tuple(self._failed)

    @property
    def in_flight(self) -> frozenset[str]:
        return self._named(self._in_flight)

    @property
    def quorum_met(self) -> bool:
        return self._held >= self.quorum

    @property
    def complete(self) -> bool:
        return self._held >= self.replicas

    @property
    def settled(self) -> bool:
        """Nothing in flight: every send of the round answered, and no substitute is
        pending (failures past the last candidate leave none)."""
        return self._started and not self._flying

    @property
    def hopeless(self) -> bool:
        """The quorum can no longer be met in this round: what holds it, what is in
        flight and the candidates left are together fewer than W."""
        left = len(self._order) - self._next
        return self._held + self._flying + left < self.quorum


class ReplicaChooser:
    """The rotation over a producer's nsqds, and a :class:`ReplicaPlan` per publish.

    Args:
        addresses: the nsqds (``host:port``), in the configured order; distinct.
        replicas: N, 1 .. len(addresses).
        quorum: W, 1 .. N.

    Thread-safe: the rotation is one ``itertools.count`` (``next()`` is atomic).
    """

    def __init__(self, addresses: Sequence[str], replicas: int, quorum: int) -> None:
        addrs = list(addresses)
        if len(set(addrs)) != len(addrs):
            raise ValueError(f"the nsqd addresses repeat: {addrs}")
        if not 1 <= replicas <= len(addrs):
            raise ValueError(f"replicas={replicas} needs 1 .. {len(addrs)} (the nsqd given)")
        if not 1 <= quorum <= replicas:
            raise ValueError(f"write_quorum={quorum} needs 1 .. replicas={replicas}")
        self.addresses = addrs
        self.replicas = replicas
        self.quorum = quorum
        self._turn = itertools.count()
        self._index = {a: i for i, a in enumerate(addrs)}
        # every rotation, made once: with every nsqd healthy (the usual case) a publish
        # takes one of these as it is
        self._rings = [tuple(addrs[k:] + addrs[:k]) for k in range(len(addrs))]

    def order(self, healthy: Callable[[str], bool]) -> Sequence[str]:
        """Every nsqd, first choice first, for the next publish (advances the rotation):
        the healthy ones rotated by one step per call, then the unhealthy ones in the
        configured order (all of them rotated when none is healthy)."""
        addrs = self.addresses
        for a in addrs:
            if not healthy(a):
                break
        else:
            return self._rings[next(self._turn) % len(addrs)]
        good = [a for a in addrs if healthy(a)]
        bad = [a for a in addrs if a not in good]
        ring = good or bad
        k = next(self._turn) % len(ring)
        first = ring[k:] + ring[:k]
        return first + bad if good else first

    def plan(self, healthy: Callable[[str], bool], have: frozenset[str] = frozenset(),
             quorum: int | None = None) -> ReplicaPlan:
        """One round for one publish. ``have``: nsqds that already hold it (left out of
        the candidates, counted as copies). ``quorum``: the copies this round needs
        (default: the write quorum; the spool completing a batch asks for N)."""
        order = self.order(healthy)
        if have:
            order = [a for a in order if a not in have]
        return ReplicaPlan(order, self.replicas, self.quorum if quorum is None else quorum,
                           have, self._index)
