"""pynsq 0.9.1's public classes that have no counterpart elsewhere in nsq_spark, built on
its parts, for ``import nsq_spark as nsq``:

* :class:`~nsq_spark.compat.writer.Writer`: pynsq's callback publisher over
  :class:`nsq_spark.Producer`;
* :class:`~nsq_spark.compat.async_conn.AsyncConn`: pynsq's evented connection
  (``on``/``off``/``trigger``, ``send``, ``send_rdy``) over :class:`nsq_spark._conn.Connection`;
* :class:`~nsq_spark.compat.sync.SyncConn`: pynsq's blocking framed socket;
* :class:`~nsq_spark.compat.backoff_timer.BackoffTimer`: pynsq's interval arithmetic;
* :class:`~nsq_spark.compat.legacy_reader.LegacyReader`: pynsq's deprecated task readers;
* :mod:`~nsq_spark.compat.event`: pynsq's event names and its ``EventedMixin``;
* :mod:`~nsq_spark.compat.reader_names`: module-level names of pynsq's ``nsq.reader``
  that programs import (``_utf8_params``), re-exported by :mod:`nsq_spark.reader`.

The modules are named as pynsq's (``nsq.conn`` is ``async_conn`` here, because
``nsq_spark._conn`` is ours), so a test harness can map pynsq's module paths onto them
(``scripts/run-pynsq-suite``). Writer is defined in terms of the Producer and
LegacyReader in terms of the Reader; neither facade imports anything from here.
"""
