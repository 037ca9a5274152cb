"""The Producer faces one transport, chosen once in ``__init__``: direct (TCP or HTTP) or
spooled. Every public attribute exists in both modes, and the old import paths still
give the same objects. No nsqd needed: nothing here connects."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest

from nsq_spark._publish.direct import DirectTransport
from nsq_spark._publish.producer import Producer
from nsq_spark._publish.spooled import SpooledTransport
from nsq_spark.spool import Sender

pytestmark = pytest.mark.unit


class NullSender:
    """A spool sender that takes everything (typed against the drain's port)."""

    def publish(self, topic: str, body: bytes, defer_ms: int | None = None) -> None:
        return None

    def mpublish(self, topic: str, bodies: Any) -> None:
        return None

    def close(self) -> None:
        return None


def null_sender() -> Sender:
    return NullSender()


def public(p: Producer) -> dict[str, object]:
    """Every public name of ``p`` and its value (a property that raises fails here)."""
    return {name: getattr(p, name) for name in dir(p) if not name.startswith("_")}


MODES: dict[str, dict[str, Any]] = {
    "tcp": {"nsqd_tcp_addresses": "127.0.0.1:1"},
    "http": {"nsqd_http_addresses": "127.0.0.1:1"},
}


@pytest.mark.parametrize("mode", sorted(MODES))
def test_every_public_attribute_exists_with_and_without_spool_dir(tmp_path: Path,
                                                                  mode: str) -> None:
    direct = Producer(**MODES[mode])
    spooled = Producer(**MODES[mode], spool_dir=tmp_path / "a")
    by_factory = Producer(spool_dir=tmp_path / "b", producer_factory=null_sender)
    try:
        names = set(public(direct))
        assert names == set(public(spooled)) == set(public(by_factory))
        # the instance attributes too (dir() also lists methods and properties)
        own = {n for n in vars(direct) if not n.startswith("_")}
        assert own == {n for n in vars(spooled) if not n.startswith("_")}
        assert own == {n for n in vars(by_factory) if not n.startswith("_")}
        assert {"config", "nsqd_tcp_addresses", "nsqd_http_addresses", "http_mode",
                "spool_dir", "spool_stats", "batch_size", "strategy"} <= names
    finally:
        direct.close()
        spooled.close(timeout=0)
        by_factory.close(timeout=0)


def test_the_attributes_of_the_other_mode_hold_what_that_mode_means(tmp_path: Path) -> None:
    direct = Producer("127.0.0.1:1", snappy=True)
    spooled = Producer("127.0.0.1:1", spool_dir=tmp_path, snappy=True)
    try:
        assert spooled.config == direct.config and spooled.config.snappy
        assert spooled.nsqd_tcp_addresses == direct.nsqd_tcp_addresses == ["127.0.0.1:1"]
        assert direct.spool_dir is None and direct.spool_stats is None
        assert spooled.spool_dir == tmp_path and spooled.spool_stats is not None
        assert direct.last_error is None and direct.pending_bytes() == 0
        assert direct.flush(0) is True
        assert direct.batch_size == spooled.batch_size == 1000
        assert direct.max_tries is None and spooled.max_tries == 1
        assert "tcp" in repr(direct) and "spool=" in repr(spooled)
    finally:
        direct.close()
        spooled.close(timeout=0)


def test_the_transport_is_chosen_once(tmp_path: Path) -> None:
    direct = Producer("127.0.0.1:1")
    spooled = Producer("127.0.0.1:1", spool_dir=tmp_path)
    try:
        assert type(direct._transport) is DirectTransport
        assert type(spooled._transport) is SpooledTransport
        # the spool sends through a direct transport, not through another Producer
        assert type(spooled._transport.drain.sender) is DirectTransport
    finally:
        direct.close()
        spooled.close(timeout=0)


def test_redrive_without_spool_dir_names_the_option() -> None:
    from nsq_spark.errors import ConfigError
    with Producer("127.0.0.1:1") as p, pytest.raises(ConfigError, match="spool_dir"):
        p.redrive()


@pytest.mark.parametrize("old,new,names", [
    ("nsq_spark.producer", "nsq_spark._publish.producer",
     ["Producer", "DEFAULT_MAX_MPUB_BYTES"]),
    ("nsq_spark.producer", "nsq_spark.errors", ["is_transient"]),
    ("nsq_spark.producer", "nsq_spark.writer", ["Writer"]),
    ("nsq_spark.publish_spool", "nsq_spark.spool",
     ["SegmentStore", "SpoolError", "SpoolFullError", "SpoolDirectoryError", "SpoolStats",
      "CorruptSegment", "Batch", "encode_record", "decode_records", "read_segment",
      "wrap_envelope", "open_envelope", "by_envelope_digest", "MAGIC", "ENVELOPE_MAGIC",
      "DIGEST_SIZE", "Decoded", "FSYNC_ALWAYS", "FSYNC_NEVER"]),
    ("nsq_spark", "nsq_spark._publish.producer", ["Producer"]),
])
def test_old_import_paths_give_the_same_objects(old: str, new: str, names: list[str]) -> None:
    for name in names:
        assert getattr(importlib.import_module(old), name) is \
            getattr(importlib.import_module(new), name), name


def test_the_spool_documentation_lives_in_the_spool_package() -> None:
    import nsq_spark.publish_spool as shim
    import nsq_spark.spool as spool
    assert spool.__doc__ is not None and "The promise" in spool.__doc__
    assert "Segment format" in spool.__doc__
    assert shim.__doc__ is not None and "nsq_spark.spool" in shim.__doc__
    assert len(shim.__doc__) < len(spool.__doc__) // 5
