"""Spark's automatic discovery hook for the ``nsq`` data source.

pyspark (>= 4.0) imports every top-level module whose name starts with ``pyspark_`` and
registers its ``DefaultSource`` under ``DefaultSource.name()``, so
``spark.readStream.format("nsq")`` works with no register call once nsq-spark is
installed. ``nsq_spark.spark.register(spark)`` is the explicit alternative.
"""

from nsq_spark.spark.datasource import NSQDataSource


class DefaultSource(NSQDataSource):
    """The ``nsq`` data source (see :class:`nsq_spark.spark.datasource.NSQDataSource`)."""


__all__ = ["DefaultSource"]
