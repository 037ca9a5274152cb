"""The publish spool's promise under connection-level faults (issue #22, 1): an auth
server that goes away for a few seconds, the spool pointed at nsqd's HTTP port, a TLS
certificate that does not verify. None of these is nsqd refusing a message, so every
case must end with 0 messages in ``rejected/``, ``flush()`` never saying delivered while
sending fails, ``stats()["health"] == "failing"`` with the cause during the fault, and --
once the fault ends -- every message on nsqd exactly once (nsqd's own count and a
Reader's)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from chaos_helpers import C, T, assert_zero_loss, bodies, consume, create_channel
from conn_tls_helpers import auth_server, make_certs
from nsq_spark import Producer
from nsq_spark._consumer.reader import Reader
from nsq_spark.testing import NSQCluster

pytestmark = [pytest.mark.chaos, pytest.mark.nsqd, pytest.mark.timeout(90)]

SECRET = "spool-secret-41c7"
# a short TTL: nsqd asks the auth server again 2 s after each AUTH, on the next PUB
GRANTS = {SECRET: {"ttl": 2, "identity": "spool", "authorizations": [
    {"topic": ".*", "channels": [".*"], "permissions": ["subscribe", "publish"]}]}}
SPOOL = dict(spool_fsync="never", batch_size=100, retry_max_wait=0.3, rescan_interval=0.2)


def topic_count(cluster: NSQCluster) -> int:
    for t in cluster.nsqds[0].stats(T).get("topics", []):
        if t["topic_name"] == T:
            return int(t["message_count"])
    return 0


def assert_failing(p: Producer, spool: Path, cause: str, errors_seen: list[Any]) -> dict:
    """During the fault: flush() does not say delivered, the health says why, nothing
    was diverted to rejected/."""
    assert not p.flush(1.0), "flush() said delivered while nsqd did not take the messages"
    st = p.stats()
    assert st["health"] == "failing", st
    assert cause.lower() in (st["last_error"] or "").lower(), st["last_error"]
    assert st["failing_since"] is not None and st["consecutive_failures"] >= 1
    assert st["rejected"] == 0 and st["spool_pending"] > 0
    assert not (spool / "rejected").exists() or not any((spool / "rejected").iterdir())
    assert errors_seen, "on_error was not called"
    return st


def read_back(cluster: NSQCluster, sent: list[bytes], what: str, **reader: Any) -> None:
    """Every message on nsqd exactly once: nsqd's count, then a Reader's."""
    assert topic_count(cluster) == len(sent), \
        f"nsqd holds {topic_count(cluster)} messages, {len(sent)} were published"
    with Reader(T, C, nsqd_tcp_addresses=cluster.nsqd_tcp_addresses, max_in_flight=500,
                msg_timeout=5, **reader) as r:
        counts = consume(r, set(sent), cluster, timeout=25)
    assert assert_zero_loss(set(sent), counts, what, cluster) == 0


def test_spool_rides_out_an_auth_server_outage(toxiproxy, tmp_path):
    """Issue #22: an auth server down for 5 s (TTL 2 s) diverted 1,959 of 5,000."""
    spool = tmp_path / "spool"
    sent = bodies(3000, "auth-outage")
    errors_seen: list[BaseException] = []
    with auth_server(GRANTS) as auth:
        proxy = toxiproxy.create_proxy("auth", upstream=auth.address)
        with NSQCluster(nsqd=1, lookupd=0, auth_http_address=proxy.listen) as cluster:
            create_channel(cluster.nsqd_http_addresses[0])
            with Producer(cluster.nsqd_tcp_addresses[0], spool_dir=spool,
                          auth_secret=SECRET, on_error=errors_seen.append, **SPOOL) as p:
                p.mpublish(T, sent[:1000])
                assert p.flush(20) and p.stats()["health"] == "ok"
                proxy.set_enabled(False)         # the auth server is unreachable
                time.sleep(2.2)                  # the TTL passes: nsqd asks again
                for i in range(1000, 2000, 100):  # accepted during the outage
                    p.mpublish(T, sent[i:i + 100])
                    time.sleep(0.05)
                st = assert_failing(p, spool, "AUTH", errors_seen)
                proxy.set_enabled(True)          # back after ~4 s
                p.mpublish(T, sent[2000:])
                assert p.flush(30), f"not delivered after the outage: {p.stats()}"
                end = p.stats()
            assert end["health"] == "ok" and end["rejected"] == 0
            assert end["acked"] == end["appended"] == len(sent)
            print(f"\n[chaos] spool, auth outage: {st['consecutive_failures']} failed "
                  f"attempts, last error {st['last_error']!r}")
            read_back(cluster, sent, "spool, auth server outage", auth_secret=SECRET)


def test_spool_pointed_at_the_http_port_keeps_everything_until_corrected(
        nsq_cluster, toxiproxy, tmp_path):
    """Issue #22: the nsqd HTTP port given by mistake diverted 5 of 5."""
    spool = tmp_path / "spool"
    proxy = toxiproxy.create_proxy("nsqd", upstream=nsq_cluster.nsqd_http_addresses[0])
    create_channel(nsq_cluster.nsqd_http_addresses[0])
    sent = bodies(500, "wrong-port")
    errors_seen: list[BaseException] = []
    with Producer(proxy.listen, spool_dir=spool, on_error=errors_seen.append,
                  **SPOOL) as p:
        for i in range(0, 500, 50):
            p.mpublish(T, sent[i:i + 50])
        time.sleep(0.5)
        st = assert_failing(p, spool, "", errors_seen)
        assert p.stats()["spool_pending"] == 500
        proxy.set_upstream(nsq_cluster.nsqd_tcp_addresses[0])   # corrected
        assert p.flush(30), f"not delivered after the correction: {p.stats()}"
        end = p.stats()
    assert (end["rejected"], end["acked"], end["health"]) == (0, 500, "ok")
    print(f"\n[chaos] spool, wrong port: {st['consecutive_failures']} failed attempts, "
          f"last error {st['last_error']!r}")
    read_back(nsq_cluster, sent, "spool, wrong port then corrected")


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory):
    return make_certs(tmp_path_factory.mktemp("certs"))


def test_spool_keeps_everything_while_the_tls_certificate_does_not_verify(certs, tmp_path):
    """Issue #22: a certificate that does not verify diverted 1 of 1. No proxy needed: the
    fault ends when a producer with the right CA takes the spool over."""
    spool = tmp_path / "spool"
    sent = bodies(300, "tls")
    errors_seen: list[BaseException] = []
    with NSQCluster(nsqd=1, lookupd=0, tls_cert=str(certs.server_cert),
                    tls_key=str(certs.server_key), tls_required="tcp-https") as cluster:
        create_channel(cluster.nsqd_http_addresses[0])
        addr = cluster.nsqd_tcp_addresses[0]
        p = Producer(addr, spool_dir=spool, tls_v1=True, tls_ca_file=str(certs.other_ca),
                     on_error=errors_seen.append, **SPOOL)
        try:
            p.mpublish(T, sent[:200])
            p.publish(T, sent[200])
            for body in sent[201:]:
                p.publish(T, body)
            st = assert_failing(p, spool, "certificate", errors_seen)
        finally:
            p.close(timeout=0)   # what is not delivered stays on disk
        with Producer(addr, spool_dir=spool, tls_v1=True, tls_ca_file=str(certs.ca),
                      **SPOOL) as p:
            assert p.flush(30), f"the leftovers were not delivered: {p.stats()}"
            end = p.stats()
        assert (end["rejected"], end["acked"], end["orphans_claimed"]) == (0, 300, 1)
        print(f"\n[chaos] spool, TLS verify failure: {st['consecutive_failures']} failed "
              f"attempts, last error {st['last_error']!r}")
        read_back(cluster, sent, "spool, TLS verify failure then fixed", tls_v1=True,
                  tls_ca_file=str(certs.ca))
