"""The consumer: :class:`Reader` (a facade) over parts that never import it.

See :mod:`nsq_spark.consumer.reader` for the behaviour and the map of the parts.
"""

from .reader import Reader
from .run import run

__all__ = ["Reader", "run"]
