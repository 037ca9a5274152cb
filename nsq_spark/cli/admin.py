"""``nsq-spark topic|channel create|delete|pause|unpause|empty``: nsqd's operations on
every nsqd given (or every nsqd lookupd lists for the topic, as nsqadmin does; ``topic
create`` through lookupd: every nsqd registered there); ``delete`` is nsqadmin's delete,
every lookupd's registration too (:mod:`nsq_spark.admin.cluster`)::

    nsq-spark channel pause --topic events --channel archive --nsqd-http-address 127.0.0.1:4151
"""

from __future__ import annotations

import argparse
from typing import IO, Any

from . import _common
from ._common import add
from ._nsqds import add_where, admin_usage, client_options, node_failure, nsqd_targets

ADMIN_ACTIONS = ("create", "delete", "pause", "unpause", "empty")
_ACTION_DONE = {"create": "created", "delete": "deleted", "pause": "paused",
                "unpause": "unpaused", "empty": "emptied"}


def add_parsers(sub: Any) -> None:
    """``topic`` and ``channel``."""
    for kind in ("topic", "channel"):
        what = "a topic" if kind == "topic" else "a topic's channel"
        p: argparse.ArgumentParser = sub.add_parser(
            kind, help=f"create, delete, pause, unpause or empty {what} on nsqd",
            formatter_class=argparse.RawDescriptionHelpFormatter,
            description=f"Run nsqd's /{kind}/ACTION on every nsqd given with "
            "--nsqd-http-address, or on every nsqd lookupd lists for the topic ("
            + ("create: every nsqd registered with lookupd" if kind == "topic" else
               "create included: the nsqds that have the topic, as nsqadmin does; an nsqd "
               "without the topic refuses a channel") + "; a lookupd that does not answer "
            "is a failure: exit status 1, the action may be incomplete, as an nsqd only "
            "that lookupd knows, if any, was not reached). pause: nsqd "
            + ("copies nothing into the topic's channels" if kind == "topic" else
               "sends nothing to the channel's consumers") + " until unpause; empty: drop "
            + ("the messages not yet copied into the channels" if kind == "topic" else
               "every message of the channel: queued, in flight and deferred (consumers' "
               "FIN or REQ of the in-flight ones then fail)") + "; delete: drop "
            + ("the topic, its channels and their messages" if kind == "topic" else
               "the channel and its messages, and close its consumers' connections") + ".",
            epilog="examples:\n"
            + (f"  nsq-spark topic create --topic events --nsqd-http-address 127.0.0.1:4151\n"
               f"  nsq-spark topic pause --topic events --lookupd-http-address 127.0.0.1:4161"
               if kind == "topic" else
               "  nsq-spark channel pause --topic events --channel archive "
               "--nsqd-http-address 127.0.0.1:4151\n"
               "  nsq-spark channel empty --topic events --channel archive "
               "--lookupd-http-address 127.0.0.1:4161"))
        p.add_argument("action", choices=ADMIN_ACTIONS, help="what to do")
        add(p, "--topic", required=True, help="the topic")
        if kind == "channel":
            add(p, "--channel", required=True, help="the channel")
        add_where(p)


def run(args: argparse.Namespace, stdout: IO[bytes], stderr: IO[str]) -> int:
    """``nsq-spark topic|channel ACTION``."""
    from nsq_spark._addresses import strip_userinfo
    from nsq_spark.admin import NsqdClient
    from nsq_spark.admin.cluster import concurrently
    from nsq_spark.admin.transport import HttpTransport

    problem = admin_usage(args)
    if problem:
        stderr.write(f"nsq-spark {args.command}: error: {problem}\n")
        return _common.EXIT_USAGE
    channel: str | None = getattr(args, "channel", None)
    transport = HttpTransport(connect_timeout=args.http_client_connect_timeout)
    try:
        if args.action == "delete":
            return _delete(args, channel, transport, stdout, stderr)
        # a channel goes where its topic is (nsqd refuses one for a topic it lacks)
        targets, unanswered = nsqd_targets(
            args, transport, for_create=args.action == "create" and channel is None)
        # an nsqd that only an unanswering lookupd knows (we cannot tell whether there
        # is one) was not reached: a failure, the action may be incomplete
        failed = len(unanswered)
        for lookupd, error in unanswered.items():
            stderr.write(f"nsq-spark {args.command} {args.action}: error: nsqlookupd "
                         f"{lookupd} did not answer, so an nsqd only it knows, if any, was "
                         f"not {_ACTION_DONE[args.action]} (the action may be incomplete): "
                         f"{error}\n")
        what = f"topic {args.topic}" if channel is None else f"channel {args.topic}/{channel}"

        def act(address: str) -> None:
            nsqd = NsqdClient(address, **client_options(args, transport))
            if channel is None:
                getattr(nsqd, f"{args.action}_topic")(args.topic)
            else:
                getattr(nsqd, f"{args.action}_channel")(args.topic, channel)

        for address, outcome in concurrently(act, targets).items():
            if isinstance(outcome, BaseException):
                if not node_failure(outcome):
                    raise outcome
                failed += 1
                stderr.write(f"nsq-spark {args.command} {args.action}: error: {outcome}\n")
                continue
            stdout.write(f"{_ACTION_DONE[args.action]} {what} on nsqd "
                         f"{strip_userinfo(address)}\n".encode())
        stdout.flush()
        return _common.EXIT_ERROR if failed else _common.EXIT_OK
    finally:
        transport.close()


def _delete(args: argparse.Namespace, channel: str | None, transport: Any,
            stdout: IO[bytes], stderr: IO[str]) -> int:
    """``topic delete`` / ``channel delete`` as nsqadmin does
    (:mod:`nsq_spark.admin.cluster`): every lookupd's registration, then every nsqd of the
    topic."""
    from nsq_spark.admin import delete_channel, delete_topic

    where = {"lookupd_http_addresses": args.lookupd_http_addresses,
             "nsqd_http_addresses": args.nsqd_http_addresses,
             "timeout": args.http_client_request_timeout, "transport": transport,
             "max_answer_bytes": args.http_client_max_answer_bytes}
    if channel is None:
        result = delete_topic(args.topic, **where)
        what = f"topic {args.topic}"
    else:
        result = delete_channel(args.topic, channel, **where)
        what = f"channel {args.topic}/{channel}"
    for node in result.done:
        kind, _, address = node.partition(" ")
        done = "the registration of " if kind == "nsqlookupd" else ""
        stdout.write(f"deleted {done}{what} on {kind} {address}\n".encode())
    stdout.flush()
    for note in result.notes:
        stderr.write(f"nsq-spark {args.command} delete: {note}\n")
    for node, error in result.failed:
        stderr.write(f"nsq-spark {args.command} delete: error: {node}: {error}\n")
    return _common.EXIT_OK if result.ok else _common.EXIT_ERROR
