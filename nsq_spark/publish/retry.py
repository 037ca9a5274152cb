"""Re-export of :mod:`nsq_spark._retry` (the retry policy moved below ``publish`` and
``spool``, which both use it); kept for users, the project imports the new path."""

from nsq_spark._retry import RetryPolicy

__all__ = ["RetryPolicy"]
