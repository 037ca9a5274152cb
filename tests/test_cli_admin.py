"""``nsq-spark stat`` and ``nsq-spark topic|channel ACTION`` against real nsqd/nsqlookupd:
what each command does to nsqd (read back through nsqd's own /stats), its output, its exit
status (0 done, 1 an operation failed, 2 bad usage) and errors that name the fix."""

from __future__ import annotations

import io
import json

import pytest

from nsq_spark import cli
from nsq_spark.testing import free_port, wait_until

pytestmark = pytest.mark.nsqd


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.BytesIO(), io.StringIO()
    rc = cli.main(list(argv), stdout=out, stderr=err)
    return rc, out.getvalue().decode(), err.getvalue()


def channel(cluster, topic, name, nsqd=0):
    return cluster.nsqds[nsqd].channel_stats(topic, name)


@pytest.mark.nsq_cluster(nsqd=2, lookupd=1)
def test_channel_actions_through_lookupd_reach_every_nsqd(nsq_cluster):
    topic = "cli_adm"
    for i in range(2):
        nsq_cluster.publish(topic, [b"x"], nsqd=i)
        nsq_cluster.wait_registered(i)
    lookupd = ("--lookupd-http-address", nsq_cluster.lookupd_http_addresses[0])
    rc, out, err = run("channel", "create", "--topic", topic, "--channel", "c", *lookupd)
    assert (rc, err) == (0, "")
    assert sorted(out.splitlines()) == sorted(
        f"created channel {topic}/c on nsqd {a}" for a in nsq_cluster.nsqd_http_addresses)
    nsq_cluster.publish(topic, [b"a", b"b"], nsqd=0)
    # the first "x" waited on the topic (no channel yet) and moved into the new channel
    wait_until(lambda: channel(nsq_cluster, topic, "c")["depth"] == 3, 5, "depth 3")

    assert run("channel", "pause", "--topic", topic, "--channel", "c", *lookupd)[0] == 0
    assert all(channel(nsq_cluster, topic, "c", i)["paused"] for i in range(2))
    assert run("channel", "unpause", "--topic", topic, "--channel", "c", *lookupd)[0] == 0
    assert not any(channel(nsq_cluster, topic, "c", i)["paused"] for i in range(2))

    assert run("channel", "empty", "--topic", topic, "--channel", "c", *lookupd)[0] == 0
    assert channel(nsq_cluster, topic, "c")["depth"] == 0
    assert run("channel", "delete", "--topic", topic, "--channel", "c", *lookupd)[0] == 0
    assert channel(nsq_cluster, topic, "c") == {} and channel(nsq_cluster, topic, "c", 1) == {}


def listed(cluster, topic: str, nsqd: int = 0) -> str:
    """Publish one message of ``topic`` on nsqd ``nsqd`` and wait until the first lookupd
    lists it as a producer of the topic; that lookupd's HTTP address."""
    from nsq_spark.admin import LookupdClient

    cluster.publish(topic, [b"x"], nsqd=nsqd)
    cluster.wait_registered(nsqd)
    lookupd = cluster.lookupd_http_addresses[0]
    with LookupdClient(lookupd) as client:
        wait_until(lambda: client.lookup(topic).producers, 5, f"{topic} registered")
    return lookupd


@pytest.mark.nsq_cluster(nsqd=2, lookupd=1)
def test_channel_create_through_lookupd_goes_to_the_nsqds_of_the_topic(nsq_cluster):
    # nsqd 1 is registered with lookupd but lacks the topic: nsqd answers POST
    # /channel/create there 404 TOPIC_NOT_FOUND, so it must not be asked
    topic = "cli_only0"
    nsq_cluster.publish("cli_other", [b"y"], nsqd=1)
    nsq_cluster.wait_registered(1)
    lookupd = listed(nsq_cluster, topic, nsqd=0)
    rc, out, err = run("channel", "create", "--topic", topic, "--channel", "c",
                       "--lookupd-http-address", lookupd)
    assert (rc, err) == (0, "")
    assert out == f"created channel {topic}/c on nsqd {nsq_cluster.nsqd_http_addresses[0]}\n"
    # nsqd's topic pump moves the waiting "x" into the new channel a moment later
    wait_until(lambda: channel(nsq_cluster, topic, "c").get("depth") == 1, 5, "depth 1")


@pytest.mark.nsq_cluster(nsqd=1, lookupd=1)
def test_a_lookupd_that_does_not_answer_fails_a_mutating_action(nsq_cluster):
    topic = "cli_half"
    up = listed(nsq_cluster, topic)
    down = f"127.0.0.1:{free_port()}"
    rc, out, err = run("topic", "pause", "--topic", topic, "--lookupd-http-address", up,
                       "--lookupd-http-address", down)
    # the nsqds the answering lookupd knows are paused; the other may know more
    assert out == f"paused topic {topic} on nsqd {nsq_cluster.nsqd_http_addresses[0]}\n"
    assert rc == cli.EXIT_ERROR
    assert f"nsqlookupd {down} did not answer" in err and "was not paused" in err
    # whether the unanswering lookupd knows another nsqd is unknown: not said as a fact
    assert "an nsqd only it knows, if any, was not paused" in err
    assert "the action may be incomplete" in err


@pytest.mark.nsq_cluster(nsqd=1, lookupd=1)
def test_stat_keeps_its_nsqds_when_lookupd_blips_mid_run(nsq_cluster, monkeypatch):
    from nsq_spark.admin import LookupdClient, NodeUnreachableError

    topic = "cli_blip"
    lookupd = listed(nsq_cluster, topic)
    real, calls = LookupdClient.lookup, []

    def blip(self, name):
        calls.append(name)
        if len(calls) == 2:
            raise NodeUnreachableError("GET /lookup: no answer (blip)")
        return real(self, name)

    monkeypatch.setattr(LookupdClient, "lookup", blip)
    rc, out, err = run("stat", "--lookupd-http-address", lookupd, "--topic", topic,
                       "--json", "--count", "3", "--interval", "100ms")
    assert (rc, err) == (0, "")
    views = [json.loads(line) for line in out.splitlines()]
    assert [len(v["channels"]) for v in views] == [1, 1, 1]
    assert [v["unreachable_lookupds"] for v in views] == [
        [], [{"lookupd": lookupd, "error": "GET /lookup: no answer (blip)"}], []]


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_topic_actions_on_a_given_nsqd(nsq_cluster):
    nsqd = ("--nsqd-http-address", nsq_cluster.nsqd_http_addresses[0])
    rc, out, _ = run("topic", "create", "--topic", "cli_t", *nsqd)
    assert rc == 0 and out == f"created topic cli_t on nsqd {nsqd[1]}\n"
    nsq_cluster.publish("cli_t", [b"1", b"2", b"3"])

    def topic_stats():
        return [t for t in nsq_cluster.nsqds[0].stats("cli_t")["topics"] or []
                if t["topic_name"] == "cli_t"]

    assert topic_stats()[0]["depth"] == 3
    assert run("topic", "pause", "--topic", "cli_t", *nsqd)[0] == 0
    assert topic_stats()[0]["paused"] is True
    assert run("topic", "unpause", "--topic", "cli_t", *nsqd)[0] == 0
    assert topic_stats()[0]["paused"] is False
    assert run("topic", "empty", "--topic", "cli_t", *nsqd)[0] == 0
    assert topic_stats()[0]["depth"] == 0
    assert run("topic", "delete", "--topic", "cli_t", *nsqd)[0] == 0
    assert topic_stats() == []


@pytest.mark.nsq_cluster(nsqd=1, lookupd=0)
def test_an_operation_on_a_missing_topic_fails_with_status_1_naming_the_fix(nsq_cluster):
    rc, out, err = run("channel", "pause", "--topic", "cli_nope", "--channel", "c",
                       "--nsqd-http-address", nsq_cluster.nsqd_http_addresses[0])
    assert rc == cli.EXIT_ERROR and out == ""
    assert "topic 'cli_nope' does not exist" in err and "create it" in err


def test_an_unreachable_nsqd_fails_with_status_1_naming_the_port():
    down = f"127.0.0.1:{free_port()}"
    rc, _, err = run("topic", "pause", "--topic", "t", "--nsqd-http-address", down)
    assert rc == cli.EXIT_ERROR
    assert down in err and "no answer" in err and "4151" in err


@pytest.mark.parametrize("argv, words", [
    (["topic", "pause", "--topic", "t"], "give --nsqd-http-address or --lookupd-http-address"),
    (["topic", "pause", "--topic", "bad name", "--nsqd-http-address", "h:1"],
     "invalid topic name"),
    (["channel", "empty", "--topic", "t", "--channel", "c!", "--nsqd-http-address", "h:1"],
     "invalid channel name"),
    (["topic", "pause", "--topic", "t", "--nsqd-http-address", "h"], "no port"),
    (["topic", "frobnicate", "--topic", "t", "--nsqd-http-address", "h:1"], "invalid choice"),
    (["channel", "pause", "--topic", "t", "--nsqd-http-address", "h:1"], "--channel"),
    (["stat", "--channel", "c", "--nsqd-http-address", "h:1"], "--channel needs --topic"),
    (["stat", "--nsqd-http-address", "h:1", "--status-every", "soon"], "duration"),
    (["stat", "--nsqd-http-address", "h:1", "--status-every", "0s"], "--interval"),
    (["stat", "--nsqd-http-address", "h:1", "--status-every", "0s"], ": --status-every=0"),
    (["stat", "--nsqd-http-address", "h:1", "-status-every", "soon"],
     ": -status-every 'soon': give a duration"),
    (["stat", "--nsqd-http-address", "h:1", "--interval", "0s"], ": --interval=0"),
    (["stat", "--nsqd-http-address", "h:1", "--interval", "0s"], "--interval"),
    (["stat", "--nsqd-http-address", "h:1", "--http-client-connect-timeout", "0"],
     "--http-client-connect-timeout"),
    (["topic", "pause", "--topic", "t", "--nsqd-http-address", "h:1",
      "--http-client-request-timeout", "later"], "--http-client-request-timeout"),
])
def test_bad_usage_is_status_2_before_any_request(argv, words, capsys):
    rc, out, err = run(*argv)
    assert rc == cli.EXIT_USAGE and out == ""
    assert words in err + capsys.readouterr().err  # argparse's own errors go to sys.stderr


def test_stat_takes_nsq_stats_flags_and_status_every_as_interval():
    parse = cli.build_parser().parse_args
    a = parse(["stat", "--nsqd-http-address", "h:1", "--interval", "500ms",
               "--http-client-connect-timeout", "1s", "--http-client-request-timeout", "3s"])
    assert (a.interval, a.http_client_connect_timeout, a.http_client_request_timeout) == \
        (0.5, 1.0, 3.0)
    assert parse(["stat", "-nsqd-http-address", "h:1", "-status-every", "1m"]).interval == 60
    a = parse(["channel", "pause", "--topic", "t", "--channel", "c",
               "--nsqd-http-address", "h:1"])
    assert (a.http_client_connect_timeout, a.http_client_request_timeout) == (2.0, 5.0)


@pytest.mark.nsq_cluster(nsqd=1, lookupd=1)
def test_the_http_client_timeouts_reach_the_transport(nsq_cluster, monkeypatch):
    from nsq_spark.admin.transport import HttpTransport

    seen = []
    real = HttpTransport.request

    def spy(self, method, url, timeout, **kw):
        seen.append((url.split("?")[0].rsplit("/", 1)[1], self.connect_timeout, timeout))
        return real(self, method, url, timeout, **kw)

    monkeypatch.setattr(HttpTransport, "request", spy)
    nsq_cluster.publish("cli_to", [b"x"])
    nsq_cluster.wait_registered(0)
    from nsq_spark.admin import LookupdClient
    with LookupdClient(nsq_cluster.lookupd_http_addresses[0]) as client:
        wait_until(lambda: client.lookup("cli_to").producers, 5, "cli_to registered")
    seen.clear()
    rc, _, err = run("stat", "--lookupd-http-address", nsq_cluster.lookupd_http_addresses[0],
                     "--topic", "cli_to", "--count", "1", "--http-client-connect-timeout",
                     "1500ms", "--http-client-request-timeout", "4s")
    assert (rc, err) == (0, "")
    assert {s[0] for s in seen} == {"lookup", "stats"}
    assert {s[1] for s in seen} == {1.5}
    # the lookup has the whole timeout; the nsqds of the view share one deadline of it
    (lookup,) = [s[2] for s in seen if s[0] == "lookup"]
    (stats,) = [s[2] for s in seen if s[0] == "stats"]
    assert lookup == 4.0 and 3.0 < stats <= 4.0


def test_help_shows_examples(capsys):
    for command in ("stat", "topic", "channel"):
        assert cli.main([command, "--help"]) == 0
        text = capsys.readouterr().out
        assert f"examples:\n  nsq-spark {command}" in text
        if command != "stat":
            assert "exit status 1, the action may be incomplete" in " ".join(text.split())


@pytest.mark.nsq_cluster(nsqd=1, lookupd=1)
def test_stat_json_gives_one_object_per_interval_with_rates(nsq_cluster, running_reader):
    topic = "cli_stat"
    address = nsq_cluster.nsqd_http_addresses[0]
    nsq_cluster.publish(topic, [b"m%d" % i for i in range(10)])
    held = []

    def keep(message):  # no answer: the messages stay in flight
        message.enable_async()
        held.append(message)

    reader = running_reader.start(topic, "slow", keep,
                                  nsqd_tcp_addresses=nsq_cluster.nsqd_tcp_addresses,
                                  max_in_flight=3)
    wait_until(lambda: len(held) == 3, 10, "3 messages in flight")
    rc, out, err = run("stat", "--nsqd-http-address", address, "--topic", topic,
                       "--channel", "slow", "--json", "--count", "2", "--interval",
                       "200ms")
    assert (rc, err) == (0, "")
    first, second = [json.loads(line) for line in out.splitlines()]
    (row,) = first["channels"]
    assert (row["topic"], row["channel"], row["in_flight"], row["depth"], row["messages"],
            row["client_count"], row["paused"]) == (topic, "slow", 3, 7, 10, 1, False)
    assert row["message_rate"] is None and first["interval_seconds"] is None
    (client,) = row["clients"]
    assert client["nsqd"] == address and client["in_flight"] == 3 and client["ready"] == 3
    assert second["interval_seconds"] > 0.15 and second["channels"][0]["message_rate"] == 0.0
    running_reader.stop(reader)


@pytest.mark.nsq_cluster(nsqd=1, lookupd=1)
def test_stat_table_through_lookupd_marks_a_paused_channel(nsq_cluster):
    topic = "cli_stat2"
    nsq_cluster.publish(topic, [b"x"])
    nsq_cluster.wait_registered(0)
    nsqd = nsq_cluster.nsqd_http_addresses[0]
    assert run("channel", "create", "--topic", topic, "--channel", "c",
               "--nsqd-http-address", nsqd)[0] == 0
    nsq_cluster.publish(topic, [b"y", b"z"])
    assert run("channel", "pause", "--topic", topic, "--channel", "c",
               "--nsqd-http-address", nsqd)[0] == 0
    rc, out, err = run("stat", "--lookupd-http-address", nsq_cluster.lookupd_http_addresses[0],
                       "--topic", topic, "--count", "1")
    assert (rc, err) == (0, "")
    header, line = out.splitlines()
    assert header.split() == ["topic/channel", "depth", "mem", "disk", "inflight",
                              "deferred", "requeued", "timedout", "msgs", "ingress/s",
                              "egress/s", "clients"]
    # "x" waited on the topic (no channel yet), then moved into the new channel: 3, all
    # in memory; no rate in the first view (nsq_stat's columns: mem, ingress, egress)
    assert line.split()[:4] == [f"{topic}/c", "3", "3", "0"] and "[channel paused]" in line
    assert line.split()[9:11] == ["-", "-"]


def test_stat_with_no_nsqd_answering_fails_with_status_1():
    down = f"127.0.0.1:{free_port()}"
    rc, out, err = run("stat", "--nsqd-http-address", down, "--count", "1")
    assert rc == cli.EXIT_ERROR and out == "" and "no nsqd answered" in err and down in err


def test_tail_takes_max_messages_and_timeout():
    a = cli.build_parser().parse_args(["tail", "--topic", "t", "--lookupd-http-address", "l:1",
                                       "--max-messages", "5", "--timeout", "2.5"])
    assert (a.count, a.idle_exit) == (5, 2.5)
    a = cli.build_parser().parse_args(["tail", "-topic", "t", "-max-messages", "7"])
    assert a.count == 7
