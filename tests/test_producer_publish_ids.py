"""The Producer's publish ids and replica options, without nsqd: every option checked and
refused with a ConfigError that names it; the body rule applied before a body is stamped;
and the spool storing the stamped body (so that its resend carries the same id). Nothing
here connects."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nsq_spark.envelope import open_body, publish_id_for
from nsq_spark.errors import ConfigError, InvalidBodyError, ReplicationError, is_transient
from nsq_spark.errors import ConnectError, BadMessageError
from nsq_spark._publish.producer import Producer
from nsq_spark.spool import Sender, read_segment, refused

pytestmark = pytest.mark.unit

ADDRS = ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]


class NullSender:
    """A spool sender that takes nothing (never called: the drain fails nothing here)."""

    def publish(self, topic: str, body: bytes, defer_ms: int | None = None) -> None:
        raise ConnectError("not connected")

    def mpublish(self, topic: str, bodies: Any) -> None:
        raise ConnectError("not connected")

    def close(self) -> None:
        return None


def null_sender() -> Sender:
    return NullSender()


def spooled_records(spool: Path) -> list[bytes]:
    return [r[1] for seg in sorted(spool.glob("*.seg")) for r in read_segment(seg).records]


# -- the options ---------------------------------------------------------------------------

def test_publish_ids_are_off_by_default_and_on_with_replicas() -> None:
    plain = Producer(ADDRS)
    replicated = Producer(ADDRS, replicas=2)
    raw = Producer(ADDRS, replicas=3, write_quorum=3, publish_ids=False)
    try:
        assert (plain.publish_ids, plain.replicas, plain.write_quorum) == (False, None, None)
        assert (replicated.publish_ids, replicated.replicas, replicated.write_quorum) == \
            (True, 2, 2)
        assert (raw.publish_ids, raw.replicas, raw.write_quorum) == (False, 3, 3)
        assert replicated.stats()["replicas"] == 2 and \
            replicated.stats()["under_replicated"] == 0
    finally:
        for p in (plain, replicated, raw):
            p.close()


@pytest.mark.parametrize("kwargs,match", [
    ({"write_quorum": 1}, "write_quorum=1 needs replicas"),
    ({"replicas": 2, "write_quorum": 3}, "write_quorum=3 is more than replicas=2"),
    ({"replicas": 4}, "replicas=4 needs at least 4 distinct nsqd addresses; 3 given"),
    ({"replicas": 0}, "replicas"),
    ({"replicas": True}, "replicas"),
    ({"replicas": 2, "write_quorum": 0}, "write_quorum"),
    ({"publish_ids": "yes"}, "publish_ids='yes'"),
])
def test_bad_replica_options_are_refused_naming_them(kwargs: dict[str, Any], match: str
                                                     ) -> None:
    with pytest.raises(ConfigError, match=match):
        Producer(ADDRS, **kwargs)


def test_replicas_count_distinct_nsqd_and_refuse_a_producer_factory(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="3 distinct nsqd addresses; 2 given"):
        Producer(ADDRS[:2] + [ADDRS[0]], replicas=3)
    with pytest.raises(ConfigError, match="drop producer_factory"):
        Producer(spool_dir=tmp_path, producer_factory=null_sender, replicas=1)
    with pytest.raises(ConfigError, match="give each nsqd once"):
        Producer(nsqd_http_addresses=["127.0.0.1:1", "http://127.0.0.1:1"], replicas=1)


def test_an_idempotency_key_without_publish_ids_is_refused_in_every_call() -> None:
    p = Producer(ADDRS[0])
    try:
        for call in (lambda: p.publish("t", b"x", idempotency_key="k"),
                     lambda: p.publish_async("t", b"x", idempotency_key="k"),
                     lambda: p.mpublish("t", [b"x"], idempotency_keys=["k"]),
                     lambda: p.mpublish_async("t", [b"x"], idempotency_keys=["k"])):
            with pytest.raises(ConfigError, match="needs publish ids: .*publish_ids=True"):
                call()
    finally:
        p.close()


@pytest.mark.parametrize("keys,match", [
    (["a"], "1 keys for 2 bodies"),
    ("ab", "give one key per body"),
    ([b"a", 7], r"idempotency_keys\[1\]: an idempotency key is bytes or str"),
    ([b"a", b""], r"idempotency_keys\[1\]: an idempotency key may not be empty"),
])
def test_bad_idempotency_keys_are_refused_naming_them(tmp_path: Path, keys: Any, match: str
                                                      ) -> None:
    p = Producer(spool_dir=tmp_path, producer_factory=null_sender, publish_ids=True)
    try:
        with pytest.raises(ConfigError, match=match):
            p.mpublish("t", [b"x", b"y"], idempotency_keys=keys)
        with pytest.raises(ConfigError, match="idempotency_key: an idempotency key is bytes"):
            p.publish("t", b"x", idempotency_key=3)  # type: ignore[arg-type]
        assert spooled_records(tmp_path) == []          # nothing spooled by a refused call
    finally:
        p.close(timeout=0)


def test_the_body_rule_applies_before_the_envelope_would_hide_an_empty_body(tmp_path: Path
                                                                           ) -> None:
    p = Producer(spool_dir=tmp_path, producer_factory=null_sender, publish_ids=True,
                 max_msg_size=30)
    try:
        with pytest.raises(InvalidBodyError, match="empty"):
            p.publish("t", b"")
        with pytest.raises(InvalidBodyError, match="#1 must be bytes, not str"):
            p.mpublish("t", [b"x", "y"])  # type: ignore[list-item]
        # the envelope (27 bytes) counts against max_msg_size: nsqd sees it
        p.publish("t", b"abc")
        with pytest.raises(InvalidBodyError, match="over the limit of 30"):
            p.publish("t", b"abcd")
    finally:
        p.close(timeout=0)


def test_the_spool_keeps_the_stamped_body_so_a_resend_carries_the_same_id(tmp_path: Path
                                                                         ) -> None:
    p = Producer(spool_dir=tmp_path, producer_factory=null_sender, publish_ids=True)
    try:
        p.publish("t", b"click")
        p.publish("t", b"click")
        p.mpublish("t", [b"a", b"b"], idempotency_keys=["k1", "k2"])
        p.publish_async("t", b"c", idempotency_key="k3").result(5)
    finally:
        p.close(timeout=0)
    opened = [open_body(b) for b in spooled_records(tmp_path)]
    assert [(e.version, e.body) for e in opened] == [
        (3, b"click"), (3, b"click"), (3, b"a"), (3, b"b"), (3, b"c")]
    ids = [e.publish_id for e in opened]
    assert ids[0] != ids[1]                               # two publishes of equal bytes
    assert ids[2:] == [publish_id_for(k) for k in ("k1", "k2", "k3")]


# -- ReplicationError and the two retry rules --------------------------------------------

def test_a_replication_error_names_the_counts_the_nsqds_and_the_fix() -> None:
    down = ConnectError("cannot connect to nsqd at 127.0.0.1:2")
    exc = ReplicationError(["127.0.0.1:1"], {"127.0.0.1:2": down}, replicas=2, quorum=2,
                           candidates=3)
    text = str(exc)
    assert "acknowledged by 1 of 2 replicas (127.0.0.1:1)" in text
    assert "write_quorum=2 needs 2" in text and "127.0.0.1:2: ConnectError" in text
    assert "1 nsqd not tried" in text and "lower write_quorum" in text
    assert exc.acked == ("127.0.0.1:1",) and exc.failed == {"127.0.0.1:2": down}
    assert is_transient(exc) and not refused(exc)        # retried, by both rules
    bad = BadMessageError("E_BAD_MESSAGE", "too big", "127.0.0.1:2")
    assert not is_transient(ReplicationError([], {"127.0.0.1:2": bad}, replicas=1, quorum=1,
                                             candidates=1))
