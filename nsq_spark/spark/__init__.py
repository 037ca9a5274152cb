"""The PySpark connector: ``spark.readStream.format("nsq")`` and friends.

Spark (pyspark >= 4.0) finds the source on its own through the top-level module
``pyspark_nsq`` when this package is installed normally (not as an import-hook editable
install); :func:`register` does it explicitly::

    import nsq_spark.spark
    nsq_spark.spark.register(spark)

Options: :mod:`nsq_spark.spark.options`. Spool protocol and guarantees:
:mod:`nsq_spark.spark.spool`. What each pyspark version supports:
:mod:`nsq_spark.spark._compat`; a feature the running one lacks is refused when the query
starts with :class:`SparkVersionError`, naming the version it needs. The source's lag
as numbers, for a ``StreamingQueryListener``: :func:`source_lag`
(:mod:`nsq_spark.spark.progress`).
"""

from __future__ import annotations

from typing import Any

from nsq_spark.errors import SparkVersionError

from .options import NSQOptionError
from .progress import SourceLag, source_lag

__all__ = ["register", "NSQDataSource", "NSQOptionError", "SourceLag", "SparkVersionError",
           "source_lag"]


def register(spark: Any) -> None:
    """Register the ``nsq`` data source with a SparkSession."""
    from .datasource import NSQDataSource

    spark.dataSource.register(NSQDataSource)


def __getattr__(name: str) -> Any:
    if name == "NSQDataSource":
        from .datasource import NSQDataSource

        return NSQDataSource
    raise AttributeError(f"module 'nsq_spark.spark' has no attribute {name!r}")
