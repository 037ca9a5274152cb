"""The ``nsq`` stream source's offset: what Spark keeps in the checkpoint's offsets log for
each micro-batch, typed, and every form of it an earlier release wrote.

The one place that knows the format. :meth:`BatchOffset.from_json` reads every form ever
written (and refuses anything else with a :class:`~nsq_spark.errors.SparkCheckpointError`
naming what is wrong and the fix); :meth:`BatchOffset.to_dict` is the JSON object the
driver hands Spark (pyspark writes ``json.dumps`` of it into the offsets log), and
:meth:`BatchOffset.to_json` that text. Nothing else reads the offset by key.

The format, key order included (the text of a batch Spark compares and logs)::

    {"query": "<token>", "batch": 43, "size": 900, "parts": 3, "v": 2,
     "spool": "/mnt/spool", "plan": [["orders", 2, 800, null], ["refunds", 1, 100, null]]}

The forms, oldest first; each is read as it was meant, and written back byte for byte
(a batch Spark hands back from the checkpoint is the same text when the driver returns it
unchanged, so Spark sees no new batch):

* 0.1.0's first offsets, ``{"query", "batch", "size"}``: no ``v`` (the query's spool has no
  query marker promised, :attr:`BatchOffset.marked` is False), no ``parts`` (the batch
  gets ``numPartitions`` tasks, or more if its spool holds more partitions), no ``plan``
  (the query's one ``topic``), no ``spool``.
* ``parts`` and ``v`` (``v`` 2: the query marker was written; 0: writing it failed, so a
  restart looks for none). The initial offset has ``v`` and no ``parts``.
* ``plan`` (several topics, a ``topicPattern``, or ``maxBytesPerTrigger``): per topic
  ``[topic, tasks, messages, bytes]``, :class:`~.admission.TopicPlan`. A query on one
  ``topic`` without a byte cap still writes none.
* ``spool``: the ``spoolPath`` the batch was planned with (password redacted), so that a
  restart with another ``spoolPath`` is named as such (:meth:`BatchOffset.spool_changed`).

What the driver does with each field is in :mod:`.datasource`'s module doc.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from nsq_spark.errors import SparkCheckpointError

from ._admission import TopicPlan

__all__ = ["BatchOffset", "OFFSET_VERSION"]

#: Offsets of this version carry ``parts`` and mean the query marker was written.
OFFSET_VERSION = 2

# the keys in the order they are written (pyspark keeps a dict's order in the log)
_KEYS = ("query", "batch", "size", "parts", "v", "spool", "plan")

_FIX_UNKNOWN = ("A newer nsq-spark may have written it: run the query with that version "
                "until its batches are committed, or start on a new checkpointLocation")
_FIX_DAMAGED = ("The checkpoint's offsets log was changed by hand or damaged: restore it, "
                "or start the query on a new checkpointLocation")


@dataclass(frozen=True)
class BatchOffset:
    """One micro-batch's offset. ``None`` fields are absent from the JSON (older forms,
    or not recorded: see the module doc)."""

    query: str  # the query's token: names its spool directory
    batch: int  # micro-batch number; 0 is the initial offset
    size: int = 0  # messages the batch may fetch in all (0: no cap)
    parts: int | None = None  # fetch tasks; None: written before "parts" existed
    version: int | None = None  # "v"; None: written before it existed
    spool: str | None = None  # spoolPath the batch was planned with (redacted)
    plan: tuple[TopicPlan, ...] | None = None  # None: the query's one topic

    @classmethod
    def initial(cls, query: str) -> "BatchOffset":
        """A new query's offset: batch 0, nothing planned."""
        return cls(query, 0, 0, None, OFFSET_VERSION)

    def next(self, plan: Sequence[TopicPlan], version: int, spool: str,
             record_plan: bool) -> "BatchOffset":
        """The offset of the batch after this one, planned as ``plan``. ``record_plan``:
        write the per-topic ``plan`` (a query on one topic without a byte cap writes none,
        and its offsets look as before ``plan`` existed)."""
        return BatchOffset(self.query, self.batch + 1, sum(p.size for p in plan),
                           sum(p.parts for p in plan), version, spool,
                           tuple(plan) if record_plan else None)

    def first_of_query(self) -> "BatchOffset":
        """The initial offset of this offset's query (a restart of pyspark < 4.2 asks for it
        again: the same query's batch 0, so that a logged batch is replayed)."""
        return BatchOffset.initial(self.query)

    # -- what each older form means ------------------------------------------------------

    @property
    def marked(self) -> bool:
        """The query's spool had its query marker when this batch was planned (``v`` 2):
        a restart that finds none knows the spool was deleted."""
        return self.version is not None and self.version >= OFFSET_VERSION

    def spool_changed(self, spool_now: str) -> str | None:
        """The ``spoolPath`` the batch was planned with, when it is not ``spool_now``
        (None: the same, or not recorded -- an offset from before ``spool``)."""
        if self.spool is not None and self.spool != spool_now:
            return self.spool
        return None

    def topic_plans(self, single_topic: str | None, num_partitions: int,
                    partitions_in_spool: Callable[[], int]) -> tuple[TopicPlan, ...]:
        """The topics and tasks of this batch as it was planned, whatever the options or a
        pattern's matches are now. ``single_topic``: the options' topic when the query
        reads one (None: several or a pattern); ``partitions_in_spool``: how many
        partitions the batch's spool holds (asked only for an offset without ``parts``)."""
        if self.plan is not None:
            return self.plan
        if single_topic is None:
            from .options import NSQOptionError

            raise NSQOptionError(
                f"the checkpoint owes micro-batch {self.batch}, planned when the query "
                "read one 'topic' (its offset names no topic list), but the options now "
                "give several topics or a 'topicPattern': which topic that batch read is "
                "not recorded. Restart with .option(\"topic\", ...) as before until that "
                "batch is committed, or start on a new checkpointLocation")
        parts = self.parts
        if parts is None:  # before "parts": at least the partitions its spool holds
            parts = max(num_partitions, int(partitions_in_spool()))
        return (TopicPlan(single_topic, parts, self.size, None),)

    # -- JSON ------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The JSON object Spark keeps (the stream reader's methods return it)."""
        out: dict[str, Any] = {"query": self.query, "batch": self.batch, "size": self.size}
        if self.parts is not None:
            out["parts"] = self.parts
        if self.version is not None:
            out["v"] = self.version
        if self.spool is not None:
            out["spool"] = self.spool
        if self.plan is not None:
            out["plan"] = [[p.topic, p.parts, p.size, p.max_bytes] for p in self.plan]
        return out

    def to_json(self) -> str:
        """The text in the offsets log (pyspark's ``json.dumps`` of :meth:`to_dict`)."""
        return json.dumps(self.to_dict())

    def describe(self) -> str:
        """The offset as errors quote it (keys sorted)."""
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, data: str | Mapping[str, Any]) -> "BatchOffset":
        """The offset in ``data`` (the text in the offsets log, or the object pyspark
        parsed from it), in any form an earlier release wrote. Anything else is a
        :class:`~nsq_spark.errors.SparkCheckpointError` naming the key and the fix."""
        obj: Any = data
        if isinstance(data, (str, bytes)):
            try:
                obj = json.loads(data)
            except ValueError as exc:
                raise SparkCheckpointError(
                    f"an offset of the nsq source is not JSON ({exc}): {_show(data)}. "
                    f"{_FIX_DAMAGED}") from None
        if not isinstance(obj, Mapping):
            raise SparkCheckpointError(
                f"an offset of the nsq source must be a JSON object with 'query' and "
                f"'batch', not {type(obj).__name__}: {_show(obj)}. {_FIX_DAMAGED}")
        unknown = sorted(str(k) for k in obj if k not in _KEYS)
        if unknown:
            raise SparkCheckpointError(
                f"the offset {_show(obj)} has keys this nsq-spark does not know: "
                f"{', '.join(map(repr, unknown))} (known: {', '.join(_KEYS)}). "
                f"{_FIX_UNKNOWN}")
        for key in ("query", "batch"):
            if key not in obj:
                raise SparkCheckpointError(
                    f"the offset {_show(obj)} has no {key!r}: every offset of the nsq "
                    f"source has 'query' and 'batch'. {_FIX_DAMAGED}")
        query = obj["query"]
        if not isinstance(query, str) or not query:
            raise SparkCheckpointError(
                f"the offset {_show(obj)} has 'query' {_short(query)}: the query's token, a "
                f"non-empty string. {_FIX_DAMAGED}")
        version = _int(obj, "v", 0)
        if version is not None and version > OFFSET_VERSION:
            raise SparkCheckpointError(
                f"the offset {_show(obj)} has format version 'v' {version}; this nsq-spark "
                f"reads versions up to {OFFSET_VERSION}. {_FIX_UNKNOWN}")
        spool = obj.get("spool")
        if spool is not None and not isinstance(spool, str):
            raise SparkCheckpointError(
                f"the offset {_show(obj)} has 'spool' {_short(spool)}: the spoolPath, a string. "
                f"{_FIX_DAMAGED}")
        batch = _int(obj, "batch", 0)
        assert batch is not None  # present: checked above
        return cls(query, batch, _int(obj, "size", 0) or 0, _int(obj, "parts", 1), version,
                   spool, _plan(obj))


def _show(obj: Any) -> str:
    """An offset as errors quote it: short (a damaged log may hold anything)."""
    text = obj if isinstance(obj, str) else repr(obj)
    if isinstance(obj, Mapping):
        try:
            text = json.dumps(obj, sort_keys=True)
        except (TypeError, ValueError):
            pass
    return text if len(text) <= 300 else text[:300] + "..."


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 100 else text[:100] + "..."


def _int(obj: Mapping[str, Any], key: str, least: int) -> int | None:
    """``obj[key]``, a JSON integer of at least ``least`` (None: absent)."""
    if key not in obj:
        return None
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise SparkCheckpointError(
            f"the offset {_show(obj)} has {key!r} {_short(value)}: an integer of at least {least}. "
            f"{_FIX_DAMAGED}")
    return value


def _plan(obj: Mapping[str, Any]) -> tuple[TopicPlan, ...] | None:
    if "plan" not in obj:
        return None
    entries = obj["plan"]
    fix = ("each entry of 'plan' is [topic, tasks, messages, bytes] (tasks at least 1, "
           f"messages and bytes at least 0, bytes null for no cap), and there is one at least. "
           f"{_FIX_DAMAGED}")
    if not isinstance(entries, list) or not entries:
        raise SparkCheckpointError(f"the offset {_show(obj)} has 'plan' {_short(entries)}: {fix}")
    out = []
    for entry in entries:
        ok = isinstance(entry, list) and len(entry) == 4
        if ok:
            topic, parts, size, max_bytes = entry
            ok = (isinstance(topic, str) and bool(topic) and _is_int(parts, 1) and
                  _is_int(size, 0) and (max_bytes is None or _is_int(max_bytes, 0)))
        if not ok:
            raise SparkCheckpointError(
                f"the offset {_show(obj)} has the 'plan' entry {_short(entry)}: {fix}")
        out.append(TopicPlan(topic, parts, size, max_bytes))
    return tuple(out)


def _is_int(value: Any, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least
