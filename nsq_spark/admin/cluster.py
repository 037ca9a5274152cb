"""Operations on a whole NSQ cluster through the admin clients: the nsqds that carry a
topic (as nsqadmin finds them), and deleting a topic or a channel as nsqadmin does.

**Delete as nsqadmin does** (nsqadmin v1.3.0, ``DELETE /api/topics/<topic>[/<channel>]``,
its ``ClusterInfo.DeleteTopic`` / ``DeleteChannel``), in its order:

1. find the nsqds that carry the topic: every lookupd's ``/lookup?topic=`` (or, given
   nsqd addresses only, each nsqd's ``/stats`` for the topic);
2. drop the registration on every lookupd (``POST /topic/delete`` drops the topic's and
   all its channels'; ``POST /channel/delete`` the channel's);
3. delete on every nsqd found (``POST /topic/delete`` / ``/channel/delete``).

Step 2 is what deleting on the nsqds alone misses: nsqlookupd keeps a channel's
registration after its nsqds drop it, and an nsqd that makes the topic again (the next
publish after the topic was deleted, or a restart) asks lookupd for the topic's channels
and makes them too, so the deleted channel collects every message with no one to read
it. nsqadmin uses no tombstone to delete (only to retire one nsqd of a topic:
:meth:`~nsq_spark.admin.LookupdClient.tombstone_topic_producer`), and neither do we.

Two deliberate differences, both about what is reported, not what is done: a lookupd or
an nsqd that answers 404 (nothing to delete there) counts as done, with a note (nsqadmin
reports it as an error, though the cluster ends the same); and every lookupd and nsqd is
asked concurrently (nsqadmin asks the lookupds concurrently in step 1, one after another
in steps 2 and 3).

Every request of a step runs concurrently (:func:`concurrently`, threads) under the
clients' ``timeout``, so one slow node never holds the others back.
"""

from __future__ import annotations

import concurrent.futures
import ssl
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence, TypeVar

from nsq_spark._addresses import parse_http_address_list, strip_userinfo
from nsq_spark.protocol import check_channel, check_topic

from .client import DEFAULT_TIMEOUT, LookupdClient, NsqdClient
from .errors import AdminError, HTTPDeadlineError, NotFoundError
from .transport import HttpTransport, Transport

__all__ = ["ClusterResult", "Deadline", "concurrently", "delete_channel", "delete_topic",
           "topic_producers"]

K = TypeVar("K")
V = TypeVar("V")

#: the most requests :func:`concurrently` has in flight at once
MAX_CONCURRENCY = 32


class Deadline:
    """One deadline for many requests (``seconds`` from now): each is given what is left
    of it as its client's ``timeout``."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.at = time.monotonic() + seconds

    def left(self) -> float:
        """Seconds left (at least a millisecond: a client's timeout must be > 0)."""
        return max(0.001, self.at - time.monotonic())

    @property
    def passed(self) -> bool:
        return time.monotonic() >= self.at


def concurrently(func: Callable[[K], V], items: Iterable[K], deadline: Deadline | None = None
                 ) -> dict[K, V | BaseException]:
    """``func(item)`` for every item, at most :data:`MAX_CONCURRENCY` at a time (threads),
    in one dict in the order of ``items``: each item's result or what it raised. With
    ``deadline``, an item not started before it passed is not started at all: its value
    is an :class:`~nsq_spark.admin.errors.HTTPDeadlineError` (``func`` bounds the ones
    started, with a client's ``timeout`` of ``deadline.left()``)."""
    keys = list(dict.fromkeys(items))
    out: dict[K, V | BaseException] = {}
    if not keys:
        return out

    def run(item: K) -> V:
        if deadline is not None and deadline.passed:
            raise HTTPDeadlineError(
                f"{strip_userinfo(str(item))}: not asked, the deadline of "
                f"{deadline.seconds:g} s passed before its turn came ({MAX_CONCURRENCY} "
                "are asked at a time: too many nodes for the time given)")
        return func(item)

    if len(keys) == 1:
        try:
            out[keys[0]] = run(keys[0])
        except Exception as exc:  # noqa: BLE001 - handed back, per item
            out[keys[0]] = exc
        return out
    with concurrent.futures.ThreadPoolExecutor(min(MAX_CONCURRENCY, len(keys)),
                                               thread_name_prefix="nsq-admin") as pool:
        futures = {k: pool.submit(run, k) for k in keys}
        for k, fut in futures.items():
            failure = fut.exception()
            out[k] = failure if failure is not None else fut.result()
    return out


@dataclass(frozen=True)
class ClusterResult:
    """What one cluster operation did. ``done``: the nodes where it took (``"nsqd
    host:port"`` / ``"nsqlookupd host:port"``); ``failed``: ``(node, what it said)`` for
    those where it did not, or that did not answer; ``notes``: lines about the rest (a
    404: nothing to do there)."""

    done: tuple[str, ...] = ()
    failed: tuple[tuple[str, str], ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """True when no node failed."""
        return not self.failed


def topic_producers(topic: str, lookupd_http_addresses: Sequence[str] = (), *,
                    nsqd_http_addresses: Sequence[str] = (),
                    timeout: float = DEFAULT_TIMEOUT, transport: Transport | None = None,
                    auth_secret: str | bytes | None = None,
                    max_answer_bytes: int | None = None
                    ) -> tuple[list[str], dict[str, str]]:
    """The HTTP addresses of the nsqds that carry ``topic``, as nsqadmin finds them
    (every lookupd's ``/lookup``, concurrently; or, without lookupds, those of
    ``nsqd_http_addresses`` whose ``/stats`` has the topic), and the nodes that did not
    answer (address without user info: what the attempt said). Raises
    :class:`~nsq_spark.admin.errors.AdminError` when none answered."""
    own = transport is None
    transport = transport or HttpTransport()
    try:
        return _producers(topic, lookupd_http_addresses, nsqd_http_addresses, timeout,
                          transport, auth_secret, max_answer_bytes)
    finally:
        if own:
            transport.close()


def _producers(topic: str, lookupds: Sequence[str], nsqds: Sequence[str], timeout: float,
               transport: Transport, auth_secret: str | bytes | None,
               max_answer_bytes: int | None = None) -> tuple[list[str], dict[str, str]]:
    errors: dict[str, str] = {}
    found: list[str] = []
    if lookupds:
        def lookup(address: str) -> list[str]:
            client = LookupdClient(address, timeout=timeout, transport=transport,
                                   auth_secret=auth_secret, max_answer_bytes=max_answer_bytes)
            return [p.http_address for p in client.lookup(topic).producers
                    if p.http_address]
        answers = concurrently(lookup, lookupds)
        for address, res in answers.items():
            if isinstance(res, BaseException):
                errors[strip_userinfo(address)] = str(res)
            else:
                found += [a for a in res if a not in found]
        if len(errors) == len(answers):
            raise AdminError("no nsqlookupd answered: " + "; ".join(errors.values()))
        return found, errors

    def has_topic(address: str) -> bool:
        client = NsqdClient(address, timeout=timeout, transport=transport,
                            auth_secret=auth_secret, max_answer_bytes=max_answer_bytes)
        return client.stats(topic, include_clients=False).topic(topic) is not None
    answers_ = concurrently(has_topic, nsqds)
    for address, carries in answers_.items():
        if isinstance(carries, BaseException):
            errors[strip_userinfo(address)] = str(carries)
        elif carries:
            found.append(address)
    if answers_ and len(errors) == len(answers_):
        raise AdminError("no nsqd answered: " + "; ".join(errors.values()))
    return found, errors


def _delete(topic: str, channel: str | None, lookupds: Sequence[str], nsqds: Sequence[str],
            timeout: float, transport: Transport | None, ssl_context: ssl.SSLContext | None,
            auth_secret: str | bytes | None, max_answer_bytes: int | None) -> ClusterResult:
    check_topic(topic)
    if channel is not None:
        check_channel(channel)
    lookupds = parse_http_address_list(lookupds, "lookupd_http_addresses", "127.0.0.1:4161")
    nsqds = parse_http_address_list(nsqds, "nsqd_http_addresses", "127.0.0.1:4151")
    if not lookupds and not nsqds:
        raise AdminError("give lookupd_http_addresses or nsqd_http_addresses: where to find "
                         "the nsqds of the topic")
    own = transport is None
    transport = transport or HttpTransport(ssl_context=ssl_context)
    done: list[str] = []
    failed: list[tuple[str, str]] = []
    notes: list[str] = []
    what = f"topic {topic}" if channel is None else f"channel {topic}/{channel}"

    def record(answers: dict[str, None | BaseException], kind: str) -> None:
        for address, res in answers.items():
            node = f"{kind} {strip_userinfo(address)}"
            if isinstance(res, NotFoundError):
                notes.append(f"{node}: {what} was not there ({res.message})")
                done.append(node)
            elif isinstance(res, BaseException):
                failed.append((node, str(res)))
            else:
                done.append(node)

    try:
        # 1. the nsqds of the topic, before anything is deleted (nsqadmin's order)
        try:
            producers, unanswered = _producers(topic, lookupds, nsqds, timeout, transport,
                                               auth_secret, max_answer_bytes)
        except AdminError as exc:
            kind = "nsqlookupd" if lookupds else "nsqd"
            return ClusterResult(failed=tuple((f"{kind} {strip_userinfo(a)}", str(exc))
                                              for a in (lookupds or nsqds)))
        for address, error in unanswered.items():
            kind = "nsqlookupd" if lookupds else "nsqd"
            failed.append((f"{kind} {address}", f"did not answer, so an nsqd only it knows, "
                           f"if any, still has {what}: {error}"))

        def delete_on(kind: type[LookupdClient] | type[NsqdClient]) -> Callable[[str], None]:
            def delete(address: str) -> None:
                client = kind(address, timeout=timeout, transport=transport,
                              auth_secret=auth_secret)
                if channel is None:
                    client.delete_topic(topic)
                else:
                    client.delete_channel(topic, channel)
            return delete

        # 2. every lookupd's registration; 3. every nsqd of the topic
        record(concurrently(delete_on(LookupdClient), lookupds), "nsqlookupd")
        record(concurrently(delete_on(NsqdClient), producers), "nsqd")
        if not producers:
            notes.append(f"no nsqd carries topic {topic} (nothing to delete on an nsqd)")
    finally:
        if own:
            transport.close()
    return ClusterResult(tuple(done), tuple(failed), tuple(notes))


def delete_topic(topic: str, *, lookupd_http_addresses: Sequence[str] = (),
                 nsqd_http_addresses: Sequence[str] = (), timeout: float = DEFAULT_TIMEOUT,
                 transport: Transport | None = None,
                 ssl_context: ssl.SSLContext | None = None,
                 auth_secret: str | bytes | None = None,
                 max_answer_bytes: int | None = None) -> ClusterResult:
    """Delete ``topic`` as nsqadmin does (see the module doc): its registration on every
    lookupd of ``lookupd_http_addresses`` and the topic, its channels and their messages
    on every nsqd that carries it (found through those lookupds, or among
    ``nsqd_http_addresses`` when no lookupd is given). ``timeout``, ``ssl_context``,
    ``auth_secret``, ``max_answer_bytes``: as the clients'
    (:class:`~nsq_spark.admin.NsqdClient`); ``transport``:
    one to share (default: one of its own, closed at the end). Never raises for a node
    that fails: see :class:`ClusterResult`."""
    return _delete(topic, None, lookupd_http_addresses, nsqd_http_addresses, timeout,
                   transport, ssl_context, auth_secret, max_answer_bytes)


def delete_channel(topic: str, channel: str, *, lookupd_http_addresses: Sequence[str] = (),
                   nsqd_http_addresses: Sequence[str] = (), timeout: float = DEFAULT_TIMEOUT,
                   transport: Transport | None = None,
                   ssl_context: ssl.SSLContext | None = None,
                   auth_secret: str | bytes | None = None,
                   max_answer_bytes: int | None = None) -> ClusterResult:
    """Delete ``channel`` of ``topic`` as nsqadmin does (see the module doc): its
    registration on every lookupd, and the channel and its messages on every nsqd that
    carries the topic (nsqd closes the channel's consumers' connections). Arguments and
    result as :func:`delete_topic`'s."""
    return _delete(topic, channel, lookupd_http_addresses, nsqd_http_addresses, timeout,
                   transport, ssl_context, auth_secret, max_answer_bytes)
