"""Options, each one row: connection options, and the Reader's and the Producer's.

:class:`ConnectionConfig` holds what one nsqd connection needs: timeouts, the features to
ask for in IDENTIFY (TLS, snappy, deflate, heartbeats, output buffering, sampling, message
timeout), TLS files, and the AUTH secret. The Reader and the Producer take the same options
as keyword arguments (``**connection_options``), with pynsq's names: ``tls_v1``,
``tls_options``, ``snappy``, ``deflate``, ``deflate_level``, ``heartbeat_interval``,
``output_buffer_size``, ``output_buffer_timeout``, ``sample_rate``, ``auth_secret``,
``msg_timeout``, ``user_agent``, ``hostname``, ``timeout``, ``requeue_delay``; and
go-nsq's ``local_address`` (``LocalAddr``), ``topology_zone`` and ``topology_region``.
:class:`ReaderOptions` and :class:`ProducerOptions` hold the Reader's and the Producer's
own options (the keyword arguments of :class:`nsq_spark.Reader` and
:class:`nsq_spark.Producer` that are values, not collaborators), checked once and handed
to the parts.

Each option is one row (:mod:`nsq_spark._options`), written where its field is declared:
its name, what it accepts (a unit and a range, choices, or a rule of its own), its
default, its documentation, its aliases (pynsq's spellings) and what it needs or excludes.
The checks at construction, the command line's flags, the generated option tables of the
docs site and their tests all read the rows (:data:`CONNECTION`, :data:`READER`,
:data:`PRODUCER`).

Units follow pynsq, so that ``import nsq_spark as nsq`` is a drop-in: every option is in
seconds (int or float) except ``output_buffer_timeout``, which is in milliseconds as in
pynsq. Seconds are converted to the milliseconds nsqd wants once, when IDENTIFY is built
(:attr:`ConnectionConfig.heartbeat_interval_ms`, :attr:`ConnectionConfig.msg_timeout_ms`).

Every option is checked at construction by the one number rule (:mod:`nsq_spark._validate`:
the right type -- a bool is not a number, a str is not one either --, finite, in range):
a bad value is a ConfigError naming the option, never a connection that nsqd refuses for
ever. ``auth_secret`` is never in a ``repr``.
"""

from __future__ import annotations

import os
import socket
import ssl
from dataclasses import dataclass, fields
from typing import Any, Callable, Mapping

from . import _validate as validate
from ._options import Option, OptionTable, check_fields, option, pick, rows_of
from ._addresses import ip_literal
from ._validate import MAX_SECONDS, SECONDS_OR_ZERO, Limit
from .errors import ConfigError, TLSError

from ._version import __version__

DEFAULT_USER_AGENT = f"nsq_spark/{__version__}"
_INT32_MAX = 2 ** 31 - 1


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _short_hostname() -> str:
    return socket.gethostname().split(".")[0]


def _in_seconds(name: str) -> Callable[[Any], str]:
    """The hint of a seconds option that pynsq also takes in seconds: a value that looks
    like milliseconds is said to be, with what it would be in seconds."""
    def hint(value: Any) -> str:
        if _is_number(value) and 1000 <= value <= MAX_SECONDS:
            return (f"{name} is in seconds, as in pynsq (did you give milliseconds? "
                    f"{value!r} ms is {name}={value / 1000:g})")
        return f"{name} is in seconds, as in pynsq"
    return hint


def _heartbeat_hint(value: Any) -> str:
    if _is_number(value) and 1000 <= value <= 60000:
        return (f"did you give milliseconds? {value!r} ms is "
                f"heartbeat_interval={value / 1000:g}")
    return "heartbeat_interval is in seconds, as in pynsq"


def _topology(value: Any, param: str) -> Any:
    if value is not None and len(value) > 255:
        raise ConfigError(f"{param} is {len(value)} characters long: give at most 255 "
                          "(a zone or region name, e.g. 'us-east-1a')")
    return value


def _pem_path(value: Any, param: str) -> Any:
    if value is not None and not isinstance(value, (str, os.PathLike)):
        raise ConfigError(f"{param}={value!r}: give the path of a PEM file, or None")
    return value


def _tls_options(value: Any, param: str) -> Any:
    if value is not None and not isinstance(value, (dict, ssl.SSLContext)):
        raise ConfigError(f"{param} ({type(value).__name__}): give a dict of pynsq TLS "
                          "options or an ssl.SSLContext")
    return value


def _secret(value: Any, param: str) -> Any:
    if value is not None and not isinstance(value, (str, bytes)):
        # the value is not shown: it may be a secret of the wrong type
        raise ConfigError(f"{param} ({type(value).__name__}): give the secret as str or "
                          "bytes, or None")
    return value


def _local_address(value: Any, param: str) -> Any:
    if value is None or ip_literal(value) is not None:
        return value
    raise ConfigError(f"{param}={value!r}: give the local IP address to dial from, "
                      "without a port (e.g. '127.0.0.2' or '::1'; the port is chosen by the "
                      "operating system), or None")


#: nsqd: -1 disables, 0 is its default, else at least 64 bytes / 1 ms
_NSQD_DEFAULT = {-1: "off", 0: "nsqd's default"}


@dataclass
class ConnectionConfig:
    """Options for one nsqd connection. Build with keywords, or with
    :meth:`from_options` which also accepts pynsq's names and rejects unknown ones.
    Each field is a row (:data:`CONNECTION`): its bounds and documentation are there."""

    # -- local timeouts (seconds) -----------------------------------------------------------
    connect_timeout: float = option(
        5.0, kind="seconds", aliases=("timeout",),
        doc="Seconds to open the TCP connection (pynsq's ``timeout``).")
    response_timeout: float = option(
        10.0, kind="seconds",
        doc="Seconds for the whole handshake (IDENTIFY, TLS, compression, AUTH together) "
        "and for each answer to a command (SUB, PUB, MPUB, DPUB, CLS); a missing answer "
        "closes the connection with NSQTimeoutError. A server that drips bytes cannot "
        "stretch it.")
    close_timeout: float = option(
        5.0, kind="seconds",
        doc="Seconds ``close()`` waits for nsqd's CLOSE_WAIT after CLS before closing "
        "anyway.")

    # -- IDENTIFY: who we are -----------------------------------------------------------------
    client_id: str | None = option(
        None, kind="text", none="the default",
        doc="Identifier nsqd shows in its stats; default: the short host name.")
    hostname: str | None = option(
        None, kind="text", none="the default",
        doc="Host name nsqd shows in its stats; default: the full host name.")
    user_agent: str = option(
        DEFAULT_USER_AGENT, kind="text",
        doc="Client library name/version nsqd shows in its stats.")
    topology_zone: str | None = option(
        None, kind="text", none="not sent", check=_topology,
        doc="Topology hint sent in IDENTIFY as ``topology_zone`` (go-nsq's "
        "``TopologyZone``): the zone (e.g. a data centre's availability zone) this client "
        "runs in; None: not sent. An EXPERIMENT on nsq's main branch (topology-aware "
        "consumption: nsqd prefers same-zone consumers); nsqd v1.3.0 ignores it. Our "
        "lookupd discovery reads it too. A non-empty string of at most 255 characters.")
    topology_region: str | None = option(
        None, kind="text", none="not sent", check=_topology,
        doc="Topology hint sent in IDENTIFY as ``topology_region`` (go-nsq's "
        "``TopologyRegion``): the region this client runs in; None: not sent. Same "
        "experiment as ``topology_zone``; nsqd v1.3.0 ignores it. A non-empty string of "
        "at most 255 characters.")
    feature_negotiation: bool = option(
        True, kind="flag",
        doc="Ask nsqd for a JSON IDENTIFY answer (needed for every feature below).")

    # -- IDENTIFY: features (nsqd may refuse or clamp; the answer is obeyed) ----------------
    heartbeat_interval: float = option(
        30, kind="seconds", limit=Limit("seconds", 1, 60), special={-1: "off"},
        hint=_heartbeat_hint,
        doc="SECONDS (int or float, 1..60) between nsqd's heartbeats, as in pynsq; sent to "
        "nsqd in milliseconds. -1 disables them (then nsqd refuses SUB). The connection is "
        "declared dead after two missed intervals.")
    output_buffer_size: int | None = option(
        None, kind="int", limit=Limit("bytes", 64, _INT32_MAX), special=_NSQD_DEFAULT,
        none="nsqd's default",
        doc="Bytes nsqd buffers before writing to us; None: nsqd's default (16 KiB); -1 "
        "disables.")
    output_buffer_timeout: int | None = option(
        None, kind="int", limit=Limit("milliseconds", 1, _INT32_MAX),
        special=_NSQD_DEFAULT, none="nsqd's default",
        hint="output_buffer_timeout is in milliseconds, as in pynsq",
        doc="MILLISECONDS (int, as in pynsq) nsqd waits before flushing its buffer; None: "
        "nsqd's default (250 ms); -1 disables (more syscalls on nsqd, lower latency).")
    tls_v1: bool = option(
        False, kind="flag",
        doc="Upgrade to TLS after IDENTIFY (nsqd needs ``--tls-cert``/``--tls-key``).")
    tls_options: dict[str, Any] | ssl.SSLContext | None = option(
        None, check=_tls_options,
        doc="pynsq-style TLS options: a dict with ``ca_certs``, ``certfile``, ``keyfile``, "
        "``cert_reqs`` (``ssl.CERT_NONE`` disables verification), ``check_hostname``; or "
        "a ready ``ssl.SSLContext`` used as is.")
    tls_ca_file: str | None = option(
        None, check=_pem_path, aliases=("tls_ca_certs",),
        doc="CA bundle that signs nsqd's certificate (default: the system's trust store).")
    tls_cert_file: str | None = option(
        None, check=_pem_path, aliases=("tls_certfile",),
        doc="Client certificate (for nsqd ``--tls-client-auth-policy``), with its key.")
    tls_key_file: str | None = option(
        None, check=_pem_path, aliases=("tls_keyfile",),
        doc="Key of the client certificate (may be inside ``tls_cert_file``).")
    tls_verify: bool = option(
        True, kind="flag",
        doc="Verify nsqd's certificate (on by default; turn off only for testing).")
    tls_check_hostname: bool | None = option(
        None, kind="flag", none="same as tls_verify",
        doc="Check that the certificate names the host connected to; default: same as "
        "tls_verify.")
    tls_server_hostname: str | None = option(
        None, kind="text", none="the default",
        doc="Name to verify and send in SNI instead of the connected host.")
    snappy: bool = option(
        False, kind="flag", excludes=("deflate",), why="nsqd refuses both at once",
        doc="Snappy stream compression (nsqd ``--snappy``, on by default there). Excludes "
        "deflate.")
    deflate: bool = option(
        False, kind="flag",
        doc="Deflate stream compression (nsqd ``--deflate``). Excludes snappy.")
    deflate_level: int = option(
        6, kind="int", limit=Limit("level", 1, 9),
        doc="Deflate level 1..9 (nsqd clamps it to its ``--max-deflate-level``).")
    sample_rate: int = option(
        0, kind="int", limit=Limit("percent", 0, 99), special={0: "every message"},
        doc="Percentage (0..99) of the channel's messages nsqd sends this consumer; 0: all.")
    msg_timeout: float | None = option(
        None, kind="seconds", limit=Limit("seconds", 1, MAX_SECONDS),
        none="nsqd's --msg-timeout", hint=_in_seconds("msg_timeout"),
        doc="SECONDS (int or float, at least 1) nsqd waits for FIN/REQ/TOUCH before "
        "redelivering a message sent on this connection, as in pynsq; sent to nsqd in "
        "milliseconds (nsqd caps it at its ``--max-msg-timeout``). None: nsqd's "
        "``--msg-timeout`` (60 s).")
    auth_secret: str | bytes | None = option(
        None, check=_secret, secret=True,
        doc="Secret sent with AUTH when nsqd says ``auth_required`` (never logged).")

    # -- local behaviour ----------------------------------------------------------------------
    local_address: str | None = option(
        None, check=_local_address,
        doc="The local IP address to dial nsqd from (go-nsq's ``LocalAddr``), e.g. "
        "``\"127.0.0.2\"`` or ``\"10.0.0.5\"`` on a host with several interfaces; the port "
        "is chosen by the operating system. None: the operating system chooses the "
        "address too. Used by the consumer's and the producer's connections alike.")
    requeue_delay: float = option(
        90.0, kind="seconds", limit=SECONDS_OR_ZERO,
        hint="requeue_delay is in seconds, as in pynsq",
        doc="SECONDS (int or float): base of the default delay for requeues that give "
        "none, which is ``requeue_delay * attempts`` (pynsq's ``requeue_delay``), capped "
        "by the Reader's ``max_requeue_delay`` (seconds).")
    max_frame_size: int = option(
        64 * 1024 * 1024, kind="int",
        # frames plus a read must fit the int32 offsets of MessageBlock (and of Arrow)
        limit=Limit("bytes", 64, 1 << 30),
        doc="Frames announcing more bytes than this are treated as a corrupt stream.")
    read_size: int = option(
        1024 * 1024, kind="int", limit=Limit("bytes", 4096, 1 << 28),
        doc="Bytes asked for per socket read on the consumer path; every frame completed "
        "by one read is decoded in one call.")

    def __post_init__(self) -> None:
        self.validate()

    @classmethod
    def from_options(cls, **options: Any) -> "ConnectionConfig":
        """Build from keyword options (pynsq names accepted); unknown names raise
        ConfigError naming the closest valid option."""
        kwargs: dict[str, Any] = {}
        for key, value in options.items():
            row = CONNECTION.find(key)
            if row is None:
                raise CONNECTION.unknown(key)
            kwargs[row.attr] = value
        return cls(**kwargs)

    def replace(self, **options: Any) -> "ConnectionConfig":
        """A copy with some options changed (same names as from_options)."""
        current = {f.name: getattr(self, f.name) for f in fields(self)}
        for key, value in options.items():
            row = CONNECTION.find(key)
            current[row.attr if row is not None else key] = value
        return type(self).from_options(**current)

    def validate(self) -> None:
        """Check every option by its row (:data:`CONNECTION`: the one rule of
        :mod:`nsq_spark._validate`: right type, finite, in range); raises ConfigError naming
        the option and the fix."""
        check_fields(self, CONNECTION)

    # -- derived ----------------------------------------------------------------------------

    @property
    def heartbeat_interval_ms(self) -> int:
        """``heartbeat_interval`` in the milliseconds nsqd wants (-1: off)."""
        hb = self.heartbeat_interval
        return -1 if hb == -1 else round(hb * 1000)

    @property
    def msg_timeout_ms(self) -> int | None:
        """``msg_timeout`` in the milliseconds nsqd wants (None: nsqd's default)."""
        mt = self.msg_timeout
        return None if mt is None else round(mt * 1000)

    @property
    def source_ip(self) -> str | None:
        """The bare IP of ``local_address`` to bind before dialing (IPv6 may be given in
        brackets); None: the operating system chooses."""
        return ip_literal(self.local_address)  # checked at construction

    def local_address_hint(self) -> str:
        """What a failed connect adds to its error when ``local_address`` is set."""
        if self.local_address is None:
            return ""
        return (f" (dialing from local_address={self.local_address!r}: is that address one "
                "of this host's, and can it reach nsqd?)")

    def identify_payload(self) -> dict[str, Any]:
        """The IDENTIFY body: what we are and which features we ask for."""
        payload: dict[str, Any] = {
            "client_id": self.client_id or _short_hostname(),
            "hostname": self.hostname or socket.gethostname(),
            "user_agent": self.user_agent,
            "feature_negotiation": self.feature_negotiation,
            "heartbeat_interval": self.heartbeat_interval_ms,
            "tls_v1": bool(self.tls_v1),
            "snappy": bool(self.snappy),
            "deflate": bool(self.deflate),
            "sample_rate": self.sample_rate,
        }
        if self.deflate:
            payload["deflate_level"] = self.deflate_level
        if self.output_buffer_size is not None:
            payload["output_buffer_size"] = self.output_buffer_size
        if self.output_buffer_timeout is not None:
            payload["output_buffer_timeout"] = self.output_buffer_timeout
        if self.msg_timeout is not None:
            payload["msg_timeout"] = self.msg_timeout_ms
        # the topology experiment's keys: sent only when set (nsqd v1.3.0 ignores them)
        if self.topology_zone is not None:
            payload["topology_zone"] = self.topology_zone
        if self.topology_region is not None:
            payload["topology_region"] = self.topology_region
        return payload

    def ssl_context(self) -> ssl.SSLContext:
        """The client-side SSLContext for the TLS upgrade (verification on by default)."""
        opts = self.tls_options
        if isinstance(opts, ssl.SSLContext):
            return opts
        opts = dict(opts or {})
        ca = opts.pop("ca_certs", None) or self.tls_ca_file
        cert = opts.pop("certfile", None) or self.tls_cert_file
        key = opts.pop("keyfile", None) or self.tls_key_file
        verify = self.tls_verify
        if "cert_reqs" in opts:
            verify = opts.pop("cert_reqs") != ssl.CERT_NONE
        check_hostname = opts.pop("check_hostname", self.tls_check_hostname)
        if check_hostname is None:
            check_hostname = verify
        # ssl's own errors name no file ("[Errno 2] No such file or directory"): each file
        # is opened first, so a missing or unreadable one is told with its option and path
        for name, path in (("tls_ca_file", ca), ("tls_cert_file", cert), ("tls_key_file", key)):
            if path:
                _readable(name, path)
        try:
            ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca)
        except (OSError, ssl.SSLError) as exc:
            raise TLSError(f"tls_ca_file {str(ca)!r} is not a PEM file of CA certificates "
                           f"({exc}); give the CA that signed nsqd's certificate") from exc
        if not verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        else:
            ctx.check_hostname = bool(check_hostname)
        if cert:
            try:
                ctx.load_cert_chain(cert, key)
            except (OSError, ssl.SSLError) as exc:
                raise TLSError(
                    f"tls_cert_file {str(cert)!r}"
                    + (f" with tls_key_file {str(key)!r}" if key else "")
                    + f" is not a client certificate and its key in PEM ({exc}); give the "
                    "certificate file and, unless it holds the key too, the key file") from exc
        return ctx


def _readable(name: str, path: Any) -> None:
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise TLSError(f"{name} {str(path)!r} cannot be read: {exc.strerror or exc}; give "
                       "the path of a readable PEM file") from exc


CONNECTION: OptionTable = rows_of(ConnectionConfig, what="connection option")
"""The rows of :class:`ConnectionConfig` (aliases: pynsq's names)."""


# -- the Reader's and the Producer's options ---------------------------------------------
#
# Rows here, next to the connection options, so that every value a user gives is checked
# by one rule (nsq_spark._validate) at construction; the facades build these first and hand
# them to their parts. Collaborators (handlers, deduplicators, factories, telemetry) are
# not options: they stay arguments of the facades.

#: nsqd counts a message's attempts in 16 bits.
MAX_ATTEMPTS = 65535

#: The Reader's ``backoff_strategy`` values (go-nsq's ``BackoffStrategy``): how long the
#: backoff window at level ``n`` lasts, ``backoff_multiplier`` seconds being the unit and
#: ``max_backoff_duration`` the cap:
#:
#: * ``"exponential"`` (the default, shaped as go-nsq's ``ExponentialStrategy``):
#:   ``backoff_multiplier * 2 ** (n - 1)`` seconds, so the first window is
#:   ``backoff_multiplier``. Deliberately not go-nsq's numbers: its ``Calculate`` is
#:   ``BackoffMultiplier * 2^n``, a first window of twice the multiplier (2 s by
#:   default); ``backoff_multiplier=2`` gives go-nsq's windows;
#: * ``"full_jitter"`` (shaped as go-nsq's ``FullJitterStrategy``, AWS's "full jitter"): a
#:   uniformly random duration from 0 up to that exponential one, capped before the draw
#:   (go-nsq draws below ``BackoffMultiplier * 2^n`` and caps after), so that many
#:   consumers failing at once do not all come back at the same moment.
#:
#: See :mod:`nsq_spark._consumer.backoff` (and pynsq's linear timer, which neither follows).
BACKOFF_STRATEGIES = ("exponential", "full_jitter")

#: The most handler threads ``concurrency`` may ask for.
MAX_CONCURRENCY = 1024
#: The most nsqds ``lookupd_max_producers`` may let a Reader dial from one lookupd poll.
MAX_LOOKUPD_PRODUCERS = 1_000_000

#: The most copies ``Producer(replicas=...)`` may ask for (a sanity bound; the nsqd
#: addresses given bound it first).
MAX_REPLICAS = 1024


@dataclass(frozen=True)
class ReaderOptions:
    """The :class:`nsq_spark.Reader`'s own options (its keyword arguments that are values,
    with the same names, defaults and meanings), checked at construction and handed to
    the Reader's parts. Each field is a row (:data:`READER`)."""

    max_tries: int = option(
        5, kind="int", limit=Limit("deliveries", 0, MAX_ATTEMPTS),
        special={0: "never give up"},
        doc="messages delivered more often than this go to :meth:`giving_up`, then are "
        "finished (requeued if it raises); 0 means never give up.")
    # 0 is refused, as pynsq does: a Reader that never receives, silently, is a mistake
    # far more often than a plan; pausing is explicit (set_max_in_flight(0), go-nsq's way)
    max_in_flight: int = option(
        1, kind="int", limit=Limit("messages", 1, _INT32_MAX),
        hint="0 would never receive a message; to start paused, construct with "
        "max_in_flight >= 1 and call set_max_in_flight(0) before run()",
        doc="the most messages in flight over all connections, spread evenly; at least 1 "
        "(0 is refused, as by pynsq: to start paused, call :meth:`set_max_in_flight` "
        "with 0 before :func:`run`).")
    lookupd_poll_interval: float = option(
        60, kind="seconds", doc="seconds between lookupd polls.")
    low_rdy_idle_timeout: float = option(
        10, kind="seconds", limit=SECONDS_OR_ZERO,
        doc="seconds without a message after which a connection gives its RDY up, when "
        "``max_in_flight`` is below the number of connections.")
    max_backoff_duration: float = option(
        128, kind="seconds", limit=SECONDS_OR_ZERO, special={0: "no backoff"},
        doc="the longest backoff window in seconds; 0 turns backoff off.")
    lookupd_poll_jitter: float = option(
        0.3, kind="number", limit=Limit("", 0, 1), unit="fraction of lookupd_poll_interval",
        hint="a fraction of lookupd_poll_interval",
        doc="fraction (0..1) of the poll interval added at random.")
    lookupd_connect_timeout: float = option(
        1, kind="seconds",
        doc="seconds, per lookupd request: the connect (a slow lookupd never holds back "
        "what the others answered: see :mod:`nsq_spark._lookupd`).")
    lookupd_request_timeout: float = option(
        2, kind="seconds",
        doc="seconds, per lookupd request: the whole request however slowly a lookupd "
        "answers (a slow lookupd never holds back what the others answered: see "
        ":mod:`nsq_spark._lookupd`).")
    max_requeue_delay: float = option(
        15 * 60, kind="seconds", limit=SECONDS_OR_ZERO,
        doc="cap, in seconds, of the default requeue delay.")
    backoff_multiplier: float = option(
        1.0, kind="seconds",
        doc="seconds of the first backoff window (doubling per level); go-nsq's first "
        "window is twice its ``BackoffMultiplier`` (see ``backoff_strategy``).")
    rdy_redistribute_interval: float = option(
        5.0, kind="seconds", doc="seconds between RDY redistribution rounds.")
    reconnect_initial: float = option(
        1.0, kind="seconds",
        doc="seconds, the first wait of the exponential reconnect backoff of direct nsqd "
        "addresses (plus up to ``reconnect_initial`` of jitter).")
    reconnect_max: float = option(
        60.0, kind="seconds",
        doc="seconds, the longest wait of the exponential reconnect backoff of direct "
        "nsqd addresses.")
    drain_timeout: float = option(
        5.0, kind="seconds", limit=SECONDS_OR_ZERO,
        doc="seconds :meth:`close` lets in-flight handlers finish before it requeues what "
        "is still unanswered.")
    backoff_strategy: str = option(
        "exponential", kind="choice", choices=BACKOFF_STRATEGIES,
        doc="how long backoff windows last (go-nsq's ``BackoffStrategy``): "
        "``\"exponential\"`` (default: ``backoff_multiplier * 2 ** (level - 1)`` seconds, "
        "at most ``max_backoff_duration``) or ``\"full_jitter\"`` (a uniformly random "
        "duration from 0 up to that, so that many consumers do not resume together). "
        "Deliberately one level below go-nsq's numbers, whose ``ExponentialStrategy`` is "
        "``BackoffMultiplier * 2^level`` (first window 2 s by default, ours 1 s; "
        "``backoff_multiplier=2`` gives go-nsq's), and its full jitter draws below that "
        "uncapped bound (ours below the capped one); pynsq's linear timer is neither (see "
        ":mod:`~nsq_spark._consumer.backoff`).")
    low_rdy_timeout: float | None = option(
        None, kind="seconds",
        none="one random holder gives its RDY up per redistribution round",
        hint="seconds a connection may hold RDY while others wait (go-nsq: 30)",
        doc="SECONDS (> 0, at most a year) a connection may hold RDY, busy or not, when "
        "``max_in_flight`` is below the number of connections (go-nsq's "
        "``LowRdyTimeout``, 30 s there): then it gives its RDY to one that waits. None "
        "(default): instead, at each redistribution round (``rdy_redistribute_interval``) "
        "one random holder gives its RDY up while others wait. Idle holders give RDY up "
        "after ``low_rdy_idle_timeout`` either way.")
    concurrency: int = option(
        1, kind="int", limit=Limit("handler threads", 1, MAX_CONCURRENCY),
        special={1: "on the IO loop"},
        doc="THREADS (1..1024, default 1) running a blocking ``message_handler`` (go-nsq's "
        "``AddConcurrentHandlers``). 1: on the loop thread, as before. N > 1: a bounded "
        "pool of N threads; messages are handled in no particular order; a message counts "
        "in flight from the moment it is queued for the pool until it is answered, so "
        "``max_in_flight`` bounds queued and running messages together (give "
        "``max_in_flight >= concurrency`` to keep every thread busy). Not for "
        "``batch_handler`` nor ``async def`` handlers (ConfigError).")
    open_envelopes: bool = option(
        True, kind="flag",
        doc="open publish envelopes (default True): a body stamped by a "
        "``Producer(publish_ids=True)`` or ``replicas`` reaches the handler as it was "
        "published, with ``message.publish_id`` set; a damaged envelope is handed over "
        "whole, with no ``publish_id`` (``stats()[\"damaged_envelopes\"]``, a WARNING). "
        "False: bodies as nsqd delivered them (open them with "
        ":func:`nsq_spark.envelope.open_body`). Costs about 17 ns a message on a topic "
        "without envelopes.")
    lookupd_max_producers: int = option(
        1000, kind="int", limit=Limit("nsqds per lookupd poll", 1, MAX_LOOKUPD_PRODUCERS),
        hint="the most nsqds dialled from one lookupd poll",
        doc="NSQDS (1..1,000,000, default 1000): the most nsqds this Reader dials from one "
        "lookupd poll (after the topology preference and the ``discovery_filter``, in "
        "their order), so a lookupd that lists thousands of nsqds (broken or hostile) "
        "cannot make it open thousands of connections; the rest are skipped with one "
        "WARNING naming how many and the first of them (again only when the set skipped "
        "changes). Raise it for a topic carried by more nsqds.")
    lookupd_authorization: bool = option(
        True, kind="flag",
        doc="send the ``auth_secret`` connection option to every lookupd whose address has "
        "no user info, as ``Authorization: Bearer <auth_secret>`` (default True, as "
        "go-nsq's ``LookupdAuthorization``; no header without an ``auth_secret``). A "
        "lookupd address with user info (``http://user:password@host:4161``) sends that "
        "as ``Authorization: Basic`` instead. Secrets are never shown: "
        "``lookupd_http_addresses`` and every log line and error show the addresses "
        "without user info.")

    def __post_init__(self) -> None:
        check_fields(self, READER)

    @classmethod
    def of(cls, arguments: Mapping[str, Any]) -> "ReaderOptions":
        """The options among ``arguments`` (a facade's arguments by name: the Reader
        passes its ``locals()``); checked, ConfigError naming the first bad one."""
        return cls(**pick(READER, arguments))


READER: OptionTable = rows_of(ReaderOptions, what="Reader option")
"""The rows of :class:`ReaderOptions`."""


FSYNC_ALWAYS, FSYNC_NEVER = "always", "never"


def check_fsync(value: Any, param: str = "spool_fsync") -> Any:
    """A spool's fsync policy: ``"always"``, ``"never"`` (or None), or an interval in
    milliseconds (an int > 0); else ConfigError naming ``param``."""
    if value is None or value in (FSYNC_ALWAYS, FSYNC_NEVER) or (
            isinstance(value, int) and not isinstance(value, bool) and value > 0):
        return value
    raise ConfigError(f"{param}={value!r}: use 'always' (sync on every call), an interval "
                      "in milliseconds (int > 0), or 'never'")


def _fsync_text(text: str, param: str) -> Any:
    """``--spool-fsync`` / a policy given as text: always, never, or milliseconds."""
    try:
        return check_fsync(text if text in (FSYNC_ALWAYS, FSYNC_NEVER) else int(text), param)
    except ValueError:
        raise ConfigError(f"{param} {text!r}: use 'always', 'never', or an interval in "
                          "ms (an int > 0)") from None


def _needs_spool_or_replicas(options: Any, needed: Option, rows: list[Option]) -> str:
    if needed.name == "replicas":
        return (f"write_quorum={options.write_quorum} needs replicas=N (the number of "
                "nsqd each message goes to): give both, or drop write_quorum")
    names = sorted(row.name for row in rows)
    one = len(names) == 1
    return (f"{', '.join(names)} only appl{'ies' if one else 'y'} to a spooling producer: "
            "also give spool_dir=<directory> (Producer(..., spool_dir=path, ...)), or "
            f"drop {'it' if one else 'them'}")


_SPOOLED = {"needs": "spool_dir"}


@dataclass(frozen=True)
class ProducerOptions:
    """The :class:`nsq_spark.Producer`'s own options (its keyword arguments other than
    the addresses, the connection options and ``telemetry``; same names, defaults and
    meanings), checked at construction and handed to its transports. Each field is a row
    (:data:`PRODUCER`)."""

    strategy: str = option(
        "round_robin", kind="choice", choices=("round_robin", "failover"),
        doc="``\"round_robin\"`` (default) spreads commands over the connected nsqd; "
        "``\"failover\"`` uses the first healthy one in the given order.")
    max_tries: int | None = option(
        None, kind="int", limit=Limit("attempts", 1, None), none="the mode's default",
        hint="1 = no retry",
        doc="attempts per publish for transient failures (1 = no retry); default None: no "
        "count, ``retry_deadline`` is the budget (an nsqd restart costs no error); 1 with "
        "``spool_dir`` (the spool retries without end itself).")
    retry_wait: float = option(
        0.1, kind="seconds", limit=SECONDS_OR_ZERO,
        doc="base of the exponential backoff between attempts, seconds (jittered).")
    retry_max_wait: float = option(
        2.0, kind="seconds", limit=SECONDS_OR_ZERO, doc="cap of one backoff wait, seconds.")
    retry_deadline: float | None = option(
        30.0, kind="seconds", none="no deadline",
        doc="seconds of retrying after the first failure (no wait sleeps past).")
    publish_timeout: float | None = option(
        60.0, kind="seconds", none="wait for ever",
        doc="the total wall time of one publish call in every mode (blocking, "
        "``publish_async``'s future, ``apublish``; TCP or HTTP), retries included: it "
        "caps ``retry_deadline``; past it, NSQTimeoutError naming this option (None: "
        "``retry_deadline`` bounds it). Inside it ``connect_timeout`` bounds each TCP "
        "connect, ``response_timeout`` each whole handshake and each answer.")
    max_msg_size: int | None = option(
        None, kind="int", limit=Limit("bytes", 1, _INT32_MAX), none="nsqd's limit only",
        doc="if set, bodies over this many bytes raise InvalidBodyError before anything is "
        "sent (nsqd itself answers E_BAD_MESSAGE and closes the connection).")
    # 4 bytes of MPUB count + 4 of length + 1 byte of body: the smallest useful MPUB
    max_mpub_bytes: int = option(
        5 * 1024 * 1024, kind="int", limit=Limit("bytes", 9, _INT32_MAX),
        doc="an mpublish whose MPUB body would exceed this is split into several MPUBs "
        "(nsqd's ``--max-body-size``, 5 MiB by default); each MPUB is atomic, the whole "
        "call is not.")
    blocking_connections: int = option(
        4, kind="int", limit=Limit("connections per nsqd", 1, 1024),
        doc="connections per nsqd shared by the threads that use the blocking calls (a "
        "thread always uses the same one).")
    publish_ids: bool | None = option(
        None, kind="flag", none="on exactly when replicas is given",
        doc="stamp each body with a publish id before it is sent (the version-3 envelope "
        "of :mod:`nsq_spark.envelope`, 27 bytes more, counted against ``max_msg_size``): "
        "a new id per message per call, or one derived from the ``idempotency_key`` given "
        "to the call; every copy and retry of it (the spool's resend after a crash too) "
        "carries the same id, so a consumer with ``dedup_key=\"publish_id\"`` handles each "
        "publish once. Default None: on exactly when ``replicas`` is given. An idempotency "
        "key without publish ids raises ConfigError (turning them on for one call would "
        "envelope some bodies and not others). ``False`` with ``replicas`` sends raw "
        "copies (as NSQ's ``to_nsq`` does), which a consumer can only tell apart by "
        "content.")
    # the nsqd given bound them further (the Producer checks: replicas <= addresses)
    replicas: int | None = option(
        None, kind="int", limit=Limit("nsqd per message", 1, MAX_REPLICAS),
        none="no replication", rule="; at most the nsqd given",
        hint="the number of distinct nsqd each message goes to",
        doc="put each message (each MPUB batch as one unit) on this many distinct nsqd of "
        "those given (1 .. their number; needs TCP or HTTP addresses, not a "
        "``producer_factory``): the first rotates over the healthy nsqd, the others follow "
        "in order, a failed one is replaced by the next one not holding it. Default None: "
        "one copy, ``strategy`` picks the nsqd. See ``docs/publishing.md``.")
    write_quorum: int | None = option(
        None, kind="int", limit=Limit("nsqd", 1, MAX_REPLICAS),
        none="a majority of replicas", rule="; at most replicas", needs="replicas",
        doc="with ``replicas``: a publish returns once this many nsqd acknowledged it (the "
        "blocking calls once every replica answered; futures and asyncio at the quorum), "
        "else :class:`~nsq_spark.errors.ReplicationError` within ``publish_timeout``. "
        "Default None: a majority, ``replicas // 2 + 1``. With ``spool_dir`` the drain "
        "moves on at the quorum and keeps each message on disk until all ``replicas`` "
        "have it.")
    spool_dir: str | os.PathLike[str] | None = option(
        None,
        doc="publish through a durable local spool in this directory (see "
        ":mod:`nsq_spark.spool`): every call returns once the message is in the spool, a "
        "background thread sends it and keeps it until nsqd acknowledged it; "
        ":meth:`flush` waits for that. The options below apply only with ``spool_dir`` "
        "(changing one without it raises ConfigError).")
    spool_fsync: str | int | None = option(
        FSYNC_ALWAYS, check=check_fsync, parse=_fsync_text, **_SPOOLED,
        doc="``\"always\"`` (sync before returning), an interval in ms, or ``\"never\"``.")
    spool_max_bytes: int = option(
        1 << 30, kind="int", limit=Limit("bytes", 1, None), **_SPOOLED,
        doc="bound on the directory's segment files.")
    spool_full: str = option(
        "block", kind="choice", choices=("block", "raise"), **_SPOOLED,
        doc="``\"block\"`` or ``\"raise\"`` (SpoolFullError) when the bound is reached.")
    spool_block_timeout: float | None = option(
        None, kind="seconds", limit=SECONDS_OR_ZERO, none="wait for ever", **_SPOOLED,
        doc="seconds ``\"block\"`` waits before raising (None: for ever).")
    message_id_digest: bool = option(
        False, kind="flag", **_SPOOLED,
        doc="wrap each body in the message-id envelope.")
    batch_size: int = option(
        1000, kind="int", limit=Limit("messages", 1, _INT32_MAX), **_SPOOLED,
        doc="messages per MPUB from the spool (also bounds duplicates per crash).")
    batch_bytes: int = option(
        1 << 20, kind="int", limit=Limit("bytes", 9, _INT32_MAX), **_SPOOLED,
        doc="bytes per MPUB from the spool (below nsqd's ``--max-body-size``).")
    rescan_interval: float = option(
        1.0, kind="seconds", **_SPOOLED,
        doc="seconds between two looks for segments left by other processes.")
    on_corrupt: Callable[..., None] | None = option(
        None, **_SPOOLED,
        doc="called with a :class:`~nsq_spark.spool._store.CorruptSegment` when a damaged "
        "spool tail is found.")
    on_rejected: Callable[[str, bytes, BaseException], None] | None = option(
        None, **_SPOOLED,
        doc="called ``(topic, body, exc)`` for a spooled message nsqd refused for good (it "
        "is also kept in ``spool_dir/rejected``; :meth:`redrive`).")
    on_error: Callable[[BaseException], None] | None = option(
        None, **_SPOOLED,
        doc="called ``(exc)`` when sending from the spool starts failing (the messages "
        "stay and are retried) and while it keeps failing, with the ERROR log: at most "
        "once per 30 s in all. The callbacks run in order on a thread of their own: one "
        "that blocks delays the callbacks after it, never the sending nor :meth:`close` "
        "past its ``timeout``.")
    producer_factory: Callable[[], Any] | None = option(
        None, **_SPOOLED,
        doc="builds what the spool sends through, a :class:`~nsq_spark.spool._drain.Sender` "
        "(default: a direct transport with the other options given here; ``max_tries`` 1 "
        "unless given: the spool retries).")

    def __post_init__(self) -> None:
        check_fields(self, PRODUCER, needs_error=_needs_spool_or_replicas)
        if self.write_quorum is not None and self.replicas is not None \
                and self.write_quorum > self.replicas:
            raise ConfigError(f"write_quorum={self.write_quorum} is more than "
                              f"replicas={self.replicas}: a publish cannot be acknowledged "
                              "by more nsqd than it is sent to; give write_quorum 1 .. "
                              f"{self.replicas}")
        if self.replicas is not None and self.producer_factory is not None:
            raise ConfigError("replicas needs the Producer's own connections to every "
                              "nsqd: drop producer_factory (or replicas)")

    @classmethod
    def of(cls, arguments: Mapping[str, Any]) -> "ProducerOptions":
        """The options among ``arguments`` (the Producer's arguments by name)."""
        return cls(**pick(PRODUCER, arguments))

    @property
    def spooled(self) -> bool:
        return self.spool_dir is not None


PRODUCER: OptionTable = rows_of(ProducerOptions, what="Producer option")
"""The rows of :class:`ProducerOptions`."""


def check_reader_options(arguments: Mapping[str, Any]) -> None:
    """The Reader's options among ``arguments`` (by name), checked by their rows
    (:class:`ReaderOptions`); ConfigError naming the first bad one."""
    ReaderOptions.of(arguments)


def check_producer_options(**options: Any) -> None:
    """The Producer's (and Writer's) options given, checked by their rows
    (:class:`ProducerOptions`); ConfigError naming the first bad one. ``max_tries`` None
    means the mode's default."""
    ProducerOptions(**options)


# -- units and bounds, by name (what the generated option tables print) -------------------
# Views of the rows above, for the docs site and its tests: nothing is written twice.

#: ConnectionConfig's numeric fields.
CONNECTION_LIMITS: dict[str, Limit] = CONNECTION.limits()
#: The Reader's numeric arguments.
READER_LIMITS: dict[str, Limit] = READER.limits()
#: The Producer's numeric arguments.
PRODUCER_LIMITS: dict[str, Limit] = PRODUCER.limits()
