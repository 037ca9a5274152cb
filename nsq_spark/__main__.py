"""``python -m nsq_spark publish|tail`` (see nsq_spark.cli)."""

import sys

from nsq_spark.cli import main

if __name__ == "__main__":
    sys.exit(main())
