"""Discovery without sockets: the pure choice of producers (topology preference, the
discovery filter), and the pool's discovery path and run-time controls driven through
its ports with fakes (a fake lookupd poller, fake nsqd connections, recording hooks),
all typed against the ports so that mypy checks them."""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable, Coroutine

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fake_nsqd import FakeConn, FakeConnections
from nsq_spark._loop import LoopBridge, TaskGroup
from nsq_spark._addresses import parse_address
from nsq_spark.config import ConnectionConfig, ReaderOptions
from nsq_spark._consumer.answers import Answers, Link
from nsq_spark._consumer.discovery import (DiscoveryFilterError, apply_filter,
                                          check_discovery_filter, choose_producers,
                                          prefer_topology)
from nsq_spark._consumer.lifecycle import Lifecycle
from nsq_spark._consumer.pool import (ConnectToNsqd, MakePoller, Poller, Pool, Pulled,
                                     QueryLookupd)
from nsq_spark._consumer.rdy import RdyPolicy
from nsq_spark.errors import ConfigError, InvalidAddressError, NotConnectedError
from nsq_spark._lookupd import ProducerInfo, lookupd_index, parse_producer_records
from nsq_spark.message import Message
from nsq_spark.protocol import MessageBlock

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


def rec(host: str, port: int = 4150, zone: str | None = None,
        region: str | None = None) -> ProducerInfo:
    return ProducerInfo(host, port, port + 1, zone, region)


# -- the records: lookupd's topology hints ---------------------------------------------------


def test_lookupd_records_carry_the_topology_hints_when_lookupd_reports_them() -> None:
    body = ('{"producers":[{"broadcast_address":"a","tcp_port":1,"http_port":2,'
            '"topology_zone":"z1","topology_region":"r1"},'
            '{"broadcast_address":"b","tcp_port":3,"topology_zone":"","topology_region":7}]}')
    a, b = parse_producer_records(body)
    assert (a.topology_zone, a.topology_region) == ("z1", "r1")
    assert (b.topology_zone, b.topology_region) == (None, None)  # empty or not a string
    assert a.producer == ("a", 1) and b.http_port is None


# -- topology preference: a stable reordering that never drops --------------------------------

ZONES = st.sampled_from([None, "z1", "z2"])
REGIONS = st.sampled_from([None, "r1", "r2"])
RECORDS = st.lists(st.builds(rec, st.sampled_from("abcdefgh"), st.integers(1, 4),
                             ZONES, REGIONS), max_size=12)


@settings(max_examples=300, deadline=None)
@given(RECORDS, ZONES, REGIONS)
def test_topology_preference_reorders_zone_then_region_then_the_rest_and_drops_nothing(
        records: list[ProducerInfo], zone: str | None, region: str | None) -> None:
    out = prefer_topology(records, zone, region)
    assert sorted(out, key=repr) == sorted(records, key=repr)  # a permutation

    def tier(r: ProducerInfo) -> int:
        if zone is not None and r.topology_zone == zone:
            return 0
        if region is not None and r.topology_region == region:
            return 1
        return 2
    assert [tier(r) for r in out] == sorted(tier(r) for r in records)
    for t in (0, 1, 2):  # lookupd's order within a group
        assert [r for r in out if tier(r) == t] == [r for r in records if tier(r) == t]


def test_without_a_zone_or_region_lookupds_order_is_kept() -> None:
    records = [rec("b", zone="z1"), rec("a"), rec("c", region="r1")]
    assert prefer_topology(records, None, None) == records
    assert prefer_topology(records, "z9", "r9") == records


def test_same_zone_comes_first_then_same_region() -> None:
    far, near, same = rec("far", region="r2"), rec("near", region="r1"), rec("same", zone="z1")
    assert prefer_topology([far, near, same], "z1", "r1") == [same, near, far]


# -- the discovery filter ---------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(RECORDS, st.lists(st.integers(0, 20), max_size=15))
def test_the_filter_keeps_drops_and_reorders_and_duplicates_count_once(
        records: list[ProducerInfo], picks: list[int]) -> None:
    def pick(given: list[ProducerInfo]) -> list[ProducerInfo]:
        return [given[i] for i in picks if i < len(given)]
    out = apply_filter(records, pick)
    wanted: list[ProducerInfo] = []
    for r in pick(records):
        if r.producer not in {w.producer for w in wanted}:
            wanted.append(r)
    assert out == wanted


def test_the_filter_sees_the_topology_preferred_order() -> None:
    seen: list[list[str]] = []

    def spy(records: list[ProducerInfo]) -> list[ProducerInfo]:
        seen.append([r.host for r in records])
        return records[:1]
    out = choose_producers([rec("a"), rec("b", zone="z1")], zone="z1", discovery_filter=spy)
    assert seen == [["b", "a"]] and [r.host for r in out] == ["b"]


@pytest.mark.parametrize("result, named", [
    (None, "NoneType"), ("a:4150", "str"), (42, "int"),
    ([("a", 4150)], "tuple"), (["a:4150"], "str")])
def test_a_filter_returning_something_else_than_records_is_a_typed_error(
        result: Any, named: str) -> None:
    with pytest.raises(DiscoveryFilterError, match=f"discovery_filter returned .*{named}.*"
                       "ProducerInfo") as info:
        apply_filter([rec("a")], lambda records: result)
    assert isinstance(info.value, ConfigError)


def test_discovery_filter_must_be_callable() -> None:
    assert check_discovery_filter(None) is None
    with pytest.raises(ConfigError, match="discovery_filter=.*give a callable"):
        check_discovery_filter(["a:4150"])


# -- the pool's discovery path, through its ports --------------------------------------------


class FakePoller:
    """A lookupd poller that polls nothing: the test reports each poll's records."""

    def __init__(self, addresses: list[str], on_records: Callable[[list[ProducerInfo]], Any],
                 poll: Callable[[], Any]) -> None:
        self.addresses = list(addresses)
        self.on_records = on_records
        self.poll = poll
        self.polls = 0
        self.failures: dict[str, str] = {}
        self.started = self.triggered = self.stopped = 0
        self.polling = 0  # polls running now
        self.polling_at_stop: list[int] = []
        self.gate = asyncio.Event()
        self.gate.set()

    def start(self) -> None:
        self.started += 1

    def trigger(self) -> None:
        self.triggered += 1

    def poll_once(self) -> Awaitable[Any]:
        async def once() -> None:
            self.polls += 1
            self.polling += 1
            try:
                await self.gate.wait()  # set: polls end at once
            finally:
                self.polling -= 1
        return once()

    def add_address(self, address: str) -> bool:
        # the port's contract: False for a lookupd polled already (the pool relies on it)
        if lookupd_index(self.addresses, address, "t") is not None:
            return False
        self.addresses.append(address)
        return True

    def remove_address(self, address: str) -> bool:
        i = lookupd_index(self.addresses, address, "t")
        if i is None:
            return False
        del self.addresses[i]
        return True

    def stop(self) -> Awaitable[None]:
        async def stop() -> None:
            self.polling_at_stop.append(self.polling)
            self.stopped += 1
        return stop()


class FakePollers:
    def __init__(self) -> None:
        self.made: list[FakePoller] = []

    def __call__(self, addresses: list[str], on_records: Callable[[list[ProducerInfo]], Any],
                 poll: Callable[[], Any]) -> FakePoller:
        self.made.append(FakePoller(addresses, on_records, poll))
        return self.made[-1]


class Recorder:
    """The owner's ``connect_to_nsqd``: records, and keeps ``refuse`` out (an override)."""

    def __init__(self, pool: Callable[[], Pool], refuse: str = "") -> None:
        self.pool = pool
        self.refuse = refuse
        self.calls: list[tuple[str, int]] = []

    def __call__(self, host: str, port: int) -> None:
        self.calls.append((host, port))
        if host != self.refuse:
            self.pool().connect_to(host, port)


class CountingQuery:
    """The owner's ``query_lookupd``: counts, polls when ``on``."""

    def __init__(self, pool: Callable[[], Pool]) -> None:
        self.pool = pool
        self.calls = 0
        self.on = True

    def __call__(self) -> Any:
        self.calls += 1
        return self.pool().poll_lookupd() if self.on else None


class NoDeliveries:
    def on_messages(self, link: Link, msgs: list[Message]) -> None:
        raise AssertionError("no messages in these tests")

    def on_blocks(self, link: Link, blocks: list[MessageBlock]) -> None:
        raise AssertionError("no blocks in these tests")


class NothingPulled:
    """No pull queue: nothing queued nor handed out."""

    def take_queued(self, link: Link) -> tuple[list[Message], list[MessageBlock]]:
        return [], []

    def holds_blocks(self, link: Link) -> bool:
        return False

    def take_unanswered_blocks(self, link: Link) -> list[MessageBlock]:
        return []

    def drop_link(self, link: Link) -> int:
        return 0


def _conforms(p: FakePollers, q: FakePoller, c: Recorder, n: CountingQuery, u: NothingPulled
              ) -> tuple[MakePoller, Poller, ConnectToNsqd, QueryLookupd, Pulled]:
    """Never called: mypy checks here that the fakes satisfy the pool's ports."""
    return p, q, c, n, u


class Rig:
    """A pool on the running loop with fake nsqds, a fake poller and recording hooks."""

    def __init__(self, *, direct: tuple[str, ...] = (), lookupd: tuple[str, ...] = ("l1:4161",),
                 refuse: str = "", topology_zone: str | None = None,
                 **pool_kw: Any) -> None:
        self.bridge = LoopBridge("closed")
        self.bridge.bind()
        self.nsqd = FakeConnections()
        self.pollers = FakePollers()
        self.connect_to_nsqd = Recorder(lambda: self.pool, refuse)
        self.query_lookupd = CountingQuery(lambda: self.pool)
        self.lifecycle = Lifecycle()
        self.pool = Pool(
            topic="t", channel="c",
            config=ConnectionConfig(close_timeout=0.2, topology_zone=topology_zone),
            policy=RdyPolicy(10), answers=Answers(self.bridge, "t", 0, 60_000),
            lifecycle=self.lifecycle, bridge=self.bridge, tasks=TaskGroup("t"), name="t",
            direct=[parse_address(a) for a in direct], make_poller=self.pollers,
            options=ReaderOptions(rdy_redistribute_interval=5, reconnect_initial=0.05,
                                  reconnect_max=0.1),
            deliveries=NoDeliveries(), pulled=NothingPulled(), connect=self.nsqd,
            lookupd=lookupd, query_lookupd=self.query_lookupd,
            connect_to_nsqd=self.connect_to_nsqd, **pool_kw)

    @property
    def poller(self) -> FakePoller:
        return self.pollers.made[-1]

    async def settle(self) -> None:
        for _ in range(20):
            await asyncio.sleep(0)

    async def close(self) -> None:
        self.lifecycle.begin_closing()
        await self.pool.stop_deliveries()
        await self.pool.close_all()


def run(body: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(asyncio.wait_for(body(), 20))


def test_each_scheduled_poll_asks_the_owners_query_lookupd() -> None:
    async def main() -> None:
        rig = Rig()
        rig.pool.start()
        poller = rig.poller
        assert poller.started == 1 and poller.addresses == ["l1:4161"]
        await poller.poll()  # what the poller runs for each scheduled or triggered poll
        assert rig.query_lookupd.calls == 1 and poller.polls == 1
        rig.query_lookupd.on = False  # an override that skips polling
        assert poller.poll() is None and poller.polls == 1
        await rig.close()
    run(main)


def test_each_chosen_producer_goes_through_the_owners_connect_to_nsqd() -> None:
    async def main() -> None:
        rig = Rig(refuse="b")  # the owner's override keeps b out
        rig.pool.start()
        rig.poller.on_records([rec("a"), rec("b"), rec("c")])
        await rig.settle()
        assert rig.connect_to_nsqd.calls == [("a", 4150), ("b", 4150), ("c", 4150)]
        assert sorted(rig.pool.links) == ["a:4150", "c:4150"]
        assert [c.address for c in rig.nsqd.made] == ["a:4150", "c:4150"]
        rig.poller.on_records([rec("a"), rec("b"), rec("c")])  # the next poll: asked again,
        await rig.settle()                                     # connected once
        assert len(rig.connect_to_nsqd.calls) == 6 and len(rig.nsqd.made) == 2
        await rig.close()
    run(main)


def test_the_discovery_filter_and_topology_order_choose_what_is_connected() -> None:
    async def main() -> None:
        rig = Rig(topology_zone="z1",
                  discovery_filter=lambda rs: [r for r in rs if r.host != "drop"])
        rig.pool.start()
        rig.poller.on_records([rec("far"), rec("drop", zone="z1"), rec("near", zone="z1")])
        await rig.settle()
        assert rig.connect_to_nsqd.calls == [("near", 4150), ("far", 4150)]
        await rig.close()
    run(main)


def test_a_filter_that_raises_or_returns_garbage_connects_to_none_of_that_poll(
        caplog: pytest.LogCaptureFixture) -> None:
    def bad(records: list[ProducerInfo]) -> Any:
        if len(records) == 1:
            raise RuntimeError("filter bug")
        return "a:4150"

    async def main() -> None:
        rig = Rig(discovery_filter=bad)
        rig.pool.start()
        rig.poller.on_records([rec("a")])
        rig.poller.on_records([rec("a"), rec("b")])
        await rig.settle()
        assert rig.connect_to_nsqd.calls == [] and rig.pool.links == {}
        await rig.close()
    run(main)
    assert "discovery_filter raised" in caplog.text and "filter bug" in caplog.text
    assert "discovery_filter returned str" in caplog.text


def test_disconnect_from_a_direct_nsqd_sends_rdy_0_and_cls_and_never_reconnects() -> None:
    async def main() -> None:
        rig = Rig(direct=("a:4150", "b:4150"), lookupd=())
        rig.pool.start()
        await rig.settle()
        assert sorted(rig.pool.links) == ["a:4150", "b:4150"]
        a = next(c for c in rig.nsqd.made if c.address == "a:4150")
        closing = rig.pool.disconnect_from("a", 4150)
        assert closing is not None
        await closing
        assert a.log[-2:] == [("RDY", 0), ("CLS",)] and a.closed
        assert sorted(rig.pool.links) == ["b:4150"] and rig.pool.direct == [("b", 4150)]
        await asyncio.sleep(0.3)  # longer than the reconnect backoff
        assert sorted(rig.pool.links) == ["b:4150"] and len(rig.nsqd.made) == 2
        with pytest.raises(NotConnectedError, match=r"not connected to nsqd a:4150 .*b:4150"):
            rig.pool.disconnect_from("a", 4150)
        await rig.close()
    run(main)


def test_a_discovered_nsqd_disconnected_is_found_again_by_the_next_poll_as_in_go_nsq() -> None:
    async def main() -> None:
        rig = Rig()
        rig.pool.start()
        rig.poller.on_records([rec("a")])
        await rig.settle()
        closing = rig.pool.disconnect_from("a", 4150)
        assert closing is not None
        await closing
        assert rig.pool.links == {} and rig.poller.triggered == 1  # an early poll
        rig.poller.on_records([rec("a")])
        await rig.settle()
        assert list(rig.pool.links) == ["a:4150"] and len(rig.nsqd.made) == 2
        await rig.close()
    run(main)


def test_lookupds_are_added_and_removed_at_run_time() -> None:
    async def main() -> None:
        rig = Rig(lookupd=())
        rig.pool.start()
        assert rig.pollers.made == []  # nothing to poll yet
        assert rig.pool.connect_to_lookupd("l1:4161") is True
        assert rig.poller.started == 1 and rig.poller.addresses == ["l1:4161"]
        assert rig.pool.connect_to_lookupd("http://l1:4161") is False  # the same lookupd
        assert rig.pool.connect_to_lookupd("l2:4161") is True
        assert rig.poller.addresses == ["l1:4161", "l2:4161"] and rig.poller.triggered == 1
        # one list: the pool asks the poller (no copy of its own to disagree)
        assert rig.pool.lookupd_addresses == rig.poller.addresses
        rig.pool.disconnect_from_lookupd("l1:4161")
        assert rig.pool.lookupd_addresses == ["l2:4161"] == rig.poller.addresses
        with pytest.raises(NotConnectedError, match=r"lookupd 'l9:4161' is not polled"):
            rig.pool.disconnect_from_lookupd("l9:4161")
        with pytest.raises(ConfigError, match="only lookupd .* connect_to_lookupd"):
            rig.pool.disconnect_from_lookupd("l2:4161")
        await rig.close()
    run(main)


@pytest.mark.parametrize("how", ["close", "last lookupd"])
def test_explicit_polls_end_before_the_poller_stops(how: str) -> None:
    # a poll still running when the poller releases its HTTP client would make a new one
    # that nothing closes: the pool ends them first
    async def main() -> None:
        rig = Rig(direct=("d1:4150",))
        rig.pool.start()
        await rig.settle()
        poller = rig.poller
        poller.gate.clear()  # polls hang, as a slow lookupd does
        rig.pool.poll_lookupd()  # Reader.query_lookupd() from another thread
        await rig.settle()
        assert poller.polling == 1
        if how == "close":
            await rig.close()
        else:
            rig.pool.disconnect_from_lookupd("l1:4161")
            await rig.settle()
            await rig.close()
        assert poller.polling_at_stop == [0] and poller.stopped == 1

    run(main)


def test_the_last_lookupd_may_go_when_there_are_direct_nsqds() -> None:
    async def main() -> None:
        rig = Rig(direct=("a:4150",))
        rig.pool.start()
        poller = rig.poller
        rig.pool.disconnect_from_lookupd("l1:4161")
        await rig.settle()
        assert rig.pool.poller is None and poller.stopped == 1
        assert rig.pool.poll_lookupd() is None
        await rig.close()
    run(main)


# -- the Reader's controls: input checked before anything runs -------------------------------


def test_the_readers_controls_check_their_input_by_the_one_rules() -> None:
    from nsq_spark._consumer.reader import Reader
    r = Reader("t", "c", lambda m: True, nsqd_tcp_addresses=["127.0.0.1:4150"])
    with pytest.raises(InvalidAddressError, match="address"):
        r.disconnect_from_nsqd("no-port")
    with pytest.raises(InvalidAddressError, match="address"):
        r.connect_to_lookupd("127.0.0.1:notaport")
    with pytest.raises(ConfigError, match="port"):
        r.connect_to_nsqd("127.0.0.1", "4150")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="host"):
        r.connect_to_nsqd("", 4150)
    with pytest.raises(ConfigError, match="discovery_filter"):
        Reader("t", "c", lambda m: True, nsqd_tcp_addresses=["127.0.0.1:4150"],
               discovery_filter="a:4150")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="topology_zone"):
        Reader("t", "c", lambda m: True, nsqd_tcp_addresses=["127.0.0.1:4150"],
               topology_zone="")
    # before start: the lists change, nothing connects
    assert r.connect_to_lookupd("127.0.0.1:4161") is True
    assert r.lookupd_http_addresses == ["127.0.0.1:4161"]
    assert r.connect_to_lookupd("http://127.0.0.1:4161/") is False  # the same one
    r.disconnect_from_lookupd("127.0.0.1:4161")
    assert r.lookupd_http_addresses == []
    r.disconnect_from_nsqd("127.0.0.1:4150")
    assert r.nsqd_tcp_addresses == [] and r.lookupd_http_addresses == []
    with pytest.raises(NotConnectedError):
        r.disconnect_from_nsqd("127.0.0.1:4150")
    assert r.query_lookupd() is None  # not running: nothing to poll


# -- disconnect_from_nsqd on a pulled Reader: the pull queue gives that nsqd's share back ------


def _pulled_reader(blocks: bool) -> tuple[Any, FakeConn, FakeConn]:
    """A pull-mode Reader on two fake nsqds (a, b), started (``blocks``: for get_blocks)."""
    from nsq_spark._consumer.reader import Reader
    from nsq_spark.testing import wait_until
    nsqd = FakeConnections()
    r = Reader("t", "c", nsqd_tcp_addresses=["127.0.0.1:4150", "127.0.0.1:4151"],
               max_in_flight=20, max_backoff_duration=0, connection_factory=nsqd,
               close_timeout=0.3)
    r.start(blocks=blocks)
    wait_until(lambda: len(r.conns) == 2, 5, "both fake nsqds subscribed")
    a, b = sorted(nsqd.made, key=lambda c: c.address)
    return r, a, b


def _on_loop(r: Any, fn: Callable[[], Any]) -> Any:
    return r._bridge.result_on_loop(fn, 5, "the test's loop call")


def test_disconnecting_a_pulled_nsqd_requeues_its_queued_messages_and_hands_them_out_no_more(
        ) -> None:
    from nsq_spark.testing import wait_until
    r, a, b = _pulled_reader(blocks=False)
    try:
        held = _on_loop(r, lambda: a.deliver(1))
        assert r.get_batch(10, timeout=1) == held  # handed out, answered during the close
        queued_a = _on_loop(r, lambda: a.deliver(3))
        queued_b = _on_loop(r, lambda: b.deliver(3))
        r.disconnect_from_nsqd("127.0.0.1:4150")
        r.finish(held)  # within close_timeout: it is FINished, not requeued
        wait_until(lambda: a.closed, 5, "a closed")
        cls = a.log.index(("CLS",))
        assert a.log[cls - 1] == ("RDY", 0)  # the one quiesce: RDY 0, then CLS
        assert a.fins() == [m.id for m in held]
        assert a.reqs() == [(m.id, 0) for m in queued_a]  # at once, no delay
        got = r.get_batch(10, timeout=1)
        assert got == queued_b  # none of a's requeued messages is handed out
        r.finish(got)  # and the healthy batch is answered (no AlreadyRespondedError)
        wait_until(lambda: b.fins() == [m.id for m in queued_b], 5, "b's FINs")
        assert r.stats()["pull_queued"] == 0
    finally:
        r.close(5)


def test_disconnecting_a_pulled_nsqd_requeues_its_blocks_queued_and_handed_out() -> None:
    from nsq_spark.testing import wait_until
    r, a, b = _pulled_reader(blocks=True)
    try:
        held = _on_loop(r, lambda: a.deliver_blocks(2))
        assert r.get_blocks(10, timeout=1) == held  # handed out, never answered
        queued_a = _on_loop(r, lambda: a.deliver_blocks(3))
        queued_b = _on_loop(r, lambda: b.deliver_blocks(3))
        r.disconnect_from_nsqd("127.0.0.1:4150")
        wait_until(lambda: a.closed, 5, "a closed")
        # the handed-out block got close_timeout to be answered, then it and the queued
        # one were requeued at once (not left to nsqd's msg_timeout)
        assert sorted(a.reqs()) == sorted((i, 0) for blk in held + queued_a
                                          for i in blk.ids())
        got = r.get_blocks(10, timeout=1)
        assert got == queued_b
        r.finish_blocks(got)
        wait_until(lambda: b.fins() == queued_b[0].ids(), 5, "b's FINs")
        assert r.stats()["pull_queued"] == 0
    finally:
        r.close(5)


# -- pynsq's nsq.reader names that real programs import -----------------------------------------

PARAM_VALUES = st.one_of(
    st.none(), st.text(max_size=5), st.binary(max_size=5), st.integers(-5, 5),
    st.floats(allow_nan=False, width=16), st.booleans(),
    st.lists(st.one_of(st.text(max_size=3), st.binary(max_size=3)), max_size=3),
    st.tuples(st.text(max_size=3)),
    st.lists(st.integers(), min_size=1, max_size=2), st.just(object()), st.just({"a": 1}))


def _outcome(f: Callable[[Any], Any], params: Any) -> Any:
    try:
        return ("ok", f(params))
    except Exception as exc:
        return ("raised", [t for t in (TypeError, AssertionError) if isinstance(exc, t)])


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.dictionaries(st.text(max_size=3), PARAM_VALUES, max_size=4),
                 st.lists(st.integers(), max_size=2), st.none(), st.text(max_size=2)))
def test_utf8_params_behaves_as_pynsqs(params: Any) -> None:
    pynsq_reader = pytest.importorskip("nsq.reader")  # pynsq, the reference
    from nsq_spark.reader import _utf8_params
    assert _outcome(_utf8_params, params) == _outcome(pynsq_reader._utf8_params, params)


def test_the_pynsq_reader_names_are_reachable_as_programs_reach_them() -> None:
    import nsq_spark as nsq
    from nsq_spark.compat.async_conn import AsyncConn
    from nsq_spark.reader import BackoffTimer, Message, Reader, _utf8_params
    assert nsq.reader._utf8_params is _utf8_params and nsq.reader.Reader is Reader
    assert nsq.reader.AsyncConn is AsyncConn and nsq.reader.Message is Message
    assert BackoffTimer is nsq.BackoffTimer
    assert _utf8_params({"topic": "t\u2020", "n": 1, "skip": None, "l": ["a", b"b"]}) == {
        "topic": "t\u2020".encode(), "n": b"1", "l": [b"a", b"b"]}
    with pytest.raises(AssertionError, match="dict"):
        _utf8_params([("topic", "t")])  # type: ignore[arg-type]


# -- the fakes above are checked against the pool's ports --------------------------------------
# This file passes mypy --strict (so ``_conforms`` holds), and a drifted poller fails:
# tests/test_typing.py (the suite's one mypy run).
