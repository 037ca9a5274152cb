"""pynsq's ``Writer`` on top of :class:`nsq_spark.Producer`, for ``import nsq_spark as nsq``
users: ``pub``, ``mpub``, ``dpub`` with a ``callback(conn, data)``, each returning a
future.

The contract, as pynsq's: ``pub``/``mpub``/``dpub`` never raise. Every outcome goes to the
callback, ``data`` being nsqd's answer (``b"OK"``) or the error (an
:class:`~nsq_spark.errors.NSQError`, which is pynsq's ``nsq.protocol.Error``): a bad topic
or body, a call made off the event loop (``SendError``), a connection that failed
(``ConnectError``, also a ``SendError``) or an nsqd error frame. The returned future (an
asyncio future: ``await`` it, or ``yield`` it in a tornado coroutine) gets the same
outcome. Without a callback a failure is logged, as pynsq logs it.

The callback's ``conn``, as pynsq's: the connection that carried the command, seen as a
:class:`WriterConnection` with pynsq's ``id`` (``"host:port"``), ``host``, ``port`` and
``str(conn)``; one object per nsqd, so it can key a dict. If a retry sent the command to
another nsqd, it is the last one tried. When no connection carried it (bad arguments, no
nsqd reachable) it is None, however many nsqds are configured, as pynsq 0.9.1 passes
None whenever it had no open connection (programs test ``conn is None``). Callbacks written for earlier nsq_spark releases, which passed the Writer
itself, keep working: any other attribute of ``conn`` is the Writer's (``conn.pub(...)``),
except ``close``/``aclose``: in pynsq ``conn.close()`` drops one connection, and closing
the whole Writer instead would be a surprise.

Differences from pynsq, each with its reason:

* ``str`` bodies are published UTF-8 encoded (pynsq's own Writer example publishes str;
  pynsq 0.9.1 fails those with SendError and closes the connection);
* the future completes when nsqd has answered, with its answer, and fails with the error
  (pynsq's completes once the bytes are written): awaiting it means "published";
* the callback's ``conn`` describes the connection (``id``, ``host``, ``port``) rather
  than being it: the Producer below owns, chooses and replaces connections itself, so a
  callback cannot send on it or close it (``conn.connected()``, ``conn.send()`` and
  ``conn.close()`` are not there); an IPv6 ``conn.id`` has brackets (``"[::1]:4150"``,
  pynsq's is ``"::1:4150"``), so that it parses back as an address;
* when no nsqd is reachable the callback hears it at once, as in pynsq (``conn`` None,
  a ``ConnectError``, a ``SendError``): unless ``max_tries`` or ``retry_deadline`` is
  given, a command gets one attempt per nsqd address (each one connected to in turn, the
  connect bounded by ``connect_timeout``), not the Producer's 30 s of retrying. Give
  either to have the Producer's retry policy (a publish then rides out an nsqd restart;
  its callback comes when that policy gives up). ``reconnect_interval`` is accepted and
  not used: a connection is made when a command needs one. A Writer takes no
  ``spool_dir`` (use ``Producer(..., spool_dir=...)``).

It lives with the rest of pynsq's surface in :mod:`nsq_spark.compat`; its old path
``nsq_spark.writer`` is a re-export.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Sequence

from tornado.ioloop import IOLoop

from .._log import get_logger
from .. import protocol, _validate as validate
from .._addresses import Address, parse_address_list
from ..errors import ConfigError, NSQError, SendError
from .._publish.producer import Producer

log = get_logger("nsq_spark.producer")

__all__ = ["Writer", "WriterConnection"]

Callback = Callable[[Any, Any], Any]


def _encoded(body: Any) -> Any:
    # pynsq's documented Writer usage publishes str bodies: UTF-8, the encoding pynsq
    # uses for every other str it sends
    return body.encode("utf-8") if isinstance(body, str) else body


#: what conn does not take from the Writer (pynsq's conn.close() closes one connection)
_NOT_FORWARDED = frozenset({"close", "aclose"})


class WriterConnection:
    """The ``conn`` a Writer callback receives: one nsqd connection as pynsq's callbacks
    see it.

    Attributes:
        id: ``"host:port"`` (IPv6 in brackets), pynsq's ``conn.id``; also ``str(conn)``.
        host: the nsqd host, without brackets.
        port: the nsqd TCP port.
        writer: the Writer that published.
    """

    __slots__ = ("id", "host", "port", "writer")

    def __init__(self, writer: "Writer", address: Address) -> None:
        self.id = str(address)
        self.host = address.host
        self.port = address.port
        self.writer = writer

    def __getattr__(self, name: str) -> Any:
        # callbacks written when nsq_spark passed the Writer itself: conn.pub(...) etc.
        if name in WriterConnection.__slots__:  # unset (a copy): no recursion
            raise AttributeError(name)
        if name in _NOT_FORWARDED:
            raise AttributeError(
                f"{name}: a Writer callback's conn ({self.id}) cannot be closed; the Writer "
                "owns its connections (close the Writer itself: conn.writer.close())")
        return getattr(self.writer, name)

    def __str__(self) -> str:
        return self.id

    def __repr__(self) -> str:
        return f"<WriterConnection {self.id}>"


class _Route:
    """The nsqd a command was last sent to (told by the pool, on the loop)."""

    __slots__ = ("key",)

    def __init__(self) -> None:
        self.key: str | None = None

    def __call__(self, key: str) -> None:
        self.key = key


class Writer(Producer):
    """pynsq's ``Writer`` surface on the Producer.

    ``pub``, ``mpub`` and ``dpub`` return a future at once and call
    ``callback(conn, data)`` on the event loop with the connection (a
    :class:`WriterConnection`) and nsqd's answer or the error. Call
    them from the running loop (a tornado/asyncio callback, as with pynsq's ``nsq.run()``);
    the writer connects on first use. Options are the Producer's and the connection
    options (``conn_kwargs`` keeps the latter, as pynsq's Writer does).
    """

    def __init__(self, nsqd_tcp_addresses: str | Sequence[str], reconnect_interval: float = 15.0,
                 name: str | None = None, **kwargs: Any) -> None:
        if kwargs.get("spool_dir") is not None:
            raise ConfigError("spool_dir is an option of nsq_spark.Producer, not of Writer "
                              "(whose pub() answers through a callback once nsqd has the "
                              "message); use Producer(..., spool_dir=...)")
        self.reconnect_interval = validate.seconds(reconnect_interval, "reconnect_interval")
        if "max_tries" not in kwargs and "retry_deadline" not in kwargs:
            # pynsq calls back at once when no connection is open: one attempt per nsqd
            kwargs["max_tries"] = max(1, len(parse_address_list(nsqd_tcp_addresses,
                                                                "nsqd_tcp_addresses")))
        super().__init__(nsqd_tcp_addresses, **kwargs)
        self.name = name or "nsq_spark.Writer"
        self._log = log.bind(producer=self.name)
        self.conn_kwargs = dict(kwargs)
        # one WriterConnection per nsqd, made on first use: pynsq keeps one conn per nsqd
        self._views: dict[str, WriterConnection] = {}
        if type(self).heartbeat is not Writer.heartbeat:  # costs nothing unless overridden
            self._tcp.on_heartbeat = self.heartbeat

    def heartbeat(self, conn: Any) -> None:
        """pynsq's hook: called on the loop after each heartbeat of a connection (already
        answered with NOP). Override it; the default does nothing."""

    # -- the three calls ------------------------------------------------------------------

    def pub(self, topic: str, msg: bytes | str,
            callback: Callback | None = None) -> "asyncio.Future[bytes]":
        """PUB one message; see the module docstring for the callback and the future."""
        return self._publish(f"PUB {topic}", callback, lambda: [
            protocol.pub(topic, _encoded(msg), self.max_msg_size)])

    def mpub(self, topic: str, msg: bytes | str | Sequence[bytes | str],
             callback: Callback | None = None) -> "asyncio.Future[bytes]":
        """MPUB the bodies of ``msg`` (a single body counts as one). A batch over
        ``max_mpub_bytes`` is sent as several MPUBs; the callback is called once, with
        ``b"OK"`` when all were acknowledged, else with the first error."""
        def encode() -> list[bytes]:
            bodies = [msg] if isinstance(msg, (bytes, bytearray, memoryview, str)) \
                else validate.bodies(msg, "msg")
            return self._encode_mpub(topic, [_encoded(b) for b in bodies])
        return self._publish(f"MPUB {topic}", callback, encode)

    def dpub(self, topic: str, delay_ms: int, msg: bytes | str,
             callback: Callback | None = None) -> "asyncio.Future[bytes]":
        """DPUB: nsqd delivers the message after ``delay_ms`` milliseconds."""
        return self._publish(f"DPUB {topic}", callback, lambda: [
            protocol.dpub(topic, validate.defer_ms(delay_ms, "delay_ms", optional=False),
                          _encoded(msg), self.max_msg_size)])

    # -- one path for all three -------------------------------------------------------------

    def _publish(self, what: str, callback: Callback | None,
                 encode: Callable[[], list[bytes]]) -> "asyncio.Future[bytes]":
        try:
            loop: asyncio.AbstractEventLoop = asyncio.get_running_loop()
        except RuntimeError:
            loop = IOLoop.current().asyncio_loop  # type: ignore[attr-defined]
        result: asyncio.Future[bytes] = loop.create_future()
        route = _Route()
        try:
            datas = encode()  # bad arguments are named before the loop is looked at
            self._bind_running_loop()
            futs = [self._tcp.command_future(data, route) for data in datas]
        except Exception as exc:
            # nothing was sent: as pynsq, the callback hears it before pub() returns
            if isinstance(exc, RuntimeError) and not isinstance(exc, NSQError):
                exc = SendError(f"{what}: Writer.pub/mpub/dpub must be called from the "
                                "running event loop (e.g. in a tornado callback after "
                                "nsq.run()); outside a loop use Producer.publish")
            elif not isinstance(exc, NSQError):  # e.g. a delay_ms that is not an int
                exc = SendError(f"{what}: invalid arguments", exc)
            result.set_exception(exc)
            self._deliver(result, callback, what, route)
            return result
        result.add_done_callback(lambda f: self._deliver(f, callback, what, route))
        answers = futs[0] if len(futs) == 1 else asyncio.gather(*futs)

        def settle(f: "asyncio.Future[Any]") -> None:
            if result.done():
                return
            exc: BaseException | None = (SendError(f"{what}: cancelled") if f.cancelled()
                                         else f.exception())
            if exc is not None:
                result.set_exception(exc)
            else:  # one answer, or every MPUB of a split batch acknowledged
                value = f.result()
                result.set_result(value if isinstance(value, bytes) else protocol.OK)

        answers.add_done_callback(settle)
        return result

    def _connection(self, route: _Route) -> WriterConnection | None:
        """The callback's ``conn``: the nsqd the command went to last; None when no
        connection carried it (pynsq)."""
        addresses: dict[str, Address] = self._tcp.addresses
        key = route.key
        if key is None:
            return None
        view = self._views.get(key)
        if view is None:
            address = addresses.get(key)
            if address is None:  # pragma: no cover - the pool names only its addresses
                return None
            view = self._views[key] = WriterConnection(self, address)
        return view

    def _deliver(self, fut: "asyncio.Future[bytes]", callback: Callback | None,
                 what: str, route: _Route) -> None:
        exc = None if fut.cancelled() else fut.exception()
        if callback is not None:
            try:
                callback(self._connection(route), exc if exc is not None else fut.result())
            except Exception:
                self._log.exception("[%s] %s: the callback raised", self.name, what)
        elif exc is not None:
            # nobody to tell but the future's awaiter, if any: log it (as pynsq does)
            self._log.error("[%s] %s failed (no callback given): %s", self.name, what, exc)
