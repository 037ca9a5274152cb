"""Shared test configuration. The NSQ/redis/memcached fixtures come from the
``nsq_spark.testing`` pytest plugin (registered by the package's entry point)."""
