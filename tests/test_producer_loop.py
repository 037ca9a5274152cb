"""LoopHome (nsq_spark._loop), the Producer's one crossing between threads and its event
loop: chosen on first use, a caller's ended loop let go, blocking calls refused on the
loop, shut down from anywhere. No sockets."""

from __future__ import annotations

import asyncio
import threading
import warnings

import pytest

from nsq_spark._loop import LoopHome
from nsq_spark.errors import NSQError

pytestmark = pytest.mark.unit


class Owner:
    def __init__(self) -> None:
        self.closed = False
        self.lost = 0
        self.home = LoopHome("thing", closed=lambda: self.closed, on_lost=self.on_lost,
                             async_hint="await thing.acall()")

    def on_lost(self) -> None:
        self.lost += 1


async def where() -> int:
    return threading.get_ident()


def io_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name == "nsq-thing-io"]


def test_used_from_threads_first_it_starts_one_io_thread() -> None:
    o = Owner()
    first = o.home.submit(where()).result(5)
    assert first != threading.get_ident() and o.home.own_thread
    assert o.home.submit(where()).result(5) == first   # the same thread every time
    assert io_threads() == ["nsq-thing-io"]
    closed = []

    async def close() -> None:
        closed.append(threading.get_ident())

    o.home.shutdown(close, 5)
    assert closed == [first] and o.home.loop is None and not io_threads()


def test_used_from_a_coroutine_first_it_binds_to_that_loop_without_a_thread() -> None:
    o = Owner()

    async def main() -> None:
        loop = o.home.bind_running()
        assert loop is asyncio.get_running_loop() and not o.home.own_thread
        assert o.home.on_it()
        with pytest.raises(NSQError, match=r"await thing.acall\(\)"):
            o.home.check_off_loop()          # a blocking call here would block its loop

    asyncio.run(main())
    assert not io_threads()


def test_a_callers_loop_that_ended_is_let_go_and_the_next_use_starts_over() -> None:
    o = Owner()

    async def main() -> None:
        o.home.bind_running()

    asyncio.run(main())
    assert o.lost == 0
    o.home.submit(where()).result(5)        # asyncio.run() ended: a thread of our own now
    assert o.lost == 1 and o.home.own_thread

    async def nothing() -> None:
        return None

    o.home.shutdown(nothing, 5)


def test_a_coroutine_on_another_loop_hops_to_the_chosen_one() -> None:
    o = Owner()
    o.home.for_threads()

    async def main() -> bool:
        return o.home.on_it()

    assert asyncio.run(main()) is False
    o.home.check_off_loop()   # off the loop: a blocking call is fine

    async def nothing() -> None:
        return None

    o.home.shutdown(nothing, 5)


def test_closed_it_starts_nothing_and_leaves_no_unawaited_coroutine() -> None:
    o = Owner()
    o.closed = True
    with pytest.raises(NSQError, match="the thing is closed"):
        o.home.for_threads()
    coro = where()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(NSQError, match="closed"):
            o.home.submit(coro)
    # closed, not left for the garbage collector to warn "never awaited" (a warning that
    # would fire outside the block above, so the block alone could not fail)
    assert coro.cr_frame is None
    with pytest.raises(NSQError, match="closed"):
        o.home.check_off_loop()
    assert not io_threads()


def test_shutdown_from_the_bound_loop_schedules_the_close() -> None:
    o = Owner()
    closed = []

    async def close() -> None:
        closed.append(True)

    async def main() -> None:
        o.home.bind_running()
        o.home.shutdown(close, 5)   # cannot wait for itself: scheduled
        await asyncio.sleep(0)

    asyncio.run(main())
    assert closed == [True]
