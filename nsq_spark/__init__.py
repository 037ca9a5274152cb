"""nsq_spark: a fast, full-spec NSQ client for Python, with a PySpark connector.

``import nsq_spark as nsq`` is meant as a drop-in upgrade for pynsq's Reader API.
"""

__version__ = "0.1.0.dev0"
