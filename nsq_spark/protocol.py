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

The command encoders take pynsq's argument names (``pub(topic, data)``, ``touch(id)``,
``requeue(id, time_ms)``, ...) and pynsq's spellings exist beside ours (``subscribe`` =
``sub``, ``ready`` = ``rdy``, ``finish`` = ``fin``, ``requeue`` = ``req``), so pynsq's
``nsq.protocol`` works on this module: message ids may be str (UTF-8, as pynsq encodes
them), ``unpack_response`` splits a frame, and pynsq's error classes are here (``Error``
is :class:`~nsq_spark.errors.NSQError`, the base of every error of this library). Bad names
and bodies raise InvalidNameError / InvalidBodyError, which are AssertionErrors as pynsq's are.

Speed matters on the consumer path: :meth:`FrameDecoder.feed` decodes *all* complete frames
of a chunk in one call, with one precompiled ``struct`` unpack per message frame, and builds
the :class:`~nsq_spark.message.Message` objects directly. :meth:`FrameDecoder.feed_blocks`
builds no object per message at all: it returns :class:`MessageBlock` s, the received bytes
plus the offsets of their message frames, for consumers that handle messages as columns.
"""

from __future__ import annotations

import gc
import json
import re
import struct
import sys
from array import array
from functools import lru_cache
from typing import Any, Iterable, Iterator, Sequence

from .errors import ConnectionClosedError, IntegrityError, InvalidBodyError, InvalidNameError
from .errors import NSQError as Error
from .errors import ProtocolError, SendError
from .message import Message, Responder

__all__ = [
    "MAGIC_V2", "FRAME_TYPE_RESPONSE", "FRAME_TYPE_ERROR", "FRAME_TYPE_MESSAGE",
    "HEARTBEAT", "OK", "CLOSE_WAIT", "DEFAULT_MAX_FRAME_SIZE",
    "identify", "auth", "sub", "pub", "mpub", "dpub", "rdy", "fin", "fins", "req", "touch", "nop",
    "cls",
    "FrameDecoder", "MessageBlock", "decode_frames", "decode_message",
    "encode_frame", "encode_message_frame",
    "valid_topic_name", "valid_channel_name", "check_topic", "check_channel",
    # pynsq's nsq.protocol names (same arguments, same bytes)
    "subscribe", "ready", "finish", "requeue", "unpack_response",
    "Error", "SendError", "ConnectionClosedError", "IntegrityError",
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
# size, frame type, attempts (the timestamp skipped): what the block decoder needs
_FRAME_AND_ATTEMPTS = struct.Struct(">ii8xH")
# where the fields of a message frame start, counted from the frame's first byte
TIMESTAMP_AT, ATTEMPTS_AT, ID_AT, BODY_AT = 8, 16, 18, 34


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
    """IDENTIFY with a JSON body of client metadata and requested features (json.dumps'
    default layout, byte for byte what pynsq sends)."""
    body = json.dumps(data).encode("utf-8")
    return b"IDENTIFY\n" + _UINT32.pack(len(body)) + body


def auth(secret: str | bytes) -> bytes:
    """AUTH with the secret as body (only sent when IDENTIFY said ``auth_required``)."""
    if isinstance(secret, str):
        secret = secret.encode("utf-8")
    return b"AUTH\n" + _UINT32.pack(len(secret)) + secret


def sub(topic: str, channel: str) -> bytes:
    """SUB topic channel (both names validated)."""
    return b"SUB " + _topic(topic) + b" " + _channel_bytes(channel) + b"\n"


def pub(topic: str, data: bytes, max_size: int | None = None) -> bytes:
    """PUB one message (``data``: the body, bytes)."""
    n = _check_body(data, max_size)
    return b"PUB " + _topic(topic) + b"\n" + _UINT32.pack(n) + bytes(data)


def dpub(topic: str, delay_ms: int, data: bytes, max_size: int | None = None) -> bytes:
    """DPUB: publish one message that nsqd delivers after ``delay_ms`` milliseconds."""
    if not isinstance(delay_ms, int) or isinstance(delay_ms, bool) or delay_ms < 0:
        raise ValueError(f"delay_ms must be a non-negative int of milliseconds, not {delay_ms!r}")
    n = _check_body(data, max_size)
    return (b"DPUB " + _topic(topic) + b" %d\n" % delay_ms + _UINT32.pack(n) + bytes(data))


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


def mpub(topic: str, data: Iterable[bytes], max_size: int | None = None) -> bytes:
    """MPUB several messages (``data``: the bodies) in one command, stored atomically."""
    t = _topic(topic)
    bodies = data
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
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise ValueError(f"RDY count must be a non-negative int, not {count!r}")
    return b"RDY %d\n" % count


def _id(message_id: bytes | str) -> bytes:
    # pynsq programs pass ids as str too; pynsq sends them UTF-8 encoded
    return message_id.encode("utf-8") if isinstance(message_id, str) else message_id


def fin(message_id: bytes | str) -> bytes:
    """FIN message_id: the message was processed."""
    return b"FIN " + _id(message_id) + b"\n"


def fins(message_ids: Iterable[bytes]) -> bytes:
    """FIN for each of several messages, as one buffer."""
    return b"".join([b"FIN " + i + b"\n" for i in message_ids])


def req(message_id: bytes | str, delay_ms: int = 0) -> bytes:
    """REQ message_id delay_ms: requeue for redelivery after the delay."""
    return b"REQ " + _id(message_id) + b" %d\n" % delay_ms


def touch(id: bytes | str) -> bytes:
    """TOUCH id: reset the in-flight timeout of that message."""
    return b"TOUCH " + _id(id) + b"\n"


# pynsq's spellings of the same commands, with pynsq's argument names


def subscribe(topic: str, channel: str) -> bytes:
    """pynsq's name for :func:`sub`."""
    return sub(topic, channel)


def ready(count: int) -> bytes:
    """pynsq's name for :func:`rdy`."""
    return rdy(count)


def finish(id: bytes | str) -> bytes:
    """pynsq's name for :func:`fin`."""
    return fin(id)


def requeue(id: bytes | str, time_ms: int = 0) -> bytes:
    """pynsq's name for :func:`req` (``time_ms``: the requeue delay in milliseconds)."""
    if not isinstance(time_ms, int) or isinstance(time_ms, bool) or time_ms < 0:
        raise ValueError(f"requeue time_ms must be a non-negative int, not {time_ms!r}")
    return req(id, time_ms)


def unpack_response(data: bytes) -> tuple[int, bytes]:
    """pynsq's frame split: ``(frame_type, payload)`` of one frame without its size prefix
    (what a blocking reader got after reading ``size`` bytes)."""
    if len(data) < 4:
        raise ProtocolError(f"a frame needs a 4-byte frame type, got {len(data)} bytes")
    return _SIZE.unpack_from(data, 0)[0], data[4:]


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


def _frame_at(data: bytes, pos: int, n: int, max_size: int
              ) -> tuple[int, tuple[int, bytes] | None]:
    """The frame at ``pos`` of ``data[:n]``, which is not a complete message frame (the
    decoders' fast loops take those): ``(end, (frame_type, frame_data))`` for a response or
    error frame, ``(-1, None)`` when the frame is incomplete. Raises ProtocolError on a
    corrupt stream. The one place where frames are checked."""
    rem = n - pos
    if rem < 8:
        if rem >= 4:
            size = _SIZE.unpack_from(data, pos)[0]
            if size < 4 or size > max_size:
                raise _bad_size(size, max_size)
        return -1, None
    size, ftype = _FRAME_HEADER.unpack_from(data, pos)
    if size < 4 or size > max_size:
        raise _bad_size(size, max_size)
    end = pos + 4 + size
    if ftype == FRAME_TYPE_MESSAGE:
        if size < 30:
            raise ProtocolError(f"message frame of size {size} is shorter than the 30 bytes "
                                "of frame type and message header")
        if end > n:
            return -1, None
        # a complete message frame always satisfies the fast loops' test
        raise AssertionError("complete message frame outside the fast loop")  # pragma: no cover
    if ftype != FRAME_TYPE_RESPONSE and ftype != FRAME_TYPE_ERROR:
        raise ProtocolError(f"unknown frame type {ftype} (expected 0, 1 or 2): the stream is "
                            "corrupt or not NSQ V2")
    if end > n:
        return -1, None
    return end, (ftype, data[pos + 8:end])


def _decode_bulk(data: bytes, responder: Responder | None, max_size: int
                 ) -> tuple[list[Message], list[tuple[int, bytes]], int]:
    """Decode every complete frame of ``data``; return (messages, other frames, end)."""
    n = len(data)
    pos = 0
    messages: list[Message] = []
    others: list[tuple[int, bytes]] = []
    add = messages.append
    unpack_msg = _FRAME_AND_MESSAGE_HEADER.unpack_from
    M = Message
    last = n - 34
    while True:
        # fast path: whole message frames, one unpack each
        while pos <= last:
            size, ftype, ts, attempts, mid = unpack_msg(data, pos)
            end = pos + 4 + size
            if ftype == 2 and 30 <= size <= max_size and end <= n:
                add(M(mid, data[pos + 34:end], ts, attempts, responder))
                pos = end
            else:
                break
        end, frame = _frame_at(data, pos, n, max_size)
        if frame is None:
            return messages, others, pos
        others.append(frame)
        pos = end


def _decode_blocks(data: bytes, responder: Responder | None, max_size: int
                   ) -> tuple[list["MessageBlock"], list[tuple[int, bytes]], int]:
    """Like _decode_bulk, but one MessageBlock per run of consecutive message frames."""
    n = len(data)
    pos = 0
    blocks: list[MessageBlock] = []
    others: list[tuple[int, bytes]] = []
    unpack = _FRAME_AND_ATTEMPTS.unpack_from
    last = n - _FRAME_AND_ATTEMPTS.size
    while True:
        offsets = array("i")
        add = offsets.append
        most = 0
        while pos <= last:
            size, ftype, attempts = unpack(data, pos)
            end = pos + 4 + size
            if ftype == 2 and 30 <= size <= max_size and end <= n:
                add(pos)
                if attempts > most:
                    most = attempts
                pos = end
            else:
                break
        if offsets:
            add(pos)
            blocks.append(MessageBlock(data, offsets, most, responder))
        end, frame = _frame_at(data, pos, n, max_size)
        if frame is None:
            return blocks, others, pos
        others.append(frame)
        pos = end


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


class MessageBlock:
    """Consecutive message frames of one read, kept as the received bytes and the frame
    boundaries: no object per message. The bulk form of delivery for consumers that handle
    messages as columns (:meth:`nsq_spark.Reader.get_blocks`; the Spark connector makes
    Arrow columns of a block without copying its frames into Python objects).

    Frame ``i`` is ``data[offsets[i]:offsets[i + 1]]``: size (4 bytes), frame type (4),
    timestamp (8, ns), attempts (2), id (16), body -- big-endian, fields at the offsets
    ``TIMESTAMP_AT``, ``ATTEMPTS_AT``, ``ID_AT``, ``BODY_AT`` of this module.

    Attributes:
        data: the bytes decoded (shared by the blocks of one read and their splits).
        offsets: ``array("i")`` of ``len(block) + 1`` frame boundaries into ``data``.
        max_attempts: at least the largest ``attempts`` in the block (exact when decoded,
            an upper bound after a split): a cheap "is any over max_tries?" test.
        responder: what answers for these messages (the Reader's connection slot).
    """

    __slots__ = ("data", "offsets", "max_attempts", "responder", "_responded")

    def __init__(self, data: bytes, offsets: "array[int]", max_attempts: int,
                 responder: Responder | None = None) -> None:
        self.data = data
        self.offsets = offsets
        self.max_attempts = max_attempts
        self.responder = responder
        self._responded = False

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __repr__(self) -> str:
        return f"<MessageBlock of {len(self)} messages from {self.nsqd_address}>"

    @property
    def nsqd_address(self) -> str | None:
        """``"host:port"`` of the nsqd that delivered these messages (None if unknown)."""
        r = self.responder
        return getattr(r, "address", None) if r is not None else None

    def split(self, k: int) -> tuple["MessageBlock", "MessageBlock"]:
        """The first ``k`` messages and the rest, as two blocks over the same bytes."""
        if not 0 < k < len(self):
            raise ValueError(f"split({k}) of a block of {len(self)} messages")
        off = self.offsets
        return (MessageBlock(self.data, off[:k + 1], self.max_attempts, self.responder),
                MessageBlock(self.data, off[k:], self.max_attempts, self.responder))

    def body_bytes(self, k: int | None = None) -> int:
        """Bytes of the bodies of the first ``k`` messages (None: all), from the offsets
        alone."""
        off = self.offsets
        k = len(self) if k is None else k
        return int(off[k] - off[0]) - k * BODY_AT

    def count_to_reach(self, nbytes: int) -> int:
        """How many leading messages it takes for their bodies to reach ``nbytes`` bytes:
        at least 1 (a message is taken whole), all of them when they never do."""
        n = len(self)
        if n == 0 or self.body_bytes(n) < nbytes:
            return n
        lo, hi = 1, n  # body_bytes(k) grows with k: the first k that reaches nbytes
        while lo < hi:
            mid = (lo + hi) // 2
            if self.body_bytes(mid) >= nbytes:
                hi = mid
            else:
                lo = mid + 1
        return lo

    def ids(self) -> list[bytes]:
        """The message ids, in order."""
        d = self.data
        return [d[s + ID_AT:s + BODY_AT] for s in self.offsets[:-1]]

    def attempts(self) -> list[int]:
        """The delivery attempts of each message, in order."""
        d = self.data
        return [(d[s + ATTEMPTS_AT] << 8) | d[s + ATTEMPTS_AT + 1] for s in self.offsets[:-1]]

    def messages(self) -> list[Message]:
        """The messages as Message objects (answering through the block's responder)."""
        d = self.data
        unpack = _MESSAGE_HEADER.unpack_from
        off = self.offsets
        out = []
        for i in range(len(off) - 1):
            s = off[i]
            ts, attempts, mid = unpack(d, s + TIMESTAMP_AT)
            out.append(Message(mid, d[s + BODY_AT:off[i + 1]], ts, attempts, self.responder))
        return out

    def select(self, keep: Sequence[bool]) -> list["MessageBlock"]:
        """The messages whose ``keep`` flag is true, as blocks of consecutive frames."""
        if len(keep) != len(self):
            raise ValueError(f"select() needs {len(self)} flags, got {len(keep)}")
        out = []
        off = self.offsets
        i, n = 0, len(keep)
        while i < n:
            if not keep[i]:
                i += 1
                continue
            j = i
            while j < n and keep[j]:
                j += 1
            out.append(MessageBlock(self.data, off[i:j + 1], self.max_attempts, self.responder))
            i = j
        return out

    def fin_commands(self) -> bytes:
        """``FIN <id>\\n`` for every message, as one buffer (numpy builds it when present:
        a few times cheaper per message than joining Python bytes)."""
        np = _numpy()
        d = self.data
        if np is None or sys.byteorder != "little":
            return b"".join([b"FIN " + d[s + ID_AT:s + BODY_AT] + b"\n"
                             for s in self.offsets[:-1]])
        starts = np.frombuffer(self.offsets, np.int32)[:-1]
        out = np.empty((len(starts), 21), np.uint8)
        out[:, :4] = np.frombuffer(b"FIN ", np.uint8)
        out[:, 4:20] = np.frombuffer(d, np.uint8)[starts[:, None] + np.arange(ID_AT, BODY_AT)]
        out[:, 20] = 10
        fins: bytes = out.tobytes()
        return fins


@lru_cache(maxsize=None)
def _numpy() -> Any:
    """numpy if installed (the Spark extra brings it), else None."""
    try:
        import numpy
    except ImportError:  # pragma: no cover - depends on the environment
        return None
    return numpy


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
        buf = self._join(data)
        if buf is None:
            return [], []
        if self.pause_gc and gc.isenabled():
            # Every object built here is alive until the chunk is handled, so the cyclic
            # collector, triggered every 700 allocations, would only traverse and promote
            # them: pause it for the chunk (as Mercurial does for bulk object creation).
            gc.disable()
            try:
                messages, others, end = _decode_bulk(buf, self.responder, self.max_frame_size)
            finally:
                gc.enable()
        else:
            messages, others, end = _decode_bulk(buf, self.responder, self.max_frame_size)
        self._keep_tail(buf, end)
        return messages, others

    def feed_blocks(self, data: bytes | bytearray | memoryview
                    ) -> tuple[list["MessageBlock"], list[tuple[int, bytes]]]:
        """Like :meth:`feed`, but the messages come as :class:`MessageBlock` s (one per run
        of consecutive message frames; usually one per chunk), not as Message objects."""
        buf = self._join(data)
        if buf is None:
            return [], []
        blocks, others, end = _decode_blocks(buf, self.responder, self.max_frame_size)
        self._keep_tail(buf, end)
        return blocks, others

    def _join(self, data: bytes | bytearray | memoryview) -> bytes | None:
        """The bytes to decode now: the kept tail plus ``data``; None while a large frame
        is still incomplete."""
        if type(data) is not bytes:
            data = bytes(data)
        if self._parts:
            self._parts.append(data)
            self._have += len(data)
            if self._have < self._need:
                return None
            data = b"".join(self._parts)
            self._parts = []
        elif self._tail:
            data = self._tail + data
        return data

    def _keep_tail(self, data: bytes, end: int) -> None:
        """Keep what follows the last complete frame for the next call."""
        n = len(data)
        if end == n:
            self._tail = b""
            return
        tail = data[end:]
        if n - end >= 4:
            need = _SIZE.unpack_from(tail, 0)[0] + 4
            if need - len(tail) > 65536:
                # a big frame still far from complete: collect pieces, join once
                self._parts = [tail]
                self._have = len(tail)
                self._need = need
                self._tail = b""
                return
        self._tail = tail

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
