"""Old import path of :class:`nsq_spark.compat.writer.Writer` (pynsq's Writer), kept for
users: ``from nsq_spark.writer import Writer`` works as before. New code imports
``nsq_spark.Writer`` or :mod:`nsq_spark.compat.writer`."""

from __future__ import annotations

from nsq_spark.compat.writer import Writer

__all__ = ["Writer"]
