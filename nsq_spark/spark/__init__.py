"""The PySpark connector: ``spark.readStream.format("nsq")`` and friends.

Spark (pyspark >= 4.0) finds the source on its own through the top-level module
``pyspark_nsq`` when this package is installed normally (not as an import-hook editable
install) and Spark's Python workers run a Python that has it; :func:`register` does it
explicitly, and in local mode also gives the workers this interpreter when
``PYSPARK_PYTHON`` is not set (a venv run without activating it)::

    import nsq_spark.spark
    nsq_spark.spark.register(spark)

Options: :mod:`nsq_spark.spark.options`. Spool protocol and guarantees:
:mod:`nsq_spark.spark._spool`. What each pyspark version supports:
:mod:`nsq_spark.spark._compat`; a feature the running one lacks is refused when the query
starts with :class:`SparkVersionError`, naming the version it needs. The source's lag
as numbers, for a ``StreamingQueryListener``: :func:`source_lag`
(:mod:`nsq_spark.spark.progress`); its consumed messages as OpenTelemetry metrics:
:class:`ProgressInstrument` (:mod:`nsq_spark.spark.instrument`).
"""

from __future__ import annotations

from typing import Any

from nsq_spark.errors import SparkSpoolError, SparkVersionError

from .instrument import ProgressInstrument
from .options import NSQOptionError
from .progress import SourceLag, source_lag

__all__ = ["register", "NSQDataSource", "NSQOptionError", "ProgressInstrument", "SourceLag",
           "SparkSpoolError", "SparkVersionError", "source_lag"]


def register(spark: Any) -> None:
    """Register the ``nsq`` data source with a SparkSession, and see that Spark's Python
    workers can import it; calling it again, or after pyspark's discovery registered it
    (``pyspark_nsq``), changes nothing.

    Spark's Python workers run ``PYSPARK_PYTHON``, else ``python3`` from the PATH, which
    is not a venv's unless it is activated. When ``PYSPARK_PYTHON`` (and
    ``spark.pyspark.python``) is not set and the master is local, the workers are given
    this interpreter, which has nsq-spark; on any other master one warning names
    ``PYSPARK_PYTHON`` and the fix (the rule: :mod:`nsq_spark.spark._python`).

    pyspark 4.1 and later replace a registered source of the same name; pyspark 4.0
    refuses with ``DATA_SOURCE_ALREADY_EXISTS``, which here means the source is there
    already (discovery registers this same class), so it is not an error."""
    from ._python import choose_worker_python
    from .datasource import NSQDataSource

    choose_worker_python(spark)
    try:
        spark.dataSource.register(NSQDataSource)
    except Exception as exc:
        if _error_condition(exc) != "DATA_SOURCE_ALREADY_EXISTS":
            raise


def _error_condition(exc: BaseException) -> str | None:
    """A pyspark error's condition (``getCondition``; ``getErrorClass`` before 4.0's
    rename), else None."""
    for name in ("getCondition", "getErrorClass"):
        get = getattr(exc, name, None)
        if callable(get):
            try:
                import warnings

                with warnings.catch_warnings():  # 4.0 warns that getErrorClass is renamed
                    warnings.simplefilter("ignore", FutureWarning)
                    value = get()
            except Exception:  # pragma: no cover - a pyspark error without one
                continue
            return str(value) if value is not None else None
    return None


def __getattr__(name: str) -> Any:
    if name == "NSQDataSource":
        from .datasource import NSQDataSource

        return NSQDataSource
    raise AttributeError(f"module 'nsq_spark.spark' has no attribute {name!r}")
