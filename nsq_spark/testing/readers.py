"""Readers running on their own event-loop threads, for synchronous tests
(:class:`ReaderRunner`; the ``running_reader`` fixture is one)."""

from __future__ import annotations

from typing import Any

from .processes import DEFAULT_START_TIMEOUT

__all__ = ["ReaderRunner"]


class ReaderRunner:
    """Readers running on their own event-loop threads, for synchronous tests.

    ``start(topic, channel, handler, **kwargs)`` builds a :class:`nsq_spark.Reader` (or
    ``reader_class``, e.g. a subclass with pynsq's hooks) with those arguments on a new
    loop thread (so handler, batch and coroutine handlers run as in an application) and
    returns it; ``stop(reader)`` closes it there (every message
    answered, the connections closed) and ends the thread; ``close()`` stops all that are
    left. The ``running_reader`` fixture is one, closed after the test."""

    def __init__(self) -> None:
        self._running: dict[int, tuple[Any, Any]] = {}

    def start(self, topic: str, channel: str, message_handler: Any = None, *,
              reader_class: Any = None, **kwargs: Any) -> Any:
        from nsq_spark._loop import LoopThread
        from nsq_spark._consumer.reader import Reader

        cls = reader_class or Reader
        thread = LoopThread(name=f"test-reader-{topic}-{channel}")

        async def build() -> Any:
            return cls(topic, channel, message_handler, **kwargs)
        try:
            reader = thread.run_coroutine(build()).result(DEFAULT_START_TIMEOUT)
        except BaseException:
            thread.stop()
            raise
        self._running[id(reader)] = (reader, thread)
        return reader

    def stop(self, reader: Any, timeout: float = 30.0) -> None:
        """Close ``reader`` on its loop (at most ``timeout`` s) and end its thread."""
        entry = self._running.pop(id(reader), None)
        if entry is None:
            return
        _, thread = entry
        try:
            thread.run_coroutine(reader.aclose()).result(timeout)
        finally:
            thread.stop()

    def close(self) -> None:
        """Stop every reader still running. A reader that fails to stop does not leave the
        others running (their loop threads would outlive the test): all are stopped, then
        the first failure is raised, with the later ones in its notes."""
        first: Exception | None = None
        for reader, _ in list(self._running.values()):
            try:
                self.stop(reader)
            except Exception as exc:  # not KeyboardInterrupt: an interrupt ends the cleanup
                if first is None:
                    first = exc
                else:
                    first.add_note(f"stopping another reader failed too: {exc!r}")
        if first is not None:
            raise first

    def __enter__(self) -> "ReaderRunner":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
