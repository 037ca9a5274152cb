"""The one retry policy of publishing, for the blocking, asyncio and spool paths alike
(below both :mod:`nsq_spark._publish` and :mod:`nsq_spark.spool`, which use it; its old
path ``nsq_spark.publish.retry`` still imports for one release: :mod:`nsq_spark._moved`).

Which failures are retried is not decided here: :func:`nsq_spark.errors.is_transient`
is the one classification of the direct publish paths, and the publish spool passes its
own (:func:`nsq_spark.spool._drain.refused`: only a refusal of the message itself ends
retrying there). This module only says *how often* and *how long between*.

The budget is time: retrying goes on until ``deadline`` seconds after the first attempt
(the Producer's ``retry_deadline``, 30 s by default) -- long enough to ride out an nsqd
restart of a few seconds. ``max_tries`` can bound the attempts as well (None: no count, the
deadline alone; the spool passes no deadline either and retries until it is stopped). A
caller with a deadline of its own (a ``publish_timeout``) passes it, and retrying ends at
the earlier of the two; no wait sleeps past it. Waits are exponential with full jitter
(so that many publishers that lost the same nsqd do not come back in lock step), capped at
``max_wait``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

from tenacity import (AsyncRetrying, RetryCallState, Retrying, retry_if_exception,
                      stop_after_attempt, stop_never, stop_when_event_set,
                      wait_random_exponential)

from nsq_spark.errors import is_transient

__all__ = ["RetryPolicy"]


def _never() -> bool:
    return False


@dataclass(frozen=True)
class RetryPolicy:
    """How a transient publishing failure is retried.

    Args:
        max_tries: attempts in all (1 = no retry); None: no count, until the deadline (or,
            without one, until ``stopped()`` is true).
        deadline: seconds after the first attempt when retrying ends; None: no limit.
        wait: base of the exponential backoff, seconds.
        max_wait: cap of one wait, seconds.
    """

    max_tries: int | None = None
    deadline: float | None = 30.0
    wait: float = 0.1
    max_wait: float = 2.0

    def _kwargs(self, tries: int | None, stopped: Callable[[], bool],
                on_retry: Callable[[RetryCallState], None] | None,
                until: float | None,
                retry_if: Callable[[BaseException], bool] = is_transient) -> dict[str, Any]:
        """``until``: the caller's own deadline (``time.monotonic()``), if any."""
        if self.deadline is not None:
            own = time.monotonic() + self.deadline
            until = own if until is None else min(until, own)
        stop: Any = stop_never if tries is None else stop_after_attempt(max(1, tries))
        backoff = wait_random_exponential(multiplier=self.wait, max=self.max_wait)
        wait: Any = backoff
        if until is not None:
            end = until

            def out_of_time(_: RetryCallState) -> bool:
                return time.monotonic() >= end

            def capped(state: RetryCallState) -> float:
                # never sleep past the deadline: the last attempt comes just before it
                return max(0.0, min(backoff(state), end - time.monotonic() - 0.01))

            stop = stop | out_of_time
            wait = capped
        kwargs: dict[str, Any] = dict(
            stop=stop, wait=wait,
            retry=retry_if_exception(lambda e: retry_if(e) and not stopped()),
            reraise=True)
        if on_retry is not None:
            kwargs["before_sleep"] = on_retry
        return kwargs

    def retrying(self, *, tries: int | None = None, stopped: Callable[[], bool] = _never,
                 on_retry: Callable[[RetryCallState], None] | None = None,
                 stop_event: Any = None, deadline: float | None = None,
                 retry_if: Callable[[BaseException], bool] = is_transient) -> Retrying:
        """A blocking ``tenacity.Retrying``. ``tries`` overrides ``max_tries`` (a caller that
        already spent an attempt passes one less). With ``stop_event`` (a
        ``threading.Event``) waits end early and retrying stops once it is set.
        ``deadline`` (``time.monotonic()``) ends retrying earlier than the policy's own.
        ``retry_if``: which failures are retried (default: the one classification)."""
        kwargs = self._kwargs(self.max_tries if tries is None else tries, stopped, on_retry,
                              deadline, retry_if)
        if stop_event is not None:
            kwargs["stop"] = kwargs["stop"] | stop_when_event_set(stop_event)
            kwargs["sleep"] = stop_event.wait
        return Retrying(**kwargs)

    def async_retrying(self, *, tries: int | None = None, stopped: Callable[[], bool] = _never,
                       on_retry: Callable[[RetryCallState], None] | None = None,
                       deadline: float | None = None) -> AsyncRetrying:
        """The same policy for coroutines."""
        return AsyncRetrying(**self._kwargs(self.max_tries if tries is None else tries,
                                            stopped, on_retry, deadline))
