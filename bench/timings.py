"""The benchmarks' observer of fetch-task timings: one JSON file per task in the directory
``NSQ_SPARK_TIMINGS_DIR`` (Spark's Python workers are other processes, so the files are
the side channel). :func:`install` names the observer in the environment
(``NSQ_SPARK_TASK_OBSERVER``, read by each worker at its first task) before the Spark
session starts, so that the workers inherit it; the package never writes these files
itself."""

from __future__ import annotations

import json
import os
import uuid

from nsq_spark.spark._fetch_task import OBSERVER_ENV

TIMINGS_DIR_ENV = "NSQ_SPARK_TIMINGS_DIR"


def write_json(timings: dict[str, float]) -> None:
    out = os.environ.get(TIMINGS_DIR_ENV)
    if out:
        with open(os.path.join(out, f"{uuid.uuid4().hex}.json"), "w") as f:
            json.dump(timings, f)


def install(timings_dir: str) -> None:
    """Before the Spark session starts: every fetch task of this process and of the
    workers it starts writes its timings under ``timings_dir``."""
    os.environ[TIMINGS_DIR_ENV] = timings_dir
    os.environ[OBSERVER_ENV] = f"{__name__}:write_json"
