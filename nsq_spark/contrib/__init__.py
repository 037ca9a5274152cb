"""Ready-made pieces built on the public API, for common needs that are not the core's.

* :mod:`~nsq_spark.contrib.dead_letter`: a ``giving_up`` handler for the Reader that
  republishes a message over ``max_tries`` to a dead-letter topic (through the Producer,
  optionally spooled) and finishes it only once that copy is safe, plus the record format
  and the function that reads the records back.

Nothing in the core imports this package: a Reader or Producer works the same without it.
"""

from __future__ import annotations

__all__: list[str] = []
