"""Fake transports for the admin clients' and discovery's unit tests, typed against the
ports (nsq_spark.admin.transport.Transport / AsyncTransport) and checked by mypy --strict
in tests/test_admin_calls.py (a drifted fake fails there)."""

from __future__ import annotations

from nsq_spark.admin.calls import Answer
from nsq_spark.admin.transport import AsyncTransport, Transport

__all__ = ["FakeAsyncTransport", "FakeTransport", "ScriptedAsyncTransport",
           "ScriptedTransport"]


class FakeTransport:
    """Answers every request with one canned answer; records what was asked."""

    def __init__(self, answer: Answer = Answer(200, b"")) -> None:
        self.answer = answer
        self.asked: list[tuple[str, str, float]] = []
        self.limits: list[int] = []
        self.authorizations: list[str | None] = []

    def request(self, method: str, url: str, timeout: float, *, max_bytes: int,
                authorization: str | None = None) -> Answer:
        self.asked.append((method, url, timeout))
        self.limits.append(max_bytes)
        self.authorizations.append(authorization)
        return self.answer

    def close(self) -> None:
        pass


class FakeAsyncTransport:
    """The asyncio twin of :class:`FakeTransport`."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.asked: list[tuple[str, str]] = []

    async def request(self, method: str, url: str, timeout: float, *, max_bytes: int,
                      authorization: str | None = None) -> Answer:
        self.asked.append((method, url))
        return self.answer

    async def aclose(self) -> None:
        pass


class ScriptedTransport:
    """Answers (or raises) in the order given; records (method, URL) asked."""

    def __init__(self, *steps: Answer | BaseException) -> None:
        self.steps = list(steps)
        self.asked: list[tuple[str, str]] = []

    def request(self, method: str, url: str, timeout: float, *, max_bytes: int,
                authorization: str | None = None) -> Answer:
        self.asked.append((method, url))
        step = self.steps.pop(0)
        if isinstance(step, BaseException):
            raise step
        return step

    def close(self) -> None:
        pass


class ScriptedAsyncTransport:
    """Answers (or raises) in the order given; records the URLs asked."""

    def __init__(self, *steps: Answer | BaseException) -> None:
        self.steps = list(steps)
        self.asked: list[str] = []

    async def request(self, method: str, url: str, timeout: float, *, max_bytes: int,
                      authorization: str | None = None) -> Answer:
        self.asked.append(url)
        step = self.steps.pop(0)
        if isinstance(step, BaseException):
            raise step
        return step

    async def aclose(self) -> None:
        pass


def _conforms(a: FakeTransport, b: FakeAsyncTransport, c: ScriptedAsyncTransport,
              d: ScriptedTransport) -> tuple[Transport, AsyncTransport, AsyncTransport,
                                             Transport]:
    return a, b, c, d
