"""nsq_spark: a fast, full-spec NSQ client for Python, with a PySpark connector.

``import nsq_spark as nsq`` is meant as a drop-in upgrade for pynsq's Reader API:
``nsq.Reader``, ``nsq.Message``, ``nsq.run()``; ``nsq.Producer`` publishes.

Names are imported on first use, so ``import nsq_spark`` stays cheap (Spark executors
import it for every task) and the optional parts (Spark, dedup backends) load only when
asked for.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    # Type checkers and IDEs see the real classes through the top-level names; at run
    # time they are loaded lazily by __getattr__ below (keep both lists in step: a unit
    # test compares them).
    from nsq_spark.config import ConnectionConfig
    from nsq_spark.conn import Connection
    from nsq_spark.errors import NSQError
    from nsq_spark.errors import NSQError as Error
    from nsq_spark.message import Message
    from nsq_spark.producer import Producer
    from nsq_spark.writer import Writer
    from nsq_spark.publish_spool import SpoolingProducer
    from nsq_spark.reader import Reader, run

__version__ = "0.1.0.dev0"

# public name -> module that defines it
_EXPORTS = {
    "Reader": "nsq_spark.reader",
    "run": "nsq_spark.reader",
    "Message": "nsq_spark.message",
    "Producer": "nsq_spark.producer",
    "Writer": "nsq_spark.writer",
    "SpoolingProducer": "nsq_spark.publish_spool",
    "Connection": "nsq_spark.conn",
    "ConnectionConfig": "nsq_spark.config",
    "NSQError": "nsq_spark.errors",
}
# pynsq's name for the base error (callbacks check ``isinstance(data, nsq.Error)``)
_ALIASES = {"Error": ("nsq_spark.errors", "NSQError")}

__all__ = ["__version__", *_EXPORTS, *_ALIASES]


def __getattr__(name: str) -> Any:
    module, attr = _ALIASES.get(name) or (_EXPORTS.get(name), name)
    if module is None:
        raise AttributeError(f"module 'nsq_spark' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
