"""The nsqd connection handshake as a pure state machine, and the connection states.

Everything that decides the handshake lives here (in the manner of h11's ``_state.py``):
what to send first, how to read the answers, which upgrade follows which, what a refused
feature or a missing secret means, and what a hostile or non-NSQ server gets back. The IO
classes (:class:`~nsq_spark._conn.Connection` on tornado, :class:`~nsq_spark._sync_conn.
SyncConnection` on blocking sockets) only move bytes and carry out the actions::

    hs = Handshake(config, host, port, decoder)
    send(hs.initial_bytes())                       # magic + IDENTIFY
    while True:
        n = hs.read_size                           # exact byte count, or None: any amount
        data = read_exactly(n) if n else codec.decompress(read_some())
        for action in hs.receive_data(data):
            SendBytes    -> write action.data (through the codec, once installed)
            StartTLS     -> wrap the socket in TLS (verifying action.server_hostname)
            InstallCodec -> from now on every byte goes through make_codec(kind, level)
            Done         -> action.negotiated holds what nsqd agreed to; action.frames are
                            response/error frames that arrived after the handshake

The steps, in order, each taken only when IDENTIFY's answer asks for it::

    IDENTIFY -> [TLS: StartTLS, expect OK] -> [snappy | deflate: InstallCodec, expect OK]
             -> [AUTH: SendBytes(AUTH), expect JSON] -> Done

Until a codec is installed, answers are read frame by frame with exact sizes
(:attr:`Handshake.read_size`): a byte of the TLS or compressed stream read as plain would be
lost. Heartbeats during the handshake are answered (``SendBytes(NOP)``).

Errors are typed: nsqd's error frames become their :mod:`~nsq_spark.errors` class;
``tls_v1`` asked but not offered is a TLSError; AUTH required without ``auth_secret`` an
AuthError; an HTTP server (nsqd's HTTP port given for its TCP port) or any other non-NSQ
answer a ProtocolError that says so; an IDENTIFY answer with a field of the wrong type or
range (a string for ``max_rdy_count``, ``1e400`` for ``msg_timeout``, JSON nested too deep)
a ProtocolError naming the field. :meth:`Handshake.connection_lost` and
:meth:`Handshake.timed_out` turn a connection that dropped or went silent half-way into the
error that explains it (a refused client certificate right after the TLS upgrade, say).

Differences from pynsq / go-nsq: both read the JSON answer with ``.get`` and trust its
types; here a wrong type ends the connection with a ProtocolError. nsqd answering both
snappy and deflate (it never does) is a ProtocolError rather than picking one.
"""

from __future__ import annotations

import enum
import json
import math
import ssl
import struct
from dataclasses import dataclass, field, fields
from typing import Any, Union

from . import protocol
from ._log import get_logger
from ._addresses import Address
from ._codecs import CodecKind
from .config import ConnectionConfig
from .errors import (AuthError, ConnectionClosedError, NSQError, NSQTimeoutError,
                     ProtocolError, TLSError, error_from_frame)

log = get_logger("nsq_spark.handshake")  # the name users filter on (docs/logging.md), not the module's

__all__ = ["ConnState", "Handshake", "Negotiated", "SendBytes", "StartTLS", "InstallCodec",
           "Done", "Action", "HTTP_PORT_HINT", "HANDSHAKE_MAX_FRAME_SIZE"]


class ConnState(enum.StrEnum):
    """The life of one nsqd connection. A ``str`` enum: ``state == "subscribed"`` and JSON
    stats keep working, but compare with the members."""

    INIT = "init"
    CONNECTING = "connecting"   # TCP connect and handshake under way
    CONNECTED = "connected"     # handshake done, not subscribed (a producer connection)
    SUBSCRIBED = "subscribed"
    CLOSING = "closing"         # CLS sent, or closing
    CLOSED = "closed"


# -- actions: what the IO loop must do ------------------------------------------------------


@dataclass(frozen=True)
class SendBytes:
    """Write these bytes (through the codec once one is installed)."""

    data: bytes


@dataclass(frozen=True)
class StartTLS:
    """Wrap the socket in TLS now (client side), verifying ``server_hostname``."""

    server_hostname: str


@dataclass(frozen=True)
class InstallCodec:
    """From now on decompress every byte read and compress every byte written."""

    kind: CodecKind
    level: int  # deflate level (nsqd's answer, or ours when it gave none); 0 for snappy


@dataclass
class Negotiated:
    """What the IDENTIFY (and AUTH) answers decided. Defaults are nsqd's. Times are in
    nsqd's milliseconds."""

    identify_response: dict[str, Any] = field(default_factory=dict)
    auth_response: dict[str, Any] = field(default_factory=dict)
    max_rdy_count: int = 2500
    msg_timeout: int = 60000
    max_msg_timeout: int = 15 * 60 * 1000
    tls: bool = False
    snappy: bool = False
    deflate: bool = False
    deflate_level: int = 0
    auth_required: bool = False
    sample_rate: int = 0
    output_buffer_size: int | None = None
    output_buffer_timeout: int | None = None
    nsqd_version: str | None = None


@dataclass(frozen=True)
class Done:
    """The handshake succeeded. ``frames``: response/error frames that came after it."""

    negotiated: Negotiated
    frames: list[tuple[int, bytes]] = field(default_factory=list)


Action = Union[SendBytes, StartTLS, InstallCodec, Done]


class NegotiatedAttributes:
    """The negotiated settings as plain attributes of a connection (``conn.max_rdy_count``,
    ``conn.tls``, ...), so both connection classes show them the same way."""

    identify_response: dict[str, Any]
    auth_response: dict[str, Any]
    max_rdy_count: int
    msg_timeout: int
    max_msg_timeout: int
    tls: bool
    snappy: bool
    deflate: bool
    deflate_level: int
    auth_required: bool
    sample_rate: int
    output_buffer_size: int | None
    output_buffer_timeout: int | None
    nsqd_version: str | None

    def _adopt(self, negotiated: Negotiated) -> None:
        for f in fields(negotiated):
            setattr(self, f.name, getattr(negotiated, f.name))


# -- the state machine --------------------------------------------------------------------


class _Step(enum.Enum):
    IDENTIFY = "the IDENTIFY answer"
    TLS = "OK after the TLS upgrade"
    COMPRESSION = "OK after the compression upgrade"
    AUTH = "the AUTH answer"
    DONE = "nothing (the handshake is done)"
    FAILED = "nothing (the handshake failed)"


#: The largest IDENTIFY or AUTH answer (or any frame before the handshake is done) we read.
#: nsqd's are under 1 KiB (a JSON object of a dozen fields; AUTH: identity, URL, count); the
#: auth server's identity strings are nsqd's to relay, not ours to buffer. 1 MiB is a
#: thousand times that, and small enough that a reconnecting client meeting a server that
#: announces tens of MiB allocates nothing big: the size prefix alone ends the handshake.
HANDSHAKE_MAX_FRAME_SIZE = 1 << 20

HTTP_PORT_HINT = ("this looks like an HTTP port; give nsqd's TCP port (4150 by default), not "
                  "its HTTP port (4151)")

_SIZE = struct.Struct(">i")
_NOP = protocol.nop()
_INT64_MAX = (1 << 63) - 1

# IDENTIFY answer fields and their allowed values (nsqd's Go types: int64, int, bool, string)
_INT_FIELDS: dict[str, tuple[int, int]] = {
    "max_rdy_count": (0, _INT64_MAX),
    "msg_timeout": (0, _INT64_MAX),
    "max_msg_timeout": (0, _INT64_MAX),
    "deflate_level": (0, 9),
    "max_deflate_level": (0, 9),
    "sample_rate": (0, 99),
    "output_buffer_size": (-1, _INT64_MAX),
    "output_buffer_timeout": (-1, _INT64_MAX),
}
_BOOL_FIELDS = ("tls_v1", "snappy", "deflate", "auth_required")
_STR_FIELDS = ("version",)


class Handshake:
    """One connection's handshake: bytes in, actions out. Not thread-safe; one per
    connection attempt.

    Args:
        config: the connection's options (features to ask for, secret, frame limit).
        host, port: the nsqd address (for messages and the TLS server name).
        decoder: the connection's FrameDecoder; given, a partial frame read after the
            handshake stays in it for the connection's read loop.
    """

    def __init__(self, config: ConnectionConfig, host: str, port: int,
                 decoder: protocol.FrameDecoder | None = None) -> None:
        self.config = config
        self.host = host
        self.address = str(Address(host, port))
        self._log = log.bind(nsqd=self.address)
        self.negotiated = Negotiated()
        self._decoder = decoder if decoder is not None else protocol.FrameDecoder(
            None, config.max_frame_size)
        self._step = _Step.IDENTIFY
        self._plain = bytearray()  # bytes of frames not yet whole: read exactly before a
        # codec is installed, decompressed ones after it
        self._compressed = False
        self._late: list[tuple[int, bytes]] = []  # frames that followed the last answer

    # -- what the IO loop asks ------------------------------------------------------------

    def initial_bytes(self) -> bytes:
        """The magic and IDENTIFY: the first bytes to send."""
        return protocol.MAGIC_V2 + protocol.identify(self.config.identify_payload())

    @property
    def done(self) -> bool:
        return self._step is _Step.DONE

    @property
    def read_size(self) -> int | None:
        """Bytes to read next, exactly (no more: an upgrade may follow them); None once a
        codec is installed (read any amount, decompress, pass it on)."""
        if self._compressed:
            return None
        have = len(self._plain)
        if have < 4:
            return 4 - have
        size: int = _SIZE.unpack_from(self._plain, 0)[0]
        return 4 + size - have

    def receive_data(self, data: bytes) -> list[Action]:
        """Feed bytes read from nsqd (decompressed, once a codec is installed); returns
        the actions to carry out, in order. Raises the typed error that ends the
        handshake."""
        if self._step in (_Step.DONE, _Step.FAILED):
            raise NSQError(f"the handshake with nsqd at {self.address} is over "
                           f"({self._step.name.lower()}); the connection reads its own frames")
        try:
            actions = self._receive(data)
        except BaseException:
            self._step = _Step.FAILED
            raise
        if self._late:  # frames after the handshake's last answer go with Done
            actions = [Done(a.negotiated, self._late) if isinstance(a, Done) else a
                       for a in actions]
            self._late = []
        return actions

    def connection_lost(self, cause: object = None) -> NSQError:
        """The error for a connection that closed (or reset) during the handshake."""
        self._step, step = _Step.FAILED, self._step
        detail = f" ({cause})" if cause else ""
        if step is _Step.TLS:
            return TLSError(f"nsqd at {self.address} dropped the connection right after the "
                            f"TLS handshake{detail}: it refused our client certificate? "
                            "(check tls_cert_file/tls_key_file against nsqd's "
                            "--tls-client-auth-policy and --tls-root-ca-file)")
        if isinstance(cause, ssl.SSLError):
            return TLSError(f"TLS with nsqd at {self.address} failed during the handshake, "
                            f"waiting for {step.value}{detail} (check tls_ca_file / "
                            "tls_cert_file, or the server's certificate)")
        return ConnectionClosedError(f"nsqd at {self.address} closed the connection during "
                                     f"the handshake, waiting for {step.value}{detail}")

    def timed_out(self, seconds: float) -> NSQTimeoutError:
        """The error for an answer that did not come within ``seconds``."""
        self._step, step = _Step.FAILED, self._step
        return NSQTimeoutError(f"nsqd at {self.address} did not answer within {seconds}s "
                               f"during the handshake (waiting for {step.value}; raise "
                               "response_timeout if nsqd or its auth server is slow)")

    # -- internals --------------------------------------------------------------------------

    def _receive(self, data: bytes) -> list[Action]:
        # frame by frame (decompressed ones too), each checked against the handshake's own
        # size limit before any of its body is read
        actions: list[Action] = []
        self._plain += data
        while len(self._plain) >= 4 and self._step is not _Step.DONE:
            size = _SIZE.unpack_from(self._plain, 0)[0]
            if size < 4 or size > self.max_frame_size:
                raise self._bad_size(size)
            if len(self._plain) < 4 + size:
                break
            frame = bytes(self._plain[:4 + size])
            del self._plain[:4 + size]
            plain = not self._compressed
            actions += self._frames(self._decode(frame))
            if plain and self._compressed and self._plain:
                # compressed bytes read as plain: an IO loop that over-read
                raise ProtocolError(
                    f"{len(self._plain)} bytes from nsqd at {self.address} were read "
                    "before the compression upgrade; read exactly read_size bytes")
            if self._plain and any(isinstance(a, StartTLS) for a in actions):
                raise ProtocolError(f"{len(self._plain)} bytes from nsqd at {self.address} "
                                    "were read before the TLS upgrade; read exactly read_size "
                                    "bytes")
        if self._step is _Step.DONE and self._plain:
            # what followed the last answer is the connection's: its decoder keeps a
            # partial frame for the read loop (with the connection's own frame limit)
            rest = bytes(self._plain)
            self._plain = bytearray()
            actions += self._frames(self._decode(rest))
        return actions

    @property
    def max_frame_size(self) -> int:
        """The largest frame read during the handshake: :data:`HANDSHAKE_MAX_FRAME_SIZE`
        (or ``max_frame_size`` when the connection's is smaller)."""
        return min(HANDSHAKE_MAX_FRAME_SIZE, self.config.max_frame_size)

    def _bad_size(self, size: int) -> ProtocolError:
        if self._plain[:4] == b"HTTP":  # size 1213486160: an HTTP response
            return ProtocolError(f"nsqd at {self.address} answered with HTTP: "
                                 f"{HTTP_PORT_HINT}")
        if size > self.max_frame_size:
            return ProtocolError(
                f"nsqd at {self.address} sent a frame of size {size} while waiting for "
                f"{self._step.value}, over the handshake's limit of {self.max_frame_size} "
                "bytes (nsq_spark._handshake.HANDSHAKE_MAX_FRAME_SIZE; nsqd's answers are "
                "under 1 KiB): is this an NSQ V2 server, and its auth server sane?")
        return self._not_nsq(f"sent a frame of size {size}")

    def _not_nsq(self, what: str) -> ProtocolError:
        return ProtocolError(f"nsqd at {self.address} {what} during the handshake; is this "
                             "an NSQ V2 server (nsqd's TCP port, 4150 by default)?")

    def _decode(self, data: bytes) -> list[tuple[int, bytes]]:
        try:
            msgs, others = self._decoder.feed(data)
        except ProtocolError as exc:
            raise ProtocolError(f"nsqd at {self.address}, during the handshake: {exc}") from None
        if msgs:
            raise ProtocolError(f"nsqd at {self.address} sent messages during the handshake "
                                "(before SUB)")
        return others

    def _frames(self, frames: list[tuple[int, bytes]]) -> list[Action]:
        actions: list[Action] = []
        for i, (ftype, data) in enumerate(frames):
            if self._step is _Step.DONE:
                self._late += frames[i:]
                break
            if ftype == protocol.FRAME_TYPE_RESPONSE and data == protocol.HEARTBEAT:
                actions.append(SendBytes(_NOP))
                continue
            if ftype == protocol.FRAME_TYPE_ERROR:
                raise error_from_frame(data, self.address)
            actions += self._on_response(data)
        return actions

    def _on_response(self, data: bytes) -> list[Action]:
        step = self._step
        if step is _Step.IDENTIFY:
            self._apply_identify(self._parse_identify(data))
            return self._after(_Step.IDENTIFY)
        if data != protocol.OK and step in (_Step.TLS, _Step.COMPRESSION):
            raise ProtocolError(f"nsqd at {self.address} answered {data[:100]!r} where it "
                                f"should send {step.value}")
        if step is _Step.AUTH:
            self.negotiated.auth_response = self._parse_auth(data)
            auth = self.negotiated.auth_response
            self._log.info("[%s] authenticated as %r (%s permissions)", self.address,
                           auth.get("identity"), auth.get("permission_count"))
        return self._after(step)

    def _after(self, step: _Step) -> list[Action]:
        """The next step after ``step`` succeeded: the one table of the handshake order."""
        n, cfg = self.negotiated, self.config
        if step is _Step.IDENTIFY and n.tls:
            self._step = _Step.TLS
            return [StartTLS(cfg.tls_server_hostname or self.host)]
        if step in (_Step.IDENTIFY, _Step.TLS) and (n.snappy or n.deflate):
            self._step = _Step.COMPRESSION
            self._compressed = True
            if n.snappy:
                return [InstallCodec("snappy", 0)]
            return [InstallCodec("deflate", n.deflate_level or cfg.deflate_level)]
        if step is not _Step.AUTH and n.auth_required:
            if cfg.auth_secret is None:
                raise AuthError(f"nsqd at {self.address} requires AUTH: set the auth_secret "
                                "connection option")
            self._step = _Step.AUTH
            return [SendBytes(protocol.auth(cfg.auth_secret))]
        if not n.auth_required and cfg.auth_secret is not None:
            self._log.warning("[%s] auth_secret is set but nsqd does not require AUTH; not sent",
                              self.address)
        self._step = _Step.DONE
        return [Done(n)]

    # -- the answers, checked ---------------------------------------------------------------

    def _parse_identify(self, data: bytes) -> dict[str, Any]:
        try:
            return protocol.parse_identify_response(data)
        except RecursionError:
            raise ProtocolError(f"nsqd at {self.address} sent an IDENTIFY answer nested too "
                                "deeply to be NSQ's") from None
        except ProtocolError as exc:
            raise ProtocolError(f"nsqd at {self.address}: {exc}") from None

    def _parse_auth(self, data: bytes) -> dict[str, Any]:
        try:
            result = json.loads(data)
        except (ValueError, RecursionError):
            result = None
        if not isinstance(result, dict):
            raise ProtocolError(f"AUTH response from {self.address} is not a JSON object: "
                                f"{data[:100]!r}")
        return result

    def _field(self, resp: dict[str, Any], name: str) -> Any:
        """The checked value of one IDENTIFY answer field (None when absent)."""
        if name not in resp:
            return None
        value = resp[name]
        if name in _INT_FIELDS:
            lo, hi = _INT_FIELDS[name]
            if isinstance(value, float) and math.isfinite(value) and value.is_integer():
                value = int(value)
            if isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi:
                return value
            expected = f"an integer from {lo} to {hi}"
        elif name in _BOOL_FIELDS:
            if isinstance(value, bool):
                return value
            expected = "true or false"
        else:
            if isinstance(value, str):
                return value
            expected = "a string"
        raise ProtocolError(f"nsqd at {self.address} sent an IDENTIFY answer with "
                            f"{name}={_short(value)}; expected {expected}")

    def _apply_identify(self, resp: dict[str, Any]) -> None:
        n = self.negotiated
        values = {name: self._field(resp, name)
                  for name in (*_INT_FIELDS, *_BOOL_FIELDS, *_STR_FIELDS)}

        def get(name: str, default: Any) -> Any:
            v = values[name]
            return default if v is None else v

        n.identify_response = resp
        n.max_rdy_count = get("max_rdy_count", n.max_rdy_count)
        n.msg_timeout = get("msg_timeout", n.msg_timeout)
        n.max_msg_timeout = get("max_msg_timeout", n.max_msg_timeout)
        n.tls = get("tls_v1", False)
        n.snappy = get("snappy", False)
        n.deflate = get("deflate", False)
        n.deflate_level = get("deflate_level", 0)
        n.auth_required = get("auth_required", False)
        n.sample_rate = get("sample_rate", 0)
        n.output_buffer_size = values["output_buffer_size"]
        n.output_buffer_timeout = values["output_buffer_timeout"]
        n.nsqd_version = values["version"]
        cfg = self.config
        if n.snappy and n.deflate:
            raise ProtocolError(f"nsqd at {self.address} sent an IDENTIFY answer with both "
                                "snappy and deflate true; a stream has one compression")
        if cfg.tls_v1 and not n.tls:
            raise TLSError(f"nsqd at {self.address} does not offer TLS (start it with "
                           "--tls-cert and --tls-key) but tls_v1 was requested")
        if cfg.snappy and not n.snappy:
            self._log.warning("[%s] snappy requested but nsqd refused it (--snappy=false?)",
                              self.address)
        if cfg.deflate and not n.deflate:
            self._log.warning("[%s] deflate requested but nsqd refused it (--deflate=false?)",
                              self.address)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
