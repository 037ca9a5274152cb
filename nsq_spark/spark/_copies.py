"""Copies of one publish become one row, whichever nsqds, partitions and micro-batches
they arrive in.

A publisher with ``replicas`` (or one that retried a publish that had in fact arrived)
puts several copies of one message on NSQ, each in a publish envelope carrying the same
publish id (:mod:`nsq_spark.envelope`; the ``publish_id`` column, :mod:`.schema`). To
nsqd they are different messages, with different nsqd ids, so the redelivery index
(:mod:`.seen`, keyed by nsqd id) makes each a row. This module keeps one.

Why the redelivery index's argument does not carry over: a redelivery comes only after
the first copy was FINished, hence durable and readable by then. Copies do not wait for
each other -- the publisher sends them to two nsqds within microseconds -- so two fetch
tasks of one batch can hold two copies at the same time, and a single round of "write my
ids, then read the others'" between two tasks cannot say which copy to keep: in some
interleaving each sees the other (both drop it: a loss) or neither does (a duplicate).

**The rule: a total order of durable chunks.** Once a chunk is durable (and the spool's
fence holds, :mod:`.spool`), and before its FIN, its fetch task gives it a place in the
batch's order of chunks, a *ticket*. A row whose publish id appears in a chunk with a
lower ticket of the same batch (of the same topic), or earlier in its own chunk, or in
the index of an earlier batch (:mod:`.seen`, within ``redeliveryWindow``) is not a row:
it is a copy, FINished with its chunk. Rows without a publish id are never copies.

**Tickets without create-if-absent.** A ticket is the file
``batch-<n>/_copies/t<number>-p<partition>-c<chunk>-<nonce>`` holding the chunk's sorted
publish ids (and a CRC-32); tickets are ordered by (number, partition, chunk, nonce). A
task takes one as in Lamport's bakery, with plain files each written by one task only:

1. write a marker ``w-p<partition>-c<chunk>-<ms>-<nonce>`` ("choosing");
2. list the directory; the number is 1 + the highest ticket number listed;
3. write the ticket (visible whole or not at all: a rename on a local disk and on HDFS,
   an upload on an object store); delete the marker;
4. list again until no other task's marker is listed (waiting for those choosing at the
   same time), then list once more: the tickets lower than this one are all there.

Why 4 sees every lower ticket: take another chunk E. If E listed the tickets (its step
2) after this ticket was written, it saw it and took a higher number. Otherwise E wrote
its marker before this ticket was written, so the marker is listed in step 4 unless E had
deleted it already -- after writing its ticket, which the last listing then shows. Ties
(same number) are ordered by partition and chunk, and seen the same way. This needs only
what every spool store gives: a file written is listed afterwards (S3 and GCS are
strongly consistent for this) -- no "create if absent", which object stores do not
offer, so the order is exact there too.

**Why nothing is lost.** A chunk drops a row only for a lower ticket it has read. That
chunk is in the batch's result: it was durable and its fence held before it took the
ticket (a retried task replays it, a sealing attempt takes it in: :mod:`.spool`), and its
own rows are decided the same way, by tickets lower still. So the copy in the lowest
ticket holding an id is a row, in every run of its task, and only the copies above it
are dropped. A chunk takes its ticket only after every earlier chunk of its partition
took theirs (the tickets are taken in chunk order), so a chunk that a retry discards (torn,
or after a gap) never has one.

**Replays decide the same.** A chunk's decision is a function of durable, immutable
facts: its rows, the tickets lower than its own (never changed nor removed while the
batch lives) and the earlier batches' index (pruned only when a batch is committed, never
while one is running). A re-executed task, a restarted query, a retry that finds a chunk
without a ticket (its task died before taking one: it takes one now) all compute the same
rows. A retry that finds its chunk's ticket still does step 4 before it decides: the
attempt that wrote the ticket may have died before its own step 4, while another task,
choosing then, takes a number at or below it (hypothesis found that schedule: both copies
kept). Tickets are not fsynced: a ticket an OS crash loses (or tears) was, for every
reader after the crash, never taken; the chunk takes another and every decision, made
again from the tickets that are left, is again "the lowest copy is the row".

**What is left of the races.** A task that dies while choosing leaves its marker; the
others wait for it at most :data:`CHOOSING_TIMEOUT` seconds (a marker older than that by
its time stamp is not waited for; the partition's next attempt deletes it). If a task
stalls longer than that between its markers' steps (or a host's clock is off by more),
another may not see its ticket: both keep the row -- a duplicate, never a loss. Two live
attempts of one partition (speculation, which the source refuses) can take two tickets
for one chunk: the lowest counts.

Costs: per chunk with publish ids, two small files written (no fsync), one deleted,
three listings of the batch's ``_copies`` directory, and the tickets of other chunks read
(16 bytes per id); chunks without publish ids take no ticket and cost nothing
(bench/RESULTS.md, "Copies of one publish").
"""

from __future__ import annotations

import os
import re
import struct
import time
import uuid
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Generator, Iterable, Protocol

from .._log import get_logger
from ._seen import PID_DTYPE, PID_SIZE, IdSet, first_copies

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

log = get_logger(__name__)

COPIES_DIR = "_copies"
# Seconds a task waits for another's "choosing" marker (a marker older than this, by its
# time stamp, is not waited for): choosing is a listing and a small write, milliseconds.
CHOOSING_TIMEOUT = 5.0
# Seconds between two listings while waiting for a marker.
CHOOSING_POLL = 0.002

_MAGIC = b"NSQCOPY1"
_HEAD = struct.Struct("<8sIQQI")  # magic, partition, chunk, topic tag, ids
_CRC = struct.Struct("<I")
_TICKET_RE = re.compile(r"^t(\d+)-p(\d+)-c(\d+)-([0-9a-f]+)$")
_MARKER_RE = re.compile(r"^w-p(\d+)-c(\d+)-(\d+)-([0-9a-f]+)$")


@dataclass(frozen=True, order=True)
class Ticket:
    """A chunk's place in its batch's order (compared by number, then partition, chunk
    and nonce: a total order every task sees the same)."""

    number: int
    part: int
    chunk: int
    nonce: str

    @property
    def name(self) -> str:
        return f"t{self.number:09d}-p{self.part:05d}-c{self.chunk:06d}-{self.nonce}"


def parse_ticket(name: str) -> Ticket | None:
    m = _TICKET_RE.match(name)
    if not m:
        return None
    return Ticket(int(m.group(1)), int(m.group(2)), int(m.group(3)), m.group(4))


@dataclass(frozen=True)
class Marker:
    name: str
    part: int
    chunk: int
    written_ms: int
    nonce: str


def parse_marker(name: str) -> Marker | None:
    m = _MARKER_RE.match(name)
    if not m:
        return None
    return Marker(name, int(m.group(1)), int(m.group(2)), int(m.group(3)), m.group(4))


def encode_ticket(part: int, chunk: int, tag: int, pids: "np.ndarray") -> bytes:
    """A ticket's content: its chunk's sorted unique publish ids (``V16``), checked."""
    body = _HEAD.pack(_MAGIC, part, chunk, tag, len(pids)) + pids.tobytes()
    return body + _CRC.pack(zlib.crc32(body))


def decode_ticket(data: bytes) -> tuple[int, int, int, "np.ndarray"] | None:
    """``(partition, chunk, topic tag, publish ids)``; None for a torn or foreign file
    (every reader ignores it alike: it is a ticket never taken)."""
    import numpy as np

    if len(data) < _HEAD.size + _CRC.size:
        return None
    magic, part, chunk, tag, n = _HEAD.unpack_from(data)
    if magic != _MAGIC or len(data) != _HEAD.size + n * PID_SIZE + _CRC.size:
        return None
    (crc,) = _CRC.unpack_from(data, len(data) - _CRC.size)
    if zlib.crc32(memoryview(data)[:len(data) - _CRC.size]) != crc:
        return None
    pids = np.frombuffer(data, PID_DTYPE, n, _HEAD.size)
    return part, chunk, tag, pids


def keep_mask(keys: "np.ndarray", valid: "np.ndarray", seen: Iterable[IdSet]
              ) -> "np.ndarray":
    """The rule for one chunk (pure): a row is kept unless its publish id is in one of
    ``seen`` (the lower tickets' ids, the earlier batches') or repeats an earlier row of
    the chunk. Rows without an id (``valid`` False) are always kept."""
    return first_copies(keys, valid, seen)


class Store(Protocol):
    """What the order needs of the spool's storage (:class:`~.spool._FS` has it)."""

    local: bool
    object_store: bool
    fs: Any

    def listdir(self, path: str) -> list[str]: ...

    def write_plain(self, path: str, data: bytes) -> None: ...

    def write_atomic(self, path: str, data: bytes) -> None: ...

    def read_bytes(self, path: str) -> bytes: ...

    def remove(self, path: str) -> None: ...

    def exists(self, path: str) -> bool: ...


class CopyOrder:
    """The order of one batch's chunks, as the fetch task of partition ``index`` sees it
    (module doc). ``earlier``: the publish ids of earlier batches (``V16`` keys);
    ``tag``: the topic's (tickets of other topics are not compared with).

    The checks that run before a ticket is taken raise :class:`~.spool.SpoolFenced`:
    ``check_fence`` for a chunk just made durable (the spool's fence: the partition not
    sealed, the batch not committed -- a chunk that fails it is not FINished, and may not
    be in the result), ``check_marker`` for a chunk spooled before (a replay, a sealing
    attempt taking in another's chunk: in the result whatever the seal says, unless the
    batch is committed)."""

    def __init__(self, fs: Store, batch_dir: str, index: int, tag: int,
                 earlier: "IdSet | Callable[[], IdSet] | None" = None, *,
                 check_fence: Callable[[], None] | None = None,
                 check_marker: Callable[[], None] | None = None,
                 wall: Callable[[], float] = time.time,
                 sleep: Callable[[float], None] = time.sleep,
                 nonce: str | None = None) -> None:
        self.fs = fs
        self.dir = f"{batch_dir}/{COPIES_DIR}"
        self.batch_dir = batch_dir
        self.index = index
        self.tag = tag
        # loaded at the first decision when given as a function (a replay of chunks
        # without publish ids never reads the index)
        self._earlier = earlier if earlier is not None else IdSet(dtype=PID_DTYPE)
        self.check_fence = check_fence
        self.check_marker = check_marker
        self.wall = wall
        self.sleep = sleep
        self.nonce = nonce or uuid.uuid4().hex[:8]
        self._made = False
        self._contents: dict[str, "np.ndarray | None"] = {}  # ticket name -> its ids
        # the ids of every ticket below ``_upto`` (the last ticket decided), read
        self._lower = IdSet(dtype=PID_DTYPE)
        self._absorbed: set[str] = set()
        self._upto: Ticket | None = None
        self._abandoned: set[str] = set()  # markers waited for in vain
        self._names: dict[str, Ticket | None] = {}  # names listed, parsed once
        self.dropped = 0  # rows this task found to be copies
        self.waited = 0.0  # seconds spent waiting for other tasks' markers

    @property
    def earlier(self) -> IdSet:
        if callable(self._earlier):
            self._earlier = self._earlier()
        return self._earlier

    # -- the live path ------------------------------------------------------------------

    def claim(self, chunk: int, keys: "np.ndarray", valid: "np.ndarray",
              replayed: bool = False) -> "np.ndarray":
        """Take a ticket for the durable chunk ``chunk`` (its rows' publish ids ``keys``,
        ``valid`` where there is one) and return which of its rows are rows (the keep
        mask). A chunk without publish ids takes none: all its rows are rows.
        ``replayed``: a chunk spooled before (checked against ``check_marker`` only)."""
        import numpy as np

        if not valid.any():
            return np.ones(len(keys), bool)
        return self._run(self.claim_steps(chunk, keys, valid, replayed))

    def _run(self, steps: Generator[float, None, "np.ndarray"]) -> "np.ndarray":
        try:
            while True:
                wait = next(steps)
                if wait:
                    self.sleep(wait)
        except StopIteration as done:
            keep: "np.ndarray" = done.value
            return keep

    def claim_steps(self, chunk: int, keys: "np.ndarray", valid: "np.ndarray",
                    replayed: bool = False) -> Generator[float, None, "np.ndarray"]:
        """:meth:`claim`, one file operation per step: yields the seconds to wait before
        the next (0: none), returns the keep mask. (Tests interleave the steps of several
        tasks through this.)"""
        from ._seen import _sorted_unique

        check = self.check_marker if replayed else self.check_fence
        if check is not None:
            check()
        self._ensure_dir()
        fs, d = self.fs, self.dir
        marker = f"w-p{self.index:05d}-c{chunk:06d}-{int(self.wall() * 1000)}-{self.nonce}"
        fs.write_plain(f"{d}/{marker}", b"")
        yield 0.0
        names = fs.listdir(d)
        self._remove_stale_markers(names)
        number = 1 + max((t.number for t in self._tickets(names)), default=-1)
        yield 0.0
        pids = _sorted_unique(keys[valid])
        ticket = Ticket(number, self.index, chunk, self.nonce)
        fs.write_atomic(f"{d}/{ticket.name}", encode_ticket(self.index, chunk, self.tag,
                                                            pids))
        self._contents[ticket.name] = pids
        yield 0.0
        fs.remove(f"{d}/{marker}")
        yield 0.0
        names = yield from self._after_choosers(marker)
        return self._decide(ticket, names, keys, valid)

    def _after_choosers(self, mine: str | None) -> Generator[float, None, list[str]]:
        """Step 4: list until no other task's marker is listed (those choosing now may
        take a number at or below ours), then once more: every lower ticket is there.
        ``mine``: this task's own marker, not waited for."""
        fs, d = self.fs, self.dir
        started = self.wall()
        while True:
            names = fs.listdir(d)
            busy = self._busy_markers(names, mine)
            if not busy:
                break
            if self.wall() - started >= CHOOSING_TIMEOUT:
                log.warning("%s: fetch tasks %s did not finish choosing their place in the "
                            "order of copies within %g s; going on without waiting (if "
                            "one is alive, a copy it holds may become a second row)",
                            self.dir, sorted(busy), CHOOSING_TIMEOUT)
                self._abandoned.update(busy)
                break
            yield CHOOSING_POLL
        self.waited += self.wall() - started
        names = fs.listdir(d)  # after the markers are gone: every lower ticket is here
        yield 0.0
        return names

    def _busy_markers(self, names: list[str], mine: str | None) -> set[str]:
        now_ms = self.wall() * 1000
        out = set()
        for name in names:
            m = parse_marker(name)
            if m is None or name == mine or name in self._abandoned:
                continue
            if now_ms - m.written_ms < CHOOSING_TIMEOUT * 1000:
                out.add(name)
        return out

    def _remove_stale_markers(self, names: list[str]) -> None:
        """Markers of this partition from an earlier attempt (one attempt of a partition
        runs at a time: that one is dead) are removed, so nobody waits for them."""
        for name in names:
            m = parse_marker(name)
            if m is not None and m.part == self.index and m.nonce != self.nonce:
                self.fs.remove(f"{self.dir}/{name}")

    # -- replays ------------------------------------------------------------------------

    def replay(self, chunk: int, keys: "np.ndarray", valid: "np.ndarray") -> "np.ndarray":
        """The keep mask of a chunk spooled before (a replay, a resumed partition, a chunk
        taken in from another attempt): decided again from its ticket, or, when it has
        none (its task died before taking one), by taking one now."""
        import numpy as np

        if not valid.any():
            return np.ones(len(keys), bool)
        return self._run(self.replay_steps(chunk, keys, valid))

    def replay_steps(self, chunk: int, keys: "np.ndarray", valid: "np.ndarray"
                     ) -> Generator[float, None, "np.ndarray"]:
        """:meth:`replay` step by step, as :meth:`claim_steps`."""
        names = self.fs.listdir(self.dir)
        self._remove_stale_markers(names)
        mine = self._ticket_of(chunk, names)
        if mine is None:
            return (yield from self.claim_steps(chunk, keys, valid, replayed=True))
        yield 0.0
        # the attempt that took the ticket may have died before its step 4: a task that
        # was choosing meanwhile may hold a lower ticket not written yet
        names = yield from self._after_choosers(None)
        return self._decide(mine, names, keys, valid)

    def _tickets(self, names: list[str]) -> list[Ticket]:
        """The tickets among ``names`` (each name parsed once per task)."""
        parsed = self._names
        out = []
        for name in names:
            if name not in parsed:
                parsed[name] = parse_ticket(name)
            t = parsed[name]
            if t is not None:
                out.append(t)
        return out

    def _ticket_of(self, chunk: int, names: list[str]) -> Ticket | None:
        """The lowest intact ticket of (this partition, ``chunk``), or None."""
        found = sorted(t for t in self._tickets(names)
                       if t.part == self.index and t.chunk == chunk)
        for t in found:
            if self._read(t) is not None:
                return t
        return None

    # -- deciding -----------------------------------------------------------------------

    def _read(self, t: Ticket) -> "np.ndarray | None":
        """A ticket's ids (None: torn, foreign or of another topic); read once."""
        if t.name in self._contents:
            return self._contents[t.name]
        try:
            data = self.fs.read_bytes(f"{self.dir}/{t.name}")
        except (FileNotFoundError, OSError):
            data = b""
        decoded = decode_ticket(data)
        ids = None
        if decoded is not None and decoded[:2] == (t.part, t.chunk) \
                and decoded[2] == self.tag:
            ids = decoded[3]
        self._contents[t.name] = ids
        return ids

    def _decide(self, ticket: Ticket, names: list[str], keys: "np.ndarray",
                valid: "np.ndarray") -> "np.ndarray":
        """The keep mask of the chunk holding ``ticket``: against every ticket below it
        (of other chunks) in ``names``, and the earlier batches."""
        if self._upto is not None and ticket < self._upto:
            # an older chunk than the last decided (a replay out of order): start over
            self._lower, self._absorbed, self._upto = IdSet(dtype=PID_DTYPE), set(), None
        own = (ticket.part, ticket.chunk)
        for t in self._tickets(names):
            if not t < ticket or t.name in self._absorbed or (t.part, t.chunk) == own:
                continue
            ids = self._read(t)
            self._absorbed.add(t.name)
            if ids is not None and len(ids):
                self._lower.add(ids, sorted_unique=True)
                del self._contents[t.name]  # in _lower now (read again after a reset)
        self._upto = ticket
        keep = keep_mask(keys, valid, (self.earlier, self._lower))
        dropped = int(len(keep) - keep.sum())
        if dropped:
            self.dropped += dropped
            log.info("%s: chunk %d of part %d: %d rows are copies of publishes already "
                     "rows (ticket %s)", self.batch_dir, ticket.chunk, ticket.part,
                     dropped, ticket.number)
        return keep

    # -- the directory ------------------------------------------------------------------

    def _ensure_dir(self) -> None:
        """``_copies`` inside the batch's directory, which the driver made (never its
        parents: an attempt that outlived its batch brings nothing back)."""
        if self._made:
            return
        from ._spool import SpoolFenced

        fs = self.fs
        if fs.local:
            try:
                os.mkdir(self.dir)
            except FileExistsError:
                pass
            except FileNotFoundError:
                raise SpoolFenced(f"{self.batch_dir}: the batch directory is gone "
                                  "(committed and deleted by the driver)") from None
        elif not fs.object_store:  # HDFS & co.: no parents made
            try:
                fs.fs.create_dir(self.dir, recursive=False)
            except OSError:
                if not fs.exists(self.dir):
                    if not fs.exists(self.batch_dir):
                        raise SpoolFenced(f"{self.batch_dir}: the batch directory is gone "
                                          "(committed and deleted by the driver)") from None
                    raise
        self._made = True


def chunk_keep(order: CopyOrder | None, chunk: int, batches: "list[Any]", replay: bool
               ) -> "list[Any]":
    """A chunk's record batches (as spooled) without its copies: decided live
    (``replay`` False: the chunk was just made durable) or again (a chunk spooled
    before). The same batches when nothing is dropped or there is no order."""
    if order is None or not batches or "publish_id" not in batches[0].schema.names:
        return batches
    import pyarrow as pa

    if len(batches) > 1:
        batches = pa.Table.from_batches(batches).combine_chunks().to_batches()
    rb = batches[0]
    col = rb.column("publish_id")
    if col.null_count == len(col):
        return batches
    from ._seen import pid_keys

    keys, valid = pid_keys(col)
    keep = (order.replay if replay else order.claim)(chunk, keys, valid)
    return batches if keep.all() else [rb.filter(pa.array(keep))]
