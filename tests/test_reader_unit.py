"""Reader helpers that need no socket: address parsing, pynsq units."""

from __future__ import annotations

import pytest

from nsq_spark.reader import _address_list, _pynsq_units, _split_hostport

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("addr,expected", [
    ("127.0.0.1:4150", ("127.0.0.1", 4150)),
    ("nsqd.example:1", ("nsqd.example", 1)),
    ("[::1]:4150", ("::1", 4150)),
])
def test_split_hostport(addr, expected):
    assert _split_hostport(addr) == expected


@pytest.mark.parametrize("bad", ["localhost", ":4150", "h:", "h:x", "h:0", "h:70000"])
def test_split_hostport_rejects(bad):
    with pytest.raises(ValueError, match="host:port"):
        _split_hostport(bad)


def test_address_list():
    assert _address_list(None, "x") == []
    assert _address_list("a:1", "x") == ["a:1"]
    assert _address_list([" a:1 ", "b:2"], "x") == ["a:1", "b:2"]
    with pytest.raises(TypeError, match="x must be"):
        _address_list(42, "x")
    with pytest.raises(ValueError, match="non-empty"):
        _address_list(["a:1", ""], "x")


def test_pynsq_units_seconds_become_milliseconds():
    assert _pynsq_units({"heartbeat_interval": 30, "msg_timeout": 2.5, "snappy": True}) == \
        {"heartbeat_interval": 30000, "msg_timeout": 2500, "snappy": True}
    # values that are valid milliseconds already stay as they are
    assert _pynsq_units({"heartbeat_interval": 1000, "msg_timeout": 60000}) == \
        {"heartbeat_interval": 1000, "msg_timeout": 60000}
    assert _pynsq_units({"heartbeat_interval": -1}) == {"heartbeat_interval": -1}
