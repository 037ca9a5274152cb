"""``nsq-spark publish``: to_nsq with a progress bar and an optional durable spool.

It reads files (or stdin), one message per line, and publishes them in MPUB batches::

    nsq-spark publish --topic events --nsqd-tcp-address 127.0.0.1:4150 a.jsonl b.jsonl
    producer | nsq-spark publish --topic events --nsqd-tcp-address 127.0.0.1:4150 \\
        --spool-dir /var/spool/events

With ``--spool-dir`` every line is in the spool before it is sent, and what nsqd has not
acknowledged when the command ends (nsqd down, ``--flush-timeout`` passed, the process
killed) is sent by the next run on the same directory. The summary line says how many
messages were spooled and how many nsqd acknowledged, never more than it knows.

The flags that are Producer options (``--batch-size``, ``--replicas``, ``--write-quorum``,
``--retry-deadline``, ``--spool-fsync``, ``--spool-max-bytes``) are read and bounded by
the Producer's rows (:data:`nsq_spark.config.PRODUCER`); the command's own numbers by the
rows below.
"""

from __future__ import annotations

import argparse
import logging
import os
import stat
import time
from typing import IO, Any, Iterator

from nsq_spark._options import Option
from nsq_spark.config import PRODUCER
from nsq_spark._validate import SECONDS_OR_ZERO, Limit

from . import _common
from ._common import add, add_option

log = logging.getLogger("nsq_spark.cli")

RATE = Option("rate", "number", 0, limit=Limit("messages per second", 0),
              doc="at most this many messages per second (default: no limit)")
FLUSH_TIMEOUT = Option(
    "flush_timeout", "seconds", 30.0, limit=SECONDS_OR_ZERO,
    doc="with --spool-dir: seconds to wait at the end for nsqd to acknowledge everything "
    "(default 30; what is left is sent by the next run)")


def _delimiter(value: str) -> bytes:
    raw = value.encode("utf-8").decode("unicode_escape").encode("latin-1")
    if len(raw) != 1:
        raise argparse.ArgumentTypeError(f"--delimiter must be one byte (got {value!r})")
    return raw


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "publish", help="publish lines of files or stdin to a topic",
        description="Publish one message per line (like to_nsq), with a progress bar on "
        "stderr and an optional durable spool.")
    add(p, "--topic", required=True, help="topic to publish to")
    add(p, "--nsqd-tcp-address", action="append", required=True, dest="nsqd_tcp_addresses",
        metavar="HOST:PORT", help="nsqd TCP address (repeatable: every line goes to every "
        "address, as to_nsq does; see --replicas)")
    add_option(p, PRODUCER["replicas"], "--replicas",
               help="with several addresses: send each line to this many of them (default: "
               "all; 1: one per line, round robin with failover)")
    add_option(p, PRODUCER["write_quorum"], "--write-quorum",
               help="with several addresses: how many must acknowledge each batch (default: "
               "a majority of the replicas)")
    add(p, "--publish-ids", action="store_true",
        help="stamp each line with a publish id (the nsq_spark envelope), so that consumers "
        "deduplicate the copies with dedup_key='publish_id' (default: the lines as they "
        "are)")
    p.add_argument("files", nargs="*", metavar="FILE",
                   help="files to read (default, or '-': stdin)")
    add(p, "--delimiter", type=_delimiter, default=b"\n",
        help="message separator, one byte (default: newline; escapes like \\t work)")
    add_option(p, PRODUCER["batch_size"], "--batch-size",
               help="messages per MPUB (default %(default)s)")
    add_option(p, RATE)
    add_option(p, PRODUCER["retry_deadline"], "--retry-deadline",
               help="seconds to keep retrying an unreachable nsqd before failing (default "
               "%(default)g: rides out an nsqd restart)")
    add(p, "--spool-dir", help="durable spool directory: messages are written there before "
        "they are sent, and kept until nsqd acknowledges them")
    add_option(p, PRODUCER["spool_fsync"], "--spool-fsync",
               help="'always' (sync every batch, default), 'never', or an interval in ms")
    add_option(p, PRODUCER["spool_max_bytes"], "--spool-max-bytes",
               help="size bound of the spool directory (default 1 GiB); publishing waits "
               "when full")
    add_option(p, FLUSH_TIMEOUT)
    add(p, "--message-id-digest", action="store_true",
        help="wrap each body in the message-id envelope (see nsq_spark.spool)")
    add(p, "--skip-empty", action="store_true",
        help="skip empty lines: the default now, as to_nsq (nsqd refuses empty bodies; a "
        "WARNING at the end counts them); kept for old command lines")
    add(p, "--quiet", "-q", action="store_true", help="no progress output")
    _common.add_connection_options(p)
    _common.add_log_level(p)
    return p


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


def run(args: argparse.Namespace, stdin: IO[bytes], stderr: IO[str]) -> int:
    """``nsq-spark publish``."""
    from nsq_spark.protocol import check_topic

    check_topic(args.topic)
    connection_options = _common.connection_options(args)
    if not args.spool_dir and args.message_id_digest:
        raise ValueError("--message-id-digest needs --spool-dir (the digest is added "
                         "by the spooling publisher)")
    opened, total = _inputs(args.files, stdin)
    progress = Progress(stderr, total, args.quiet)
    from nsq_spark._publish.producer import Producer

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
    rc = _common.EXIT_OK
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
                rc = _common.EXIT_SPOOLED
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
    from nsq_spark._addresses import parse_address_list

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
