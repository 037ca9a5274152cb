"""The publish spool on a full disk, for real: a small tmpfs the test mounts, filled by a
file, a real nsqd. A full disk must never make the spool acknowledge what it did not
write, and the spool must come back without a restart -- by retiring its own delivered
data at once, and as soon as space is freed.

Mounting needs root with CAP_SYS_ADMIN. Without it the tests skip with the reason; under
``CI`` they fail only when mounting was expected to work (root with CAP_SYS_ADMIN) and
did not, so a CI runner that is not privileged skips instead of failing."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Iterator

import pytest

from nsq_spark import Producer
from nsq_spark.spool import SpoolError
from test_publish_spool_nsqd import TOPIC, check_delivery, drain_channel, make_channel

pytestmark = [pytest.mark.nsqd, pytest.mark.timeout(60)]

FS_BYTES = 1 << 20
BODY = 1000


def _has_cap_sys_admin() -> bool:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) & (1 << 21))
    except OSError:
        pass
    return False


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs at tmp_path/fs, unmounted afterwards."""
    where = tmp_path / "fs"
    where.mkdir()
    expected = os.geteuid() == 0 and _has_cap_sys_admin() and shutil.which("mount")
    if not expected:
        pytest.skip("mounting a small tmpfs needs root with CAP_SYS_ADMIN and mount(8)")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={FS_BYTES},mode=0700",
                        "tmpfs", str(where)], capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        why = f"mount -t tmpfs failed: {r.stderr.strip()}"
        if os.environ.get("CI"):
            pytest.fail(why + " (root with CAP_SYS_ADMIN: it was expected to work)")
        pytest.skip(why)
    try:
        yield where
    finally:
        r = subprocess.run(["umount", str(where)], capture_output=True, timeout=30)
        if r.returncode != 0:   # something still open: detach it, it goes when closed
            subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=30)


def fill(path: Path, leave: int = 0) -> int:
    """Write ``path`` until the filesystem is full (or only ``leave`` bytes are left);
    returns its size. Bounded by the filesystem's size."""
    st = os.statvfs(path.parent)
    room = st.f_bavail * st.f_frsize
    size = 0
    with open(path, "wb") as f:
        for _ in range(4 * FS_BYTES // 4096):   # bounded: more than the fs can hold
            if room - size - 4096 < leave:
                break
            try:
                f.write(b"\0" * 4096)
                f.flush()
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
                break
            size += 4096
    return size


@pytest.mark.nsq_cluster(lookupd=0)
def test_after_enospc_the_spool_frees_its_delivered_data_and_publishing_resumes(
        nsq_cluster, small_fs):
    """Issue #22, 2: the delivered active segment was kept until 8 MiB, so the spool's
    own delivered data kept the disk full: 20 of 20 later publishes failed."""
    make_channel(nsq_cluster)
    spool = small_fs / "spool"
    sent = []
    with Producer(nsq_cluster.nsqd_tcp_addresses[0], spool_dir=spool) as p:
        for i in range(4):   # ~400 KB through the spool, all delivered
            bodies = [b"before-%d-%03d-" % (i, j) + b"x" * BODY for j in range(100)]
            p.mpublish(TOPIC, bodies)
            sent += bodies
        assert p.flush(20)
        assert p.stats()["spool_pending"] == 0
        fill(small_fs / "filler")    # the disk is full now
        # published one by one, as an application would, each tried again after a pause
        # when it fails: a publish that lands while the previous one is still on its way
        # to nsqd can meet the full disk (there is nothing delivered to free yet)
        failed = 0
        for i in range(20):
            body = b"after-%02d-" % i + b"y" * BODY
            for _ in range(5):
                try:
                    p.publish(TOPIC, body)
                except SpoolError as exc:
                    assert "out of disk space" in str(exc)
                    failed += 1
                    time.sleep(0.05)
                else:
                    sent.append(body)
                    break
            time.sleep(0.005)
        assert len(sent) == 420, f"{420 - len(sent)} of 20 publishes never got in " \
            f"({failed} failures) while the spool held only delivered data"
        assert failed <= 4, f"{failed} failures for 20 publishes"
        assert p.flush(20)
        st = p.stats()
    assert (st["appended"], st["acked"], st["rejected"]) == (420, 420, 0)
    check_delivery(drain_channel(nsq_cluster), set(sent), max_dups=0)


@pytest.mark.nsq_cluster(lookupd=0)
def test_a_full_disk_raises_and_publishing_resumes_once_space_is_freed(nsq_cluster,
                                                                        small_fs):
    make_channel(nsq_cluster)
    node = nsq_cluster.nsqds[0]
    spool = small_fs / "spool"
    filler = small_fs / "filler"
    fill(filler, leave=200 << 10)
    accepted = []
    with Producer(nsq_cluster.nsqd_tcp_addresses[0], spool_dir=spool,
                  retry_max_wait=0.2) as p:
        node.terminate()   # nothing is delivered, so nothing can be freed by the spool
        err = None
        for i in range(2000):   # bounded: 200 KB fill up far sooner
            body = b"during-%04d-" % i + b"z" * BODY
            try:
                p.publish(TOPIC, body)
            except SpoolError as exc:
                err = exc
                break
            accepted.append(body)
        assert err is not None, "the disk never filled"
        assert str(spool) in str(err) and "out of disk space" in str(err)
        assert 100 < len(accepted) < 200
        with pytest.raises(SpoolError, match="NOT spooled"):
            p.mpublish(TOPIC, [b"still full" * 1000])   # more than a page's slack
        assert p.stats()["appended"] == len(accepted)   # nothing counted that failed
        filler.unlink()                                   # space is freed: no restart
        for i in range(20):
            body = b"freed-%02d" % i
            p.publish(TOPIC, body)
            accepted.append(body)
        node.start()
        assert p.flush(30), f"{p.pending_bytes()} bytes not delivered"
        st = p.stats()
    assert (st["appended"], st["acked"], st["rejected"]) == (len(accepted),) * 2 + (0,)
    check_delivery(drain_channel(nsq_cluster), set(accepted), max_dups=0)
