"""What nsqd's and nsqlookupd's HTTP API answer, as frozen dataclasses (parsed by
:mod:`nsq_spark.admin.calls`). Field names are nsqd's JSON names without the ``_name`` /
``_count`` noise where that reads better; counts are messages unless said otherwise."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ChannelStats", "ClientStats", "Lookup", "LookupdInfo", "LookupdProducer",
           "NsqdInfo", "NsqdStats", "TopicStats"]


def _join(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass(frozen=True)
class ClientStats:
    """One consumer connection on a channel (``/stats`` ``clients``)."""

    client_id: str
    hostname: str
    remote_address: str
    user_agent: str
    version: str
    state: int  # nsqd's client state: 3 = subscribed, 4 = closing
    ready_count: int  # the client's RDY
    in_flight_count: int
    message_count: int  # sent to this client
    finish_count: int
    requeue_count: int
    connect_ts: int  # Unix seconds
    tls: bool
    snappy: bool
    deflate: bool


@dataclass(frozen=True)
class ChannelStats:
    """One channel of a topic on one nsqd. ``depth`` is memory + disk
    (``backend_depth``), excluding in-flight and deferred messages."""

    name: str
    depth: int
    backend_depth: int
    in_flight_count: int
    deferred_count: int
    message_count: int  # ever put on the channel
    requeue_count: int
    timeout_count: int
    client_count: int
    paused: bool
    clients: tuple[ClientStats, ...] = ()


@dataclass(frozen=True)
class TopicStats:
    """One topic on one nsqd. ``depth`` is what nsqd has not copied into the channels yet
    (a topic without channels keeps everything here)."""

    name: str
    depth: int
    backend_depth: int
    message_count: int  # ever published to the topic
    message_bytes: int  # bytes ever published
    paused: bool
    channels: tuple[ChannelStats, ...] = ()

    def channel(self, name: str) -> ChannelStats | None:
        """The channel called ``name``, or None."""
        return next((c for c in self.channels if c.name == name), None)


@dataclass(frozen=True)
class NsqdStats:
    """One nsqd's ``/stats``."""

    version: str
    health: str  # "OK" or nsqd's complaint (e.g. a failing disk)
    start_time: int  # Unix seconds
    topics: tuple[TopicStats, ...] = ()

    def topic(self, name: str) -> TopicStats | None:
        """The topic called ``name``, or None."""
        return next((t for t in self.topics if t.name == name), None)

    def channel(self, topic: str, channel: str) -> ChannelStats | None:
        """``topic``'s channel ``channel``, or None."""
        found = self.topic(topic)
        return None if found is None else found.channel(channel)


@dataclass(frozen=True)
class NsqdInfo:
    """One nsqd's ``/info``."""

    version: str
    broadcast_address: str
    hostname: str
    tcp_port: int
    http_port: int
    start_time: int  # Unix seconds

    @property
    def tcp_address(self) -> str:
        return _join(self.broadcast_address, self.tcp_port)

    @property
    def http_address(self) -> str:
        return _join(self.broadcast_address, self.http_port)


@dataclass(frozen=True)
class LookupdProducer:
    """One nsqd as nsqlookupd lists it (``/nodes``, ``/lookup``). ``topics`` and
    ``tombstones`` (one flag per topic: tombstoned on this nsqd) only come with
    ``/nodes``."""

    broadcast_address: str
    tcp_port: int
    http_port: int | None
    hostname: str = ""
    remote_address: str = ""
    version: str = ""
    topics: tuple[str, ...] = ()
    tombstones: tuple[bool, ...] = ()
    #: where the nsqd runs, for topology-aware consumption (an experiment on nsq's main
    #: branch; nsqlookupd v1.3.0 does not report them): None when lookupd does not say
    topology_zone: str | None = None
    topology_region: str | None = None

    @property
    def tcp_address(self) -> str:
        """``host:tcp_port`` (IPv6 in brackets): where a Reader connects."""
        return _join(self.broadcast_address, self.tcp_port)

    @property
    def http_address(self) -> str | None:
        """``host:http_port`` (IPv6 in brackets), or None if lookupd did not say."""
        return None if self.http_port is None else _join(self.broadcast_address,
                                                         self.http_port)


@dataclass(frozen=True)
class Lookup:
    """nsqlookupd's ``/lookup?topic=``: the topic's channels and the nsqds carrying it
    (both empty for a topic lookupd does not know)."""

    channels: tuple[str, ...] = ()
    producers: tuple[LookupdProducer, ...] = ()


@dataclass(frozen=True)
class LookupdInfo:
    """nsqlookupd's ``/info``."""

    version: str
