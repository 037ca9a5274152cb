"""The bridge between threads and a consumer's loop (nsq_spark._loop.LoopBridge): a read
(``result``) may fall back to the caller's thread when the loop is blocked; a change
(``result_on_loop``: the Reader's run-time controls) runs once, on the loop, or not at all
(NSQTimeoutError naming the blocked loop), never twice."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Callable, Iterator

import pytest

from nsq_spark._loop import LoopBridge
from nsq_spark.errors import NSQTimeoutError

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


class LoopOnThread:
    """A loop on a thread whose bridge is bound; ``block(s)`` blocks it (a blocking
    handler on the loop thread)."""

    def __init__(self) -> None:
        self.bridge = LoopBridge("closed")
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self.thread = threading.Thread(target=asyncio.run, args=(self._main(),), daemon=True)
        self.thread.start()
        assert self._ready.wait(5)

    async def _main(self) -> None:
        self.bridge.bind()
        self._stop = asyncio.Event()
        self._ready.set()
        await self._stop.wait()

    def block(self, seconds: float) -> threading.Event:
        """Block the loop for ``seconds``; the Event is set once it is blocked."""
        blocked = threading.Event()

        def sleep() -> None:
            blocked.set()
            time.sleep(seconds)
        assert self.bridge.loop is not None
        self.bridge.loop.call_soon_threadsafe(sleep)
        assert blocked.wait(5)
        return blocked

    def stop(self) -> None:
        loop, stop = self.bridge.loop, self._stop
        assert loop is not None and stop is not None
        loop.call_soon_threadsafe(stop.set)
        self.thread.join(5)


@pytest.fixture
def on_thread() -> Iterator[LoopOnThread]:
    lt = LoopOnThread()
    try:
        yield lt
    finally:
        lt.stop()


def _recorder() -> tuple[list[str], Callable[[], str]]:
    calls: list[str] = []

    def fn() -> str:
        calls.append(threading.current_thread().name)
        return "done"
    return calls, fn


def _settle(bridge: LoopBridge) -> None:
    """Wait until the loop ran everything queued before now."""
    assert bridge.result_on_loop(lambda: None, 5, "settle") is None


def test_a_change_runs_once_on_the_loop_thread_when_it_is_free(on_thread: LoopOnThread) -> None:
    calls, fn = _recorder()
    assert on_thread.bridge.result_on_loop(fn, 5, "busy") == "done"
    assert calls == [on_thread.thread.name]


def test_a_change_on_a_blocked_loop_raises_and_never_runs_later(on_thread: LoopOnThread) -> None:
    calls, fn = _recorder()
    on_thread.block(0.5)
    with pytest.raises(NSQTimeoutError, match="the loop is blocked"):
        on_thread.bridge.result_on_loop(fn, 0.1, "the loop is blocked")
    _settle(on_thread.bridge)  # the loop is free again and ran what was queued
    assert calls == []  # neither here nor, later, on the loop


def test_a_read_on_a_blocked_loop_is_evaluated_here_once(on_thread: LoopOnThread) -> None:
    calls, fn = _recorder()
    on_thread.block(0.5)
    assert on_thread.bridge.result(fn, 0.1) == "done"
    _settle(on_thread.bridge)
    assert calls == [threading.current_thread().name]  # not a second time on the loop


def test_the_errors_of_a_change_reach_the_caller_once(on_thread: LoopOnThread) -> None:
    runs: list[int] = []

    def fails() -> Any:
        runs.append(1)
        raise RuntimeError("pool refused")
    with pytest.raises(RuntimeError, match="pool refused"):
        on_thread.bridge.result_on_loop(fails, 5, "busy")
    with pytest.raises(RuntimeError, match="pool refused"):
        on_thread.bridge.result(fails, 5)
    assert runs == [1, 1]  # a RuntimeError of fn is not taken for a closed loop


def test_without_a_running_loop_a_change_runs_here() -> None:
    calls, fn = _recorder()
    assert LoopBridge("closed").result_on_loop(fn, 0.1, "busy") == "done"
    assert calls == [threading.current_thread().name]


def test_a_readers_control_on_a_blocked_loop_names_the_control_and_the_fix(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from fake_nsqd import FakeConnections
    from nsq_spark._consumer import reader as reader_module
    from nsq_spark._consumer.reader import Reader

    monkeypatch.setattr(reader_module, "CONTROL_TIMEOUT", 0.1)
    r = Reader("t", "c", nsqd_tcp_addresses=["127.0.0.1:4150"], max_in_flight=10,
               connection_factory=FakeConnections(), close_timeout=0.2)
    r.start()
    try:
        loop = r.loop
        assert loop is not None
        blocked = threading.Event()

        def sleep() -> None:
            blocked.set()
            time.sleep(1.0)  # a blocking handler on the loop thread
        loop.call_soon_threadsafe(sleep)
        assert blocked.wait(5)
        with pytest.raises(NSQTimeoutError,
                           match=r"disconnect_from_nsqd\('127.0.0.1:4150'\) was not applied"
                                 r".*blocked.*concurrency=N"):
            r.disconnect_from_nsqd("127.0.0.1:4150")
        with pytest.raises(NSQTimeoutError, match=r"connect_to_lookupd\('l1:4161'\)"):
            r.connect_to_lookupd("l1:4161")
        time.sleep(1.1)  # the loop is free again: nothing of either ran late
        assert r.nsqd_tcp_addresses == ["127.0.0.1:4150"]
        assert r.lookupd_http_addresses == []
    finally:
        r.close(5)
