"""pynsq's deprecated ``LegacyReader``: one Reader per "task" of ``all_tasks``
(``{name: handler}``), each on channel ``channel.name`` (or ``channel`` itself when there is
a single task). Kept so that pre-0.5 pynsq programs run; write Readers instead."""

from __future__ import annotations

import warnings
from typing import Any, Callable

from .._consumer.reader import Reader
from ..errors import ConfigError

__all__ = ["LegacyReader"]

# pynsq's positional order of the old constructor
_POSITIONAL = ("all_tasks", "topic", "channel", "nsqd_tcp_addresses",
               "lookupd_http_addresses", "max_tries", "max_in_flight", "requeue_delay",
               "lookupd_poll_interval", "low_rdy_idle_timeout", "heartbeat_interval",
               "max_backoff_duration")


class LegacyReader:
    """``LegacyReader(all_tasks, topic, channel, ...)``: ``readers`` holds one Reader per
    task. Deprecated (a DeprecationWarning says so)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        warnings.warn("LegacyReader is deprecated: make one Reader per handler "
                      "(each with its own channel)", DeprecationWarning, stacklevel=2)
        if len(args) > len(_POSITIONAL):
            raise ConfigError(f"LegacyReader takes at most {len(_POSITIONAL)} positional "
                              f"arguments ({', '.join(_POSITIONAL)}), got {len(args)}")
        options = dict(zip(_POSITIONAL, args))
        for key, value in kwargs.items():
            if key in options:
                raise ConfigError(f"LegacyReader got {key!r} twice (positionally and by name)")
            options[key] = value
        missing = [k for k in ("all_tasks", "topic", "channel") if k not in options]
        if missing:
            raise ConfigError(f"LegacyReader needs {', '.join(missing)}")
        all_tasks: dict[str, Callable[..., Any]] = options.pop("all_tasks")
        topic, channel = options.pop("topic"), options.pop("channel")
        if not isinstance(all_tasks, dict) or not all_tasks:
            raise ConfigError("all_tasks must be a non-empty dict {task name: handler}")
        for task, handler in all_tasks.items():
            if not callable(handler):
                raise ConfigError(f"all_tasks[{task!r}] must be callable, not "
                                  f"{type(handler).__name__}")
        self.readers: list[Reader] = [
            Reader(topic=topic, channel=channel if len(all_tasks) == 1 else f"{channel}.{task}",
                   message_handler=handler, **options)
            for task, handler in all_tasks.items()]
