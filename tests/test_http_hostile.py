"""Every HTTP call under a deadline for the whole request and a size limit for its answer
(nsq_spark.admin.transport), tried from outside against a hostile server the test starts
(tests/hostile_http.py): one that drips its answer a byte at a time, one that announces
4 GiB, one that sends chunks for ever, one that never answers, and answers of the wrong
shape. The admin clients (blocking and asyncio), ``nsq-spark stat`` and lookupd
discovery end with the exact typed error within a bounded time; memory is measured in a
child process of its own. Time bounds are generous: they only catch a hang."""

from __future__ import annotations

import asyncio
import io
import json
import time

import pytest

from hostile_http import HostileHttp, child
from nsq_spark import cli
from nsq_spark.admin import (AnswerTooLargeError, AsyncLookupdClient, AsyncNsqdClient,
                             HTTPDeadlineError, LookupdClient, LookupdError,
                             NodeUnreachableError, NsqdClient, UnexpectedAnswerError)
from nsq_spark.admin.transport import ANSWER_LIMITS
from nsq_spark.errors import NSQTimeoutError, is_transient

pytestmark = pytest.mark.timeout(120)

STATS = {"version": "1.3.0", "health": "OK", "start_time": 1, "topics": [
    {"topic_name": "t", "depth": 0, "backend_depth": 0, "message_count": 5,
     "message_bytes": 5, "paused": False, "channels": [
         {"channel_name": "c", "depth": 2, "backend_depth": 0, "in_flight_count": 0,
          "deferred_count": 0, "message_count": 5, "requeue_count": 0, "timeout_count": 0,
          "client_count": 0, "clients": [], "paused": False}]}]}


def stats_with(**channel_fields: object) -> bytes:
    doc = json.loads(json.dumps(STATS))
    doc["topics"][0]["channels"][0].update(channel_fields)
    return json.dumps(doc).encode()


# -- the deadline ----------------------------------------------------------------------


def test_a_dripping_server_is_cut_off_at_the_deadline_blocking_and_asyncio():
    with HostileHttp("drip", json.dumps(STATS).encode(), every=0.5) as server:
        started = time.monotonic()
        with NsqdClient(server.address, timeout=1.5) as nsqd:
            with pytest.raises(HTTPDeadlineError, match=r"within the request's deadline "
                               r"of 1\.5 s") as raised:
                nsqd.stats()
        took = time.monotonic() - started
        assert 1.4 < took < 10, took   # before: never returned (each read got 5 s anew)
        error = raised.value
        assert server.address in str(error) and "/stats" in str(error)
        assert isinstance(error, NodeUnreachableError) and isinstance(error, NSQTimeoutError)
        assert is_transient(error)

        async def main() -> float:
            started = time.monotonic()
            async with AsyncLookupdClient(server.address, timeout=1.0) as lookupd:
                with pytest.raises(HTTPDeadlineError, match=r"deadline of 1 s"):
                    await lookupd.lookup("t")
            return time.monotonic() - started

        assert 0.9 < asyncio.run(main()) < 10


def test_a_server_that_never_answers_costs_one_deadline():
    with HostileHttp("silent") as server:
        started = time.monotonic()
        with pytest.raises(HTTPDeadlineError, match=server.address):
            LookupdClient(server.address, timeout=1.0).nodes()
        assert time.monotonic() - started < 10


# -- the size limit --------------------------------------------------------------------


@pytest.mark.parametrize("mode, words", [
    ("huge", "Content-Length 4,294,967,296 bytes"),  # refused before a byte is read
    ("chunks", "more than 33,554,432 bytes arrived"),  # cut off at the limit
])
def test_an_answer_over_its_size_limit_is_refused_naming_url_and_limit(mode, words):
    with HostileHttp(mode) as server:
        with NsqdClient(server.address, timeout=30) as nsqd:
            with pytest.raises(AnswerTooLargeError) as raised:
                nsqd.stats()
        text = str(raised.value)
        assert words in text and "size limit of 32 MiB" in text
        assert f"http://{server.address}/stats" in text and "max_answer_bytes" in text
        assert not is_transient(raised.value)
        # a smaller limit of one's own, and the lookup kind's limit for lookupd
        with pytest.raises(AnswerTooLargeError, match="size limit of 1,000 bytes"):
            NsqdClient(server.address, max_answer_bytes=1000).info()

        async def lookup() -> None:
            async with AsyncLookupdClient(server.address, timeout=30) as lookupd:
                await lookupd.lookup("t")

        with pytest.raises(AnswerTooLargeError, match="size limit of 16 MiB"):
            asyncio.run(lookup())


def test_the_size_limits_of_each_kind_of_answer():
    assert ANSWER_LIMITS == {"status": 1 << 20, "lookup": 16 << 20, "stats": 32 << 20}
    with pytest.raises(Exception, match="max_answer_bytes"):
        NsqdClient("127.0.0.1:4151", max_answer_bytes=0)


@pytest.mark.parametrize("mode", ["huge", "chunks"])
def test_a_4_gib_answer_leaves_the_admin_client_under_200_mb(mode):
    with HostileHttp(mode) as server:
        got = child(f"""
            import json
            from nsq_spark.admin import NsqdClient, AsyncNsqdClient
            import asyncio
            errors = []
            try:
                NsqdClient({server.address!r}, timeout=60).stats()
            except Exception as exc:
                errors.append(type(exc).__name__)
            async def main():
                async with AsyncNsqdClient({server.address!r}, timeout=60) as c:
                    await c.stats()
            try:
                asyncio.run(main())
            except Exception as exc:
                errors.append(type(exc).__name__)
            print(json.dumps({{"errors": errors, "rss": peak_rss_mb()}}))
        """)
    assert got["errors"] == ["AnswerTooLargeError", "AnswerTooLargeError"]
    assert got["rss"] < 200, got   # before: 3 GB, then a builtin MemoryError
    assert got["seconds"] < 60


def test_a_compressed_answer_is_refused_not_inflated():
    # asked for identity, answered gzip (a proxy?): never inflated (a bomb would be)
    with HostileHttp("answer", b"\x1f\x8b", headers=b"Content-Encoding: gzip\r\n") as server:
        with pytest.raises(UnexpectedAnswerError, match="compressed .'gzip'."):
            NsqdClient(server.address).stats()
        assert server.headers()["accept-encoding"] == "identity"


# -- answers of the wrong shape --------------------------------------------------------


@pytest.mark.parametrize("fields, words", [
    ({"paused": "yes"}, "topics[0].channels[0].paused = 'yes' (a string), where nsqd "
                        "sends true or false"),
    ({"depth": -3}, "topics[0].channels[0].depth = -3 (a number), where nsqd sends a "
                    "whole number of 0 or more"),
    ({"message_count": 1.5}, "channels[0].message_count = 1.5"),
    ({"clients": {"a": 1}}, "channels[0].clients = {'a': 1} (an object)"),
])
def test_wrong_types_in_stats_are_a_typed_error_naming_the_field(fields, words):
    with HostileHttp("answer", stats_with(**fields)) as server:
        with pytest.raises(UnexpectedAnswerError) as raised:
            NsqdClient(server.address).stats()
    assert words in str(raised.value) and f"nsqd {server.address}" in str(raised.value)


def test_null_is_empty_only_where_nsqd_sends_it():
    doc = json.loads(stats_with(clients=None))
    with HostileHttp("answer", json.dumps(doc).encode()) as server:
        assert NsqdClient(server.address).stats().channel("t", "c").clients == ()
    doc["topics"][0]["channels"] = None   # nsqd never sends null channels
    with HostileHttp("answer", json.dumps(doc).encode()) as server:
        with pytest.raises(UnexpectedAnswerError, match=r"topics\[0\]\.channels = None"):
            NsqdClient(server.address).stats()
    with HostileHttp("answer", b'{"version": "1.3.0", "topics": null}') as server:
        assert NsqdClient(server.address).stats().topics == ()   # ?topic= it lacks


def test_deeply_nested_json_is_a_typed_error_not_a_recursion_error():
    deep = b'{"version": "1.3.0", "topics": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    with HostileHttp("answer", deep) as server:
        with pytest.raises(UnexpectedAnswerError, match="nested too deeply"):
            NsqdClient(server.address).stats()
        with pytest.raises(LookupdError, match="nested too deeply"):
            LookupdClient(server.address).lookup("t")


# -- nsq-spark stat ----------------------------------------------------------------------


def run_stat(*argv: str) -> tuple[int, str, str]:
    out, err = io.BytesIO(), io.StringIO()
    rc = cli.main(["stat", *argv], stdout=out, stderr=err)
    return rc, out.getvalue().decode(), err.getvalue()


def test_stat_asks_its_nsqds_at_once_under_one_deadline_per_view():
    servers = [HostileHttp("silent") for _ in range(12)]
    try:
        with HostileHttp("answer", json.dumps(STATS).encode()) as good:
            where = [a for s in [good, *servers] for a in ("--nsqd-http-address", s.address)]
            started = time.monotonic()
            rc, out, err = run_stat(*where, "--json", "--count", "1",
                                    "--http-client-request-timeout", "1s")
            took = time.monotonic() - started
    finally:
        for s in servers:
            s.close()
    assert (rc, err) == (0, ""), err
    assert took < 8, took   # before: 12 x 5 s, one after another (61 s)
    (view,) = [json.loads(line) for line in out.splitlines()]
    assert view["channels"][0]["nsqds"] == [good.address]
    assert len(view["unreachable"]) == 12
    assert all("no complete /stats within the view's deadline of 1 s" in u["error"]
               for u in view["unreachable"]), view["unreachable"]


@pytest.mark.parametrize("mode, words", [("huge", "size limit of 32 MiB"),
                                         ("chunks", "size limit of 32 MiB"),
                                         ("drip", "view's deadline of 1 s")])
def test_stat_against_a_hostile_nsqd_fails_with_the_typed_error_in_bounded_memory(mode,
                                                                                  words):
    with HostileHttp(mode, json.dumps(STATS).encode(), every=0.5) as server:
        got = child(f"""
            import io, json, sys
            from nsq_spark import cli
            out, err = io.BytesIO(), io.StringIO()
            rc = cli.main(["stat", "--nsqd-http-address", {server.address!r}, "--count",
                           "1", "--http-client-request-timeout", "1s" if {mode!r} == "drip"
                           else "60s"], stdout=out, stderr=err)
            print(json.dumps({{"rc": rc, "err": err.getvalue(), "rss": peak_rss_mb()}}))
        """)
    assert got["rc"] == cli.EXIT_ERROR
    assert words in got["err"] and "Traceback" not in got["err"] + got["stderr"]
    assert got["err"].startswith("nsq-spark stat: error: no nsqd answered")
    assert got["rss"] < 200, got


def test_stat_with_a_channel_that_does_not_exist_exits_1_as_nsq_stat():
    with HostileHttp("answer", json.dumps(STATS).encode()) as server:
        rc, out, err = run_stat("--nsqd-http-address", server.address, "--topic", "t",
                                "--channel", "typo", "--count", "1")
        assert rc == cli.EXIT_ERROR and out == ""
        assert "no channel 'typo' of topic 't' on the nsqds that answered" in err
        rc, out, err = run_stat("--nsqd-http-address", server.address, "--topic", "t",
                                "--channel", "c", "--count", "1")
        assert rc == 0 and out.splitlines()[1].split()[:3] == ["t/c", "2", "2"]
