"""Reliable publishing: a durable local spool in front of the Producer.

A message handed to ``nsq_spark.Producer(..., spool_dir=path)`` is appended to a spool
file on local disk *before* it is sent, and stays there until nsqd has acknowledged it
(``OK`` to PUB/MPUB/DPUB). A publisher crash or an nsqd outage therefore loses nothing that ``publish()`` had
accepted: on the next start -- or in another process sharing the directory -- the spool
is sent again.

The promise: **what ``publish()`` accepted is delivered to nsqd or stays on disk and is
retried, unless nsqd itself refused that message for a reason a retry cannot fix** -- a
bad topic, a body empty, too big or malformed, a defer out of range: nsqd's
``E_BAD_TOPIC``, ``E_BAD_MESSAGE``, ``E_BAD_BODY``, ``E_INVALID`` answered to
PUB/MPUB/DPUB (the rule is :func:`nsq_spark.spool._drain.refused`). Such a message goes to
``rejected/``, is counted in ``stats()["rejected"]`` (never in ``acked``), is handed to
``on_rejected``, makes the next :meth:`Producer.flush` return False, and comes back with
:meth:`Producer.redrive` or ``nsq-spark spool redrive DIR`` once the cause is fixed.

Every other failure is a failing *connection*, not a bad message: nsqd unreachable or
exiting (``E_PUB_FAILED``), the wrong port (nsqd's HTTP port, another service), AUTH
refused or the auth server down, a TLS certificate that does not verify, protocol
garbage, a timeout. The spool retries it with capped exponential backoff (jittered, from
0.05 s up to ``retry_max_wait``; the Producer's ``retry_wait`` is not used here) for as
long as the producer lives, and makes it loud:

* ``stats()["health"]`` is ``"failing"`` (``"ok"`` again after the next delivery), with
  ``last_error`` (the cause), ``failing_since`` (epoch seconds) and
  ``consecutive_failures``;
* a log at ERROR names the cause when sending starts failing and while it goes on, at
  most once per 30 s in all (not one per retry, nor one per blip of a flapping
  connection), and a WARNING when delivery resumes;
* ``on_error(exc)`` is called at the same moments;
* :meth:`Producer.flush` returns False (it does not raise: existing callers test the
  bool) -- it returns True only when nsqd took everything.

This differs on purpose from a direct ``Producer`` (no spool), which raises a refused
AUTH or a TLS failure at once: there a caller is waiting for the answer and decides;
here the caller was already told "accepted".

On-disk layout (``spool_dir``)::

    <time_ns>-<pid>-<n>-<rand>.seg       a segment: header + framed records, append-only
    <time_ns>-<pid>-<n>-<rand>.seg.ack   how far that segment is acknowledged (a watermark)
    .<name>.tmp                          a segment being created (renamed once locked)
    corrupt/                             segments with a damaged tail, after their intact
                                         prefix was delivered (kept for inspection)
    rejected/                            messages nsqd refused for good (bad topic, too big),
                                         same format; ``spool redrive`` moves them back as
                                         ``<name>-redriven.seg``

Files are created 0600 and the directories the spool creates 0700, whatever the umask
(bodies are application data; nsqd keeps its own queue files 0600). A directory that
already existed keeps the mode its owner gave it (it may be shared with a group on
purpose); the files in it are 0600 all the same, so every process sharing a spool
directory must run as the same user.

Segment format: the 8-byte magic ``NSQSPL01``, then records, each
``u32 payload length | u32 crc32(payload) | payload`` (little endian), the payload being
``u8 flags | u8 topic length | u32 defer ms | topic | body``. Every ``publish``/
``mpublish`` call is one ``pwrite(2)`` of whole records. A truncated or damaged tail (a
process killed inside a large write, power loss, a disk fault, a stray edit) is detected
by the length and checksum, reported (log error, :attr:`SpoolStats.corrupt_segments`, the
``on_corrupt`` callback), and the intact records before it are still delivered; a record
cut by a kill belongs to a call that had not returned, so nothing accepted is lost.

Durability policy (``spool_fsync``):

* ``"always"`` (default): ``fdatasync`` before ``publish()``/``mpublish()`` returns --
  one sync per call, so ``mpublish`` of 1000 bodies costs one sync. Survives a crash of
  the process *and* of the machine.
* an ``int`` N (milliseconds): a background thread syncs at most every N ms; a machine
  crash (not a process crash) can lose the last N ms of accepted messages.
* ``"never"``: leave it to the OS page cache: survives a process crash (``kill -9``),
  not a machine crash.

Sharing a directory: every segment is owned by exactly one process at a time, through an
exclusive ``fcntl.flock`` on the segment file itself (held from creation to deletion).
The lock dies with its process, so a crashed process's segments become lockable, and
every spooling Producer on the directory periodically claims such orphans (with
``LOCK_NB``: a segment someone else holds is skipped) and sends them. After taking a lock
the claimer checks the path still names the locked inode, so a segment deleted by its
previous owner in between is never sent again. Create one producer per process: after
``os.fork()`` the child's inherited copy closes its segment files (so it does not keep
the parent's locks alive) and refuses to publish.

Delivery semantics: at least once. A message is sent twice only when (a) the process
died after nsqd acknowledged a batch and before the watermark was written (at most one
batch, ``batch_size`` messages, per crash), (b) a PUB/MPUB was retried after its answer
was lost (connection dropped mid-request, nsqd stopped): nsqd may have taken the first
one -- again at most one batch per failure, or (c) the machine crashed: the watermark
files are not synced (they only save resending), so a stale one resends more. Messages
are sent in spool order per segment, one batch on the wire at a time (the next one is
read from disk during the round trip).

Ownership vs. ``flush``: ``publish()`` returns once the message is in the spool;
:meth:`Producer.flush` waits until nsqd has acknowledged everything the producer
holds (True), or returns False (timeout, or messages refused since the last flush);
:meth:`Producer.close` tries to for ``timeout`` seconds and leaves the rest on disk for
the next start. Failures follow the promise above.

The whole Producer API works with a spool: ``publish_async``/``mpublish_async`` return a
future settled once the message is in the spool (the append happens in the call),
``apublish``/``ampublish`` append in a worker thread, ``publish_nowait`` returns a settled
asyncio future, and ``async with`` closes like ``close()``. Bodies follow the Producer's
one rule (bytes-like, not empty; ``str`` is refused: encode it), and topics the same rule
as the direct Producer (a ``bytes`` topic is accepted): the same calls are accepted, and
refused with the same error, in both modes. ``stats()`` gives
``messages``/``bytes`` acknowledged by nsqd, ``retries``, ``errors`` (messages rejected),
``spool_pending`` (messages) and ``spool_pending_bytes``, the spool's own counters
(``appended``, ``acked``, ``rejected``, ``redriven``, ...) and the health above.

Size bound (``spool_max_bytes``): the total size of the segment files in the directory.
When an append would exceed it, ``spool_full="block"`` waits until the drain frees space
(or ``spool_block_timeout`` passes, then :class:`SpoolFullError`), ``"raise"`` raises
:class:`SpoolFullError` at once. Space is freed a whole segment at a time, so segments
are sealed at 1/8 of the bound (64 KiB to 64 MiB).

A full disk (``ENOSPC``, or a quota) is not this bound: ``publish`` raises
:class:`SpoolError` naming the directory and the cause, and nothing of that call is
acknowledged or kept half-written. The spool then retires at once what nsqd has
acknowledged -- the current segment too, which is otherwise kept until it is worth a new
file (1/8 of ``segment_bytes``) -- and tries the append once more when that freed
something; until an append works again, every delivered segment is deleted as soon as it
is delivered. So publishing resumes, without a restart, as soon as there is room.

A spool directory deleted (or replaced) under a running producer makes the next
``publish`` raise :class:`SpoolDirectoryError` (an ``fstat`` checks that the current
segment still has a name: on every call with ``spool_fsync="always"``, else at most once
per millisecond; the periodic rescan checks the directory itself)
instead of appending to files nobody can find again. What was spooled before is still
sent while that producer lives; create a new producer to go on.

Message-id envelope (``message_id_digest=True``): NSQ messages have no header fields, so
the id travels in the body: just before sending, the body is wrapped as
``b"\\x00NID\\x01" + blake2b(body, digest_size=16) + body`` (21 bytes more). The digest is
computed from the spooled body, so a resent message carries the same id. Consumers call
:func:`open_envelope` to get ``(digest, body)``, or use :func:`by_envelope_digest` as the
deduplication key: it returns the same 16 bytes that ``nsq_spark.dedup.by_body_digest``
computes on the inner body, and falls back to that digest for bodies without an envelope.
Without the envelope the consumer can still deduplicate by content with
``by_body_digest``; the envelope saves hashing on the consumer side and marks which
messages came through a spool. Version 2 of the envelope also carries a W3C trace
context (``Telemetry(trace_context=True)``, see :mod:`nsq_spark.telemetry`);
:func:`open_envelope` and :func:`by_envelope_digest` read both versions alike and
:func:`open_traced_envelope` returns the trace context too.

The code, in three parts (none imports the Producer; a spooling Producer's transport,
:class:`nsq_spark._publish.spooled.SpooledTransport`, composes a store and a drain):

``format.py``  records, framing, the message-id envelope, the spool's errors (sans-IO)
``store.py``   segment files: append, claim, batches, watermarks, locks, fork safety
``drain.py``   the thread that sends a store's records through a sender and acknowledges
               them, and the spool's rule of what nsqd refused for good (:func:`refused`)
"""

from ._drain import REFUSAL_CODES, Sender, SpoolDrain, refused
from ._format import (DIGEST_SIZE, ENVELOPE_MAGIC, MAGIC, TRACED_ENVELOPE_MAGIC, Decoded,
                     Opened, SpoolDirectoryError, SpoolError, SpoolFullError,
                     by_envelope_digest, decode_records, encode_record, open_envelope,
                     open_traced_envelope, read_segment, wrap_envelope)
from ._store import (FSYNC_ALWAYS, FSYNC_NEVER, Batch, CorruptSegment, Redriven,
                    SegmentStore, SpoolStats, redrive)

__all__ = [
    "SpoolDrain", "Sender", "refused", "REFUSAL_CODES", "redrive", "Redriven", "SegmentStore",
    "SpoolStats", "CorruptSegment", "Batch",
    "FSYNC_ALWAYS", "FSYNC_NEVER", "SpoolError", "SpoolDirectoryError", "SpoolFullError",
    "MAGIC", "Decoded", "encode_record", "decode_records", "read_segment", "ENVELOPE_MAGIC",
    "DIGEST_SIZE", "wrap_envelope", "open_envelope", "by_envelope_digest",
    "TRACED_ENVELOPE_MAGIC", "Opened", "open_traced_envelope",
]
