"""Old import path of :mod:`nsq_spark.testing.install` (provide the NSQ binaries), kept for
users and scripts: ``python -m nsq_spark.install`` works as before. New code imports
:mod:`nsq_spark.testing.install`."""

from __future__ import annotations

import sys

from nsq_spark.testing.install import *  # noqa: F401,F403
from nsq_spark.testing.install import __all__, main

if __name__ == "__main__":
    sys.exit(main())
