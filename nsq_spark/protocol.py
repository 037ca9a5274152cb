"""The NSQ V2 wire protocol, free of IO (in the manner of h11).

Everything here turns values into bytes or bytes into values; no sockets, no loop. The
connection (``conn.py``) feeds whatever it read into a :class:`FrameDecoder` and writes what
the encoders return.

Wire format (https://nsq.io/clients/tcp_protocol_spec.html):

* the client opens with the 4-byte magic ``b"  V2"``;
* commands are a line (``NAME params\\n``), some followed by a 4-byte big-endian size and a
  body;
* the server answers with frames: ``size:int32 | frame_type:int32 | data[size-4]``, where
  the frame type is 0 (response), 1 (error) or 2 (message);
* a message frame's data is ``timestamp:int64 ns | attempts:uint16 | id:16 bytes | body``.

Speed matters on the consumer path: :meth:`FrameDecoder.feed` decodes *all* complete frames
of a chunk in one call, with one precompiled ``struct`` unpack per message frame, and builds
the :class:`~nsq_spark.message.Message` objects directly.
"""

from __future__ import annotations

import gc
import json
import re
import struct
from functools import lru_cache
from typing import Any, Iterable, Sequence

from .errors import InvalidBodyError, InvalidNameError, ProtocolError
from .message import Message, Responder

__all__ = [
    "MAGIC_V2", "FRAME_TYPE_RESPONSE", "FRAME_TYPE_ERROR", "FRAME_TYPE_MESSAGE",
    "HEARTBEAT", "OK", "CLOSE_WAIT", "DEFAULT_MAX_FRAME_SIZE",
    "identify", "auth", "sub", "pub", "mpub", "dpub", "rdy", "fin", "req", "touch", "nop", "cls",
    "FrameDecoder", "decode_frames", "decode_message",
    "encode_frame", "encode_message_frame",
    "valid_topic_name", "valid_channel_name", "check_topic", "check_channel",
]

MAGIC_V2 = b"  V2"

FRAME_TYPE_RESPONSE = 0
FRAME_TYPE_ERROR = 1
FRAME_TYPE_MESSAGE = 2

HEARTBEAT = b"_heartbeat_"
OK = b"OK"
CLOSE_WAIT = b"CLOSE_WAIT"

#: Frames announcing more than this are treated as a corrupt stream. nsqd's own limits
#: (``--max-msg-size`` 1 MiB, ``--max-body-size`` 5 MiB by default) are far below it.
DEFAULT_MAX_FRAME_SIZE = 64 * 1024 * 1024

MESSAGE_HEADER_SIZE = 26  # timestamp 8 + attempts 2 + id 16

_SIZE = struct.Struct(">i")
_UINT32 = struct.Struct(">I")
_FRAME_HEADER = struct.Struct(">ii")
# size, frame type, then the message header: one unpack per message frame
_FRAME_AND_MESSAGE_HEADER = struct.Struct(">iiqH16s")
_MESSAGE_HEADER = struct.Struct(">qH16s")
_TWO_UINT32 = struct.Struct(">II")
_FRAME_AND_MESSAGE_LEN = _FRAME_AND_MESSAGE_HEADER.size  # 34


# -----------------------------------------------------------------------------------------
# names

_NAME_RE = re.compile(r"[.a-zA-Z0-9_-]+(?:#ephemeral)?")


def _valid_name(name: object) -> bool:
    return (isinstance(name, str) and 1 <= len(name) <= 64
            and _NAME_RE.fullmatch(name) is not None)


def valid_topic_name(name: object) -> bool:
    """True if nsqd accepts ``name`` as a topic: 1-64 characters of ``[.a-zA-Z0-9_-]``,
    optionally ending in ``#ephemeral`` (within the 64)."""
    return _valid_name(name)


def valid_channel_name(name: object) -> bool:
    """True if nsqd accepts ``name`` as a channel (same rule as topics)."""
    return _valid_name(name)


def _name_str(name: object) -> object:
    if isinstance(name, (bytes, bytearray)):
        try:
            return bytes(name).decode("ascii")
        except UnicodeDecodeError:
            return name
    return name


def _check_name(kind: str, name: str | bytes) -> str:
    s = _name_str(name)
    if not _valid_name(s):
        raise InvalidNameError(
            f"invalid {kind} name {name!r}: {kind} names are 1-64 characters of "
            "[.a-zA-Z0-9_-], optionally ending in '#ephemeral'")
    return s  # type: ignore[return-value]


def check_topic(name: str | bytes) -> str:
    """Return ``name`` (as str) if it is a valid topic name, else raise InvalidNameError."""
    return _check_name("topic", name)


def check_channel(name: str | bytes) -> str:
    """Return ``name`` (as str) if it is a valid channel name, else raise InvalidNameError."""
    return _check_name("channel", name)


@lru_cache(maxsize=4096)
def _topic_bytes(name: str | bytes) -> bytes:
    # publishing checks and encodes the same few topic names over and over: cache them
    return check_topic(name).encode("ascii")


@lru_cache(maxsize=4096)
def _channel_bytes(name: str | bytes) -> bytes:
    return check_channel(name).encode("ascii")


def _topic(name: Any) -> bytes:
    try:
        return _topic_bytes(name)
    except TypeError:  # unhashable (e.g. bytearray)
        return check_topic(name).encode("ascii")


# -----------------------------------------------------------------------------------------
# bodies

_BODY_TYPES = (bytes, bytearray, memoryview)


def _check_body(body: Any, max_size: int | None, what: str = "message body") -> int:
    if not isinstance(body, _BODY_TYPES):
        raise InvalidBodyError(
            f"{what} must be bytes, not {type(body).__name__} (encode str bodies first, "
            "e.g. body.encode())")
    n = len(body) if not isinstance(body, memoryview) else body.nbytes
    if n == 0:
        raise InvalidBodyError(f"{what} is empty: nsqd refuses empty messages")
    if max_size is not None and n > max_size:
        raise InvalidBodyError(
            f"{what} is {n} bytes, over the limit of {max_size} bytes (nsqd --max-msg-size); "
            "split it or raise the limit")
    return n


# -----------------------------------------------------------------------------------------
# command encoders (each returns the complete bytes to write)


def identify(data: dict[str, Any]) -> bytes:
    """IDENTIFY with a JSON body of client metadata and requested features."""
    body = json.dumps(data, separators=(",", ":")).encode("utf-8")
    return b"IDENTIFY\n" + _UINT32.pack(len(body)) + body


def auth(secret: str | bytes) -> bytes:
    """AUTH with the secret as body (only sent when IDENTIFY said ``auth_required``)."""
    if isinstance(secret, str):
        secret = secret.encode("utf-8")
    return b"AUTH\n" + _UINT32.pack(len(secret)) + secret


def sub(topic: str, channel: str) -> bytes:
    """SUB topic channel (both names validated)."""
    return b"SUB " + _topic(topic) + b" " + _channel_bytes(channel) + b"\n"


def pub(topic: str, body: bytes, max_size: int | None = None) -> bytes:
    """PUB one message."""
    n = _check_body(body, max_size)
    return b"PUB " + _topic(topic) + b"\n" + _UINT32.pack(n) + bytes(body)


def dpub(topic: str, defer_ms: int, body: bytes, max_size: int | None = None) -> bytes:
    """DPUB: publish one message that nsqd delivers after ``defer_ms`` milliseconds."""
    if not isinstance(defer_ms, int) or isinstance(defer_ms, bool) or defer_ms < 0:
        raise ValueError(f"defer_ms must be a non-negative int of milliseconds, not {defer_ms!r}")
    n = _check_body(body, max_size)
    return (b"DPUB " + _topic(topic) + b" %d\n" % defer_ms + _UINT32.pack(n) + bytes(body))


_PACKED_LEN: dict[int, bytes] = {}  # body length -> its 4-byte prefix (MPUB hot path)


def _packed_lens(lens: list[int]) -> list[bytes]:
    cache = _PACKED_LEN
    try:
        return list(map(cache.__getitem__, lens))
    except KeyError:
        if len(cache) > 65536:
            cache.clear()
        for n in lens:
            if n not in cache:
                cache[n] = _UINT32.pack(n)
        return list(map(cache.__getitem__, lens))


def mpub(topic: str, bodies: Iterable[bytes], max_size: int | None = None) -> bytes:
    """MPUB several messages in one command (atomically stored by nsqd)."""
    t = _topic(topic)
    if not isinstance(bodies, (list, tuple)):
        bodies = list(bodies)
    count = len(bodies)
    if count == 0:
        raise InvalidBodyError("mpublish needs at least one message body")
    try:
        lens = list(map(len, bodies))
        ok = all(lens) and (max_size is None or max(lens) <= max_size)
        if ok:
            first = lens[0]
            if lens.count(first) == count:
                # all the same length: the length prefix is a join separator
                prefix = _UINT32.pack(first)
                payload = prefix + prefix.join(bodies)
            else:
                parts: list[Any] = [b""] * (2 * count)
                parts[0::2] = _packed_lens(lens)
                parts[1::2] = bodies
                payload = b"".join(parts)
    except TypeError:  # a body that is not bytes-like
        ok = False
    if not ok:
        # find the offending body and name it
        for i, b in enumerate(bodies):
            _check_body(b, max_size, f"message body #{i}")
        raise InvalidBodyError("invalid message bodies")  # pragma: no cover
    return (b"MPUB " + t + b"\n" + _TWO_UINT32.pack(len(payload) + 4, count)) + payload


def rdy(count: int) -> bytes:
    """RDY count: how many messages nsqd may have in flight to this connection."""
    if not isinstance(count, int) or count < 0:
        raise ValueError(f"RDY count must be a non-negative int, not {count!r}")
    return b"RDY %d\n" % count


def fin(message_id: bytes) -> bytes:
    """FIN message_id: the message was processed."""
    return b"FIN " + message_id + b"\n"


def req(message_id: bytes, delay_ms: int = 0) -> bytes:
    """REQ message_id delay_ms: requeue for redelivery after the delay."""
    return b"REQ " + message_id + b" %d\n" % delay_ms


def touch(message_id: bytes) -> bytes:
    """TOUCH message_id: reset the in-flight timeout."""
    return b"TOUCH " + message_id + b"\n"


def nop() -> bytes:
    """NOP: the answer to a heartbeat."""
    return b"NOP\n"


def cls() -> bytes:
    """CLS: stop sending messages; nsqd answers CLOSE_WAIT."""
    return b"CLS\n"


# -----------------------------------------------------------------------------------------
# frame encoders (the server side; for tests, fuzzing and fakes)


def encode_frame(frame_type: int, data: bytes) -> bytes:
    return _FRAME_HEADER.pack(len(data) + 4, frame_type) + data


def encode_message_frame(message_id: bytes, body: bytes, timestamp: int = 0, attempts: int = 1) -> bytes:
    if len(message_id) != 16:
        raise ValueError("message ids are 16 bytes")
    return (_FRAME_AND_MESSAGE_HEADER.pack(len(body) + 30, FRAME_TYPE_MESSAGE, timestamp, attempts,
                                           message_id) + body)


# -----------------------------------------------------------------------------------------
# decoding


def decode_message(data: bytes, responder: Responder | None = None) -> Message:
    """A Message from the data of one message frame."""
    if len(data) < MESSAGE_HEADER_SIZE:
        raise ProtocolError(f"message frame of {len(data)} bytes is shorter than the "
                            f"{MESSAGE_HEADER_SIZE}-byte message header")
    ts, attempts, mid = _MESSAGE_HEADER.unpack_from(data, 0)
    return Message(mid, bytes(data[MESSAGE_HEADER_SIZE:]), ts, attempts, responder)


def _bad_size(size: int, max_size: int) -> ProtocolError:
    if size < 4:
        return ProtocolError(f"frame size {size} is below the 4-byte minimum: the stream is "
                             "corrupt or not NSQ V2")
    return ProtocolError(f"frame size {size} exceeds the limit of {max_size} bytes: the stream "
                         "is corrupt (or raise max_frame_size)")


def _decode_bulk(data: bytes, responder: Responder | None, max_size: int
                 ) -> tuple[list[Message], list[tuple[int, bytes]], int]:
    """Decode every complete frame of ``data``; return (messages, other frames, end)."""
    n = len(data)
    pos = 0
    messages: list[Message] = []
    others: list[tuple[int, bytes]] = []
    add = messages.append
    unpack_msg = _FRAME_AND_MESSAGE_HEADER.unpack_from
    unpack_hdr = _FRAME_HEADER.unpack_from
    M = Message
    last = n - 34
    while True:
        # fast path: whole message frames, one unpack each
        while pos <= last:
            size, ftype, ts, attempts, mid = unpack_msg(data, pos)
            end = pos + 4 + size
            if ftype == 2 and size >= 30 and end <= n:
                add(M(mid, data[pos + 34:end], ts, attempts, responder))
                pos = end
            else:
                break
        # general path: one frame of any kind, a partial frame, or a corrupt one
        rem = n - pos
        if rem >= 34:
            size, ftype, ts, attempts, mid = unpack_msg(data, pos)
        elif rem >= 8:
            size, ftype = unpack_hdr(data, pos)
        else:
            if rem >= 4:
                size = _SIZE.unpack_from(data, pos)[0]
                if size < 4 or size > max_size:
                    raise _bad_size(size, max_size)
            break
        end = pos + 4 + size
        if ftype == 2 and size >= 30:
            if end > n:
                if size > max_size:
                    raise _bad_size(size, max_size)
                break
            add(M(mid, data[pos + 34:end], ts, attempts, responder))
        elif size < 4 or size > max_size:
            raise _bad_size(size, max_size)
        elif ftype == 0 or ftype == 1:
            if end > n:
                break
            others.append((ftype, data[pos + 8:end]))
        elif ftype == 2:
            raise ProtocolError(f"message frame of size {size} is shorter than the 30 bytes "
                                "of frame type and message header")
        else:
            raise ProtocolError(f"unknown frame type {ftype} (expected 0, 1 or 2): the stream is "
                                "corrupt or not NSQ V2")
        pos = end
    return messages, others, pos


def decode_frames(data: bytes, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE
                  ) -> tuple[list[tuple[int, bytes]], int]:
    """All complete frames of ``data`` as ``(frame_type, frame_data)`` in order, and the
    number of bytes they used (the rest is an incomplete frame). Raises ProtocolError on a
    corrupt stream."""
    data = bytes(data)
    frames: list[tuple[int, bytes]] = []
    pos = 0
    n = len(data)
    while n - pos >= 4:
        size = _SIZE.unpack_from(data, pos)[0]
        if size < 4 or size > max_frame_size:
            raise _bad_size(size, max_frame_size)
        end = pos + 4 + size
        if end > n:
            break
        ftype = _SIZE.unpack_from(data, pos + 4)[0]
        if ftype not in (0, 1, 2):
            raise ProtocolError(f"unknown frame type {ftype} (expected 0, 1 or 2): the stream is "
                                "corrupt or not NSQ V2")
        if ftype == 2 and size < 30:
            raise ProtocolError(f"message frame of size {size} is shorter than the 30 bytes "
                                "of frame type and message header")
        frames.append((ftype, data[pos + 8:end]))
        pos = end
    return frames, pos


class FrameDecoder:
    """Incremental bulk decoder for the server-to-client byte stream.

    ``feed(chunk)`` returns ``(messages, others)``: every :class:`Message` completed by the
    chunk, in stream order, and every response/error frame as ``(frame_type, data)``, in
    stream order. (The relative order between the two lists is not kept; nothing in NSQ
    depends on it.) A partial frame at the end is kept for the next call. A large frame that
    arrives in many pieces is gathered without re-copying the pieces on every call.

    Args:
        responder: set on every Message, so ``msg.finish()`` reaches the connection.
        max_frame_size: frames announcing more than this raise ProtocolError.
        pause_gc: pause Python's cyclic garbage collector while one chunk is decoded
            (see ``feed``); it is re-enabled before ``feed`` returns.
    """

    __slots__ = ("responder", "max_frame_size", "pause_gc", "_tail", "_parts", "_have", "_need")

    def __init__(self, responder: Responder | None = None,
                 max_frame_size: int = DEFAULT_MAX_FRAME_SIZE, pause_gc: bool = True) -> None:
        self.responder = responder
        self.max_frame_size = max_frame_size
        self.pause_gc = pause_gc
        self._tail = b""
        self._parts: list[bytes] = []  # pieces of one large incomplete frame
        self._have = 0
        self._need = 0

    @property
    def buffered(self) -> int:
        """Bytes of an incomplete frame held back."""
        return self._have if self._parts else len(self._tail)

    def feed(self, data: bytes | bytearray | memoryview
             ) -> tuple[list[Message], list[tuple[int, bytes]]]:
        if type(data) is not bytes:
            data = bytes(data)
        if self._parts:
            self._parts.append(data)
            self._have += len(data)
            if self._have < self._need:
                return [], []
            data = b"".join(self._parts)
            self._parts = []
        elif self._tail:
            data = self._tail + data
        if self.pause_gc and gc.isenabled():
            # Every object built here is alive until the chunk is handled, so the cyclic
            # collector, triggered every 700 allocations, would only traverse and promote
            # them: pause it for the chunk (as Mercurial does for bulk object creation).
            gc.disable()
            try:
                messages, others, end = _decode_bulk(data, self.responder, self.max_frame_size)
            finally:
                gc.enable()
        else:
            messages, others, end = _decode_bulk(data, self.responder, self.max_frame_size)
        n = len(data)
        if end == n:
            self._tail = b""
            return messages, others
        tail = data[end:]
        if n - end >= 4:
            need = _SIZE.unpack_from(tail, 0)[0] + 4
            if need - len(tail) > 65536:
                # a big frame still far from complete: collect pieces, join once
                self._parts = [tail]
                self._have = len(tail)
                self._need = need
                self._tail = b""
                return messages, others
        self._tail = tail
        return messages, others

    def reset(self) -> None:
        """Forget any partial frame (after a reconnect)."""
        self._tail = b""
        self._parts = []
        self._have = self._need = 0


def parse_identify_response(data: bytes) -> dict[str, Any]:
    """The IDENTIFY answer: JSON when feature negotiation was accepted, else ``OK``."""
    if data == OK:
        return {}
    try:
        result = json.loads(data)
    except ValueError as exc:
        raise ProtocolError(f"IDENTIFY response is neither OK nor JSON: {data[:100]!r}") from exc
    if not isinstance(result, dict):
        raise ProtocolError(f"IDENTIFY response is not a JSON object: {data[:100]!r}")
    return result


def split_bodies(bodies: Sequence[bytes], max_batch_bytes: int) -> list[list[bytes]]:
    """Split bodies into batches whose MPUB body stays within ``max_batch_bytes`` (nsqd's
    ``--max-body-size``); each batch holds at least one body."""
    batches: list[list[bytes]] = []
    current: list[bytes] = []
    size = 4
    for b in bodies:
        add = len(b) + 4
        if current and size + add > max_batch_bytes:
            batches.append(current)
            current, size = [], 4
        current.append(b)
        size += add
    if current:
        batches.append(current)
    return batches
