"""The spool across os.fork(): a forked child neither writes through its parent's
segments nor keeps their locks alive. (Forks a process, hence not a unit test.)"""

from __future__ import annotations

import os
import time

import pytest

from nsq_spark import Producer
from nsq_spark.spool import SegmentStore, SpoolError

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]


class Quiet:
    """A producer stand-in that never succeeds: messages stay in the spool."""

    def mpublish(self, topic, bodies):
        raise ConnectionRefusedError("no nsqd in this test")

    publish = mpublish

    def close(self):
        pass


def test_forked_child_refuses_writes_and_does_not_hold_locks(tmp_path):
    p = Producer(spool_dir=tmp_path, producer_factory=Quiet, retry_max_wait=0.05)
    p.mpublish("t", [b"parent-1", b"parent-2"])
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:   # the child: report, then linger so that its fds would still be open
        code = 3
        try:
            p.publish("t", b"child")
        except SpoolError as exc:
            code = 0 if "fork" in str(exc) else 4
        except BaseException:
            code = 5
        p.close()
        os.write(w, bytes([code]))
        time.sleep(5)
        os._exit(0)
    try:
        os.close(w)
        assert os.read(r, 1) == bytes([0]), "the child could write through the spool"
        p.close(timeout=0)          # the parent lets go; the child is still alive
        other = SegmentStore(tmp_path)
        assert other.claim_orphans() == 1, "the child still holds the parent's lock"
        b = other.next_batch()
        assert b.bodies == [b"parent-1", b"parent-2"]
        other.close()
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        os.close(r)
