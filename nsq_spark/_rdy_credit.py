"""Flow control on the read side of one nsqd connection: what nsqd may send, given the
RDY we sent and the answers we gave. Pure, one call per read chunk; the connection
(:mod:`nsq_spark._conn`) checks every chunk against it. The RDY *policy* (how much RDY to
give) is the consumer's: :mod:`nsq_spark._consumer.rdy`.
"""

from __future__ import annotations

__all__ = ["RdyCredit", "RDY_LOWER_GRACE"]


# -- the read side: what nsqd may send, given the RDY we sent --------------------------------

#: Seconds a lowered RDY's previous (higher) value still bounds what may arrive. nsqd applies
#: RDY when its IOLoop reads the command, which we cannot observe (RDY has no answer), and
#: messages it sent before that are still on the wire after it. A live nsqd on a live
#: network does both in milliseconds; 60 s
#: only widens the check for a minute after a lowering, never the bound on memory (the
#: previous value was allowed already).
RDY_LOWER_GRACE = 60.0


class RdyCredit:
    """Flow control enforced on the read side of one connection: pure, one call per read
    chunk.

    nsqd (>= 1.0) sends a message only while its in-flight count for the connection is
    below the RDY count it last applied; in flight there means sent and not yet answered
    (FIN, REQ) nor timed out. Every message we received and did not answer is also in
    nsqd's count (our answers reach it later, its messages reach us later), so

        unanswered = received - answered  <=  the RDY nsqd applied when it sent

    holds for any correct nsqd, with two allowances:

    * a lowered RDY: until nsqd read it, it may still fill the previous, higher RDY: that
      value stays allowed for ``grace`` seconds after the lowering (:data:`RDY_LOWER_GRACE`),
      the time for nsqd to read the RDY plus for what it sent before to cross the wire;
    * timeouts: nsqd stops counting a message ``msg_timeout`` after it sent it, and may
      send another. Such a message was received more than ``msg_timeout / 2`` ago (less
      than half of it on the wire), so at most the unanswered count of half a timeout ago:
      the largest unanswered count of the previous window of ``msg_timeout / 2`` seconds is
      allowed on top.

    :meth:`arrive` returns None while the chunk fits, else the reason to close (a message
    naming received, credit and RDY). The caller counts answers in ``answered`` (one add per
    batch of answers) and calls :meth:`on_rdy` for every RDY it sends.
    """

    __slots__ = ("received", "answered", "rdy", "grace", "window", "_held", "_win_end",
                 "_win_max", "_prev_max")

    def __init__(self, msg_timeout: float = 60.0, grace: float = RDY_LOWER_GRACE,
                 now: float = 0.0) -> None:
        if msg_timeout <= 0 or grace < 0:
            raise ValueError(f"msg_timeout must be > 0 and grace >= 0 seconds, got "
                             f"{msg_timeout!r} and {grace!r}")
        self.received = 0
        self.answered = 0  # FIN and REQ sent (the caller adds to it)
        self.rdy = 0  # the RDY last sent
        self.grace = grace
        self.window = msg_timeout / 2
        # (value, until): each lowering's previous RDY, allowed until its own lowering's
        # grace is over; values fall and deadlines rise along the list (see on_rdy)
        self._held: list[tuple[int, float]] = []
        self._win_end = now + self.window
        self._win_max = 0  # the largest unanswered count of the current window
        self._prev_max = 0  # ... and of the previous one

    @property
    def unanswered(self) -> int:
        return self.received - self.answered

    def on_rdy(self, count: int, now: float) -> None:
        """RDY ``count`` was sent. Only a lowering of the last RDY holds anything: the
        previous value, for ``grace`` seconds from this lowering. Any other RDY extends
        nothing, or a consumer that resends RDY would keep its highest RDY allowed forever."""
        if count < self.rdy:  # lowered: what nsqd may still fill until it reads this RDY
            # an entry expiring sooner with no larger value can never be the limit again
            self._held = [(value, until) for value, until in self._held
                          if until >= now and value > self.rdy]
            self._held.append((self.rdy, now + self.grace))
        self.rdy = count

    def rdy_limit(self, now: float) -> int:
        """The most RDY nsqd may be applying now: the last one sent, or a higher one it
        replaced by a lowering at most ``grace`` seconds ago."""
        limit = self.rdy
        for value, until in self._held:
            if now <= until and value > limit:
                limit = value
        return limit

    def credit(self, now: float) -> int:
        """The most messages that may be unanswered now."""
        return self.rdy_limit(now) + self._prev_max

    def arrive(self, n: int, now: float) -> str | None:
        """``n`` messages arrived (one call per read chunk). None when they fit the
        credit; else why the connection must close (nothing is counted then)."""
        if now >= self._win_end:
            self._roll(now)
        unanswered = self.received - self.answered + n
        if unanswered > self.credit(now):
            return self.violation(n, now)
        self.received += n
        if unanswered > self._win_max:
            self._win_max = unanswered
        return None

    def violation(self, n: int, now: float) -> str:
        """Why ``n`` more messages do not fit (the counts, for the error message)."""
        limit = self.rdy_limit(now)
        return (f"{self.unanswered + n} messages received and unanswered ({self.received + n} "
                f"received, {self.answered} answered), over the credit of "
                f"{self.credit(now)} (RDY {self.rdy}"
                + (f", {limit} until nsqd applies the lowered RDY" if limit != self.rdy else "")
                + (f", plus {self._prev_max} that may have timed out" if self._prev_max
                   else "")
                + "); nsqd never has more than RDY messages in flight: this server ignores "
                "RDY")

    def _roll(self, now: float) -> None:
        # between two chunks the count only falls (answers), so a window with no chunk had
        # at most the previous window's largest count
        self._prev_max = self._win_max
        self._win_max = self.received - self.answered
        self._win_end = now + self.window
