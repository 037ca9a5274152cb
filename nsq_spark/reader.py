"""The Reader's historical module path: ``from nsq_spark.reader import Reader, run``.

The consumer lives in :mod:`nsq_spark.consumer` (the Reader facade and its parts); this
module re-exports its public names.
"""

from __future__ import annotations

from .consumer.pool import CLOSE_QUIET, CLOSE_QUIET_MAX
from .consumer.reader import BatchHandler, MessageHandler, Reader
from .consumer.run import run

__all__ = ["Reader", "run", "MessageHandler", "BatchHandler", "CLOSE_QUIET", "CLOSE_QUIET_MAX"]
