"""Faults with real processes: kill -9 and restart of an nsqd mid-stream, SIGSTOP/SIGCONT
(missed heartbeats), and through lookupd. In every case each published body is handled at
least once (checked by content)."""

from __future__ import annotations

import logging
import time

import pytest

from nsq_spark import Reader
from nsq_spark.testing import NSQCluster, publish

pytestmark = [pytest.mark.nsqd, pytest.mark.slow, pytest.mark.timeout(90)]

T, C = "ft", "fc"

# fsync nsqd's disk queues every 50 ms so a kill -9 loses nothing published before it
DURABLE = {"mem_queue_size": 0, "sync_timeout": "50ms"}


def bodies(n: int, prefix: str) -> list[bytes]:
    return [f"{prefix}-{i}".encode() for i in range(n)]


def pull_until(r: Reader, want: set[bytes], got: set[bytes], timeout: float,
               on_batch=None) -> None:
    deadline = time.monotonic() + timeout
    while not want <= got and time.monotonic() < deadline:
        batch = r.get_batch(max_messages=50, timeout=0.2)
        for m in batch:
            got.add(m.body)
        if batch:
            time.sleep(0.002 * len(batch))  # a slow consumer: nsqd has little in flight
            r.finish(batch)
        if on_batch is not None:
            on_batch(len(got))


def test_kill_9_and_restart_nsqd_mid_stream():
    with NSQCluster(nsqd=2, lookupd=0, **DURABLE) as cluster:
        sent0, sent1 = bodies(400, "k0"), bodies(400, "k1")
        publish(cluster.nsqd_http_addresses[0], T, sent0)
        publish(cluster.nsqd_http_addresses[1], T, sent1)
        time.sleep(0.2)  # past one sync period: on disk
        got: set[bytes] = set()
        killed = []

        def maybe_kill(n: int) -> None:
            if not killed and n >= 200:
                cluster.kill(0)
                killed.append(n)

        with Reader(T, C, nsqd_tcp_addresses=cluster.nsqd_tcp_addresses, max_in_flight=20,
                    reconnect_initial=0.2, reconnect_max=1.0, msg_timeout=2) as r:
            pull_until(r, set(sent0) | set(sent1), got, 8, maybe_kill)
            assert killed, "nsqd 0 was never killed"
            # nsqd 1 keeps flowing while nsqd 0 is down
            assert set(sent1) <= got or len(got) > killed[0]
            cluster.restart(0)
            pull_until(r, set(sent0) | set(sent1), got, 30)
        missing = (set(sent0) | set(sent1)) - got
        assert not missing, f"{len(missing)} bodies never handled, e.g. {sorted(missing)[:5]}"
        cluster.wait_drained(T, C, timeout=10)


def test_sigstop_nsqd_heartbeats_missed_then_reconnected(caplog):
    caplog.set_level(logging.WARNING)
    with NSQCluster(nsqd=1, lookupd=0) as cluster:
        sent = bodies(300, "s")
        publish(cluster.nsqd_http_addresses[0], T, sent)
        got: set[bytes] = set()
        with Reader(T, C, nsqd_tcp_addresses=cluster.nsqd_tcp_addresses, max_in_flight=10,
                    heartbeat_interval=1, msg_timeout=2, response_timeout=1.0,
                    reconnect_initial=0.2, reconnect_max=1.0) as r:
            pull_until(r, set(sent), got, 10)
            # more messages, a few of them in flight here when nsqd stops
            r2_sent = bodies(300, "s2")
            publish(cluster.nsqd_http_addresses[0], T, r2_sent)
            batch = r.get_batch(max_messages=5, timeout=5)
            assert batch
            cluster.stop(0)
            t0 = time.monotonic()
            # the connection must be declared dead after two missed heartbeats
            while "sent nothing for" not in caplog.text and time.monotonic() - t0 < 10:
                r.get_batch(timeout=0.2)
            assert "sent nothing for" in caplog.text
            dead_after = time.monotonic() - t0
            cluster.resume(0)
            for m in batch:  # answers for a dead connection are dropped, not raised
                got.add(m.body)
            try:
                r.finish(batch)
            except Exception as exc:  # pragma: no cover - must not happen
                raise AssertionError(f"finish after reconnect raised {exc!r}")
            pull_until(r, set(sent) | set(r2_sent), got, 30)
        assert 1.5 <= dead_after <= 6
        missing = (set(sent) | set(r2_sent)) - got
        assert not missing, f"{len(missing)} bodies never handled"
        cluster.wait_drained(T, C, timeout=10)


def test_lookupd_discovered_nsqd_killed_and_restarted():
    with NSQCluster(nsqd=2, lookupd=1, **DURABLE) as cluster:
        sent0, sent1 = bodies(300, "l0"), bodies(300, "l1")
        publish(cluster.nsqd_http_addresses[0], T, sent0)
        publish(cluster.nsqd_http_addresses[1], T, sent1)
        time.sleep(0.2)
        got: set[bytes] = set()
        killed = []

        def maybe_kill(n: int) -> None:
            if not killed and n >= 150:
                cluster.kill(1)
                killed.append(n)

        with Reader(T, C, lookupd_http_addresses=cluster.lookupd_http_addresses,
                    max_in_flight=20, lookupd_poll_interval=0.5, msg_timeout=2) as r:
            pull_until(r, set(sent0) | set(sent1), got, 8, maybe_kill)
            assert killed
            cluster.restart(1)  # re-registers with lookupd; found by the next poll
            pull_until(r, set(sent0) | set(sent1), got, 30)
            st = r.stats()
        missing = (set(sent0) | set(sent1)) - got
        assert not missing, f"{len(missing)} bodies never handled"
        assert len(st["connections"]) == 2
        cluster.wait_drained(T, C, timeout=10)
        assert cluster.nsqds[1].channel_stats(T, C)["client_count"] == 0
