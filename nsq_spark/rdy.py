"""Moved: the RDY policy is the consumer's, :mod:`nsq_spark._consumer.rdy`; the read-side
flow control (:class:`RdyCredit`) is the connection's, :mod:`nsq_spark._rdy_credit`.

This module keeps the old import path working for users; the project never imports it.
"""

from nsq_spark._rdy_credit import *  # noqa: F401,F403
from nsq_spark._rdy_credit import RDY_LOWER_GRACE, RdyCredit
from nsq_spark._consumer.rdy import *  # noqa: F401,F403
from nsq_spark._consumer.rdy import (BACKOFF, NORMAL, STARVED_RATIO, TESTING, ConnRdy,
                                    RdyPolicy, commands_by_key)

__all__ = ["ConnRdy", "RdyPolicy", "RdyCredit", "RDY_LOWER_GRACE", "NORMAL", "BACKOFF",
           "TESTING", "STARVED_RATIO", "commands_by_key"]
