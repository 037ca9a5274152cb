"""Publishing: the :class:`~nsq_spark.publish.producer.Producer` facade and its parts.

``producer.py``   the facade: validates the options, owns the public attributes, and picks
                  one transport in ``__init__`` (never asks the mode again)
``transport.py``  the ``Transport`` port between the facade and a transport
``direct.py``     the direct transport: blocking fast path, pipelined loop, or HTTP
``spooled.py``    the spooled transport: a durable spool (:mod:`nsq_spark.spool`) and its
                  drain, sending through a direct transport
``tcp.py``        the pipelined TCP pool on an event loop
``sync.py``       the blocking TCP pool in the callers' threads
``health.py``     the strategy order and each nsqd's backoff, shared by both TCP pools
``http.py``       publishing through nsqd's HTTP API (``/pub``, ``/mpub``)
``retry.py``      the one tenacity policy (attempts, deadline, jittered exponential waits),
                  retrying by :func:`nsq_spark.errors.is_transient`
``stats.py``      the counters (messages, bytes, retries, errors; per nsqd) and the nsqd
                  up/down transitions with their log lines

No part imports the facade: it builds them and hands them what they need. This package
imports nothing on its own (``nsq_spark.spool`` uses ``retry.py`` without loading the
Producer); import the Producer from ``nsq_spark`` or ``nsq_spark.publish.producer``.
"""
