"""Old import path of the Producer, kept for users: ``from nsq_spark.producer import
Producer`` (and ``Writer``, ``is_transient``) keeps working. The Producer lives in
:mod:`nsq_spark._publish.producer`; the project itself imports it from there."""

from __future__ import annotations

from nsq_spark.compat.writer import Writer
from nsq_spark.errors import is_transient as is_transient  # the one classification
from nsq_spark._publish.producer import DEFAULT_MAX_MPUB_BYTES, Producer

__all__ = ["Producer", "Writer", "is_transient", "DEFAULT_MAX_MPUB_BYTES"]
