"""Command-line tools: ``nsq-spark publish``, ``nsq-spark tail``, ``nsq-spark stat``,
``nsq-spark topic|channel create|delete|pause|unpause|empty``, ``nsq-spark spool
redrive``, ``nsq-spark install-nsq`` (``python -m nsq_spark ...`` is the same program;
``nsq-spark --version`` prints the version).

``stat`` is nsq_stat: every ``--interval`` (2s) one view of the channels (depth, in
flight, deferred, requeued, timed out, message counts and rates, clients), summed over
the nsqds given or found through lookupd; ``--json`` prints one JSON object an interval::

    nsq-spark stat --nsqd-http-address 127.0.0.1:4151 --topic events --count 1

``topic`` and ``channel`` run nsqd's operations on every nsqd given (or every nsqd
lookupd lists for the topic, as nsqadmin does; ``topic create`` through lookupd: every
nsqd registered there); ``delete`` is nsqadmin's delete, every lookupd's registration
too (:mod:`nsq_spark.admin.cluster`). Every request is bounded as a whole
(``--http-client-request-timeout``) and so is every answer's size
(:mod:`nsq_spark.admin.transport`); an address may carry user info, sent as
``Authorization: Basic`` and never shown::

    nsq-spark channel pause --topic events --channel archive --nsqd-http-address 127.0.0.1:4151

``publish`` is to_nsq with a progress bar and an optional durable spool: it reads files
(or stdin), one message per line, and publishes them in MPUB batches::

    nsq-spark publish --topic events --nsqd-tcp-address 127.0.0.1:4150 a.jsonl b.jsonl
    producer | nsq-spark publish --topic events --nsqd-tcp-address 127.0.0.1:4150 \\
        --spool-dir /var/spool/events

With ``--spool-dir`` every line is in the spool before it is sent, and what nsqd has not
acknowledged when the command ends (nsqd down, ``--flush-timeout`` passed, the process
killed) is sent by the next run on the same directory. The summary line says how many
messages were spooled and how many nsqd acknowledged, never more than it knows.

``tail`` is nsq_tail: it consumes a topic and writes each body followed by a newline to
stdout::

    nsq-spark tail --topic events --lookupd-http-address 127.0.0.1:4161 -n 10

By default it reads on a new ephemeral channel, which gets only the messages published
after it exists (plus the topic's backlog when the topic has no channel yet); NSQ keeps a
backlog per channel, so ``--channel NAME`` reads (and consumes: tail FINishes what it
prints) the backlog of the named, durable channel. A line on stderr says which it does.

``spool redrive DIR`` moves the messages nsqd refused for good (``DIR/rejected``) back
into the spool's queue, once the cause is fixed; the next producer on ``DIR`` (a running
one within a second) sends them. A rejected file with a damaged record has every intact
record moved (those after the damage too), the file as it was kept in ``DIR/corrupt/``,
and the exit status 1.

Both take TLS (``--tls``, ``--tls-ca-file``, ...) and AUTH options; the AUTH secret comes
from a file or the ``NSQ_AUTH_SECRET`` variable, never from the command line (``ps`` would
show it), and is never printed.

Both accept the Go tools' single-dash spellings (``-topic``, ``-nsqd-tcp-address``, ...).
Exit status: 0 done, 1 error (the message says what and how to fix it; an operation that
failed on any nsqd, or through lookupd with a lookupd not answering; also ``tail``
ending without ever having connected to an nsqd, ``stat`` finding no such topic or
channel, as nsq_stat, and ``spool redrive`` keeping damaged bytes back), 2 bad usage, 3
``publish`` ended with messages still in the spool, 130 interrupted.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import signal
import stat
import sys
import threading
import time
from typing import IO, Any, Iterator, Sequence

# standard library only below them (the parser works before the dependencies exist)
from nsq_spark import validate
from nsq_spark._strict_argparse import StrictParser
from nsq_spark.errors import ConfigError
from nsq_spark.validate import MAX_SECONDS

log = logging.getLogger(__name__)

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_SPOOLED, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
AUTH_SECRET_ENV = "NSQ_AUTH_SECRET"
CONNECT_GRACE = 2.0   # seconds tail waits for a first connection before --idle-exit applies


def _add(p: argparse.ArgumentParser | argparse._ArgumentGroup, *names: str, **kw: Any) -> None:
    """An option with its Go-style single-dash alias (``--topic`` and ``-topic``)."""
    aliases = [n for n in names]
    for n in names:
        if n.startswith("--") and len(n) > 3:
            aliases.append(n[1:])
    p.add_argument(*aliases, **kw)


def _number(kind: type, option: str, **rule: Any) -> Any:
    """An argparse ``type`` that parses ``kind`` (int or float) and applies the one number
    rule (:func:`nsq_spark.validate.number`: finite, in range), naming the option."""
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{option} {text!r}: give {'an integer' if kind is int else 'a number'}"
            ) from None
        try:
            return validate.number(value, option, is_int=kind is int, **rule)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    parse.__name__ = kind.__name__  # argparse's "invalid int value" wording
    return parse


def _parse_fsync(value: str) -> str | int:
    if value in ("always", "never"):
        return value
    try:
        ms = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--spool-fsync {value!r}: use 'always', 'never', or an interval in ms") from None
    if ms <= 0:
        raise argparse.ArgumentTypeError("--spool-fsync interval must be > 0 ms")
    return ms


def _delimiter(value: str) -> bytes:
    raw = value.encode("utf-8").decode("unicode_escape").encode("latin-1")
    if len(raw) != 1:
        raise argparse.ArgumentTypeError(f"--delimiter must be one byte (got {value!r})")
    return raw


def _add_connection_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("TLS and AUTH (for a secured nsqd)")
    _add(g, "--tls", action="store_true", help="upgrade connections to TLS (nsqd --tls-*)")
    _add(g, "--tls-ca-file", metavar="PEM", help="CA certificates to verify nsqd with "
         "(default: the system's)")
    _add(g, "--tls-cert-file", metavar="PEM", help="client certificate (nsqd "
         "--tls-client-auth-policy)")
    _add(g, "--tls-key-file", metavar="PEM", help="key of --tls-cert-file")
    _add(g, "--tls-no-verify", action="store_true",
         help="do not verify nsqd's certificate (tests only)")
    _add(g, "--auth-secret-file", metavar="FILE",
         help=f"file holding the AUTH secret (first line); or set ${AUTH_SECRET_ENV}. "
         "Never given on the command line, where other users could read it")


def _connection_options(args: argparse.Namespace) -> dict[str, Any]:
    """ConnectionConfig options from the TLS/AUTH flags (see _add_connection_options)."""
    opts: dict[str, Any] = {}
    tls_files = {"tls_ca_file": args.tls_ca_file, "tls_cert_file": args.tls_cert_file,
                 "tls_key_file": args.tls_key_file}
    if args.tls or any(tls_files.values()) or args.tls_no_verify:
        opts["tls_v1"] = True
        opts.update({k: v for k, v in tls_files.items() if v})
        if args.tls_no_verify:
            opts["tls_verify"] = False
    secret: str | None = None
    if args.auth_secret_file:
        try:
            with open(args.auth_secret_file, encoding="utf-8") as f:
                secret = f.readline().rstrip("\r\n")
        except OSError as exc:
            raise OSError(exc.errno, f"--auth-secret-file {args.auth_secret_file}: "
                          f"cannot read it: {exc.strerror}") from exc
        if not secret:
            raise ValueError(f"--auth-secret-file {args.auth_secret_file}: the first line "
                             "is empty; put the secret there")
    elif os.environ.get(AUTH_SECRET_ENV):
        secret = os.environ[AUTH_SECRET_ENV]
    if secret:
        opts["auth_secret"] = secret
    return opts


def _version() -> str:
    from nsq_spark._version import __version__
    return f"nsq-spark {__version__}"


def build_parser(prog: str = "nsq-spark") -> argparse.ArgumentParser:
    # every parser and subparser: exact option names only (`-auth X` must not be taken for
    # -auth-secret-file X), no secret echoed by a usage error (see _strict_argparse)
    parser = StrictParser(prog=prog, description="NSQ command-line tools of nsq_spark")
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", required=True,
                                metavar="{publish,tail,stat,topic,channel,spool,install-nsq}")

    p = sub.add_parser("publish", help="publish lines of files or stdin to a topic",
                       description="Publish one message per line (like to_nsq), with a "
                       "progress bar on stderr and an optional durable spool.")
    _add(p, "--topic", required=True, help="topic to publish to")
    _add(p, "--nsqd-tcp-address", action="append", required=True, dest="nsqd_tcp_addresses",
         metavar="HOST:PORT", help="nsqd TCP address (repeatable: every line goes to every "
         "address, as to_nsq does; see --replicas)")
    _add(p, "--replicas", type=_number(int, "--replicas", lo=1, hi=1024), default=None,
         help="with several addresses: send each line to this many of them (default: all; "
         "1: one per line, round robin with failover)")
    _add(p, "--write-quorum", type=_number(int, "--write-quorum", lo=1, hi=1024),
         default=None, help="with several addresses: how many must acknowledge each batch "
         "(default: a majority of the replicas)")
    _add(p, "--publish-ids", action="store_true",
         help="stamp each line with a publish id (the nsq_spark envelope), so that "
         "consumers deduplicate the copies with dedup_key='publish_id' (default: the lines "
         "as they are)")
    p.add_argument("files", nargs="*", metavar="FILE",
                   help="files to read (default, or '-': stdin)")
    _add(p, "--delimiter", type=_delimiter, default=b"\n",
         help="message separator, one byte (default: newline; escapes like \\t work)")
    _add(p, "--batch-size", type=_number(int, "--batch-size", lo=1, hi=2 ** 31 - 1),
         default=1000, help="messages per MPUB (default 1000)")
    _add(p, "--rate", type=_number(float, "--rate", lo=0, unit="messages per second"),
         default=0,
         help="at most this many messages per second (default: no limit)")
    _add(p, "--retry-deadline", type=_number(float, "--retry-deadline", lo=0, lo_open=True,
                                              hi=MAX_SECONDS,
                                              unit="seconds"), default=30.0,
         help="seconds to keep retrying an unreachable nsqd before failing (default 30: "
         "rides out an nsqd restart)")
    _add(p, "--spool-dir", help="durable spool directory: messages are written there before "
         "they are sent, and kept until nsqd acknowledges them")
    _add(p, "--spool-fsync", type=_parse_fsync, default="always",
         help="'always' (sync every batch, default), 'never', or an interval in ms")
    _add(p, "--spool-max-bytes", type=_number(int, "--spool-max-bytes", lo=1, unit="bytes"),
         default=1 << 30,
         help="size bound of the spool directory (default 1 GiB); publishing waits when full")
    _add(p, "--flush-timeout", type=_number(float, "--flush-timeout", lo=0, hi=MAX_SECONDS,
                                             unit="seconds"), default=30.0,
         help="with --spool-dir: seconds to wait at the end for nsqd to acknowledge "
         "everything (default 30; what is left is sent by the next run)")
    _add(p, "--message-id-digest", action="store_true",
         help="wrap each body in the message-id envelope (see nsq_spark.spool)")
    _add(p, "--skip-empty", action="store_true",
         help="skip empty lines: the default now, as to_nsq (nsqd refuses empty bodies; "
         "a WARNING at the end counts them); kept for old command lines")
    _add(p, "--quiet", "-q", action="store_true", help="no progress output")

    t = sub.add_parser("tail", help="print the messages of a topic (like nsq_tail)",
                       description="Consume a topic and write each message body and a "
                       "newline to stdout (like nsq_tail).")
    _add(t, "--topic", action="append", required=True, dest="topics",
         help="topic to consume (repeat for several)")
    _add(t, "--channel", default=None,
         help="channel to read, e.g. a durable one to read (and consume) its backlog "
         "(default: a new tail<random>#ephemeral channel, which sees only messages "
         "published from now on, unless the topic has no channel yet, and which nsqd drops "
         "afterwards)")
    _add(t, "--nsqd-tcp-address", action="append", default=[], dest="nsqd_tcp_addresses",
         metavar="HOST:PORT", help="nsqd TCP address (repeatable)")
    _add(t, "--lookupd-http-address", action="append", default=[],
         dest="lookupd_http_addresses", metavar="HOST:PORT",
         help="nsqlookupd HTTP address (repeatable)")
    t.add_argument("-n", "--n", "--max-messages", "-max-messages",
                   type=_number(int, "-n", lo=0), default=0, dest="count",
                   help="exit after this many messages (default 0: run until interrupted)")
    _add(t, "--max-in-flight", type=_number(int, "--max-in-flight", lo=1, hi=2 ** 31 - 1),
         default=200, help="max in flight (default 200)")
    _add(t, "--print-topic", action="store_true", help="prefix each line with 'topic | '")
    _add(t, "--idle-exit", "--timeout", type=_number(float, "--idle-exit", lo=0, hi=MAX_SECONDS,
                                         unit="seconds"), default=0,
         help="exit after this many seconds without a message (default 0: never); exit "
         f"status 1 if no nsqd was ever connected (a first connection is given at least "
         f"{CONNECT_GRACE:g} s)")
    _add(t, "--quiet", "-q", action="store_true",
         help="no status line on stderr (which channel is read)")

    for sp in (p, t):
        _add_connection_options(sp)
        _add(sp, "--log-level", default="warning",
             choices=["debug", "info", "warning", "error"], help="log level (stderr)")

    _add_admin_parsers(sub)

    s = sub.add_parser("spool", help="manage a publish spool directory",
                       description="Manage a publish spool directory (--spool-dir, "
                       "Producer(spool_dir=...)).")
    ss = s.add_subparsers(dest="spool_command", required=True, metavar="{redrive}")
    r = ss.add_parser("redrive",
                      help="send the messages nsqd refused (DIR/rejected) again",
                      description="Move the messages nsqd refused for good (DIR/rejected) "
                      "back into the spool's queue; the next producer on DIR sends them "
                      "(a running one within its rescan interval). Fix the cause first "
                      "(topic name, nsqd's --max-msg-size, ...), or they are refused again.")
    r.add_argument("directory", metavar="DIR", help="the spool directory")
    _add(r, "--log-level", default="warning",
         choices=["debug", "info", "warning", "error"], help="log level (stderr)")

    i = sub.add_parser("install-nsq", help="provide the nsqd/nsqlookupd binaries",
                       description="Find nsq v1.3.0 on PATH or in the cache, or build it "
                       "once with Go, and print the directory (for NSQ_BIN_DIR).",
                       add_help=False)
    i.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    return parser


ADMIN_ACTIONS = ("create", "delete", "pause", "unpause", "empty")
_ACTION_DONE = {"create": "created", "delete": "deleted", "pause": "paused",
                "unpause": "unpaused", "empty": "emptied"}


def _duration(option: str) -> Any:
    """An argparse ``type`` for a Go duration (``2s``, ``500ms``, ``1m``) or seconds,
    named ``option`` in its errors."""
    def parse(text: str) -> float:
        return _seconds(text, option)
    parse.__name__ = "duration"
    return parse


class _DurationAction(argparse.Action):
    """Stores a duration as :func:`_duration` does, but parsed here, where the option
    string typed is known: an error names ``--status-every`` when that was typed, not
    the option's first name ``--interval``."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        try:
            seconds = _seconds(str(values), option_string or self.option_strings[0])
        except argparse.ArgumentTypeError as exc:
            raise argparse.ArgumentError(self, str(exc)) from None
        setattr(namespace, self.dest, seconds)


def _seconds(text: str, option: str) -> float:
    units = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    number, unit = text, "s"
    for suffix in ("ms", "s", "m", "h"):
        if text.endswith(suffix):
            number, unit = text[:-len(suffix)], suffix
            break
    try:
        seconds = float(number) * units[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{option} {text!r}: give a duration such as 2s, 500ms or 1m") from None
    try:
        return float(validate.number(seconds, option, lo=0.01, hi=MAX_SECONDS,
                                     unit="seconds"))
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_where(p: argparse.ArgumentParser) -> None:
    _add(p, "--nsqd-http-address", action="append", default=[], dest="nsqd_http_addresses",
         metavar="HOST:PORT", help="nsqd HTTP address (repeatable; no default: give the port, "
         "which nsqd opens at 4151 unless its --http-address says otherwise)")
    _add(p, "--lookupd-http-address", action="append", default=[],
         dest="lookupd_http_addresses", metavar="HOST:PORT",
         help="nsqlookupd HTTP address (repeatable; no default: give the port, 4161 unless "
         "its --http-address says otherwise): act on the nsqds it lists")
    _add(p, "--http-client-connect-timeout", type=_duration("--http-client-connect-timeout"),
         default=2.0, metavar="DURATION",
         help="time a TCP (and TLS) connect to nsqd / nsqlookupd may take (default 2s)")
    _add(p, "--http-client-request-timeout", type=_duration("--http-client-request-timeout"),
         default=5.0, metavar="DURATION",
         help="time a whole request may take, however slowly the answer comes (default "
         "5s); stat: the nsqds of one view are asked at once, all within it")
    _add(p, "--http-client-max-answer-bytes",
         type=_number(int, "--http-client-max-answer-bytes", lo=1, hi=1 << 31,
                      unit="bytes"), default=None, metavar="BYTES",
         help="size limit of an answer (default: per kind, 32 MiB for nsqd's /stats, 16 "
         "MiB for lookupd's answers, 1 MiB for the others)")
    _add(p, "--log-level", default="warning",
         choices=["debug", "info", "warning", "error"], help="log level (stderr)")


def _add_admin_parsers(sub: Any) -> None:
    st = sub.add_parser(
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
    _add(st, "--topic", help="only this topic (default: every topic)")
    _add(st, "--channel", help="only this channel of --topic (default: every channel)")
    _add(st, "--interval", "--status-every", action=_DurationAction, default=2.0,
         metavar="DURATION", help="time between views: 2s (default), 500ms, 1m "
         "(--status-every: nsq_stat's old name of it)")
    _add(st, "--count", type=_number(int, "--count", lo=0), default=0,
         help="views to print, then exit (default 0: until interrupted)")
    _add(st, "--json", action="store_true",
         help="one JSON object per view (a line each) instead of the table")
    _add(st, "--clients", action="store_true",
         help="a line per consumer connection under each channel (the table)")
    _add_where(st)
    for kind in ("topic", "channel"):
        what = "a topic" if kind == "topic" else "a topic's channel"
        p = sub.add_parser(
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
            + ("the topic, its channels and their "
                                                    "messages" if kind == "topic" else
                                                    "the channel and its messages, and close "
                                                    "its consumers' connections") + ".",
            epilog="examples:\n"
            + (f"  nsq-spark topic create --topic events --nsqd-http-address 127.0.0.1:4151\n"
               f"  nsq-spark topic pause --topic events --lookupd-http-address 127.0.0.1:4161"
               if kind == "topic" else
               "  nsq-spark channel pause --topic events --channel archive "
               "--nsqd-http-address 127.0.0.1:4151\n"
               "  nsq-spark channel empty --topic events --channel archive "
               "--lookupd-http-address 127.0.0.1:4161"))
        p.add_argument("action", choices=ADMIN_ACTIONS, help="what to do")
        _add(p, "--topic", required=True, help="the topic")
        if kind == "channel":
            _add(p, "--channel", required=True, help="the channel")
        _add_where(p)


def main(argv: Sequence[str] | None = None, *, stdin: IO[bytes] | None = None,
         stdout: IO[bytes] | None = None, stderr: IO[str] | None = None,
         prog: str = "nsq-spark") -> int:
    """The ``nsq-spark`` command (console script) and ``python -m nsq_spark``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["install-nsq"]:
        # its own parser: it needs only the standard library (runs before deps exist)
        from nsq_spark.testing import install
        return install.main(argv[1:], stderr=stderr)
    parser = build_parser(prog)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    stderr = stderr or sys.stderr
    logging.basicConfig(level=args.log_level.upper(), stream=stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        if args.command == "publish":
            return _publish(args, stdin or sys.stdin.buffer, stderr)
        if args.command == "spool":
            return _spool_redrive(args.directory, stderr)
        if args.command == "stat":
            return _stat(args, stdout or sys.stdout.buffer, stderr)
        if args.command in ("topic", "channel"):
            return _admin_action(args, stdout or sys.stdout.buffer, stderr)
        return _tail(args, stdout or sys.stdout.buffer, stderr)
    except KeyboardInterrupt:
        stderr.write("\ninterrupted\n")
        return EXIT_INTERRUPTED
    except (ValueError, OSError, RuntimeError) as exc:   # NSQError derives from these
        stderr.write(f"nsq-spark {args.command}: error: {exc}\n")
        return EXIT_ERROR
    except Exception as exc:
        from nsq_spark.errors import NSQError
        if isinstance(exc, NSQError):
            stderr.write(f"nsq-spark {args.command}: error: {exc}\n")
            return EXIT_ERROR
        raise


# ---------------------------------------------------------------------------------------
# publish


class Progress:
    """A one-line progress display on stderr: a bar when the total size is known.
    Redraws at most 5 times a second on a terminal, once a second otherwise (logs)."""

    def __init__(self, stream: IO[str], total_bytes: int | None, quiet: bool) -> None:
        self.stream = stream
        self.total = total_bytes
        self.quiet = quiet
        self.tty = bool(getattr(stream, "isatty", lambda: False)())
        self.start = time.monotonic()
        self._last = 0.0
        self.messages = 0
        self.bytes = 0

    def update(self, messages: int, nbytes: int) -> None:
        self.messages += messages
        self.bytes += nbytes
        now = time.monotonic()
        if not self.quiet and now - self._last >= (0.2 if self.tty else 1.0):
            self._last = now
            self._draw(now, final=False)

    def _draw(self, now: float, final: bool) -> None:
        elapsed = max(now - self.start, 1e-9)
        rate = self.messages / elapsed
        text = f"{self.messages:,} msgs  {self.bytes / 1e6:,.1f} MB  {rate:,.0f} msg/s"
        if self.total:
            frac = min(1.0, self.bytes / self.total)
            width = 30
            fill = int(frac * width)
            text = f"[{'#' * fill}{'.' * (width - fill)}] {frac * 100:5.1f}%  " + text
        if self.tty:
            self.stream.write("\r" + text + ("\n" if final else ""))
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def done(self) -> None:
        if not self.quiet:
            self._draw(time.monotonic(), final=True)


def _inputs(files: list[str], stdin: IO[bytes]) -> tuple[list[tuple[str, Any]], int | None]:
    """Open the inputs up front (a missing file fails before anything is sent) and sum
    their sizes when they are all regular files."""
    names = files or ["-"]
    opened: list[tuple[str, Any]] = []
    total: int | None = 0
    for name in names:
        if name == "-":
            f: Any = stdin
        else:
            try:
                f = open(name, "rb")
            except OSError as exc:
                for n, g in opened:
                    if g is not stdin:
                        g.close()
                raise OSError(exc.errno, f"cannot read input file {name}: {exc.strerror}") \
                    from exc
        opened.append((name, f))
        try:
            st = os.fstat(f.fileno())
            if total is not None and stat.S_ISREG(st.st_mode):
                total += st.st_size - (f.tell() if f.seekable() else 0)
            else:
                total = None
        except (OSError, AttributeError, ValueError):
            total = None
    return opened, total


def _records(f: IO[bytes], delimiter: bytes) -> Iterator[bytes]:
    if delimiter == b"\n":
        yield from f
        return
    tail = b""
    while True:
        chunk = f.read(1 << 20)
        if not chunk:
            break
        parts = (tail + chunk).split(delimiter)
        tail = parts.pop()
        for part in parts:
            yield part + delimiter
    if tail:
        yield tail


def _batches(opened: list[tuple[str, Any]], delimiter: bytes, size: int, skip_empty: bool
             ) -> Iterator[tuple[list[bytes], int]]:
    """Batches of bodies, with the input bytes they came from (for the progress bar).

    As to_nsq: a body is the bytes between two delimiters, unchanged (a ``\\r`` before
    ``\\n`` stays in the body, as to_nsq keeps it); an empty one is no message (nsqd
    refuses empty bodies) and is skipped, whatever ``skip_empty`` says (the old
    ``--skip-empty`` flag); one WARNING at the end says how many were, and the first
    where."""
    batch: list[bytes] = []
    raw = 0
    empty = 0
    first_empty = ""
    for name, f in opened:
        for lineno, line in enumerate(_records(f, delimiter), 1):
            raw += len(line)
            body = line[:-1] if line.endswith(delimiter) else line
            if not body:
                empty += 1
                first_empty = first_empty or f"{name}:{lineno}"
                continue
            batch.append(body)
            if len(batch) >= size:
                yield batch, raw
                batch, raw = [], 0
    if batch or raw:
        yield batch, raw
    if empty:
        log.warning("skipped %d empty message%s (first at %s): nsqd refuses empty bodies, "
                    "and to_nsq skips them too", empty, "" if empty == 1 else "s",
                    "stdin" + first_empty[1:] if first_empty.startswith("-:") else
                    first_empty)


def _publish(args: argparse.Namespace, stdin: IO[bytes], stderr: IO[str]) -> int:
    from nsq_spark.protocol import check_topic

    check_topic(args.topic)
    connection_options = _connection_options(args)
    if not args.spool_dir and args.message_id_digest:
        raise ValueError("--message-id-digest needs --spool-dir (the digest is added "
                         "by the spooling publisher)")
    opened, total = _inputs(args.files, stdin)
    progress = Progress(stderr, total, args.quiet)
    from nsq_spark.publish.producer import Producer

    connection_options.update(_replication(args))
    if args.spool_dir:
        producer = Producer(
            args.nsqd_tcp_addresses, spool_dir=args.spool_dir, spool_fsync=args.spool_fsync,
            spool_max_bytes=args.spool_max_bytes, message_id_digest=args.message_id_digest,
            batch_size=args.batch_size, retry_deadline=args.retry_deadline,
            **connection_options)
    else:
        producer = Producer(args.nsqd_tcp_addresses, retry_deadline=args.retry_deadline,
                            **connection_options)
    batch_size = args.batch_size
    per_msg = 0.0
    if args.rate > 0:
        # bursts of at most a tenth of a second's worth of messages
        per_msg = 1.0 / args.rate
        batch_size = max(1, min(batch_size, int(args.rate // 10)))
    rc = EXIT_OK
    try:
        next_at = time.monotonic()
        for bodies, raw in _batches(opened, args.delimiter, batch_size, args.skip_empty):
            if per_msg:
                delay = next_at - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                next_at = max(next_at, time.monotonic()) + per_msg * len(bodies)
            if bodies:
                producer.mpublish(args.topic, bodies)
            progress.update(len(bodies), raw)
        progress.done()
        if args.spool_dir:
            flushed = producer.flush(args.flush_timeout)
            stderr.write(_spool_summary(args, progress.messages, producer.stats(), flushed))
            if not flushed:
                rc = EXIT_SPOOLED
        elif not args.quiet:
            stderr.write(f"published {progress.messages:,} messages to {args.topic}\n")
    finally:
        for _, f in opened:
            if f is not stdin:
                f.close()
        if args.spool_dir:
            producer.close(timeout=0)
        else:
            producer.close()
    return rc


def _replication(args: argparse.Namespace) -> dict[str, Any]:
    """The Producer's replication options for ``publish``: as NSQ's ``to_nsq``, every line
    to every address given (a repeated address counts once); ``--replicas N`` to N of them
    (1: one, as before, round robin with failover); ``--write-quorum``; ``--publish-ids``.
    The Producer checks the numbers against the addresses."""
    from nsq_spark.addresses import parse_address_list

    # named as the Producer names them, which refuses a bad one the same way
    distinct = len({str(a) for a in parse_address_list(args.nsqd_tcp_addresses,
                                                        "nsqd_tcp_addresses")})
    replicas = distinct if args.replicas is None else args.replicas
    if replicas > distinct:
        raise ValueError(f"--replicas {replicas}: only {distinct} distinct "
                         "--nsqd-tcp-address given; give more addresses or fewer replicas")
    if replicas == 1:
        if args.write_quorum not in (None, 1):
            raise ValueError(f"--write-quorum {args.write_quorum} needs --replicas of at "
                             "least that many (and as many addresses)")
        return {"publish_ids": True} if args.publish_ids else {}
    return {"replicas": replicas, "write_quorum": args.write_quorum,
            "publish_ids": bool(args.publish_ids)}


def _spool_redrive(directory: str, stderr: IO[str]) -> int:
    from nsq_spark.spool.store import redrive

    if not os.path.isdir(directory):
        raise ValueError(f"{directory} is not a directory: give the spool directory "
                         "(the --spool-dir / spool_dir of the producer)")
    done = redrive(directory)
    text = (f"moved {done.messages:,} message{'s' if done.messages != 1 else ''} in "
            f"{done.files} file{'s' if done.files != 1 else ''} from {directory}/rejected "
            "back into the spool; the next producer on it sends them")
    if done.busy:
        text += (f"; {done.busy} file{' is' if done.busy == 1 else 's are'} still being "
                 "written by a running producer (its Producer.redrive() moves it, or run "
                 "this again after it stops)")
    if done.kept_back_bytes:
        # every intact record was moved (those after a damaged one too); the damaged
        # bytes cannot be sent: said, and the exit status says it too
        text += (f"; kept back {done.kept_back_bytes:,} damaged bytes, which cannot be "
                 f"sent ({'; '.join(done.damaged)}); the files as they were are in "
                 f"{directory}/corrupt/ for inspection")
    stderr.write(text + "\n")
    return EXIT_ERROR if done.kept_back_bytes else EXIT_OK


def _spool_summary(args: argparse.Namespace, read: int, stats: dict[str, Any],
                   flushed: bool) -> str:
    """What a spooled publish really did: messages read and spooled, messages nsqd
    acknowledged (which may include leftovers of earlier runs), what stays behind. Written
    even with --quiet when something stays behind."""
    acked, rejected = stats.get("acked", 0), stats.get("rejected", 0)
    text = (f"spooled {read:,} messages for {args.topic} in {args.spool_dir}; nsqd "
            f"acknowledged {acked:,}")
    if stats.get("orphans_claimed"):
        text += " (leftovers of earlier runs included)"
    if rejected:
        text += (f"; nsqd refused {rejected:,} for good (moved to the spool's rejected/; "
                 f"nsq-spark spool redrive {args.spool_dir} sends them again)")
    if flushed:
        return "" if args.quiet else text + "; nothing left in the spool\n"
    last_error = stats.get("last_error")
    return (text + f"; {stats.get('pending_bytes', 0):,} bytes were NOT acknowledged "
            f"within --flush-timeout={args.flush_timeout:g}s"
            + (f" (last error: {last_error})" if last_error else "")
            + "; they stay in the spool and are sent by the next run on it\n")


# ---------------------------------------------------------------------------------------
# tail


def _tail(args: argparse.Namespace, stdout: IO[bytes], stderr: IO[str]) -> int:
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
    from nsq_spark.consumer.reader import Reader

    connection_options = _connection_options(args)
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
                    return EXIT_OK
                reader.finish(batch)
                written += len(batch)
                if args.count and written >= args.count:
                    return EXIT_OK
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
            return EXIT_ERROR
        return EXIT_OK
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


# ---------------------------------------------------------------------------------------
# stat, topic, channel


def _node_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is what a node's request can end in (an admin error, no answer,
    a bad name), as opposed to a bug that must not be shown as "did not answer"."""
    from nsq_spark.errors import NSQError

    return isinstance(exc, (NSQError, OSError, ValueError))


def _client_options(args: argparse.Namespace, transport: Any) -> dict[str, Any]:
    """The admin clients' options from the command line (timeout, size limit, the shared
    transport)."""
    return {"timeout": args.http_client_request_timeout, "transport": transport,
            "max_answer_bytes": args.http_client_max_answer_bytes}


def _nsqd_targets(args: argparse.Namespace, transport: Any, for_create: bool = False,
                  last: dict[str, list[str]] | None = None
                  ) -> tuple[list[str], dict[str, str]]:
    """The nsqd HTTP addresses to act on, and the lookupds that did not answer (address
    without user info: what the attempt said). Given with --nsqd-http-address, or what
    the lookupds list (asked concurrently): the topic's producers (``lookup(topic)``, as
    nsqadmin does), or every registered nsqd (``for_create`` of a topic, or no topic).
    ``last`` (``stat``): each lookupd's list of the previous round, updated here; a
    lookupd that does not answer keeps its list. Raises when no lookupd answered (and
    none answered before), or when none lists an nsqd."""
    from nsq_spark.addresses import parse_http_address_list, strip_userinfo
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
        client = LookupdClient(address, **_client_options(args, transport))
        if args.topic and not for_create:
            producers = list(client.lookup(args.topic).producers)
        else:
            producers = client.nodes()
        return [p.http_address for p in producers if p.http_address]

    for address, answer in concurrently(ask, lookupds).items():
        if isinstance(answer, BaseException):
            if not _node_failure(answer):
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


def _admin_usage(args: argparse.Namespace) -> str | None:
    """What is wrong with the arguments of stat/topic/channel before any request (exit
    status 2), or None: names, addresses, where to act."""
    from nsq_spark.addresses import parse_http_address_list
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


def _admin_action(args: argparse.Namespace, stdout: IO[bytes], stderr: IO[str]) -> int:
    from nsq_spark.addresses import strip_userinfo
    from nsq_spark.admin import NsqdClient
    from nsq_spark.admin.cluster import concurrently
    from nsq_spark.admin.transport import HttpTransport

    problem = _admin_usage(args)
    if problem:
        stderr.write(f"nsq-spark {args.command}: error: {problem}\n")
        return EXIT_USAGE
    channel: str | None = getattr(args, "channel", None)
    transport = HttpTransport(connect_timeout=args.http_client_connect_timeout)
    try:
        if args.action == "delete":
            return _delete(args, channel, transport, stdout, stderr)
        # a channel goes where its topic is (nsqd refuses one for a topic it lacks)
        targets, unanswered = _nsqd_targets(
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
            nsqd = NsqdClient(address, **_client_options(args, transport))
            if channel is None:
                getattr(nsqd, f"{args.action}_topic")(args.topic)
            else:
                getattr(nsqd, f"{args.action}_channel")(args.topic, channel)

        for address, outcome in concurrently(act, targets).items():
            if isinstance(outcome, BaseException):
                if not _node_failure(outcome):
                    raise outcome
                failed += 1
                stderr.write(f"nsq-spark {args.command} {args.action}: error: {outcome}\n")
                continue
            stdout.write(f"{_ACTION_DONE[args.action]} {what} on nsqd "
                         f"{strip_userinfo(address)}\n".encode())
        stdout.flush()
        return EXIT_ERROR if failed else EXIT_OK
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
    return EXIT_OK if result.ok else EXIT_ERROR


def _stat(args: argparse.Namespace, stdout: IO[bytes], stderr: IO[str]) -> int:
    from nsq_spark.addresses import strip_userinfo
    from nsq_spark.admin import HTTPDeadlineError, NsqdClient
    from nsq_spark.admin.cluster import Deadline, concurrently
    from nsq_spark.admin.stat import StatView, format_text
    from nsq_spark.admin.transport import HttpTransport

    problem = _admin_usage(args)
    if problem:
        stderr.write(f"nsq-spark stat: error: {problem}\n")
        return EXIT_USAGE
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
                targets, unanswered = _nsqd_targets(args, transport, last=lists)
            except _NoNsqdListed as exc:
                if shown == 0:
                    raise
                # e.g. its one nsqd restarted and lookupd dropped it: say so, go on
                targets, unanswered, notes = [], exc.unanswered, (exc.later,)
            # nsq_stat's clusterinfo asks the nsqds at once: all of them within one
            # request timeout, so twelve that never answer cost one timeout, not twelve
            deadline = Deadline(args.http_client_request_timeout)

            def ask(address: str) -> Any:
                options = {**_client_options(args, transport), "timeout": deadline.left()}
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
                    if not _node_failure(answer):
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
                return EXIT_OK
            time.sleep(max(0.0, args.interval - (time.monotonic() - started)))
    finally:
        transport.close()
