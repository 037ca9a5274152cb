"""``nsq-spark stat``: nsq_stat. Every ``--interval`` (2s) one view of the channels
(depth, in flight, deferred, requeued, timed out, message counts and rates, clients),
summed over the nsqds given or found through lookupd; ``--json`` prints one JSON object
an interval::

    nsq-spark stat --nsqd-http-address 127.0.0.1:4151 --topic events --count 1
"""

from __future__ import annotations

import argparse
import time
from typing import IO, Any

from nsq_spark._options import Option
from nsq_spark._validate import Limit

from . import _common
from ._common import DurationAction, add, add_option
from ._nsqds import _NoNsqdListed, add_where, admin_usage, client_options, node_failure, nsqd_targets

COUNT = Option("count", "int", 0, limit=Limit("views", 0),
               doc="views to print, then exit (default 0: until interrupted)")


def add_parser(sub: Any) -> argparse.ArgumentParser:
    st: argparse.ArgumentParser = sub.add_parser(
        "stat", help="per-interval channel stats (like nsq_stat)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Every --interval, one view of the channels summed over the nsqds: "
        "depth, disk depth, in flight, deferred, requeued, timed out, messages and "
        "messages per second, clients (like nsq_stat).",
        epilog="examples:\n"
        "  nsq-spark stat --nsqd-http-address 127.0.0.1:4151 --count 1\n"
        "  nsq-spark stat --lookupd-http-address 127.0.0.1:4161 --topic events "
        "--channel archive --interval 5s\n"
        "  nsq-spark stat --nsqd-http-address 127.0.0.1:4151 --json --count 3 | jq .channels")
    add(st, "--topic", help="only this topic (default: every topic)")
    add(st, "--channel", help="only this channel of --topic (default: every channel)")
    add(st, "--interval", "--status-every", action=DurationAction, default=2.0,
        metavar="DURATION", help="time between views: 2s (default), 500ms, 1m "
        "(--status-every: nsq_stat's old name of it)")
    add_option(st, COUNT)
    add(st, "--json", action="store_true",
        help="one JSON object per view (a line each) instead of the table")
    add(st, "--clients", action="store_true",
        help="a line per consumer connection under each channel (the table)")
    add_where(st)
    return st


def run(args: argparse.Namespace, stdout: IO[bytes], stderr: IO[str]) -> int:
    """``nsq-spark stat``."""
    from nsq_spark._addresses import strip_userinfo
    from nsq_spark.admin import HTTPDeadlineError, NsqdClient
    from nsq_spark.admin.cluster import Deadline, concurrently
    from nsq_spark.admin.stat import StatView, format_text
    from nsq_spark.admin.transport import HttpTransport

    problem = admin_usage(args)
    if problem:
        stderr.write(f"nsq-spark stat: error: {problem}\n")
        return _common.EXIT_USAGE
    transport = HttpTransport(connect_timeout=args.http_client_connect_timeout)
    view = StatView(args.topic, args.channel)
    shown = 0
    lists: dict[str, list[str]] = {}  # each lookupd's nsqds, kept while it does not answer
    try:
        while True:
            started = time.monotonic()
            # a lookupd that does not answer keeps its nsqds of the last round, and is
            # said in the view (only the first round fails when none answers)
            notes: tuple[str, ...] = ()
            try:
                targets, unanswered = nsqd_targets(args, transport, last=lists)
            except _NoNsqdListed as exc:
                if shown == 0:
                    raise
                # e.g. its one nsqd restarted and lookupd dropped it: say so, go on
                targets, unanswered, notes = [], exc.unanswered, (exc.later,)
            # nsq_stat's clusterinfo asks the nsqds at once: all of them within one
            # request timeout, so twelve that never answer cost one timeout, not twelve
            deadline = Deadline(args.http_client_request_timeout)

            def ask(address: str) -> Any:
                options = {**client_options(args, transport), "timeout": deadline.left()}
                try:
                    return NsqdClient(address, **options).stats(args.topic, args.channel,
                                                                include_clients=True)
                except HTTPDeadlineError:
                    raise HTTPDeadlineError(
                        f"nsqd {strip_userinfo(address)}: no complete /stats within the "
                        f"view's deadline of {deadline.seconds:g} s "
                        "(--http-client-request-timeout: the nsqds of one view are asked "
                        "at once, all within it)") from None

            snapshots = {}
            unreachable = {}
            for address, answer in concurrently(ask, targets, deadline).items():
                if isinstance(answer, BaseException):
                    if not node_failure(answer):
                        raise answer
                    unreachable[strip_userinfo(address)] = str(answer)
                else:
                    snapshots[strip_userinfo(address)] = answer
            if not snapshots and shown == 0:
                raise RuntimeError("no nsqd answered: " + "; ".join(
                    f"{a}: {e}" for a, e in unreachable.items()))
            # the wall clock only for the time shown: rates are measured on the monotonic
            # one (an NTP step of time.time() would give absurd rates)
            interval = view.update(time.time(), snapshots, unreachable, unanswered,
                                   monotonic=time.monotonic(), notes=notes)
            if snapshots and (args.topic or args.channel) and not interval.rows:
                # nsq_stat: "failed to find channel(%s) in stats metadata for topic(%s)"
                what = (f"channel {args.channel!r} of topic {args.topic!r}" if args.channel
                        else f"topic {args.topic!r}")
                raise RuntimeError(
                    f"no {what} on the nsqds that answered ({', '.join(snapshots)}); "
                    "check the name (nsq-spark stat without --channel / --topic lists "
                    "what there is)")
            if args.json:
                text = interval.as_json() + "\n"
            else:
                text = format_text(interval, header=shown % 25 == 0, clients=args.clients)
            stdout.write(text.encode())
            stdout.flush()
            shown += 1
            if args.count and shown >= args.count:
                return _common.EXIT_OK
            time.sleep(max(0.0, args.interval - (time.monotonic() - started)))
    finally:
        transport.close()
