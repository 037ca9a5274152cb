"""The chaos tier: a real toxiproxy-server (``nsq_spark.testing.chaos``) between the
Reader / Producer and a real nsqd. Without the binary the tier skips with the install
command (scripts/install-toxiproxy), except under CI=1, where it fails."""

from __future__ import annotations

# the fixtures, made visible to every test in this directory
from nsq_spark.testing.chaos import toxiproxy, toxiproxy_server  # noqa: F401

__all__ = ["toxiproxy", "toxiproxy_server"]
