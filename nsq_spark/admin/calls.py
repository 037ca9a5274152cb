"""nsqd's and nsqlookupd's HTTP API without IO: what to ask (:class:`Call`: method, URL,
how to read the answer) and what the answer means (:func:`read_answer`). The blocking and
the asyncio clients (:mod:`nsq_spark.admin.client`) and lookupd discovery
(:mod:`nsq_spark._lookupd`) send these calls; this module is the one place that knows the
URLs, the JSON and the error answers.

Names are checked here, before any request (:func:`nsq_spark.protocol.check_topic`), and
addresses by the one address rule (:func:`nsq_spark._addresses.parse_http_address`).

nsqd v1.3.0 answers errors as ``{"message": "TOPIC_NOT_FOUND"}`` with the HTTP status
(older versions put ``status_txt`` in a ``{"status_code", "data"}`` envelope; both are
read). Its write endpoints take POST only (GET is 405).

Answers are checked as they are read, by one parser per endpoint: JSON nested too deeply
(Python's parser gives up near 1,000 levels; NSQ's answers are 5 deep) and, in nsqd's
``/stats`` and ``/info``, a field of another type than nsqd sends (``"paused": "yes"``, a
negative count, ``"channels": null``) are an :class:`UnexpectedAnswerError` naming the
node, the field and the value. A field that is absent takes its default (older nsqd
versions lack some); ``null`` is read as empty only where nsqd v1.x itself sends it (Go's
empty slice: ``topics`` of ``/stats?topic=`` for a topic it lacks, ``clients`` of
``/stats?include_clients=false``), never for ``channels``. lookupd's producers are read one
by one: an entry without a usable address and TCP port is skipped, and one warning per
answer says how many were and shows the first. Each call says what kind of answer it
expects (``answer``: ``"status"``, ``"lookup"`` or ``"stats"``), which chooses the size
limit of its body (:data:`nsq_spark.admin.transport.ANSWER_LIMITS`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Generic, NamedTuple, TypeVar
from urllib.parse import urlencode

from nsq_spark._log import get_logger
from nsq_spark._addresses import parse_address, parse_http_address, strip_userinfo
from nsq_spark.protocol import check_channel, check_topic

from .errors import (ChannelNotFoundError, HTTPStatusError, LookupdError, NotFoundError,
                     TopicNotFoundError, UnexpectedAnswerError)
from .model import (ChannelStats, ClientStats, Lookup, LookupdInfo, LookupdProducer, NsqdInfo,
                    NsqdStats, TopicStats)

log = get_logger(__name__)

__all__ = ["ACCEPT", "Answer", "Call", "TOPIC_ACTIONS", "base_url", "channel_action",
           "lookup", "lookupd_channel_action", "lookupd_channels", "lookupd_info", "lookupd_nodes",
           "lookupd_topic_action", "lookupd_topics", "LOOKUPD_ACTIONS",
           "nsqd_info", "nsqd_stats", "parse_lookup", "parse_nsqd_stats", "parse_producers",
           "ping", "read_answer", "tombstone", "check_tombstoned", "topic_action"]

T = TypeVar("T")

#: nsqlookupd < 1.0 wraps answers in an envelope unless asked for this version.
ACCEPT = "application/vnd.nsq; version=1.0"
#: What ``topic_action`` / ``channel_action`` can do (nsqd's ``/topic/<action>``).
TOPIC_ACTIONS = ("create", "delete", "empty", "pause", "unpause")


class Answer(NamedTuple):
    """What came back: the HTTP status and the body."""

    status: int
    body: bytes


@dataclass(frozen=True)
class Call(Generic[T]):
    """One request and how to read its answer.

    ``parse`` turns a 2xx body into the result; ``missing`` is the result of a 404 when
    the API means "nothing" by it (lookupd's ``/lookup`` of an unknown topic), and
    ``has_missing`` says whether there is one (None can be a result)."""

    method: str
    url: str
    parse: Callable[[bytes, str], T]
    node: str  # "nsqd 127.0.0.1:4151" / "nsqlookupd ...", for messages
    topic: str | None = None
    channel: str | None = None
    missing: T | None = None
    has_missing: bool = False
    #: the kind of answer, which chooses its size limit (a key of
    #: :data:`nsq_spark.admin.transport.ANSWER_LIMITS`)
    answer: str = "status"


def base_url(address: str, kind: str) -> tuple[str, str]:
    """``(base URL, "<kind> host:port")`` for an nsqd / nsqlookupd HTTP address
    (``host:port`` or an ``http(s)://`` URL, by the one address rule). A path is not
    kept: pynsq-style lookupd addresses name their ``/lookup`` endpoint with it
    (discovery honours that, :func:`nsq_spark._lookupd.lookup_url`), which is no prefix
    of the other endpoints. User info is not kept either: the clients send it as the
    ``Authorization`` header (:func:`nsq_spark._addresses.http_authorization`)."""
    param = f"{kind} HTTP address"
    example = "127.0.0.1:4161" if kind == "nsqlookupd" else "127.0.0.1:4151"
    scheme, address_, _ = parse_http_address(address, param, example)
    return f"{scheme}://{address_}", f"{kind} {address_}"


def _url(base: str, path: str, **params: Any) -> str:
    query = urlencode({k: v for k, v in params.items() if v is not None})
    return f"{base}{path}" + (f"?{query}" if query else "")


# -- reading answers --------------------------------------------------------------------


def _loads(body: bytes) -> Any:
    """``json.loads`` for an answer: ValueError for anything that is not JSON, JSON nested
    too deeply included (a RecursionError of the parser, near 1,000 levels)."""
    try:
        return json.loads(body)
    except RecursionError:
        raise ValueError("nested too deeply to be NSQ's") from None


def _message(body: bytes) -> str:
    """nsqd's error text: ``{"message": X}`` (1.x), ``{"status_txt": X}`` (0.x), or the
    body."""
    try:
        doc = _loads(body)
    except (ValueError, UnicodeDecodeError):
        doc = None
    if isinstance(doc, dict):
        for key in ("message", "status_txt"):
            if isinstance(doc.get(key), str):
                return str(doc[key])
    return body[:200].decode("utf-8", "replace").strip()


def _fix(call: Call[Any], status: int, message: str) -> str:
    where = f"on {call.node}"
    if message == "TOPIC_NOT_FOUND":
        return (f"topic {call.topic!r} does not exist {where}; check the name, or create it "
                "first (NsqdClient.create_topic, nsq-spark topic create)")
    if message == "CHANNEL_NOT_FOUND":
        return (f"channel {call.channel!r} of topic {call.topic!r} does not exist {where}; "
                "check the name, or create it first (NsqdClient.create_channel, "
                "nsq-spark channel create)")
    if status == 404:
        return (f"{call.url} is not found {where} ({message}); is this address an "
                f"{call.node.split()[0]} HTTP port of a v1.x server?")
    return f"{call.method} {call.url} failed {where}: HTTP {status} {message}"


def read_answer(call: Call[T], answer: Answer) -> T:
    """The result of ``call`` from ``answer``, or the typed error it means."""
    status, body = answer
    if 200 <= status < 300:
        return call.parse(body, call.node)
    message = _message(body)
    if status == 404 and call.has_missing and message in ("TOPIC_NOT_FOUND",
                                                          "CHANNEL_NOT_FOUND"):
        return call.missing  # type: ignore[return-value]
    kind: type[HTTPStatusError] = HTTPStatusError
    if status == 404:
        kind = {"TOPIC_NOT_FOUND": TopicNotFoundError,
                "CHANNEL_NOT_FOUND": ChannelNotFoundError}.get(message, NotFoundError)
    raise kind(_fix(call, status, message), status=status, message=message, url=call.url)


def _json(body: bytes, source: str, error: type[UnexpectedAnswerError] = UnexpectedAnswerError
          ) -> Any:
    try:
        return _loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise error(f"{source} answered something that is not JSON ({exc}): "
                    f"{_preview(body)}; is this address the right server's HTTP port?"
                    ) from None


def _preview(body: bytes | str, n: int = 120) -> str:
    text = body if isinstance(body, str) else body[:n].decode("utf-8", "replace")
    return repr(text[:n] + ("..." if len(body) > n else ""))


def _unwrap(doc: Any, key: str) -> Any:
    """nsqd < 1.0 wraps answers: ``{"status_code": 200, "data": {...}}``."""
    if isinstance(doc, dict) and key not in doc and isinstance(doc.get("data"), dict):
        return doc["data"]
    return doc


def _short(value: Any, n: int = 60) -> str:
    shown = repr(value)
    return shown if len(shown) <= n else shown[:n - 3] + "..."


def _type_name(value: Any) -> str:
    return {bool: "a boolean", int: "a number", float: "a number", str: "a string",
            list: "a list", dict: "an object", type(None): "null"}.get(type(value),
                                                                        type(value).__name__)


class _Fields:
    """One JSON object of nsqd's answer, read field by field with the type nsqd sends
    there. An absent field takes its default (older nsqd versions lack some); a field of
    another type is an :class:`UnexpectedAnswerError` naming the node, the field's path
    and its value (see the module doc)."""

    def __init__(self, doc: dict[str, Any], path: str, source: str, what: str) -> None:
        self.doc, self.path, self.source, self.what = doc, path, source, what

    def _wrong(self, key: str, expected: str) -> UnexpectedAnswerError:
        value = self.doc[key]
        return UnexpectedAnswerError(
            f"{self.source} answered {self.what} with {self.path}{key} = {_short(value)} "
            f"({_type_name(value)}), where nsqd sends {expected}; is this address an nsqd "
            "HTTP port of a v1.x server?")

    def count(self, key: str) -> int:
        """A number that nsqd never sends negative (a depth, a count, a time)."""
        value = self.doc.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise self._wrong(key, "a whole number of 0 or more")
        return value

    def text(self, key: str) -> str:
        value = self.doc.get(key, "")
        if not isinstance(value, str):
            raise self._wrong(key, "a string")
        return value

    def flag(self, key: str) -> bool:
        value = self.doc.get(key, False)
        if not isinstance(value, bool):
            raise self._wrong(key, "true or false")
        return value

    def objects(self, key: str, nullable: bool = False) -> list["_Fields"]:
        """The objects of a list field (``null`` is empty when ``nullable``: where nsqd
        sends a Go nil slice)."""
        value = self.doc.get(key, [])
        if value is None and nullable:
            return []
        if not isinstance(value, list):
            raise self._wrong(key, "a list" + (" or null" if nullable else ""))
        out = []
        for i, item in enumerate(value):
            if not isinstance(item, dict):
                raise UnexpectedAnswerError(
                    f"{self.source} answered {self.what} with {self.path}{key}[{i}] = "
                    f"{_short(item)} ({_type_name(item)}), where nsqd sends an "
                    "object; is this address an nsqd HTTP port of a v1.x server?")
            out.append(_Fields(item, f"{self.path}{key}[{i}].", self.source, self.what))
        return out


def _str(doc: dict[str, Any], key: str) -> str:
    value = doc.get(key)
    return value if isinstance(value, str) else ""


def _port(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536:
        return None
    return value


def _client(f: _Fields) -> ClientStats:
    return ClientStats(
        client_id=f.text("client_id"), hostname=f.text("hostname"),
        remote_address=f.text("remote_address"), user_agent=f.text("user_agent"),
        version=f.text("version"), state=f.count("state"),
        ready_count=f.count("ready_count"), in_flight_count=f.count("in_flight_count"),
        message_count=f.count("message_count"), finish_count=f.count("finish_count"),
        requeue_count=f.count("requeue_count"), connect_ts=f.count("connect_ts"),
        tls=f.flag("tls"), snappy=f.flag("snappy"), deflate=f.flag("deflate"))


def _channel(f: _Fields) -> ChannelStats:
    return ChannelStats(
        name=f.text("channel_name"), depth=f.count("depth"),
        backend_depth=f.count("backend_depth"), in_flight_count=f.count("in_flight_count"),
        deferred_count=f.count("deferred_count"), message_count=f.count("message_count"),
        requeue_count=f.count("requeue_count"), timeout_count=f.count("timeout_count"),
        client_count=f.count("client_count"), paused=f.flag("paused"),
        clients=tuple(_client(c) for c in f.objects("clients", nullable=True)))


def _topic(f: _Fields) -> TopicStats:
    return TopicStats(
        name=f.text("topic_name"), depth=f.count("depth"),
        backend_depth=f.count("backend_depth"), message_count=f.count("message_count"),
        message_bytes=f.count("message_bytes"), paused=f.flag("paused"),
        channels=tuple(_channel(c) for c in f.objects("channels")))


def parse_nsqd_stats(body: bytes, source: str = "nsqd") -> NsqdStats:
    """nsqd's ``/stats?format=json``, every field checked (see the module doc)."""
    doc = _unwrap(_json(body, source), "topics")
    if not isinstance(doc, dict) or "version" not in doc:
        raise UnexpectedAnswerError(f"{source} answered JSON that is not nsqd's /stats: "
                                    f"{_preview(body)}; is this an nsqd HTTP port?")
    f = _Fields(doc, "", source, "/stats")
    return NsqdStats(version=f.text("version"), health=f.text("health"),
                     start_time=f.count("start_time"),
                     topics=tuple(_topic(t) for t in f.objects("topics", nullable=True)))


def _parse_nsqd_info(body: bytes, source: str) -> NsqdInfo:
    doc = _unwrap(_json(body, source), "version")
    if not isinstance(doc, dict) or "tcp_port" not in doc:
        raise UnexpectedAnswerError(f"{source} answered JSON that is not nsqd's /info: "
                                    f"{_preview(body)}; is this an nsqd HTTP port?")
    f = _Fields(doc, "", source, "/info")
    return NsqdInfo(version=f.text("version"),
                    broadcast_address=f.text("broadcast_address"),
                    hostname=f.text("hostname"), tcp_port=f.count("tcp_port"),
                    http_port=f.count("http_port"), start_time=f.count("start_time"))


def _parse_lookupd_info(body: bytes, source: str) -> LookupdInfo:
    doc = _unwrap(_json(body, source), "version")
    if not isinstance(doc, dict) or "version" not in doc:
        raise UnexpectedAnswerError(f"{source} answered JSON that is not /info: "
                                    f"{_preview(body)}; is this an nsqlookupd HTTP port?")
    return LookupdInfo(version=_Fields(doc, "", source, "/info").text("version"))


def _parse_ok(body: bytes, source: str) -> None:
    return None


def _parse_ping(body: bytes, source: str) -> str:
    return body.decode("utf-8", "replace").strip()


def _producers_doc(body: bytes | str, source: str) -> dict[str, Any]:
    doc = _unwrap(_json(body if isinstance(body, bytes) else body.encode(), source,
                        LookupdError), "producers")
    if not isinstance(doc, dict) or not isinstance(doc.get("producers"), list):
        raise LookupdError(f"{source} answered JSON without a 'producers' list: "
                           f"{_preview(body)}; is this address an nsqlookupd HTTP port?")
    return doc


def _strings(value: Any) -> tuple[str, ...] | None:
    if value is None:
        return ()
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    return None


def _read_producers(doc: dict[str, Any], source: str) -> list[LookupdProducer]:
    """The usable producers of a lookupd answer; one warning for those skipped (see the
    module doc)."""
    out: list[LookupdProducer] = []
    skipped: list[Any] = []
    loose: list[str] = []   # fields of kept producers that were not read (wrong type)
    for p in doc["producers"]:
        if not isinstance(p, dict):
            skipped.append(p)
            continue
        host = p.get("broadcast_address") or p.get("address")
        port = _port(p.get("tcp_port"))
        if not isinstance(host, str) or not host or port is None:
            skipped.append(p)
            continue
        topics = _strings(p.get("topics"))
        tombstones = p.get("tombstones")
        if tombstones is None:
            tombstones = []
        if not isinstance(tombstones, list) or not all(isinstance(t, bool)
                                                       for t in tombstones):
            loose.append("tombstones")
            tombstones = []
        if topics is None:
            loose.append("topics")
            topics = ()
        if "http_port" in p and p["http_port"] is not None and _port(p["http_port"]) is None:
            loose.append("http_port")
        out.append(LookupdProducer(
            broadcast_address=host, tcp_port=port, http_port=_port(p.get("http_port")),
            hostname=_str(p, "hostname"), remote_address=_str(p, "remote_address"),
            version=_str(p, "version"), topics=topics, tombstones=tuple(tombstones),
            topology_zone=_str(p, "topology_zone") or None,
            topology_region=_str(p, "topology_region") or None))
    if skipped or loose:
        what = []
        if skipped:
            what.append(f"skipped {len(skipped)} of its {len(doc['producers'])} producers "
                        "that are not objects with a broadcast_address and a tcp_port "
                        f"(the first: {_short(skipped[0])})")
        if loose:
            what.append(f"left out {len(loose)} fields of the wrong type "
                        f"({', '.join(sorted(set(loose)))})")
        log.for_lookupd(source).warning("%s: %s", source, "; ".join(what))
    return out


def parse_producers(body: bytes | str, source: str = "lookupd") -> list[LookupdProducer]:
    """The producers in a ``/lookup`` or ``/nodes`` answer, nsqlookupd >= 1.0 or the
    older form with a ``data`` envelope. Raises :class:`LookupdError` if the answer is
    not such a response at all; malformed producer entries are skipped, with one warning
    per answer. The one parser of lookupd's producers (discovery, the Spark driver and
    sink, the admin client)."""
    return _read_producers(_producers_doc(body, source), source)


def parse_lookup(body: bytes, source: str = "lookupd") -> Lookup:
    """nsqlookupd's ``/lookup?topic=``."""
    doc = _producers_doc(body, source)
    channels = _strings(doc.get("channels"))
    if channels is None:
        raise LookupdError(f"{source} answered /lookup with 'channels' that is not a list "
                           f"of names: {_preview(body)}; is this an nsqlookupd HTTP port?")
    return Lookup(channels=channels, producers=tuple(_read_producers(doc, source)))


def _names(key: str) -> Callable[[bytes, str], list[str]]:
    def parse(body: bytes, source: str) -> list[str]:
        doc = _unwrap(_json(body, source, LookupdError), key)
        names = _strings(doc.get(key)) if isinstance(doc, dict) and key in doc else None
        if names is None:
            raise LookupdError(f"{source} answered JSON without a {key!r} list of names: "
                               f"{_preview(body)}; is this an nsqlookupd HTTP port?")
        return list(names)
    return parse


# -- what to ask ------------------------------------------------------------------------


def ping(address: str, kind: str = "nsqd") -> Call[str]:
    """``GET /ping``: ``"OK"`` when healthy (nsqd says what is wrong otherwise, with 500)."""
    base, node = base_url(address, kind)
    return Call("GET", _url(base, "/ping"), _parse_ping, node)


def nsqd_info(address: str) -> Call[NsqdInfo]:
    base, node = base_url(address, "nsqd")
    return Call("GET", _url(base, "/info"), _parse_nsqd_info, node)


def nsqd_stats(address: str, topic: str | None = None, channel: str | None = None,
               include_clients: bool = True) -> Call[NsqdStats]:
    """``GET /stats?format=json``, optionally of one topic (and channel) only."""
    base, node = base_url(address, "nsqd")
    if topic is not None:
        check_topic(topic)
    if channel is not None:
        if topic is None:
            raise ValueError("nsqd_stats: a channel needs its topic; give topic= too")
        check_channel(channel)
    url = _url(base, "/stats", format="json", topic=topic, channel=channel,
               include_clients=None if include_clients else "false")
    return Call("GET", url, parse_nsqd_stats, node, topic, channel, answer="stats")


def _action(action: str) -> str:
    if action not in TOPIC_ACTIONS:
        raise ValueError(f"unknown action {action!r}: use one of {', '.join(TOPIC_ACTIONS)}")
    return action


def topic_action(address: str, action: str, topic: str) -> Call[None]:
    """``POST /topic/<action>?topic=`` (create, delete, empty, pause, unpause)."""
    base, node = base_url(address, "nsqd")
    check_topic(topic)
    return Call("POST", _url(base, f"/topic/{_action(action)}", topic=topic), _parse_ok,
                node, topic)


def channel_action(address: str, action: str, topic: str, channel: str) -> Call[None]:
    """``POST /channel/<action>?topic=&channel=`` (create, delete, empty, pause,
    unpause)."""
    base, node = base_url(address, "nsqd")
    check_topic(topic)
    check_channel(channel)
    return Call("POST", _url(base, f"/channel/{_action(action)}", topic=topic,
                             channel=channel), _parse_ok, node, topic, channel)


def lookup(address_or_url: str, topic: str | None = None) -> Call[Lookup]:
    """``GET /lookup?topic=``; an unknown topic is an empty :class:`Lookup`. With
    ``topic`` None, ``address_or_url`` is a full lookup URL (discovery builds it,
    :func:`nsq_spark._lookupd.lookup_url`)."""
    if topic is None:
        url = strip_userinfo(address_or_url)
        return Call("GET", url, parse_lookup, f"nsqlookupd {url}", missing=Lookup(),
                    has_missing=True, answer="lookup")
    base, node = base_url(address_or_url, "nsqlookupd")
    check_topic(topic)
    return Call("GET", _url(base, "/lookup", topic=topic), parse_lookup, node, topic,
                missing=Lookup(), has_missing=True, answer="lookup")


def lookupd_nodes(address: str) -> Call[list[LookupdProducer]]:
    """``GET /nodes``: every nsqd registered with the lookupd."""
    base, node = base_url(address, "nsqlookupd")
    return Call("GET", _url(base, "/nodes"), parse_producers, node, answer="lookup")


def lookupd_topics(address: str) -> Call[list[str]]:
    base, node = base_url(address, "nsqlookupd")
    return Call("GET", _url(base, "/topics"), _names("topics"), node, answer="lookup")


def lookupd_channels(address: str, topic: str) -> Call[list[str]]:
    base, node = base_url(address, "nsqlookupd")
    check_topic(topic)
    return Call("GET", _url(base, "/channels", topic=topic), _names("channels"), node, topic,
                missing=[], has_missing=True, answer="lookup")


def lookupd_info(address: str) -> Call[LookupdInfo]:
    base, node = base_url(address, "nsqlookupd")
    return Call("GET", _url(base, "/info"), _parse_lookupd_info, node)


#: What ``lookupd_topic_action`` / ``lookupd_channel_action`` can do (nsqlookupd's
#: ``/topic/<action>`` and ``/channel/<action>``: its registrations, not any nsqd's data).
LOOKUPD_ACTIONS = ("create", "delete")


def lookupd_topic_action(address: str, action: str, topic: str) -> Call[None]:
    """``POST /topic/<action>?topic=`` on nsqlookupd: ``delete`` drops the registration
    of the topic and of all its channels (what nsqadmin does before it deletes the topic
    on the nsqds); ``create`` registers it without any nsqd."""
    base, node = base_url(address, "nsqlookupd")
    check_topic(topic)
    if action not in LOOKUPD_ACTIONS:
        raise ValueError(f"unknown lookupd action {action!r}: use one of "
                         f"{', '.join(LOOKUPD_ACTIONS)}")
    return Call("POST", _url(base, f"/topic/{action}", topic=topic), _parse_ok, node, topic)


def lookupd_channel_action(address: str, action: str, topic: str, channel: str
                           ) -> Call[None]:
    """``POST /channel/<action>?topic=&channel=`` on nsqlookupd: ``delete`` drops the
    channel's registration (404 ``CHANNEL_NOT_FOUND`` when it has none), so that an nsqd
    that makes the topic again does not make the channel with it; ``create`` registers
    it."""
    base, node = base_url(address, "nsqlookupd")
    check_topic(topic)
    check_channel(channel)
    if action not in LOOKUPD_ACTIONS:
        raise ValueError(f"unknown lookupd action {action!r}: use one of "
                         f"{', '.join(LOOKUPD_ACTIONS)}")
    return Call("POST", _url(base, f"/channel/{action}", topic=topic, channel=channel),
                _parse_ok, node, topic, channel)


def tombstone(address: str, topic: str, node_address: str) -> Call[None]:
    """``POST /topic/tombstone?topic=&node=``: lookupd stops listing that nsqd for the
    topic (for ``--tombstone-lifetime``), so consumers stop finding it there while it is
    being retired. ``node_address`` is the nsqd's ``broadcast_address:http_port``
    (``[::1]:4151`` for IPv6).

    nsqlookupd v1.3.0 compares ``node`` with ``fmt.Sprintf("%s:%d", BroadcastAddress,
    HTTPPort)`` -- an IPv6 host without brackets -- and answers 200 whether or not a
    producer matched, so the node is sent that way, and the clients check the result
    with :func:`check_tombstoned` on ``/nodes``."""
    base, node = base_url(address, "nsqlookupd")
    check_topic(topic)
    target = parse_address(node_address, "node_address", "127.0.0.1:4151")
    return Call("POST", _url(base, "/topic/tombstone", topic=topic,
                             node=f"{target.host}:{target.port}"),
                _parse_ok, node, topic)


def check_tombstoned(call: Call[None], nodes: list[LookupdProducer], node_address: str
                     ) -> None:
    """After the :func:`tombstone` ``call``: return when ``nodes`` (that lookupd's
    ``/nodes``) has the nsqd at ``node_address`` (its ``broadcast_address:http_port``)
    tombstoned for the topic, else raise :class:`NotFoundError` (``NODE_NOT_FOUND``).
    lookupd answers the tombstone request 200 even when no producer matched (a typo,
    the TCP port, a hostname where lookupd knows an IP), so only ``/nodes`` tells.

    * The nsqd is listed for the topic but not tombstoned: the tombstone did not take,
      or already expired (a ``--tombstone-lifetime`` shorter than reading ``/nodes``).
    * The nsqd is listed, but not for the topic: lookupd tombstones among the topic's
      producers, so nothing was tombstoned.
    * No such nsqd is listed at all: not confirmed either way. Either none is registered
      there (nothing was tombstoned), or lookupd leaves it out of ``/nodes`` as inactive
      (no heartbeat for its ``--inactive-producer-timeout``, 300 s by default) while the
      tombstone may have taken. Still an error, saying so: the caller must not be told
      the tombstone took when that is not known."""
    target = parse_address(node_address, "node_address", "127.0.0.1:4151")
    topic = str(call.topic)
    carrying = [p for p in nodes if topic in p.topics]
    known = ", ".join(str(p.http_address) for p in carrying) or "none"
    hint = (f"the producers of {topic!r} it knows: {known}; give one of those (the nsqd's "
            "HTTP port, 4151 by default, not its TCP port)")
    at = [p for p in nodes
          if p.broadcast_address == target.host and p.http_port == target.port]
    for p in at:
        if topic in p.topics:
            i = p.topics.index(topic)
            if i < len(p.tombstones) and p.tombstones[i]:
                return
    if any(topic in p.topics for p in at):
        what = (f"{call.node} lists the producer of topic {topic!r} at {target} but not as "
                "tombstoned: the tombstone did not take, or it already expired (lookupd's "
                "--tombstone-lifetime shorter than the time to read /nodes)")
    elif at:
        listed = ", ".join(sorted({t for p in at for t in p.topics})) or "no topic"
        what = (f"{call.node} tombstoned nothing: no producer of topic {topic!r} is at "
                f"{target} (broadcast_address:http_port); the nsqd there is registered for "
                f"{listed} only; {hint}")
    else:
        what = (f"{call.node} did not confirm the tombstone: no producer of topic "
                f"{topic!r} is at {target} (broadcast_address:http_port) in its /nodes, "
                "which lists no nsqd there at all: either none is registered there and "
                "nothing was tombstoned, or lookupd leaves it out of /nodes as inactive "
                "(no heartbeat for its --inactive-producer-timeout, 300 s by default) and "
                f"the tombstone may have taken; {hint}")
    raise NotFoundError(what, status=200, message="NODE_NOT_FOUND", url=call.url)
