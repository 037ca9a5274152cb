"""pynsq's ``Writer`` on top of :class:`nsq_spark.Producer`, for ``import nsq_spark as nsq``
users: ``pub``, ``mpub``, ``dpub`` with a ``callback(writer, data)``, each returning a
future.

The contract, as pynsq's: ``pub``/``mpub``/``dpub`` never raise. Every outcome goes to the
callback, ``data`` being nsqd's answer (``b"OK"``) or the error (an
:class:`~nsq_spark.errors.NSQError`, which is pynsq's ``nsq.protocol.Error``): a bad topic
or body, a call made off the event loop (``SendError``), a connection that failed
(``ConnectError``, also a ``SendError``) or an nsqd error frame. The returned future (an
asyncio future: ``await`` it, or ``yield`` it in a tornado coroutine) gets the same
outcome. Without a callback a failure is logged, as pynsq logs it.

Differences from pynsq, each with its reason:

* ``str`` bodies are published UTF-8 encoded (pynsq's own Writer example publishes str;
  pynsq 0.9.1 fails those with SendError and closes the connection);
* the future completes when nsqd has answered, with its answer, and fails with the error
  (pynsq's completes once the bytes are written): awaiting it means "published";
* the callback's first argument is the Writer, not one connection (the Producer below
  chooses and replaces connections itself);
* reconnects follow the Producer's retry policy; ``reconnect_interval`` is accepted and
  not used. A Writer takes no ``spool_dir`` (use ``Producer(..., spool_dir=...)``).

It lives with the rest of pynsq's surface in :mod:`nsq_spark.compat`; its old path
``nsq_spark.writer`` is a re-export.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Sequence

from tornado.ioloop import IOLoop

from .._log import get_logger
from .. import protocol, validate
from ..errors import ConfigError, NSQError, SendError
from ..publish.producer import Producer

log = get_logger("nsq_spark.producer")

__all__ = ["Writer"]

Callback = Callable[[Any, Any], Any]


def _encoded(body: Any) -> Any:
    # pynsq's documented Writer usage publishes str bodies: UTF-8, the encoding pynsq
    # uses for every other str it sends
    return body.encode("utf-8") if isinstance(body, str) else body


class Writer(Producer):
    """pynsq's ``Writer`` surface on the Producer.

    ``pub``, ``mpub`` and ``dpub`` return a future at once and call
    ``callback(writer, data)`` on the event loop with nsqd's answer or the error. Call
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
        super().__init__(nsqd_tcp_addresses, **kwargs)
        self.name = name or "nsq_spark.Writer"
        self._log = log.bind(producer=self.name)
        self.conn_kwargs = dict(kwargs)
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
        try:
            datas = encode()  # bad arguments are named before the loop is looked at
            self._bind_running_loop()
            futs = [self._command_future(data) for data in datas]
        except Exception as exc:
            # nothing was sent: as pynsq, the callback hears it before pub() returns
            if isinstance(exc, RuntimeError) and not isinstance(exc, NSQError):
                exc = SendError(f"{what}: Writer.pub/mpub/dpub must be called from the "
                                "running event loop (e.g. in a tornado callback after "
                                "nsq.run()); outside a loop use Producer.publish")
            elif not isinstance(exc, NSQError):  # e.g. a delay_ms that is not an int
                exc = SendError(f"{what}: invalid arguments", exc)
            result.set_exception(exc)
            self._deliver(result, callback, what)
            return result
        result.add_done_callback(lambda f: self._deliver(f, callback, what))
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

    def _deliver(self, fut: "asyncio.Future[bytes]", callback: Callback | None,
                 what: str) -> None:
        exc = None if fut.cancelled() else fut.exception()
        if callback is not None:
            try:
                callback(self, exc if exc is not None else fut.result())
            except Exception:
                self._log.exception("[%s] %s: the callback raised", self.name, what)
        elif exc is not None:
            # nobody to tell but the future's awaiter, if any: log it (as pynsq does)
            self._log.error("[%s] %s failed (no callback given): %s", self.name, what, exc)
