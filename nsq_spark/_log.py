"""The one way the library's log records get their structured fields (``extra=``).

Every module logs through a :class:`ContextLogger` (a :class:`logging.LoggerAdapter`) from
:func:`get_logger`. A part binds what it knows once, where it is built
(``self._log = log.bind(nsqd=address, topic=topic)``), and every line it logs carries
those fields as attributes of the :class:`logging.LogRecord`, so a JSON formatter emits
them as fields and a filter can select on them; no call site builds a dict. The message
texts are unchanged: the address stays in the text too.

Three layers are merged per record, later ones winning: the process's Spark task fields
(:func:`task_fields`, set by :mod:`nsq_spark.spark._logs` while a Spark task runs: a Python
worker runs one task at a time, and the Reader's IO thread logs for that task too), the
fields bound to the logger, and a call's own ``extra=``.

Costs: a disabled line costs one call more than on a plain ``Logger`` (each level's
method asks ``isEnabledFor`` before anything is built); one small dict per emitted
record.

Secrets: values are redacted once, when bound (:func:`nsq_spark._validate.redact_url`: a
URL's password and secret query parameters), a record's string arguments as it is logged,
and only the names of :data:`FIELDS` are taken, none of which names a secret
(:func:`nsq_spark._validate.is_secret_name`): an AUTH secret or a credential never becomes
a field.

Field names (:data:`FIELDS`) are stable; none clashes with a ``LogRecord`` attribute.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Iterator, Mapping, MutableMapping

from ._validate import is_secret_name, redact_url

if TYPE_CHECKING:
    _Adapter = logging.LoggerAdapter[logging.Logger]
else:
    _Adapter = logging.LoggerAdapter

__all__ = ["FIELDS", "ContextLogger", "get_logger", "task_fields"]

#: The structured fields a record may carry, and what each holds. Stable names: log
#: pipelines select on them. A record carries those its part knows.
FIELDS: Mapping[str, str] = MappingProxyType({
    "nsqd": "the nsqd TCP address ``host:port`` (IPv6 in brackets) the line is about",
    "topic": "the NSQ topic",
    "channel": "the NSQ channel (consumers)",
    "lookupd": "the nsqlookupd HTTP address or URL the line is about",
    "reader": "the Reader's name (``Reader(name=...)``, default ``topic:channel``)",
    "producer": "the Writer's name (pynsq's ``Writer(name=...)``)",
    "spool": "the publish spool's directory",
    "spark_query": "the Spark streaming query's id in the connector's spool",
    "spark_batch": "the Spark micro-batch number (streaming reads)",
    "spark_partition": "the Spark input partition's index in its batch",
})

_RESERVED = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message", "asctime"}
assert not _RESERVED & set(FIELDS), "a field name clashes with a LogRecord attribute"
assert not any(map(is_secret_name, FIELDS)), "a field name says it holds a secret"

_MAX_CHILDREN = 1024
_NO_FIELDS: Mapping[str, Any] = MappingProxyType({})
_task: Mapping[str, Any] = _NO_FIELDS  # the Spark task running in this process


def _checked(fields: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in fields.items():
        if name not in FIELDS:
            raise ValueError(f"log field {name!r} is not one of nsq_spark._log.FIELDS "
                             f"({', '.join(FIELDS)}): add it there, with its meaning")
        if value is not None:
            out[name] = redact_url(value) if isinstance(value, str) else value
    return out


class ContextLogger(_Adapter):
    """A logger whose records carry the fields bound to it (see the module doc).

    ``fields``: names from :data:`FIELDS`; None values are left out."""

    def __init__(self, logger: logging.Logger, fields: Mapping[str, Any] = _NO_FIELDS) -> None:
        super().__init__(logger, _checked(fields))
        self._children: dict[tuple[str, str], ContextLogger] = {}

    def bind(self, **fields: Any) -> "ContextLogger":
        """This logger with more fields (a part calls it once, where it is built)."""
        assert self.extra is not None
        return ContextLogger(self.logger, {**self.extra, **_checked(fields)})

    def for_nsqd(self, address: str) -> "ContextLogger":
        """This logger with ``nsqd=address`` bound, made once per address (for a part that
        logs about several connections: the pool, the handlers, the producer's pool)."""
        return self._child("nsqd", address)

    def for_lookupd(self, address: str) -> "ContextLogger":
        """This logger with ``lookupd=address`` bound, made once per address."""
        return self._child("lookupd", address)

    def _child(self, field: str, value: str) -> "ContextLogger":
        key = (field, value)
        child = self._children.get(key)
        if child is None:
            if len(self._children) >= _MAX_CHILDREN:  # addresses come and go: stay bounded
                self._children.clear()
            child = self._children[key] = self.bind(**{field: value})
        return child

    # Each level's method asks the logger first (a disabled line costs one call), then
    # _emit builds the record; two frames of this module are skipped for the caller's line.
    def debug(self, msg: object, *args: object, **kwargs: Any) -> None:
        if self.logger.isEnabledFor(logging.DEBUG):
            self._emit(logging.DEBUG, msg, args, kwargs)

    def info(self, msg: object, *args: object, **kwargs: Any) -> None:
        if self.logger.isEnabledFor(logging.INFO):
            self._emit(logging.INFO, msg, args, kwargs)

    def warning(self, msg: object, *args: object, **kwargs: Any) -> None:
        if self.logger.isEnabledFor(logging.WARNING):
            self._emit(logging.WARNING, msg, args, kwargs)

    def error(self, msg: object, *args: object, **kwargs: Any) -> None:
        if self.logger.isEnabledFor(logging.ERROR):
            self._emit(logging.ERROR, msg, args, kwargs)

    def exception(self, msg: object, *args: object, exc_info: Any = True,
                  **kwargs: Any) -> None:
        if self.logger.isEnabledFor(logging.ERROR):
            self._emit(logging.ERROR, msg, args, {**kwargs, "exc_info": exc_info})

    def critical(self, msg: object, *args: object, **kwargs: Any) -> None:
        if self.logger.isEnabledFor(logging.CRITICAL):
            self._emit(logging.CRITICAL, msg, args, kwargs)

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        if self.logger.isEnabledFor(level):
            self._emit(level, msg, args, kwargs)

    def _emit(self, level: int, msg: object, args: tuple[object, ...],
              kwargs: dict[str, Any]) -> None:
        """Log with the fields, every ``str`` argument passed through
        :func:`~nsq_spark._validate.redact_url` (a spool or dedup URL's password never reaches
        a message; a plain string costs one ``in`` test), and the caller's line kept."""
        msg, given = self.process(msg, kwargs)
        args = tuple(redact_url(a) if isinstance(a, str) else a for a in args)
        given["stacklevel"] = given.get("stacklevel", 1) + 2  # skip this module's 2 frames
        self.logger.log(level, msg, *args, **given)

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]
                ) -> tuple[Any, MutableMapping[str, Any]]:
        extra = {**_task, **(self.extra or _NO_FIELDS)}
        given = kwargs.get("extra")
        if given:
            extra.update(given)
        kwargs["extra"] = extra
        return msg, kwargs


def get_logger(name: str, **fields: Any) -> ContextLogger:
    """The :class:`ContextLogger` of the :mod:`logging` logger ``name`` (users filter on the
    name), with ``fields`` bound."""
    return ContextLogger(logging.getLogger(name), fields)


@contextmanager
def task_fields(**fields: Any) -> Iterator[None]:
    """Every record logged in this process while the block runs carries ``fields`` (the
    Spark task's query, batch, partition, topic, channel), from any thread."""
    global _task
    previous = _task
    _task = MappingProxyType({**previous, **_checked(fields)})
    try:
        yield
    finally:
        _task = previous
