"""The publish spool's segment store: append-only segment files in one directory, shared
safely between processes. No sockets, no retries: the drain (:mod:`.drain`) reads batches
from it and acknowledges them.

The on-disk layout (segments, ``.ack`` watermarks, ``corrupt/``, ``rejected/``) is
documented once, for users, in :mod:`nsq_spark.spool`.

Every :meth:`SegmentStore.append` is one ``pwrite(2)`` of whole records (format in
:mod:`.format`), synced per the fsync policy. Every segment is owned by exactly one
process at a time, through an exclusive ``fcntl.flock`` on the segment file itself (held
from creation to deletion); :meth:`SegmentStore.claim_orphans` takes over unlocked
segments of crashed or closed processes and checks that the path still names the locked
inode. After ``os.fork()`` the child's inherited stores close their files (so they keep
no lock of the parent's alive) and refuse to write.

Files are created 0600 and the directories the store creates 0700, whatever the umask
(spooled bodies are the application's data; nsqd's own queue files are 0600 too). A
directory that already existed keeps the mode its owner gave it: it may be shared with a
group on purpose, and the files in it are 0600 anyway.

Two failures the store watches for itself, because each would break "what ``append``
accepted is never lost":

* the directory deleted, renamed away or replaced under it (``rm -rf``, ``mv`` +
  ``mkdir``, a cleanup job): an append first checks that the active segment's path
  still names its file (one ``stat``: on every append with ``fsync="always"``, else at
  most once per millisecond, see :data:`_LINK_CHECK_S`),
  and every new segment and every rescan checks the directory's ``(st_dev, st_ino)``;
  either change makes every later append raise :class:`SpoolDirectoryError` instead of
  writing into unlinked files;
* a full disk: an ``ENOSPC`` (or ``EDQUOT``) on append retires the delivered part of the
  spool at once -- the active segment too, which otherwise stays until it is worth a new
  file -- and the append is tried once more when that freed something; until then it
  raises :class:`SpoolError` and nothing is acknowledged that is not written.
"""

from __future__ import annotations

import errno
import fcntl
import os
import secrets
import struct
import threading
import time
import weakref
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from .._log import get_logger
# the fsync policy's words and rule: the Producer's spool_fsync row
from ..config import FSYNC_ALWAYS, FSYNC_NEVER, check_fsync
from ._format import (MAGIC, SpoolDirectoryError, SpoolError, SpoolFullError, decode_records,
                     encode_record, salvage_records)

log = get_logger("nsq_spark.publish_spool")

__all__ = ["SegmentStore", "SpoolStats", "CorruptSegment", "Batch", "FSYNC_ALWAYS",
           "FSYNC_NEVER", "Redriven", "redrive"]

#: modes of what the spool creates, whatever the umask (see the module doc)
FILE_MODE = 0o600
DIR_MODE = 0o700
#: errnos of a full disk (or quota): the store frees its delivered segments and tries again
_NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})
#: how often an append checks that the active segment's path still names it, unless the
#: fsync policy is "always" (then every append: next to a ~250 us fdatasync the stat is
#: free). An fstat costs ~0.6-1.5 us of CPU on this 2-core VM (a stat of the path a
#: little more), 10-20 % of a single-message publish with fsync="never" or an interval
#: (bench/RESULTS.md); at most one per millisecond costs nothing measurable, and a
#: millisecond is a smaller window than those policies already accept for a machine
#: crash.
_LINK_CHECK_S = 0.001

# ---------------------------------------------------------------------------------------
# the segment store


@dataclass
class CorruptSegment:
    """A segment whose tail could not be read. ``valid_end`` is the file offset where the
    intact records stop; ``lost_bytes`` how much follows it."""
    path: str
    valid_end: int
    file_size: int
    reason: str

    @property
    def lost_bytes(self) -> int:
        return self.file_size - self.valid_end

    def __str__(self) -> str:
        return (f"spool segment {self.path} is damaged at byte {self.valid_end} "
                f"({self.reason}); the {self.lost_bytes} bytes after it are not delivered, "
                f"the records before it are")


@dataclass
class SpoolStats:
    appended: int = 0          # messages appended by this store
    acked: int = 0             # messages acknowledged (sent and confirmed)
    rejected: int = 0          # messages nsqd refused for good (moved to rejected/);
                               # never counted in `acked`
    redriven: int = 0          # messages moved from rejected/ back into the queue
    segments_deleted: int = 0
    orphans_claimed: int = 0   # leftover segments taken over (crashed or closed processes)
    corrupt_segments: list[CorruptSegment] = field(default_factory=list)
    fsyncs: int = 0
    bytes_on_disk: int = 0


@dataclass
class Batch:
    """Consecutive records of one segment, same topic, sent as one MPUB (or one DPUB)."""
    segment: "_Segment"
    topic: str
    bodies: list[bytes]
    defer_ms: int | None
    end: int                   # the watermark once this batch is acknowledged
    start: int = 0             # where its first record begins (to read it again)
    count: int = -1            # its messages (len(bodies) unless the bodies were let go)

    def __post_init__(self) -> None:
        if self.count < 0:
            self.count = len(self.bodies)


class _Segment:
    __slots__ = ("name", "path", "fd", "size", "acked", "ack_fd", "sealed", "own",
                 "corrupt", "count", "read", "ident")

    def __init__(self, name: str, path: str, fd: int, size: int, acked: int, own: bool) -> None:
        self.name = name
        self.path = path
        self.fd = fd
        self.size = size          # end of the records we may read
        self.acked = acked        # watermark: everything before it is acknowledged
        self.ack_fd: int | None = None
        self.sealed = not own     # a claimed segment never grows
        self.own = own            # created by this store (vs claimed)
        self.corrupt: CorruptSegment | None = None
        self.count = 0            # records appended by us that are not yet acknowledged
        self.read = 0             # read cursor of read_unsent (never below acked)
        st = os.fstat(fd)
        self.ident = (st.st_dev, st.st_ino)  # what its path must still name


_ACK = struct.Struct("<QI")  # watermark, crc32 of the watermark bytes


def _create_file(path: str | os.PathLike[str], flags: int) -> int:
    """``os.open`` with ``O_CREAT`` and the spool's file mode, whatever the umask."""
    fd = os.open(path, flags | os.O_CREAT, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)   # the umask may have taken bits away (e.g. 0o277)
    except OSError:
        os.close(fd)
        raise
    return fd


def _make_dir(d: Path) -> bool:
    """Create ``d`` (not its parents) with the spool's directory mode; True if this call
    created it. An existing directory is left as its owner made it."""
    try:
        d.mkdir(mode=DIR_MODE)
    except FileExistsError:
        return False
    os.chmod(d, DIR_MODE)   # mkdir's mode is filtered by the umask
    return True


def check_spool_directory(d: Path) -> None:
    """Create ``d`` if needed (0700; missing parents with the usual mode: they hold no
    data) and prove that a file can be created, synced and locked there; a
    SpoolDirectoryError that says what to give instead otherwise."""
    if d.exists() and not d.is_dir():
        raise SpoolDirectoryError(errno.ENOTDIR, f"spool directory {d} is not a directory; "
                                  "give spool_dir a path to a writable local directory")
    try:
        d.parent.mkdir(parents=True, exist_ok=True)
        _make_dir(d)
    except OSError as exc:
        raise SpoolDirectoryError(
            exc.errno, f"cannot create the spool directory {d}: {exc.strerror or exc}; "
            "give spool_dir a path to a writable local directory") from exc
    probe = d / f".probe-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        fd = os.open(probe, os.O_CREAT | os.O_EXCL | os.O_RDWR, FILE_MODE)
        try:
            os.write(fd, MAGIC)
            os.fsync(fd)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
            os.unlink(probe)
    except OSError as exc:
        raise SpoolDirectoryError(
            exc.errno, f"spool directory {d} is not usable: cannot create, sync and lock "
            f"a file there ({exc.strerror or exc}); give spool_dir a writable local "
            "directory (flock must work: not every network filesystem supports it)"
        ) from exc


def _parse_fsync(policy: str | int | None) -> int | None:
    """``"always"`` -> 0, ``"never"``/None -> None, N -> N ms."""
    if policy is None or policy == FSYNC_NEVER:
        return None
    if policy == FSYNC_ALWAYS:
        return 0
    ms: int = check_fsync(policy, "spool_fsync")
    return ms


class SegmentStore:
    """Append-only segment files in one directory, shared safely between processes.

    Writer side: :meth:`append` (thread-safe). Reader side (one drain thread):
    :meth:`claim_orphans`, :meth:`next_batch`, :meth:`ack`, :meth:`reject`. No sockets.

    Args:
        directory: created if missing; must be writable and support ``flock``.
        fsync: ``"always"``, an interval in ms, or ``"never"`` (see the module doc).
        max_bytes: bound on the total size of the directory's segment files.
        full: ``"block"`` or ``"raise"`` when an append does not fit.
        block_timeout: seconds ``"block"`` waits before raising (None: forever).
        segment_bytes: size at which the current segment is sealed and a new one started
            (default: 1/8 of ``max_bytes``, at most 64 MiB, at least 64 KiB).
        max_claimed: how many orphan segments one store holds at a time, so that several
            processes share a large backlog.
        on_corrupt: called with a :class:`CorruptSegment` when a damaged tail is found.
    """

    def __init__(self, directory: str | os.PathLike[str], *, fsync: str | int | None = "always",
                 max_bytes: int = 1 << 30, full: str = "block",
                 block_timeout: float | None = None, segment_bytes: int | None = None,
                 max_claimed: int = 4,
                 on_corrupt: Callable[[CorruptSegment], None] | None = None) -> None:
        if full not in ("block", "raise"):
            raise ValueError(f"spool_full={full!r}: use 'block' (wait for space) or 'raise'")
        if not isinstance(max_bytes, int) or max_bytes <= 0:
            raise ValueError(f"spool_max_bytes={max_bytes!r}: give a positive number of bytes")
        self.directory = Path(directory)
        self._log = log.bind(spool=str(self.directory))
        self._sync_ms = _parse_fsync(fsync)
        self.max_bytes = max_bytes
        self.full = full
        self.block_timeout = block_timeout
        self.segment_bytes = segment_bytes or max(64 << 10, min(64 << 20, max_bytes // 8))
        self.max_claimed = max_claimed
        self.on_corrupt = on_corrupt
        self.stats = SpoolStats()

        self._lock = threading.Lock()
        self._space = threading.Condition(self._lock)   # appenders waiting for room
        self._changed = threading.Condition(self._lock)  # acks (for flush)
        self._segments: list[_Segment] = []    # owned, oldest first; claimed ones go first
        self._active: _Segment | None = None
        self._counter = 0
        self._disk_bytes = 0
        self._waiters = 0
        self._dirty = False
        self._closed = False
        self._reject_fd: int | None = None
        self._short_of_space = False   # an append met ENOSPC: retire delivered data at once
        # every append with fsync="always", else at most once per _LINK_CHECK_S
        self._link_check_s = 0.0 if self._sync_ms == 0 else _LINK_CHECK_S
        self._next_link_check = 0.0
        self._lost: str | None = None  # why the directory is no longer ours (deleted, ...)

        check_spool_directory(self.directory)
        st = os.stat(self.directory)
        self._dir_id = (st.st_dev, st.st_ino)
        self._disk_bytes = self._scan_bytes()
        self._forked = False
        _STORES.add(self)
        self._flusher: threading.Thread | None = None
        if self._sync_ms:
            self._flusher = threading.Thread(target=self._flush_loop, daemon=True,
                                             name=f"nsq-spool-fsync {self.directory}")
            self._flusher.start()

    # -- setup -------------------------------------------------------------------------

    def _scan_bytes(self) -> int:
        total = 0
        try:
            with os.scandir(self.directory) as it:
                for e in it:
                    if e.name.endswith(".seg"):
                        try:
                            total += e.stat().st_size
                        except FileNotFoundError:
                            pass
        except OSError:
            return self._disk_bytes
        return total

    # -- writer side -------------------------------------------------------------------

    def append(self, records: Sequence[tuple[str, bytes, int | None]]) -> None:
        """Append messages durably (per the fsync policy). Blocks or raises when full."""
        data = b"".join(encode_record(t, b, d) for t, b, d in records)
        if not data:
            return
        need = len(data)
        if self._closed:
            if self._forked:
                raise SpoolError(
                    f"this spool ({self.directory}) was opened before os.fork(); a forked "
                    "process must not write through its parent's segments: create the "
                    "Producer(spool_dir=...) in each process (e.g. after the worker starts)")
            raise SpoolError(f"spool {self.directory} is closed; create a new producer")
        if self._lost is not None:
            raise self._lost_error()
        if need + len(MAGIC) > self.max_bytes:
            raise SpoolFullError(
                f"{need} bytes of messages can never fit in spool_max_bytes={self.max_bytes}; "
                "raise spool_max_bytes or publish smaller batches")
        with self._lock:
            self._wait_for_space(need)
            # inline, not in helpers: this is the hot path (see _LINK_CHECK_S)
            seg = self._active or self._active_segment()
            now = time.monotonic()
            if now >= self._next_link_check:
                self._next_link_check = now + self._link_check_s
                # the path, not the open file: a directory renamed away (mv + mkdir)
                # leaves the file linked, but where nobody will look for it
                try:
                    st = os.stat(seg.path)
                    here = (st.st_dev, st.st_ino) == seg.ident
                except OSError:
                    here = False
                if not here:
                    raise self._unlinked(seg)
            try:
                written = os.pwrite(seg.fd, data, seg.size)
            except OSError as exc:
                seg = self._append_failed(seg, data, exc)
            else:
                if written != need:
                    seg = self._append_failed(seg, data, OSError(
                        errno.ENOSPC, "short write to the spool segment (disk full)"))
            self._short_of_space = False   # written: the disk has room again
            seg.size += need
            seg.count += len(records)
            self._disk_bytes += need
            self.stats.appended += len(records)
            if self._sync_ms == 0:
                try:
                    self._sync_fd(seg.fd)
                except OSError as exc:
                    # the records may or may not be on disk: they stay in the spool (and
                    # are sent), but the caller must not count them as durable
                    raise SpoolError(f"fsync of spool segment {seg.path} failed: {exc}; "
                                     "the disk is failing or full") from exc
            else:
                self._dirty = True
            if seg.size >= self.segment_bytes:
                seg.sealed = True
                self._active = None

    def _unlinked(self, seg: _Segment) -> SpoolDirectoryError:
        self._lost = (f"its segment {seg.name} is no longer at {seg.path} (the directory "
                      "was removed, renamed away or replaced?)")
        return self._lost_error()

    def _append_failed(self, seg: _Segment, data: bytes, exc: OSError) -> _Segment:
        """The write of ``data`` to ``seg`` failed or was short (lock held): cut off what
        it left; on a full disk free the delivered segments and write once more, in a new
        segment, when that freed something. Returns the segment written to, or raises."""
        _truncate_quiet(seg)
        if exc.errno not in _NO_SPACE or not self._free_delivered():
            raise self._append_error(seg, exc) from exc
        seg = self._active_segment()
        try:
            written = os.pwrite(seg.fd, data, seg.size)
            if written != len(data):
                raise OSError(errno.ENOSPC, "short write to the spool segment (disk full)")
        except OSError as again:
            _truncate_quiet(seg)
            raise self._append_error(seg, again) from again
        return seg

    def _lost_error(self) -> SpoolDirectoryError:
        return SpoolDirectoryError(
            errno.ENOENT, f"spool directory {self.directory} was deleted or replaced while "
            f"in use ({self._lost}); nothing more is accepted into it, because it would be "
            "written to files nobody can find again. What was spooled before is still sent "
            "while this producer lives. Fix: close this producer and create a new one "
            "(it recreates the directory); keep cleanup jobs away from spool_dir")

    def _check_directory(self) -> bool:
        """Does the path still name the directory we opened? (lock not needed)"""
        if self._lost is not None:
            return False
        try:
            st = os.stat(self.directory)
            same = (st.st_dev, st.st_ino) == self._dir_id
        except OSError:
            same = False
        if not same:
            self._lost = "the path now names another directory, or nothing"
            self._log.error("spool %s was deleted or replaced while in use; publishing into it "
                            "raises from now on (create a new producer)", self.directory)
        return same

    def _append_error(self, seg: _Segment, exc: OSError) -> SpoolError:
        if exc.errno in _NO_SPACE:
            return SpoolError(
                f"spool {self.directory} is out of disk space ({exc.strerror or exc}): the "
                "message was NOT spooled. The delivered part of the spool is freed as "
                "nsqd acknowledges; free space on that filesystem (or lower "
                "spool_max_bytes below its free space) and publish again")
        return SpoolError(f"cannot append to spool segment {seg.path}: {exc}; the "
                          "message was NOT spooled; check the directory's health")

    def _free_delivered(self) -> bool:
        """After ENOSPC (lock held): retire what nsqd has acknowledged -- the active
        segment included -- and keep doing so until an append works again. True if a
        segment was deleted (room may have been made)."""
        self._short_of_space = True
        before = self.stats.segments_deleted
        active = self._active
        if active is not None and active.acked >= active.size:
            active.sealed = True
            self._active = None
        self._retire_done()
        return self.stats.segments_deleted > before

    def _wait_for_space(self, need: int) -> None:
        if self._disk_bytes + need <= self.max_bytes:
            return
        active = self._active
        if active is not None and active.acked >= active.size:
            # the current segment is delivered but kept for more appends: free it now
            active.sealed = True
            self._active = None
            self._retire_done()
        self._disk_bytes = self._scan_bytes()   # other processes may have freed space
        if self._disk_bytes + need <= self.max_bytes:
            return
        if self.full == "raise":
            raise SpoolFullError(
                f"spool {self.directory} is full ({self._disk_bytes} of {self.max_bytes} "
                "bytes) while nsqd does not take messages fast enough (or is unreachable); "
                "retry later, raise spool_max_bytes, or use spool_full='block'")
        deadline = None if self.block_timeout is None else time.monotonic() + self.block_timeout
        self._waiters += 1
        try:
            while self._disk_bytes + need > self.max_bytes:
                if self._closed:
                    raise SpoolError("the spool was closed while waiting for space")
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise SpoolFullError(
                        f"spool {self.directory} stayed full ({self._disk_bytes} of "
                        f"{self.max_bytes} bytes) for spool_block_timeout="
                        f"{self.block_timeout}s; is nsqd reachable?")
                # poll too: space freed by *other* processes sends no notification
                self._space.wait(0.1 if left is None else min(0.1, left))
                self._disk_bytes = self._scan_bytes()
        finally:
            self._waiters -= 1

    def _active_segment(self) -> _Segment:
        if self._active is not None:
            return self._active
        if not self._check_directory():
            raise self._lost_error()
        self._counter += 1
        name = f"{time.time_ns():020d}-{os.getpid()}-{self._counter}-{secrets.token_hex(3)}.seg"
        path = os.path.join(self.directory, name)
        tmp = os.path.join(self.directory, f".{name}.tmp")
        # create under a temporary name and lock before renaming, so no other process can
        # ever see (and claim) a segment its writer has not locked yet
        fd = -1
        try:
            fd = _create_file(tmp, os.O_EXCL | os.O_RDWR)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if os.write(fd, MAGIC) != len(MAGIC):
                raise OSError(errno.ENOSPC, "short write of the segment header (disk full)")
            os.rename(tmp, path)
        except OSError as exc:
            _close_quiet(fd)      # leave nothing behind (a full disk meets this often)
            _unlink_quiet(tmp)
            raise SpoolError(f"cannot create a spool segment in {self.directory}: {exc}; "
                             "check free disk space and permissions") from exc
        if self._sync_ms == 0:
            try:
                self._sync_dir()
            except OSError as exc:   # the segment exists and is ours: the appends say more
                self._log.error("spool %s: syncing the directory failed: %s", self.directory, exc)
        seg = _Segment(name, path, fd, len(MAGIC), len(MAGIC), own=True)
        self._next_link_check = 0.0   # a new file: check it on its first append
        self._segments.append(seg)
        self._active = seg
        self._disk_bytes += len(MAGIC)
        return seg

    def _sync_fd(self, fd: int) -> None:
        os.fdatasync(fd)
        self.stats.fsyncs += 1

    def _sync_dir(self) -> None:
        dfd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def sync(self) -> None:
        """Sync every owned segment now (the interval policy calls this)."""
        with self._lock:
            if not self._dirty or self._closed:   # close() did the final sync
                return
            self._dirty = False
            for seg in self._segments:
                if seg.own and seg.fd >= 0:
                    self._sync_fd(seg.fd)
            self._sync_dir()

    def _flush_loop(self) -> None:
        assert self._sync_ms
        interval = self._sync_ms / 1000.0
        while not self._closed:
            time.sleep(interval)
            try:
                self.sync()
            except OSError as exc:  # keep trying: the next interval may succeed
                self._log.error("spool %s: periodic fsync failed: %s", self.directory, exc)

    # -- reader side -------------------------------------------------------------------

    def claim_orphans(self) -> int:
        """Take over unlocked segments (left by crashed or closed processes); returns how
        many were claimed. Also removes stale temporary and ack files."""
        if not self._check_directory():   # removed: appends raise from now on, and
            return 0                      # there is nothing left there to claim
        with self._lock:
            if self._closed:
                return 0
            held = {s.name for s in self._segments}
            room = self.max_claimed - sum(1 for s in self._segments if not s.own)
        try:
            names = sorted(os.listdir(self.directory))
        except OSError as exc:
            self._log.error("spool %s: cannot list the directory: %s", self.directory, exc)
            return 0
        existing = set(names)
        claimed = 0
        now = time.time()
        for name in names:
            path = os.path.join(self.directory, name)
            if name.endswith(".seg.ack") and name[:-4] not in existing \
                    and not os.path.exists(path[:-4]):   # its segment is gone: stale
                _unlink_quiet(path)
            elif name.startswith(".") and name.endswith(".tmp"):
                try:  # a creator crashed between create and rename (it holds no record)
                    if now - os.stat(path).st_mtime > 60:
                        _unlink_quiet(path)
                except OSError:
                    pass
        for name in names:
            if room <= 0:
                break
            if not name.endswith(".seg") or name in held:
                continue
            seg = self._try_claim(name)
            if seg is not None:
                with self._lock:
                    if self._closed:
                        os.close(seg.fd)
                        return claimed
                    # claimed segments are older than our own: send them first
                    i = sum(1 for s in self._segments if not s.own)
                    self._segments.insert(i, seg)
                self.stats.orphans_claimed += 1
                claimed += 1
                room -= 1
                self._log.info("spool %s: claimed leftover segment %s (%d bytes, %d acknowledged)",
                               self.directory, name, seg.size, seg.acked)
        with self._lock:
            # refresh the size bound's view of the directory (other processes write too)
            self._disk_bytes = self._scan_bytes()
            self.stats.bytes_on_disk = self._disk_bytes
            if self._waiters:
                self._space.notify_all()
        return claimed

    def _try_claim(self, name: str) -> _Segment | None:
        path = os.path.join(self.directory, name)
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            return None
        except OSError as exc:
            self._log.error("spool %s: cannot open %s: %s", self.directory, name, exc)
            return None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return None
            # the previous owner may have deleted it between our open and our lock
            try:
                if os.stat(path).st_ino != os.fstat(fd).st_ino:
                    os.close(fd)
                    return None
            except FileNotFoundError:
                os.close(fd)
                return None
            size = os.fstat(fd).st_size
            head = os.pread(fd, len(MAGIC), 0)
            seg = _Segment(name, path, fd, size, len(MAGIC), own=False)
            if head != MAGIC:
                if size <= len(MAGIC) and MAGIC.startswith(head):
                    # created and never written (the header itself was cut): nothing lost
                    seg.size = seg.acked = len(MAGIC) if size >= len(MAGIC) else size
                else:
                    seg.size = seg.acked = 0
                    self._notify_corrupt(
                        self._report_corrupt(seg, 0, size, "not a spool segment (bad magic)"))
                return seg
            seg.acked = min(max(self._read_ack(name), len(MAGIC)), size)
            return seg
        except Exception:
            os.close(fd)
            raise

    def _read_ack(self, name: str) -> int:
        try:
            with open(os.path.join(self.directory, name + ".ack"), "rb") as f:
                raw = f.read(_ACK.size)
        except FileNotFoundError:
            return 0
        if len(raw) != _ACK.size:
            return 0
        mark, checksum = _ACK.unpack(raw)
        if zlib.crc32(raw[:8]) != checksum:
            self._log.warning("spool %s: ack file of %s is damaged; its messages are sent again "
                              "from the start (duplicates possible)", self.directory, name)
            return 0
        return int(mark)

    def _write_ack(self, seg: _Segment) -> None:
        # written without fsync: it only saves resending; a stale watermark after a machine
        # crash means duplicates, never loss
        if seg.ack_fd is None:
            seg.ack_fd = _create_file(seg.path + ".ack", os.O_WRONLY)
        mark = struct.pack("<Q", seg.acked)
        os.pwrite(seg.ack_fd, mark + struct.pack("<I", zlib.crc32(mark)), 0)

    def _report_corrupt(self, seg: _Segment, valid_end: int, file_size: int,
                        reason: str) -> CorruptSegment:
        """Mark the damage (caller may hold the lock); :meth:`_notify_corrupt` after."""
        info = CorruptSegment(seg.path, valid_end, file_size, reason)
        seg.corrupt = info
        seg.sealed = True
        seg.size = valid_end
        if seg is self._active:
            self._active = None
        self.stats.corrupt_segments.append(info)
        self._log.error("%s; the segment is moved to %s once that prefix is acknowledged",
                        info, self.directory / "corrupt")
        return info

    def _notify_corrupt(self, info: CorruptSegment) -> None:
        # never under self._lock: the callback may publish
        if self.on_corrupt is not None:
            try:
                self.on_corrupt(info)
            except Exception:  # a user callback must not stop the drain
                self._log.exception("spool on_corrupt callback failed")

    def next_batch(self, max_messages: int = 1000, max_bytes: int = 1 << 20,
                   after: Batch | None = None) -> Batch | None:
        """The next unacknowledged records of the oldest owned segment that has any:
        consecutive records of one topic (a deferred record travels alone). None when
        everything owned is acknowledged. Fully acknowledged segments are retired.

        ``after``: a batch sent but not yet acknowledged -- read what follows it (to
        prepare the next batch during the round trip)."""
        while True:
            with self._lock:
                if after is None:
                    self._retire_done()
                    seg = next((s for s in self._segments if s.acked < s.size), None)
                    start = seg.acked if seg is not None else 0
                else:
                    cur = after.segment
                    if cur.fd >= 0 and after.end < cur.size:
                        seg, start = cur, after.end
                    else:
                        seg = next((s for s in self._segments
                                    if s is not cur and s.acked < s.size), None)
                        start = seg.acked if seg is not None else 0
                if seg is None:
                    return None
                size, fd = seg.size, seg.fd
            batch = self._read_batch(seg, fd, start, size, max_messages, max_bytes)
            if batch is not None or after is not None:
                return batch

    def read_unsent(self, max_messages: int = 1000, max_bytes: int = 1 << 20
                    ) -> Batch | None:
        """The next records that no batch was read for yet, from the oldest owned segment
        that has any (a read cursor per segment, starting at its watermark): for a drain
        that keeps several batches out at once and acknowledges them in order (the
        replicated drain, which keeps a batch until every replica has it). None when
        everything owned has been read."""
        while True:
            with self._lock:
                self._retire_done()
                seg = next((s for s in self._segments if max(s.read, s.acked) < s.size),
                           None)
                if seg is None:
                    return None
                start, size, fd = max(seg.read, seg.acked), seg.size, seg.fd
            batch = self._read_batch(seg, fd, start, size, max_messages, max_bytes)
            if batch is not None:
                with self._lock:
                    seg.read = max(seg.read, batch.end)
                return batch

    def reread(self, batch: Batch) -> list[bytes]:
        """The bodies of ``batch`` read from its segment again (a drain that let them go
        while the batch was out). SpoolError when the segment is no longer open here."""
        with self._lock:
            fd = batch.segment.fd
            if fd < 0:
                raise SpoolError(f"spool {self.directory}: segment {batch.segment.name} is "
                                 "closed; its unacknowledged records are sent by the next "
                                 "producer on the directory")
            buf = os.pread(fd, batch.end - batch.start, batch.start)
        dec = decode_records(buf, batch.start, eof=True)
        bodies = [r[1] for r in dec.records]
        if dec.error or len(bodies) != batch.count:
            raise SpoolError(f"spool {self.directory}: segment {batch.segment.name} reads "
                             f"back {len(bodies)} of {batch.count} records at "
                             f"{batch.start}..{batch.end} ({dec.error or 'short'})")
        return bodies

    def _read_batch(self, seg: _Segment, fd: int, start: int, size: int,
                    max_messages: int, max_bytes: int) -> Batch | None:
        want = min(size - start, max_bytes)
        while True:
            buf = os.pread(fd, want, start)
            # a file shorter than we think (cut by someone else) ends here too
            eof = start + len(buf) >= size or len(buf) < want
            dec = decode_records(buf, start, limit=max_messages, eof=eof)
            if dec.records or dec.error:
                break
            if dec.need:   # one record bigger than max_bytes: read it whole
                want = dec.need
                continue
            break
        if not dec.records and not dec.error:
            # the file ends before the size we know (cut by someone else)
            dec.error = f"file ends at byte {start + len(buf)}, {size - start - len(buf)} " \
                "bytes short of what was written"
        if dec.error and not dec.records:
            with self._lock:
                file_size = os.fstat(fd).st_size
                info = self._report_corrupt(seg, dec.end, file_size, dec.error)
            self._notify_corrupt(info)
            return None
        # with an error after some records: deliver those now; the damage is reported
        # when the next call starts at it
        recs = dec.records
        if not recs:
            return None
        topic, _, defer, _ = recs[0]
        if defer is not None:
            return Batch(seg, topic, [recs[0][1]], defer, recs[0][3], start)
        bodies = []
        end = start
        for t, body, d, rec_end in recs:
            if t != topic or d is not None:
                break
            bodies.append(body)
            end = rec_end
        return Batch(seg, topic, bodies, None, end, start)

    def ack(self, batch: Batch, rejected: int = 0) -> None:
        """nsqd acknowledged ``batch`` (all but ``rejected`` of its messages, which
        :meth:`reject` moved to ``rejected/``): advance its segment's watermark."""
        with self._lock:
            seg = batch.segment
            if batch.end <= seg.acked:
                return
            seg.acked = batch.end
            n = batch.count
            self.stats.acked += n - rejected
            if seg.own:
                seg.count = max(0, seg.count - n)
            if seg.fd >= 0 and self._lost is None:   # no directory: no ack file
                try:
                    self._write_ack(seg)
                except OSError as exc:
                    self._log.warning("spool %s: cannot write the ack file of %s (%s); its "
                                      "messages may be sent again after a crash",
                                      self.directory, seg.name, exc)
            self._retire_done()
            self._changed.notify_all()

    def reject(self, batch: Batch, index: int, exc: BaseException) -> None:
        """nsqd refused message ``index`` of ``batch`` for good: move it to ``rejected/``
        (same record format) so it is neither lost nor retried forever; :meth:`redrive`
        puts it back in the queue. Raises SpoolError when it cannot be written (the
        caller then keeps the message in the queue)."""
        body = batch.bodies[index]
        with self._lock:
            try:
                if self._reject_fd is None:
                    rdir = self.directory / "rejected"
                    _make_dir(rdir)
                    name = f"{time.time_ns():020d}-{os.getpid()}-{secrets.token_hex(3)}.seg"
                    fd = _create_file(rdir / name, os.O_EXCL | os.O_WRONLY | os.O_APPEND)
                    # held while we append, so that redrive() never moves a file that grows
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    self._reject_fd = fd
                    os.write(fd, MAGIC)
                os.write(self._reject_fd, encode_record(batch.topic, body, batch.defer_ms))
                os.fdatasync(self._reject_fd)
            except OSError as e:
                raise SpoolError(f"cannot write a rejected message to {self.directory}/"
                                 f"rejected: {e}; it stays in the queue") from e
            self.stats.rejected += 1
        self._log.error("spool %s: nsqd refused a message for topic %r for good (%s); it was moved "
                        "to %s/rejected (nsq-spark spool redrive %s puts it back)", self.directory,
                        batch.topic, exc, self.directory, self.directory)

    def redrive(self) -> "Redriven":
        """Move every file of ``rejected/`` back into the queue (this store's own rejected
        file too); the drain of any producer on the directory sends them. Returns what
        was moved."""
        with self._lock:
            fd, self._reject_fd = self._reject_fd, None
            _close_quiet(fd)   # releases its lock: the file can move now
        out = redrive(self.directory)
        with self._lock:
            self.stats.redriven += out.messages
        return out

    def _retire_done(self) -> None:
        """Delete (or quarantine) fully acknowledged sealed segments. Lock held."""
        keep = []
        for seg in self._segments:
            done = seg.acked >= seg.size
            if done and seg is self._active and not self._closed:
                # the current segment is retired only when it is worth a new file, or
                # when someone waits for space, or the disk was found full
                if seg.size >= self.segment_bytes // 8 or self._waiters or \
                        self._short_of_space:
                    seg.sealed = True
                    self._active = None
            if done and seg.sealed:
                self._delete(seg)
            else:
                keep.append(seg)
        if len(keep) != len(self._segments):
            self._segments = keep
            self._space.notify_all()
        # a damaged tail shrinks what is pending without an ack: wake flush() too
        self._changed.notify_all()

    def _delete(self, seg: _Segment) -> None:
        try:
            if seg.corrupt is not None:
                qdir = self.directory / "corrupt"
                _make_dir(qdir)
                os.rename(seg.path, qdir / seg.name)
                self._log.error("spool %s: the intact part of damaged segment %s was delivered; "
                                "the segment is kept as %s for inspection", self.directory,
                                seg.name, qdir / seg.name)
            elif self._lost is None:   # else: already gone with the directory
                os.unlink(seg.path)
            _unlink_quiet(seg.path + ".ack")
        except OSError as exc:
            self._log.error("spool %s: cannot remove delivered segment %s: %s", self.directory,
                            seg.name, exc)
        try:
            self._disk_bytes -= os.fstat(seg.fd).st_size
        except OSError:
            pass
        self._disk_bytes = max(0, self._disk_bytes)
        self.stats.segments_deleted += 1
        if seg.ack_fd is not None:
            os.close(seg.ack_fd)
            seg.ack_fd = None
        os.close(seg.fd)   # releases the lock, after the file is gone
        seg.fd = -1

    # -- state -------------------------------------------------------------------------

    def pending(self) -> int:
        """Bytes owned by this store that nsqd has not acknowledged."""
        with self._lock:
            return sum(s.size - s.acked for s in self._segments)

    def pending_messages(self) -> int:
        """Messages appended through this store that nsqd has not acknowledged (leftover
        segments claimed from other processes are counted in :meth:`pending` bytes only)."""
        with self._lock:
            return sum(s.count for s in self._segments if s.own)

    @property
    def forked(self) -> bool:
        """True in a child process that inherited this store through ``os.fork()``."""
        return self._forked

    def wait_empty(self, timeout: float | None = None) -> bool:
        """Wait until everything this store owns is acknowledged."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while any(s.acked < s.size for s in self._segments):
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._changed.wait(left)
            return True

    @property
    def bytes_on_disk(self) -> int:
        return self._disk_bytes

    def close(self) -> None:
        """Sync, release every lock. What is not acknowledged stays on disk, for the next
        start or another process."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._active is not None:
                self._active.sealed = True
                self._active = None
            self._retire_done()
            lost = sum(s.size - s.acked for s in self._segments)
            if self._lost is not None and lost:
                self._log.error("spool %s: %d bytes of messages accepted before the directory was "
                                "deleted or replaced were not delivered; they are lost with their "
                                "unlinked files", self.directory, lost)
            for seg in self._segments:
                try:
                    if seg.own and self._sync_ms is not None:
                        self._sync_fd(seg.fd)
                except OSError as exc:
                    self._log.error("spool %s: final fsync of %s failed: %s", self.directory,
                                    seg.name, exc)
                if seg.ack_fd is not None:
                    os.close(seg.ack_fd)
                os.close(seg.fd)
                seg.fd = -1
            self._segments = []
            self._active = None
            if self._reject_fd is not None:
                os.close(self._reject_fd)
                self._reject_fd = None
            self._space.notify_all()
            self._changed.notify_all()
        self.stats.bytes_on_disk = self._disk_bytes


@dataclass
class Redriven:
    """What :func:`redrive` did: ``messages`` in ``files`` moved back into the queue;
    ``busy``: rejected files still being written by a live producer (left in place);
    ``damaged``: one line per damaged span found (file, offset, what was wrong);
    ``kept_back_bytes``: the bytes of those spans, which are not sent (the file as it was
    is kept in ``corrupt/``)."""
    messages: int = 0
    files: int = 0
    busy: int = 0
    damaged: list[str] = field(default_factory=list)
    kept_back_bytes: int = 0


def _rejected_files(rdir: Path) -> Iterator[Path]:
    try:
        names = sorted(os.listdir(rdir))
    except FileNotFoundError:
        return
    for name in names:
        if name.endswith(".seg"):
            yield rdir / name


def redrive(directory: str | os.PathLike[str]) -> Redriven:
    """Move the files of ``directory/rejected`` back into ``directory`` as leftover
    segments, so that the next drain on the directory (any producer's, within its
    ``rescan_interval``) sends them again, in order, from their start. A file that a
    live producer still appends to (it holds its lock) is left for a later call.

    A message refused again (its topic is still invalid, ...) goes back to ``rejected/``;
    redrive once the cause is fixed (the topic name, nsqd's ``--max-msg-size``, ...).
    Safe while producers run on the directory: a moved file is locked until it is in
    place, so no drain can claim half of it."""
    d = Path(directory)
    out = Redriven()
    for path in _rejected_files(d / "rejected"):
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                out.busy += 1
                continue
            data = os.pread(fd, os.fstat(fd).st_size, 0)
            found = salvage_records(data[len(MAGIC):], len(MAGIC))
            target = d / f"{path.name[:-4]}-redriven.seg"
            if found.damaged:
                # every intact record is sent, those after the damage too (the drain
                # stops reading a segment at its first damaged record); the file as it
                # was goes to corrupt/ for inspection
                _write_segment(d, target, found.records)
                _make_dir(d / "corrupt")
                os.link(path, d / "corrupt" / path.name)
                os.unlink(path)
                for offset, length, why in found.damaged:
                    out.damaged.append(f"{path.name}: {why} at offset {offset} ({length} "
                                       "bytes kept back)")
                out.kept_back_bytes += found.damaged_bytes
            else:
                # link + unlink: never replaces a file of that name
                os.link(path, target)
                os.unlink(path)
            out.files += 1
            out.messages += len(found.records)
        finally:
            os.close(fd)   # after the move: a drain claims it only now
    if out.files:
        log.bind(spool=str(d)).info(
            "spool %s: %d messages in %d files moved from rejected/ back into the "
            "queue", d, out.messages, out.files)
    return out


def _write_segment(directory: Path, target: Path,
                   records: list[tuple[str, bytes, int | None, int]]) -> None:
    """A new segment ``target`` holding ``records``, whole before anyone can claim it
    (written and synced under a temporary name, then linked; never replaces a file)."""
    tmp = directory / f".{target.name}.tmp"
    fd = _create_file(str(tmp), os.O_EXCL | os.O_WRONLY)
    try:
        data = MAGIC + b"".join(encode_record(t, b, defer) for t, b, defer, _ in records)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, target)
    finally:
        os.unlink(tmp)


def _truncate_quiet(seg: _Segment) -> None:
    """Cut ``seg`` back to its last whole record: leave no torn record for the drain."""
    try:
        os.ftruncate(seg.fd, seg.size)
    except OSError:
        pass


def _close_quiet(fd: int | None) -> None:
    if fd is not None and fd >= 0:
        try:
            os.close(fd)
        except OSError:
            pass


def _after_fork_in_child() -> None:
    """A forked child shares its parent's open segment files -- and their flocks, which
    live until every copy is closed. Close the child's copies (so a dead parent's segments
    become claimable) and make the inherited stores refuse writes (two processes
    appending at one offset would corrupt the segment). Locks are replaced, not taken:
    another thread may have held them at the fork."""
    for st in list(_STORES):
        st._lock = threading.Lock()
        st._space = threading.Condition(st._lock)
        st._changed = threading.Condition(st._lock)
        for seg in st._segments:
            _close_quiet(seg.ack_fd)
            _close_quiet(seg.fd)
            seg.fd = -1
        _close_quiet(st._reject_fd)
        st._reject_fd = None
        st._segments = []
        st._active = None
        st._closed = st._forked = True


_STORES: "weakref.WeakSet[SegmentStore]" = weakref.WeakSet()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _unlink_quiet(path: str | os.PathLike[str]) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
