"""Publishing: the :class:`~nsq_spark._publish.producer.Producer` facade and its parts.

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
``instrument.py`` OpenTelemetry of publishing: each publish call measured (a traced
                  transport) and each send of the spool's drain counted
``stats.py``      the counters (messages, bytes, retries, errors; per nsqd) and the nsqd
                  up/down transitions with their log lines

The retry policy is :mod:`nsq_spark._retry`, the one tenacity policy (attempts, deadline,
jittered exponential waits), below this package and :mod:`nsq_spark.spool` as both use it.

No part imports the facade: it builds them and hands them what they need. This package
is private and imports nothing on its own; users import the Producer from ``nsq_spark``.
"""
