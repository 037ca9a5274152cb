"""The Reader's historical module path: ``from nsq_spark.reader import Reader, run``.

The consumer lives in :mod:`nsq_spark._consumer` (the Reader facade and its parts); this
module re-exports its public names, and the names pynsq programs import from
``nsq.reader`` (``_utf8_params``, ``AsyncConn``, ``BackoffTimer``, ``Message``).
"""

from __future__ import annotations

from .compat.async_conn import AsyncConn
from .compat.backoff_timer import BackoffTimer
from .compat.reader_names import _utf8_params
from ._consumer.pool import CLOSE_QUIET, CLOSE_QUIET_MAX
from ._consumer.reader import BatchHandler, MessageHandler, Reader
from ._consumer.run import run
from .message import Message

__all__ = ["Reader", "run", "MessageHandler", "BatchHandler", "CLOSE_QUIET", "CLOSE_QUIET_MAX",
           "_utf8_params", "AsyncConn", "BackoffTimer", "Message"]
