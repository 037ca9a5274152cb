"""The consumer (private; users import ``nsq_spark.Reader`` and ``nsq_spark.run``):
:class:`Reader` (a facade) over parts that never import it.

See :mod:`nsq_spark._consumer.reader` for the behaviour and the map of the parts.
"""

from .reader import Reader
from .run import run

__all__ = ["Reader", "run"]
