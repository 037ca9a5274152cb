"""nsq_spark: a fast, full-spec NSQ client for Python, with a PySpark connector.

``import nsq_spark as nsq`` is meant as a drop-in upgrade for pynsq's Reader API:
``nsq.Reader``, ``nsq.Message``, ``nsq.run()``; ``nsq.Producer`` publishes.

Names are imported on first use, so ``import nsq_spark`` stays cheap (Spark executors
import it for every task) and the optional parts (Spark, dedup backends) load only when
asked for.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0.dev0"

# public name -> module that defines it
_EXPORTS = {
    "Reader": "nsq_spark.reader",
    "run": "nsq_spark.reader",
    "Message": "nsq_spark.message",
    "Producer": "nsq_spark.producer",
    "Writer": "nsq_spark.producer",
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
