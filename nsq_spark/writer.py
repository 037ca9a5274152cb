"""pynsq's ``Writer`` on top of :class:`nsq_spark.Producer`, for ``import nsq_spark as nsq``
users: ``pub``, ``mpub``, ``dpub`` with a ``callback(writer, data)``.

The one difference from pynsq: reconnects follow the Producer's retry policy;
``reconnect_interval`` is accepted for compatibility and not used. A Writer publishes
directly: it takes no ``spool_dir`` (use ``Producer(..., spool_dir=...)``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable, Sequence

from . import protocol, validate
from .errors import ConfigError, NSQError
from .producer import Producer

log = logging.getLogger("nsq_spark.producer")

__all__ = ["Writer"]


class Writer(Producer):
    """pynsq's ``Writer`` surface on the Producer.

    ``pub``, ``mpub`` and ``dpub`` return at once and call ``callback(writer, data)`` on the
    event loop when nsqd answered: ``data`` is ``b"OK"`` or the exception (an NSQError).
    Call them from the running loop (a tornado/asyncio callback, as with pynsq's
    ``nsq.run()``); the writer connects on first use. ``reconnect_interval`` is accepted for
    compatibility: reconnects follow the Producer's retry policy instead.
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

    def _on_loop_future(self, data: bytes) -> "asyncio.Future[bytes]":
        try:
            self._bind_running_loop()
        except RuntimeError:
            raise NSQError("Writer.pub/mpub/dpub must be called from the running event loop "
                           "(e.g. in a tornado callback after nsq.run()); outside a loop use "
                           "Producer.publish") from None
        return self._command_future(data)

    def _callback(self, fut: "asyncio.Future[bytes]", callback: Callable[..., Any] | None,
                  what: str) -> None:
        if callback is None:
            def log_failure(f: "asyncio.Future[bytes]") -> None:
                # no callback to tell: log it (as pynsq does) rather than lose it silently
                exc = None if f.cancelled() else f.exception()
                if exc is not None:
                    log.error("[%s] %s failed (no callback given): %s", self.name, what, exc)
            fut.add_done_callback(log_failure)
            return

        def done(f: "asyncio.Future[bytes]") -> None:
            exc = None if f.cancelled() else f.exception()
            callback(self, exc if exc is not None else f.result())

        fut.add_done_callback(done)

    def pub(self, topic: str, msg: bytes, callback: Callable[..., Any] | None = None) -> None:
        self._callback(self._on_loop_future(protocol.pub(topic, msg, self.max_msg_size)), callback,
                       f"PUB {topic}")

    def mpub(self, topic: str, msg: bytes | Sequence[bytes],
             callback: Callable[..., Any] | None = None) -> None:
        bodies: Sequence[Any] = [msg] if isinstance(msg, (bytes, bytearray, memoryview)) \
            else validate.bodies(msg, "msg")
        datas = self._encode_mpub(topic, bodies)
        futs = [self._on_loop_future(d) for d in datas]
        if len(futs) == 1:
            self._callback(futs[0], callback, f"MPUB {topic}")
            return
        whole: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

        def settle(g: "asyncio.Future[Any]") -> None:
            exc = g.exception()
            if exc is not None:
                whole.set_exception(exc)
            else:
                whole.set_result(b"OK")  # every MPUB of the split batch was acknowledged

        asyncio.gather(*futs).add_done_callback(settle)
        self._callback(whole, callback, f"MPUB {topic}")

    def dpub(self, topic: str, delay_ms: int, msg: bytes,
             callback: Callable[..., Any] | None = None) -> None:
        delay_ms = validate.defer_ms(delay_ms, "delay_ms", optional=False)
        self._callback(self._on_loop_future(protocol.dpub(topic, delay_ms, msg,
                                                          self.max_msg_size)), callback,
                       f"DPUB {topic}")
