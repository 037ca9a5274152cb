"""Old import path of the publish spool, kept for users: the names below are re-exported
from :mod:`nsq_spark.spool` (where the spool's documentation is), and the deprecated
``SpoolingProducer`` still works. The project itself imports :mod:`nsq_spark.spool`."""

from __future__ import annotations

import warnings
from typing import Any, Sequence

from nsq_spark._publish.producer import Producer
from nsq_spark.spool._format import (DIGEST_SIZE, ENVELOPE_MAGIC, MAGIC, Decoded,
                                    SpoolDirectoryError, SpoolError, SpoolFullError,
                                    by_envelope_digest, decode_records, encode_record,
                                    open_envelope, read_segment, wrap_envelope)
from nsq_spark.spool._store import (FSYNC_ALWAYS, FSYNC_NEVER, Batch, CorruptSegment,
                                   SegmentStore, SpoolStats)

__all__ = [
    "SpoolingProducer", "SegmentStore", "SpoolError", "SpoolDirectoryError", "SpoolFullError",
    "SpoolStats", "CorruptSegment", "Batch", "encode_record", "decode_records",
    "read_segment", "wrap_envelope", "open_envelope", "by_envelope_digest", "MAGIC",
    "ENVELOPE_MAGIC", "DIGEST_SIZE", "Decoded", "FSYNC_ALWAYS", "FSYNC_NEVER",
]


class SpoolingProducer(Producer):
    """Deprecated: use ``nsq_spark.Producer(..., spool_dir=path)``, which this is.

    Kept so that old code runs: a SpoolingProducer *is* a Producer with a spool (same
    signature, ``spool_dir`` required). It no longer has ``pub``/``mpub`` aliases (their
    meaning differed from ``Writer.pub``) and, like every Producer, refuses ``str``
    bodies: encode them first.
    """

    def __init__(self, nsqd_tcp_addresses: str | Sequence[str] | None = None, *,
                 spool_dir: Any, **kwargs: Any) -> None:
        warnings.warn("nsq_spark.publish_spool.SpoolingProducer is deprecated: use "
                      "nsq_spark.Producer(..., spool_dir=...)", DeprecationWarning,
                      stacklevel=2)
        super().__init__(nsqd_tcp_addresses, spool_dir=spool_dir, **kwargs)
