"""Delete a topic or a channel as nsqadmin does, on real processes: nsqadmin v1.3.0,
nsqlookupd and three nsqds. The same history is played on two topics, one deleted by
nsqadmin's own ``DELETE /api/topics/...``, the other by ours (``nsq-spark channel|topic
delete`` and ``nsq_spark.admin.delete_channel/delete_topic``); then the topic is
published again, on an nsqd that had it and on one that did not (an nsqd that makes a
topic asks lookupd for its channels and makes them too). The final state -- lookupd's
``/lookup``, ``/topics``, ``/channels``, and every nsqd's ``/stats`` -- must be the same
for both topics, and the deleted channel must be nowhere, collecting nothing.

Deleting on the nsqds alone (what ``nsq-spark channel delete`` did before) left
lookupd's registration, and the channel came back with the topic on the third nsqd and
collected every message there (``{'old-consumer': 5}`` against nsqadmin's ``{}``)."""

from __future__ import annotations

import io
import json
import urllib.request
from typing import Any

import pytest

from nsq_spark import cli
from nsq_spark.admin import LookupdClient, NsqdClient, delete_channel, delete_topic
from nsq_spark.testing import NSQCluster, wait_until

pytestmark = [pytest.mark.nsqd, pytest.mark.timeout(120),
              pytest.mark.nsq_cluster(nsqd=3, lookupd=1, nsqadmin=True)]


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


def _nsqadmin_delete(cluster: NSQCluster, path: str) -> None:
    req = urllib.request.Request(f"http://{cluster.nsqadmin_http_address}/api/topics/{path}",
                                 method="DELETE")
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status == 200, resp.read()


def _history(cluster: NSQCluster, topic: str) -> None:
    """The topic on nsqd 0 and 1 (not 2), with channels keep and old-consumer on both,
    all registered with lookupd."""
    for i in (0, 1):
        with NsqdClient(cluster.nsqd_http_addresses[i]) as nsqd:
            nsqd.create_topic(topic)
            nsqd.create_channel(topic, "keep")
            nsqd.create_channel(topic, "old-consumer")
    with LookupdClient(cluster.lookupd_http_addresses[0]) as lookupd:
        wait_until(lambda: len(lookupd.lookup(topic).producers) == 2
                   and set(lookupd.channels(topic)) == {"keep", "old-consumer"}, 10,
                   f"{topic} registered by two nsqds with both channels")


def _afterwards(cluster: NSQCluster, topic: str) -> None:
    """The topic is published again: 5 messages on nsqd 0 (which had it) and on nsqd 2
    (which makes it now, with the channels lookupd lists)."""
    for i in (0, 2):
        cluster.publish(topic, [b"m%d" % k for k in range(5)], nsqd=i)


def _state(cluster: NSQCluster, topic: str, name: str) -> dict[str, Any]:
    """What lookupd and the nsqds say of ``topic``, with its name replaced by ``name``."""
    lookupd = f"http://{cluster.lookupd_http_addresses[0]}"
    try:
        lookup = _get(f"{lookupd}/lookup?topic={topic}")
        lookup = {"channels": sorted(lookup["channels"]),
                  "producers": sorted(p["tcp_port"] for p in lookup["producers"])}
    except urllib.error.HTTPError as exc:
        lookup = {"status": exc.code}
    nsqds = []
    for node in cluster.nsqds:
        stats = node.stats(topic)
        topics = [t for t in stats.get("topics") or [] if t["topic_name"] == topic]
        nsqds.append({c["channel_name"]: c["depth"] for t in topics for c in t["channels"]}
                     if topics else None)
    return {"lookup": lookup,
            "topics": topic in _get(f"{lookupd}/topics")["topics"],
            "channels": sorted(_get(f"{lookupd}/channels?topic={topic}")["channels"]),
            "nsqds": json.loads(json.dumps(nsqds).replace(topic, name))}


def _same_in_the_end(cluster: NSQCluster, theirs: str, ours: str) -> dict[str, Any]:
    """Both topics' state once it settles (nsqd tells lookupd what it deleted after the
    fact): equal, and returned."""
    states: list[Any] = []

    def settled() -> bool:
        a, b = _state(cluster, theirs, "T"), _state(cluster, ours, "T")
        states.append((a, b))
        return a == b and len(states) > 1 and states[-2] == (a, b)

    try:
        wait_until(settled, 15, "the same state after both deletes", interval=0.3)
    except AssertionError:
        raise AssertionError(f"nsqadmin left {states[-1][0]}, ours {states[-1][1]}") \
            from None
    return states[-1][0]


def test_channel_delete_leaves_what_nsqadmins_leaves(nsq_cluster: NSQCluster) -> None:
    theirs, ours, api = "del_ch_admin", "del_ch_cli", "del_ch_api"
    for topic in (theirs, ours, api):
        _history(nsq_cluster, topic)
    _nsqadmin_delete(nsq_cluster, f"{theirs}/old-consumer")
    out, err = io.BytesIO(), io.StringIO()
    rc = cli.main(["channel", "delete", "--topic", ours, "--channel", "old-consumer",
                   "--lookupd-http-address", nsq_cluster.lookupd_http_addresses[0]],
                  stdout=out, stderr=err)
    assert (rc, err.getvalue()) == (0, "")
    lookupd = nsq_cluster.lookupd_http_addresses[0]
    assert sorted(out.getvalue().decode().splitlines()) == sorted(
        [f"deleted the registration of channel {ours}/old-consumer on nsqlookupd {lookupd}"]
        + [f"deleted channel {ours}/old-consumer on nsqd {a}"
           for a in nsq_cluster.nsqd_http_addresses[:2]])
    result = delete_channel(api, "old-consumer", lookupd_http_addresses=[lookupd])
    assert result.ok and len(result.done) == 3 and result.notes == ()
    for topic in (theirs, ours, api):
        _afterwards(nsq_cluster, topic)
    state = _same_in_the_end(nsq_cluster, theirs, ours)
    assert _same_in_the_end(nsq_cluster, theirs, api) == state
    # the channel is nowhere, and nothing collects messages for it
    assert state["channels"] == ["keep"] and state["lookup"]["channels"] == ["keep"]
    assert state["nsqds"] == [{"keep": 5}, {"keep": 0}, {"keep": 5}]


def test_topic_delete_leaves_what_nsqadmins_leaves(nsq_cluster: NSQCluster) -> None:
    theirs, ours, api = "del_t_admin", "del_t_cli", "del_t_api"
    for topic in (theirs, ours, api):
        _history(nsq_cluster, topic)
    _nsqadmin_delete(nsq_cluster, theirs)
    out, err = io.BytesIO(), io.StringIO()
    rc = cli.main(["topic", "delete", "--topic", ours, "--lookupd-http-address",
                   nsq_cluster.lookupd_http_addresses[0]], stdout=out, stderr=err)
    assert (rc, err.getvalue()) == (0, ""), err.getvalue()
    assert len(out.getvalue().splitlines()) == 3
    assert delete_topic(api, lookupd_http_addresses=nsq_cluster.lookupd_http_addresses).ok
    # deleted everywhere before it is published again
    for topic in (theirs, ours, api):
        wait_until(lambda: _state(nsq_cluster, topic, "T")["nsqds"] == [None] * 3, 10,
                   f"{topic} gone from the nsqds")
    assert _same_in_the_end(nsq_cluster, theirs, ours)["topics"] is False
    for topic in (theirs, ours, api):
        _afterwards(nsq_cluster, topic)
    state = _same_in_the_end(nsq_cluster, theirs, ours)
    assert _same_in_the_end(nsq_cluster, theirs, api) == state
    # made again by the publishes, with no channel: lookupd forgot them too
    assert state["channels"] == [] and state["nsqds"] == [{}, None, {}]


def test_a_lookupd_that_does_not_answer_makes_the_delete_fail_loudly(
        nsq_cluster: NSQCluster) -> None:
    from nsq_spark.testing import free_port

    topic = "del_half"
    _history(nsq_cluster, topic)
    down = f"127.0.0.1:{free_port()}"
    result = delete_channel(topic, "old-consumer", timeout=2, lookupd_http_addresses=[
        nsq_cluster.lookupd_http_addresses[0], down])
    assert not result.ok
    assert {node for node, _ in result.failed} == {f"nsqlookupd {down}"}
    # said for its lookup (an nsqd only it knows may keep the channel) and its delete
    assert "did not answer, so an nsqd only it knows" in result.failed[0][1]
    assert "no answer" in result.failed[1][1]
    # what the answering lookupd knows is deleted all the same, as nsqadmin does
    assert len(result.done) == 3
