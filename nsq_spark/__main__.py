"""``python -m nsq_spark publish|tail|install-nsq``: the ``nsq-spark`` command
(see nsq_spark.cli)."""

import sys

from nsq_spark.cli import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m nsq_spark"))
