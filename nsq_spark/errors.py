"""Typed errors of nsq_spark.

Every error derives from :class:`NSQError`. Errors that nsqd sends in an error frame
(``E_BAD_TOPIC ...``) become :class:`NSQServerError` subclasses chosen by their code; the
attribute ``fatal`` tells whether nsqd closes the connection after sending it. Per the NSQ
spec only ``E_FIN_FAILED``, ``E_REQ_FAILED`` and ``E_TOUCH_FAILED`` leave the connection
open (they are "client errors": the message had already timed out or was unknown).
"""

from __future__ import annotations


class NSQError(Exception):
    """Base class of every error raised by nsq_spark; also pynsq's ``nsq.Error`` /
    ``nsq.protocol.Error``, so a pynsq callback's ``isinstance(data, nsq.Error)`` holds."""


class HTTPAnswerError(NSQError):
    """nsqd or nsqlookupd answered an HTTP request with a status other than 2xx.
    ``status`` is the HTTP status, ``message`` what the node said (e.g.
    ``"INVALID_TOPIC"``), ``url`` what was asked. Defined here, not in the admin package,
    because :func:`is_transient` (the one retry rule) decides on its ``status``; the admin
    clients raise its subclass :class:`nsq_spark.admin.errors.HTTPStatusError`."""

    def __init__(self, text: str, *, status: int, message: str, url: str) -> None:
        super().__init__(text)
        self.status = status
        self.message = message
        self.url = url


# -- pynsq's error classes (``nsq.protocol``): ours derive from them where they mean the same


class SendError(NSQError):
    """pynsq's ``SendError(msg, error=None)``: a command could not be sent (no open
    connection, a write or TLS upgrade that failed). ``msg`` and ``error`` (the cause) are
    kept as pynsq keeps them."""

    def __init__(self, msg: str = "", error: BaseException | None = None) -> None:
        self.msg = msg
        self.error = error
        super().__init__(msg if error is None else f"{msg} ({error})")


class IntegrityError(NSQError):
    """pynsq's ``IntegrityError``: what nsqd sent cannot be parsed."""


# -- client-side validation ---------------------------------------------------------------


class InvalidNameError(NSQError, ValueError, AssertionError):
    """A topic or channel name that nsqd would refuse (checked before anything is sent).
    Also an AssertionError: pynsq asserts on names, and pynsq programs catch that."""


class InvalidBodyError(NSQError, ValueError, AssertionError):
    """A message body nsqd would refuse: empty, not bytes, or larger than the known limit.
    Also an AssertionError, as pynsq's ``protocol.pub`` raises for a body that is not bytes."""


class ConfigError(NSQError, ValueError, AssertionError):
    """An unknown or out-of-range option. Also an AssertionError: pynsq checks every option
    (unknown keywords included) with ``assert``, and pynsq programs and tests expect that."""


class InvalidAddressError(ConfigError):
    """A ``host:port`` address that does not follow the one address rule
    (:mod:`nsq_spark._addresses`); the message names the parameter and the bad entry."""


class AlreadyRespondedError(NSQError, RuntimeError):
    """A message was finished or requeued twice (or touched after its response)."""


# -- wire / connection level --------------------------------------------------------------


class ProtocolError(IntegrityError):
    """Bytes on the wire that do not follow the NSQ V2 protocol (bad frame size, unknown
    frame type, truncated message, bad compressed stream). The connection cannot continue."""


class ConnectError(SendError, ConnectionError):
    """The TCP connection to nsqd could not be opened (refused, unreachable, timed out)."""


class ConnectionClosedError(NSQError, ConnectionError):
    """The connection closed while something was still expected from it."""


class TLSError(SendError):
    """The TLS upgrade failed or was refused (certificate, verification, server config)."""


class AuthError(NSQError):
    """AUTH was needed but not configured, or nsqd's auth server refused the secret."""


class SubscribeRefusedError(NSQError):
    """No nsqd accepted a consumer's subscription, for a reason no retry fixes (AUTH
    refused, TLS verification failed, ...): the message names each nsqd and its answer."""


class DedupStoreError(NSQError, ConnectionError):
    """The shared deduplication store (e.g. the ``dedup`` option's redis) did not answer;
    the message names the option, the store (password hidden) and the fix."""


class NotConnectedError(NSQError, ValueError):
    """A run-time control named an nsqd or lookupd the consumer is not connected to or
    polling (go-nsq's ``ErrNotConnected``); the message lists those it is."""


class PollerStoppedError(NSQError, RuntimeError):
    """A lookupd poller was asked to query after :meth:`~nsq_spark._lookupd.LookupdPoller.stop`
    (its consumer closed, or its last lookupd was disconnected): it makes no new HTTP
    client that nothing would close. Start it again, or make a new one
    (``Reader.connect_to_lookupd``)."""


class NSQTimeoutError(NSQError, TimeoutError):
    """nsqd did not answer in time (connect, handshake, response, heartbeat)."""


class ReplicationError(NSQError):
    """A replicated publish (``Producer(replicas=N, write_quorum=W)``) was acknowledged by
    fewer than ``quorum`` nsqds. ``acked``: the nsqds that hold it (``host:port``; a
    message may be stored there: at-least-once), ``failed``: each nsqd tried and its
    failure, ``replicas`` and ``quorum``: N and W. Transient (retried, then raised) when
    any failure was; the message names the counts, the nsqds and the fixes."""

    def __init__(self, acked: "tuple[str, ...] | list[str]",
                 failed: "dict[str, BaseException]", *, replicas: int, quorum: int,
                 candidates: int, what: str = "a replicated publish") -> None:
        self.acked = tuple(acked)
        self.failed = dict(failed)
        self.replicas = replicas
        self.quorum = quorum
        causes = "; ".join(f"{a}: {type(e).__name__}: {e}" for a, e in self.failed.items())
        untried = candidates - len(self.acked) - len(self.failed)
        text = (f"{what} was acknowledged by {len(self.acked)} of {replicas} replicas "
                f"({', '.join(self.acked) or 'none'}); write_quorum={quorum} needs "
                f"{quorum}. Failed: {causes or 'none'}")
        if untried > 0:
            text += f"; {untried} nsqd not tried"
        text += (". Fix: bring the failed nsqd back, give more nsqd addresses than replicas "
                 "(a failed one is then replaced by another), or lower write_quorum")
        super().__init__(text)

    @property
    def transient(self) -> bool:
        """True when another round may succeed: some failure was transient."""
        return any(is_transient(e) for e in self.failed.values())


class SparkVersionError(NSQError, RuntimeError):
    """The running pyspark's Python data source API lacks what a Spark feature of the
    ``nsq`` source needs (e.g. streaming writes on pyspark 4.0). Raised when the query
    starts; the message names the pyspark version needed, the one found, and the way out.
    :mod:`nsq_spark.spark._compat` decides what each version supports."""


class SparkSpoolError(NSQError, RuntimeError):
    """The Spark connector's write-ahead spool (the ``spoolPath`` option) could not be
    used, or a batch it owes is gone: the message names the spool, the batch and what to
    check (shared storage every executor reaches, a spool deleted while the query was
    stopped). Not the Producer's publish spool: that one's errors are
    :class:`nsq_spark.spool.SpoolError`. (Called ``nsq_spark.spark._spool.SpoolError`` in
    0.1.0, where it derived from ``RuntimeError`` alone; that name stays for a release.)"""



class SparkCheckpointError(NSQError, ValueError):
    """An offset in a Spark checkpoint's offsets log that the ``nsq`` source cannot read:
    not one of the forms any release wrote (damaged or edited by hand), or written by a
    newer nsq-spark. The message names the offset, the key and the fix; the forms are in
    :mod:`nsq_spark.spark._offset`."""

# -- errors sent by nsqd ------------------------------------------------------------------


class NSQServerError(NSQError):
    """An error frame from nsqd: ``code`` (e.g. ``"E_BAD_TOPIC"``), ``description``, and
    ``fatal`` (nsqd closes the connection after a fatal error)."""

    code: str = ""
    fatal: bool = True

    def __init__(self, code: str, description: str = "", address: str | None = None) -> None:
        self.code = code
        self.description = description
        self.address = address
        where = f" from nsqd {address}" if address else ""
        hint = _HINTS.get(code, "")
        if "TLS required" in description:
            hint = " (this nsqd runs with --tls-required: set tls_v1=True)"
        text = f"{code}{where}: {description}" if description else f"{code}{where}"
        super().__init__(f"{text}{hint}")


class InvalidError(NSQServerError):
    """E_INVALID: a command was invalid in the current state or badly formed."""


class BadBodyError(NSQServerError):
    """E_BAD_BODY: a command body was malformed (IDENTIFY/AUTH/MPUB)."""


class BadTopicError(NSQServerError):
    """E_BAD_TOPIC: nsqd refused the topic name."""


class BadChannelError(NSQServerError):
    """E_BAD_CHANNEL: nsqd refused the channel name."""


class BadMessageError(NSQServerError):
    """E_BAD_MESSAGE: a message body was empty or over nsqd's ``--max-msg-size``."""


class PubFailedError(NSQServerError):
    """E_PUB_FAILED: nsqd could not store the message (e.g. it is exiting)."""


class MPubFailedError(NSQServerError):
    """E_MPUB_FAILED: nsqd could not store the batch."""


class DPubFailedError(NSQServerError):
    """E_DPUB_FAILED: nsqd could not store the deferred message."""


class SubFailedError(NSQServerError):
    """E_SUB_FAILED: nsqd refused the subscription (topic/channel being deleted)."""


class IdentifyFailedError(NSQServerError):
    """E_IDENTIFY_FAILED: feature negotiation failed on the server side."""


class FinFailedError(NSQServerError):
    """E_FIN_FAILED (non-fatal): the message was unknown or had timed out already."""

    fatal = False


class ReqFailedError(NSQServerError):
    """E_REQ_FAILED (non-fatal): the message was unknown or had timed out already."""

    fatal = False


class TouchFailedError(NSQServerError):
    """E_TOUCH_FAILED (non-fatal): the message was unknown or had timed out already."""

    fatal = False


class AuthFailedError(NSQServerError, AuthError):
    """E_AUTH_FAILED / E_AUTH_ERROR / E_AUTH_DISABLED / E_AUTH_FIRST: AUTH did not succeed."""


class UnauthorizedError(NSQServerError, AuthError):
    """E_UNAUTHORIZED: the secret is valid but grants nothing for this topic/channel."""


_HINTS = {
    "E_BAD_TOPIC": " (topic names are 1-64 characters of [.a-zA-Z0-9_-], optionally ending in #ephemeral)",
    "E_BAD_CHANNEL": " (channel names are 1-64 characters of [.a-zA-Z0-9_-], optionally ending in #ephemeral)",
    "E_BAD_MESSAGE": " (bodies must be non-empty and at most nsqd's --max-msg-size)",
    "E_AUTH_FAILED": " (check auth_secret and nsqd's --auth-http-address server)",
    "E_UNAUTHORIZED": " (the auth server grants this secret no access to that topic/channel)",
    "E_AUTH_FIRST": " (set auth_secret: this nsqd requires AUTH before other commands)",
}

#: nsqd error code -> exception class
ERROR_CLASSES: dict[str, type[NSQServerError]] = {
    "E_INVALID": InvalidError,
    "E_BAD_BODY": BadBodyError,
    "E_BAD_TOPIC": BadTopicError,
    "E_BAD_CHANNEL": BadChannelError,
    "E_BAD_MESSAGE": BadMessageError,
    "E_PUB_FAILED": PubFailedError,
    "E_MPUB_FAILED": MPubFailedError,
    "E_DPUB_FAILED": DPubFailedError,
    "E_SUB_FAILED": SubFailedError,
    "E_IDENTIFY_FAILED": IdentifyFailedError,
    "E_FIN_FAILED": FinFailedError,
    "E_REQ_FAILED": ReqFailedError,
    "E_TOUCH_FAILED": TouchFailedError,
    "E_AUTH_FAILED": AuthFailedError,
    "E_AUTH_ERROR": AuthFailedError,
    "E_AUTH_DISABLED": AuthFailedError,
    "E_AUTH_FIRST": AuthFailedError,
    "E_UNAUTHORIZED": UnauthorizedError,
}

#: the codes after which nsqd keeps the connection open
NON_FATAL_CODES = frozenset(c for c, cls in ERROR_CLASSES.items() if not cls.fatal)


def error_from_frame(data: bytes | bytearray | memoryview, address: str | None = None) -> NSQServerError:
    """The typed exception for the payload of an nsqd error frame (``b"E_CODE text"``)."""
    text = bytes(data).decode("utf-8", "replace")
    code, _, description = text.partition(" ")
    cls = ERROR_CLASSES.get(code, NSQServerError)
    return cls(code, description, address)


def is_fatal(code: str) -> bool:
    """True when nsqd closes the connection after sending this error code."""
    return code not in NON_FATAL_CODES


# -- the one retry classification -------------------------------------------------------

#: nsqd error codes after which another attempt, maybe on another nsqd, can succeed:
#: nsqd could not store the message (exiting, disk trouble).
_TRANSIENT_CODES = frozenset({"E_PUB_FAILED", "E_MPUB_FAILED", "E_DPUB_FAILED"})
#: HTTP answers of nsqd / nsqlookupd that another attempt can change: the server (or a
#: proxy in front of it) failed, was not reachable from the proxy, or timed out.
_TRANSIENT_HTTP_STATUSES = frozenset({500, 502, 503, 504})


def is_transient(exc: BaseException) -> bool:
    """True for a failure that another attempt can fix (connection lost or refused, no
    answer in time, nsqd could not store the message, an HTTP answer 500, 502, 503 or 504
    of nsqd / nsqlookupd -- :class:`HTTPAnswerError`, as the admin clients raise it: the server
    or a proxy in front of it failed this time, as lookupd discovery and HTTP publishing
    treat it too); False for one that no retry can fix (bad name or body, refused AUTH, a
    TLS certificate or setup failure -- typed TLSError or a raw ``ssl.SSLError`` such as
    ``SSLCertVerificationError`` --, any other nsqd error or HTTP status, a protocol
    violation). Producers retry by this rule. The publish spool
    has a rule of its own, :func:`nsq_spark.spool._drain.refused` (only nsqd refusing the
    message itself takes a message out of its queue), because its caller was already
    told "accepted" and nobody waits to decide."""
    import asyncio
    import ssl

    if isinstance(exc, NSQServerError):
        return exc.code in _TRANSIENT_CODES
    if isinstance(exc, ReplicationError):
        return exc.transient
    if isinstance(exc, HTTPAnswerError):
        return exc.status in _TRANSIENT_HTTP_STATUSES
    if isinstance(exc, (AuthError, TLSError, InvalidNameError, InvalidBodyError, ConfigError,
                        ProtocolError)):
        return False
    if isinstance(exc, ssl.SSLError):
        # a certificate or TLS configuration refused: the same on every attempt. Only a
        # TLS stream cut short (EOF, close_notify) is a lost connection.
        return isinstance(exc, (ssl.SSLEOFError, ssl.SSLZeroReturnError))
    return isinstance(exc, (ConnectError, ConnectionClosedError, NSQTimeoutError,
                            ConnectionError, TimeoutError, asyncio.TimeoutError))


def is_permanent(exc: BaseException) -> bool:
    """The opposite of :func:`is_transient`: a failure no retry can fix."""
    return not is_transient(exc)
