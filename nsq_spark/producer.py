"""Old import path of the Producer, kept for users: ``from nsq_spark.producer import
Producer`` (and ``Writer``, ``is_transient``) keeps working. The Producer lives in
:mod:`nsq_spark.publish.producer`; the project itself imports it from there."""

from __future__ import annotations

import importlib
from typing import Any

from nsq_spark.errors import is_transient as is_transient  # the one classification
from nsq_spark.publish.producer import DEFAULT_MAX_MPUB_BYTES, Producer

__all__ = ["Producer", "Writer", "is_transient", "DEFAULT_MAX_MPUB_BYTES"]


def __getattr__(name: str) -> Any:
    # `from nsq_spark.producer import Writer` keeps working; loaded on first use only, as
    # before (pynsq's surface is not needed to publish)
    if name == "Writer":
        return importlib.import_module("nsq_spark.writer").Writer
    raise AttributeError(f"module 'nsq_spark.producer' has no attribute {name!r}")
