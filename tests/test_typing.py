"""What a user's type checker sees through the top-level names (``import nsq_spark as
nsq``, ``from nsq_spark import Producer``): the real classes, not ``Any``.

The runtime exports are lazy (``__getattr__``); the ``TYPE_CHECKING`` imports beside them
are what mypy and IDEs read. These tests run mypy on small user scripts."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import nsq_spark

PACKAGE_ROOT = Path(nsq_spark.__file__).resolve().parent.parent

BAD_SCRIPT = '''
import nsq_spark as nsq
from nsq_spark import Producer

producer = nsq.Producer("127.0.0.1:4150")
producer.publish("events", "a str, not bytes")
Producer("127.0.0.1:4150").mpublish("events", ["also", "str"])
nsq.Reader("events", "archive", message_handler=42)
'''

GOOD_SCRIPT = '''
import nsq_spark as nsq
from nsq_spark import Message, Producer, Reader


def handler(message: Message) -> bool:
    print(message.body.decode())
    return True


with nsq.Producer("127.0.0.1:4150") as producer:
    producer.publish("events", b"hello")
    producer.mpublish("events", [b"a", b"b"])
reader: Reader = nsq.Reader("events", "archive", message_handler=handler,
                            nsqd_tcp_addresses=["127.0.0.1:4150"])
error: type[nsq.Error] = nsq.NSQError
p: Producer = Producer("127.0.0.1:4150")
'''


@pytest.mark.unit
def test_every_lazy_export_has_a_type_checking_import():
    tree = ast.parse(Path(nsq_spark.__file__).read_text())
    seen: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for imp in node.body:
                assert isinstance(imp, ast.ImportFrom)
                for alias in imp.names:
                    seen[alias.asname or alias.name] = f"{imp.module}.{alias.name}"
    lazy = {name: f"{module}.{name}" for name, module in nsq_spark._EXPORTS.items()}
    lazy.update({name: f"{module}.{attr}" for name, (module, attr) in nsq_spark._ALIASES.items()})
    assert seen == lazy


@pytest.mark.unit
@pytest.mark.timeout(120)
def test_mypy_sees_the_real_classes_through_the_top_level_names(tmp_path):
    pytest.importorskip("mypy")
    (tmp_path / "bad.py").write_text(textwrap.dedent(BAD_SCRIPT))
    (tmp_path / "good.py").write_text(textwrap.dedent(GOOD_SCRIPT))
    # MYPYPATH: the package under test (this checkout, not whatever is installed);
    # follow-imports=silent: report the user's scripts only, as for an installed package
    env = {**os.environ, "MYPYPATH": str(PACKAGE_ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", "", "--follow-imports", "silent",
         "--cache-dir", str(tmp_path / "cache"), "--python-version", "3.11",
         "--no-error-summary", "--show-error-codes", "bad.py", "good.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=110)
    out = proc.stdout + proc.stderr
    errors = [line for line in out.splitlines() if ": error:" in line]
    assert not [e for e in errors if e.startswith("good.py")], out
    assert any(e.startswith("bad.py:6:") and '"publish" of "Producer"' in e
               and '"str"' in e and '"bytes"' in e for e in errors), out
    assert any(e.startswith("bad.py:7:") and '"str"; expected "bytes"' in e for e in errors), out
    assert any(e.startswith("bad.py:8:") and "message_handler" in e for e in errors), out
    assert proc.returncode == 1, out


TESTS_DIR = Path(__file__).resolve().parent

def strict_mypy(tmp_path: Path, search_dir: Path, *files: str) -> tuple[int, str]:
    """``mypy --strict`` on ``files`` from ``tmp_path``, with the package and ``search_dir``
    (where the checked test module lives) on the path; its exit code and output."""
    env = {**os.environ, "MYPYPATH": os.pathsep.join([str(PACKAGE_ROOT), str(search_dir)])}
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", "", "--strict",
         "--follow-imports", "silent", "--cache-dir", str(tmp_path / "cache"),
         "--python-version", "3.11", "--no-error-summary", "--show-error-codes", *files],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=170)
    return proc.returncode, proc.stdout + proc.stderr


BROKEN_FAKE = '''
from fake_nsqd import FakeConn, FakeConnections
from nsq_spark.consumer.connection_port import ConnectNsqd, ConsumerConnection


class NoTouch(FakeConn):
    touch = None  # the port needs touch(message_id)


def make(nsqd: FakeConnections, conn: NoTouch) -> tuple[ConnectNsqd, ConsumerConnection]:
    return nsqd, conn
'''


@pytest.mark.unit
@pytest.mark.timeout(180)
def test_the_consumer_unit_tests_fake_conforms_to_the_connection_port(tmp_path):
    """tests/fake_nsqd.py is checked by mypy (strict) against the consumer's connection
    port; a fake that drifts from the port fails (the broken variant shows the check
    bites)."""
    pytest.importorskip("mypy")
    (tmp_path / "broken_fake.py").write_text(textwrap.dedent(BROKEN_FAKE))
    code, out = strict_mypy(tmp_path, TESTS_DIR, str(TESTS_DIR / "fake_nsqd.py"))
    assert code == 0, out
    code, out = strict_mypy(tmp_path, TESTS_DIR, "broken_fake.py")
    assert code == 1 and "broken_fake.py:11:" in out and "ConsumerConnection" in out, out


# -- the Spark unit tests' Reader stand-in (tests/spark/stand_in_reader.py) ----------------

SPARK_TESTS_DIR = TESTS_DIR / "spark"

DRIFTED_STAND_IN = '''
from typing import Any

from stand_in_reader import StandInReader
from nsq_spark.spark.fetch_task import ReaderPort
from nsq_spark.spark.reader_cache import Pausable


class NoPause(StandInReader):
    def set_max_in_flight(self, max_in_flight: str) -> None:  # the ports take an int
        pass


def port(reader: NoPause) -> ReaderPort:
    return reader


def cached(reader: NoPause) -> Pausable:
    return reader
'''


@pytest.mark.unit
@pytest.mark.timeout(180)
def test_the_spark_unit_tests_reader_stand_in_conforms_to_its_ports(tmp_path):
    """tests/spark/stand_in_reader.py is checked by mypy (strict) against the fetch task's
    ReaderPort and the reader cache's Pausable; a stand-in that drifts from them fails
    (the drifted variant shows the check bites)."""
    pytest.importorskip("mypy")
    (tmp_path / "drifted_stand_in.py").write_text(textwrap.dedent(DRIFTED_STAND_IN))
    code, out = strict_mypy(tmp_path, SPARK_TESTS_DIR,
                            str(SPARK_TESTS_DIR / "stand_in_reader.py"))
    assert code == 0, out
    code, out = strict_mypy(tmp_path, SPARK_TESTS_DIR, "drifted_stand_in.py")
    assert code == 1, out
    assert "drifted_stand_in.py:15:" in out and "ReaderPort" in out, out
    assert "drifted_stand_in.py:19:" in out and "Pausable" in out, out


# -- the dedup unit tests' store stand-ins (tests/dedup_fakes.py) ---------------------------

DRIFTED_STORE = '''
from typing import Sequence

from dedup_fakes import ScriptedClaims
from nsq_spark.dedup import ClaimingDeduplicator, Key


class NoLease(ScriptedClaims):
    def renew_many(self, keys: Sequence[Key]) -> None:  # the port takes lease_ms too
        pass


def port(store: NoLease) -> ClaimingDeduplicator:
    return store
'''


@pytest.mark.unit
@pytest.mark.timeout(180)
def test_the_dedup_unit_tests_store_stand_ins_conform_to_the_ports(tmp_path):
    """tests/dedup_fakes.py is checked by mypy (strict) against the claim-then-commit port
    and the older one-step interface; a stand-in that drifts fails (the drifted variant
    shows the check bites)."""
    pytest.importorskip("mypy")
    (tmp_path / "drifted_store.py").write_text(textwrap.dedent(DRIFTED_STORE))
    code, out = strict_mypy(tmp_path, TESTS_DIR, str(TESTS_DIR / "dedup_fakes.py"))
    assert code == 0, out
    code, out = strict_mypy(tmp_path, TESTS_DIR, "drifted_store.py")
    assert code == 1 and "drifted_store.py:14:" in out and "ClaimingDeduplicator" in out, out
