"""What the running pyspark's Python data source API offers: decided here, once.

The ``nsq`` source runs on pyspark 4.0 and later (the Python data source API came with
4.0). What each minor version adds, found by reading each version's
``pyspark/sql/datasource.py``, ``pyspark/sql/streaming/datasource.py`` and the planner
process ``pyspark/sql/streaming/python_streaming_source_runner.py`` (the JVM side
``PythonMicroBatchStream`` read with ``javap``):

========================  =====  =====  =====  =====
feature                    4.0    4.1    4.2    4.3
========================  =====  =====  =====  =====
batch read, batch write    yes    yes    yes    yes
streaming read             yes    yes    yes    yes
streaming write            no     yes    yes    yes
admission control          no     no     yes    yes
========================  =====  =====  =====  =====

* streaming write: ``DataSourceStreamArrowWriter`` (the Arrow stream writer our sink is)
  exists from 4.1 on.
* admission control: ``pyspark.sql.streaming.datasource`` (``ReadLimit``, ``ReadMaxRows``,
  ``ReadMinRows``, ``ReadMaxBytes``, ``SupportsTriggerAvailableNow``) and a planner that calls ``latestOffset(start, limit)``,
  ``prepareForTriggerAvailableNow()`` and ``reportLatestOffset()``: from 4.2 on. The 4.0
  and 4.1 planners call ``latestOffset()`` with no argument; the stream reader then keeps
  the start offset itself (see :mod:`.datasource`).

The checks test for the API itself (an import), not the version string, so a patch
release or a vendor build with the API backported works; the version only goes into the
messages. :data:`API` is what :mod:`.datasource` consults; :func:`require` refuses a
feature with :class:`~nsq_spark.errors.SparkVersionError` naming the version it needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nsq_spark.errors import SparkVersionError

try:
    import pyspark
    from pyspark.sql.datasource import DataSource as _DataSource  # noqa: F401 (4.0+)
except ImportError as exc:  # pyspark missing, or older than the Python data source API
    import importlib.metadata as _md

    try:
        _found = _md.version("pyspark")
    except _md.PackageNotFoundError:
        _found = "not installed"
    raise SparkVersionError(
        f"the nsq Spark data source needs pyspark >= 4.0 (found {_found}): the Python data "
        f"source API came with Spark 4.0 ({exc}); pip install 'nsq-spark[spark]'") from exc

try:  # 4.1+: the Arrow stream writer the sink is built on
    from pyspark.sql.datasource import DataSourceStreamArrowWriter as StreamArrowWriterBase
    _STREAM_ARROW_WRITER = True
except ImportError:  # 4.0: a stand-in base; NSQDataSource.streamWriter refuses first
    from pyspark.sql.datasource import (  # type: ignore[assignment]
        DataSourceStreamWriter as StreamArrowWriterBase)
    _STREAM_ARROW_WRITER = False

ReadAllAvailable: Any
ReadMaxRows: Any
ReadMinRows: Any
ReadMaxBytes: Any
try:  # 4.2+: read limits and Trigger.AvailableNow for Python stream readers
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows
    from pyspark.sql.streaming.datasource import (
        SupportsTriggerAvailableNow as TriggerAvailableNowBase)
    _ADMISSION_CONTROL = True
except ImportError:  # 4.0, 4.1: the planner never asks; a plain base keeps the MRO simple
    ReadAllAvailable = ReadMaxRows = None
    _ADMISSION_CONTROL = False

    class TriggerAvailableNowBase:  # type: ignore[no-redef]
        """Stand-in: pyspark < 4.2 has no ``SupportsTriggerAvailableNow``."""
try:  # ReadMinRows and ReadMaxBytes came with the others (4.2); a build without them
    # gets the options applied by the source alone, as on 4.0 and 4.1
    from pyspark.sql.streaming.datasource import ReadMaxBytes, ReadMinRows
except ImportError:
    ReadMinRows = ReadMaxBytes = None

_FOUND = pyspark.__version__

__all__ = ["API", "SparkAPI", "require", "StreamArrowWriterBase", "TriggerAvailableNowBase",
           "ReadAllAvailable", "ReadMaxBytes", "ReadMaxRows", "ReadMinRows"]


@dataclass(frozen=True)
class SparkAPI:
    """What the running pyspark's Python data source API supports."""

    version: str
    #: ``DataSourceStreamArrowWriter``: ``df.writeStream.format("nsq")`` (4.1+)
    stream_write: bool
    #: ``latestOffset(start, limit)``, read limits, ``Trigger.AvailableNow``,
    #: ``reportLatestOffset`` (4.2+)
    admission_control: bool


API = SparkAPI(_FOUND, _STREAM_ARROW_WRITER, _ADMISSION_CONTROL)

#: feature -> (the pyspark it needs, what that version brought, the way out)
NEEDS: dict[str, tuple[str, str, str]] = {
    "stream_write": (
        "4.1", "pyspark 4.0 has no DataSourceStreamArrowWriter, the Python streaming sink API",
        "upgrade pyspark, or publish each micro-batch with foreachBatch: "
        "df.writeStream.foreachBatch(lambda batch, _: batch.write.format('nsq')"
        ".options(**opts).save())"),
}

_WHAT = {"stream_write": "streaming writes (df.writeStream.format('nsq'))"}


def require(feature: str, api: SparkAPI = API) -> None:
    """Raise :class:`SparkVersionError` unless ``api`` supports ``feature`` (a key of
    :data:`NEEDS`)."""
    if getattr(api, feature):
        return
    need, why, fix = NEEDS[feature]
    raise SparkVersionError(f"{_WHAT[feature]} need pyspark >= {need} (found {api.version}): "
                            f"{why}; {fix}")
