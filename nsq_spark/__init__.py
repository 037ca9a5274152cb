"""nsq_spark: a fast, full-spec NSQ client for Python, with a PySpark connector.

``import nsq_spark as nsq`` is a drop-in for pynsq 0.9.1: every name of pynsq's
``nsq.__all__`` is here (``Reader``, ``Writer``, ``run``, ``Message``, ``Error``,
``AsyncConn``, ``SyncConn``, ``BackoffTimer``, ``LegacyReader``, the protocol helpers and
``FRAME_TYPE_*``), and ``nsq.protocol`` is :mod:`nsq_spark.protocol`. ``nsq.Producer``
is our publishing API.

Names are imported on first use, so ``import nsq_spark`` stays cheap (Spark executors
import it for every task) and the optional parts (Spark, dedup backends) load only when
asked for.

Public modules (what users may import; tests/test_structure.py checks that every other
module is private, a ``_`` in its dotted path):
  ``errors``         typed errors and the retry classification
  ``protocol``       the wire format: commands, FrameDecoder, MessageBlock
  ``message``        Message and its Responder
  ``config``         ConnectionConfig: every connection option, documented and bounded
  ``envelope``       the body envelope: publish ids (stamp, open_body), message-id digests
  ``spool``          the durable publish spool's documentation, its errors and envelope
                     helpers (open_envelope, by_envelope_digest)
  ``admin``          nsqd / nsqlookupd HTTP clients (blocking, asyncio): stats, operations
  ``dedup``          deduplicators and key functions
  ``compat``         pynsq's surface: Writer, AsyncConn, SyncConn, BackoffTimer, LegacyReader
  ``contrib``        ready-made pieces on the public API: the dead-letter giving_up handler
  ``spark``          the PySpark data source and sink: register, NSQDataSource, the options,
                     source_lag, the listener and ProgressInstrument
  ``testing``        the test harness: NSQ processes, pytest plugin, chaos, installer
  ``metrics``        the Prometheus collector
  ``telemetry``      OpenTelemetry metrics and spans (``Telemetry``; the ``otel`` extra)
  ``cli``            the ``nsq-spark`` command

The facades are here, at the root: ``Reader``, ``run``, ``Producer``, ``Writer``,
``Connection``, ``ConnectionConfig``, ``Message``, ``ProducerInfo`` (what a discovery
filter returns) and pynsq's names. Everything else is private (``_consumer``,
``_publish``, ``_conn``, ``_lookupd``, ``spool._store``, ``spark._fetch``, ...): it may
change in any release. The paths that became private in 0.2.0 (``consumer``, ``publish``,
``conn``, ``sync_conn``, ``handshake``, ``lookupd``, ``addresses``, ``validate``, the
spool's and the Spark connector's parts) still import for one release, with a
``DeprecationWarning`` naming the name to use: one table, :mod:`nsq_spark._moved`.
The older paths ``reader``, ``writer``, ``producer``, ``rdy``, ``backoff``, ``install``,
``testing_chaos`` and ``publish_spool`` are re-exports kept for users; the project itself
imports none of these old paths.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    # Type checkers and IDEs see the real classes through the top-level names; at run
    # time they are loaded lazily by __getattr__ below (keep both lists in step: a unit
    # test compares them). ``import X as X`` and the literal ``__all__`` below make each
    # an explicit re-export, so ``mypy --strict`` (no implicit re-export) accepts
    # ``nsq.Producer`` and ``nsq.Message`` in a user's program.
    from nsq_spark import protocol as protocol
    from nsq_spark._conn import Connection as Connection
    from nsq_spark._consumer.reader import Reader as Reader
    from nsq_spark._consumer.run import run as run
    from nsq_spark._lookupd import ProducerInfo as ProducerInfo
    from nsq_spark._publish.producer import Producer as Producer
    from nsq_spark.compat.async_conn import AsyncConn as AsyncConn
    from nsq_spark.compat.backoff_timer import BackoffTimer as BackoffTimer
    from nsq_spark.compat.legacy_reader import LegacyReader as LegacyReader
    from nsq_spark.compat.sync import SyncConn as SyncConn
    from nsq_spark.compat.writer import Writer as Writer
    from nsq_spark.config import ConnectionConfig as ConnectionConfig
    from nsq_spark.errors import NSQError as Error
    from nsq_spark.errors import NSQError as NSQError
    from nsq_spark.message import Message as Message
    from nsq_spark.protocol import FRAME_TYPE_ERROR as FRAME_TYPE_ERROR
    from nsq_spark.protocol import FRAME_TYPE_MESSAGE as FRAME_TYPE_MESSAGE
    from nsq_spark.protocol import FRAME_TYPE_RESPONSE as FRAME_TYPE_RESPONSE
    from nsq_spark.protocol import decode_message as decode_message
    from nsq_spark.protocol import finish as finish
    from nsq_spark.protocol import identify as identify
    from nsq_spark.protocol import mpub as mpub
    from nsq_spark.protocol import nop as nop
    from nsq_spark.protocol import pub as pub
    from nsq_spark.protocol import ready as ready
    from nsq_spark.protocol import requeue as requeue
    from nsq_spark.protocol import subscribe as subscribe
    from nsq_spark.protocol import touch as touch
    from nsq_spark.protocol import unpack_response as unpack_response
    from nsq_spark.protocol import valid_channel_name as valid_channel_name
    from nsq_spark.protocol import valid_topic_name as valid_topic_name
    from nsq_spark.publish_spool import SpoolingProducer as SpoolingProducer

from . import _moved
from ._version import __version__

# the paths that became private in 0.2.0 still import, warning, for one release
_moved.install()

# public name -> module that defines it
_EXPORTS = {
    "Reader": "nsq_spark._consumer.reader",
    "run": "nsq_spark._consumer.run",
    "Message": "nsq_spark.message",
    "Producer": "nsq_spark._publish.producer",
    "Writer": "nsq_spark.compat.writer",
    "SpoolingProducer": "nsq_spark.publish_spool",
    "Connection": "nsq_spark._conn",
    "ProducerInfo": "nsq_spark._lookupd",
    "ConnectionConfig": "nsq_spark.config",
    "NSQError": "nsq_spark.errors",
    # the rest of pynsq 0.9.1's nsq.__all__
    "AsyncConn": "nsq_spark.compat.async_conn",
    "SyncConn": "nsq_spark.compat.sync",
    "BackoffTimer": "nsq_spark.compat.backoff_timer",
    "LegacyReader": "nsq_spark.compat.legacy_reader",
    **{name: "nsq_spark.protocol" for name in (
        "unpack_response", "decode_message", "identify", "subscribe", "ready", "finish",
        "touch", "requeue", "nop", "pub", "mpub", "valid_topic_name", "valid_channel_name",
        "FRAME_TYPE_RESPONSE", "FRAME_TYPE_ERROR", "FRAME_TYPE_MESSAGE")},
}
# pynsq's name for the base error (callbacks check ``isinstance(data, nsq.Error)``)
_ALIASES = {"Error": ("nsq_spark.errors", "NSQError")}

# written out (not built from the tables) so that type checkers read it: a name listed here
# is an explicit re-export (a unit test checks it is exactly the tables' names)
__all__ = [
    "__version__", "Reader", "run", "Message", "Producer", "Writer", "SpoolingProducer",
    "Connection", "ConnectionConfig", "ProducerInfo", "NSQError", "AsyncConn", "SyncConn",
    "BackoffTimer", "LegacyReader", "unpack_response", "decode_message", "identify", "subscribe", "ready",
    "finish", "touch", "requeue", "nop", "pub", "mpub", "valid_topic_name",
    "valid_channel_name", "FRAME_TYPE_RESPONSE", "FRAME_TYPE_ERROR", "FRAME_TYPE_MESSAGE",
    "Error"]

# submodules pynsq programs reach as attributes (``nsq.protocol.Error``,
# ``nsq.reader._utf8_params``)
_SUBMODULES = frozenset({"protocol", "reader"})


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"nsq_spark.{name}")
    module, attr = _ALIASES.get(name) or (_EXPORTS.get(name), name)
    if module is None:
        raise AttributeError(f"module 'nsq_spark' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
