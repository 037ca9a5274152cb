"""Which discovered nsqds a consumer connects to, after each lookupd answer: a pure rule.

Each poll the lookupd poller hands over the union of the producer records of every lookupd
(:class:`~nsq_spark._lookupd.ProducerInfo`: address, ports, and the topology hints when
lookupd reports them): when the poll ends, and before that as each answer adds producers
(see :mod:`nsq_spark._lookupd`). :func:`choose_producers` turns them into the list to connect to,
in order:

1. **Topology preference** (:func:`prefer_topology`): producers in the consumer's
   ``topology_zone`` first, then those in its ``topology_region``, then the rest; the
   order within each group is lookupd's. It reorders and never drops: a message on an nsqd
   that no consumer connects to is never delivered, so a consumer in another zone must
   still reach it. The order is all it changes: it is the order in which the filter
   sees the records and ``connect_to_nsqd`` is called; every chosen producer is then
   connected, and ``max_in_flight`` is shared equally among the connections whatever
   their zone (no RDY weighting). To read from same-zone nsqds only, drop the others
   in a ``discovery_filter`` (keeping all of them when none is in the zone: see
   docs/discovery.md). nsqd's own topology-aware delivery (the hints sent in IDENTIFY)
   is the server's part. Records without hints (nsqlookupd v1.3.0 reports none) keep
   their order.
2. **The discovery filter** (go-nsq's ``DiscoveryFilter``): ``discovery_filter(records)``
   gets that list and returns the records to use -- keep, drop, reorder. Its result is
   checked: anything but :class:`~nsq_spark._lookupd.ProducerInfo` records raises
   :class:`DiscoveryFilterError` naming what came back and what to return instead.
   Duplicates are dropped (the first one counts).

What happens next is the owner's (pynsq's): every chosen record goes through the Reader's
``connect_to_nsqd(host, port)``, so a subclass override still decides per producer. A
producer the filter drops is not disconnected if it is connected already (go-nsq and pynsq
alike only choose what to connect to).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Sequence

from ..errors import ConfigError
from .._lookupd import ProducerInfo

__all__ = ["DiscoveryFilter", "DiscoveryFilterError", "prefer_topology", "apply_filter",
           "choose_producers", "check_discovery_filter"]

#: ``f(records) -> records``: the producer records of one poll, returning those to use.
DiscoveryFilter = Callable[[list[ProducerInfo]], Iterable[ProducerInfo]]


class DiscoveryFilterError(ConfigError, TypeError):
    """The ``discovery_filter`` returned something that is not a list of producer records."""


def check_discovery_filter(value: Any) -> DiscoveryFilter | None:
    """The ``discovery_filter=`` argument: None or a callable (ConfigError otherwise)."""
    if value is None or callable(value):
        return value  # type: ignore[no-any-return]
    raise ConfigError(f"discovery_filter={value!r} ({type(value).__name__}): give a callable "
                      "f(records) returning the ProducerInfo records to connect to, or None")


def _tier(record: ProducerInfo, zone: str | None, region: str | None) -> int:
    if zone is not None and record.topology_zone == zone:
        return 0
    if region is not None and record.topology_region == region:
        return 1
    return 2


def prefer_topology(records: Sequence[ProducerInfo], zone: str | None,
                    region: str | None) -> list[ProducerInfo]:
    """``records`` with those in ``zone`` first, then those in ``region``, then the rest,
    each group in its given order (a stable sort; nothing is dropped)."""
    if zone is None and region is None:
        return list(records)
    return sorted(records, key=lambda r: _tier(r, zone, region))


def apply_filter(records: list[ProducerInfo], discovery_filter: DiscoveryFilter
                 ) -> list[ProducerInfo]:
    """What ``discovery_filter`` keeps of ``records``, checked, without duplicates.
    Raises :class:`DiscoveryFilterError` for a result that is not records (what the filter
    itself raises is the caller's to report)."""
    result = discovery_filter(list(records))
    if isinstance(result, (str, bytes)) or not isinstance(result, Iterable):
        raise DiscoveryFilterError(
            f"discovery_filter returned {type(result).__name__}: return a list of the "
            "ProducerInfo records it was given (an empty list connects to none)")
    out: list[ProducerInfo] = []
    seen: set[tuple[str, int]] = set()
    for r in result:
        if not isinstance(r, ProducerInfo):
            raise DiscoveryFilterError(
                f"discovery_filter returned {r!r} ({type(r).__name__}) among its records: "
                "return ProducerInfo records (those it was given, or "
                "nsq_spark.ProducerInfo(host, tcp_port, http_port))")
        if r.producer not in seen:
            seen.add(r.producer)
            out.append(r)
    return out


def choose_producers(records: Sequence[ProducerInfo], *, zone: str | None = None,
                     region: str | None = None,
                     discovery_filter: DiscoveryFilter | None = None) -> list[ProducerInfo]:
    """The producers to connect to after one poll, in order (see the module doc)."""
    preferred = prefer_topology(records, zone, region)
    if discovery_filter is None:
        return preferred
    return apply_filter(preferred, discovery_filter)
