"""The spool: a write-ahead log of fetched messages that makes NSQ replayable for Spark.

NSQ has no offsets and no replay: a FINished message is gone. So a fetch task writes what
it fetched durably *before* it FINishes it, and a re-executed task replays what was
written instead of fetching anew.

Layout under ``spoolPath`` (any pyarrow filesystem URI, or a local path)::

    <spoolPath>/<query token>/_QUERY                           (the query marker)
    <spoolPath>/<query token>/batch-<000000000042>/_DRIVER     (the batch's marker)
    <spoolPath>/<query token>/batch-<000000000042>/part-<00001>/c000000.arrow
                                                               c000000.nkeys (ids, .seen)
                                                               c000001.arrow ...
                                                               _SEAL
                                                               _COMPLETE      (JSON)
    <spoolPath>/<query token>/batch-<000000000042>/_copies/... (the order of copies)
    <spoolPath>/<query token>/_seen/...                        (the redelivery index)
    <spoolPath>/<query token>/_started/batch-<000000000042>    (handed out: step 7)

The query token is chosen by ``initialOffset`` and carried in every offset, so a new
query (fresh checkpoint) never reads another query's spool, even on the same spoolPath.

Protocol of one fetch task for (batch, partition) -- deterministic per pair, so any
attempt finds the same directory:

1. ``_COMPLETE`` exists: the partition is decided. Replay chunks ``0 .. chunks-1`` and
   fetch nothing. (A re-executed batch reads the same messages.)
2. Otherwise an earlier attempt may have died part-way. Replay the chunks it left
   (``c000000`` upwards while contiguous and readable), count their rows against the
   partition's share, then fetch the rest, continuing the numbering. A chunk torn by a
   crash while it was written, and any chunk after a gap, was never FINished (FIN waits
   for durability, in chunk order): it is deleted and its messages come again from nsqd.
   If the partition is *sealed* (``_SEAL``, step 5) but not complete, the sealing
   attempt died before ``_COMPLETE``: the chunks replayed are the result, and the task
   goes to step 5 without fetching.
3. Fetching goes chunk by chunk; a chunk holds at most ``spoolChunkSize`` messages
   (default half of ``maxInFlight``: nsqd sends nothing more once ``maxInFlight`` are
   un-FINished) and is cut after at most ``FLUSH_INTERVAL`` seconds, far inside nsqd's
   ``msg_timeout`` (60 s by default), so no spooled message outlives its timeout before
   its FIN. Each chunk is an Arrow IPC file created *only if absent* (O_EXCL on a
   local disk), written, fsynced, and its directory fsynced.
   Only after the chunk is durable, and the *fence* holds (below), are its messages
   FINished; then its rows are handed to Spark. A chunk holding publish ids first takes
   its place in the batch's order of chunks (:mod:`.copies`: after it and every chunk
   before it are durable and the fence held), and its rows that are copies of a
   publish already a row are FINished with it, not handed over; a replay decides them
   again, the same way. (The writing happens in a writer thread
   while the next chunk's messages arrive; chunks are FINished in order, each as soon as
   it is durable, and handed over in order, several settled chunks as one record batch.)
4. If the chunk's name is taken (another attempt of the same partition is running), the
   task REQueues its own un-FINished messages and fails; Spark's retry then takes step 1
   or 2.
5. When the share is reached, or no message came for ``idleTimeout``, or
   ``maxFetchPeriod`` has passed, the task *seals* the partition (``_SEAL``, created if
   absent): from then on no attempt FINishes a new chunk of it. It then takes in any
   chunk after its own that another attempt wrote before the seal (rows it hands to
   Spark too: that attempt may have FINished them), writes the redelivery index, and
   writes ``_COMPLETE`` (same no-replace rule; if another attempt wrote one first, the
   task follows that one). ``_COMPLETE`` is JSON: chunks and rows (what replay needs),
   and for the driver's lag metrics the body bytes, the nsqd timestamps of the oldest
   and newest row and the redeliveries dropped (:class:`Completion`; summed per batch by
   :meth:`Spool.batch_summary`).
6. ``commit(end)`` on the driver deletes the spool of every batch up to ``end``, each
   batch's ``_DRIVER`` marker first. Spark asks ``latestOffset(start)`` only once the
   batch ending at ``start`` is committed by the sink, so the driver deletes up to
   ``start`` there too: the last batch's spool does not outlive the next trigger. A batch
   Spark did not commit keeps its spool, so that a restart from the checkpoint replays
   it, with the partition count it was planned with (the offset's ``parts``). The
   redelivery index (``<query>/_seen``, :mod:`.seen`) outlives the batches for its
   window; the driver prunes it at each commit.
7. The query's directory stays, with its marker ``_QUERY`` (written before the first
   batch is planned), for the query's life: a restart that finds it gone knows the spool
   was deleted while the query was stopped, and fails naming the batch the checkpoint
   still owes (:class:`SparkSpoolError`) instead of running on over the loss. A batch planned
   but never started (a crash between Spark's offsets log and ``partitions``) has no
   batch directory, and is told apart by the query marker still being there.
8. Every batch whose tasks the driver handed out is accounted for: ``partitions`` makes
   the batch's directory and marker, then writes the batch's record
   ``<query>/_started/batch-<n>`` (:meth:`Spool.record_started`, outside the batch's
   directory), and only then returns the tasks. So a batch directory that is missing
   at a restart while its record is there was deleted after its tasks could have
   FINished messages into it (``rm -rf <spool>/*/batch-*``): the driver fails naming the
   batch and the spool (:class:`SparkSpoolError`), where it would otherwise take the batch
   for one planned and never started and fetch anew, losing what the deleted spool
   held. No record and no directory: never started (the crash between Spark's offsets
   log and ``partitions``), fetched anew. A record with its directory: the usual
   replay. The commit deletes the record after the directory (a crash between the two
   leaves a record of a committed batch, which Spark never runs again; the next commit
   removes it). A batch planned before records existed has none: for it a missing
   directory still reads as never started.

The spool must be *shared*: when the driver plans a batch it writes a marker
``batch-<n>/_DRIVER``, and every fetch task checks that it sees it,
failing with :class:`SparkSpoolError` ("the spool must be shared storage reachable from every
executor") if not -- a per-node local disk would otherwise lose the spool of a node that
dies and make replays fetch anew. (A task that sees ``_QUERY`` but not ``_DRIVER`` is an
attempt that outlived its batch: :class:`SpoolFenced`.)

The fence. An attempt can outlive its batch (a losing speculative copy; any attempt
Spark stopped waiting for): the batch committed, its spool deleted, the attempt still
fetching. If it FINished what it fetched, those messages would be gone from nsqd and
from every result. So a fetch task under Spark (it has the ``_DRIVER`` marker's name)
checks, after each chunk is durable and before its FIN, and before each file it writes:

* the partition is not sealed (``_SEAL`` or ``_COMPLETE``), read first;
* the batch's ``_DRIVER`` marker is there, read second.

If either fails it FINishes nothing more, requeues what it holds (or nsqd redelivers it
after ``msg_timeout``) and fails with :class:`SpoolFenced`. It creates no directory but
its partition's own, inside the batch directory the driver made (``mkdir`` without
parents; on object stores, where directories are implicit, it writes no file once the
marker is gone), so it never brings a deleted batch back.

Why the fence cannot lose a message, and what is left of the race:

* Against the commit: the driver removes ``_DRIVER`` before anything else of the batch,
  and the attempt reads ``_DRIVER`` last, after its chunk is durable and after the seal.
  If it still sees the marker, the deletion had not begun when it read the seal; a
  committed batch has every partition complete, hence sealed. So an attempt that FINishes
  after the commit has seen "not sealed" before the partition was sealed, and then the
  sealing attempt, which lists the chunks after creating ``_SEAL``, sees that chunk and
  puts its rows in the result (step 5). The one window left: between the attempt's last
  check and its FIN the driver may commit and delete; the messages FINished then are in
  the committed result (by the same argument), so nothing is lost.
* Against another live attempt of the partition: each writes a chunk, then reads the
  seal; the completer creates the seal, then lists the chunks. Of two such
  write-then-read pairs at least one sees the other's write, so a chunk FINished after
  the seal is impossible and a chunk FINished before it is taken in.
* What is not fenced: an attempt that resumes a partition deletes a chunk it finds torn
  (step 2), on the assumption that its writer is dead. If that writer is alive (two
  live attempts of one partition) and finishes the write after the deletion, it could
  FINish a chunk that no longer exists. Spark runs two attempts of a task at once only
  with speculative execution, which the source refuses (:mod:`.fetch`), or when it gave
  up on an executor that still runs (a network partition); the window is one chunk
  write. Likewise the redelivery index of an attempt that loses the ``_COMPLETE`` race
  may name ids another attempt took in (step 5) -- the same two-live-attempts case.

What this guarantees: nothing is FINished before it is durable and part of the batch's
result, and a batch that Spark runs again reads the same rows once its partitions are
complete. A crash after a chunk is durable but before its FIN reaches nsqd makes nsqd
redeliver those messages (same ``id``) later; the fetch tasks drop them against the ids
spooled before (:mod:`.seen`, within ``redeliveryWindow``).

Durability: on a local filesystem the data and the directories are fsynced.
On object stores (S3, GCS) a completed upload is durable and atomic, but "create if
absent" is a check-then-write; on HDFS rename does not replace. Spark's speculative
execution is refused (:func:`nsq_spark.spark._fetch.check_speculation_off`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import socket
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator

from nsq_spark.errors import SparkSpoolError
from nsq_spark._validate import redact_url
from .._log import get_logger

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa

log = get_logger(__name__)

# Seconds after which a partly filled chunk is written and FINished anyway.
FLUSH_INTERVAL = 2.0

_CHUNK_RE = re.compile(r"^c(\d{6,})\.arrow$")
_KEYS_RE = re.compile(r"^c(\d{6,})\.n?keys$")
_BATCH_RE = re.compile(r"^batch-(\d+)$")
_BATCH_PART_RE = re.compile(r"^part-(\d+)$")
COMPLETE = "_COMPLETE"
SEAL = "_SEAL"
MARKER = "_DRIVER"
QUERY_MARKER = "_QUERY"
STARTED = "_started"  # <query>/_started/batch-<n>: the driver handed the batch's tasks out
# In a chunk's keys file, the count's top bit: the topic's tag follows (.seen).
TAGGED = 1 << 63


# One class per meaning: the Spark spool's errors are SparkSpoolError (an NSQError, in
# nsq_spark.errors); SpoolError is its 0.1.0 name, kept for users for one release.
SpoolError = SparkSpoolError


class SpoolConflict(SparkSpoolError):
    """Another attempt of the same partition wrote the same chunk first."""


class SpoolFenced(SpoolConflict):
    """This attempt may no longer FINish or write: its batch was committed (the driver's
    marker is gone) or its partition was sealed by another attempt. Nothing it holds
    un-FINished is lost: it requeues it, or nsqd redelivers it after ``msg_timeout``."""


@dataclass(frozen=True)
class Completion:
    """A partition's ``_COMPLETE`` record. ``bytes`` (bodies), the nsqd timestamps of
    the oldest and newest row fetched (not replayed; None without such rows) and the
    redeliveries dropped are what the driver reports as lag; a record written before
    they existed reads as 0 / None."""

    chunks: int
    rows: int
    bytes: int = 0
    oldest_timestamp_ns: int | None = None
    newest_timestamp_ns: int | None = None
    redeliveries_dropped: int = 0
    dead_lettered: int = 0  # rows over maxAttempts this attempt wrote to deadLetterPath
    copies_dropped: int = 0  # rows that were copies of a publish already a row (.copies)


@dataclass(frozen=True)
class BatchSummary:
    """The completed partitions of one micro-batch, summed (:meth:`Spool.batch_summary`):
    for the driver at commit. Timestamps: the oldest and newest of the partitions' (None
    if none fetched rows)."""

    rows: int = 0
    bytes: int = 0
    oldest_timestamp_ns: int | None = None
    newest_timestamp_ns: int | None = None
    redeliveries_dropped: int = 0
    partitions: int = 0
    dead_lettered: int = 0
    copies_dropped: int = 0

    def add(self, done: Completion) -> "BatchSummary":
        def pick(a: int | None, b: int | None, f: Any) -> int | None:
            return b if a is None else a if b is None else f(a, b)

        return BatchSummary(
            rows=self.rows + done.rows, bytes=self.bytes + done.bytes,
            oldest_timestamp_ns=pick(self.oldest_timestamp_ns, done.oldest_timestamp_ns, min),
            newest_timestamp_ns=pick(self.newest_timestamp_ns, done.newest_timestamp_ns, max),
            redeliveries_dropped=self.redeliveries_dropped + done.redeliveries_dropped,
            partitions=self.partitions + 1,
            dead_lettered=self.dead_lettered + done.dead_lettered,
            copies_dropped=self.copies_dropped + done.copies_dropped)


def normalize_spool_path(path: str) -> str:
    """Absolute local path or URI. Relative local paths resolve on the driver."""
    if "://" in path:
        return path.rstrip("/")
    if path.startswith("file:"):
        return path
    return os.path.abspath(os.path.expanduser(path))


class _FS:
    """The few file operations the spool needs, fast and fsynced on local disks."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.local: bool
        self.fs: Any = None
        self.object_store = False  # s3/gcs: a finished upload is atomic, no rename
        if "://" not in uri and not uri.startswith("file:"):
            self.local, self.root = True, uri
            return
        try:
            from pyarrow import fs as pafs

            fs, root = pafs.FileSystem.from_uri(uri)
        except Exception as exc:
            raise SparkSpoolError(f"spoolPath {uri!r} is not a filesystem pyarrow can open "
                             f"({exc}); use a local path or a URI such as hdfs://, s3://, "
                             "gs://") from exc
        self.local = isinstance(fs, pafs.LocalFileSystem)
        self.fs, self.root = fs, root
        self.object_store = bool(fs.type_name in ("s3", "gcs"))

    def join(self, *parts: str) -> str:
        return "/".join([self.root.rstrip("/"), *parts])

    # -- directories ------------------------------------------------------------------

    def makedirs(self, path: str) -> None:
        if self.local:
            missing = []
            p = path
            while not os.path.isdir(p):
                missing.append(p)
                p = os.path.dirname(p)
            os.makedirs(path, exist_ok=True)
            # make the new directory entries durable too
            for d in reversed(missing):
                _fsync_dir(os.path.dirname(d))
        else:
            self.fs.create_dir(path, recursive=True)

    def listdir(self, path: str) -> list[str]:
        if self.local:
            try:
                return os.listdir(path)
            except FileNotFoundError:
                return []
        from pyarrow import fs as pafs

        infos = self.fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
        return [i.base_name for i in infos]

    def rmtree(self, path: str) -> None:
        if self.local:
            shutil.rmtree(path, ignore_errors=True)
        else:
            try:
                self.fs.delete_dir(path)
            except FileNotFoundError:
                pass

    def remove(self, path: str) -> None:
        try:
            if self.local:
                os.unlink(path)
            else:
                self.fs.delete_file(path)
        except FileNotFoundError:
            pass

    def exists(self, path: str) -> bool:
        if self.local:
            return os.path.exists(path)
        from pyarrow import fs as pafs

        return bool(self.fs.get_file_info(path).type != pafs.FileType.NotFound)

    # -- files --------------------------------------------------------------------------

    def write_plain(self, path: str, data: bytes) -> None:
        """Write (or replace) ``path``, not fsynced: for files that only speed things up."""
        if self.local:
            with open(path, "wb") as f:
                f.write(data)
            return
        with self.fs.open_output_stream(path) as f:
            f.write(data)

    def write_atomic(self, path: str, data: bytes) -> None:
        """Write (or replace) ``path`` so that a reader sees all of it or none of it (a
        rename on a local disk and on HDFS, an upload on an object store); not fsynced:
        for files whose loss in an OS crash is accounted for (:mod:`.copies`)."""
        tmp = f"{os.path.dirname(path)}/.{os.path.basename(path)}.{uuid.uuid4().hex}.tmp"
        if self.local:
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
            return
        if self.object_store:  # a finished upload is atomic
            with self.fs.open_output_stream(path) as f:
                f.write(data)
            return
        with self.fs.open_output_stream(tmp) as f:
            f.write(data)
        self.fs.move(tmp, path)

    def read_bytes(self, path: str) -> bytes:
        if self.local:
            with open(path, "rb") as f:
                return f.read()
        with self.fs.open_input_stream(path) as f:
            return bytes(f.read())

    def create_exclusive(self, path: str, data: "bytes | memoryview") -> bool:
        """Write ``data`` durably at ``path`` unless it exists; False if it existed.

        Local: created in place with O_EXCL (atomic "create if absent"), written, fsynced,
        then the directory fsynced -- one journal commit on ext4/xfs, where a temporary
        file plus link needs two. A crash mid-write can leave a torn file; the fetch task
        only FINishes after this returns, so a torn file holds nothing FINished and the
        next attempt discards it (:meth:`PartitionSpool.discard_from`).
        """
        if self.local:
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                return False
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            finally:
                os.close(fd)
            _fsync_dir(os.path.dirname(path))
            return True
        tmp = f"{os.path.dirname(path)}/.{os.path.basename(path)}.{uuid.uuid4().hex}.tmp"
        if self.exists(path):
            return False
        if self.object_store:  # a finished upload is atomic; no rename there
            with self.fs.open_output_stream(path) as f:
                f.write(data)
            return True
        with self.fs.open_output_stream(tmp) as f:
            f.write(data)
        if self.exists(path):
            self.fs.delete_file(tmp)
            return False
        self.fs.move(tmp, path)
        return True


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _ipc_bytes(batch: "pa.RecordBatch") -> memoryview:
    """The batch as an Arrow IPC file, in memory (a view of Arrow's buffer: no copy)."""
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return memoryview(sink.getvalue())


class Spool:
    """The spool of one query (picklable: plain strings until first use)."""

    def __init__(self, spool_path: str, query: str) -> None:
        self.spool_path = spool_path
        self.query = query
        self._fs: _FS | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"spool_path": self.spool_path, "query": self.query, "_fs": None}

    @property
    def fs(self) -> _FS:
        if self._fs is None:
            self._fs = _FS(self.spool_path)
        return self._fs

    def query_dir(self) -> str:
        return self.fs.join(self.query)

    def batch_dir(self, batch: int) -> str:
        return self.fs.join(self.query, f"batch-{batch:012d}")

    def partition(self, batch: int, index: int, marker: str | None = None
                  ) -> "PartitionSpool":
        """``marker``: the driver's marker of the batch (fetch tasks under Spark); with it
        the partition is *fenced* (:class:`PartitionSpool`)."""
        fence = f"{self.batch_dir(batch)}/{marker}" if marker else None
        return PartitionSpool(self.fs, f"{self.batch_dir(batch)}/part-{index:05d}", fence)

    def check_writable(self) -> None:
        """Fail early (on the driver, at query start) when spoolPath is unusable. The probe
        goes to the spool's root and is removed: nothing is left behind."""
        probe = self.fs.join(f"_probe-{uuid.uuid4().hex}")
        try:
            self.fs.makedirs(self.fs.root)
            if not self.fs.create_exclusive(probe, b"probe"):
                raise SparkSpoolError("probe file collision")
            self.fs.remove(probe)
        except SparkSpoolError:
            raise
        except Exception as exc:
            raise SparkSpoolError(
                f"option 'spoolPath': cannot write to {redact_url(self.spool_path)!r} "
                f"({exc}); it must be a writable directory reachable from the "
                "driver and every executor") from exc

    # -- the query marker ------------------------------------------------------------------

    def write_query_marker(self) -> None:
        """Driver, before it plans the query's first batch: ``<query>/_QUERY``, kept for
        the query's life (the
        query's directory is never removed while it is there). Its absence later means
        the spool was deleted, which a batch planned but never started (no batch
        directory yet) cannot be mistaken for."""
        self.fs.makedirs(self.query_dir())
        self.fs.create_exclusive(f"{self.query_dir()}/{QUERY_MARKER}", b"nsq-spark query")

    def has_query_marker(self) -> bool:
        return self.fs.exists(f"{self.query_dir()}/{QUERY_MARKER}")

    def partition_count(self, batch: int) -> int:
        """1 + the highest partition index with a spool directory in ``batch`` (0: none)."""
        out = 0
        for name in self.fs.listdir(self.batch_dir(batch)):
            m = _BATCH_PART_RE.match(name)
            if m:
                out = max(out, int(m.group(1)) + 1)
        return out

    # -- the shared-storage marker ----------------------------------------------------------

    def write_marker(self, batch: int) -> str:
        """Driver, when it plans ``batch``: a marker file in the batch's directory that
        every fetch task of the batch must see (:meth:`check_marker`); returns its name.
        It goes away with the batch's spool."""
        self.fs.makedirs(self.batch_dir(batch))
        # False: already there (a batch planned again after a restart); fine either way
        self.fs.create_exclusive(f"{self.batch_dir(batch)}/{MARKER}", b"nsq-spark driver")
        return MARKER

    def check_marker(self, batch: int, name: str = "") -> None:
        """Executor: the driver's marker must be visible here, or the spool is not shared."""
        path = f"{self.batch_dir(batch)}/{name or MARKER}"
        try:
            seen = self.fs.exists(path)
        except Exception as exc:
            raise SparkSpoolError(
                f"option 'spoolPath': cannot read {redact_url(self.spool_path)!r} from this "
                f"executor (host {socket.gethostname()}): {exc}; the spool must "
                "be shared storage reachable from every executor, with its "
                "credentials (spark.executorEnv.*)") from exc
        if not seen and self.has_query_marker():
            # the query's marker is visible, the batch's is not: the driver deleted the
            # batch after its commit (this attempt outlived it), or it was never planned
            raise SpoolFenced(f"batch {batch} of this query is committed (the driver's "
                              f"marker {path!r} is gone): this attempt fetches nothing")
        if not seen:
            raise SparkSpoolError(
                f"option 'spoolPath': this executor (host {socket.gethostname()}) does not see "
                f"the marker {path!r} the driver wrote when it planned the batch, so "
                f"{redact_url(self.spool_path)!r} is not the same storage here as on the driver. The "
                "spool must be shared storage reachable from every executor (HDFS, S3, GCS, "
                "or a network filesystem mounted at the same path everywhere), not a local "
                "disk")

    def tidy(self, committed: int) -> int:
        """Driver: delete the spool of batches <= ``committed`` (Spark committed them),
        and the query's directory once nothing is left in it; how many batches."""
        n = self.delete_upto(committed)
        if not self.fs.listdir(self.query_dir()):
            self.fs.rmtree(self.query_dir())
        return n

    def batches(self) -> list[int]:
        out = []
        for name in self.fs.listdir(self.query_dir()):
            m = _BATCH_RE.match(name)
            if m:
                out.append(int(m.group(1)))
        return sorted(out)

    def delete_upto(self, batch: int) -> int:
        """Delete the spool of batches <= ``batch``; returns how many were deleted."""
        n = 0
        for b in self.batches():
            if b <= batch:
                # the marker first: an attempt still running sees it gone before any of
                # the batch's files go, and FINishes nothing more (PartitionSpool)
                self.fs.remove(f"{self.batch_dir(b)}/{MARKER}")
                self.fs.rmtree(self.batch_dir(b))
                n += 1
        # the records after the directories (step 8): also those a crash left behind. Their
        # directory stays, empty, for the query's life: made again for every batch it cost
        # a mkdir, an rmdir and a durable entry (an fsync of the query's directory) per
        # batch, of the driver's six fsyncs per batch (bench/bench_driver_batch.py)
        for name in self.fs.listdir(self.fs.join(self.query, STARTED)):
            m = _BATCH_RE.match(name)
            if m and int(m.group(1)) <= batch:
                self.fs.remove(self.started_record(int(m.group(1))))
        return n

    # -- the batches handed out (step 8) -------------------------------------------------

    def started_record(self, batch: int) -> str:
        return self.fs.join(self.query, STARTED, f"batch-{batch:012d}")

    def record_started(self, batch: int) -> None:
        """Driver, after the batch's directory and marker exist and before it returns
        the batch's tasks: the durable record that they were handed out."""
        self.fs.makedirs(self.fs.join(self.query, STARTED))
        # False: already there (the batch run again after a restart); fine either way
        self.fs.create_exclusive(self.started_record(batch), b"nsq-spark batch")

    def was_started(self, batch: int) -> bool:
        return self.fs.exists(self.started_record(batch))

    def batch_exists(self, batch: int) -> bool:
        return self.fs.exists(self.batch_dir(batch))

    def batch_rows(self, batch: int) -> int | None:
        """Rows the completed partitions of ``batch`` hold; None if nothing completed."""
        summary = self.batch_summary(batch)
        return summary.rows if summary.partitions else None

    def batch_summary(self, batch: int) -> BatchSummary:
        """The completed partitions of ``batch`` summed (``partitions`` 0: none)."""
        out = BatchSummary()
        for name in self.fs.listdir(self.batch_dir(batch)):
            if _BATCH_PART_RE.match(name):
                done = PartitionSpool(self.fs, f"{self.batch_dir(batch)}/{name}").completion()
                if done is not None:
                    out = out.add(done)
        return out


class PartitionSpool:
    """The spool directory of one (batch, partition).

    With ``fence`` (the path of the driver's batch marker, as fetch tasks under Spark
    have it) the partition is fenced: nothing is written under it once the marker is
    gone or the partition is sealed (:meth:`fenced`), and no directory is created but the
    partition's own, inside the batch directory the driver made -- an attempt that
    outlives its batch never brings a deleted batch back.
    """

    def __init__(self, fs: _FS, path: str, fence: str | None = None) -> None:
        self.fs = fs
        self.path = path
        self.fence = fence
        self._made = False

    def _ensure_dir(self) -> None:
        if self._made:
            return
        if self.fence is None:
            self.fs.makedirs(self.path)
        else:
            self.check_marker()
            self._make_own_dir()
        self._made = True

    def check_marker(self) -> None:
        """Fenced partitions: the driver's batch marker must still be there."""
        if self.fence is not None and not self.fs.exists(self.fence):
            raise SpoolFenced(f"the driver's marker {self.fence} is gone: the batch was "
                              "committed and its spool deleted while this attempt still ran")

    def _make_own_dir(self) -> None:
        """The partition's directory only: its parent must exist (the driver made it)."""
        if self.fs.local:
            try:
                os.mkdir(self.path)
            except FileExistsError:
                return
            except FileNotFoundError:
                raise SpoolFenced(f"{self.path}: the batch directory is gone (committed "
                                  "and deleted by the driver)") from None
            _fsync_dir(os.path.dirname(self.path))
        elif not self.fs.object_store:  # HDFS & co.: no parents made
            try:
                self.fs.fs.create_dir(self.path, recursive=False)
            except OSError:
                if self.fs.exists(self.path):
                    return
                if not self.fs.exists(os.path.dirname(self.path)):
                    raise SpoolFenced(f"{self.path}: the batch directory is gone (committed "
                                      "and deleted by the driver)") from None
                raise
        # object stores: directories are implicit; check_fence ran just before

    # -- fencing -------------------------------------------------------------------------

    def sealed(self) -> bool:
        return self.fs.exists(f"{self.path}/{SEAL}") or self.fs.exists(f"{self.path}/{COMPLETE}")

    def fenced(self) -> str | None:
        """Why this attempt may not FINish or write any more, or None. The seal is read
        before the driver's marker: if the marker is still there afterwards, the batch's
        deletion had not begun when the seal was read (the driver deletes the marker
        first), so "not sealed" was the partition's true state."""
        if self.sealed():
            return (f"{self.path} was completed (or is being completed) by another attempt "
                    "of the same task")
        if self.fence is not None and not self.fs.exists(self.fence):
            return (f"the driver's marker {self.fence} is gone: the batch was committed and "
                    "its spool deleted while this attempt still ran")
        return None

    def check_fence(self) -> None:
        reason = self.fenced()
        if reason is not None:
            raise SpoolFenced(reason)

    def completion(self) -> Completion | None:
        """The decided result, or None (also for a marker torn by a crash: it is removed)."""
        path = f"{self.path}/{COMPLETE}"
        try:
            raw = self.fs.read_bytes(path)
        except (FileNotFoundError, OSError):
            return None
        try:
            doc = json.loads(raw)

            def ns(key: str) -> int | None:
                value = doc.get(key)
                return None if value is None else int(value)

            return Completion(chunks=int(doc["chunks"]), rows=int(doc["rows"]),
                              bytes=int(doc.get("bytes", 0)),
                              oldest_timestamp_ns=ns("oldest_timestamp_ns"),
                              newest_timestamp_ns=ns("newest_timestamp_ns"),
                              redeliveries_dropped=int(doc.get("redeliveries_dropped", 0)),
                              dead_lettered=int(doc.get("dead_lettered", 0)),
                              copies_dropped=int(doc.get("copies_dropped", 0)))
        except (ValueError, KeyError, TypeError, AttributeError):
            log.warning("%s: torn completion marker (crash while writing it); removed", path)
            self.fs.remove(path)
            return None

    def chunk_numbers(self) -> set[int]:
        """Numbers of the chunk files present (some may be torn or being written)."""
        present = set()
        for name in self.fs.listdir(self.path):
            m = _CHUNK_RE.match(name)
            if m:
                present.add(int(m.group(1)))
        return present

    def chunk_count(self) -> int:
        """Number of chunks ``c000000 ..`` present without a gap."""
        present = self.chunk_numbers()
        n = 0
        while n in present:
            n += 1
        return n

    def discard_from(self, k: int) -> int:
        """Remove chunks numbered ``k`` and up (torn, or beyond a gap); how many."""
        n = 0
        for name in self.fs.listdir(self.path):
            m = _CHUNK_RE.match(name) or _KEYS_RE.match(name)
            if m and int(m.group(1)) >= k:
                self.fs.remove(f"{self.path}/{name}")
                n += name.endswith(".arrow")
        return n

    def chunk_path(self, k: int) -> str:
        return f"{self.path}/c{k:06d}.arrow"

    def read_chunk(self, k: int) -> list["pa.RecordBatch"]:
        import pyarrow as pa

        data = self.fs.read_bytes(self.chunk_path(k))
        from ._schema import conform  # chunks spooled before the trace_parent column

        reader = pa.ipc.open_file(pa.py_buffer(data))
        return [conform(reader.get_batch(i)) for i in range(reader.num_record_batches)]

    def read_chunk_columns(self, k: int, names: "tuple[str, ...]"
                           ) -> list["pa.RecordBatch"]:
        """Only the columns ``names`` of chunk ``k`` (a peer's ids, :mod:`.seen`): on a
        local disk the file is memory-mapped and only their pages are read (a tenth of
        a chunk for the ids), elsewhere the whole file as :meth:`read_chunk` reads it."""
        if not self.fs.local:
            return [rb.select(list(names)) for rb in self.read_chunk(k)]
        import pyarrow as pa

        with pa.memory_map(self.chunk_path(k)) as source:
            reader = pa.ipc.open_file(source)
            have = [n for n in names if n in reader.schema.names]
            return [reader.get_batch(i).select(have)
                    for i in range(reader.num_record_batches)]

    def read_chunk_ids(self, k: int) -> "pa.ChunkedArray":
        """The ``id`` column of chunk ``k``."""
        import pyarrow as pa

        return pa.chunked_array([rb.column("id") for rb in self.read_chunk(k)], pa.string())

    def write_chunk_keys(self, k: int, keys: "tuple[Any, Any]", tag: int | None = None
                         ) -> None:
        """After chunk ``k`` is durable: its id keys with their nsqds' tags (:mod:`.seen`,
        ``(nsqds, keys)`` sorted by both), in ``c<k>.nkeys``: the count first (with
        :data:`TAGGED` set and the topic's tag next, when ``tag`` is given), the nsqd
        tags, the keys; so that the other tasks of the batch need not parse the chunk.
        Not fsynced: a missing or short file only sends them to the chunk itself."""
        import numpy as np

        if self.fence is not None and not self.fs.exists(self.fence):
            return  # committed meanwhile: nothing more under the batch (no FIN follows)
        nsqds, ids = keys
        head = [len(ids)] if tag is None else [len(ids) | TAGGED, tag]
        data = np.concatenate((np.array(head, np.uint64), nsqds, ids)).astype("<u8")
        self.fs.write_plain(f"{self.path}/c{k:06d}.nkeys", data.tobytes())

    def read_chunk_keys(self, k: int) -> "tuple[Any, Any] | None":
        """``(nsqds, keys)`` written by :meth:`write_chunk_keys`; None if absent or short."""
        tagged = self.read_chunk_keys_tagged(k)
        return None if tagged is None else tagged[0]

    def read_chunk_keys_tagged(self, k: int) -> "tuple[tuple[Any, Any], int | None] | None":
        """``((nsqds, keys), topic tag or None)`` of chunk ``k``; None if absent or short
        (a ``.keys`` file of an older version, without the nsqds, is not read)."""
        import numpy as np

        try:
            data = self.fs.read_bytes(f"{self.path}/c{k:06d}.nkeys")
        except OSError:
            return None
        if len(data) < 8 or len(data) % 8:
            return None
        words = np.frombuffer(data, "<u8")
        head = int(words[0])
        tag = None
        if head & TAGGED:
            if len(words) < 2:
                return None
            head, tag, words = head & ~TAGGED, int(words[1]), words[2:]
        else:
            words = words[1:]
        if 2 * head != len(words):
            return None
        return ((words[:head].astype(np.uint64), words[head:].astype(np.uint64)), tag)

    def replay(self, chunks: int) -> Iterator["pa.RecordBatch"]:
        for k in range(chunks):
            yield from self.read_chunk(k)

    def write_chunk(self, k: int, batch: "pa.RecordBatch") -> None:
        """Durably write chunk ``k``; SpoolConflict if another attempt wrote it first,
        SpoolFenced if the batch's marker is gone (then nothing is written). (The seal is
        checked before the FIN, where it matters: a chunk written after it is never
        FINished, and one stat less per chunk counts on object stores.)"""
        self._ensure_dir()
        self.check_marker()
        if not self.fs.create_exclusive(self.chunk_path(k), _ipc_bytes(batch)):
            raise SpoolConflict(f"spool chunk {self.chunk_path(k)} was written by another "
                                "attempt of the same task (speculative execution?)")

    def seal(self) -> None:
        """Before completing: from now on no attempt FINishes a new chunk here (each
        checks :meth:`fenced` after its chunk is durable and before the FIN). Chunks
        written before the seal are then all visible to :meth:`chunks_from`."""
        self._ensure_dir()
        self.check_marker()
        self.fs.create_exclusive(f"{self.path}/{SEAL}", b"sealed")  # False: sealed before

    def chunks_from(self, k: int) -> Iterator[tuple[int, list["pa.RecordBatch"]]]:
        """After :meth:`seal`: the readable chunks ``k, k+1, ..`` (written by another
        attempt, which may have FINished them before the seal), up to the first one
        missing or torn (a torn one's writer saw the seal: it FINishes nothing)."""
        present = self.chunk_numbers()
        while k in present:
            try:
                batches = self.read_chunk(k)
            except (OSError, ValueError):
                return
            yield k, batches
            k += 1

    def complete(self, chunks: int, rows: int, *, bytes: int = 0,
                 oldest_timestamp_ns: int | None = None,
                 newest_timestamp_ns: int | None = None,
                 redeliveries_dropped: int = 0, dead_lettered: int = 0,
                 copies_dropped: int = 0) -> Completion:
        """Mark the partition decided; returns the marker that won (maybe another's)."""
        self._ensure_dir()
        self.check_marker()
        mine = Completion(chunks, rows, bytes, oldest_timestamp_ns, newest_timestamp_ns,
                          redeliveries_dropped, dead_lettered, copies_dropped)
        doc = json.dumps(dataclasses.asdict(mine)).encode()
        if self.fs.create_exclusive(f"{self.path}/{COMPLETE}", doc):
            return mine
        winner = self.completion()
        assert winner is not None
        return winner


class DeadLetters:
    """Messages delivered more often than ``maxAttempts``: written durably (one Arrow IPC
    file per write, the source's schema) under ``deadLetterPath`` before they are
    FINished, so that none is dropped without a trace. Picklable."""

    def __init__(self, path: str) -> None:
        self.path = normalize_spool_path(path)
        self._fs: _FS | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "_fs": None}

    def write(self, batch: "pa.RecordBatch", label: str) -> str:
        """Durably write ``batch``; returns the file's path."""
        if self._fs is None:
            self._fs = _FS(self.path)
        fs = self._fs
        fs.makedirs(fs.root)
        path = fs.join(f"{label}-{uuid.uuid4().hex}.arrow")
        if not fs.create_exclusive(path, _ipc_bytes(batch)):  # pragma: no cover - uuid
            raise SparkSpoolError(f"dead-letter file {path} exists")
        return path
