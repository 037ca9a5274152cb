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
