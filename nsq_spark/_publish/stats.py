"""What a Producer counts, and when it says that an nsqd went down or came back.

Counters are in *messages* and body *bytes* (an MPUB of 100 bodies counts 100), so they
can be compared with nsqd's own ``message_count`` and exported as they are:

``messages``  messages nsqd acknowledged
``bytes``     body bytes of those messages
``retries``   attempts repeated after a transient failure (one per extra attempt)
``errors``    messages whose publish failed for good (the caller got the exception)
``commands``  PUB/MPUB/DPUB commands (or HTTP requests) acknowledged

Per nsqd (``"nsqd": {address: {...}}``): ``up`` (True, False, or None before the first
attempt), ``messages``, ``bytes``, ``last_error``. An nsqd's transitions are logged once
each, not once per failed attempt: WARNING when it goes down (with the address and the
reason), INFO when it is reachable again.

Thread-safe: the blocking path records from the callers' threads, the pipelined path from
the IO loop.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from .._log import ContextLogger

__all__ = ["PublishStats", "command_size"]

_MPUB = ord("M")


def command_size(data: bytes) -> tuple[int, int]:
    """``(messages, body bytes)`` of an encoded PUB, DPUB or MPUB command (O(1): reads
    the header, not the bodies)."""
    head = data.index(b"\n") + 1
    if data[0] == _MPUB:
        # MPUB: u32 size of the rest, u32 count, then u32 size + body per message
        count = int.from_bytes(data[head + 4:head + 8], "big")
        return count, len(data) - head - 8 - 4 * count
    return 1, len(data) - head - 4     # PUB/DPUB: u32 size, body


class _Nsqd:
    __slots__ = ("up", "last_error")

    def __init__(self) -> None:
        self.up: bool | None = None
        self.last_error: str | None = None


class _Counts:
    """Acknowledged commands, messages and bytes, in total and per nsqd. Written by one
    writer at a time (see :class:`PublishStats`)."""

    __slots__ = ("commands", "messages", "bytes", "per_nsqd")

    def __init__(self) -> None:
        self.commands = 0
        self.messages = 0
        self.bytes = 0
        self.per_nsqd: dict[str | None, list[int]] = {}   # address -> [messages, bytes]

    def add(self, messages: int, size: int, address: str | None) -> None:
        self.commands += 1
        self.messages += messages
        self.bytes += size
        entry = self.per_nsqd.get(address)
        if entry is None:
            entry = self.per_nsqd[address] = [0, 0]
        entry[0] += messages
        entry[1] += size


def _size(data: bytes) -> tuple[int, int]:
    if data[0] == _MPUB:
        return command_size(data)
    return 1, len(data) - data.index(b"\n") - 5     # PUB/DPUB, inlined: the hot path


class PublishStats:
    """The counters of one producer, and the up/down state of each nsqd it uses.

    ``log`` is the logger the transitions go to (the facade's own, so users filter on
    ``nsq_spark.producer``). Acknowledgements counted on the IO loop (:meth:`acked_on_loop`,
    one thread) take no lock; those of the blocking callers' threads (:meth:`acked`) do.
    """

    def __init__(self, log: logging.Logger | ContextLogger) -> None:
        self._log = log if isinstance(log, ContextLogger) else ContextLogger(log)
        self._lock = threading.Lock()
        self._loop_counts = _Counts()       # only the IO loop's thread writes these
        self._thread_counts = _Counts()     # under _lock
        self.retries = 0
        self.errors = 0
        self._nsqd: dict[str, _Nsqd] = {}

    def _entry(self, address: str) -> _Nsqd:
        entry = self._nsqd.get(address)
        if entry is None:
            entry = self._nsqd[address] = _Nsqd()
        return entry

    def acked_on_loop(self, data: bytes, address: str | None) -> None:
        """nsqd acknowledged the command ``data``; called on the producer's event loop."""
        messages, size = _size(data)
        self._loop_counts.add(messages, size, address)

    def acked(self, data: bytes, address: str | None) -> None:
        """nsqd acknowledged the command ``data``; from any thread."""
        messages, size = _size(data)
        with self._lock:
            self._thread_counts.add(messages, size, address)

    def acked_http(self, messages: int, size: int, address: str) -> None:
        """An HTTP request was answered 200 (on the producer's event loop)."""
        self._loop_counts.add(messages, size, address)

    @property
    def commands(self) -> int:
        return self._loop_counts.commands + self._thread_counts.commands

    def failed(self, data: bytes | None, messages: int = 1) -> None:
        """The publish of ``data`` (or of ``messages`` messages) failed for good."""
        if data is not None:
            messages = command_size(data)[0]
        with self._lock:
            self.errors += messages

    def retried(self, attempts: int = 1) -> None:
        with self._lock:
            self.retries += attempts

    def down(self, address: str, exc: BaseException) -> None:
        """``address`` failed (connect refused, connection lost): logs on the transition."""
        with self._lock:
            entry = self._entry(address)
            entry.last_error = str(exc) or type(exc).__name__
            was = entry.up
            entry.up = False
        if was is not False:
            self._log.for_nsqd(address).warning(
                "nsqd %s is down: %s (publishing retries it, or uses the "
                "other nsqd given)", address, entry.last_error)

    def up(self, address: str) -> None:
        """``address`` answered (connected): logs when it had been down."""
        with self._lock:
            entry = self._entry(address)
            was = entry.up
            entry.up = True
        if was is False:
            self._log.for_nsqd(address).info("nsqd %s is up again", address)

    def is_up(self, address: str) -> bool | None:
        entry = self._nsqd.get(address)
        return None if entry is None else entry.up

    def snapshot(self) -> dict[str, Any]:
        """The counters as a dict (the keys of the module doc)."""
        with self._lock:
            parts = (self._loop_counts, self._thread_counts)
            per: dict[str, list[int]] = {}
            for counts in parts:
                for address, (messages, size) in list(counts.per_nsqd.items()):
                    if address is not None:
                        entry = per.setdefault(address, [0, 0])
                        entry[0] += messages
                        entry[1] += size
            nsqd = {}
            for address in sorted(set(per) | set(self._nsqd)):
                state = self._nsqd.get(address) or _Nsqd()
                messages, size = per.get(address, (0, 0))
                nsqd[address] = {"up": state.up, "messages": messages, "bytes": size,
                                 "last_error": state.last_error}
            return {
                "messages": sum(c.messages for c in parts),
                "bytes": sum(c.bytes for c in parts),
                "retries": self.retries, "errors": self.errors,
                "commands": sum(c.commands for c in parts),
                "nsqd": nsqd,
            }
