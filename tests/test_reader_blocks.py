"""The Reader's block pull API (get_blocks / finish_blocks / requeue_blocks) against a real
nsqd: exactly-once draining, requeue, max_messages, mode and answer errors, close() giving
back unanswered blocks, max_tries, and close() waiting out the message nsqd sends after
CLOSE_WAIT (checked on nsqd's own in-flight count)."""

from __future__ import annotations

import time

import pytest

from nsq_spark.errors import AlreadyRespondedError, ConfigError, NSQError
from nsq_spark.protocol import FrameDecoder, MessageBlock, encode_message_frame
from nsq_spark import Reader
from nsq_spark.testing import publish, wait_until

pytestmark = [pytest.mark.nsqd, pytest.mark.timeout(90)]

C = "bc"


def bodies(n: int, prefix: str = "m") -> list[bytes]:
    return [f"{prefix}{i}".encode() for i in range(n)]


def pull_all(r: Reader, n: int, timeout: float = 15.0, **kw) -> list[MessageBlock]:
    """get_blocks until ``n`` messages came (unanswered)."""
    got: list[MessageBlock] = []
    deadline = time.monotonic() + timeout
    while sum(map(len, got)) < n:
        assert time.monotonic() < deadline, f"only {sum(map(len, got))} of {n} messages came"
        got += r.get_blocks(timeout=0.5, **kw)
    return got


def msgs(blocks: list[MessageBlock]):
    return [m for b in blocks for m in b.messages()]


def wait_client_finished(cluster, topic: str, n: int) -> None:
    """Wait until nsqd counts ``n`` FINs from the channel's connected clients (nsqd keeps
    finish counts per client only: read them before the Reader closes)."""
    def count() -> int:
        return sum(cl["finish_count"] for cl in cluster.nsqds[0].channel_stats(topic, C)["clients"])
    wait_until(lambda: count() == n, 5, f"nsqd counting {n} FINs")
    assert count() == n


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_get_blocks_and_finish_blocks_drain_every_body_once(nsq_cluster):
    topic = "bt_drain"
    sent = bodies(3000)
    publish(nsq_cluster.nsqd_http_addresses[0], topic, sent)
    address = nsq_cluster.nsqd_tcp_addresses[0]
    got: list[bytes] = []
    with Reader(topic, C, nsqd_tcp_addresses=[address], max_in_flight=500) as r:
        deadline = time.monotonic() + 20
        while len(got) < len(sent) and time.monotonic() < deadline:
            blocks = r.get_blocks(max_messages=1000, timeout=0.5)
            assert sum(map(len, blocks)) <= 1000
            for b in blocks:
                assert isinstance(b, MessageBlock) and b.nsqd_address == address
                assert b.attempts() == [1] * len(b)
                assert all(len(i) == 16 for i in b.ids())
            got += [m.body for m in msgs(blocks)]
            r.finish_blocks(blocks)
        # nothing more is coming: everything was handed out once
        assert r.get_blocks(timeout=0.3) == []
        wait_client_finished(nsq_cluster, topic, 3000)
        st = r.stats()
    assert sorted(got) == sorted(sent) and len(set(got)) == len(sent)
    assert st["finished"] == 3000 and st["messages_received"] == 3000
    assert st["requeued"] == 0
    nsq_cluster.wait_drained(topic, C)
    c = nsq_cluster.nsqds[0].channel_stats(topic, C)
    assert c["message_count"] == 3000 and c["requeue_count"] == 0 and c["timeout_count"] == 0


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_requeue_blocks_brings_the_same_ids_back_with_attempts_2(nsq_cluster):
    topic = "bt_req"
    publish(nsq_cluster.nsqd_http_addresses[0], topic, bodies(40))
    with Reader(topic, C, nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses,
                max_in_flight=100, max_backoff_duration=0) as r:
        first = pull_all(r, 40)
        firsts = {m.id: m.body for m in msgs(first)}
        assert len(firsts) == 40 and {m.attempts for m in msgs(first)} == {1}
        r.requeue_blocks(first, delay_ms=0)
        again = pull_all(r, 40)
        seconds = {m.id: m.body for m in msgs(again)}
        assert seconds == firsts  # same ids, same bodies
        assert [a for b in again for a in b.attempts()] == [2] * 40
        assert all(b.max_attempts == 2 for b in again)
        r.finish_blocks(again)
        assert r.get_blocks(timeout=0.3) == []
        wait_client_finished(nsq_cluster, topic, 40)
        st = r.stats()
    assert st["requeued"] == 40 and st["finished"] == 40
    nsq_cluster.wait_drained(topic, C)
    c = nsq_cluster.nsqds[0].channel_stats(topic, C)
    assert c["requeue_count"] == 40 and c["timeout_count"] == 0


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_max_messages_splits_blocks(nsq_cluster):
    topic = "bt_max"
    sent = bodies(1000)
    publish(nsq_cluster.nsqd_http_addresses[0], topic, sent)
    got: list[bytes] = []
    sizes: list[int] = []
    with Reader(topic, C, nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses,
                max_in_flight=500) as r:
        deadline = time.monotonic() + 20
        while len(got) < len(sent) and time.monotonic() < deadline:
            blocks = r.get_blocks(max_messages=7, timeout=0.5)
            n = sum(map(len, blocks))
            assert n <= 7 and all(len(b) >= 1 for b in blocks)
            sizes.append(n)
            got += [m.body for m in msgs(blocks)]
            r.finish_blocks(blocks)
    assert sorted(got) == sorted(sent)
    # nsqd sends far more than 7 messages per read: most calls got a full, split share
    assert sizes.count(7) >= 100
    nsq_cluster.wait_drained(topic, C)


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_modes_do_not_mix_and_dedup_is_refused(nsq_cluster):
    from nsq_spark.dedup import OppositeBloomFilter

    topic = "bt_mode"
    addrs = nsq_cluster.nsqd_tcp_addresses
    publish(nsq_cluster.nsqd_http_addresses[0], topic, bodies(5))
    with Reader(topic, C, nsqd_tcp_addresses=addrs, max_in_flight=10) as r:
        blocks = pull_all(r, 1)
        with pytest.raises(NSQError, match="get_blocks"):
            r.get_batch(timeout=0.1)
        with pytest.raises(NSQError):
            r.start()  # the message mode: refused as well
        r.start(blocks=True)  # the mode chosen: fine
        r.finish_blocks(blocks)
    with Reader(topic, C, nsqd_tcp_addresses=addrs, max_in_flight=10) as r:
        r.get_batch(timeout=0.1)
        with pytest.raises(NSQError, match="MessageBlocks"):
            r.get_blocks(timeout=0.1)
    r = Reader(topic, C, nsqd_tcp_addresses=addrs, dedup=OppositeBloomFilter(1 << 10))
    try:
        with pytest.raises(NSQError, match="dedup"):
            r.get_blocks(timeout=0.1)
        with pytest.raises(NSQError, match="dedup"):
            r.start(blocks=True)
    finally:
        r.close()
    r = Reader(topic, C, batch_handler=lambda ms: True, nsqd_tcp_addresses=addrs)
    with pytest.raises(NSQError, match="get_blocks"):
        r.get_blocks()
    r.close()
    with pytest.raises(ValueError):
        Reader(topic, C, nsqd_tcp_addresses=addrs).get_blocks(max_messages=0)


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_answering_twice_or_a_foreign_block_raises(nsq_cluster):
    topic = "bt_twice"
    publish(nsq_cluster.nsqd_http_addresses[0], topic, bodies(20))
    publish(nsq_cluster.nsqd_http_addresses[0], topic + "_other", bodies(1))
    addrs = nsq_cluster.nsqd_tcp_addresses
    with Reader(topic, C, nsqd_tcp_addresses=addrs, max_in_flight=50,
                max_backoff_duration=0) as r, \
            Reader(topic + "_other", C, nsqd_tcp_addresses=addrs, max_in_flight=50) as other:
        blocks = pull_all(r, 20)
        foreign = pull_all(other, 1)
        first, rest = blocks[:1], blocks[1:]
        r.finish_blocks(first)
        with pytest.raises(AlreadyRespondedError):
            r.finish_blocks(first)
        with pytest.raises(AlreadyRespondedError):
            r.requeue_blocks(first, delay_ms=0)
        # a call holding an answered block sends nothing of the others either
        with pytest.raises(AlreadyRespondedError):
            r.finish_blocks(rest + first)
        with pytest.raises(NSQError, match="not delivered by this Reader"):
            r.finish_blocks(foreign)
        hand_made = FrameDecoder().feed_blocks(encode_message_frame(b"0" * 16, b"x"))[0]
        with pytest.raises(NSQError, match="not delivered by this Reader"):
            r.requeue_blocks(hand_made)
        r.finish_blocks(rest)  # still unanswered: accepted
        other.finish_blocks(foreign)
        r.finish_blocks([])  # nothing: nothing to do
        wait_client_finished(nsq_cluster, topic, 20)
        st = r.stats()
    assert st["finished"] == 20
    nsq_cluster.wait_drained(topic, C)
    c = nsq_cluster.nsqds[0].channel_stats(topic, C)
    assert c["requeue_count"] == 0 and c["timeout_count"] == 0


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_close_requeues_pulled_unanswered_blocks(nsq_cluster):
    topic = "bt_close"
    publish(nsq_cluster.nsqd_http_addresses[0], topic, bodies(300))
    r = Reader(topic, C, nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses,
               max_in_flight=100, msg_timeout=60)
    blocks = pull_all(r, 60, max_messages=60)
    finished, kept = blocks[:1], blocks[1:]
    n_fin = len(finished[0])
    r.finish_blocks(finished)
    wait_client_finished(nsq_cluster, topic, n_fin)
    r.close()
    assert r.closed
    wait_until(lambda: nsq_cluster.nsqds[0].channel_stats(topic, C)["message_count"] == 300, 5,
               "every message in the channel")
    c = nsq_cluster.nsqds[0].channel_stats(topic, C)
    # given back at close, not left in flight until msg_timeout (60 s)
    assert c["in_flight_count"] == 0 and c["client_count"] == 0, c
    assert c["requeue_count"] >= sum(map(len, kept))
    assert c["depth"] == 300 - n_fin and c["timeout_count"] == 0
    with pytest.raises(NSQError):
        r.finish_blocks(kept)
    # the requeued messages come back to the next Reader
    with Reader(topic, C, nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses,
                max_in_flight=300) as r2:
        again = pull_all(r2, 300 - n_fin)
        assert {m.id for m in msgs(kept)} <= {m.id for m in msgs(again)}
        assert len({m.id for m in msgs(again)}) == 300 - n_fin
        r2.finish_blocks(again)
    nsq_cluster.wait_drained(topic, C)


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_max_tries_with_blocks_gives_up_and_finishes(nsq_cluster):
    topic = "bt_tries"
    http = nsq_cluster.nsqd_http_addresses[0]
    doomed = bodies(10, "d")
    gave_up: list[tuple[bytes, int]] = []

    class R(Reader):
        def giving_up(self, message):
            gave_up.append((message.body, message.attempts))

    handed: list[tuple[bytes, int]] = []
    publish(http, topic, doomed)
    with R(topic, C, nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses, max_tries=2,
           max_in_flight=100, max_backoff_duration=0) as r:
        for attempt in (1, 2):
            blocks = pull_all(r, 10)
            handed += [(m.body, m.attempts) for m in msgs(blocks)]
            if attempt == 2:
                # fresh messages queued just before the third delivery of the doomed
                # ones: they share reads (and blocks) with messages over max_tries
                publish(http, topic, bodies(30, "f"))
            r.requeue_blocks(blocks, delay_ms=0)
        deadline = time.monotonic() + 10
        fresh: list[bytes] = []
        while (len(fresh) < 30 or len(gave_up) < 10) and time.monotonic() < deadline:
            blocks = r.get_blocks(timeout=0.2)
            for m in msgs(blocks):
                handed.append((m.body, m.attempts))
                fresh.append(m.body)
            r.finish_blocks(blocks)
        wait_client_finished(nsq_cluster, topic, 40)  # 30 fresh + 10 given up
        st = r.stats()
    assert sorted(gave_up) == sorted((b, 3) for b in doomed)
    assert sorted(fresh) == sorted(bodies(30, "f"))
    # the doomed were handed out at attempts 1 and 2 only; never a 3rd time
    assert sorted(handed) == sorted([(b, 1) for b in doomed] + [(b, 2) for b in doomed]
                                    + [(b, 1) for b in bodies(30, "f")])
    assert st["given_up"] == 10
    nsq_cluster.wait_drained(topic, C)
    c = nsq_cluster.nsqds[0].channel_stats(topic, C)
    assert c["requeue_count"] == 20 and c["timeout_count"] == 0


ROUNDS = 60


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_close_while_nsqd_is_sending_leaves_nothing_in_flight(nsq_cluster):
    """nsqd's message pump may send a message after CLOSE_WAIT; close() reads on until the
    connection is quiet and requeues it. Without that, the message stays in flight on nsqd
    until msg_timeout (60 s here), and the short poll below fails. It is a race: each round
    closes while nsqd is filling a 2500-message window (without the fix, about one round
    in 15 leaves a message in flight on this machine). max_tries=0: the messages requeued
    at each close come back with more attempts, and must not be given up (FINished)."""
    topic = "bt_quiet"
    http = nsq_cluster.nsqd_http_addresses[0]
    handled = 0
    for round_ in range(ROUNDS):
        publish(http, topic, bodies(3000, f"r{round_}-"))
        r = Reader(topic, C, nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses,
                   max_in_flight=2500, msg_timeout=60, max_tries=0)
        try:
            for _ in range(2):
                blocks = r.get_blocks(max_messages=200, timeout=5)
                assert blocks
                handled += sum(map(len, blocks))
                r.finish_blocks(blocks)
        finally:
            r.close()

        def settled():
            c = nsq_cluster.nsqds[0].channel_stats(topic, C)
            return c if c["in_flight_count"] == 0 and c["client_count"] == 0 else None
        try:
            wait_until(settled, 1.0, "nothing in flight after close")
        except AssertionError:
            c = nsq_cluster.nsqds[0].channel_stats(topic, C)
            raise AssertionError(f"round {round_}: {c['in_flight_count']} messages left in "
                                 f"flight after close(): {c}") from None
    # every message published has reached the channel (the topic copies them over
    # asynchronously); then nothing lost, nothing timed out: what was not finished is back
    # in the queue
    total = ROUNDS * 3000
    wait_until(lambda: nsq_cluster.nsqds[0].channel_stats(topic, C)["message_count"] == total, 10,
               "every message in the channel")
    c = nsq_cluster.nsqds[0].channel_stats(topic, C)
    assert c["timeout_count"] == 0 and c["in_flight_count"] == 0
    assert c["depth"] == total - handled


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_requeue_blocks_default_delay_follows_the_requeue_policy(nsq_cluster):
    """delay_ms=None: each message gets the policy's delay (requeue_delay * attempts), so
    nsqd holds them deferred instead of handing them straight back."""
    topic = "bt_defer"
    publish(nsq_cluster.nsqd_http_addresses[0], topic, bodies(25))
    with Reader(topic, C, nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses,
                max_in_flight=50, requeue_delay=60, max_backoff_duration=0) as r:
        blocks = pull_all(r, 25)
        r.requeue_blocks(blocks, backoff=False)
        wait_until(lambda: nsq_cluster.nsqds[0].channel_stats(topic, C)["deferred_count"] == 25, 5,
                   "25 deferred messages")
        assert r.get_blocks(timeout=0.3) == []  # not back yet: deferred for 60 s
        st = r.stats()
    assert st["requeued"] == 25
    c = nsq_cluster.nsqds[0].channel_stats(topic, C)
    assert c["deferred_count"] == 25 and c["in_flight_count"] == 0 and c["depth"] == 0
    assert c["requeue_count"] == 25


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_get_blocks_stops_at_the_message_that_reaches_max_bytes(nsq_cluster):
    """A byte share (the Spark source's maxBytesPerTrigger): the body that reaches
    ``max_bytes`` is the last one taken, the rest stay queued in order."""
    topic = "bt_bytes"
    sent = [b"%03d" % i + b"x" * 97 for i in range(50)]  # 100 bytes each
    publish(nsq_cluster.nsqd_http_addresses[0], topic, sent)
    with Reader(topic, C, nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses,
                max_in_flight=50) as r:
        start = r.get_blocks(max_messages=1, timeout=5)  # starts the Reader
        assert [m.body for m in msgs(start)] == sent[:1]
        wait_until(lambda: r.stats()["pull_queued"] == 49, 10, "the other 49 queued")
        first = r.get_blocks(max_messages=1000, timeout=1, max_bytes=250)
        assert [m.body for m in msgs(first)] == sent[1:4]  # 200 < 250 <= 300
        one = r.get_blocks(max_messages=1000, timeout=1, max_bytes=1)
        assert [m.body for m in msgs(one)] == sent[4:5]  # at least one message
        rest = r.get_blocks(max_messages=1000, timeout=1)
        assert [m.body for m in msgs(rest)] == sent[5:]
        r.finish_blocks(start + first + one + rest)
        with pytest.raises(ConfigError, match="max_bytes"):
            r.get_blocks(max_messages=10, timeout=0, max_bytes=0)
        wait_client_finished(nsq_cluster, topic, 50)
    nsq_cluster.wait_drained(topic, C)


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0, msg_timeout="4s")
def test_stats_show_the_msg_timeout_nsqd_negotiated(nsq_cluster):
    with Reader("bt_timeout", C, nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses) as r:
        assert r.get_blocks(timeout=0.5) == []  # starts the Reader
        wait_until(lambda: r.stats()["connections"] and all(
            c["msg_timeout"] for c in r.stats()["connections"].values()), 10, "subscribed")
        assert [c["msg_timeout"] for c in r.stats()["connections"].values()] == [4000]
