"""The connector's log lines in Spark's output, at the level the user chose.

Spark's Python workers -- the executors' fetch and publish tasks, and the runner that
calls the streaming source's ``latestOffset`` / ``commit`` for the driver -- start with no
logging handler: the ``nsq_spark`` loggers' INFO lines went nowhere, and WARNING and above
reached stderr only through Python's last-resort handler, with no time or logger name.

:func:`configure` is called by the source's and sink's entry points in every worker (cheap
after the first call). It sets the level of the ``nsq_spark`` logger from the ``logLevel``
option (``DEBUG``, ``INFO``, ``WARN``, ``ERROR``), else from the environment variable
``NSQ_SPARK_LOG_LEVEL`` of the worker (``spark.executorEnv.NSQ_SPARK_LOG_LEVEL`` on a
cluster), else ``WARN``: the connector's INFO lines come per task and per connection
(connecting, subscribed, timings, backlog per trigger), too many for a long-running query
by default; INFO is for looking into one. Once per process it adds one stderr handler to
the ``nsq_spark`` logger, unless the root logger has handlers already: whoever configured
root (a user's ``logging.basicConfig``, Spark's Python worker logging) then owns the
output and the lines propagate to it, so none is written twice. The root logger itself is
never touched. In local mode the workers' stderr is the driver process's stderr; on a
cluster, each executor's ``stderr`` log (Spark UI, Executors tab).

Format, with the fetch task's topic, channel, batch and partition on each of its lines
(the Reader's lines too, which come from its IO thread: a Python worker runs one task at a
time, so the label is per process)::

    2026-11-25 01:02:03,456 INFO nsq_spark.spark._fetch [t/c batch 3 part 1] batch 3 ...

With ``NSQ_SPARK_LOG_FORMAT=json`` in the worker's environment
(``spark.executorEnv.NSQ_SPARK_LOG_FORMAT`` on a cluster) that handler writes one JSON
object per line instead, with the fields below (needs the ``json-logs`` extra:
python-json-logger).

The same task context is on every record as fields (:mod:`nsq_spark._log`): ``topic``,
``channel``, ``spark_query``, ``spark_batch``, ``spark_partition``, so a JSON formatter
(docs/logging.md) emits them; :func:`task` sets both, the text label being made from the
fields by :func:`label_of` when not given.
"""

from __future__ import annotations

import logging
import os
import sys
from contextlib import contextmanager
from typing import Any, Iterator, Mapping, TypeVar

from .._log import task_fields

__all__ = ["ENV", "FORMAT_ENV", "LEVELS", "configure", "json_formatter", "label_of",
           "parse_level", "task", "task_rows"]

T = TypeVar("T")

ENV = "NSQ_SPARK_LOG_LEVEL"
FORMAT_ENV = "NSQ_SPARK_LOG_FORMAT"  # "text" (default) or "json"
DEFAULT = "WARNING"
# Spark's names (WARN) and Python's (WARNING) alike
LEVELS = {"DEBUG": "DEBUG", "INFO": "INFO", "WARN": "WARNING", "WARNING": "WARNING",
          "ERROR": "ERROR"}
FORMAT = "%(asctime)s %(levelname)s %(name)s [%(nsq_task)s] %(message)s"
JSON_FORMAT = "{asctime}{levelname}{name}{message}"  # and every field of the record

_task = "-"  # the label of the task running in this process


def parse_level(value: str) -> str | None:
    """Python's name of a level given as Spark or Python names it; None if unknown."""
    return LEVELS.get(value.strip().upper())


class _TaskLabel(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.nsq_task = _task
        return True


class _Stderr(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to the *current* ``sys.stderr`` (a worker may swap it for a while)."""

    def __init__(self) -> None:
        super().__init__()

    @property
    def stream(self) -> object:
        return sys.stderr

    @stream.setter
    def stream(self, _value: object) -> None:
        pass


def configure(level: str | None = None) -> None:
    """Set the ``nsq_spark`` logger's level (``level``, else ``$NSQ_SPARK_LOG_LEVEL``, else
    WARN) and add its stderr handler once per process unless root has handlers (text, or
    JSON with ``$NSQ_SPARK_LOG_FORMAT=json``)."""
    logger = logging.getLogger("nsq_spark")
    name = parse_level(level or os.environ.get(ENV) or "") or DEFAULT
    logger.setLevel(name)
    if any(isinstance(h, _Stderr) for h in logger.handlers) or logging.getLogger().handlers:
        return
    handler = _Stderr()
    if os.environ.get(FORMAT_ENV, "").strip().lower() == "json":
        handler.setFormatter(json_formatter())
    else:
        handler.setFormatter(logging.Formatter(FORMAT))
        handler.addFilter(_TaskLabel())
    logger.addHandler(handler)


def json_formatter() -> logging.Formatter:
    """python-json-logger's formatter: time, level, logger name, message, and every
    structured field of the record (:data:`nsq_spark._log.FIELDS`) as a JSON field."""
    try:
        from pythonjsonlogger.json import JsonFormatter
    except ImportError:
        raise ImportError(f"{FORMAT_ENV}=json needs python-json-logger in the Spark "
                          "workers' Python: pip install 'nsq-spark[json-logs]'") from None
    return JsonFormatter(JSON_FORMAT, style="{")


def label_of(fields: Mapping[str, Any]) -> str:
    """The text label of a task's fields: ``topic/channel batch 3 part 1`` (a streaming
    fetch), ``topic/channel read part 1`` (a batch read), ``-`` for none."""
    words = []
    if "topic" in fields:
        words.append(f"{fields['topic']}/{fields.get('channel', '-')}")
    if "spark_batch" in fields:
        words.append(f"batch {fields['spark_batch']}")
    elif "spark_partition" in fields:
        words.append("read")
    if "spark_partition" in fields:
        words.append(f"part {fields['spark_partition']}")
    return " ".join(words) or "-"


@contextmanager
def task(label: str | None = None, **fields: Any) -> Iterator[None]:
    """Label the lines logged in this process while a task runs, and put ``fields`` (names
    of :data:`nsq_spark._log.FIELDS`: ``topic``, ``channel``, ``spark_query``,
    ``spark_batch``, ``spark_partition``) on its records (see the module doc). ``label``:
    the text format's label; default :func:`label_of` the fields."""
    global _task
    previous, _task = _task, label if label is not None else label_of(fields)
    try:
        with task_fields(**fields):
            yield
    finally:
        _task = previous


def task_rows(level: str | None, rows: Iterator[T], **fields: Any) -> Iterator[T]:
    """``rows`` (a task's generator, which does its work as it is iterated) with the
    logging configured and every record of the task carrying ``fields`` (:func:`task`)."""
    configure(level)
    with task(**fields):
        yield from rows
