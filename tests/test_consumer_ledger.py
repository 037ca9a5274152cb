"""The consumer's parts alone, without a loop or a socket: the answers ledger's chunk-level
calls, the deduplicator gate, the lifecycle, and the rule that the consumer's parts never
reference each other both ways (``TYPE_CHECKING`` imports included)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import nsq_spark._consumer
from fake_nsqd import FakeConn, FakeConnections
from nsq_spark._loop import LoopBridge
from nsq_spark.config import ConnectionConfig
from nsq_spark._consumer.answers import Answers, Link
from nsq_spark._consumer.dedup_gate import DedupGate
from nsq_spark._consumer.lifecycle import Lifecycle, Phase
from nsq_spark.dedup import OppositeBloomFilter
from nsq_spark.message import Message
from test_structure import (SHIMS, USER_REEXPORTS, cycles, import_graph, imported_names,
                            module_files)

pytestmark = pytest.mark.unit


def ledger(dedup: DedupGate | None = None) -> tuple[Answers, Link, FakeConn, list[bool]]:
    results: list[bool] = []
    answers = Answers(LoopBridge("closed"), "t:c", 1000, 5000, results.append, dedup)
    link = answers.link("127.0.0.1", 4150, "127.0.0.1:4150")
    conn = FakeConnections()("127.0.0.1", 4150, ConnectionConfig(), on_messages=lambda m: None,
                      on_blocks=None, on_close=lambda exc: None, on_heartbeat=None,
                      responder=link)
    answers.attach(link, conn)
    return answers, link, conn, results


def chunk(link: Link, first: int, n: int, attempts: int = 1) -> list[Message]:
    return [Message(b"%016d" % (first + i), b"", 0, attempts, link) for i in range(n)]


# -- the ledger ---------------------------------------------------------------------------------

OUTCOMES = ["true", "none", "false", "raise", "answer_fin", "answer_req", "delegate"]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(st.sampled_from(OUTCOMES), min_size=1, max_size=6), max_size=6))
def test_every_handed_message_is_answered_once_and_in_flight_counts_the_rest(chunks: list[list[str]]) -> None:
    answers, link, conn, results = ledger()
    plan: dict[bytes, str] = {}
    held: list[Message] = []

    def call(m: Message) -> Any:
        what = plan[m.id]
        if what == "raise":
            raise RuntimeError("handler failed")
        if what == "answer_fin":
            m.finish()
        elif what == "answer_req":
            m.requeue(backoff=False)
        elif what == "delegate":
            m.enable_async()
            held.append(m)
        return {"true": True, "false": False}.get(what)

    def other(link_: Link, m: Message, r: Any, exc: Exception | None) -> None:
        assert isinstance(exc, RuntimeError) and r is None
        answers.settle(link_, m, False)

    async def main() -> None:
        answers.bridge.bind()  # Message.finish() inside a handler: on the loop's thread
        sent = 0
        for outcomes in chunks:
            msgs = chunk(link, sent, len(outcomes))
            sent += len(msgs)
            plan.update((m.id, o) for m, o in zip(msgs, outcomes))
            answers.hand_over_each(link, msgs, call, other)
            answers.flush()
            assert link.rdy.in_flight == len(held) == len(link.outstanding)
        # the delegated ones, answered by the application later
        for i, m in enumerate(held):
            answers.settle(link, m, i % 2 == 0)
        answers.flush()

    asyncio.run(main())
    assert link.rdy.in_flight == 0 and not link.outstanding
    answered = conn.fins() + [mid for mid, _ in conn.reqs()]
    assert sorted(answered) == sorted(plan)  # each once, FIN or REQ
    # a failure in a turn feeds backoff: a handler's False or exception, or a delegated
    # message requeued by settle(False) (the odd ones above)
    failed = any(o in ("false", "raise") for o in plan.values()) or len(held) > 1
    assert (False in results) == failed


def test_a_chunk_settles_what_nobody_answered_and_holds_the_delegated() -> None:
    answers, link, conn, results = ledger()
    msgs = chunk(link, 0, 4)
    answers.hand_over(link, msgs)
    msgs[0].enable_async()
    answers.settle(link, msgs[1], True)  # answered on its own before the chunk's result
    answers.settle_chunk(link, msgs, False)
    assert [mid for mid, _ in conn.reqs()] == [msgs[2].id, msgs[3].id]
    assert conn.fins() == [msgs[1].id]
    assert link.rdy.in_flight == 1 and list(link.outstanding) == [msgs[0].id]
    assert results == [False]


def test_what_the_gate_answers_never_counts_in_flight() -> None:
    answers, link, conn, _ = ledger()
    dups, late = chunk(link, 0, 2), chunk(link, 2, 2)
    answers.finish_unhanded(link, dups)
    answers.give_back(link, late)
    answers.flush()
    assert conn.fins() == [m.id for m in dups]
    assert conn.reqs() == [(m.id, 0) for m in late]  # at once: closing
    assert all(m.responded for m in dups + late) and link.rdy.in_flight == 0


def test_requeued_messages_are_released_and_finished_ones_committed() -> None:
    # 65,536 buckets: the two ids share one (hash() is salted per run) once in 65,536 runs;
    # with 64 buckets it was one run in 64, and the redelivery then looked like a duplicate
    gate = DedupGate(OppositeBloomFilter(1 << 16), lambda m: m.id, "t:c")
    answers, link, conn, _ = ledger(gate)
    msgs = chunk(link, 0, 2)
    assert gate.claim(msgs, 60_000, link.address) == (msgs, [], [])
    answers.hand_over(link, msgs)
    answers.settle_chunk(link, msgs, False)  # requeued: released
    again = chunk(link, 0, 2)  # redelivered: handled again, not duplicates nor held
    assert gate.claim(again, 60_000, link.address) == (again, [], [])
    answers.hand_over(link, again)
    answers.settle_chunk(link, again, True)  # finished: committed
    third = chunk(link, 0, 2)
    assert gate.claim(third, 60_000, link.address) == ([], third, [])
    assert gate.duplicates == 2 and gate.held == 0


def test_a_failing_deduplicator_lets_the_chunk_through(caplog: pytest.LogCaptureFixture) -> None:
    class Broken:
        def check_and_set(self, key: Any) -> bool:
            raise ConnectionError("redis is down")

        def erase(self, key: Any) -> None:
            raise ConnectionError("redis is down")

    gate = DedupGate.build(Broken(), "id", "t:c")
    assert gate is not None
    _, link, _, _ = ledger()
    msgs = chunk(link, 0, 3)
    assert gate.claim(msgs, 60_000, link.address) == (msgs, [], [])
    assert "dedup claim failed" in caplog.text
    gate.commit_many(msgs)
    gate.flush()  # logged, not raised: the FINs go out anyway
    assert "dedup commit failed" in caplog.text


def test_the_lifecycle_only_moves_forward() -> None:
    life = Lifecycle()
    assert (life.phase, life.closing, life.closed) == (Phase.RUNNING, False, False)
    life.begin_closing()
    assert (life.phase, life.closing, life.closed) == (Phase.CLOSING, True, False)
    life.finish_closing()
    life.begin_closing()  # too late: stays closed
    assert (life.phase, life.closing, life.closed) == (Phase.CLOSED, True, True)


# -- shape: no two consumer parts reference each other ------------------------------------------

CONSUMER = nsq_spark._consumer.__name__


def consumer_edges() -> dict[str, set[str]]:
    """consumer part -> the consumer parts it imports, ``TYPE_CHECKING`` ones included: the
    consumer's slice of tests/test_structure.py's import graph (one walker, not two)."""
    graph = import_graph()
    parts = {m for m in graph if m.startswith(CONSUMER + ".")}
    return {m.rpartition(".")[2]: {t.rpartition(".")[2] for t in graph[m] & parts}
            for m in parts}


def test_the_walk_sees_type_checking_edges() -> None:
    edges = consumer_edges()
    assert "answers" in edges["intake"]  # under TYPE_CHECKING only
    assert "dedup_gate" in edges["answers"]


def test_no_cycle_among_the_consumers_parts_type_level_included() -> None:
    edges = consumer_edges()
    cyclic = cycles(edges)
    assert cyclic == [], {m: sorted(edges[m]) for c in cyclic for m in c}


def test_nothing_in_the_consumer_imports_a_compatibility_shim() -> None:
    files = module_files()
    through_shims = sorted(
        f"{mod} imports {target}{'.' + name if name else ''}"
        for mod, path in files.items() if mod == CONSUMER or mod.startswith(CONSUMER + ".")
        for target, name in imported_names(mod, path, files)
        if target in SHIMS or name in USER_REEXPORTS.get(target, {}))
    assert {"nsq_spark.reader", "nsq_spark.rdy", "nsq_spark.backoff"} <= set(SHIMS)
    assert through_shims == []
