"""``nsq-spark tail``: nsq_tail. It consumes a topic and writes each body followed by a
newline to stdout::

    nsq-spark tail --topic events --lookupd-http-address 127.0.0.1:4161 -n 10

By default it reads on a new ephemeral channel, which gets only the messages published
after it exists (plus the topic's backlog when the topic has no channel yet); NSQ keeps a
backlog per channel, so ``--channel NAME`` reads (and consumes: tail FINishes what it
prints) the backlog of the named, durable channel. A line on stderr says which it does.

``--max-in-flight`` is the Reader's ``max_in_flight`` (its row,
:data:`nsq_spark.config.READER`, bounds it; the command's default is its own).
"""

from __future__ import annotations

import argparse
import random
import signal
import threading
import time
from typing import IO, Any

from nsq_spark._options import Option
from nsq_spark.config import READER
from nsq_spark._validate import SECONDS_OR_ZERO, Limit

from . import _common
from ._common import add, add_option

CONNECT_GRACE = 2.0   # seconds tail waits for a first connection before --idle-exit applies

COUNT = Option("count", "int", 0, limit=Limit("messages", 0),
               doc="exit after this many messages (default 0: run until interrupted)")
IDLE_EXIT = Option(
    "idle_exit", "seconds", 0, limit=SECONDS_OR_ZERO,
    doc="exit after this many seconds without a message (default 0: never); exit status 1 "
    "if no nsqd was ever connected (a first connection is given at least "
    f"{CONNECT_GRACE:g} s)")


def add_parser(sub: Any) -> argparse.ArgumentParser:
    t: argparse.ArgumentParser = sub.add_parser(
        "tail", help="print the messages of a topic (like nsq_tail)",
        description="Consume a topic and write each message body and a newline to stdout "
        "(like nsq_tail).")
    add(t, "--topic", action="append", required=True, dest="topics",
        help="topic to consume (repeat for several)")
    add(t, "--channel", default=None,
        help="channel to read, e.g. a durable one to read (and consume) its backlog "
        "(default: a new tail<random>#ephemeral channel, which sees only messages "
        "published from now on, unless the topic has no channel yet, and which nsqd drops "
        "afterwards)")
    add(t, "--nsqd-tcp-address", action="append", default=[], dest="nsqd_tcp_addresses",
        metavar="HOST:PORT", help="nsqd TCP address (repeatable)")
    add(t, "--lookupd-http-address", action="append", default=[],
        dest="lookupd_http_addresses", metavar="HOST:PORT",
        help="nsqlookupd HTTP address (repeatable)")
    add_option(t, COUNT, "-n", "--n", "--max-messages", "-max-messages", dest="count",
               go_aliases=False)
    add_option(t, READER["max_in_flight"], "--max-in-flight", default=200,
               help="max in flight (default %(default)s)")
    add(t, "--print-topic", action="store_true", help="prefix each line with 'topic | '")
    add_option(t, IDLE_EXIT, "--idle-exit", "--timeout")
    add(t, "--quiet", "-q", action="store_true",
        help="no status line on stderr (which channel is read)")
    _common.add_connection_options(t)
    _common.add_log_level(t)
    return t


def run(args: argparse.Namespace, stdout: IO[bytes], stderr: IO[str]) -> int:
    """``nsq-spark tail``."""
    from nsq_spark.protocol import check_channel, check_topic

    if not args.nsqd_tcp_addresses and not args.lookupd_http_addresses:
        raise ValueError("give --nsqd-tcp-address or --lookupd-http-address (where to find "
                         "the topic)")
    if args.nsqd_tcp_addresses and args.lookupd_http_addresses:
        raise ValueError("give --nsqd-tcp-address or --lookupd-http-address, not both")
    for topic in args.topics:
        check_topic(topic)
    channel = args.channel or f"tail{random.randrange(1_000_000):06d}#ephemeral"
    check_channel(channel)
    from nsq_spark._consumer.reader import Reader

    connection_options = _common.connection_options(args)
    if not args.quiet:
        if args.channel:
            what = (f"channel {channel!r}: its backlog, then new messages; what is printed "
                    "is consumed (FINished)")
        else:
            what = (f"the new ephemeral channel {channel!r}: only messages published from "
                    "now on (use --channel NAME to read a channel's backlog)")
        stderr.write(f"tail: reading {', '.join(args.topics)} on {what}\n")
        stderr.flush()
    readers = [Reader(topic, channel, nsqd_tcp_addresses=args.nsqd_tcp_addresses or None,
                      lookupd_http_addresses=args.lookupd_http_addresses or None,
                      max_in_flight=args.max_in_flight, **connection_options)
               for topic in args.topics]
    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        stop.set()

    old = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            old[sig] = signal.signal(sig, on_signal)
    written = 0
    connected = False
    last_msg = time.monotonic()
    # one topic: wait longer per call; several: poll each briefly in turn
    poll = 0.5 if len(readers) == 1 else 0.05
    try:
        while not stop.is_set():
            got = False
            for topic, reader in zip(args.topics, readers):
                want = args.max_in_flight
                if args.count:
                    want = min(want, args.count - written)
                batch = reader.get_batch(max_messages=want, timeout=poll)
                if not batch:
                    continue
                got = True
                prefix = f"{topic} | ".encode() if args.print_topic else b""
                out = b"".join(prefix + m.body + b"\n" for m in batch)
                try:
                    stdout.write(out)
                    stdout.flush()
                except BrokenPipeError:
                    reader.requeue(batch)   # not shown: let another consumer have them
                    return _common.EXIT_OK
                reader.finish(batch)
                written += len(batch)
                if args.count and written >= args.count:
                    return _common.EXIT_OK
            now = time.monotonic()
            if got:
                last_msg = now
                connected = True
            if not connected:
                connected = any(_ever_subscribed(r) for r in readers)
            # the first connection gets at least CONNECT_GRACE s, whatever --idle-exit says
            idle_limit = args.idle_exit if connected else max(args.idle_exit, CONNECT_GRACE)
            if args.idle_exit and not got and now - last_msg >= idle_limit:
                break
        if not connected:
            if args.nsqd_tcp_addresses:
                where = (f"nsqd {', '.join(args.nsqd_tcp_addresses)} (is nsqd running "
                         "there? the address is nsqd's TCP port, 4150 by default)")
            else:
                where = (f"any nsqd for topic {', '.join(args.topics)} through lookupd "
                         f"{', '.join(args.lookupd_http_addresses)} (does the topic exist "
                         "on an nsqd registered there? the address is lookupd's HTTP port, "
                         "4161 by default)")
            stderr.write(f"nsq-spark tail: error: never connected to {where}\n")
            return _common.EXIT_ERROR
        return _common.EXIT_OK
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        for reader in readers:
            reader.close()


def _ever_subscribed(reader: Any) -> bool:
    """True once a connection of ``reader`` is subscribed (or was: it received messages)."""
    for conn in reader.stats().get("connections", {}).values():
        if conn.get("state") in ("subscribed", "closing") or conn.get("messages"):
            return True
    return False
