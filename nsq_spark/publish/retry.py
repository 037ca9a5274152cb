"""The one retry policy of publishing, for the blocking, asyncio and spool paths alike.

Which failures are retried is not decided here: :func:`nsq_spark.errors.is_transient`
is the one classification. This module only says *how often* and *how long between*:
bounded attempts (``max_tries``, or unbounded for the spool, which keeps every message
until nsqd takes it), a total deadline, and exponential waits with full jitter (so that
many publishers that lost the same nsqd do not come back in lock step).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from tenacity import (AsyncRetrying, RetryCallState, Retrying, retry_if_exception,
                      stop_after_attempt, stop_after_delay, stop_never, stop_when_event_set,
                      wait_random_exponential)

from nsq_spark.errors import is_transient

__all__ = ["RetryPolicy"]


def _never() -> bool:
    return False


@dataclass(frozen=True)
class RetryPolicy:
    """How a transient publishing failure is retried.

    Args:
        max_tries: attempts in all (1 = no retry); None: until ``stopped()`` is true.
        deadline: seconds after the first attempt when retrying ends; None: no limit.
        wait: base of the exponential backoff, seconds.
        max_wait: cap of one wait, seconds.
    """

    max_tries: int | None = 5
    deadline: float | None = 30.0
    wait: float = 0.1
    max_wait: float = 2.0

    def _kwargs(self, tries: int | None, stopped: Callable[[], bool],
                on_retry: Callable[[RetryCallState], None] | None) -> dict[str, Any]:
        stop: Any = stop_never if tries is None else stop_after_attempt(max(1, tries))
        if self.deadline is not None:
            stop = stop | stop_after_delay(self.deadline)
        kwargs: dict[str, Any] = dict(
            stop=stop,
            wait=wait_random_exponential(multiplier=self.wait, max=self.max_wait),
            retry=retry_if_exception(lambda e: is_transient(e) and not stopped()),
            reraise=True)
        if on_retry is not None:
            kwargs["before_sleep"] = on_retry
        return kwargs

    def retrying(self, *, tries: int | None = None, stopped: Callable[[], bool] = _never,
                 on_retry: Callable[[RetryCallState], None] | None = None,
                 stop_event: Any = None) -> Retrying:
        """A blocking ``tenacity.Retrying``. ``tries`` overrides ``max_tries`` (a caller that
        already spent an attempt passes one less). With ``stop_event`` (a
        ``threading.Event``) waits end early and retrying stops once it is set."""
        kwargs = self._kwargs(self.max_tries if tries is None else tries, stopped, on_retry)
        if stop_event is not None:
            kwargs["stop"] = kwargs["stop"] | stop_when_event_set(stop_event)
            kwargs["sleep"] = stop_event.wait
        return Retrying(**kwargs)

    def async_retrying(self, *, tries: int | None = None, stopped: Callable[[], bool] = _never,
                       on_retry: Callable[[RetryCallState], None] | None = None
                       ) -> AsyncRetrying:
        """The same policy for coroutines."""
        return AsyncRetrying(**self._kwargs(self.max_tries if tries is None else tries,
                                            stopped, on_retry))
