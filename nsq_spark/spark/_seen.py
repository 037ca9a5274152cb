"""The ids the source has spooled, remembered for a window: nsqd's redeliveries are dropped.

NSQ redelivers a message under its original ``id`` when its FIN did not reach nsqd (an
executor or driver killed between the spool write and the FIN: nsqd sends it again after
``msg_timeout``) and when a restarted nsqd rewinds its disk queue past messages it had
already sent. The spool holds every id the source made durable, so a fetch task drops a
message whose id is there (and FINishes it, so that nsqd forgets it) instead of making it
a second row. No dedup in the user's query, no external store.

Where a first copy can be, and how a fetch task of (batch ``n``, partition ``p``) sees it:

* an earlier batch (committed or not): the *index*, one file per completed partition,
  ``<spoolPath>/<query>/_seen/b<batch>-p<part>-n<ids>-d<dropped>-t<ms>-<rand>.arrow``
  (Arrow IPC: the ``uint64`` ids and their nsqds' tags, sorted), written before the
  partition's ``_COMPLETE``; every file of a batch below ``n`` is loaded once per task;
* the same batch, another partition: that partition's spool chunks, looked at again each
  time this task cuts a chunk, through the chunk's keys file (``c<k>.nkeys``: its sorted
  keys, written once the chunk is durable, not fsynced), or the chunk's ``id`` and
  ``nsqd_address`` columns when the keys file is missing or short;
* the same partition (this attempt or an earlier one that died part-way): kept in memory.

That last listing is enough because nsqd sends the second copy of a message only after
the first was FINished (rewind) or timed out, and the source FINishes only after the chunk
holding it is durable; so when the second copy arrives, the first is already readable, or
it never will be (the task died before writing it; then nothing was FINished either).

Retention: the driver deletes index files at commit once they are older than
``redeliveryWindow`` seconds (default 300: nsqd's ``msg_timeout`` of 60 s, the batches
before a driver restart, an nsqd restarted within minutes), and the oldest beyond
``redeliveryWindowMaxIds`` ids (default 5,000,000). A redelivery older than the window
passes as a row. Costs: 16 bytes per id on disk (the id and its nsqd's tag; plus ~400
bytes per file) and 8 in each fetch task's memory (the cap: 40 MB; the sort of the
loaded files takes as much again for a moment). The publish ids of the rows that carry
one (:mod:`.copies`) are kept beside, in ``<name>.pids.arrow``, for the same window: 16
bytes each. Per chunk of the fault-free path: a hex decode, sorts and binary searches of
numpy arrays, a listing of the batch directory, a keys file written and the other tasks'
read (bench/RESULTS.md, "Redelivery index", has the measured cost).

Keys: nsqd's ids are 16 hex digits, i.e. exactly 64 bits, so each is kept as the
``uint64`` it spells (exact: two ids collide only if they are equal). An id that is not
16 hex digits (not from nsqd) is never taken for a duplicate.

Nsqds: an id names a message on one nsqd only. nsqd makes it from the time in ms, its
node id (``--node-id``, by default a hash of the host name into 10 bits: the same for
every nsqd of a host, and for two hosts in 1,024) and a sequence that restarts every ms,
so two nsqds that share a node id give messages published in the same millisecond the
same ids -- a replicated publish, which lands on two nsqds within microseconds, almost
always. A redelivery comes from the nsqd that delivered the first copy, so ids are
compared within one nsqd (the row's ``nsqd_address``, as a 64-bit tag: :func:`nsqd_tags`)
and nothing else: :class:`KeySet` holds one :class:`IdSet` per nsqd. (Measured: three
nsqds on one host, replicated publishing, 4,260 of 8,000 copies taken for
"redeliveries" when ids were compared across nsqds; since, none.) Copies of one publish
on two nsqds are the business of :mod:`.copies`, by publish id. Index and keys files
written before the nsqd was kept are not read: a redelivery of what they name passes as
a row, never the other way round.

Topics: nsqd numbers each topic's messages itself (time in ms, node id, a sequence that
restarts every ms), so two topics of one query routinely hold messages with the same id.
Ids are therefore compared within one topic only: a gate made for a topic loads only
index files tagged with that topic (:func:`topic_tag`, ``-x<tag>`` in the name; files
from before the tag are taken for no topic -- a redelivery then passes as a row, never
the other way round), and reads only the peers' keys files of its topic (the tag is in
the file; a peer chunk without one is read, and its rows of other topics skipped).
"""

from __future__ import annotations

import hashlib
import re
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable
from .._log import get_logger

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np
    import pyarrow as pa

    from ._spool import PartitionSpool, Spool

log = get_logger(__name__)

SEEN_DIR = "_seen"
# Defaults of the options redeliveryWindow and redeliveryWindowMaxIds.
DEFAULT_WINDOW = 300.0
DEFAULT_MAX_IDS = 5_000_000
# At most this many runs in an IdSet (see IdSet).
_MAX_RUNS = 24

_NAME_RE = re.compile(r"^b(\d+)-p(\d+)-n(\d+)-d(\d+)-t(\d+)-[0-9a-f]+(?:-x([0-9a-f]{16}))?"
                      r"\.arrow$")


# Publish ids as numpy keys: 16 bytes compared as bytes (:class:`IdSet` with this dtype).
PID_SIZE = 16
PID_DTYPE = "V16"


def pids_sibling(name: str) -> str:
    """The file of an index file's publish ids (``x.arrow`` -> ``x.pids.arrow``)."""
    return name[:-len(".arrow")] + ".pids.arrow"


def pid_keys(col: "pa.Array | pa.ChunkedArray") -> tuple["np.ndarray", "np.ndarray"]:
    """``(keys, valid)`` of a ``publish_id`` column: each id as a ``V16`` key (zeros where
    there is none), and whether there is one. A value that is not 16 bytes is no id."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    n = len(col)
    if n == 0 or col.null_count == n:
        return np.zeros(n, PID_DTYPE), np.zeros(n, bool)
    valid = pc.equal(pc.binary_length(col), PID_SIZE)
    valid = pc.fill_null(valid, False)
    fixed = pc.if_else(valid, col, pa.scalar(bytes(PID_SIZE), pa.binary())).cast(
        pa.binary(PID_SIZE))
    keys = np.frombuffer(fixed.buffers()[1], PID_DTYPE, n, fixed.offset * PID_SIZE).copy()
    return keys, valid.to_numpy(zero_copy_only=False)


def topic_tag(topic: str) -> int:
    """A topic's 64-bit tag (ids are compared within one topic: module doc)."""
    return int.from_bytes(hashlib.blake2b(topic.encode(), digest_size=8).digest(), "big")

def nsqd_tags(addresses: "pa.Array | pa.ChunkedArray") -> "np.ndarray":
    """Each row's nsqd (its ``nsqd_address``) as a 64-bit tag: ids are compared within one
    nsqd (module doc). One hash per distinct address, not per row."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(addresses, pa.ChunkedArray):
        addresses = addresses.combine_chunks()
    n = len(addresses)
    if n == 0:
        return np.zeros(0, np.uint64)
    one = _one_value(addresses)
    if one is not None:  # a chunk from one nsqd (the usual case): no hash table
        return np.full(n, _address_tag(one), np.uint64)
    encoded = pc.dictionary_encode(addresses)
    values = encoded.dictionary.to_pylist()
    tags = np.array([_address_tag(a) for a in values], np.uint64)
    if len(tags) == 1 and not encoded.indices.null_count:
        return np.full(n, tags[0], np.uint64)
    indices = pc.fill_null(encoded.indices, 0).to_numpy(zero_copy_only=False)
    out: "np.ndarray" = tags[indices] if len(tags) else np.zeros(n, np.uint64)
    return out


_ADDRESS_TAGS: dict[str, int] = {}


def _address_tag(address: str | None) -> int:
    if address is None:
        return 0
    tag = _ADDRESS_TAGS.get(address)
    if tag is None:
        tag = topic_tag("nsqd\0" + address)
        if len(_ADDRESS_TAGS) < 4096:
            _ADDRESS_TAGS[address] = tag
    return tag


def _one_value(col: "pa.Array") -> str | None:
    """The value of a string column whose rows all hold the same one (no nulls), else
    None: its bytes are the first value's, repeated (one comparison in C)."""
    import numpy as np
    import pyarrow as pa

    n = len(col)
    if col.null_count or not pa.types.is_string(col.type):
        return None
    offsets = np.frombuffer(col.buffers()[1], np.int32, n + 1, col.offset * 4)
    start, stop = int(offsets[0]), int(offsets[-1])
    width = int(offsets[1]) - start
    if stop - start != width * n:
        return None
    data = col.buffers()[2]
    first = memoryview(data)[start:start + width].tobytes()
    # (a memoryview compares element by element in Python terms: bytes compare in C)
    if memoryview(data)[start:stop].tobytes() != first * n:
        return None
    return first.decode("utf-8")


def row_keys(rb: "pa.RecordBatch") -> tuple["np.ndarray", "np.ndarray", "np.ndarray"]:
    """``(nsqds, keys, valid)`` of a batch's rows: their nsqd's tag, their id as a key
    (:func:`id_keys`), and whether it is one."""
    keys, valid = id_keys(rb.column("id"))
    return nsqd_tags(rb.column("nsqd_address")), keys, valid


_HEX_LUT: Any = None


def _hex_lut() -> "np.ndarray":
    global _HEX_LUT
    if _HEX_LUT is None:
        import numpy as np

        lut = np.full(256, 255, np.uint8)
        for i, c in enumerate(b"0123456789abcdef"):
            lut[c] = i
        for i, c in enumerate(b"ABCDEF"):
            lut[c] = 10 + i
        _HEX_LUT = lut
    lut_: "np.ndarray" = _HEX_LUT
    return lut_


def id_keys(ids: "pa.Array | pa.ChunkedArray") -> tuple["np.ndarray", "np.ndarray"]:
    """``(keys, valid)``: each id as the uint64 its 16 hex digits spell, and whether it
    is such an id (``keys`` is 0 where not). Vectorized: no Python object per id."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(ids, pa.ChunkedArray):
        ids = ids.combine_chunks()
    n = len(ids)
    if n == 0:
        return np.zeros(0, np.uint64), np.zeros(0, bool)
    if ids.null_count == 0 and (pa.types.is_string(ids.type) or pa.types.is_binary(ids.type)):
        offsets = np.frombuffer(ids.buffers()[1], np.int32)[ids.offset:ids.offset + n + 1]
        start, stop = int(offsets[0]), int(offsets[-1])
        if stop - start == 16 * n and bool((np.diff(offsets) == 16).all()):
            data = ids.buffers()[2]
            try:  # 16 hex digits each, back to back: one C call (about 4x _decode)
                packed = bytes.fromhex(memoryview(data)[start:stop].tobytes().decode("ascii"))
            except (ValueError, UnicodeDecodeError):
                packed = b""
            if len(packed) == 8 * n:  # (fromhex skips whitespace: a shorter result is not)
                return (np.frombuffer(packed, ">u8").astype(np.uint64),
                        np.ones(n, bool))
            raw = np.frombuffer(data, np.uint8)[start:stop].reshape(n, 16)
            return _decode(raw)
    # any other layout (nulls, other lengths): the rows of 16 characters, one by one
    keys = np.zeros(n, np.uint64)
    valid = np.zeros(n, bool)
    lengths = pc.binary_length(ids).to_numpy(zero_copy_only=False)
    for i in np.flatnonzero(lengths == 16):
        k, ok = _decode(np.frombuffer(ids[int(i)].as_py().encode()
                                      if pa.types.is_string(ids.type) else ids[int(i)].as_py(),
                                      np.uint8).reshape(1, 16))
        keys[i], valid[i] = k[0], ok[0]
    return keys, valid


def _decode(raw: "np.ndarray") -> tuple["np.ndarray", "np.ndarray"]:
    import numpy as np

    nib = np.take(_hex_lut(), raw)
    bad = nib == 255
    if bad.any():  # not nsqd's ids: the rows concerned get key 0, valid False
        valid = ~bad.any(axis=1)
        nib[bad] = 0
    else:
        valid = np.ones(len(raw), bool)
    packed = (nib[:, 0::2] << 4) | nib[:, 1::2]  # 8 big-endian bytes per id
    keys = packed.view(">u8").reshape(-1).astype(np.uint64)
    keys[~valid] = 0
    return keys, valid


def _sorted_unique(keys: "np.ndarray") -> "np.ndarray":
    """Sorted, without repeats (np.unique's hash path is several times slower here).
    Keys keep their dtype: uint64 (nsqd ids) or ``V16`` (publish ids, compared as bytes)."""
    import numpy as np

    # stable: timsort, which merges the two sorted runs of a concatenation in linear time
    out = np.sort(np.asarray(keys), kind="stable")
    if len(out) > 1:
        out = out[np.concatenate(([True], out[1:] != out[:-1]))]
    return out


class IdSet:
    """A set of keys for bulk membership tests: sorted unique runs, each at least
    twice as long as the next (a new run is merged into the one before while it is not),
    so there are O(log n) runs and each key is merged O(log n) times. A lookup costs a
    binary search per run. ``dtype``: ``uint64`` (nsqd ids), or ``"V16"`` (publish ids:
    16 bytes compared as bytes, so two keys are equal only if every byte is)."""

    def __init__(self, keys: "np.ndarray | None" = None, dtype: Any = None) -> None:
        import numpy as np

        self.dtype = np.dtype(np.uint64 if dtype is None else dtype)
        self._runs: list["np.ndarray"] = []
        if keys is not None and len(keys):
            self.add(keys)

    def __len__(self) -> int:
        return sum(len(r) for r in self._runs)

    def add(self, keys: "np.ndarray", sorted_unique: bool = False) -> None:
        """Add ``keys`` (``sorted_unique``: they already are, the sort is skipped)."""
        import numpy as np

        if not len(keys):
            return
        runs = self._runs
        keys = np.asarray(keys, self.dtype)
        runs.append(keys if sorted_unique else _sorted_unique(keys))
        while len(runs) > 1 and (2 * len(runs[-1]) >= len(runs[-2])
                                 or len(runs) > _MAX_RUNS):
            last = runs.pop()
            runs[-1] = _sorted_unique(np.concatenate((runs[-1], last)))

    def contains(self, keys: "np.ndarray") -> "np.ndarray":
        """A bool mask: which of ``keys`` are in the set."""
        import numpy as np

        keys = np.asarray(keys, self.dtype)
        hit = np.zeros(len(keys), bool)
        if not len(keys) or not self._runs:
            return hit
        lo = hi = None
        if self.dtype.kind == "u":  # nsqd ids grow with time: older runs lie below
            lo, hi = keys.min(), keys.max()
        for run in self._runs:
            if lo is not None and (run[-1] < lo or run[0] > hi):
                continue
            pos = np.searchsorted(run, keys)
            pos[pos == len(run)] = 0
            hit |= run[pos] == keys
        return hit

    def sorted_keys(self) -> "np.ndarray":
        import numpy as np

        if not self._runs:
            return np.zeros(0, self.dtype)
        return self._runs[0] if len(self._runs) == 1 else _sorted_unique(
            np.concatenate(self._runs))


def first_copies(keys: "np.ndarray", valid: "np.ndarray", seen: Iterable[IdSet]
                 ) -> "np.ndarray":
    """The keep mask of one chunk: a row is dropped when its key is in any of ``seen`` or
    when an earlier row of the chunk has the same key. Invalid keys are always kept."""
    import numpy as np

    drop = np.zeros(len(keys), bool)
    for s in seen:
        drop |= s.contains(keys)
    order = np.argsort(keys, kind="stable")  # equal keys stay in arrival order
    in_order = keys[order]
    drop[order[1:][in_order[1:] == in_order[:-1]]] = True  # all but the first of each
    keep: "np.ndarray" = ~(drop & valid)
    return keep


def _groups(nsqds: "np.ndarray") -> "list[tuple[int, Any]]":
    """``(tag, rows)`` per distinct nsqd tag (``rows``: a slice of all when one)."""
    import numpy as np

    if not len(nsqds):
        return []
    first = nsqds[0]
    if bool((nsqds == first).all()):
        return [(int(first), slice(None))]
    return [(int(t), np.flatnonzero(nsqds == t)) for t in np.unique(nsqds)]


class KeySet:
    """nsqd ids per nsqd (module doc: an id names a message on one nsqd only): an
    :class:`IdSet` per nsqd tag, so that a lookup costs what one set's does."""

    def __init__(self) -> None:
        self._by: dict[int, IdSet] = {}

    def __len__(self) -> int:
        return sum(len(s) for s in self._by.values())

    def add(self, nsqds: "np.ndarray", keys: "np.ndarray", sorted_unique: bool = False
            ) -> None:
        """Add ``keys`` (``nsqds[i]`` is the nsqd of ``keys[i]``); ``sorted_unique``:
        sorted by (nsqd, key) without repeats, as :meth:`pairs` gives them."""
        for tag, rows in _groups(nsqds):
            self._by.setdefault(tag, IdSet()).add(keys[rows], sorted_unique)

    def contains(self, nsqds: "np.ndarray", keys: "np.ndarray") -> "np.ndarray":
        import numpy as np

        hit = np.zeros(len(keys), bool)
        for tag, rows in _groups(nsqds):
            s = self._by.get(tag)
            if s is not None:
                hit[rows] = s.contains(keys[rows])
        return hit

    def pairs(self) -> tuple["np.ndarray", "np.ndarray"]:
        """``(nsqds, keys)``: every key with its nsqd, sorted by (nsqd, key)."""
        import numpy as np

        tags = sorted(self._by)
        keys = [self._by[t].sorted_keys() for t in tags]
        if not keys:
            return np.zeros(0, np.uint64), np.zeros(0, np.uint64)
        return (np.concatenate([np.full(len(k), t, np.uint64) for t, k in zip(tags, keys)]),
                np.concatenate(keys))


def sorted_pairs(nsqds: "np.ndarray", keys: "np.ndarray"
                 ) -> tuple["np.ndarray", "np.ndarray"]:
    """``(nsqds, keys)`` sorted by (nsqd, key), without repeated pairs."""
    import numpy as np

    order = np.lexsort((keys, nsqds))
    t, k = nsqds[order], keys[order]
    if len(k) > 1:
        new = np.concatenate(([True], (t[1:] != t[:-1]) | (k[1:] != k[:-1])))
        t, k = t[new], k[new]
    return t, k


def first_copies_by(nsqds: "np.ndarray", keys: "np.ndarray", valid: "np.ndarray",
                    seen: "Iterable[KeySet]") -> "np.ndarray":
    """:func:`first_copies` with the keys of each nsqd apart: a row is dropped when its
    (nsqd, id) is in one of ``seen`` or repeats an earlier row of the chunk."""
    return _first_copies_sorted(nsqds, keys, valid, seen)[0]


def _first_copies_sorted(nsqds: "np.ndarray", keys: "np.ndarray", valid: "np.ndarray",
                         seen: "Iterable[KeySet]"
                         ) -> "tuple[np.ndarray, np.ndarray, np.ndarray]":
    """``(keep, nsqds, keys)``: :func:`first_copies_by`'s mask, and the pairs sorted by
    (nsqd, key) -- one sort serves both (a chunk from one nsqd, the usual case, sorts
    its keys alone: about a third of the ``lexsort``)."""
    import numpy as np

    drop = np.zeros(len(keys), bool)
    for s in seen:
        drop |= s.contains(nsqds, keys)
    if len(nsqds) and nsqds[0] == nsqds[-1] and bool((nsqds == nsqds[0]).all()):
        order = np.argsort(keys, kind="stable")  # equal keys stay in arrival order
        t, k = nsqds[:len(keys)], keys[order]
        repeat = k[1:] == k[:-1]
    else:
        order = np.lexsort((keys, nsqds))  # stable: equal pairs stay in arrival order
        t, k = nsqds[order], keys[order]
        repeat = (t[1:] == t[:-1]) & (k[1:] == k[:-1])
    if repeat.any():
        drop[order[1:][repeat]] = True
    keep: "np.ndarray" = ~(drop & valid)
    return keep, t, k


@dataclass(frozen=True)
class IndexFile:
    name: str
    batch: int
    part: int
    ids: int
    dropped: int
    written_ms: int
    topic_tag: int | None = None  # None: written before ids were kept per topic


def parse_index_name(name: str) -> IndexFile | None:
    m = _NAME_RE.match(name)
    if not m:
        return None
    b, p, n, d, t = (int(g) for g in m.groups()[:5])
    tag = m.group(6)
    return IndexFile(name, b, p, n, d, t, None if tag is None else int(tag, 16))


def to_prune(files: list[IndexFile], committed: int, now_ms: int, window_s: float,
             max_ids: int) -> list[IndexFile]:
    """The index files the driver deletes after committing ``committed``: those of
    committed batches older than the window, then the oldest committed ones while the
    rest holds more than ``max_ids`` ids. A batch not committed keeps its files (a restart
    replays it)."""
    old = now_ms - int(window_s * 1000)
    gone = [f for f in files if f.batch <= committed and f.written_ms < old]
    kept = sorted((f for f in files if f not in gone), key=lambda f: (f.batch, f.written_ms))
    total = sum(f.ids for f in kept)
    for f in kept:
        if total <= max_ids or f.batch > committed:
            break
        gone.append(f)
        total -= f.ids
    return gone


class SeenIndex:
    """The index files of one query's spool (driver: prune; executors: write, load)."""

    def __init__(self, spool: "Spool") -> None:
        self.spool = spool

    @property
    def dir(self) -> str:
        return self.spool.fs.join(self.spool.query, SEEN_DIR)

    def files(self) -> list[IndexFile]:
        out = []
        for name in self.spool.fs.listdir(self.dir):
            f = parse_index_name(name)
            if f is not None:
                out.append(f)
        return out

    def write(self, batch: int, part: int, nsqds: "np.ndarray", keys: "np.ndarray",
              dropped: int, tag: int | None = None, pids: "np.ndarray | None" = None) -> str:
        """Durably write the ids ``keys`` of a completed partition (of the topic ``tag``;
        ``nsqds[i]`` the tag of ``keys[i]``'s nsqd), sorted by (nsqd, id): the columns
        ``id64`` and ``nsqd``. And first its publish ids, when it has any (``V16`` keys:
        the sibling file ``<name>.pids.arrow``, one ``fixed_size_binary(16)`` column), so
        that an index file's publish ids are there whenever it is."""
        import numpy as np
        import pyarrow as pa

        from ._spool import _ipc_bytes

        nsqds, keys = sorted_pairs(np.asarray(nsqds, np.uint64), np.asarray(keys, np.uint64))
        rb = pa.RecordBatch.from_arrays([pa.array(keys, pa.uint64()),
                                         pa.array(nsqds, pa.uint64())],
                                        names=["id64", "nsqd"])
        name = (f"b{batch:012d}-p{part:05d}-n{len(keys)}-d{dropped}"
                f"-t{int(time.time() * 1000)}-{uuid.uuid4().hex[:8]}"
                f"{'' if tag is None else f'-x{tag:016x}'}.arrow")
        fs = self.spool.fs
        fs.makedirs(self.dir)
        path = f"{self.dir}/{name}"
        if pids is not None and len(pids):
            pids = _sorted_unique(np.asarray(pids, PID_DTYPE))
            col = pa.Array.from_buffers(pa.binary(PID_SIZE), len(pids),
                                        [None, pa.py_buffer(pids.tobytes())])
            fs.create_exclusive(pids_sibling(path), _ipc_bytes(
                pa.RecordBatch.from_arrays([col], names=["pid"])))
        fs.create_exclusive(path, _ipc_bytes(rb))
        return path

    def load_before(self, batch: int, tag: int | None = None) -> KeySet:
        """Every id remembered from batches below ``batch`` (of the topic ``tag`` only,
        when given), with its nsqd. Files written before the nsqd was kept (no ``nsqd``
        column) are not read (module doc)."""
        import numpy as np
        import pyarrow as pa

        nsqds, keys = [], []
        for f in self.files():
            if f.batch >= batch or (tag is not None and f.topic_tag != tag):
                continue
            try:
                data = self.spool.fs.read_bytes(f"{self.dir}/{f.name}")
            except FileNotFoundError:  # pruned meanwhile: older than the window
                continue
            reader = pa.ipc.open_file(pa.py_buffer(data))
            if "nsqd" not in reader.schema.names:
                continue
            for i in range(reader.num_record_batches):
                rb = reader.get_batch(i)
                keys.append(rb.column("id64").to_numpy())
                nsqds.append(rb.column("nsqd").to_numpy())
        out = KeySet()
        if keys:
            out.add(*sorted_pairs(np.concatenate(nsqds), np.concatenate(keys)),
                    sorted_unique=True)
        return out

    def load_pids_before(self, batch: int, tag: int | None = None) -> IdSet:
        """Every publish id remembered from batches below ``batch`` (of the topic ``tag``
        only, when given): the ``.pids.arrow`` siblings of :meth:`load_before`'s files."""
        import numpy as np
        import pyarrow as pa

        names = set(self.spool.fs.listdir(self.dir))
        arrays = []
        for name in sorted(names):
            f = parse_index_name(name)
            if f is None or f.batch >= batch or (tag is not None and f.topic_tag != tag):
                continue
            sibling = pids_sibling(name)
            if sibling not in names:
                continue
            try:
                data = self.spool.fs.read_bytes(f"{self.dir}/{sibling}")
            except FileNotFoundError:  # pruned meanwhile: older than the window
                continue
            reader = pa.ipc.open_file(pa.py_buffer(data))
            for i in range(reader.num_record_batches):
                col = reader.get_batch(i).column(0)
                arrays.append(np.frombuffer(col.buffers()[1], PID_DTYPE, len(col),
                                            col.offset * PID_SIZE))
        if not arrays:
            return IdSet(dtype=PID_DTYPE)
        return IdSet(np.concatenate(arrays) if len(arrays) > 1 else arrays[0], PID_DTYPE)

    def prune(self, committed: int, window_s: float, max_ids: int) -> tuple[int, int]:
        """Driver, at commit: delete what :func:`to_prune` says (an index file's publish
        ids with it); returns (files deleted, ids remembered after)."""
        files = self.files()
        gone = to_prune(files, committed, int(time.time() * 1000), window_s, max_ids)
        for f in gone:
            self.spool.fs.remove(f"{self.dir}/{f.name}")
            self.spool.fs.remove(f"{self.dir}/{pids_sibling(f.name)}")
        names = {f.name for f in gone}
        return len(gone), sum(f.ids for f in files if f.name not in names)

    def dropped_total(self) -> int:
        """Redeliveries dropped by the partitions whose index files are still kept."""
        return sum(f.dropped for f in self.files())


class Redeliveries:
    """A fetch task's gate: which rows of a chunk are first copies (see the module doc)."""

    def __init__(self, spool: "Spool", batch: int, index: int,
                 topic: str | None = None, pids: bool = False) -> None:
        self.spool = spool
        self.batch = batch
        self.index = index
        self.topic = topic
        self.tag = None if topic is None else topic_tag(topic)
        index_files = SeenIndex(spool)
        self.earlier = index_files.load_before(batch, self.tag)
        # the publish ids of earlier batches (``pids``: for the copies' order, .copies)
        self.earlier_pids = (index_files.load_pids_before(batch, self.tag) if pids
                             else IdSet(dtype=PID_DTYPE))
        # the publish ids of this partition's rows, for its index file (sorted there)
        self.my_pids: "list[np.ndarray]" = []
        self.mine = KeySet()
        self.peers = KeySet()
        self._peer_next: dict[str, int] = {}  # partition dir -> its first chunk not read
        self.dropped = 0
        # (nsqds, keys) of the rows the last keep() let through, sorted (for the chunk's
        # keys file)
        self.last_keys: "tuple[np.ndarray, np.ndarray] | None" = None

    def remember(self, rb: "pa.RecordBatch") -> None:
        """Rows of this partition already spooled (an earlier attempt's chunks)."""
        nsqds, keys, valid = row_keys(rb)
        self.mine.add(nsqds[valid], keys[valid])
        self._add_pids(rb)

    def _add_pids(self, rb: "pa.RecordBatch") -> None:
        """The publish ids of ``rb``'s rows go to the partition's index file."""
        if "publish_id" not in rb.schema.names:
            return
        col = rb.column("publish_id")
        if col.null_count == len(col):  # a topic without publish ids: nothing to do
            return
        keys, valid = pid_keys(col)
        self.my_pids.append(keys[valid])

    def _refresh_peers(self) -> None:
        """Read the keys of the other partitions' chunks not read yet (chunks are
        numbered without gaps, so one existence check per partition finds none new)."""
        from ._spool import _BATCH_PART_RE, PartitionSpool

        fs = self.spool.fs
        bdir = self.spool.batch_dir(self.batch)
        for name in fs.listdir(bdir):
            m = _BATCH_PART_RE.match(name)
            if not m or int(m.group(1)) == self.index:
                continue
            peer = PartitionSpool(fs, f"{bdir}/{name}")
            k = self._peer_next.get(name, 0)
            while True:
                # the keys file is written once the chunk is durable: trusted only in
                # this contiguous walk (a durable chunk after a torn one has one too,
                # but the walk stops at the torn one, and a retry deletes both)
                tagged = peer.read_chunk_keys_tagged(k)
                if tagged is not None:
                    (nsqds, keys), tag = tagged
                    if self.tag is None or tag == self.tag:  # else another topic's
                        self.peers.add(nsqds, keys, sorted_unique=True)
                    k += 1
                    continue
                if not fs.exists(peer.chunk_path(k)):
                    break
                try:
                    rows = self._chunk_rows(peer, k)
                except (OSError, ValueError):  # being written: its messages are not
                    break  # FINished yet, so no second copy of them exists yet
                for rb in rows:
                    nsqds, keys, valid = row_keys(rb)
                    self.peers.add(nsqds[valid], keys[valid])
                k += 1
            self._peer_next[name] = k

    def _chunk_rows(self, peer: "PartitionSpool", k: int) -> "list[pa.RecordBatch]":
        """A peer's chunk k, of this gate's topic only (when it has one)."""
        import pyarrow.compute as pc

        batches = peer.read_chunk_columns(k, ("id", "nsqd_address", "topic"))
        if self.topic is None:
            return batches
        return [rb.filter(pc.equal(rb.column("topic"), self.topic)) for rb in batches]

    def keep(self, rb: "pa.RecordBatch") -> "pa.RecordBatch":
        """``rb`` without the rows whose id was spooled before (or repeats an earlier row
        of ``rb``); the ids kept are remembered. The caller FINishes all of them."""
        import pyarrow as pa

        self.last_keys = None
        if rb.num_rows == 0:
            return rb
        self._refresh_peers()
        nsqds, keys, valid = row_keys(rb)
        sets = (self.earlier, self.mine, self.peers)
        mask, sorted_nsqds, sorted_keys = _first_copies_sorted(nsqds, keys, valid, sets)
        if mask.all() and valid.all():  # the fault-free path: no repeat, sorted already
            self.last_keys = (sorted_nsqds, sorted_keys)
            self.mine.add(*self.last_keys, sorted_unique=True)
            self._add_pids(rb)
            return rb
        kept = mask & valid
        self.last_keys = sorted_pairs(nsqds[kept], keys[kept])
        self.mine.add(*self.last_keys, sorted_unique=True)
        if mask.all():
            self._add_pids(rb)
            return rb
        n = int((~mask).sum())
        self.dropped += n
        log.info("batch %d part %d: dropped %d redelivered messages already spooled "
                 "(ids %s)", self.batch, self.index, n,
                 rb.column("id").filter(pa.array(~mask)).to_pylist()[:5])
        out = rb.filter(pa.array(mask))
        self._add_pids(out)
        return out

    def finish(self) -> None:
        """Before the partition's ``_COMPLETE``: its ids (and publish ids) go to the
        index."""
        import numpy as np

        pids = np.concatenate(self.my_pids) if self.my_pids else None
        SeenIndex(self.spool).write(self.batch, self.index, *self.mine.pairs(),
                                    self.dropped, self.tag, pids)
