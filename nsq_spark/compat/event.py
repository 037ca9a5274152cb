"""pynsq's event names and the listener registry its connections use (``on``, ``off``,
``trigger``). Kept pynsq's contract: a callback registered twice is an error, removing one
that is not registered is an error, callbacks run in registration order with the
trigger's arguments."""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Callable

from ..errors import NSQError

__all__ = ["EventedMixin", "DuplicateListenerError", "InvalidListenerError",
           "CONNECT", "CLOSE", "DATA", "ERROR", "IDENTIFY", "READY", "RESPONSE", "MESSAGE",
           "HEARTBEAT", "BACKOFF", "CONTINUE", "RESUME", "REQUEUE", "TOUCH", "FINISH", "AUTH",
           "AUTH_RESPONSE", "IDENTIFY_RESPONSE"]

CONNECT = "connect"
CLOSE = "close"
DATA = "data"
ERROR = "error"
IDENTIFY = "identify"
READY = "ready"
RESPONSE = "response"
MESSAGE = "message"
HEARTBEAT = "heartbeat"
BACKOFF = "backoff"
CONTINUE = "continue"
RESUME = "resume"
REQUEUE = "requeue"
TOUCH = "touch"
FINISH = "finish"
AUTH = "auth"
AUTH_RESPONSE = "auth_response"
IDENTIFY_RESPONSE = "identify_response"


class DuplicateListenerError(NSQError):
    """The callback already listens to that event."""


class InvalidListenerError(NSQError):
    """``off`` for a callback that does not listen to that event."""


class EventedMixin:
    """Named events with listeners, as pynsq's connections have them."""

    def __init__(self) -> None:
        self._listeners: defaultdict[str, list[Callable[..., Any]]] = defaultdict(list)

    def on(self, name: str, callback: Callable[..., Any]) -> None:
        """Call ``callback(**kwargs)`` each time event ``name`` is triggered."""
        if not callable(callback):
            raise TypeError(f"callback for event {name!r} must be callable, not "
                            f"{type(callback).__name__}")
        if callback in self._listeners[name]:
            raise DuplicateListenerError(f"{callback!r} already listens to {name!r}")
        self._listeners[name].append(callback)

    def off(self, name: str, callback: Callable[..., Any]) -> None:
        """Stop calling ``callback`` for event ``name``."""
        if callback not in self._listeners[name]:
            raise InvalidListenerError(f"{callback!r} does not listen to {name!r}")
        self._listeners[name].remove(callback)

    def trigger(self, name: str, *args: Any, **kwargs: Any) -> None:
        """Call every listener of ``name`` (a copy of the list: listeners may unregister)."""
        for callback in list(self._listeners[name]):
            callback(*args, **kwargs)
