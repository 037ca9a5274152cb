"""Options of the ``nsq`` Spark data source: their rows, parsing and validation.

Every option is one row (:mod:`nsq_spark._options`) in one of three tables:
:data:`READ` (``spark.readStream.format("nsq")`` and ``spark.read.format("nsq")``),
:data:`WRITE` (``df.write.format("nsq")`` / ``df.writeStream.format("nsq")``) and
:data:`CONNECTION` (both directions). A row holds the option's name, what it accepts (a
unit and a range, a rule, or a parser), its default, its documentation and what it needs
or excludes; the parser below, the generated option tables of the docs site
(``docs/spark.md``) and their tests read the rows, so adding an option is one row and the
code that uses it. In Python: ``for row in READ: print(row.name, row.default_text,
row.bounds_text, row.doc)``.

Spark hands data source options over case-insensitively (a plain dict whose keys may
arrive lower-cased), so every lookup here ignores case. Options use camelCase like
Spark's Kafka source. Every problem is reported at query start, in one error that names
the option and says how to fix it: an unknown option names the closest known one, an
option that only works with another one (its row's ``needs``) says which, two that
exclude each other say so. Addresses follow the one address rule
(:mod:`nsq_spark._addresses`); numbers the one number rule (:mod:`nsq_spark._validate`:
integers where an integer is meant, finite, in range, the option named in the error).
The ``repr`` of the parsed options never shows the AUTH secret, nor a password or secret
key inside a URI (``dedup``, ``spoolPath``).

Connection options (both directions, :data:`CONNECTION`): any other ``ConnectionConfig``
keyword can be given as ``nsq.<snake_case_name>`` (e.g. ``nsq.output_buffer_timeout``),
in ``ConnectionConfig``'s (pynsq's) units: ``nsq.heartbeat_interval`` and
``nsq.msg_timeout`` in seconds, ``nsq.output_buffer_timeout`` in ms. Reading asks nsqd for
a 64 KiB output buffer flushed after at most 25 ms (``nsq.output_buffer_size=65536``,
``nsq.output_buffer_timeout=25``: the largest buffer and the shortest timeout nsqd's
defaults allow, ``--max-output-buffer-size`` and ``--min-output-buffer-timeout``); set
them within your nsqd's limits if it allows less.

Publish identifiers (writing; :mod:`.sink` says how they are derived): ``publishIds``,
``idempotencyKeyColumn``, ``replicas`` and ``writeQuorum`` follow the Producer's rules
(``publish_ids`` on by default exactly with replicas; here with a key column too).

Durations (every option in seconds): a number of seconds, or a number with a unit as
Spark's Kafka source takes them (``"500ms"``, ``"5s"``, ``"1m"``, ``"2 minutes"``,
``"1h"``, ``"1d"``; :func:`parse_duration`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import Any, Mapping

from nsq_spark._options import Given, Option, OptionTable, parse_duration
from nsq_spark.config import CONNECTION as CONNECTION_CONFIG
from nsq_spark.errors import ConfigError
from nsq_spark._validate import MAX_SECONDS, SECONDS_OR_ZERO, Limit, redact_options

from ._seen import DEFAULT_MAX_IDS, DEFAULT_WINDOW

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


# MPUB counts and sizes are 32-bit; nsqd counts attempts in 16 bits.
MAX_INT32, MAX_ATTEMPTS = 2 ** 31 - 1, 65535
# A fetch task keeps up to maxInFlight messages in memory; numPartitions tasks a batch.
MAX_IN_FLIGHT, MAX_PARTITIONS = 1_000_000, 10_000
# Seconds: the cap of readerCacheIdleTimeout; and its largest share of msg_timeout.
MAX_READER_CACHE_IDLE, READER_CACHE_SHARE_OF_MSG_TIMEOUT = 300.0, 0.5
# nsqd's default --msg-timeout, seconds: the msg_timeout a Reader gets when the options
# do not ask for one in IDENTIFY.
NSQD_MSG_TIMEOUT = 60.0
# Keys Spark itself puts into the option map: ``path`` (from ``.load(path)`` /
# ``.save(path)``, refused with its own message when reading) and ``checkpointLocation``
# (a writeStream's ``.option("checkpointLocation", ...)`` reaches the sink's options too).
SPARK_OPTIONS = ("path", "checkpointLocation")
EPHEMERAL = "#ephemeral"


# -- the parsers of options that are not numbers ------------------------------------------


def _name(kind: str) -> Any:
    """A topic or channel name by nsqd's rule: 1-64 of [.a-zA-Z0-9_-], optionally ending in
    ``#ephemeral`` (which reading refuses: :func:`check_durable_channel`)."""
    def parse(value: str, param: str) -> str:
        if not re.fullmatch(r"[.a-zA-Z0-9_-]+(#ephemeral)?", value) or len(value) > 64:
            raise NSQOptionError(
                f"option '{kind}': {value!r} is not a valid NSQ {kind} name (1-64 "
                "characters of letters, digits, '.', '_', '-', optionally ending in "
                "'#ephemeral')")
        return value
    return parse


def _topics(value: str, param: str) -> tuple[str, ...]:
    topics = tuple(dict.fromkeys(t.strip() for t in value.split(",") if t.strip()))
    if not topics:
        raise NSQOptionError(f"{param} is empty; give comma-separated topics")
    for topic in topics:
        _name("topic")(topic, param)
    return topics


def _one_topic(value: str, param: str) -> str:
    topics = _topics(value, param)
    if len(topics) > 1:
        raise NSQOptionError(f"{param} names one topic, not {value!r}; for several use "
                             ".option(\"topics\", \"a,b\")")
    return topics[0]


def _pattern(value: str, param: str) -> str:
    try:
        re.compile(value)
    except re.error as exc:
        raise NSQOptionError(f"{param}: {value!r} is not a valid regular expression "
                             f"({exc})") from None
    return value


def _addresses(http: bool) -> Any:
    """A comma-separated address list, by the one address rule (:mod:`nsq_spark._addresses`);
    ``http``: lookupd's, ``host:port`` or an ``http(s)://`` URL, kept as given."""
    def parse(value: str, param: str) -> list[str]:
        from nsq_spark._addresses import parse_address_list, parse_http_address, split_list
        from nsq_spark.errors import InvalidAddressError

        try:
            if http:
                out = [e.strip() for e in split_list(value, param) if isinstance(e, str)]
                for entry in out:
                    parse_http_address(entry, param, "127.0.0.1:4161")
            else:
                out = [str(a) for a in parse_address_list(value, param)]
        except InvalidAddressError as exc:
            raise NSQOptionError(str(exc)) from None
        if not out:
            raise NSQOptionError(f"{param} is empty; give comma-separated host:port")
        return out
    return parse


def _log_level(value: str, param: str) -> str:
    """Python's name of the level (without the option: the worker's environment variable,
    else WARN: see :mod:`.logs`)."""
    from ._logs import LEVELS, parse_level

    level = parse_level(value)
    if level is None:
        raise NSQOptionError(f"{param} must be one of {', '.join(LEVELS)}, not {value!r}")
    return level


def _pem_file(option: str) -> Any:
    def parse(value: str, param: str) -> str:
        check_file(option, value)
        return value
    return parse


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


def _text(value: str, param: str) -> str:
    return value


_NAME_RULE = "1-64 of [.a-zA-Z0-9_-]"
_PATH = "path or pyarrow filesystem URI"
_LEVELS: dict[str, Any] = dict(parse=_log_level, shown="WARN", unit="DEBUG, INFO, WARN or ERROR")


# -- the rows --------------------------------------------------------------------------------

#: The connection options, both directions (Spark options are in ms, Kafka-style, where
#: ConnectionConfig takes pynsq's seconds; its own defaults are printed).
CONNECTION = OptionTable([
    Option("tlsV1", "flag", False,
           doc="upgrade the connection to TLS (nsqd needs --tls-cert and --tls-key)"),
    Option("tlsCaFile", parse=_pem_file("tlsCaFile"), needs="tlsV1", shown="the system's trust store",
           unit="path of a PEM file",
           doc="CA bundle that signs nsqd's certificate; needs tlsV1. Checked at query "
           "start: readable on the driver, at the path the executors use too"),
    Option("tlsCertFile", parse=_pem_file("tlsCertFile"), needs="tlsV1", shown="none",
           unit="path of a PEM file",
           doc="client certificate (nsqd --tls-client-auth-policy); needs tlsV1"),
    Option("tlsKeyFile", parse=_pem_file("tlsKeyFile"), needs="tlsV1", shown="none",
           unit="path of a PEM file", doc="key of the client certificate; needs tlsV1"),
    Option("tlsServerHostname", parse=_text, needs="tlsV1", shown="the address's host",
           unit="host name",
           doc="name to verify in nsqd's certificate and send in SNI, where executors "
           "reach nsqd by an address its certificate does not name; needs tlsV1"),
    Option("tlsInsecure", "flag", False, needs="tlsV1",
           doc="skip certificate verification (testing only); needs tlsV1"),
    Option("authSecret", parse=_text, secret=True, shown="none", unit="string",
           doc="secret sent with AUTH when nsqd requires it; never logged, never in an "
           "error"),
    Option("snappy", "flag", False, excludes=("deflate",),
           doc="snappy stream compression; excludes deflate"),
    Option("deflate", "flag", False, doc="deflate stream compression; excludes snappy"),
    Option("deflateLevel", "int", limit=Limit("level", 1, 9), needs="deflate",
           shown=str(CONNECTION_CONFIG["deflate_level"].default),
           doc="deflate level (nsqd clamps it); needs deflate"),
    Option("msgTimeout", "int", limit=Limit("milliseconds", 1000, MAX_SECONDS * 1000),
           hint="the connection's msg_timeout, in ms here",
           shown=f"nsqd's --msg-timeout ({NSQD_MSG_TIMEOUT * 1000:.0f})",
           doc="how long nsqd waits for FIN/REQ/TOUCH before it redelivers (nsqd caps it "
           "at --max-msg-timeout)"),
    Option("heartbeatInterval", "int", limit=Limit("milliseconds", 1000, 60_000),
           special={-1: "off"}, hint="the connection's heartbeat_interval, in ms here",
           shown=f"{CONNECTION_CONFIG['heartbeat_interval'].default * 1000:.0f}",
           doc="interval of nsqd's heartbeats"),
    Option("userAgent", parse=_text, shown="nsq_spark/<version>", unit="string",
           doc="client name nsqd shows in its stats"),
], what="option", error=NSQOptionError, ignore_case=True)

#: Reading: ``spark.readStream.format("nsq")`` and ``spark.read.format("nsq")``.
READ = OptionTable([
    Option("topic", parse=_one_topic, rule=_NAME_RULE, doc="the NSQ topic to consume; or"),
    Option("topics", parse=_topics, unit="comma-separated topic names",
           doc="a comma-separated list of topics (Kafka: ``subscribe``); or"),
    Option("topicPattern", parse=_pattern, unit="Python regular expression",
           doc="a regular expression (Python ``re``, matched against the whole name) over "
           "the topics lookupd lists (``/topics``; with ``nsqdHttpAddresses``: the nsqds' "
           "``/stats``), listed again at each trigger (Kafka: ``subscribePattern``). "
           "Exactly one of the three. Rows tell topics apart by their ``topic`` column."),
    Option("channel", parse=_name("channel"), rule=_NAME_RULE + "; no #ephemeral",
           doc="required: the NSQ channel (one channel per query; two queries on the same "
           "channel share its messages). A durable channel: a ``#ephemeral`` one is refused "
           "(:func:`check_durable_channel`)."),
    Option("nsqdTcpAddresses", parse=_addresses(http=False),
           excludes=("lookupdHttpAddresses",), why="give exactly one of them",
           unit="comma-separated host:port",
           doc="comma-separated ``host:port`` of nsqd TCP listeners; or"),
    Option("lookupdHttpAddresses", parse=_addresses(http=True),
           unit="comma-separated host:port or URL",
           doc="comma-separated ``host:port`` of nsqlookupd HTTP listeners. Exactly one of "
           "the two."),
    Option("nsqdHttpAddresses", parse=_addresses(http=False), needs="nsqdTcpAddresses",
           why="with 'lookupdHttpAddresses' the HTTP ports come from nsqlookupd",
           unit="comma-separated host:port",
           doc="optional, with ``nsqdTcpAddresses``: the same nsqds' HTTP listeners, used by "
           "the driver to create the channel at query start and to read its depth from "
           "``/stats`` so that no micro-batch starts when nothing is queued. With lookupd "
           "the HTTP ports come from lookupd. Without either, every trigger starts a batch "
           "that ends after ``idleTimeout``."),
    Option("maxInFlight", "int", 2500, attr="max_in_flight",
           limit=Limit("messages per fetch task", 1, MAX_IN_FLIGHT),
           doc="messages in flight per fetch task (default 2500, nsqd's default "
           "``--max-rdy-count``; nsqd caps each connection's RDY at its "
           "``--max-rdy-count``). For throughput on a large backlog, start nsqd with "
           "``--max-rdy-count=20000`` and set ``maxInFlight`` to 10000-20000: a fetch task "
           "then spools and FINishes in chunks of half that (fewer fsyncs, fewer and larger "
           "Arrow batches). The cost: up to that many messages per task are redelivered "
           "after a crash, and kept in the task's memory. At most 1,000,000."),
    Option("numPartitions", "int", 2, attr="num_partitions",
           limit=Limit("fetch tasks per micro-batch", 1, MAX_PARTITIONS),
           doc="fetch tasks per micro-batch (default 2, at most 10,000). With several "
           "topics they are split over the topics that have a backlog, in proportion to "
           "it, and each such topic gets at least one (:mod:`.admission`)."),
    Option("maxMessagesPerTrigger", "int", attr="max_messages_per_trigger",
           limit=Limit("messages", 1), shown="none (no cap)",
           doc="cap on messages per micro-batch (Spark read limit ``ReadMaxRows``); under "
           "``Trigger.AvailableNow`` the backlog is then drained in several batches."),
    Option("minMessagesPerTrigger", "int", attr="min_messages_per_trigger",
           limit=Limit("messages", 1), shown="none",
           doc="no micro-batch while the fetchable backlog (all topics) is below this "
           "(Kafka: ``minOffsetsPerTrigger``; Spark's ``ReadMinRows``), unless "
           "``maxTriggerDelay`` has passed since the last batch. Needs a measurable "
           "backlog (lookupd or ``nsqdHttpAddresses``); ignored under "
           "``Trigger.AvailableNow``."),
    Option("maxTriggerDelay", "seconds", 900.0, attr="max_trigger_delay",
           needs="minMessagesPerTrigger",
           doc="how long a batch may be held back by ``minMessagesPerTrigger`` (default "
           "900 s, Kafka's 15 minutes), counted by the source from its last batch (or from "
           "its start): seconds, or Kafka's duration strings (``\"5s\"``, ``\"1m\"``, "
           "``\"500ms\"``, ``\"15m\"``)."),
    Option("maxBytesPerTrigger", "int", attr="max_bytes_per_trigger",
           limit=Limit("bytes of message bodies", 1, 2 ** 63 - 1), shown="none (no cap)",
           doc="cap on message body bytes per micro-batch (Spark's ``ReadMaxBytes``), "
           "split over the batch's fetch tasks, each of which stops at its share (nsqd's "
           "``/stats`` counts messages, not bytes, so the fetch task enforces it: it takes "
           "no message past the one whose body reaches its share, and nsqd's RDY follows "
           "the bytes left; a task takes at least one message, so a batch may exceed the "
           "cap by one message per task)."),
    # The default: seconds between two measurements of the backlog while the source is
    # idle (the last call planned nothing and no batch ended since). With the default
    # trigger Spark asks every ~10 ms while idle; a measurement is a lookupd /lookup plus
    # a /stats per nsqd (and a /topics for a pattern). Measured with
    # bench/bench_backlog_poll.py (one nsqd, one lookupd, this 2-core machine): at every
    # call, 82 measurements/s (164 HTTP requests/s) and 12% of a core in the driver's
    # Python worker; at 0.1 s, 9/s and 2%, and new data after a quiet spell is planned
    # 43 ms later at the median, 94 ms at p95 (0 s: 2 / 3 ms; 0.05 s: 33 / 43 ms; 0.25 s:
    # 129 / 246 ms). A batch that ends is measured at once, so a steady stream (2,000
    # msg/s) waits for no poll.
    Option("backlogPollInterval", "seconds", 0.1, attr="backlog_poll_interval",
           limit=SECONDS_OR_ZERO, special={0: "measure at every trigger"},
           doc="seconds between two measurements of the backlog (nsqd ``/stats``) while "
           "the query is idle (default 0.1; 0: at every trigger). Spark asks every ~10 ms "
           "with the default trigger; a batch that ends is measured at once (no Kafka "
           "counterpart)."),
    Option("maxFetchPeriod", "seconds", 10.0, attr="max_fetch_period",
           doc="seconds a fetch task may spend fetching (default 10)."),
    Option("idleTimeout", "seconds", 1.0, attr="idle_timeout",
           doc="seconds without a message after which a fetch task stops (default 1; for "
           "the first message of a batch that nsqd reported, at least 5 s, to allow for "
           "discovery and connect)."),
    Option("spoolPath", parse=_text, attr="spool_path", shown="required for streaming",
           unit=_PATH,
           doc="required for streaming: a pyarrow filesystem URI or local path, durable "
           "and reachable from the driver and every executor."),
    Option("spoolChunkSize", "int", limit=Limit("messages", 1), shown="maxInFlight // 2",
           rule=", at most maxInFlight",
           doc="messages per spool chunk file (default ``maxInFlight // 2``, so that one "
           "half of the in-flight window arrives while the other is written and "
           "FINished)."),
    Option("maxAttempts", "int", 0, attr="max_attempts",
           limit=Limit("deliveries", 0, MAX_ATTEMPTS), special={0: "never"},
           shown="0 (never)",
           doc="a message delivered more often than this goes to the dead-letter directory "
           "instead of the result (default 0: never). It is written there durably before "
           "its FIN, counted and logged (WARNING). At most 65535 (nsqd counts attempts in "
           "16 bits)."),
    Option("deadLetterPath", parse=_text, needs="maxAttempts",
           shown="<spoolPath>/_dead_letter", unit=_PATH,
           doc="where messages over ``maxAttempts`` go: a directory or pyarrow filesystem "
           "URI (default ``<spoolPath>/_dead_letter``), one Arrow IPC file per chunk, with "
           "the source's schema. Kept until you delete it."),
    Option("maxMessages", "int", 100_000, attr="max_messages",
           limit=Limit("messages (batch read)", 1),
           doc="batch read only: stop after this many messages in total (default "
           "100000)."),
    Option("dedup", parse=_text, attr="dedup", shown="none", unit="deduplicator spec (URI)",
           doc="optional: a deduplicator spec for ``nsq_spark.dedup.from_spec`` (e.g. "
           "``redis://host:6379/0?ttl=86400``): rows whose ``id`` was seen before are "
           "dropped at fetch time. A store that does not answer fails the task with a "
           "``DedupStoreError`` naming it."),
    Option("redeliveryWindow", "seconds", DEFAULT_WINDOW, attr="redelivery_window",
           limit=SECONDS_OR_ZERO, special={0: "off"},
           doc="streaming: seconds the ids of spooled messages are remembered (default "
           "300; 0 turns it off). A message nsqd delivers again under the id of one the "
           "source has already spooled (a FIN lost to a crash, an nsqd restart rewinding "
           "its disk queue) within this window is FINished and counted, not made a second "
           "row. Kept under ``<spoolPath>/<query>/_seen``, 8 bytes per id."),
    Option("redeliveryWindowMaxIds", "int", DEFAULT_MAX_IDS,
           attr="redelivery_window_max_ids", limit=Limit("ids", 1),
           doc="cap on the ids remembered (default 5000000, 40 MB in each fetch task's "
           "memory, and 16 bytes more per id for the rows that carry a publish id): beyond "
           "it the oldest batches are forgotten first."),
    Option("logLevel", attr="log_level", **_LEVELS,
           doc="the connector's log level in Spark's Python workers (executors' stderr, and "
           "the driver's in local mode): ``DEBUG``, ``INFO``, ``WARN`` (default) or "
           "``ERROR``; also for writing. Without it, the workers' ``NSQ_SPARK_LOG_LEVEL`` "
           "environment variable. INFO shows each fetch task's rows and timings, "
           "redeliveries dropped (with the first ids) and the backlog per trigger "
           "(:mod:`.logs`)."),
    Option("dropCopies", "flag", shown="true (streaming)",
           doc="streaming: rows that are copies of one publish -- the same ``publish_id``, "
           "from a Producer with ``replicas`` or ``publish_ids`` -- become one row, "
           "whichever nsqds, fetch tasks and micro-batches they arrive in (default true; "
           "across batches within ``redeliveryWindow``). The copies are FINished, counted "
           "and logged, not rows (:mod:`.copies`). Rows without a publish id are never "
           "copies: a topic without publish envelopes pays one byte check per row. false: "
           "every copy is a row."),
    Option("readerCache", "flag", True, attr="reader_cache",
           doc="streaming: keep each fetch task's connected Reader in the executor's Python "
           "worker for the query's next task there, whichever partition it fetches "
           "(default true; Kafka: ``spark.kafka.consumer.cache.*``). Saves the connect, "
           "IDENTIFY, SUB and close of every micro-batch (:mod:`.reader_cache`). false: "
           "each task connects and closes."),
    # and at most half of the connection's msg_timeout (checked with it)
    Option("readerCacheIdleTimeout", "seconds", 5.0,
           limit=Limit("seconds", 0, MAX_READER_CACHE_IDLE, lo_open=True),
           rule=", and at most half of msgTimeout",
           hint=f"at most {MAX_READER_CACHE_IDLE:g} s: a paused Reader may hold messages in "
           "flight on nsqd until it is closed",
           doc="seconds a cached Reader may stay unused before it is closed (default 5; "
           "Kafka: ``spark.kafka.consumer.cache.timeout``). A paused Reader may hold "
           "messages nsqd sent before it saw RDY 0, so this must stay well below the "
           "connection's msg_timeout: at most half of ``msgTimeout`` (or "
           "``nsq.msg_timeout``; without them nsqd's ``--msg-timeout``, 60 s by default, so "
           "at most 30), and at most 300; the default is lowered to that half. Each cached "
           "Reader is also closed after at most half the msg_timeout its nsqds actually "
           "negotiated (an nsqd started with ``--msg-timeout=4s``: 2 s)."),
], what="option", error=NSQOptionError, ignore_case=True)

#: Writing: ``df.write.format("nsq")`` / ``df.writeStream.format("nsq")``.
WRITE = OptionTable([
    Option("topic", parse=_name("topic"), attr="topic", shown="none", rule=_NAME_RULE,
           doc="the topic of rows whose `topic` column is null or absent"),
    Option("nsqdTcpAddresses", parse=_addresses(http=False),
           excludes=("lookupdHttpAddresses",), why="give exactly one of them",
           unit="comma-separated host:port", doc="the nsqds to publish to; or"),
    Option("lookupdHttpAddresses", parse=_addresses(http=True),
           unit="comma-separated host:port or URL",
           doc="nsqlookupds that list the nsqds to publish to"),
    Option("batchSize", "int", 1000, attr="batch_size",
           limit=Limit("messages per MPUB", 1, MAX_INT32), doc="messages per MPUB"),
    Option("maxBatchBytes", "int", 4 << 20, attr="max_batch_bytes",
           limit=Limit("bytes per MPUB", 9, MAX_INT32),
           doc="bytes per MPUB, under nsqd's --max-body-size (5 MiB)"),
    Option("retries", "int", 5, attr="retries", limit=Limit("attempts per MPUB", 1),
           doc="attempts per MPUB before the task fails"),
    Option("publishTimeout", "seconds", 60.0, attr="publish_timeout",
           doc="how long to wait for nsqd's acknowledgements of one Arrow batch"),
    Option("logLevel", attr="log_level", **_LEVELS,
           doc="the connector's log level in Spark's Python workers"),
    Option("publishIds", "flag",
           shown="true with replicas or idempotencyKeyColumn, else false",
           doc="stamp each message with a publish id (the version-3 envelope, 27 bytes) "
           "that a re-run of the same micro-batch reproduces, so that a consumer "
           "deduplicating by publish id (a Reader with dedup_key=\"publish_id\", the nsq "
           "source) drops the copies; a consumer that is not nsq-spark sees the envelope "
           "in the body"),
    Option("idempotencyKeyColumn", parse=_text, attr="idempotency_key_column",
           shown="none (derived from the query, batch, partition, row and body)",
           unit="column name",
           doc="a column (string or binary, no nulls) whose value is each row's "
           "idempotency key: rows with the same key are one message to a consumer "
           "deduplicating by publish id, whichever write publishes them"),
    # and at most the nsqds given (checked with them)
    Option("replicas", "int", attr="replicas", limit=Limit("nsqds per message", 1),
           shown="none (one copy)", rule=", at most the nsqds given",
           doc="put each message on this many nsqds (Producer(replicas=N)); turns "
           "publishIds on"),
    Option("writeQuorum", "int", attr="write_quorum", limit=Limit("acknowledgements", 1),
           needs="replicas", why="the nsqds each message goes to",
           shown="a majority of replicas", rule=", at most replicas",
           doc="nsqds that must acknowledge a publish; needs replicas"),
], what="option", error=NSQOptionError, ignore_case=True)

_READING = READ + CONNECTION
_WRITING = WRITE + CONNECTION
_UNKNOWN_HINT = (" (connection settings without an option of their own go as "
                 "nsq.<snake_case_name>)")

# Derived names kept for the code and docs that refer to them (not copies: the rows').
DEFAULT_POLL_INTERVAL: float = READ["backlogPollInterval"].default
DEFAULT_MAX_IN_FLIGHT: int = READ["maxInFlight"].default


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


def _connection_options(given: Given) -> dict[str, Any]:
    """Connection keyword arguments (pynsq names) for Reader / Producer."""
    conn: dict[str, Any] = {}
    if given.get("tlsV1"):
        conn["tls_v1"] = True
        tls: dict[str, Any] = {}
        for opt, key in (("tlsCaFile", "ca_certs"), ("tlsCertFile", "certfile"),
                         ("tlsKeyFile", "keyfile")):
            path = given.get(opt)
            if path:
                tls[key] = path
        if given.given("tlsServerHostname"):
            conn["tls_server_hostname"] = given.get("tlsServerHostname")
        if given.get("tlsInsecure"):
            import ssl

            tls["cert_reqs"] = ssl.CERT_NONE
            tls["check_hostname"] = False
        if tls:
            conn["tls_options"] = tls
    if given.given("authSecret"):
        conn["auth_secret"] = given.get("authSecret")
    if given.get("snappy"):
        conn["snappy"] = True
    if given.get("deflate"):
        conn["deflate"] = True
        level = given.get("deflateLevel")
        if level is not None:
            conn["deflate_level"] = level
    # Spark options are in ms (Kafka-style); ConnectionConfig takes pynsq's seconds
    msg_timeout = given.get("msgTimeout")
    if msg_timeout is not None:
        conn["msg_timeout"] = msg_timeout / 1000
    heartbeat = given.get("heartbeatInterval")
    if heartbeat is not None:
        conn["heartbeat_interval"] = -1 if heartbeat == -1 else heartbeat / 1000
    if given.given("userAgent"):
        conn["user_agent"] = given.get("userAgent")
    for key, raw in given.prefixed("nsq.").items():
        conn[key] = _coerce(raw)
    try:  # the executors would fail on the first connect; say it at query start instead
        from nsq_spark.config import ConnectionConfig

        ConnectionConfig.from_options(**conn)
    except (TypeError, ValueError) as exc:
        raise NSQOptionError(f"connection options: {exc} (options tlsV1, tlsCaFile, ..., "
                             "or nsq.<name>)") from exc
    return conn


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
    """Validated reading options (picklable: shipped to executors inside partitions).
    Every field is set by :func:`parse_read_options`, with its row's default."""

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
    connection: dict[str, Any]
    dead_letter_path: str | None
    # what the query subscribes to: ``topics`` (one for ``topic``, the list for ``topics``,
    # empty for ``topicPattern``, whose topics the driver lists at each trigger); ``topic``
    # is the first of them ("" for a pattern): a partition names its own topic
    topics: tuple[str, ...]
    topic_pattern: str | None
    # Kafka's minOffsetsPerTrigger / maxTriggerDelay (s) / a byte cap per micro-batch
    min_messages_per_trigger: int | None
    max_trigger_delay: float
    max_bytes_per_trigger: int | None
    backlog_poll_interval: float  # seconds between measurements while idle
    # seconds spooled ids are remembered to drop redeliveries (0: off); cap on their number
    redelivery_window: float
    redelivery_window_max_ids: int
    log_level: str | None  # the connector's log level in Spark's workers (.logs)
    # the executor's Reader cache (readerCache, readerCacheIdleTimeout)
    reader_cache: bool
    reader_cache_idle_timeout: float
    # copies of one publish are one row (dropCopies)
    drop_copies: bool

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


def _address_pair(given: Given) -> tuple[list[str], list[str]]:
    nsqd: list[str] = given.get("nsqdTcpAddresses") or []
    lookupd: list[str] = given.get("lookupdHttpAddresses") or []
    if not nsqd and not lookupd:
        raise NSQOptionError("one of the options 'nsqdTcpAddresses' (host:port,...) or "
                             "'lookupdHttpAddresses' (host:port,...) is required")
    return nsqd, lookupd


def parse_read_options(options: Mapping[str, Any], *, streaming: bool) -> ReadOptions:
    """Validate reading options; raises NSQOptionError naming the first bad option."""
    given = _READING.read(options, known=SPARK_OPTIONS, prefixes=("nsq.",),
                          context=" for reading (spark.read/readStream.format(\"nsq\"))",
                          unknown_hint=_UNKNOWN_HINT)
    topics, pattern = _subscription(given)
    channel = given.require("channel", "the NSQ channel to consume from")
    check_durable_channel(channel, streaming)
    nsqd, lookupd = _address_pair(given)
    nsqd_http: list[str] = given.get("nsqdHttpAddresses") or []
    if nsqd_http and len(nsqd_http) != len(nsqd):
        raise NSQOptionError("option 'nsqdHttpAddresses' must list the same nsqds as "
                             f"'nsqdTcpAddresses' ({len(nsqd)} addresses, got {len(nsqd_http)})")
    if pattern is not None and not (lookupd or nsqd_http):
        raise NSQOptionError("option 'topicPattern' needs a list of topics to match: give "
                             "'lookupdHttpAddresses' (its /topics), or 'nsqdHttpAddresses' "
                             "with 'nsqdTcpAddresses' (their /stats)")
    min_rows = given.get("minMessagesPerTrigger")
    if min_rows is not None and not (lookupd or nsqd_http):
        raise NSQOptionError("option 'minMessagesPerTrigger' needs the backlog measured: "
                             "give 'lookupdHttpAddresses', or 'nsqdHttpAddresses' with "
                             "'nsqdTcpAddresses'")
    max_rows = given.get("maxMessagesPerTrigger")
    if min_rows is not None and max_rows is not None and min_rows > max_rows:
        raise NSQOptionError(f"option 'minMessagesPerTrigger' ({min_rows}) must not exceed "
                             f"'maxMessagesPerTrigger' ({max_rows})")
    spool = given.get("spoolPath")
    if streaming and spool is None:
        raise NSQOptionError(
            "option 'spoolPath' is required for streaming reads: a directory (local path or "
            "pyarrow filesystem URI such as hdfs://... or s3://...) that is durable and "
            "reachable from the driver and every executor; fetched messages are written "
            "there before they are FINished, so a re-executed batch replays them")
    max_in_flight: int = given.get("maxInFlight")
    # at most maxInFlight too, checked here (a bound that depends on another option)
    chunk: int = given.get("spoolChunkSize", max(1, max_in_flight // 2))
    if chunk > max_in_flight:
        raise NSQOptionError(f"option 'spoolChunkSize' ({chunk}) must not exceed "
                             f"'maxInFlight' ({max_in_flight}): nsqd sends no more than "
                             "maxInFlight messages before they are FINished")
    dead_letter = given.get("deadLetterPath")
    if given.get("maxAttempts") and dead_letter is None:
        if spool is None:
            raise NSQOptionError(
                "option 'maxAttempts' needs somewhere to put the messages over it: set "
                "'deadLetterPath' (a directory or pyarrow filesystem URI) or 'spoolPath' "
                "(they then go under <spoolPath>/_dead_letter)")
        base, sep, query = spool.partition("?")  # keep a URI's options (endpoint_override=)
        dead_letter = base.rstrip("/") + "/_dead_letter" + sep + query
    connection = _connection_options(given)
    return ReadOptions(
        topic=topics[0] if topics else "", topics=topics, topic_pattern=pattern,
        channel=channel, nsqd_tcp_addresses=nsqd, lookupd_http_addresses=lookupd,
        nsqd_http_addresses=nsqd_http, spool_chunk_size=chunk,
        dead_letter_path=dead_letter, connection=connection,
        **given.fields(),
        **_reader_cache_options(given, connection),
        **_copies_options(given, streaming),
    )


SUBSCRIPTION = ("topic", "topics", "topicPattern")


def _subscription(given: Given) -> tuple[tuple[str, ...], str | None]:
    """``topic`` / ``topics`` / ``topicPattern``, exactly one (Kafka's assign / subscribe /
    subscribePattern rule): the topics named, and the compiled-checked pattern."""
    chosen = [name for name in SUBSCRIPTION if given.given(name)]
    if len(chosen) != 1:
        what = "none" if not chosen else " and ".join(f"'{g}'" for g in chosen)
        raise NSQOptionError(
            f"give exactly one of the options 'topic' (one topic), 'topics' (a "
            f"comma-separated list) or 'topicPattern' (a regular expression over the "
            f"topics lookupd lists); got {what}")
    if chosen[0] == "topicPattern":
        return (), given.get("topicPattern")
    if chosen[0] == "topic":
        return (given.get("topic"),), None
    topics: tuple[str, ...] = given.get("topics")
    return topics, None


def _reader_cache_options(given: Given, connection: Mapping[str, Any]) -> dict[str, Any]:
    """``readerCacheIdleTimeout``: a paused cached Reader may hold messages in flight on
    nsqd, so it must be closed (requeueing them) well before nsqd's msg_timeout would
    redeliver them elsewhere. The one place this is decided: from the parsed
    ``connection`` (``msgTimeout`` or ``nsq.msg_timeout``, the value the Reader
    negotiates; else nsqd's default), the idle timeout is at most half of it; the default
    is lowered to that half, a larger given value is refused (its own bounds, > 0 .. 300,
    are its row's)."""
    msg_timeout = float(connection.get("msg_timeout") or NSQD_MSG_TIMEOUT)
    limit = msg_timeout * READER_CACHE_SHARE_OF_MSG_TIMEOUT
    idle: float = given.get("readerCacheIdleTimeout",
                            min(READ["readerCacheIdleTimeout"].default, limit))
    if idle > limit:
        said = ("nsqd's default --msg-timeout" if connection.get("msg_timeout") is None
                else "from option 'msgTimeout' or 'nsq.msg_timeout'")
        raise NSQOptionError(
            f"option 'readerCacheIdleTimeout' ({idle:g} s) must be at most half of "
            f"'msgTimeout' / 'nsq.msg_timeout', the connection's msg_timeout "
            f"({msg_timeout:g} s, {said}): a cached Reader may hold messages that nsqd "
            f"would otherwise redeliver elsewhere; set readerCacheIdleTimeout to at most "
            f"{limit:g}, or raise msgTimeout (ms) within your nsqd's --max-msg-timeout")
    return {"reader_cache_idle_timeout": idle}


def _copies_options(given: Given, streaming: bool) -> dict[str, Any]:
    """``dropCopies``: on by default for streaming reads. A batch read returns every
    copy (it has no spool to order its chunks in): asking it to drop them is refused
    rather than ignored."""
    drop = given.get("dropCopies", streaming)
    if drop and not streaming:
        raise NSQOptionError(
            "option 'dropCopies' applies to streaming reads (spark.readStream): a batch "
            "read returns every copy of a publish, each with its 'publish_id' column; "
            "remove the option, or drop the copies in the query, e.g. rows with a null "
            "publish_id plus df.where(\"publish_id IS NOT NULL\")"
            ".dropDuplicates([\"publish_id\"])")
    return {"drop_copies": drop}


@dataclass(frozen=True)
class WriteOptions:
    """Validated writing options. Every field is set by :func:`parse_write_options`, with
    its row's default."""

    topic: str | None
    nsqd_tcp_addresses: list[str]
    lookupd_http_addresses: list[str]
    batch_size: int
    max_batch_bytes: int
    retries: int
    publish_timeout: float
    connection: dict[str, Any]
    log_level: str | None
    # publish identifiers (see .sink): stamped or not; the column holding each row's
    # idempotency key (None: derived from the query, batch, partition and row)
    publish_ids: bool
    idempotency_key_column: str | None
    replicas: int | None  # nsqds per message (Producer(replicas=N))
    write_quorum: int | None  # acknowledgements per publish (None: a majority)

    __repr__ = _redacted_repr


def parse_write_options(options: Mapping[str, Any]) -> WriteOptions:
    """Validate writing options; raises NSQOptionError naming the first bad option."""
    given = _WRITING.read(options, known=SPARK_OPTIONS, prefixes=("nsq.",),
                          context=" for writing (df.write/writeStream.format(\"nsq\"))",
                          unknown_hint=_UNKNOWN_HINT)
    nsqd, lookupd = _address_pair(given)
    _check_publish_ids(given, nsqd)
    return WriteOptions(nsqd_tcp_addresses=nsqd, lookupd_http_addresses=lookupd,
                        publish_ids=_publish_ids(given), connection=_connection_options(given),
                        **given.fields())


def _check_publish_ids(given: Given, nsqd: list[str]) -> None:
    """``replicas``, ``writeQuorum``: the Producer's rules, checked on the driver."""
    replicas = given.get("replicas")
    if replicas is not None and nsqd and replicas > len(nsqd):
        raise NSQOptionError(f"option 'replicas' ({replicas}) is more than the "
                             f"{len(nsqd)} nsqds of 'nsqdTcpAddresses': each copy of a "
                             "message goes to a different nsqd; give more addresses or "
                             f"replicas 1 .. {len(nsqd)}")
    quorum = given.get("writeQuorum")
    if quorum is not None and replicas is not None and quorum > replicas:
        raise NSQOptionError(f"option 'writeQuorum' ({quorum}) is more than 'replicas' "
                             f"({replicas}): a publish cannot be acknowledged by more nsqds "
                             f"than it goes to; give writeQuorum 1 .. {replicas}")


def _publish_ids(given: Given) -> bool:
    """``publishIds``: on by default exactly with replicas, as the Producer's
    ``publish_ids``; here with a key column too, which means nothing without them."""
    column = given.get("idempotencyKeyColumn")
    ids: bool = given.get("publishIds", given.get("replicas") is not None or column is not None)
    if column is not None and not ids:
        raise NSQOptionError("option 'idempotencyKeyColumn' needs publish ids: the key "
                             "names each row's publish id; remove publishIds=false (or the "
                             "key column)")
    return ids
