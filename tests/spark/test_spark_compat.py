"""What each pyspark supports is decided in one place (``nsq_spark.spark._compat``), and a
missing feature is refused with the version it needs. The offset bookkeeping of the
pyspark 4.0/4.1 stream reader, without Spark (the version tier runs it in each Spark).
"""

from __future__ import annotations

import pytest

from nsq_spark.errors import NSQError, SparkVersionError
from nsq_spark.spark import _compat
from nsq_spark.spark.datasource import (NSQDataSource, NSQStartlessStreamReader,
                                        NSQStreamReader)

pytestmark = pytest.mark.unit

PYSPARK_40 = _compat.SparkAPI("4.0.5", stream_write=False, admission_control=False)


def test_the_running_pyspark_is_described():
    import pyspark

    assert _compat.API.version == pyspark.__version__
    major_minor = tuple(int(p) for p in pyspark.__version__.split(".")[:2])
    assert _compat.API.stream_write == (major_minor >= (4, 1))
    assert _compat.API.admission_control == (major_minor >= (4, 2))


def test_a_missing_feature_names_the_version_it_needs_and_the_way_out():
    with pytest.raises(SparkVersionError) as err:
        _compat.require("stream_write", PYSPARK_40)
    text = str(err.value)
    assert text.startswith("streaming writes (df.writeStream.format('nsq')) need pyspark "
                           ">= 4.1 (found 4.0.5)")
    assert "foreachBatch" in text
    assert isinstance(err.value, NSQError)


def test_a_present_feature_passes():
    _compat.require("stream_write", _compat.SparkAPI("4.1.4", True, False))


def test_the_stream_reader_follows_the_api(tmp_path):
    source = NSQDataSource({"topic": "t", "channel": "c", "spoolPath": str(tmp_path),
                            "nsqdTcpAddresses": "127.0.0.1:4150"})
    reader = source.streamReader(None)
    if _compat.API.admission_control:
        assert type(reader) is NSQStreamReader
    else:
        assert type(reader) is NSQStartlessStreamReader


def startless(tmp_path) -> NSQStartlessStreamReader:
    return NSQStartlessStreamReader({"topic": "t", "channel": "c", "spoolPath": str(tmp_path),
                                     "nsqdTcpAddresses": "127.0.0.1:4150"})


def test_the_startless_reader_keeps_the_latest_offset_spark_showed_it(tmp_path):
    r = startless(tmp_path)
    first = r.initialOffset()
    assert first["batch"] == 0 and r.initialOffset() == first  # one token per query
    one = {"query": first["query"], "batch": 1, "size": 10}
    r.partitions(first, one)
    assert r._seen == one
    r.commit(first)  # an older offset never moves the start back
    assert r._seen == one


def test_a_restart_continues_the_logged_query(tmp_path):
    """Spark hands the offset log's latest entry over as partitions(latest, latest)
    (setLatestSeenOffset); the initial offset asked afterwards is that query's batch 0,
    so a logged but uncommitted batch 1 is replayed, not skipped."""
    r = startless(tmp_path)
    logged = {"query": "q1", "batch": 1, "size": 10}
    assert list(r.partitions(logged, logged)) == []
    assert r.initialOffset() == {"query": "q1", "batch": 0, "size": 0, "v": 2}
    assert r._seen == logged


def _compat_without(monkeypatch: pytest.MonkeyPatch, *missing: str):
    """A fresh copy of ``_compat`` run against a pyspark whose streaming datasource module
    lacks ``missing``; the real ``_compat`` (and what imported from it) stays untouched, and
    monkeypatch puts the removed names back after the test."""
    import importlib.util
    import sys

    import pyspark.sql.streaming.datasource as streaming

    for name in missing:
        monkeypatch.delattr(streaming, name)
    spec = importlib.util.spec_from_file_location("_compat_copy", _compat.__file__)
    assert spec is not None and spec.loader is not None
    copy = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, copy)  # dataclasses look their module up
    spec.loader.exec_module(copy)
    return copy


@pytest.mark.skipif(not _compat.API.admission_control, reason="needs pyspark >= 4.2")
def test_a_pyspark_without_read_min_rows_keeps_the_real_available_now_base(monkeypatch):
    from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

    copy = _compat_without(monkeypatch, "ReadMinRows")
    assert copy.API.admission_control is True
    assert copy.TriggerAvailableNowBase is SupportsTriggerAvailableNow
    assert copy.ReadMinRows is None and copy.ReadMaxBytes is None
    assert copy.ReadMaxRows is not None


@pytest.mark.skipif(not _compat.API.admission_control, reason="needs pyspark >= 4.2")
def test_a_pyspark_without_available_now_gets_the_stand_in_base(monkeypatch):
    from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

    copy = _compat_without(monkeypatch, "SupportsTriggerAvailableNow")
    assert copy.API.admission_control is False
    assert copy.TriggerAvailableNowBase is not SupportsTriggerAvailableNow
    assert copy.TriggerAvailableNowBase.__doc__.startswith("Stand-in")
    assert copy.ReadAllAvailable is None and copy.ReadMaxRows is None
    # the read limits that are there are still found
    assert copy.ReadMinRows is not None and copy.ReadMaxBytes is not None


def test_the_real_compat_is_left_as_it_was():
    import pyspark.sql.streaming.datasource as streaming

    if _compat.API.admission_control:
        assert _compat.TriggerAvailableNowBase is streaming.SupportsTriggerAvailableNow
        assert _compat.ReadMinRows is streaming.ReadMinRows
