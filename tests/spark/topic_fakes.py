"""A fake of the stream driver's :class:`~nsq_spark.spark._backlog.TopicBacklog` port (one
topic's nsqds) without sockets, and a reader whose topics are such fakes. Typed: mypy
checks it against the port (tests/test_typing.py)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from nsq_spark.spark._backlog import Backlog, TopicBacklog

if TYPE_CHECKING:
    from nsq_spark.spark.datasource import NSQStreamReader


class FakeTopic:
    """``depth`` messages wait on the topic's channel; every nsqd answers."""

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self.last: Backlog | None = None

    def check_reachable(self, require_producer: bool) -> None:
        pass

    def backlog(self) -> int | None:
        return self.depth

    def settled_backlog(self) -> int | None:
        return self.depth


_PORT_CHECK: TopicBacklog = FakeTopic(0)


def fake_reader(spool: Path | str, depths: dict[str, int],
                **options: str) -> tuple["NSQStreamReader", dict[str, FakeTopic]]:
    """A stream reader on ``depths``' topics (one: ``topic``; more: ``topics``) whose
    nsqds are fakes, measuring at each call (no poll interval), its spool at ``spool``."""
    from nsq_spark.spark.datasource import NSQStreamReader

    names = list(depths)
    topics = {"topic": names[0]} if len(names) == 1 else {"topics": ",".join(names)}
    r = NSQStreamReader({"channel": "c", "nsqdTcpAddresses": "127.0.0.1:4150",
                         "nsqdHttpAddresses": "127.0.0.1:4151", "spoolPath": str(spool),
                         "backlogPollInterval": "0", **topics, **options})
    fakes = {topic: FakeTopic(depth) for topic, depth in depths.items()}
    for topic, fake in fakes.items():
        r._subscription.handles[topic] = fake
    return r, fakes
