"""What ``stat`` and ``topic`` / ``channel`` share: where to act (the nsqds given, or
those the lookupds list), the HTTP client's bounds, and the checks before any request.

Every request is bounded as a whole (``--http-client-request-timeout``) and so is every
answer's size (:mod:`nsq_spark.admin.transport`); an address may carry user info, sent as
``Authorization: Basic`` and never shown.
"""

from __future__ import annotations

import argparse
from typing import Any

from nsq_spark._options import Option
from nsq_spark._validate import Limit

from ._common import add, add_log_level, add_option, duration

MAX_ANSWER_BYTES = Option(
    "http_client_max_answer_bytes", "int", limit=Limit("bytes", 1, 1 << 31),
    doc="size limit of an answer (default: per kind, 32 MiB for nsqd's /stats, 16 MiB for "
    "lookupd's answers, 1 MiB for the others)")


def add_where(p: argparse.ArgumentParser) -> None:
    """Where to act (nsqd or lookupd HTTP addresses) and the HTTP client's bounds."""
    add(p, "--nsqd-http-address", action="append", default=[], dest="nsqd_http_addresses",
        metavar="HOST:PORT", help="nsqd HTTP address (repeatable; no default: give the port, "
        "which nsqd opens at 4151 unless its --http-address says otherwise)")
    add(p, "--lookupd-http-address", action="append", default=[],
        dest="lookupd_http_addresses", metavar="HOST:PORT",
        help="nsqlookupd HTTP address (repeatable; no default: give the port, 4161 unless "
        "its --http-address says otherwise): act on the nsqds it lists")
    add(p, "--http-client-connect-timeout", type=duration("--http-client-connect-timeout"),
        default=2.0, metavar="DURATION",
        help="time a TCP (and TLS) connect to nsqd / nsqlookupd may take (default 2s)")
    add(p, "--http-client-request-timeout", type=duration("--http-client-request-timeout"),
        default=5.0, metavar="DURATION",
        help="time a whole request may take, however slowly the answer comes (default "
        "5s); stat: the nsqds of one view are asked at once, all within it")
    add_option(p, MAX_ANSWER_BYTES, metavar="BYTES")
    add_log_level(p)


def node_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is what a node's request can end in (an admin error, no answer,
    a bad name), as opposed to a bug that must not be shown as "did not answer"."""
    from nsq_spark.errors import NSQError

    return isinstance(exc, (NSQError, OSError, ValueError))


def client_options(args: argparse.Namespace, transport: Any) -> dict[str, Any]:
    """The admin clients' options from the command line (timeout, size limit, the shared
    transport)."""
    return {"timeout": args.http_client_request_timeout, "transport": transport,
            "max_answer_bytes": args.http_client_max_answer_bytes}


def nsqd_targets(args: argparse.Namespace, transport: Any, for_create: bool = False,
                  last: dict[str, list[str]] | None = None
                  ) -> tuple[list[str], dict[str, str]]:
    """The nsqd HTTP addresses to act on, and the lookupds that did not answer (address
    without user info: what the attempt said). Given with --nsqd-http-address, or what
    the lookupds list (asked concurrently): the topic's producers (``lookup(topic)``, as
    nsqadmin does), or every registered nsqd (``for_create`` of a topic, or no topic).
    ``last`` (``stat``): each lookupd's list of the previous round, updated here; a
    lookupd that does not answer keeps its list. Raises when no lookupd answered (and
    none answered before), or when none lists an nsqd."""
    from nsq_spark._addresses import parse_http_address_list, strip_userinfo
    from nsq_spark.admin import LookupdClient
    from nsq_spark.admin.cluster import concurrently

    if args.nsqd_http_addresses:
        return parse_http_address_list(args.nsqd_http_addresses, "--nsqd-http-address",
                                       "127.0.0.1:4151"), {}
    lookupds = parse_http_address_list(args.lookupd_http_addresses,
                                       "--lookupd-http-address", "127.0.0.1:4161")
    lists = last if last is not None else {}
    errors: dict[str, str] = {}

    def ask(address: str) -> list[str]:
        client = LookupdClient(address, **client_options(args, transport))
        if args.topic and not for_create:
            producers = list(client.lookup(args.topic).producers)
        else:
            producers = client.nodes()
        return [p.http_address for p in producers if p.http_address]

    for address, answer in concurrently(ask, lookupds).items():
        if isinstance(answer, BaseException):
            if not node_failure(answer):
                raise answer  # not an answer of a node: a bug, not "did not answer"
            errors[strip_userinfo(address)] = str(answer)
        else:
            lists[address] = answer
    if not any(a in lists for a in lookupds):
        raise RuntimeError("no nsqlookupd answered: " + "; ".join(errors.values()))
    found: list[str] = []
    for address in lookupds:
        found += [a for a in lists.get(address, []) if a not in found]
    if not found:
        where = f"for topic {args.topic!r} " if args.topic and not for_create else ""
        shown = ", ".join(strip_userinfo(a) for a in lookupds)
        unanswered = (f"; {', '.join(errors)} did not answer: {'; '.join(errors.values())}"
                      if errors else "")
        raise _NoNsqdListed(f"nsqlookupd {shown} lists no nsqd {where}(is the name right? "
                            "does nsqd run with --lookupd-tcp-address?)" + unanswered,
                            f"nsqlookupd {shown} lists no nsqd {where}for now (restarted "
                            "and not registered again yet?); asking again next interval",
                            errors)
    return found, errors


class _NoNsqdListed(RuntimeError):
    """The lookupds that answered list no nsqd: an error for an action and for the first
    view of ``stat``; a later view says ``later`` and goes on. ``unanswered``: the
    lookupds that did not answer (address: what the attempt said)."""

    def __init__(self, message: str, later: str, unanswered: dict[str, str]) -> None:
        super().__init__(message)
        self.later = later
        self.unanswered = unanswered


def admin_usage(args: argparse.Namespace) -> str | None:
    """What is wrong with the arguments of stat/topic/channel before any request (exit
    status 2), or None: names, addresses, where to act."""
    from nsq_spark._addresses import parse_http_address_list
    from nsq_spark.errors import InvalidAddressError, InvalidNameError
    from nsq_spark.protocol import check_channel, check_topic

    if bool(args.nsqd_http_addresses) == bool(args.lookupd_http_addresses):
        return "give --nsqd-http-address or --lookupd-http-address (one of them, repeatable)"
    if getattr(args, "channel", None) is not None and args.topic is None:
        return "--channel needs --topic"
    try:
        if args.topic is not None:
            check_topic(args.topic)
        if getattr(args, "channel", None) is not None:
            check_channel(args.channel)
        parse_http_address_list(args.nsqd_http_addresses, "--nsqd-http-address",
                                "127.0.0.1:4151")
        parse_http_address_list(args.lookupd_http_addresses, "--lookupd-http-address",
                                "127.0.0.1:4161")
    except (InvalidNameError, InvalidAddressError) as exc:
        return str(exc)
    return None
