"""Moved: the backoff policy is the consumer's, :mod:`nsq_spark._consumer.backoff`.

This module keeps the old import path working for users; the project never imports it.
"""

from nsq_spark._consumer.backoff import *  # noqa: F401,F403
from nsq_spark._consumer.backoff import Action, Backoff, Decision, exponential, full_jitter

__all__ = ["Backoff", "Decision", "Action", "exponential", "full_jitter"]
