"""Old import path of :mod:`nsq_spark.testing.chaos` (Toxiproxy fault injection for tests),
kept for users: ``from nsq_spark.testing_chaos import toxiproxy, toxiproxy_server`` and
``python -m nsq_spark.testing_chaos`` work as before. New code imports
:mod:`nsq_spark.testing.chaos`."""

from __future__ import annotations

import sys

from nsq_spark.testing.chaos import *  # noqa: F401,F403
from nsq_spark.testing.chaos import __all__, main

if __name__ == "__main__":
    sys.exit(main())
