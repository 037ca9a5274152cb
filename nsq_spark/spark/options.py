"""Options of the ``nsq`` Spark data source: parsing and validation.

Spark hands data source options over case-insensitively (a plain dict whose keys may
arrive lower-cased), so every lookup here ignores case. Options use camelCase like
Spark's Kafka source. Every problem is reported at query start, in one error that names
the option and says how to fix it: an unknown option names the closest known one
(``difflib``), an option that only works with another one (``NEEDS``) says which.
Addresses follow the one address rule (:mod:`nsq_spark.addresses`); numbers the one
number rule (:mod:`nsq_spark.validate`: integers where an integer is meant, finite, in
range, the option named in the error). The ``repr`` of the parsed options never shows
the AUTH secret, nor a password or secret key inside a URI (``dedup``, ``spoolPath``).

Reading (``spark.readStream.format("nsq")`` and ``spark.read.format("nsq")``):

=========================  =================================================================
``topic``                  the NSQ topic to consume; or
``topics``                 a comma-separated list of topics (Kafka: ``subscribe``); or
``topicPattern``           a regular expression (Python ``re``, matched against the whole
                           name) over the topics lookupd lists (``/topics``; with
                           ``nsqdHttpAddresses``: the nsqds' ``/stats``), listed again at
                           each trigger (Kafka: ``subscribePattern``). Exactly one of the
                           three. Rows tell topics apart by their ``topic`` column.
``channel``                required: the NSQ channel (one channel per query; two queries on
                           the same channel share its messages). A durable channel: a
                           ``#ephemeral`` one is refused (:func:`check_durable_channel`).
``nsqdTcpAddresses``       comma-separated ``host:port`` of nsqd TCP listeners; or
``lookupdHttpAddresses``   comma-separated ``host:port`` of nsqlookupd HTTP listeners.
                           Exactly one of the two.
``nsqdHttpAddresses``      optional, with ``nsqdTcpAddresses``: the same nsqds' HTTP
                           listeners, used by the driver to create the channel at query
                           start and to read its depth from ``/stats`` so that no
                           micro-batch starts when nothing is queued.
                           With lookupd the HTTP ports come from lookupd. Without either,
                           every trigger starts a batch that ends after ``idleTimeout``.
``maxInFlight``            messages in flight per fetch task (default 2500, nsqd's default
                           ``--max-rdy-count``; nsqd caps each connection's RDY at its
                           ``--max-rdy-count``). For throughput on a large backlog, start
                           nsqd with ``--max-rdy-count=20000`` and set ``maxInFlight`` to
                           10000-20000: a fetch task then spools and FINishes in chunks of
                           half that (fewer fsyncs, fewer and larger Arrow batches). The
                           cost: up to that many messages per task are redelivered after a
                           crash, and kept in the task's memory. At most 1,000,000.
``numPartitions``          fetch tasks per micro-batch (default 2, at most 10,000). With
                           several topics they are split over the topics that have a
                           backlog, in proportion to it, and each such topic gets at least
                           one (:mod:`.admission`).
``maxMessagesPerTrigger``  cap on messages per micro-batch (Spark read limit
                           ``ReadMaxRows``); under ``Trigger.AvailableNow`` the backlog is
                           then drained in several batches.
``minMessagesPerTrigger``  no micro-batch while the fetchable backlog (all topics) is below
                           this (Kafka: ``minOffsetsPerTrigger``; Spark's ``ReadMinRows``),
                           unless ``maxTriggerDelay`` has passed since the last batch.
                           Needs a measurable backlog (lookupd or ``nsqdHttpAddresses``);
                           ignored under ``Trigger.AvailableNow``.
``maxTriggerDelay``        how long a batch may be held back by ``minMessagesPerTrigger``
                           (default 900 s, Kafka's 15 minutes), counted by the source from
                           its last batch (or from its start): seconds, or Kafka's
                           duration strings (``"5s"``, ``"1m"``, ``"500ms"``, ``"15m"``).
``maxBytesPerTrigger``     cap on message body bytes per micro-batch (Spark's
                           ``ReadMaxBytes``), split over the batch's fetch tasks, each of
                           which stops at its share (nsqd's ``/stats`` counts messages,
                           not bytes, so the fetch task enforces it: it takes no message
                           past the one whose body reaches its share, and nsqd's RDY
                           follows the bytes left; a task takes at least one message, so
                           a batch may exceed the cap by one message per task).
``backlogPollInterval``    seconds between two measurements of the backlog (nsqd
                           ``/stats``) while the query is idle (default 0.1; 0: at every
                           trigger). Spark asks every ~10 ms with the default trigger; a
                           batch that ends is measured at once (no Kafka counterpart).
``maxFetchPeriod``         seconds a fetch task may spend fetching (default 10).
``idleTimeout``            seconds without a message after which a fetch task stops
                           (default 1; for the first message of a batch that nsqd
                           reported, at least 5 s, to allow for discovery and connect).
``spoolPath``              required for streaming: a pyarrow filesystem URI or local path,
                           durable and reachable from the driver and every executor.
``spoolChunkSize``         messages per spool chunk file (default ``maxInFlight // 2``, so
                           that one half of the in-flight window arrives while the other is
                           written and FINished).
``maxAttempts``            a message delivered more often than this goes to the dead-letter
                           directory instead of the result (default 0: never). It is written
                           there durably before its FIN, counted and logged (WARNING).
                           At most 65535 (nsqd counts attempts in 16 bits).
``deadLetterPath``         where messages over ``maxAttempts`` go: a directory or pyarrow
                           filesystem URI (default ``<spoolPath>/_dead_letter``), one Arrow
                           IPC file per chunk, with the source's schema. Kept until you
                           delete it.
``maxMessages``            batch read only: stop after this many messages in total
                           (default 100000).
``dedup``                  optional: a deduplicator spec for ``nsq_spark.dedup.from_spec``
                           (e.g. ``redis://host:6379/0?ttl=86400``): rows whose ``id`` was
                           seen before are dropped at fetch time. A store that does not
                           answer fails the task with a ``DedupStoreError`` naming it.
``redeliveryWindow``       streaming: seconds the ids of spooled messages are remembered
                           (default 300; 0 turns it off). A message nsqd delivers again
                           under the id of one the source has already spooled (a FIN lost
                           to a crash, an nsqd restart rewinding its disk queue) within
                           this window is FINished and counted, not made a second row.
                           Kept under ``<spoolPath>/<query>/_seen``, 8 bytes per id.
``redeliveryWindowMaxIds`` cap on the ids remembered (default 5000000, 40 MB in each fetch
                           task's memory, and 16 bytes more per id for the rows that
                           carry a publish id): beyond it the oldest batches are
                           forgotten first.
``dropCopies``             streaming: rows that are copies of one publish -- the same
                           ``publish_id``, from a Producer with ``replicas`` or
                           ``publish_ids`` -- become one row, whichever nsqds, fetch tasks
                           and micro-batches they arrive in (default true; across
                           batches within ``redeliveryWindow``). The copies are FINished,
                           counted and logged, not rows (:mod:`.copies`). Rows without a
                           publish id are never copies: a topic without publish envelopes
                           pays one byte check per row. false: every copy is a row.
``logLevel``               the connector's log level in Spark's Python workers (executors'
                           stderr, and the driver's in local mode): ``DEBUG``, ``INFO``,
                           ``WARN`` (default) or ``ERROR``; also for writing. Without it, the
                           workers' ``NSQ_SPARK_LOG_LEVEL`` environment variable. INFO shows
                           each fetch task's rows and timings, redeliveries dropped (with
                           the first ids) and the backlog per trigger (:mod:`.logs`).
``readerCache``            streaming: keep each fetch task's connected Reader in the
                           executor's Python worker for the query's next task there,
                           whichever partition it fetches (default true; Kafka:
                           ``spark.kafka.consumer.cache.*``). Saves the connect, IDENTIFY,
                           SUB and close of every micro-batch (:mod:`.reader_cache`).
                           false: each task connects and closes.
``readerCacheIdleTimeout`` seconds a cached Reader may stay unused before it is closed
                           (default 5; Kafka: ``spark.kafka.consumer.cache.timeout``). A
                           paused Reader may hold messages nsqd sent before it saw RDY 0,
                           so this must stay well below the connection's msg_timeout:
                           at most half of ``msgTimeout`` (or ``nsq.msg_timeout``; without
                           them nsqd's ``--msg-timeout``, 60 s by default, so at most 30),
                           and at most 300; the default is lowered to that half. Each
                           cached Reader is also closed after at most half the msg_timeout
                           its nsqds actually negotiated (an nsqd started with
                           ``--msg-timeout=4s``: 2 s).
=========================  =================================================================

Connection options (both directions): ``tlsV1`` (bool), ``tlsCaFile``, ``tlsCertFile``,
``tlsKeyFile`` (the three files are checked at query start: readable on the driver, at
the path the executors use too), ``tlsInsecure`` (bool: skip certificate verification),
``authSecret``,
``snappy`` (bool), ``deflate`` (bool), ``deflateLevel`` (1-9), ``msgTimeout`` (ms),
``heartbeatInterval`` (ms), ``userAgent``; any other ``ConnectionConfig`` keyword can be
given as ``nsq.<snake_case_name>`` (e.g. ``nsq.output_buffer_timeout``), in
``ConnectionConfig``'s (pynsq's) units: ``nsq.heartbeat_interval`` and ``nsq.msg_timeout``
in seconds, ``nsq.output_buffer_timeout`` in ms. Reading asks nsqd for a 64 KiB output
buffer flushed after at most 25 ms (``nsq.output_buffer_size=65536``,
``nsq.output_buffer_timeout=25``: the largest buffer and the shortest timeout nsqd's
defaults allow, ``--max-output-buffer-size`` and ``--min-output-buffer-timeout``); set
them within your nsqd's limits if it allows less.

Writing (``df.write.format("nsq")`` / ``df.writeStream.format("nsq")``): ``topic``
(default topic for rows without a ``topic`` column value), ``nsqdTcpAddresses`` or
``lookupdHttpAddresses``, ``batchSize`` (messages per MPUB, default 1000),
``maxBatchBytes`` (bytes per MPUB, default 4 MiB, under nsqd's 5 MiB ``--max-body-size``),
``retries`` (attempts per MPUB, default 5), ``publishTimeout`` (seconds to wait for
nsqd's acknowledgements of one Arrow batch, default 60), ``logLevel``, plus the connection
options. Publish identifiers (:mod:`.sink` says how they are derived): ``publishIds``
(stamp each message with a publish id a re-run reproduces; default: on exactly when
``replicas`` or ``idempotencyKeyColumn`` is given, as the Producer's ``publish_ids``),
``idempotencyKeyColumn`` (a column whose value is each row's idempotency key),
``replicas`` (each message on this many nsqds, as ``Producer(replicas=N)``) and
``writeQuorum`` (acknowledgements a publish needs, default a majority of ``replicas``).

Durations (every option in seconds): a number of seconds, or a number with a unit as
Spark's Kafka source takes them (``"500ms"``, ``"5s"``, ``"1m"``, ``"2 minutes"``,
``"1h"``, ``"1d"``; :func:`parse_duration`).
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Mapping, NamedTuple

from nsq_spark import validate
from nsq_spark.errors import ConfigError
from nsq_spark.validate import (MAX_SECONDS, SECONDS_OR_ZERO, SECONDS_POSITIVE, Limit,
                                redact_options)

from .seen import DEFAULT_MAX_IDS, DEFAULT_WINDOW

__all__ = ["NSQOptionError", "ReadOptions", "WriteOptions", "parse_read_options",
           "parse_write_options"]


class NSQOptionError(ConfigError):
    """An option of the ``nsq`` data source is missing or wrong; the message names it.
    (A :class:`~nsq_spark.errors.ConfigError`, hence also a ``ValueError``.)"""


def _redacted_repr(self: Any) -> str:
    """The options without secrets: the AUTH secret (``authSecret``, ``nsq.*secret*``),
    passwords and secret keys inside URIs (``dedup``, ``spoolPath``, ...)."""
    shown = redact_options({f.name: getattr(self, f.name) for f in fields(self)})
    return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in shown.items())})"


# Seconds between two measurements of the backlog while the source is idle (the last call
# planned nothing and no batch ended since): ``backlogPollInterval``'s default. With the
# default trigger Spark asks every ~10 ms while idle; a measurement is a lookupd /lookup
# plus a /stats per nsqd (and a /topics for a pattern). Measured with
# bench/bench_backlog_poll.py (one nsqd, one lookupd, this 2-core machine): at every call,
# 82 measurements/s (164 HTTP requests/s) and 12% of a core in the driver's Python worker;
# at 0.1 s, 9/s and 2%, and new data after a quiet spell is planned 43 ms later at the
# median, 94 ms at p95 (0 s: 2 / 3 ms; 0.05 s: 33 / 43 ms; 0.25 s: 129 / 246 ms). A batch
# that ends is measured at once, so a steady stream (2,000 msg/s) waits for no poll.
DEFAULT_POLL_INTERVAL = 0.1
# MPUB counts and sizes are 32-bit; nsqd counts attempts in 16 bits.
MAX_INT32, MAX_ATTEMPTS = 2 ** 31 - 1, 65535
# A fetch task keeps up to maxInFlight messages in memory; numPartitions tasks a batch.
MAX_IN_FLIGHT, MAX_PARTITIONS = 1_000_000, 10_000
# The defaults the parsers apply (the docs print them from here too).
DEFAULT_MAX_IN_FLIGHT, DEFAULT_PARTITIONS, DEFAULT_MAX_MESSAGES = 2500, 2, 100_000
DEFAULT_MAX_TRIGGER_DELAY, DEFAULT_MAX_FETCH_PERIOD, DEFAULT_IDLE_TIMEOUT = 900.0, 10.0, 1.0
DEFAULT_BATCH_SIZE, DEFAULT_MAX_BATCH_BYTES, DEFAULT_RETRIES = 1000, 4 << 20, 5
DEFAULT_PUBLISH_TIMEOUT = 60.0
# Options of each direction, as documented above. ``nsq.<name>`` passes any
# ConnectionConfig keyword through.
CONNECTION_OPTIONS = ("tlsV1", "tlsCaFile", "tlsCertFile", "tlsKeyFile", "tlsInsecure",
                      "authSecret", "snappy", "deflate", "deflateLevel", "msgTimeout",
                      "heartbeatInterval", "userAgent")
READ_OPTIONS = ("topic", "topics", "topicPattern", "channel", "nsqdTcpAddresses", "lookupdHttpAddresses",
                "nsqdHttpAddresses", "maxInFlight", "numPartitions", "maxMessagesPerTrigger",
                "minMessagesPerTrigger", "maxTriggerDelay", "maxBytesPerTrigger",
                "backlogPollInterval",
                "maxFetchPeriod", "idleTimeout", "spoolPath", "spoolChunkSize", "maxAttempts",
                "deadLetterPath", "maxMessages", "dedup", "redeliveryWindow",
                "redeliveryWindowMaxIds", "logLevel", "dropCopies") + CONNECTION_OPTIONS
WRITE_OPTIONS = ("topic", "nsqdTcpAddresses", "lookupdHttpAddresses", "batchSize",
                 "maxBatchBytes", "retries", "publishTimeout", "logLevel", "publishIds",
                 "idempotencyKeyColumn", "replicas", "writeQuorum") + CONNECTION_OPTIONS
# Keys Spark itself puts into the option map: ``path`` (from ``.load(path)`` /
# ``.save(path)``, refused with its own message when reading) and ``checkpointLocation``
# (a writeStream's ``.option("checkpointLocation", ...)`` reaches the sink's options too).
SPARK_OPTIONS = ("path", "checkpointLocation")
# An option that means something only together with another one.
NEEDS = {"tlsInsecure": "tlsV1", "tlsCaFile": "tlsV1", "tlsCertFile": "tlsV1",
         "tlsKeyFile": "tlsV1", "deflateLevel": "deflate"}


def check_known(options: Mapping[str, Any], known: tuple[str, ...], what: str) -> None:
    """Unknown option -> NSQOptionError naming the closest known one (options arrive
    lower-cased from Spark, so the comparison ignores case)."""
    import difflib

    by_lower = {k.lower(): k for k in known + SPARK_OPTIONS}
    for key in options:
        low = str(key).lower()
        if low in by_lower or (low.startswith("nsq.") and len(low) > 4):
            continue
        close = difflib.get_close_matches(low, list(by_lower), n=1, cutoff=0.6)
        hint = (f"did you mean '{by_lower[close[0]]}'?" if close else
                f"known options: {', '.join(known)}")
        raise NSQOptionError(f"unknown option '{key}' for {what}; {hint} (connection "
                             "settings without an option of their own go as "
                             "nsq.<snake_case_name>)")


def check_needs(opts: "_Opts") -> None:
    """Options that do nothing without another one fail instead of being ignored."""
    for name, needed in NEEDS.items():
        if opts.get(name) is not None and not opts.bool(needed):
            raise NSQOptionError(f"option '{name}' only takes effect with "
                                 f"'{needed}' = true; set .option(\"{needed}\", \"true\") or "
                                 f"remove '{name}'")


class _Opts:
    """Case-insensitive view of Spark's option map."""

    def __init__(self, options: Mapping[str, Any]) -> None:
        self._by_lower = {str(k).lower(): v for k, v in dict(options).items()}

    def get(self, name: str) -> str | None:
        value = self._by_lower.get(name.lower())
        if value is None:
            return None
        value = str(value).strip()
        return value or None

    def prefixed(self, prefix: str) -> dict[str, str]:
        prefix = prefix.lower()
        return {k[len(prefix):]: str(v) for k, v in self._by_lower.items()
                if k.startswith(prefix) and len(k) > len(prefix)}

    def require(self, name: str, why: str) -> str:
        value = self.get(name)
        if value is None:
            raise NSQOptionError(f"option '{name}' is required: {why}; "
                                 f".option(\"{name}\", ...)")
        return value

    def int(self, name: str, default: int | None, minimum: int = 1,
            maximum: int | None = None, **rule: Any) -> int | None:
        """An integer option in ``minimum..maximum`` (``rule``: more of
        :func:`nsq_spark.validate.integer`, e.g. ``special={-1: "off"}``)."""
        raw = self.get(name)
        if raw is None:
            return default
        try:
            value = int(raw)
        except ValueError:
            raise NSQOptionError(f"option '{name}' must be an integer >= {minimum}, "
                                 f"not {raw!r}") from None
        checked: int | None = validate.integer(value, f"option '{name}'", lo=minimum,
                                               hi=maximum, error=NSQOptionError, **rule)
        return checked

    def limited(self, name: str, default: builtins.int | None, limits: Mapping[str, Limit],
                **rule: Any) -> builtins.int | None:
        """An integer option in the range ``limits[name]`` gives (the range the docs
        print)."""
        limit = limits[name]
        return self.int(name, default, minimum=int(limit.lo if limit.lo is not None else 1),
                        maximum=None if limit.hi is None else int(limit.hi), **rule)

    def seconds(self, name: str, default: float,
                limits: Mapping[str, Limit] | None = None, hint: str = "") -> float:
        """A number of seconds in the range ``limits[name]`` gives (without ``limits``:
        > 0, at most a year)."""
        limit = SECONDS_POSITIVE if limits is None else limits[name]
        raw = self.get(name)
        if raw is None:
            return default
        value = parse_duration(raw)
        if value is None:
            raise NSQOptionError(f"option '{name}' must be a number of seconds, "
                                 f"{limit.bounds()}, or a duration with a unit such as "
                                 f"'500ms', '5s', '1m', not {raw!r}") from None
        return validate.seconds(  # type: ignore[no-any-return]
            value, f"option '{name}'", lo=limit.lo or 0, lo_open=limit.lo_open,
            hi=limit.hi if limit.hi is not None else MAX_SECONDS, hint=hint,
            error=NSQOptionError)

    def bool(self, name: str, default: bool = False) -> bool:
        raw = self.get(name)
        if raw is None:
            return default
        low = raw.lower()
        if low in ("true", "1", "yes", "on"):
            return True
        if low in ("false", "0", "no", "off"):
            return False
        raise NSQOptionError(f"option '{name}' must be true or false, not {raw!r}")


# Units of a duration, in seconds: Spark's (JavaUtils.timeStringAs, what the Kafka source
# reads its maxTriggerDelay with: us, ms, s, m, min, h, d) and their words.
_DURATION_UNITS = {
    **dict.fromkeys(("us", "micro", "micros", "microsecond", "microseconds"), 1e-6),
    **dict.fromkeys(("ms", "milli", "millis", "millisecond", "milliseconds"), 1e-3),
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), 1.0),
    **dict.fromkeys(("m", "min", "mins", "minute", "minutes"), 60.0),
    **dict.fromkeys(("h", "hour", "hours"), 3600.0),
    **dict.fromkeys(("d", "day", "days"), 86400.0),
}


def parse_duration(raw: str) -> float | None:
    """Seconds of a duration option: a plain number is seconds (as these options always
    took them; Kafka's plain number is milliseconds), a number with a unit is converted
    (``"500ms"``, ``"5s"``, ``"1m"``, ``"2 minutes"``, ``"1h"``; case-insensitive). None
    when it is neither (the caller names the option). Range checks are the caller's."""
    import re

    m = re.fullmatch(r"\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*([a-zA-Z]*)\s*",
                     raw)
    if m is None:
        try:  # "inf", "nan": refused by the range check with the option's bounds
            return float(raw)
        except ValueError:
            return None
    number, unit = m.groups()
    scale = _DURATION_UNITS.get(unit.lower()) if unit else 1.0
    return None if scale is None else float(number) * scale


def _addresses(opts: _Opts, name: str, http: bool = False) -> list[str]:
    """A comma-separated address list, by the one address rule (:mod:`nsq_spark.addresses`)."""
    from nsq_spark.addresses import parse_address_list, parse_http_address, split_list
    from nsq_spark.errors import InvalidAddressError

    raw = opts.get(name)
    if raw is None:
        return []
    param = f"option '{name}'"
    try:
        if http:  # lookupd: host:port or an http(s):// URL, kept as given
            out = [e.strip() for e in split_list(raw, param) if isinstance(e, str)]
            for entry in out:
                parse_http_address(entry, param, "127.0.0.1:4161")
        else:
            out = [str(a) for a in parse_address_list(raw, param)]
    except InvalidAddressError as exc:
        raise NSQOptionError(str(exc)) from None
    if not out:
        raise NSQOptionError(f"option '{name}' is empty; give comma-separated host:port")
    return out


def _check_name(kind: str, value: str) -> None:
    # nsqd's rule: 1-64 chars of [.a-zA-Z0-9_-], optional "#ephemeral" suffix.
    import re

    if not re.fullmatch(r"[.a-zA-Z0-9_-]+(#ephemeral)?", value) or len(value) > 64:
        raise NSQOptionError(
            f"option '{kind}': {value!r} is not a valid NSQ {kind} name (1-64 characters of "
            f"letters, digits, '.', '_', '-', optionally ending in '#ephemeral')")


EPHEMERAL = "#ephemeral"


def check_durable_channel(channel: str, streaming: bool) -> None:
    """An ``#ephemeral`` channel is refused, for streaming and batch reads alike.

    nsqd deletes an ephemeral channel, with every message on it, when its last client
    disconnects, and keeps at most ``--mem-queue-size`` messages on it (the rest are
    dropped: no disk queue). Streaming: the fetch tasks disconnect between micro-batches,
    so whatever nsqd queued in that gap, and whatever a task requeued on close, is gone
    (testers lost 1,734 of 12,000, and 11,304 of 12,000 when the topic also had a durable
    channel). Batch read: the same loss path -- a task requeues what it holds when it
    stops (idle, ``maxFetchPeriod``, a ``LIMIT``, a failure) and the channel, with those
    messages, is deleted as the last task leaves; and the channel only exists while a task
    is subscribed, so it has no backlog to read. Hence refused for both.
    """
    if channel.endswith(EPHEMERAL):
        durable = channel[:-len(EPHEMERAL)]
        what = "a streaming query" if streaming else "a batch read"
        raise NSQOptionError(
            f"option 'channel': {channel!r} is an ephemeral channel, which {what} cannot "
            "read without losing messages: nsqd deletes an ephemeral channel with its "
            "messages when its last client disconnects (fetch tasks disconnect between "
            "micro-batches and at the end of each task, requeueing what they hold), and "
            "drops what exceeds its memory queue. Use a durable channel, e.g. "
            f".option(\"channel\", {durable!r}), and delete it on nsqd when you no longer "
            "need it")


def _connection_options(opts: _Opts) -> dict[str, Any]:
    """Connection keyword arguments (pynsq names) for Reader / Producer."""
    conn: dict[str, Any] = {}
    if opts.bool("tlsV1"):
        conn["tls_v1"] = True
        tls: dict[str, Any] = {}
        for opt, key in (("tlsCaFile", "ca_certs"), ("tlsCertFile", "certfile"),
                         ("tlsKeyFile", "keyfile")):
            path = opts.get(opt)
            if path:
                check_file(opt, path)
                tls[key] = path
        if opts.bool("tlsInsecure"):
            import ssl

            tls["cert_reqs"] = ssl.CERT_NONE
            tls["check_hostname"] = False
        if tls:
            conn["tls_options"] = tls
    if opts.get("authSecret"):
        conn["auth_secret"] = opts.get("authSecret")
    if opts.bool("snappy") and opts.bool("deflate"):
        raise NSQOptionError("options 'snappy' and 'deflate' are exclusive: choose one")
    if opts.bool("snappy"):
        conn["snappy"] = True
    if opts.bool("deflate"):
        conn["deflate"] = True
        level = opts.limited("deflateLevel", None, CONNECTION_OPTION_LIMITS)
        if level is not None:
            conn["deflate_level"] = level
    # Spark options are in ms (Kafka-style); ConnectionConfig takes pynsq's seconds
    msg_timeout = opts.limited("msgTimeout", None, CONNECTION_OPTION_LIMITS,
                               unit="milliseconds",
                               hint="the connection's msg_timeout, in ms here")
    if msg_timeout is not None:
        conn["msg_timeout"] = msg_timeout / 1000
    heartbeat = opts.limited("heartbeatInterval", None, CONNECTION_OPTION_LIMITS,
                             unit="milliseconds", special={-1: "off"},
                             hint="the connection's heartbeat_interval, in ms here")
    if heartbeat is not None:
        conn["heartbeat_interval"] = -1 if heartbeat == -1 else heartbeat / 1000
    if opts.get("userAgent"):
        conn["user_agent"] = opts.get("userAgent")
    for key, raw in opts.prefixed("nsq.").items():
        conn[key] = _coerce(raw)
    try:  # the executors would fail on the first connect; say it at query start instead
        from nsq_spark.config import ConnectionConfig

        ConnectionConfig.from_options(**conn)
    except ImportError:  # pragma: no cover
        pass
    except (TypeError, ValueError) as exc:
        raise NSQOptionError(f"connection options: {exc} (options tlsV1, tlsCaFile, ..., "
                             "or nsq.<name>)") from exc
    return conn


def check_file(option: str, path: str) -> None:
    """A file option must name a readable file where the options are parsed: on the
    driver at query start (the executors would otherwise fail their connects one by one,
    and the driver would only hear that they could not subscribe), and again in each
    sink task, which parses its options on the executor."""
    import os
    import socket

    if not os.path.exists(path):
        problem = "does not exist"
    elif not os.path.isfile(path):
        problem = "is not a file"
    elif not os.access(path, os.R_OK):
        problem = "is not readable by this process"
    else:
        return
    raise NSQOptionError(f"option '{option}': {path!r} {problem} on host "
                         f"{socket.gethostname()}; give the path of a PEM file readable "
                         "at that path on the driver and on every executor")


def _coerce(value: str) -> Any:
    low = value.lower()
    if low in ("true", "false"):
        return low == "true"
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            pass
    return value


@dataclass(frozen=True)
class ReadOptions:
    """Validated reading options (picklable: shipped to executors inside partitions)."""

    topic: str
    channel: str
    nsqd_tcp_addresses: list[str]
    lookupd_http_addresses: list[str]
    nsqd_http_addresses: list[str]
    max_in_flight: int
    num_partitions: int
    max_messages_per_trigger: int | None
    max_fetch_period: float
    idle_timeout: float
    spool_path: str | None
    spool_chunk_size: int
    max_attempts: int
    max_messages: int
    dedup: str | None
    connection: dict[str, Any] = field(default_factory=dict)
    dead_letter_path: str | None = None
    # what the query subscribes to: ``topics`` (one for ``topic``, the list for ``topics``,
    # empty for ``topicPattern``, whose topics the driver lists at each trigger); ``topic``
    # is the first of them ("" for a pattern): a partition names its own topic
    topics: tuple[str, ...] = ()
    topic_pattern: str | None = None
    # Kafka's minOffsetsPerTrigger / maxTriggerDelay (s) / a byte cap per micro-batch
    min_messages_per_trigger: int | None = None
    max_trigger_delay: float = 900.0
    max_bytes_per_trigger: int | None = None
    backlog_poll_interval: float = DEFAULT_POLL_INTERVAL  # seconds between them while idle
    # seconds spooled ids are remembered to drop redeliveries (0: off); cap on their number
    redelivery_window: float = DEFAULT_WINDOW
    redelivery_window_max_ids: int = DEFAULT_MAX_IDS
    log_level: str | None = None  # the connector's log level in Spark's workers (.logs)
    # the executor's Reader cache (see READER_CACHE_OPTIONS)
    reader_cache: bool = True
    reader_cache_idle_timeout: float = 5.0
    # copies of one publish are one row (see COPIES_OPTIONS)
    drop_copies: bool = True

    __repr__ = _redacted_repr

    def reader_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``nsq_spark.Reader`` (pull mode)."""
        kwargs: dict[str, Any] = dict(
            topic=self.topic, channel=self.channel, max_in_flight=self.max_in_flight,
            # maxAttempts is applied by the fetch task (dead-letter, not give-up-and-FIN)
            max_tries=0,
            **{"output_buffer_size": READ_OUTPUT_BUFFER_SIZE,
               "output_buffer_timeout": READ_OUTPUT_BUFFER_TIMEOUT, **self.connection})
        if self.nsqd_tcp_addresses:
            kwargs["nsqd_tcp_addresses"] = list(self.nsqd_tcp_addresses)
        else:
            kwargs["lookupd_http_addresses"] = list(self.lookupd_http_addresses)
        return kwargs


# What the source asks nsqd for unless ``nsq.output_buffer_size`` says otherwise: nsqd's
# largest by default (--max-output-buffer-size, 64 KiB). Fewer, larger writes from nsqd
# mean fewer reads here, and a fetch task's cost is mostly per read, not per message.
READ_OUTPUT_BUFFER_SIZE = 65536
# ... and the longest nsqd holds a partly filled buffer back, in ms: nsqd's smallest by
# default (--min-output-buffer-timeout). A small backlog fits in 64 KiB whole, and with
# nsqd's default (250 ms) it would arrive after a short idleTimeout had ended the fetch.
READ_OUTPUT_BUFFER_TIMEOUT = 25


def _address_pair(opts: _Opts) -> tuple[list[str], list[str]]:
    nsqd = _addresses(opts, "nsqdTcpAddresses")
    lookupd = _addresses(opts, "lookupdHttpAddresses", http=True)
    if nsqd and lookupd:
        raise NSQOptionError("options 'nsqdTcpAddresses' and 'lookupdHttpAddresses' are "
                             "exclusive: give exactly one of them")
    if not nsqd and not lookupd:
        raise NSQOptionError("one of the options 'nsqdTcpAddresses' (host:port,...) or "
                             "'lookupdHttpAddresses' (host:port,...) is required")
    return nsqd, lookupd


def parse_read_options(options: Mapping[str, Any], *, streaming: bool) -> ReadOptions:
    """Validate reading options; raises NSQOptionError naming the first bad option."""
    check_known(options, READ_OPTIONS + READER_CACHE_OPTIONS,
                "reading (spark.read/readStream.format(\"nsq\"))")
    opts = _Opts(options)
    check_needs(opts)
    topics, pattern = _subscription(opts)
    channel = opts.require("channel", "the NSQ channel to consume from")
    _check_name("channel", channel)
    check_durable_channel(channel, streaming)
    nsqd, lookupd = _address_pair(opts)
    nsqd_http = _addresses(opts, "nsqdHttpAddresses")
    if nsqd_http and not nsqd:
        raise NSQOptionError("option 'nsqdHttpAddresses' goes with 'nsqdTcpAddresses'; with "
                             "'lookupdHttpAddresses' the HTTP ports come from nsqlookupd")
    if nsqd_http and len(nsqd_http) != len(nsqd):
        raise NSQOptionError("option 'nsqdHttpAddresses' must list the same nsqds as "
                             f"'nsqdTcpAddresses' ({len(nsqd)} addresses, got {len(nsqd_http)})")
    if pattern is not None and not (lookupd or nsqd_http):
        raise NSQOptionError("option 'topicPattern' needs a list of topics to match: give "
                             "'lookupdHttpAddresses' (its /topics), or 'nsqdHttpAddresses' "
                             "with 'nsqdTcpAddresses' (their /stats)")
    min_rows = opts.limited("minMessagesPerTrigger", None, READ_OPTION_LIMITS)
    if min_rows is not None and not (lookupd or nsqd_http):
        raise NSQOptionError("option 'minMessagesPerTrigger' needs the backlog measured: "
                             "give 'lookupdHttpAddresses', or 'nsqdHttpAddresses' with "
                             "'nsqdTcpAddresses'")
    max_rows = opts.limited("maxMessagesPerTrigger", None, READ_OPTION_LIMITS)
    if min_rows is not None and max_rows is not None and min_rows > max_rows:
        raise NSQOptionError(f"option 'minMessagesPerTrigger' ({min_rows}) must not exceed "
                             f"'maxMessagesPerTrigger' ({max_rows})")
    if opts.get("maxTriggerDelay") is not None and min_rows is None:
        raise NSQOptionError("option 'maxTriggerDelay' only takes effect with "
                             "'minMessagesPerTrigger'; set it or remove maxTriggerDelay")
    spool = opts.get("spoolPath")
    if streaming and spool is None:
        raise NSQOptionError(
            "option 'spoolPath' is required for streaming reads: a directory (local path or "
            "pyarrow filesystem URI such as hdfs://... or s3://...) that is durable and "
            "reachable from the driver and every executor; fetched messages are written "
            "there before they are FINished, so a re-executed batch replays them")
    max_in_flight = opts.limited("maxInFlight", DEFAULT_MAX_IN_FLIGHT, READ_OPTION_LIMITS)
    assert max_in_flight is not None
    # at most maxInFlight too, checked below (a bound that depends on another option)
    chunk = opts.limited("spoolChunkSize", max(1, max_in_flight // 2), READ_OPTION_LIMITS)
    assert chunk is not None
    if chunk > max_in_flight:
        raise NSQOptionError(f"option 'spoolChunkSize' ({chunk}) must not exceed "
                             f"'maxInFlight' ({max_in_flight}): nsqd sends no more than "
                             "maxInFlight messages before they are FINished")
    max_attempts = opts.limited("maxAttempts", 0, READ_OPTION_LIMITS) or 0
    dead_letter = opts.get("deadLetterPath")
    if dead_letter is not None and not max_attempts:
        raise NSQOptionError("option 'deadLetterPath' only takes effect with 'maxAttempts' "
                             "> 0; set maxAttempts or remove deadLetterPath")
    if max_attempts and dead_letter is None:
        if spool is None:
            raise NSQOptionError(
                "option 'maxAttempts' needs somewhere to put the messages over it: set "
                "'deadLetterPath' (a directory or pyarrow filesystem URI) or 'spoolPath' "
                "(they then go under <spoolPath>/_dead_letter)")
        base, sep, query = spool.partition("?")  # keep a URI's options (endpoint_override=)
        dead_letter = base.rstrip("/") + "/_dead_letter" + sep + query
    connection = _connection_options(opts)
    return ReadOptions(
        topic=topics[0] if topics else "", topics=topics, topic_pattern=pattern,
        min_messages_per_trigger=min_rows,
        max_trigger_delay=opts.seconds("maxTriggerDelay", DEFAULT_MAX_TRIGGER_DELAY,
                                       READ_OPTION_LIMITS),
        max_bytes_per_trigger=opts.limited("maxBytesPerTrigger", None,
                                           READ_OPTION_LIMITS),
        backlog_poll_interval=_seconds_or_zero(opts, "backlogPollInterval",
                                               DEFAULT_POLL_INTERVAL,
                                               "0 measures at every trigger"),
        channel=channel, nsqd_tcp_addresses=nsqd,
        lookupd_http_addresses=lookupd, nsqd_http_addresses=nsqd_http,
        max_in_flight=max_in_flight,
        num_partitions=opts.limited("numPartitions", DEFAULT_PARTITIONS,
                                    READ_OPTION_LIMITS) or DEFAULT_PARTITIONS,
        max_messages_per_trigger=max_rows,
        max_fetch_period=opts.seconds("maxFetchPeriod", DEFAULT_MAX_FETCH_PERIOD,
                                      READ_OPTION_LIMITS),
        idle_timeout=opts.seconds("idleTimeout", DEFAULT_IDLE_TIMEOUT,
                                  READ_OPTION_LIMITS),
        spool_path=spool,
        spool_chunk_size=chunk,
        max_attempts=max_attempts,
        dead_letter_path=dead_letter,
        max_messages=opts.limited("maxMessages", DEFAULT_MAX_MESSAGES,
                                  READ_OPTION_LIMITS) or DEFAULT_MAX_MESSAGES,
        dedup=opts.get("dedup"),
        connection=connection,
        redelivery_window=_redelivery_window(opts),
        redelivery_window_max_ids=opts.limited("redeliveryWindowMaxIds", DEFAULT_MAX_IDS,
                                               READ_OPTION_LIMITS)
        or DEFAULT_MAX_IDS,
        log_level=_log_level(opts),
        **_reader_cache_options(opts, connection),
        **_copies_options(opts, streaming),
    )


SUBSCRIPTION = ("topic", "topics", "topicPattern")


def _subscription(opts: _Opts) -> tuple[tuple[str, ...], str | None]:
    """``topic`` / ``topics`` / ``topicPattern``, exactly one (Kafka's assign / subscribe /
    subscribePattern rule): the topics named, and the compiled-checked pattern."""
    import re

    given = [name for name in SUBSCRIPTION if opts.get(name) is not None]
    if len(given) != 1:
        what = "none" if not given else " and ".join(f"'{g}'" for g in given)
        raise NSQOptionError(
            f"give exactly one of the options 'topic' (one topic), 'topics' (a "
            f"comma-separated list) or 'topicPattern' (a regular expression over the "
            f"topics lookupd lists); got {what}")
    if given[0] == "topicPattern":
        pattern = opts.get("topicPattern")
        assert pattern is not None
        try:
            re.compile(pattern)
        except re.error as exc:
            raise NSQOptionError(f"option 'topicPattern': {pattern!r} is not a valid "
                                 f"regular expression ({exc})") from None
        return (), pattern
    raw = opts.get(given[0])
    assert raw is not None
    topics = tuple(dict.fromkeys(t.strip() for t in raw.split(",") if t.strip()))
    if not topics:
        raise NSQOptionError(f"option '{given[0]}' is empty; give comma-separated topics")
    if given[0] == "topic" and len(topics) > 1:
        raise NSQOptionError(f"option 'topic' names one topic, not {raw!r}; for several "
                             "use .option(\"topics\", \"a,b\")")
    for topic in topics:
        _check_name("topic", topic)
    return topics, None


# -- the executor's Reader cache (spark/reader_cache.py) --------------------------------
# One block, so that it merges with other options' changes cleanly.
READER_CACHE_OPTIONS = ("readerCache", "readerCacheIdleTimeout")
# Seconds: the cap of readerCacheIdleTimeout; and its largest share of msg_timeout.
MAX_READER_CACHE_IDLE, READER_CACHE_SHARE_OF_MSG_TIMEOUT = 300.0, 0.5
DEFAULT_READER_CACHE_IDLE = 5.0
# nsqd's default --msg-timeout, seconds: the msg_timeout a Reader gets when the options
# do not ask for one in IDENTIFY.
NSQD_MSG_TIMEOUT = 60.0


def _reader_cache_options(opts: _Opts, connection: Mapping[str, Any]) -> dict[str, Any]:
    """``readerCache`` and ``readerCacheIdleTimeout``: a paused cached Reader may hold
    messages in flight on nsqd, so it must be closed (requeueing them) well before nsqd's
    msg_timeout would redeliver them elsewhere. The one place this is decided: from the
    parsed ``connection`` (``msgTimeout`` or ``nsq.msg_timeout``, the value the Reader
    negotiates; else nsqd's default), the idle timeout is at most half of it; the
    default is lowered to that half, a larger given value is refused."""
    msg_timeout = float(connection.get("msg_timeout") or NSQD_MSG_TIMEOUT)
    limit = msg_timeout * READER_CACHE_SHARE_OF_MSG_TIMEOUT
    # the option's own Limit (> 0 .. 300), so a bad value is told its real bounds; the
    # cap's reason goes with the error
    idle = opts.seconds("readerCacheIdleTimeout", min(DEFAULT_READER_CACHE_IDLE, limit),
                        READ_OPTION_LIMITS, hint="at most "
                        f"{MAX_READER_CACHE_IDLE:g} s: a paused Reader may hold messages "
                        "in flight on nsqd until it is closed")
    if idle > limit:
        said = ("nsqd's default --msg-timeout" if connection.get("msg_timeout") is None
                else "from option 'msgTimeout' or 'nsq.msg_timeout'")
        raise NSQOptionError(
            f"option 'readerCacheIdleTimeout' ({idle:g} s) must be at most half of "
            f"'msgTimeout' / 'nsq.msg_timeout', the connection's msg_timeout "
            f"({msg_timeout:g} s, {said}): a cached Reader may hold messages that nsqd "
            f"would otherwise redeliver elsewhere; set readerCacheIdleTimeout to at most "
            f"{limit:g}, or raise msgTimeout (ms) within your nsqd's --max-msg-timeout")
    return {"reader_cache": opts.bool("readerCache", True),
            "reader_cache_idle_timeout": idle}


# -- copies of one publish (spark/copies.py) --------------------------------------------


def _copies_options(opts: _Opts, streaming: bool) -> dict[str, Any]:
    """``dropCopies``: on by default for streaming reads. A batch read returns every
    copy (it has no spool to order its chunks in): asking it to drop them is refused
    rather than ignored."""
    drop = opts.bool("dropCopies", streaming)
    if drop and not streaming:
        raise NSQOptionError(
            "option 'dropCopies' applies to streaming reads (spark.readStream): a batch "
            "read returns every copy of a publish, each with its 'publish_id' column; "
            "remove the option, or drop the copies in the query, e.g. rows with a null "
            "publish_id plus df.where(\"publish_id IS NOT NULL\")"
            ".dropDuplicates([\"publish_id\"])")
    return {"drop_copies": drop}


def _log_level(opts: _Opts) -> str | None:
    """``logLevel``: Python's name of the level, or None (the worker's environment
    variable, else WARN: see :mod:`.logs`)."""
    from .logs import LEVELS, parse_level

    raw = opts.get("logLevel")
    if raw is None:
        return None
    level = parse_level(raw)
    if level is None:
        raise NSQOptionError(f"option 'logLevel' must be one of {', '.join(LEVELS)}, "
                             f"not {raw!r}")
    return level


def _redelivery_window(opts: _Opts) -> float:
    """``redeliveryWindow``: seconds >= 0 (0 turns the redelivery index off)."""
    return _seconds_or_zero(opts, "redeliveryWindow", DEFAULT_WINDOW,
                            "0 turns the dropping of redeliveries off")


def _seconds_or_zero(opts: _Opts, name: str, default: float, zero: str) -> float:
    """A number of seconds in ``READ_OPTION_LIMITS[name]`` (>= 0; ``zero`` says what 0
    means)."""
    return opts.seconds(name, default, READ_OPTION_LIMITS, hint=zero)


@dataclass(frozen=True)
class WriteOptions:
    topic: str | None
    nsqd_tcp_addresses: list[str]
    lookupd_http_addresses: list[str]
    batch_size: int
    max_batch_bytes: int
    retries: int
    publish_timeout: float
    connection: dict[str, Any] = field(default_factory=dict)
    log_level: str | None = None
    # publish identifiers (see .sink): stamped or not; the column holding each row's
    # idempotency key (None: derived from the query, batch, partition and row)
    publish_ids: bool = False
    idempotency_key_column: str | None = None
    replicas: int | None = None  # nsqds per message (Producer(replicas=N))
    write_quorum: int | None = None  # acknowledgements per publish (None: a majority)

    __repr__ = _redacted_repr


def parse_write_options(options: Mapping[str, Any]) -> WriteOptions:
    """Validate writing options; raises NSQOptionError naming the first bad option."""
    check_known(options, WRITE_OPTIONS, "writing (df.write/writeStream.format(\"nsq\"))")
    opts = _Opts(options)
    check_needs(opts)
    topic = opts.get("topic")
    if topic is not None:
        _check_name("topic", topic)
    nsqd, lookupd = _address_pair(opts)
    return WriteOptions(
        topic=topic, nsqd_tcp_addresses=nsqd, lookupd_http_addresses=lookupd,
        **_publish_id_options(opts, nsqd),
        batch_size=opts.limited("batchSize", DEFAULT_BATCH_SIZE, WRITE_OPTION_LIMITS)
        or DEFAULT_BATCH_SIZE,
        max_batch_bytes=opts.limited("maxBatchBytes", DEFAULT_MAX_BATCH_BYTES,
                                     WRITE_OPTION_LIMITS) or DEFAULT_MAX_BATCH_BYTES,
        retries=opts.limited("retries", DEFAULT_RETRIES, WRITE_OPTION_LIMITS)
        or DEFAULT_RETRIES,
        publish_timeout=opts.seconds("publishTimeout", DEFAULT_PUBLISH_TIMEOUT,
                                     WRITE_OPTION_LIMITS),
        connection=_connection_options(opts),
        log_level=_log_level(opts),
    )


def _publish_id_options(opts: _Opts, nsqd: list[str]) -> dict[str, Any]:
    """``publishIds``, ``idempotencyKeyColumn``, ``replicas``, ``writeQuorum``: the
    Producer's rules (``publish_ids`` on by default exactly with replicas; here with a key
    column too, which means nothing without them), checked on the driver."""
    replicas = opts.limited("replicas", None, WRITE_OPTION_LIMITS)
    if replicas is not None and nsqd and replicas > len(nsqd):
        raise NSQOptionError(f"option 'replicas' ({replicas}) is more than the "
                             f"{len(nsqd)} nsqds of 'nsqdTcpAddresses': each copy of a "
                             "message goes to a different nsqd; give more addresses or "
                             f"replicas 1 .. {len(nsqd)}")
    quorum = opts.int("writeQuorum", None, minimum=1)
    if quorum is not None and replicas is None:
        raise NSQOptionError("option 'writeQuorum' only takes effect with 'replicas' (the "
                             "nsqds each message goes to); set replicas or remove "
                             "writeQuorum")
    if quorum is not None and replicas is not None and quorum > replicas:
        raise NSQOptionError(f"option 'writeQuorum' ({quorum}) is more than 'replicas' "
                             f"({replicas}): a publish cannot be acknowledged by more nsqds "
                             f"than it goes to; give writeQuorum 1 .. {replicas}")
    column = opts.get("idempotencyKeyColumn")
    given = opts.get("publishIds")
    ids = opts.bool("publishIds") if given is not None else (
        replicas is not None or column is not None)
    if column is not None and not ids:
        raise NSQOptionError("option 'idempotencyKeyColumn' needs publish ids: the key "
                             "names each row's publish id; remove publishIds=false (or the "
                             "key column)")
    return {"publish_ids": ids, "idempotency_key_column": column, "replicas": replicas,
            "write_quorum": quorum}


# -- machine-readable facts of each option (for the generated options tables) --------------
#
# The docs site prints one table per direction from these and from the table of the module
# docstring above (docs/hooks/generate.py); tests/test_docs_metadata.py checks that every
# option of READ_OPTIONS / WRITE_OPTIONS has its facts and a description, and that each
# default here is the one the parser applies. An option added above needs a line here.

class OptionFacts(NamedTuple):
    """Default, unit and bounds of one option, as a user writes them in ``.option()``."""

    default: str = ""
    unit: str = ""
    bounds: str = ""
    #: The description, for options the module docstring's table does not describe.
    doc: str = ""


# The numeric options' units and bounds: the parser above takes its bounds from these
# (``_Opts.limited``, ``_Opts.seconds``), and the facts below print them, so the two are one.
READ_OPTION_LIMITS: dict[str, Limit] = {
    "maxInFlight": Limit("messages per fetch task", 1, MAX_IN_FLIGHT),
    "numPartitions": Limit("fetch tasks per micro-batch", 1, MAX_PARTITIONS),
    "maxMessagesPerTrigger": Limit("messages", 1),
    "minMessagesPerTrigger": Limit("messages", 1),
    "maxTriggerDelay": SECONDS_POSITIVE,
    "maxBytesPerTrigger": Limit("bytes of message bodies", 1, 2 ** 63 - 1),
    "backlogPollInterval": SECONDS_OR_ZERO._replace(special="0: measure at every trigger"),
    "maxFetchPeriod": SECONDS_POSITIVE,
    "idleTimeout": SECONDS_POSITIVE,
    "spoolChunkSize": Limit("messages", 1),  # and at most maxInFlight (checked with it)
    "maxAttempts": Limit("deliveries", 0, MAX_ATTEMPTS, special="0: never"),
    "maxMessages": Limit("messages (batch read)", 1),
    "redeliveryWindow": SECONDS_OR_ZERO._replace(special="0: off"),
    "redeliveryWindowMaxIds": Limit("ids", 1),
    # and at most half of the connection's msg_timeout (checked with it)
    "readerCacheIdleTimeout": Limit("seconds", 0, MAX_READER_CACHE_IDLE, lo_open=True),
}

WRITE_OPTION_LIMITS: dict[str, Limit] = {
    "batchSize": Limit("messages per MPUB", 1, MAX_INT32),
    "maxBatchBytes": Limit("bytes per MPUB", 9, MAX_INT32),
    "retries": Limit("attempts per MPUB", 1),
    "publishTimeout": SECONDS_POSITIVE,
    "replicas": Limit("nsqds per message", 1),  # and at most the nsqds given (checked)
}

CONNECTION_OPTION_LIMITS: dict[str, Limit] = {
    "deflateLevel": Limit("level", 1, 9),
    "msgTimeout": Limit("milliseconds", 1000, MAX_SECONDS * 1000),
    "heartbeatInterval": Limit("milliseconds", 1000, 60_000, special="-1: off"),
}


def _facts(limits: Mapping[str, Limit]) -> Callable[..., OptionFacts]:
    """``fact(name, default, also="", doc="")``: the facts of a numeric option, its unit and
    bounds from ``limits[name]`` (``also``: a bound that depends on another option, in
    words)."""
    def fact(name: str, default: Any, also: str = "", doc: str = "") -> OptionFacts:
        limit = limits[name]
        shown = f"{default:g}" if isinstance(default, float) else str(default)
        return OptionFacts(shown, limit.unit, limit.bounds() + also, doc)
    return fact


_read, _write, _conn = (_facts(READ_OPTION_LIMITS), _facts(WRITE_OPTION_LIMITS),
                        _facts(CONNECTION_OPTION_LIMITS))


READ_OPTION_FACTS: dict[str, OptionFacts] = {
    "topic": OptionFacts(bounds="1-64 of [.a-zA-Z0-9_-]"),
    "topics": OptionFacts(unit="comma-separated topic names"),
    "topicPattern": OptionFacts(unit="Python regular expression"),
    "channel": OptionFacts(bounds="1-64 of [.a-zA-Z0-9_-]; no #ephemeral"),
    "nsqdTcpAddresses": OptionFacts(unit="comma-separated host:port"),
    "lookupdHttpAddresses": OptionFacts(unit="comma-separated host:port or URL"),
    "nsqdHttpAddresses": OptionFacts(unit="comma-separated host:port"),
    "maxInFlight": _read("maxInFlight", DEFAULT_MAX_IN_FLIGHT),
    "numPartitions": _read("numPartitions", DEFAULT_PARTITIONS),
    "maxMessagesPerTrigger": _read("maxMessagesPerTrigger", "none (no cap)"),
    "minMessagesPerTrigger": _read("minMessagesPerTrigger", "none"),
    "maxTriggerDelay": _read("maxTriggerDelay", DEFAULT_MAX_TRIGGER_DELAY),
    "maxBytesPerTrigger": _read("maxBytesPerTrigger", "none (no cap)"),
    "backlogPollInterval": _read("backlogPollInterval", DEFAULT_POLL_INTERVAL),
    "maxFetchPeriod": _read("maxFetchPeriod", DEFAULT_MAX_FETCH_PERIOD),
    "idleTimeout": _read("idleTimeout", DEFAULT_IDLE_TIMEOUT),
    "spoolPath": OptionFacts("required for streaming", "path or pyarrow filesystem URI"),
    "spoolChunkSize": _read("spoolChunkSize", "maxInFlight // 2", ", at most maxInFlight"),
    "maxAttempts": _read("maxAttempts", "0 (never)"),
    "deadLetterPath": OptionFacts("<spoolPath>/_dead_letter",
                                  "path or pyarrow filesystem URI"),
    "maxMessages": _read("maxMessages", DEFAULT_MAX_MESSAGES),
    "dedup": OptionFacts("none", "deduplicator spec (URI)"),
    "redeliveryWindow": _read("redeliveryWindow", float(DEFAULT_WINDOW)),
    "redeliveryWindowMaxIds": _read("redeliveryWindowMaxIds", DEFAULT_MAX_IDS),
    "logLevel": OptionFacts("WARN", "DEBUG, INFO, WARN or ERROR"),
    "readerCache": OptionFacts("true", "boolean"),
    "dropCopies": OptionFacts("true (streaming)", "boolean"),
    "readerCacheIdleTimeout": _read("readerCacheIdleTimeout", DEFAULT_READER_CACHE_IDLE,
                                    ", and at most half of msgTimeout"),
}

CONNECTION_OPTION_FACTS: dict[str, OptionFacts] = {
    "tlsV1": OptionFacts("false", "boolean", doc="upgrade the connection to TLS "
                         "(nsqd needs --tls-cert and --tls-key)"),
    "tlsCaFile": OptionFacts("the system's trust store", "path of a PEM file",
                             doc="CA bundle that signs nsqd's certificate; needs tlsV1. "
                             "Checked at query start: readable on the driver, at the path "
                             "the executors use too"),
    "tlsCertFile": OptionFacts("none", "path of a PEM file",
                               doc="client certificate (nsqd --tls-client-auth-policy); "
                               "needs tlsV1"),
    "tlsKeyFile": OptionFacts("none", "path of a PEM file",
                              doc="key of the client certificate; needs tlsV1"),
    "tlsInsecure": OptionFacts("false", "boolean",
                               doc="skip certificate verification (testing only); needs tlsV1"),
    "authSecret": OptionFacts("none", "string", doc="secret sent with AUTH when nsqd "
                              "requires it; never logged, never in an error"),
    "snappy": OptionFacts("false", "boolean", doc="snappy stream compression; excludes deflate"),
    "deflate": OptionFacts("false", "boolean", doc="deflate stream compression; excludes snappy"),
    "deflateLevel": _conn("deflateLevel", 6, doc="deflate level (nsqd clamps it); needs deflate"),
    "msgTimeout": _conn("msgTimeout", f"nsqd's --msg-timeout ({NSQD_MSG_TIMEOUT * 1000:.0f})",
                        doc="how long nsqd waits for FIN/REQ/TOUCH before it "
                        "redelivers (nsqd caps it at --max-msg-timeout)"),
    "heartbeatInterval": _conn("heartbeatInterval", 30000, doc="interval of nsqd's heartbeats"),
    "userAgent": OptionFacts("nsq_spark/<version>", "string",
                             doc="client name nsqd shows in its stats"),
}

WRITE_OPTION_FACTS: dict[str, OptionFacts] = {
    "topic": OptionFacts("none", bounds="1-64 of [.a-zA-Z0-9_-]",
                         doc="the topic of rows whose `topic` column is null or absent"),
    "nsqdTcpAddresses": OptionFacts(unit="comma-separated host:port",
                                    doc="the nsqds to publish to; or"),
    "lookupdHttpAddresses": OptionFacts(unit="comma-separated host:port or URL",
                                        doc="nsqlookupds that list the nsqds to publish to"),
    "batchSize": _write("batchSize", DEFAULT_BATCH_SIZE, doc="messages per MPUB"),
    "maxBatchBytes": _write("maxBatchBytes", DEFAULT_MAX_BATCH_BYTES,
                            doc="bytes per MPUB, under nsqd's --max-body-size (5 MiB)"),
    "retries": _write("retries", DEFAULT_RETRIES,
                      doc="attempts per MPUB before the task fails"),
    "publishTimeout": _write("publishTimeout", DEFAULT_PUBLISH_TIMEOUT,
                             doc="how long to wait for nsqd's acknowledgements of one "
                             "Arrow batch"),
    "logLevel": OptionFacts("WARN", "DEBUG, INFO, WARN or ERROR",
                            doc="the connector's log level in Spark's Python workers"),
    "publishIds": OptionFacts(
        "true with replicas or idempotencyKeyColumn, else false", "boolean",
        doc="stamp each message with a publish id (the version-3 envelope, 27 bytes) "
        "that a re-run of the same micro-batch reproduces, so that a consumer "
        "deduplicating by publish id (a Reader with dedup_key=\"publish_id\", the nsq "
        "source) drops the copies; a consumer that is not nsq-spark sees the envelope in "
        "the body"),
    "idempotencyKeyColumn": OptionFacts(
        "none (derived from the query, batch, partition, row and body)", "column name",
        doc="a column (string or binary, no nulls) whose value is each row's idempotency "
        "key: rows with the same key are one message to a consumer deduplicating by "
        "publish id, whichever write publishes them"),
    "replicas": _write("replicas", "none (one copy)", ", at most the nsqds given",
                       doc="put each message on this many nsqds (Producer(replicas=N)); "
                       "turns publishIds on"),
    "writeQuorum": OptionFacts("a majority of replicas", "acknowledgements",
                               "at least 1, at most replicas",
                               doc="nsqds that must acknowledge a publish; needs replicas"),
}
