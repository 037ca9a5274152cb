"""RDY and ``max_in_flight`` policy: pure logic, no sockets, no clock, no loop.

The Reader keeps one :class:`ConnRdy` per nsqd connection inside a :class:`RdyPolicy` and
asks the policy what to do on each event (new connection, a batch of messages, responses,
a periodic tick, backoff transitions, ``set_max_in_flight``). The policy answers with a
list of RDY commands ``[(ConnRdy, count), ...]`` that the Reader writes to the sockets.

Rules (from the "Building Client Libraries" guide, go-nsq and pynsq; where they differ the
choice is noted):

* a new connection starts at RDY 1 (if the budget allows); once it delivers, it is raised
  to its share: ``max(1, max_in_flight // connections)``, never above the connection's
  ``max_rdy_count`` (from IDENTIFY);
* the sum of the RDY counts last sent never exceeds ``max_in_flight`` (nsqd >= 1.0 uses
  RDY as a cap on in-flight messages, so the sum bounds what is in flight);
* RDY is re-sent when a connection's count of messages since its last RDY leaves less
  than 25 % of that RDY (``remaining < rdy / 4``, or at most 1 left), as the guide asks;
* when ``max_in_flight`` is smaller than the number of connections (or during backoff,
  when at most one RDY is allowed), a periodic :meth:`RdyPolicy.tick` takes RDY from
  connections idle for ``low_rdy_idle_timeout`` and gives RDY 1 to the connections that
  have waited longest (ties at random).
  Busy connections give their RDY up too, so that every nsqd gets a turn even while
  another never idles, by one of two rules: by default (beyond go-nsq and pynsq), when
  connections wait and every slot is held, the tick takes it from one holder at random;
  with ``low_rdy_timeout`` (go-nsq's ``LowRdyTimeout``) instead, every connection that
  has held its RDY for longer than that gives it up, busy or not (go-nsq's rule). How
  long a connection has held RDY is measured from the tick that gave it RDY (or, when
  another event did, from the first tick that saw it hold RDY: never overestimated, so
  no connection gives up earlier than ``low_rdy_timeout``); a RDY refresh of the same
  count does not restart it (go-nsq's clock restarts on any RDY; ours sends a refresh
  per message in this regime, which would never let a busy connection go);
* backoff: :meth:`enter_backoff` sends RDY 0 everywhere, :meth:`test_waters` gives RDY 1 to
  one random connection, :meth:`exit_backoff` returns everyone to their share.

The read side of the same rule, what one connection may receive given the RDY it sent
and the answers it gave, is :class:`nsq_spark._rdy_credit.RdyCredit`: the connection's, not
the consumer's: every connection checks each read against it, and a message nobody asked
for with RDY closes the connection (on a producer's connection, which never sends RDY, any
message does). So it lives beside ``conn.py``.

Every method runs per batch or per event, never per message: :meth:`on_arrival` is the
hot path and costs a few attribute updates and one comparison.

In flight means what the guide and pynsq mean: from the moment a message is handed to the
application until it is answered. A read chunk that arrived is not in flight yet:
counting it whole made ``is_starved()`` true before the handler saw its first message.
The consumer calls :meth:`RdyPolicy.on_arrival` per chunk and counts hand-overs and
answers in ``ConnRdy.in_flight`` itself; :meth:`RdyPolicy.on_messages` /
:meth:`RdyPolicy.on_responses` are the same rules for a caller that hands a chunk over at
once (the property tests).
"""

from __future__ import annotations

import random
from typing import Any, Generic, Iterable, TypeVar

__all__ = ["ConnRdy", "RdyPolicy", "NORMAL", "BACKOFF", "TESTING", "STARVED_RATIO",
           "commands_by_key"]

# Policy modes.
NORMAL = "normal"  # every connection gets its share of max_in_flight
BACKOFF = "backoff"  # inside a backoff window: RDY 0 everywhere
TESTING = "testing"  # backoff level > 0 between windows: at most one RDY 1 in total

# is_starved(): a connection is starved once its in-flight count reaches 85 % of its RDY
# (the guide's threshold; pynsq and go-nsq use the same).
STARVED_RATIO = 0.85

_NEVER = -(1 << 62)  # low-water mark of a RDY-0 connection: never triggers a refresh

# the caller's handle of a connection (the consumer: its ledger Link); the policy only
# carries it, so commands come back typed with it
H = TypeVar("H")

Command = tuple["ConnRdy[H]", int]


class ConnRdy(Generic[H]):
    """RDY bookkeeping for one connection. ``handle`` is the caller's (the policy ignores it)."""

    __slots__ = ("key", "handle", "max_rdy_count", "rdy", "remaining", "low_water",
                 "in_flight", "last_msg_at", "finished", "requeued", "turn", "rdy_since")

    def __init__(self, key: Any, max_rdy_count: int = 2500, now: float = 0.0,
                 handle: H | None = None) -> None:
        if max_rdy_count < 1:
            raise ValueError(f"max_rdy_count must be >= 1, got {max_rdy_count}")
        self.key = key
        self.handle = handle
        self.max_rdy_count = max_rdy_count
        self.rdy = 0  # the RDY count last sent
        self.remaining = 0  # rdy minus messages received since it was sent
        self.low_water = _NEVER  # re-send RDY when remaining falls to this
        # handed to the application (a handler, a puller) and not answered yet: the guide's
        # and pynsq's meaning. The consumer's answers ledger keeps it (on_messages and
        # on_responses do, in the pure model); the policy reads it (is_starved, tick).
        self.in_flight = 0
        self.last_msg_at = now  # also reset when the connection gets RDY from 0
        self.finished = 0
        self.requeued = 0
        self.turn = -1  # when it last lost its RDY (a counter): the longest waiting go first
        # when it got RDY from 0, as the RDY tick saw it (None: holds none, or no tick has
        # seen it hold yet); read by the low_rdy_timeout rule
        self.rdy_since: float | None = None

    def __repr__(self) -> str:
        return (f"ConnRdy({self.key!r}, rdy={self.rdy}, in_flight={self.in_flight}, "
                f"remaining={self.remaining})")


class RdyPolicy(Generic[H]):
    """RDY distribution across the connections of one Reader.

    Args:
        max_in_flight: the most messages in flight over all connections (0 pauses).
        low_rdy_idle_timeout: seconds without a message after which a connection gives its
            RDY up when there is not enough RDY for everyone.
        rng: random source (injected for tests).
        low_rdy_timeout: seconds a connection may hold RDY, busy or not, when there is not
            enough RDY for everyone (go-nsq's ``LowRdyTimeout``); None: the default rule
            instead, one random holder per tick while others wait (see the module doc).
    """

    def __init__(self, max_in_flight: int, low_rdy_idle_timeout: float = 10.0,
                 rng: random.Random | None = None,
                 low_rdy_timeout: float | None = None) -> None:
        _check_max_in_flight(max_in_flight)
        if low_rdy_idle_timeout < 0:
            raise ValueError(f"low_rdy_idle_timeout must be >= 0 seconds, got {low_rdy_idle_timeout}")
        if low_rdy_timeout is not None and not low_rdy_timeout > 0:
            raise ValueError(f"low_rdy_timeout must be > 0 seconds or None, got {low_rdy_timeout}")
        self.max_in_flight = max_in_flight
        self.low_rdy_idle_timeout = low_rdy_idle_timeout
        self.low_rdy_timeout = low_rdy_timeout
        self.rng = rng or random.Random()
        self.conns: dict[Any, ConnRdy[H]] = {}
        self.total_rdy = 0  # sum of ConnRdy.rdy
        self.mode = NORMAL
        self._turns = 0

    # -- queries ------------------------------------------------------------------------

    def cap(self) -> int:
        """The most RDY allowed in total right now (depends on the mode)."""
        if self.mode is NORMAL:
            return self.max_in_flight
        if self.mode is TESTING:
            return min(1, self.max_in_flight)
        return 0

    def share(self, c: ConnRdy[H]) -> int:
        """The RDY count ``c`` should have in normal operation."""
        if self.max_in_flight == 0 or not self.conns:
            return 0
        return min(max(1, self.max_in_flight // len(self.conns)), c.max_rdy_count)

    def is_starved(self) -> bool:
        """True when some connection has in flight at least 85 % of its RDY count.

        Batching handlers use it to flush before they wait for messages that nsqd will not
        send (a connection's in-flight count can never exceed its RDY). Callable from any
        thread: it iterates a snapshot, as the loop may add or remove connections meanwhile.
        """
        for c in list(self.conns.values()):
            if c.in_flight > 0 and c.in_flight >= c.rdy * STARVED_RATIO:
                return True
        return False

    @property
    def in_flight(self) -> int:
        return sum(c.in_flight for c in list(self.conns.values()))  # any thread: snapshot

    # -- connection lifecycle -----------------------------------------------------------

    def add(self, key: Any, max_rdy_count: int = 2500, now: float = 0.0,
            handle: H | None = None) -> tuple[ConnRdy[H], list[Command[H]]]:
        """A connection is subscribed. Returns its state and the RDY commands to send."""
        if key in self.conns:
            raise ValueError(f"connection {key!r} is already tracked")
        c = ConnRdy(key, max_rdy_count, now, handle)
        self.conns[key] = c
        out: list[Command[H]] = []
        if self.mode is NORMAL:
            # Shrink connections above the new (smaller) share first, so that the newcomer
            # is never starved by an older connection holding the whole budget.
            for other in self.conns.values():
                target = self.share(other)
                if other.rdy > target:
                    self._send(other, target, out)
            self._send_capped(c, 1, out)
        elif self.mode is TESTING and self.total_rdy == 0:
            # nobody is testing the waters (e.g. the tester closed): this one does
            self._send_capped(c, 1, out)
        return c, out

    def remove(self, key: Any) -> list[Command[H]]:
        """A connection closed. Its RDY is returned to the others."""
        c = self.conns.pop(key, None)
        if c is None:
            return []
        self.total_rdy -= c.rdy
        c.rdy = 0
        c.low_water = _NEVER
        return self.rebalance()

    # -- hot path -----------------------------------------------------------------------

    def on_messages(self, c: ConnRdy[H], n: int, now: float) -> list[Command[H]] | None:
        """``n`` messages arrived on ``c`` and are in flight at once (the pure model)."""
        c.in_flight += n
        return self.on_arrival(c, n, now)

    def on_arrival(self, c: ConnRdy[H], n: int, now: float) -> list[Command[H]] | None:
        """``n`` messages arrived on ``c`` (one call per decoded batch); they count as in
        flight only once handed over (the caller adds to ``c.in_flight`` then)."""
        c.remaining -= n
        c.last_msg_at = now
        if c.remaining <= c.low_water and self.mode is NORMAL:
            out: list[Command[H]] = []
            self._send_capped(c, self.share(c), out)
            return out
        return None

    def on_responses(self, c: ConnRdy[H], finished: int = 0, requeued: int = 0) -> None:
        """``finished`` FINs and ``requeued`` REQs were sent on ``c``."""
        c.finished += finished
        c.requeued += requeued
        c.in_flight -= finished + requeued
        if c.in_flight < 0:  # a late response after a reconnect: never go negative
            c.in_flight = 0

    # -- backoff ------------------------------------------------------------------------

    def enter_backoff(self) -> list[Command[H]]:
        """A backoff window starts: RDY 0 everywhere."""
        self.mode = BACKOFF
        out: list[Command[H]] = []
        for c in self.conns.values():
            self._send(c, 0, out)
        return out

    def test_waters(self) -> list[Command[H]]:
        """A backoff window ended (level still > 0): RDY 1 on one random connection."""
        self.mode = TESTING
        out: list[Command[H]] = []
        if self.total_rdy == 0 and self.conns:
            c = self.rng.choice(list(self.conns.values()))
            self._send_capped(c, 1, out)
        return out

    def exit_backoff(self) -> list[Command[H]]:
        """Backoff is over: every connection back to its share."""
        self.mode = NORMAL
        return self.rebalance()

    # -- configuration ------------------------------------------------------------------

    def set_max_in_flight(self, max_in_flight: int) -> list[Command[H]]:
        """Change ``max_in_flight`` at runtime; 0 pauses (RDY 0 everywhere)."""
        _check_max_in_flight(max_in_flight)
        self.max_in_flight = max_in_flight
        out: list[Command[H]] = []
        cap = self.cap()
        conns = list(self.conns.values())
        for c in conns:  # lower first, so the sum never exceeds the new cap on the wire
            target = self.share(c) if self.mode is NORMAL else min(c.rdy, cap)
            if c.rdy > target:
                self._send(c, target, out)
        if self.total_rdy > cap:  # fewer slots than holders: keep a random subset
            self.rng.shuffle(conns)
            for c in conns:
                if self.total_rdy <= cap:
                    break
                if c.rdy:
                    self._send(c, 0, out)
        out.extend(self.rebalance())
        return out

    # -- periodic -----------------------------------------------------------------------

    def rebalance(self) -> list[Command[H]]:
        """Raise connections below their share, as far as the budget allows (while testing
        the waters: make sure one connection has RDY 1)."""
        out: list[Command[H]] = []
        if self.mode is BACKOFF or self.max_in_flight == 0:
            return out
        if self.mode is TESTING:
            # the tester closed, or max_in_flight came back from 0: someone else tests
            return self.test_waters()
        conns = list(self.conns.values())
        self.rng.shuffle(conns)  # who gets a truncated RDY when the budget is short: random
        for c in conns:
            target = self.share(c)
            if c.rdy < target:
                self._send_capped(c, target, out)
        return out

    def tick(self, now: float) -> list[Command[H]]:
        """Periodic redistribution (go-nsq: every 5 s).

        With enough RDY for every connection it only heals (:meth:`rebalance`). Otherwise
        (``max_in_flight`` < connections, or one RDY in total while testing the waters),
        it moves RDY 1 between connections so that every nsqd is drained eventually.
        """
        out: list[Command[H]] = []
        if self.mode is BACKOFF or self.max_in_flight == 0 or not self.conns:
            return out
        cap = self.cap()
        if len(self.conns) <= cap:
            return self.rebalance()
        conns = list(self.conns.values())
        gave_up = set()
        held_too_long = self.low_rdy_timeout
        for c in conns:  # idle connections give their RDY up (and, with low_rdy_timeout,
            if c.rdy == 0:  # those that held it too long)
                continue
            if now - c.last_msg_at > self.low_rdy_idle_timeout:
                self._send(c, 0, out)
                gave_up.add(c.key)
            elif held_too_long is not None:
                if c.rdy_since is None:
                    c.rdy_since = now
                elif now - c.rdy_since > held_too_long:
                    self._send(c, 0, out)
                    gave_up.add(c.key)
        # A connection with RDY or messages in flight holds a slot (pynsq's rule: a
        # connection set to RDY 0 keeps its in-flight messages until they are answered).
        holders = sum(1 for c in conns if c.rdy > 0 or c.in_flight > 0)
        budget = cap - holders
        # those that just gave their RDY up wait for the next round (others go first)
        waiting = [c for c in conns
                   if c.rdy == 0 and c.in_flight == 0 and c.key not in gave_up]
        if budget <= 0 and waiting and held_too_long is None:
            donors = [c for c in conns if c.rdy > 0]
            if donors:
                d = self.rng.choice(donors)
                self._send(d, 0, out)
                if d.in_flight == 0:
                    budget += 1  # freed now; otherwise once its in-flight is answered
        self.rng.shuffle(waiting)  # ties at random, then the longest waiting first
        waiting.sort(key=lambda c: c.turn, reverse=True)
        while budget > 0 and waiting:
            c = waiting.pop()
            c.last_msg_at = now  # its idle clock starts with its RDY
            before = len(out)
            self._send_capped(c, 1, out)
            if len(out) > before:
                c.rdy_since = now  # and so does its holding clock
                budget -= 1
            else:
                break
        return out

    # -- internals ----------------------------------------------------------------------

    def _send_capped(self, c: ConnRdy[H], value: int, out: list[Command[H]]) -> None:
        room = self.cap() - (self.total_rdy - c.rdy)
        if value > room:
            value = room if room > 0 else 0
        if value > c.max_rdy_count:
            value = c.max_rdy_count
        self._send(c, value, out)

    def _send(self, c: ConnRdy[H], value: int, out: list[Command[H]]) -> None:
        if value == 0 and c.rdy == 0:
            return
        if value == 0:
            self._turns += 1
            c.turn = self._turns
            c.rdy_since = None
        elif c.rdy == 0:
            c.rdy_since = None  # got RDY from 0: the next tick stamps it (no clock here)
        self.total_rdy += value - c.rdy
        c.rdy = value
        c.remaining = value
        # refresh once under 25 % left (remaining < value/4), or at 1 left (go-nsq)
        c.low_water = max(1, (value + 3) // 4 - 1) if value else _NEVER
        out.append((c, value))


def _check_max_in_flight(value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"max_in_flight must be an int >= 0 (0 pauses the reader), got {value!r}")


def commands_by_key(commands: Iterable[Command[Any]]) -> dict[Any, int]:
    """The final RDY per connection key (tests and logs)."""
    return {c.key: v for c, v in commands}
