"""pynsq's Reader hooks as programs use them: assigned on the instance
(``r.validate_message = f``, ``r.preprocess_message = f``, ``r.heartbeat = f``,
``r.disabled = f``), before or after start, as well as overridden in a subclass.

pynsq's ``Reader._handle_message`` (0.9.1, read for behaviour) calls
``preprocess_message(message)``, then ``validate_message`` on what that returned; a False
finishes the message without handing it to ``process_message``; it looks every hook up on
the instance at each message, so an assigned one counts. We choose the handler strategy
once instead (no lookup per message, nothing at all when no hook is set) and choose it
again whenever a hook is assigned or deleted.

Unit tests with fake connections first; then a real program against real nsqd, run
unchanged under pynsq and under nsq_spark, that rejects 10 of 100 messages."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from fake_nsqd import FakeConn, FakeConnections
from nsq_spark._consumer import Reader
from nsq_spark._consumer.handlers import PerMessage
from nsq_spark.message import Message
from nsq_spark.testing import NSQCluster, publish


async def _started(handler: Any, **kw: Any) -> tuple[Reader, FakeConn]:
    nsqd = FakeConnections()
    r = Reader("t", "c", handler, nsqd_tcp_addresses=["127.0.0.1:4150"], connection_factory=nsqd,
               max_in_flight=100, **kw)
    return r, await _subscribed(r, nsqd)


async def _subscribed(r: Reader, nsqd: FakeConnections) -> FakeConn:
    for _ in range(100):
        await asyncio.sleep(0)
        if r.conns:
            break
    assert len(nsqd.made) == 1 and r.conns
    return nsqd.made[0]


def _run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 20))


def _record(into: list[bytes], item: bytes) -> bool:
    into.append(item)
    return True


def _odd(m: Message) -> bool:
    return int(m.id) % 2 == 1


# -- unit: fake connections -------------------------------------------------------------------


@pytest.mark.unit
def test_without_hooks_the_handler_is_called_directly_with_nothing_in_between() -> None:
    def handler(m: Message) -> bool:
        return True

    async def main() -> None:
        r, _ = await _started(handler)
        strategy = r._intake.to_messages
        assert isinstance(strategy, PerMessage) and strategy.call is handler
        await r.aclose()
    _run(main())


@pytest.mark.unit
def test_validate_message_assigned_before_start_finishes_the_rejected_unhandled() -> None:
    handled: list[bytes] = []

    async def main() -> None:
        nsqd = FakeConnections()
        r = Reader("t", "c", lambda m: _record(handled, m.id),
                   nsqd_tcp_addresses=["127.0.0.1:4150"], connection_factory=nsqd,
                   max_in_flight=100)
        # a program's shape: right after construction (mypy calls it assigning a method)
        r.validate_message = _odd  # type: ignore[method-assign,assignment]
        c = await _subscribed(r, nsqd)
        msgs = c.deliver(10)
        assert handled == [m.id for m in msgs if _odd(m)]
        assert sorted(c.fins()) == sorted(m.id for m in msgs)  # the rejected are FINished
        assert c.reqs() == [] and r.finished == 10
        await r.aclose()
    _run(main())


@pytest.mark.unit
def test_hooks_assigned_after_start_apply_from_the_next_chunk_and_del_restores() -> None:
    handled: list[bytes] = []
    seen: list[bytes] = []

    def pre(m: Message) -> Message:
        seen.append(m.id)
        return m

    async def main() -> None:
        def handler(m: Message) -> bool:
            return _record(handled, m.id)

        r, c = await _started(handler)
        first = c.deliver(4)
        r.preprocess_message = pre  # type: ignore[method-assign,assignment]
        r.validate_message = lambda m: False  # type: ignore[method-assign,assignment]
        second = c.deliver(4)
        assert seen == [m.id for m in second]
        assert handled == [m.id for m in first]  # none of the second chunk: rejected
        del r.validate_message  # back to the class's hook: every message valid
        third = c.deliver(4)
        assert handled == [m.id for m in first + third]
        del r.preprocess_message
        # no hook left: the handler is called directly again (telemetry off: the strategy
        # is what the intake hands messages to)
        assert r._intake.to_messages.call is handler  # type: ignore[attr-defined]
        assert sorted(c.fins()) == sorted(m.id for m in first + second + third)
        await r.aclose()
    _run(main())


@pytest.mark.unit
def test_an_instance_hook_wins_over_a_subclass_override() -> None:
    class Sub(Reader):
        def validate_message(self, message: Message) -> bool:
            return False

    handled: list[bytes] = []

    async def main() -> None:
        nsqd = FakeConnections()
        r = Sub("t", "c", lambda m: _record(handled, m.id),
                nsqd_tcp_addresses=["127.0.0.1:4150"], connection_factory=nsqd,
                max_in_flight=100)
        c = await _subscribed(r, nsqd)
        c.deliver(2)
        assert handled == []  # the subclass rejects all
        r.validate_message = _odd  # type: ignore[method-assign,assignment]
        msgs = c.deliver(4)
        assert handled == [m.id for m in msgs if _odd(m)]
        await r.aclose()
    _run(main())


@pytest.mark.unit
def test_disabled_assigned_on_the_instance_holds_rdy_at_0_and_gives_it_back() -> None:
    async def main() -> None:
        r, c = await _started(lambda m: True)
        assert c.rdy_count > 0
        # pynsq's classmethod, replaced on the instance
        r.disabled = lambda: True  # type: ignore[method-assign]
        r._pool._tick()
        assert c.rdy_count == 0
        del r.disabled
        r._pool._tick()
        assert c.rdy_count > 0
        await r.aclose()
    _run(main())


@pytest.mark.unit
def test_heartbeat_assigned_on_the_instance_is_what_the_connection_calls() -> None:
    beats: list[Any] = []

    async def main() -> None:
        r, c = await _started(lambda m: True)
        r._pool._heartbeat(c)  # what a connection calls at each heartbeat
        r.heartbeat = beats.append  # type: ignore[method-assign,assignment]
        r._pool._heartbeat(c)
        assert beats == [c]
        await r.aclose()
    _run(main())


# -- real nsqd: one program, run under pynsq and under nsq_spark -------------------------------

PROGRAM = '''
import importlib, json, os, signal, sys, time
import tornado.ioloop

nsq = importlib.import_module(sys.argv[1])  # "nsq" (pynsq) or "nsq_spark"
nsqd, topic, channel = sys.argv[2:5]
seen = {"handled": [], "preprocessed": 0, "validated": 0, "heartbeats": 0}


def handler(message):
    seen["handled"].append(int(message.body))
    return True


def preprocess(message):
    seen["preprocessed"] += 1
    return message


def validate(message):
    seen["validated"] += 1
    return int(message.body) % 10 != 0  # rejects 0, 10, ..., 90


def heartbeat(conn):
    seen["heartbeats"] += 1


r = nsq.Reader(topic=topic, channel=channel, message_handler=handler,
               nsqd_tcp_addresses=[nsqd], max_in_flight=20, heartbeat_interval=1)
r.preprocess_message = preprocess
r.validate_message = validate
r.heartbeat = heartbeat

started = time.monotonic()


def check():
    done = seen["validated"] >= 100 and seen["heartbeats"] >= 1
    if done or time.monotonic() - started > 20:
        os.kill(os.getpid(), signal.SIGTERM)


tornado.ioloop.PeriodicCallback(check, 50).start()
nsq.run()
print(json.dumps(seen))
'''


def _create_channel(http: str, topic: str, channel: str) -> None:
    for path in (f"topic/create?topic={topic}", f"channel/create?topic={topic}&channel={channel}"):
        urllib.request.urlopen(urllib.request.Request(f"http://{http}/{path}", method="POST"),
                               timeout=5).read()


@pytest.mark.nsqd
@pytest.mark.timeout(120)
@pytest.mark.unit
@pytest.mark.parametrize("name", ["validate_message", "preprocess_message", "disabled"])
def test_a_coroutine_hook_is_refused_not_taken_for_true(name: str) -> None:
    # called without awaiting, as pynsq calls them: a coroutine would stand for the
    # result, always true (every message "valid", RDY held at 0 for good)
    from tornado import gen

    from nsq_spark.errors import ConfigError

    async def coro(*args: Any) -> bool:
        return False

    @gen.coroutine
    def tornado_coro(*args: Any) -> Any:
        return False

    r = Reader("t", "c", lambda m: True, nsqd_tcp_addresses=["127.0.0.1:4150"])
    for hook in (coro, tornado_coro):
        with pytest.raises(ConfigError, match=f"{name} is a coroutine function"):
            setattr(r, name, hook)
        assert name not in vars(r)  # refused, not half-applied
    setattr(r, name, lambda *args: True)  # a plain def is taken
    assert name in vars(r)

    class Overriding(Reader):
        pass
    setattr(Overriding, name, coro)
    with pytest.raises(ConfigError, match=name):
        Overriding("t", "c", lambda m: True, nsqd_tcp_addresses=["127.0.0.1:4150"])


def test_a_program_assigning_hooks_rejects_10_of_100_as_under_pynsq(nsq_cluster: NSQCluster,
                                                                    tmp_path: Path) -> None:
    modules = ["nsq_spark"]
    try:
        import nsq  # type: ignore[import-untyped]  # noqa: F401  pynsq, the reference
        modules.insert(0, "nsq")
    except ImportError:
        pass
    http, tcp = nsq_cluster.nsqd_http_addresses[0], nsq_cluster.nsqd_tcp_addresses[0]
    topic = "hooks"
    for module in modules:
        _create_channel(http, topic, module.replace("_", ""))
    publish(http, topic, [str(i).encode() for i in range(100)])
    script = tmp_path / "prog.py"
    script.write_text(PROGRAM)
    results: dict[str, Any] = {}
    for module in modules:
        channel = module.replace("_", "")
        proc = subprocess.run([sys.executable, str(script), module, tcp, topic, channel],
                              capture_output=True, text=True, timeout=60,
                              env={**os.environ, "PYTHONUNBUFFERED": "1"})
        assert proc.returncode == 0, proc.stderr
        seen = json.loads(proc.stdout.strip().splitlines()[-1])
        results[module] = seen
        assert sorted(seen["handled"]) == [i for i in range(100) if i % 10], (module, seen)
        assert seen["preprocessed"] == seen["validated"] == 100, (module, seen)
        assert seen["heartbeats"] >= 1, (module, seen)
        c = nsq_cluster.nsqds[0].channel_stats(topic, channel)
        # the 10 rejected were FINished like the 90 handled: nothing left, requeued or
        # timed out
        assert c["message_count"] == 100, (module, c)
        assert (c["depth"], c["in_flight_count"], c["requeue_count"],
                c["timeout_count"]) == (0, 0, 0, 0), (module, c)
    if "nsq" in results:  # the same program, the same outcome
        assert sorted(results["nsq"]["handled"]) == sorted(results["nsq_spark"]["handled"])
