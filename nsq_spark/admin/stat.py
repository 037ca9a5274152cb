"""``nsq-spark stat`` without IO: nsq_stat's per-interval view of channels, computed from
nsqd ``/stats`` snapshots (:class:`StatView`), and its text and JSON forms.

A row is one topic/channel summed over the nsqds that carry it (as nsq_stat sums them):
depth (memory and disk), the part of it in memory (``mem``, nsq_stat's column: depth
minus disk depth), in flight, deferred, and the counters nsqd keeps since it started:
messages, requeued, timed out. Rates are per second since the previous interval: the
ingress (``message_rate``: messages put on the channel) and nsq_stat's egress
(``egress_rate``: those that left its depth, i.e. the messages' growth minus the depth's),
and the requeue and timeout rates. They are computed per nsqd and then summed: an
nsqd's growth counts only when its ``start_time`` is the one of the previous interval and
none of its counters of that row went down (else it restarted, or the channel was deleted
and made again, and its counters began anew). A row has no rate in the first interval,
nor when any of its nsqds began anew, nor when its set of nsqds changed (one joined or did
not answer), so a rate is never negative (the egress neither: clamped at 0, as a depth
can grow by more than what was put on the channel only through a requeue) and never mixes
a restart into the others' growth. A topic without channels is shown as a row without a
channel (its depth is what no channel has been sent yet).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Mapping

from .model import NsqdStats

__all__ = ["ChannelRow", "ClientRow", "Interval", "StatView", "format_text"]


@dataclass(frozen=True)
class ClientRow:
    """One consumer connection of a channel."""

    nsqd: str
    remote_address: str
    user_agent: str
    ready: int
    in_flight: int
    messages: int
    finished: int
    requeued: int


@dataclass(frozen=True)
class ChannelRow:
    """One topic/channel (``channel`` None: a topic with no channel), summed over nsqds."""

    topic: str
    channel: str | None
    depth: int
    backend_depth: int
    in_flight: int
    deferred: int
    messages: int
    requeued: int
    timed_out: int
    client_count: int
    paused: bool  # on any nsqd
    topic_paused: bool  # on any nsqd
    nsqds: tuple[str, ...]
    message_rate: float | None = None  # ingress: per second since the previous interval
    requeue_rate: float | None = None
    timeout_rate: float | None = None
    clients: tuple[ClientRow, ...] = ()
    memory_depth: int = 0  # depth - backend_depth (nsq_stat's "mem")
    egress_rate: float | None = None  # per second: messages that left the depth

    @property
    def key(self) -> tuple[str, str | None]:
        return (self.topic, self.channel)


@dataclass(frozen=True)
class Interval:
    """What one interval shows."""

    at: float  # time.time(): the time shown, never used for a rate
    seconds: float | None  # since the previous interval (None: the first)
    rows: tuple[ChannelRow, ...]
    unreachable: tuple[tuple[str, str], ...] = ()  # (nsqd, what the attempt said)
    #: (nsqlookupd, what the attempt said): the nsqds it listed before were asked
    unreachable_lookupds: tuple[tuple[str, str], ...] = ()
    #: lines about the view as a whole (e.g. lookupd lists no nsqd for now)
    notes: tuple[str, ...] = ()

    def as_json(self) -> str:
        """One JSON object (``--json`` prints one a line)."""
        doc: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.at)),
            "interval_seconds": self.seconds,
            "channels": [asdict(r) for r in self.rows],
            "unreachable": [{"nsqd": a, "error": e} for a, e in self.unreachable],
            "unreachable_lookupds": [{"lookupd": a, "error": e}
                                     for a, e in self.unreachable_lookupds],
            "notes": list(self.notes)}
        return json.dumps(doc, sort_keys=False)


#: One nsqd's counters of one row: messages, requeued, timed out; and its depth (which
#: may go down without a restart)
_Counters = tuple[int, int, int, int]
#: What the next interval's rates are computed from: per row, per ``(nsqd, start_time)``.
_Previous = dict[tuple[str, str | None], dict[tuple[str, int], _Counters]]


def _rows(snapshots: Mapping[str, NsqdStats], topic: str | None, channel: str | None
          ) -> tuple[list[ChannelRow], _Previous]:
    """The rows summed over the nsqds, and each row's counters per nsqd."""
    sums: dict[tuple[str, str | None], dict[str, Any]] = {}
    parts: _Previous = {}
    for nsqd, stats in sorted(snapshots.items()):
        for t in stats.topics:
            if topic is not None and t.name != topic:
                continue
            chans = [c for c in t.channels if channel is None or c.name == channel]
            if not t.channels and channel is None:
                row = sums.setdefault((t.name, None), _empty())
                _add(row, nsqd, depth=t.depth, backend_depth=t.backend_depth,
                     messages=t.message_count, topic_paused=t.paused)
                parts.setdefault((t.name, None), {})[(nsqd, stats.start_time)] = (
                    t.message_count, 0, 0, t.depth)
            for c in chans:
                row = sums.setdefault((t.name, c.name), _empty())
                _add(row, nsqd, depth=c.depth, backend_depth=c.backend_depth,
                     in_flight=c.in_flight_count, deferred=c.deferred_count,
                     messages=c.message_count, requeued=c.requeue_count,
                     timed_out=c.timeout_count, client_count=c.client_count,
                     paused=c.paused, topic_paused=t.paused)
                parts.setdefault((t.name, c.name), {})[(nsqd, stats.start_time)] = (
                    c.message_count, c.requeue_count, c.timeout_count, c.depth)
                row["clients"].extend(
                    ClientRow(nsqd, k.remote_address, k.user_agent, k.ready_count,
                              k.in_flight_count, k.message_count, k.finish_count,
                              k.requeue_count) for k in c.clients)
    rows = [ChannelRow(topic=k[0], channel=k[1], nsqds=tuple(v.pop("nsqds")),
                       clients=tuple(v.pop("clients")),
                       memory_depth=max(0, v["depth"] - v["backend_depth"]), **v)
            for k, v in sorted(sums.items(), key=lambda kv: (kv[0][0], kv[0][1] or ""))]
    return rows, parts


def _empty() -> dict[str, Any]:
    return dict(depth=0, backend_depth=0, in_flight=0, deferred=0, messages=0, requeued=0,
                timed_out=0, client_count=0, paused=False, topic_paused=False, nsqds=[],
                clients=[])


def _add(row: dict[str, Any], nsqd: str, **values: Any) -> None:
    for k, v in values.items():
        row[k] = (row[k] or v) if isinstance(v, bool) else row[k] + v
    if nsqd not in row["nsqds"]:
        row["nsqds"].append(nsqd)


def _growth(now: Mapping[tuple[str, int], _Counters],
            before: Mapping[tuple[str, int], _Counters] | None) -> _Counters | None:
    """The row's counters' growth summed over its nsqds, or None when it has none to
    show: no previous interval, the set of nsqds changed, or one of them began anew (its
    start_time changed: it restarted; or a counter went down: the channel was made
    again)."""
    if before is None or {n for n, _ in now} != {n for n, _ in before}:
        return None
    total = [0, 0, 0, 0]
    for node, counters in now.items():
        previous = before.get(node)  # keyed by (nsqd, start_time): a restart misses
        # the counters only grow while nsqd runs; the depth (last) may go down
        if previous is None or any(c < p for c, p in zip(counters[:3], previous[:3])):
            return None
        for i, (c, p) in enumerate(zip(counters, previous)):
            total[i] += c - p
    return (total[0], total[1], total[2], total[3])


@dataclass
class StatView:
    """The rows of each interval and their rates (``topic`` / ``channel`` None: all)."""

    topic: str | None = None
    channel: str | None = None
    _previous: _Previous = field(default_factory=dict)
    _previous_at: float | None = None  # the previous interval's ``monotonic``

    def update(self, at: float, snapshots: Mapping[str, NsqdStats],
               unreachable: Mapping[str, str] | None = None,
               unreachable_lookupds: Mapping[str, str] | None = None, *,
               monotonic: float | None = None, notes: tuple[str, ...] = ()) -> Interval:
        """The interval measured at ``at`` (``time.time()``, the time it shows) from each
        answering nsqd's stats (keyed by its address); ``unreachable`` /
        ``unreachable_lookupds``: the nsqds and lookupds that did not answer (address:
        what the attempt said); ``notes``: lines about the view as a whole.
        ``monotonic`` (``time.monotonic()``; default ``at``) is what the seconds between
        intervals, and so the rates, are measured on: a wall clock stepped by NTP would
        give absurd or no rates."""
        now = at if monotonic is None else monotonic
        seconds = None if self._previous_at is None else now - self._previous_at
        rows = []
        found, parts = _rows(snapshots, self.topic, self.channel)
        for row in found:
            growth = _growth(parts[row.key], self._previous.get(row.key))
            if growth is not None and seconds is not None and seconds > 0:
                # nsq_stat's egress: what was put on the channel minus what stayed in it
                row = replace(row, message_rate=round(growth[0] / seconds, 3),
                              requeue_rate=round(growth[1] / seconds, 3),
                              timeout_rate=round(growth[2] / seconds, 3),
                              egress_rate=round(max(0, growth[0] - growth[3]) / seconds, 3))
            rows.append(row)
        self._previous = parts
        self._previous_at = now
        return Interval(at, seconds, tuple(rows), tuple(sorted((unreachable or {}).items())),
                        tuple(sorted((unreachable_lookupds or {}).items())), tuple(notes))


_HEADER = (f"{'topic/channel':<32} {'depth':>8} {'mem':>8} {'disk':>8} {'inflight':>8} "
           f"{'deferred':>8} {'requeued':>8} {'timedout':>8} {'msgs':>10} {'ingress/s':>9} "
           f"{'egress/s':>9} {'clients':>7}")


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def format_text(interval: Interval, header: bool = True, clients: bool = False) -> str:
    """The interval as text lines (a header first when ``header``; with ``clients`` a
    line per consumer connection under its channel)."""
    lines = [_HEADER] if header else []
    for r in interval.rows:
        name = f"{r.topic}/{r.channel}" if r.channel is not None else f"{r.topic} (no channel)"
        flags = "".join([" [channel paused]" if r.paused else "",
                         " [topic paused]" if r.topic_paused else ""])
        lines.append(f"{name:<32} {r.depth:>8,} {r.memory_depth:>8,} {r.backend_depth:>8,} "
                     f"{r.in_flight:>8,} {r.deferred:>8,} {r.requeued:>8,} {r.timed_out:>8,} "
                     f"{r.messages:>10,} {_num(r.message_rate):>9} {_num(r.egress_rate):>9} "
                     f"{r.client_count:>7}{flags}")
        if clients:
            for k in r.clients:
                lines.append(f"    {k.remote_address} on {k.nsqd} ({k.user_agent}): rdy "
                             f"{k.ready} inflight {k.in_flight} msgs {k.messages} fin "
                             f"{k.finished} req {k.requeued}")
    lines.extend(interval.notes)
    if not interval.rows and not interval.notes:
        lines.append("(nothing to show: no such topic/channel on the nsqds that answered)")
    for nsqd, error in interval.unreachable:
        lines.append(f"nsqd {nsqd} did not answer: {error}")
    for lookupd, error in interval.unreachable_lookupds:
        lines.append(f"nsqlookupd {lookupd} did not answer (the nsqds it listed before, if "
                     f"any, were asked): {error}")
    return "\n".join(lines) + "\n"
