"""Which Python Spark's Python workers run, decided once, when :func:`register` is called.

Spark starts its Python workers (the data source's planner and readers, UDFs) with
``PYSPARK_PYTHON``, else ``spark.pyspark.python``, else ``python3`` from the PATH. Run as
``venv/bin/python app.py`` without activating the venv, ``python3`` is the system's,
without nsq-spark: the query fails in a worker with ``No module named 'nsq_spark'`` (or,
for the source found by ``pyspark_nsq``, ``[DATA_SOURCE_NOT_FOUND] ... nsq``), far from the
cause.

The rule:

* ``PYSPARK_PYTHON`` or ``spark.pyspark.python`` set: the user's choice, kept.
* a local master (``local``, ``local[N]``, ``local-cluster[...]``): the workers run on this
  machine, so this interpreter (``sys.executable``, which has nsq-spark: it is running
  this code) is safe for them; the session's Python for new Python functions is set to it.
* any other master: the workers run elsewhere, where this interpreter's path may not
  exist; nothing is changed, and one warning names ``PYSPARK_PYTHON`` and the fix.
* Spark Connect (no ``sparkContext``): the server starts the workers; nothing to do.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from nsq_spark._log import get_logger

log = get_logger("nsq_spark.spark")

__all__ = ["choose_worker_python"]

_CONF = "spark.pyspark.python"


def _context(spark: Any) -> Any:
    try:
        return spark.sparkContext
    except Exception:  # Spark Connect: "not supported", whatever its exception class
        return None


def choose_worker_python(spark: Any) -> str | None:
    """Apply the rule above to ``spark``'s context; the Python its workers will run when
    this call set it, else None."""
    sc = _context(spark)
    if sc is None or not hasattr(sc, "pythonExec"):
        return None
    if os.environ.get("PYSPARK_PYTHON") or sc.getConf().get(_CONF):
        return None
    master = str(sc.master)
    if master.startswith("local"):
        if sc.pythonExec != sys.executable:
            log.info("Spark's Python workers run %s (this interpreter, local master %s) "
                     "instead of %r: set PYSPARK_PYTHON to choose another",
                     sys.executable, master, sc.pythonExec)
            sc.pythonExec = sys.executable
        return str(sys.executable)
    log.warning("Spark's Python workers run %r (PYSPARK_PYTHON is not set) on the master "
                "%s's executors: that Python must have nsq-spark installed on every "
                "worker, else the query fails with \"No module named 'nsq_spark'\"; set "
                "PYSPARK_PYTHON (or %s) to a Python that has it", sc.pythonExec, master,
                _CONF)
    return None
