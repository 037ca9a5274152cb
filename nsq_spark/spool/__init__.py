"""The durable publish spool, in three parts (user documentation: :mod:`nsq_spark.publish_spool`).

``format.py``  records, framing, the message-id envelope, the spool's errors (sans-IO)
``store.py``   segment files: append, claim, batches, watermarks, locks, fork safety
``drain.py``   the thread that sends a store's records through a producer and acks them,
               and the spool's rule of what nsqd refused for good (:func:`refused`)

A spooling :class:`nsq_spark.Producer` composes a store and a drain; none of these parts
imports the Producer.
"""

from .drain import REFUSAL_CODES, Sender, SpoolDrain, refused
from .format import (DIGEST_SIZE, ENVELOPE_MAGIC, MAGIC, Decoded, SpoolDirectoryError,
                     SpoolError, SpoolFullError, by_envelope_digest, decode_records,
                     encode_record, open_envelope, read_segment, wrap_envelope)
from .store import (FSYNC_ALWAYS, FSYNC_NEVER, Batch, CorruptSegment, Redriven,
                    SegmentStore, SpoolStats, redrive)

__all__ = [
    "SpoolDrain", "Sender", "refused", "REFUSAL_CODES", "redrive", "Redriven", "SegmentStore",
    "SpoolStats", "CorruptSegment", "Batch",
    "FSYNC_ALWAYS", "FSYNC_NEVER", "SpoolError", "SpoolDirectoryError", "SpoolFullError",
    "MAGIC", "Decoded", "encode_record", "decode_records", "read_segment", "ENVELOPE_MAGIC",
    "DIGEST_SIZE", "wrap_envelope", "open_envelope", "by_envelope_digest",
]
