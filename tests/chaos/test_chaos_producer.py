"""A Producer behind a real Toxiproxy (TCP, and one HTTP case): resets, fragments with
latency, a black-holed connection. Every publish call must either succeed or raise a
typed error (:class:`nsq_spark.errors.NSQError`); the test publishes again what failed,
as an application would. Then a Reader straight on nsqd (around the proxy) must find
exactly the published set: nothing lost, nothing made up (a retried publish whose first
attempt did reach nsqd may be stored twice: counted and printed)."""

from __future__ import annotations

import concurrent.futures
import time
from collections import Counter
from typing import Callable, Sequence

import pytest

from chaos_helpers import C, T, assert_zero_loss, bodies, consume, create_channel
from nsq_spark.errors import NSQError, NSQTimeoutError
from nsq_spark import Producer
from nsq_spark._consumer.reader import Reader
from nsq_spark.testing.chaos import inject_periodically

pytestmark = [pytest.mark.chaos, pytest.mark.nsqd, pytest.mark.slow, pytest.mark.timeout(60)]

PRODUCER = dict(max_tries=3, retry_wait=0.02, retry_max_wait=0.2, retry_deadline=3.0,
                publish_timeout=2.0)


class Outcome:
    """Failures seen by the application: typed ones by class name, anything else kept
    whole (an untyped error escaping the Producer is a bug)."""

    def __init__(self) -> None:
        self.typed: Counter[str] = Counter()
        self.untyped: list[BaseException] = []

    def record(self, exc: BaseException) -> None:
        if isinstance(exc, NSQError):
            self.typed[type(exc).__name__] += 1
        else:
            self.untyped.append(exc)

    def check(self) -> None:
        assert not self.untyped, ("publishing raised errors that are not NSQError: "
                                  f"{[repr(e) for e in self.untyped[:5]]}")


def publish_until_accepted(call: Callable[[], object], outcome: Outcome,
                           deadline: float) -> None:
    """Call until it succeeds; every failure is recorded, then the call is repeated."""
    while True:
        try:
            call()
            return
        except Exception as exc:  # noqa: BLE001 - classified by Outcome
            outcome.record(exc)
            if time.monotonic() > deadline:
                raise AssertionError(f"still failing at the deadline: {exc!r}") from exc
            time.sleep(0.02)


def publish_blocking(producer: Producer, sent: Sequence[bytes], outcome: Outcome,
                     pause: float, budget: float = 25.0) -> None:
    """The first third one PUB at a time, the rest in MPUBs of 20."""
    deadline = time.monotonic() + budget
    third = len(sent) // 3
    for body in sent[:third]:
        publish_until_accepted(lambda: producer.publish(T, body), outcome, deadline)
        time.sleep(pause)
    for i in range(third, len(sent), 20):
        chunk = list(sent[i:i + 20])
        publish_until_accepted(lambda: producer.mpublish(T, chunk), outcome, deadline)
        time.sleep(pause * 5)


def read_back(cluster, sent: Sequence[bytes], what: str, outcome: Outcome,
              **figures: object) -> None:
    """A Reader straight on nsqd must find exactly the published set."""
    with Reader(T, C, nsqd_tcp_addresses=cluster.nsqd_tcp_addresses, max_in_flight=500,
                msg_timeout=5) as reader:
        counts = consume(reader, set(sent), cluster, timeout=25)
    assert_zero_loss(set(sent), counts, what, cluster,
                     publish_errors=dict(outcome.typed) or 0, **figures)
    outcome.check()


def test_blocking_producer_loses_nothing_when_its_connection_is_reset_again_and_again(
        nsq_cluster, toxiproxy):
    proxy = toxiproxy.create_proxy("nsqd_tcp", upstream=nsq_cluster.nsqd_tcp_addresses[0])
    create_channel(nsq_cluster.nsqd_http_addresses[0])
    sent = bodies(3000, "pub-reset")
    outcome = Outcome()
    with Producer(proxy.listen, **PRODUCER) as producer, \
            inject_periodically(proxy, "reset_peer", every=0.2, hold=0.05, count=12,
                                streams=("downstream", "upstream"), timeout=0) as faults:
        publish_blocking(producer, sent, outcome, pause=0.002)
        retries = producer.stats()["retries"]
    assert faults.injected >= 4, f"only {faults.injected} resets during the publishing"
    read_back(nsq_cluster, sent, "producer (blocking), reset_peer", outcome,
              resets=faults.injected, retried_inside=retries)


def test_futures_producer_loses_nothing_when_its_connection_is_reset_again_and_again(
        nsq_cluster, toxiproxy):
    """publish_async keeps many PUBs in flight on one pipelined connection: a reset fails
    some of them at once; their bodies go out again in the next wave."""
    proxy = toxiproxy.create_proxy("nsqd_tcp", upstream=nsq_cluster.nsqd_tcp_addresses[0])
    create_channel(nsq_cluster.nsqd_http_addresses[0])
    sent = bodies(4000, "pub-async")
    outcome = Outcome()
    deadline = time.monotonic() + 25
    with Producer(proxy.listen, **PRODUCER) as producer, \
            inject_periodically(proxy, "reset_peer", every=0.2, hold=0.05, count=12,
                                streams=("downstream", "upstream"), timeout=0) as faults:
        pending = list(sent)
        while pending and time.monotonic() < deadline:
            retry: list[bytes] = []
            for i in range(0, len(pending), 100):
                wave = pending[i:i + 100]
                futures = {producer.publish_async(T, b): b for b in wave}
                for fut in concurrent.futures.as_completed(futures, timeout=20):
                    exc = fut.exception()
                    if exc is not None:
                        outcome.record(exc)
                        retry.append(futures[fut])
                time.sleep(0.03)
            pending = retry
        assert not pending, f"{len(pending)} bodies still failing at the deadline"
        retries = producer.stats()["retries"]
    assert faults.injected >= 4, f"only {faults.injected} resets during the publishing"
    read_back(nsq_cluster, sent, "producer (futures), reset_peer", outcome,
              resets=faults.injected, retried_inside=retries)


def test_futures_producer_loses_nothing_through_fragments_and_mid_command_cuts(
        nsq_cluster, toxiproxy):
    """Pipelined PUBs whose bytes go out in 1-7 byte pieces and whose answers come back in
    1-3 byte pieces, on connections cut after ~5 kB: answers must still be matched to the
    right commands, and every cut command failed and sent again."""
    proxy = toxiproxy.create_proxy("nsqd_tcp", upstream=nsq_cluster.nsqd_tcp_addresses[0])
    create_channel(nsq_cluster.nsqd_http_addresses[0])
    sent = bodies(3000, "pub-cut")
    outcome = Outcome()
    deadline = time.monotonic() + 25
    with proxy.toxic("slicer", "upstream", average_size=4, size_variation=3, delay=1), \
            proxy.toxic("slicer", "downstream", average_size=2, size_variation=1, delay=1), \
            Producer(proxy.listen, **PRODUCER) as producer, \
            inject_periodically(proxy, "limit_data", every=0.2, hold=0.2, count=10,
                                streams=("downstream", "upstream"), bytes=5003) as faults:
        pending = list(sent)
        while pending and time.monotonic() < deadline:
            retry: list[bytes] = []
            for i in range(0, len(pending), 200):
                futures = {producer.publish_async(T, b): b for b in pending[i:i + 200]}
                for fut in concurrent.futures.as_completed(futures, timeout=20):
                    exc = fut.exception()
                    if exc is not None:
                        outcome.record(exc)
                        retry.append(futures[fut])
            pending = retry
        assert not pending, f"{len(pending)} bodies still failing at the deadline"
        retries = producer.stats()["retries"]
    assert faults.injected >= 2, f"only {faults.injected} cuts during the publishing"
    read_back(nsq_cluster, sent, "producer (futures), slicer + limit_data", outcome,
              cuts=faults.injected, retried_inside=retries)


def test_blocking_producer_loses_nothing_when_commands_are_cut_in_half(
        nsq_cluster, toxiproxy):
    """limit_data closes connections after ~3 kB either way: PUBs and MPUBs half written,
    answers half read."""
    proxy = toxiproxy.create_proxy("nsqd_tcp", upstream=nsq_cluster.nsqd_tcp_addresses[0])
    create_channel(nsq_cluster.nsqd_http_addresses[0])
    sent = bodies(3000, "pub-half")
    outcome = Outcome()
    with Producer(proxy.listen, blocking_connections=2, **PRODUCER) as producer, \
            inject_periodically(proxy, "limit_data", every=0.1, hold=0.3, count=15,
                                streams=("downstream", "upstream"), bytes=3001) as faults:
        publish_blocking(producer, sent, outcome, pause=0.001)
        retries = producer.stats()["retries"]
    assert faults.injected >= 3, f"only {faults.injected} cuts during the publishing"
    read_back(nsq_cluster, sent, "producer (blocking), limit_data", outcome,
              cuts=faults.injected, retried_inside=retries)


def test_producer_loses_nothing_through_fragments_and_jittered_latency(
        nsq_cluster, toxiproxy):
    proxy = toxiproxy.create_proxy("nsqd_tcp", upstream=nsq_cluster.nsqd_tcp_addresses[0])
    create_channel(nsq_cluster.nsqd_http_addresses[0])
    sent = bodies(1500, "pub-slicer")
    outcome = Outcome()
    with proxy.toxic("slicer", "upstream", average_size=4, size_variation=3, delay=10), \
            proxy.toxic("slicer", "downstream", average_size=4, size_variation=3, delay=10), \
            proxy.toxic("latency", "downstream", latency=5, jitter=4), \
            Producer(proxy.listen, **PRODUCER) as producer:
        publish_blocking(producer, sent, outcome, pause=0)
    read_back(nsq_cluster, sent, "producer, slicer 1-7 bytes + latency 5+-4 ms", outcome)
    assert not outcome.typed, f"fragments alone made publishes fail: {dict(outcome.typed)}"


def test_producer_recovers_from_a_black_holed_connection(nsq_cluster, toxiproxy):
    """A stall longer than two heartbeats: publishes time out, nsqd drops the silent
    connection, and once the stall is removed publishing goes on. The Producer may absorb
    the stall in its own retries or raise a typed error; either way it must be seen."""
    proxy = toxiproxy.create_proxy("nsqd_tcp", upstream=nsq_cluster.nsqd_tcp_addresses[0])
    create_channel(nsq_cluster.nsqd_http_addresses[0])
    sent = bodies(1500, "pub-stall")
    outcome = Outcome()
    with Producer(proxy.listen, heartbeat_interval=1, connect_timeout=1,
                  **{**PRODUCER, "publish_timeout": 1.0}) as producer, \
            inject_periodically(proxy, "timeout", every=0, hold=3.0, count=1,
                                start_after=0.3, streams=("downstream", "upstream"),
                                timeout=0) as faults:
        publish_blocking(producer, sent, outcome, pause=0.003)
        retries = producer.stats()["retries"]
    assert faults.injected == 1
    read_back(nsq_cluster, sent, "producer, a stall of 3 s", outcome, retried_inside=retries)
    assert outcome.typed or retries, "no publish noticed the stall: the fault did not bite"


def test_http_producer_loses_nothing_when_its_connections_are_reset(nsq_cluster, toxiproxy):
    proxy = toxiproxy.create_proxy("nsqd_http", upstream=nsq_cluster.nsqd_http_addresses[0])
    create_channel(nsq_cluster.nsqd_http_addresses[0])
    sent = bodies(1200, "pub-http")
    outcome = Outcome()
    with Producer(nsqd_http_addresses=proxy.listen, **PRODUCER) as producer, \
            inject_periodically(proxy, "reset_peer", every=0.15, hold=0.05, count=10,
                                streams=("downstream", "upstream"), timeout=0) as faults:
        publish_blocking(producer, sent, outcome, pause=0.002)
        retries = producer.stats()["retries"]
    assert faults.injected >= 4, f"only {faults.injected} resets during the publishing"
    read_back(nsq_cluster, sent, "producer (HTTP), reset_peer", outcome,
              resets=faults.injected, retried_inside=retries)


def test_spooling_producer_delivers_everything_through_resets(nsq_cluster, toxiproxy,
                                                              tmp_path):
    """With spool_dir no publish call fails (the message is durable in the spool first);
    the drain thread keeps sending through the resets until nsqd took everything."""
    proxy = toxiproxy.create_proxy("nsqd_tcp", upstream=nsq_cluster.nsqd_tcp_addresses[0])
    create_channel(nsq_cluster.nsqd_http_addresses[0])
    sent = bodies(3000, "pub-spool")
    outcome = Outcome()
    with Producer(proxy.listen, spool_dir=tmp_path / "spool", spool_fsync="never",
                  batch_size=100) as producer, \
            inject_periodically(proxy, "reset_peer", every=0.2, hold=0.05, count=12,
                                streams=("downstream", "upstream"), timeout=0) as faults:
        publish_blocking(producer, sent, outcome, pause=0.002)
        flushed = producer.flush(timeout=30)
    assert flushed, "the spool still held messages 30 s after the last publish"
    assert not outcome.typed, f"a spooling producer raised: {dict(outcome.typed)}"
    read_back(nsq_cluster, sent, "producer (spool), reset_peer", outcome,
              resets=faults.injected)


@pytest.mark.parametrize("transport", [
    "tcp",
    "http",
])
def test_a_blocking_publish_gives_up_after_publish_timeout_when_nsqd_answers_late(
        nsq_cluster, toxiproxy, transport):
    """The documented contract: publish_timeout is how long a blocking call waits for
    its answer. nsqd's answers are delayed 1.5 s; the call must raise NSQTimeoutError
    after 0.3 s, not return OK after 1.5 s."""
    upstream = (nsq_cluster.nsqd_tcp_addresses if transport == "tcp"
                else nsq_cluster.nsqd_http_addresses)[0]
    proxy = toxiproxy.create_proxy(f"nsqd_{transport}", upstream=upstream)
    where = ({"nsqd_tcp_addresses": proxy.listen} if transport == "tcp"
             else {"nsqd_http_addresses": proxy.listen})
    with Producer(**where, max_tries=1, publish_timeout=0.3) as producer:
        producer.publish(T, b"connected before the delay")
        with proxy.toxic("latency", "downstream", latency=1500):
            started = time.monotonic()
            with pytest.raises(NSQTimeoutError):
                producer.publish(T, b"answered late")
            waited = time.monotonic() - started
    assert waited < 1.2, f"publish_timeout=0.3 but the call waited {waited:.2f}s"


def test_close_settles_every_publish_future_even_when_nsqd_went_silent(
        nsq_cluster, toxiproxy):
    """Nothing is dropped silently: a publish still waiting for nsqd's answer when the
    producer closes must end with a typed error (the application then knows to publish
    it again), never stay pending."""
    proxy = toxiproxy.create_proxy("nsqd_tcp", upstream=nsq_cluster.nsqd_tcp_addresses[0])
    producer = Producer(proxy.listen, max_tries=1)
    try:
        producer.publish_async(T, b"connected").result(timeout=5)
        proxy.add_toxic("timeout", "downstream", timeout=0)
        proxy.add_toxic("timeout", "upstream", timeout=0)
        futures = [producer.publish_async(T, b"unanswered-%d" % i) for i in range(5)]
        time.sleep(0.3)
        assert not any(f.done() for f in futures), "the stall did not hold the answers"
    finally:
        producer.close()
    done, pending = concurrent.futures.wait(futures, timeout=3)
    assert not pending, f"{len(pending)} of 5 publish futures still pending after close()"
    outcomes = ["cancelled" if f.cancelled() else type(f.exception()).__name__ for f in done]
    assert all(not f.cancelled() and isinstance(f.exception(), NSQError) for f in done), \
        f"publish futures settled without a typed error: {outcomes}"
