"""The parts the :class:`nsq_spark.Producer` facade is built from.

``retry.py``  the one tenacity policy (attempts, deadline, jittered exponential waits),
              retrying by :func:`nsq_spark.errors.is_transient`.
``stats.py``  the counters (messages, bytes, retries, errors; per nsqd) and the nsqd
              up/down transitions with their log lines.
``http.py``   publishing through nsqd's HTTP API (``/pub``, ``/mpub``).

No part imports the Producer: it builds them and hands them what they need.
"""
