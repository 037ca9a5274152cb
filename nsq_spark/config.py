"""Connection options, each documented where it is defined.

:class:`ConnectionConfig` holds what one nsqd connection needs: timeouts, the features to
ask for in IDENTIFY (TLS, snappy, deflate, heartbeats, output buffering, sampling, message
timeout), TLS files, and the AUTH secret. The Reader and the Producer take the same options
as keyword arguments (``**connection_options``), with pynsq's names: ``tls_v1``,
``tls_options``, ``snappy``, ``deflate``, ``deflate_level``, ``heartbeat_interval``,
``output_buffer_size``, ``output_buffer_timeout``, ``sample_rate``, ``auth_secret``,
``msg_timeout``, ``user_agent``, ``hostname``, ``timeout``, ``requeue_delay``; and
go-nsq's ``local_address`` (``LocalAddr``), ``topology_zone`` and ``topology_region``.

Units follow pynsq, so that ``import nsq_spark as nsq`` is a drop-in: every option is in
seconds (int or float) except ``output_buffer_timeout``, which is in milliseconds as in
pynsq. Seconds are converted to the milliseconds nsqd wants once, when IDENTIFY is built
(:attr:`ConnectionConfig.heartbeat_interval_ms`, :attr:`ConnectionConfig.msg_timeout_ms`).

Every option is checked at construction by the one number rule (:mod:`nsq_spark.validate`:
the right type -- a bool is not a number, a str is not one either --, finite, in range), and
so are the Reader's and the Producer's own numbers (:func:`check_reader_options`,
:func:`check_producer_options`): a bad value is a ConfigError naming the option, never a
connection that nsqd refuses for ever. ``auth_secret`` is never in a ``repr``.
"""

from __future__ import annotations

import difflib
import os
import socket
import ssl
from dataclasses import dataclass, field, fields
from typing import Any, Mapping

from . import validate
from .addresses import ip_literal
from .validate import MAX_SECONDS, Limit
from .errors import ConfigError, TLSError

from ._version import __version__

DEFAULT_USER_AGENT = f"nsq_spark/{__version__}"
_INT32_MAX = 2 ** 31 - 1

# pynsq spellings and other accepted aliases -> our field names
_ALIASES = {
    "timeout": "connect_timeout",
    "tls_ca_certs": "tls_ca_file",
    "tls_certfile": "tls_cert_file",
    "tls_keyfile": "tls_key_file",
}


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _short_hostname() -> str:
    return socket.gethostname().split(".")[0]


@dataclass
class ConnectionConfig:
    """Options for one nsqd connection. Build with keywords, or with
    :meth:`from_options` which also accepts pynsq's names and rejects unknown ones."""

    # -- local timeouts (seconds) -----------------------------------------------------------
    #: Seconds to open the TCP connection (pynsq's ``timeout``).
    connect_timeout: float = 5.0
    #: Seconds for the whole handshake (IDENTIFY, TLS, compression, AUTH together) and for
    #: each answer to a command (SUB, PUB, MPUB, DPUB, CLS); a missing answer closes the
    #: connection with NSQTimeoutError. A server that drips bytes cannot stretch it.
    response_timeout: float = 10.0
    #: Seconds ``close()`` waits for nsqd's CLOSE_WAIT after CLS before closing anyway.
    close_timeout: float = 5.0

    # -- IDENTIFY: who we are -----------------------------------------------------------------
    #: Identifier nsqd shows in its stats; default: the short host name.
    client_id: str | None = None
    #: Host name nsqd shows in its stats; default: the full host name.
    hostname: str | None = None
    #: Client library name/version nsqd shows in its stats.
    user_agent: str = DEFAULT_USER_AGENT
    #: Topology hint sent in IDENTIFY as ``topology_zone`` (go-nsq's ``TopologyZone``): the
    #: zone (e.g. a data centre's availability zone) this client runs in; None: not sent.
    #: An EXPERIMENT on nsq's main branch (topology-aware consumption: nsqd prefers
    #: same-zone consumers); nsqd v1.3.0 ignores it. Our lookupd discovery reads it too.
    #: A non-empty string of at most 255 characters.
    topology_zone: str | None = None
    #: Topology hint sent in IDENTIFY as ``topology_region`` (go-nsq's ``TopologyRegion``):
    #: the region this client runs in; None: not sent. Same experiment as
    #: ``topology_zone``; nsqd v1.3.0 ignores it. A non-empty string of at most 255 characters.
    topology_region: str | None = None
    #: Ask nsqd for a JSON IDENTIFY answer (needed for every feature below).
    feature_negotiation: bool = True

    # -- IDENTIFY: features (nsqd may refuse or clamp; the answer is obeyed) ----------------
    #: SECONDS (int or float, 1..60) between nsqd's heartbeats, as in pynsq; sent to nsqd
    #: in milliseconds. -1 disables them (then nsqd refuses SUB). The connection is
    #: declared dead after two missed intervals.
    heartbeat_interval: float = 30
    #: Bytes nsqd buffers before writing to us; None: nsqd's default (16 KiB); -1 disables.
    output_buffer_size: int | None = None
    #: MILLISECONDS (int, as in pynsq) nsqd waits before flushing its buffer; None: nsqd's
    #: default (250 ms); -1 disables (more syscalls on nsqd, lower latency).
    output_buffer_timeout: int | None = None
    #: Upgrade to TLS after IDENTIFY (nsqd needs ``--tls-cert``/``--tls-key``).
    tls_v1: bool = False
    #: pynsq-style TLS options: a dict with ``ca_certs``, ``certfile``, ``keyfile``,
    #: ``cert_reqs`` (``ssl.CERT_NONE`` disables verification), ``check_hostname``; or a
    #: ready ``ssl.SSLContext`` used as is.
    tls_options: dict[str, Any] | ssl.SSLContext | None = None
    #: CA bundle that signs nsqd's certificate (default: the system's trust store).
    tls_ca_file: str | None = None
    #: Client certificate (for nsqd ``--tls-client-auth-policy``), with its key.
    tls_cert_file: str | None = None
    #: Key of the client certificate (may be inside ``tls_cert_file``).
    tls_key_file: str | None = None
    #: Verify nsqd's certificate (on by default; turn off only for testing).
    tls_verify: bool = True
    #: Check that the certificate names the host connected to; default: same as tls_verify.
    tls_check_hostname: bool | None = None
    #: Name to verify and send in SNI instead of the connected host.
    tls_server_hostname: str | None = None
    #: Snappy stream compression (nsqd ``--snappy``, on by default there). Excludes deflate.
    snappy: bool = False
    #: Deflate stream compression (nsqd ``--deflate``). Excludes snappy.
    deflate: bool = False
    #: Deflate level 1..9 (nsqd clamps it to its ``--max-deflate-level``).
    deflate_level: int = 6
    #: Percentage (0..99) of the channel's messages nsqd sends this consumer; 0: all.
    sample_rate: int = 0
    #: SECONDS (int or float, at least 1) nsqd waits for FIN/REQ/TOUCH before redelivering
    #: a message sent on this connection, as in pynsq; sent to nsqd in milliseconds (nsqd
    #: caps it at its ``--max-msg-timeout``). None: nsqd's ``--msg-timeout`` (60 s).
    msg_timeout: float | None = None
    #: Secret sent with AUTH when nsqd says ``auth_required`` (never logged).
    auth_secret: str | bytes | None = field(default=None, repr=False)

    # -- local behaviour ----------------------------------------------------------------------
    #: The local IP address to dial nsqd from (go-nsq's ``LocalAddr``), e.g. ``"127.0.0.2"``
    #: or ``"10.0.0.5"`` on a host with several interfaces; the port is chosen by the
    #: operating system. None: the operating system chooses the address too. Used by the
    #: consumer's and the producer's connections alike.
    local_address: str | None = None
    #: SECONDS (int or float): base of the default delay for requeues that give none, which
    #: is ``requeue_delay * attempts`` (pynsq's ``requeue_delay``), capped by the Reader's
    #: ``max_requeue_delay`` (seconds).
    requeue_delay: float = 90.0
    #: Frames announcing more bytes than this are treated as a corrupt stream.
    max_frame_size: int = 64 * 1024 * 1024
    #: Bytes asked for per socket read on the consumer path; every frame completed by one
    #: read is decoded in one call.
    read_size: int = 1024 * 1024

    def __post_init__(self) -> None:
        self.validate()

    @classmethod
    def from_options(cls, **options: Any) -> "ConnectionConfig":
        """Build from keyword options (pynsq names accepted); unknown names raise
        ConfigError naming the closest valid option."""
        known = {f.name for f in fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, value in options.items():
            name = _ALIASES.get(key, key)
            if name not in known:
                close = difflib.get_close_matches(name, sorted(known | set(_ALIASES)), n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise ConfigError(f"unknown connection option {key!r}{hint}")
            kwargs[name] = value
        return cls(**kwargs)

    def replace(self, **options: Any) -> "ConnectionConfig":
        """A copy with some options changed (same names as from_options)."""
        current = {f.name: getattr(self, f.name) for f in fields(self)}
        for key, value in options.items():
            current[_ALIASES.get(key, key)] = value
        return type(self).from_options(**current)

    def validate(self) -> None:
        """Check every option by the one rule (:mod:`nsq_spark.validate`): right type,
        finite, in range; raises ConfigError naming the option and the fix."""
        v = validate
        for name in ("connect_timeout", "response_timeout", "close_timeout"):
            v.seconds(getattr(self, name), name)
        for name in ("client_id", "hostname", "tls_server_hostname"):
            v.text(getattr(self, name), name, none="the default", nonempty=True)
        v.text(self.user_agent, "user_agent", nonempty=True)
        for name in ("topology_zone", "topology_region"):
            value = v.text(getattr(self, name), name, none="not sent", nonempty=True)
            if value is not None and len(value) > 255:
                raise ConfigError(f"{name} is {len(value)} characters long: give at most 255 "
                                  "(a zone or region name, e.g. 'us-east-1a')")
        _check_local_address(self.local_address)
        for name in ("feature_negotiation", "tls_v1", "tls_verify", "snappy", "deflate"):
            v.flag(getattr(self, name), name)
        v.flag(self.tls_check_hostname, "tls_check_hostname", none="same as tls_verify")
        for name in ("tls_ca_file", "tls_cert_file", "tls_key_file"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, (str, os.PathLike)):
                raise ConfigError(f"{name}={value!r}: give the path of a PEM file, or None")
        hb = self.heartbeat_interval
        hint = (f"did you give milliseconds? {hb!r} ms is heartbeat_interval={hb / 1000:g}"
                if _is_number(hb) and 1000 <= hb <= 60000 else "")
        v.number(hb, "heartbeat_interval", lo=1, hi=60, unit="seconds", special={-1: "off"},
                 hint=hint or "heartbeat_interval is in seconds, as in pynsq")
        v.integer(self.deflate_level, "deflate_level", lo=1, hi=9)
        v.integer(self.sample_rate, "sample_rate", lo=0, hi=99, unit="percent",
                  hint="0 sends every message")
        if self.snappy and self.deflate:
            raise ConfigError("choose one of snappy and deflate: nsqd refuses both at once")
        mt = self.msg_timeout
        v.seconds(mt, "msg_timeout", lo=1, lo_open=False, none="nsqd's --msg-timeout",
                  hint="msg_timeout is in seconds, as in pynsq" + (
                      f" (did you give milliseconds? {mt!r} ms is msg_timeout={mt / 1000:g})"
                      if isinstance(mt, (int, float)) and 1000 <= mt <= MAX_SECONDS else ""))
        v.seconds(self.requeue_delay, "requeue_delay", lo_open=False,
                  hint="requeue_delay is in seconds, as in pynsq")
        # nsqd: -1 disables, 0 is its default, else at least 64 bytes / 1 ms
        v.integer(self.output_buffer_size, "output_buffer_size", lo=64, hi=_INT32_MAX,
                  unit="bytes", special={-1: "off", 0: "nsqd's default"},
                  none="nsqd's default")
        v.integer(self.output_buffer_timeout, "output_buffer_timeout", lo=1, hi=_INT32_MAX,
                  unit="milliseconds (as in pynsq)",
                  special={-1: "off", 0: "nsqd's default"}, none="nsqd's default")
        if self.tls_options is not None and not isinstance(self.tls_options, (dict, ssl.SSLContext)):
            raise ConfigError(f"tls_options ({type(self.tls_options).__name__}): give a dict "
                              "of pynsq TLS options or an ssl.SSLContext")
        secret = self.auth_secret
        if secret is not None and not isinstance(secret, (str, bytes)):
            # the value is not shown: it may be a secret of the wrong type
            raise ConfigError(f"auth_secret ({type(secret).__name__}): give the secret as "
                              "str or bytes, or None")
        v.integer(self.read_size, "read_size", lo=4096, hi=1 << 28, unit="bytes")
        # frames plus a read must fit the int32 offsets of MessageBlock (and of Arrow)
        v.integer(self.max_frame_size, "max_frame_size", lo=64, hi=1 << 30, unit="bytes")

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


def _check_local_address(value: Any) -> None:
    if value is None or ip_literal(value) is not None:
        return
    raise ConfigError(f"local_address={value!r}: give the local IP address to dial from, "
                      "without a port (e.g. '127.0.0.2' or '::1'; the port is chosen by the "
                      "operating system), or None")


# -- the Reader's and the Producer's own numbers ------------------------------------------
#
# Bounded here, next to the connection options, so that every number a user gives is
# checked by one rule (nsq_spark.validate) at construction; the facades call these first.

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
#: See :mod:`nsq_spark.consumer.backoff` (and pynsq's linear timer, which neither follows).
BACKOFF_STRATEGIES = ("exponential", "full_jitter")

#: The most handler threads ``concurrency`` may ask for.
MAX_CONCURRENCY = 1024
#: The most nsqds ``lookupd_max_producers`` may let a Reader dial from one lookupd poll.
MAX_LOOKUPD_PRODUCERS = 1_000_000

#: The most copies ``Producer(replicas=...)`` may ask for (a sanity bound; the nsqd
#: addresses given bound it first).
MAX_REPLICAS = 1024


def check_reader_options(arguments: Mapping[str, Any]) -> None:
    """The Reader's numeric arguments, looked up by name in ``arguments`` (the Reader
    passes its ``locals()``; see :class:`nsq_spark.Reader`); ConfigError naming the first
    bad one."""
    a, v = arguments, validate
    v.integer(a["max_tries"], "max_tries", lo=0, hi=MAX_ATTEMPTS, hint="0 never gives up")
    # 0 is refused, as pynsq does: a Reader that never receives, silently, is a mistake far
    # more often than a plan; pausing is explicit (set_max_in_flight(0), go-nsq's way)
    v.integer(a["max_in_flight"], "max_in_flight", lo=1, hi=_INT32_MAX,
              hint="0 would never receive a message; to start paused, construct with "
              "max_in_flight >= 1 and call set_max_in_flight(0) before run()")
    v.number(a["lookupd_poll_jitter"], "lookupd_poll_jitter", lo=0, hi=1,
             hint="a fraction of lookupd_poll_interval")
    for name in ("lookupd_poll_interval", "lookupd_connect_timeout", "lookupd_request_timeout",
                 "backoff_multiplier", "rdy_redistribute_interval", "reconnect_initial",
                 "reconnect_max"):
        v.seconds(a[name], name)
    v.seconds(a["max_backoff_duration"], "max_backoff_duration", lo_open=False,
              hint="0 turns backoff off")
    for name in ("low_rdy_idle_timeout", "max_requeue_delay", "drain_timeout"):
        v.seconds(a[name], name, lo_open=False)
    strategy = a["backoff_strategy"]
    if strategy not in BACKOFF_STRATEGIES:
        close = difflib.get_close_matches(str(strategy), BACKOFF_STRATEGIES, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ConfigError(f"backoff_strategy={strategy!r}: {hint}give one of "
                          + ", ".join(map(repr, BACKOFF_STRATEGIES)))
    v.seconds(a["low_rdy_timeout"], "low_rdy_timeout",
              none="one random holder gives its RDY up per redistribution round",
              hint="seconds a connection may hold RDY while others wait (go-nsq: 30)")
    v.integer(a["concurrency"], "concurrency", lo=1, hi=MAX_CONCURRENCY, unit="threads",
              hint="1 runs the handler on the loop thread, as before")
    v.integer(a["lookupd_max_producers"], "lookupd_max_producers", lo=1,
              hi=MAX_LOOKUPD_PRODUCERS, unit="nsqds",
              hint="the most nsqds dialled from one lookupd poll")


def check_producer_options(*, strategy: Any, max_tries: Any, retry_wait: Any,
                           retry_max_wait: Any, retry_deadline: Any, publish_timeout: Any,
                           max_msg_size: Any, max_mpub_bytes: Any, blocking_connections: Any,
                           replicas: Any, write_quorum: Any, spool_max_bytes: Any, spool_block_timeout: Any, batch_size: Any,
                           batch_bytes: Any, rescan_interval: Any) -> None:
    """The Producer's (and Writer's) arguments other than addresses, connection and
    callbacks (see :class:`nsq_spark.Producer`); ConfigError naming the first bad one.
    ``max_tries`` None means the mode's default."""
    v = validate
    if strategy not in ("round_robin", "failover"):
        raise ConfigError(f"strategy={strategy!r}: give 'round_robin' or 'failover'")
    v.integer(max_tries, "max_tries", lo=1, none="the default", hint="1 = no retry")
    v.seconds(retry_wait, "retry_wait", lo_open=False)
    v.seconds(retry_max_wait, "retry_max_wait", lo_open=False)
    v.seconds(retry_deadline, "retry_deadline", none="no deadline")
    v.seconds(publish_timeout, "publish_timeout", none="wait for ever")
    v.integer(max_msg_size, "max_msg_size", lo=1, hi=_INT32_MAX, unit="bytes",
              none="nsqd's limit only")
    # 4 bytes of MPUB count + 4 of length + 1 byte of body: the smallest useful MPUB
    v.integer(max_mpub_bytes, "max_mpub_bytes", lo=9, hi=_INT32_MAX, unit="bytes")
    v.integer(blocking_connections, "blocking_connections", lo=1, hi=1024)
    # the nsqd given bound them further (the Producer checks: replicas <= addresses,
    # write_quorum <= replicas)
    v.integer(replicas, "replicas", lo=1, hi=MAX_REPLICAS, none="no replication",
              hint="the number of distinct nsqd each message goes to")
    v.integer(write_quorum, "write_quorum", lo=1, hi=MAX_REPLICAS,
              none="a majority of replicas")
    v.integer(spool_max_bytes, "spool_max_bytes", lo=1, unit="bytes")
    v.seconds(spool_block_timeout, "spool_block_timeout", lo_open=False, none="wait for ever")
    v.integer(batch_size, "batch_size", lo=1, hi=_INT32_MAX)
    v.integer(batch_bytes, "batch_bytes", lo=9, hi=_INT32_MAX, unit="bytes")
    v.seconds(rescan_interval, "rescan_interval")


# -- machine-readable units and bounds (for the generated option tables) -------------------
#
# The checks above are the rule; these tables say the same in data, so that the docs site
# prints every numeric option's unit and bounds from here rather than from a hand-written
# copy (docs/hooks/generate.py). tests/test_docs_metadata.py probes each bound against the
# checks above (the bound accepted, one step past it refused), so the two cannot drift.

_SECONDS_POSITIVE = validate.SECONDS_POSITIVE
_SECONDS_OR_ZERO = validate.SECONDS_OR_ZERO

#: ConnectionConfig's numeric fields.
CONNECTION_LIMITS: dict[str, Limit] = {
    "connect_timeout": _SECONDS_POSITIVE,
    "response_timeout": _SECONDS_POSITIVE,
    "close_timeout": _SECONDS_POSITIVE,
    "heartbeat_interval": Limit("seconds", 1, 60, special="-1: off"),
    "output_buffer_size": Limit("bytes", 64, _INT32_MAX,
                                special="-1: off; 0 or None: nsqd's default"),
    "output_buffer_timeout": Limit("milliseconds", 1, _INT32_MAX,
                                   special="-1: off; 0 or None: nsqd's default"),
    "deflate_level": Limit("level", 1, 9),
    "sample_rate": Limit("percent", 0, 99, special="0: every message"),
    "msg_timeout": Limit("seconds", 1, MAX_SECONDS, special="None: nsqd's --msg-timeout"),
    "requeue_delay": _SECONDS_OR_ZERO,
    "max_frame_size": Limit("bytes", 64, 1 << 30),
    "read_size": Limit("bytes", 4096, 1 << 28),
}

#: The Reader's numeric arguments (checked by :func:`check_reader_options`).
READER_LIMITS: dict[str, Limit] = {
    "max_tries": Limit("deliveries", 0, MAX_ATTEMPTS, special="0: never give up"),
    "max_in_flight": Limit("messages", 1, _INT32_MAX),
    "lookupd_poll_interval": _SECONDS_POSITIVE,
    "low_rdy_idle_timeout": _SECONDS_OR_ZERO,
    "max_backoff_duration": Limit("seconds", 0, MAX_SECONDS, special="0: no backoff"),
    "lookupd_poll_jitter": Limit("fraction of lookupd_poll_interval", 0, 1),
    "lookupd_connect_timeout": _SECONDS_POSITIVE,
    "lookupd_request_timeout": _SECONDS_POSITIVE,
    "max_requeue_delay": _SECONDS_OR_ZERO,
    "backoff_multiplier": _SECONDS_POSITIVE,
    "rdy_redistribute_interval": _SECONDS_POSITIVE,
    "reconnect_initial": _SECONDS_POSITIVE,
    "reconnect_max": _SECONDS_POSITIVE,
    "drain_timeout": _SECONDS_OR_ZERO,
    "low_rdy_timeout": _SECONDS_POSITIVE._replace(
        special="None: one random holder gives its RDY up per redistribution round"),
    "concurrency": Limit("handler threads", 1, MAX_CONCURRENCY, special="1: on the IO loop"),
    "lookupd_max_producers": Limit("nsqds per lookupd poll", 1, MAX_LOOKUPD_PRODUCERS),
}

#: The Producer's numeric arguments (checked by :func:`check_producer_options`).
PRODUCER_LIMITS: dict[str, Limit] = {
    "max_tries": Limit("attempts", 1, None, special="None: the mode's default"),
    "retry_wait": _SECONDS_OR_ZERO,
    "retry_max_wait": _SECONDS_OR_ZERO,
    "retry_deadline": Limit("seconds", 0, MAX_SECONDS, lo_open=True,
                            special="None: no deadline"),
    "publish_timeout": Limit("seconds", 0, MAX_SECONDS, lo_open=True,
                             special="None: wait for ever"),
    "max_msg_size": Limit("bytes", 1, _INT32_MAX, special="None: nsqd's limit only"),
    "max_mpub_bytes": Limit("bytes", 9, _INT32_MAX),
    "blocking_connections": Limit("connections per nsqd", 1, 1024),
    "replicas": Limit("nsqd per message", 1, MAX_REPLICAS,
                      special="None: no replication; at most the nsqd given"),
    "write_quorum": Limit("nsqd", 1, MAX_REPLICAS,
                          special="None: replicas // 2 + 1; at most replicas"),
    "spool_max_bytes": Limit("bytes", 1, None),
    "spool_block_timeout": Limit("seconds", 0, MAX_SECONDS, special="None: wait for ever"),
    "batch_size": Limit("messages", 1, _INT32_MAX),
    "batch_bytes": Limit("bytes", 9, _INT32_MAX),
    "rescan_interval": _SECONDS_POSITIVE,
}
