"""Every typing check of the suite, on ONE mypy run (the module's ``mypy_run`` fixture).

What a user's type checker sees through the top-level names (``import nsq_spark as
nsq``, ``from nsq_spark import Producer``): the real classes, not ``Any``, each an explicit
re-export, so a user's program passes ``mypy --strict``. The runtime exports are lazy
(``__getattr__``); the ``TYPE_CHECKING`` imports beside them are what mypy and IDEs read.

And the unit tests' fakes and stand-ins, each checked against the port it stands in for,
with a drifted variant of each that must fail (the check bites).

One run over the package, the user scripts, the typed test modules and the drifted
variants together, its output shared by the assertions: mypy analyses the package and its
dependencies once, not once per check (seven separate runs took 22 s on this machine
class, the one run 8 s; the five files that held them, ``-n 0``: 51 s before, 33 s after,
two runs each; the dedup fakes' check, added since, is one more file in the run). Each
test reads the errors of its own files; a file expected to pass has no error line at all.

Strictness per file, as each check always had it: the package, the user programs, the
fakes and the stand-ins under ``--strict``; ``test_contrib_dead_letter.py`` and
``test_telemetry_unit.py`` (untyped test functions beside their typed fakes) and their
drifted variants under mypy's defaults, through per-module sections of the run's config.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

import nsq_spark

pytestmark = pytest.mark.unit

PACKAGE_ROOT = Path(nsq_spark.__file__).resolve().parent.parent
TESTS_DIR = Path(__file__).resolve().parent
SPARK_TESTS_DIR = TESTS_DIR / "spark"

# -- the user's programs ------------------------------------------------------------------

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

# A new user's program as the documentation writes it (``import nsq_spark as nsq``): the
# Reader, the Producer, the admin clients and the Spark helpers, under --strict.
USER_PROGRAM = '''
import asyncio
from typing import assert_type

import nsq_spark as nsq
import nsq_spark.spark
from nsq_spark.admin import AsyncNsqdClient, NsqdClient, NsqdStats
from nsq_spark.spark import SourceLag


def handle(message: nsq.Message) -> bool:
    print(message.id, message.body.decode(), message.attempts)
    return True


def first_program() -> None:
    with NsqdClient("127.0.0.1:4151") as admin:
        assert_type(admin, NsqdClient)
        admin.create_channel("events", "first")
        stats: NsqdStats = admin.stats(topic="events")
        print(stats.version)
    with nsq.Producer("127.0.0.1:4150") as producer:
        assert_type(producer, nsq.Producer)
        producer.publish("events", b"hello")
        producer.mpublish("events", [b"a", b"b"])
    with nsq.Reader("events", "first", nsqd_tcp_addresses=["127.0.0.1:4150"],
                    max_in_flight=100) as reader:
        assert_type(reader, nsq.Reader)
        for batch in reader.iter_batches(max_messages=100, timeout=1.0):
            assert_type(batch, list[nsq.Message])
            reader.finish(batch)
    nsq.Reader("events", "handled", message_handler=handle,
               lookupd_http_addresses=["127.0.0.1:4161"])
    try:
        nsq.run()
    except nsq.Error as exc:
        print(exc)


async def async_admin() -> None:
    async with AsyncNsqdClient("127.0.0.1:4151") as admin:
        assert_type(admin, AsyncNsqdClient)
        print(await admin.ping())


def spark_helpers(spark: object, progress: object) -> None:
    nsq_spark.spark.register(spark)
    lag = nsq_spark.spark.source_lag(progress)
    if lag is not None:
        assert_type(lag, SourceLag)
        print(lag.backlog_messages)


asyncio.run(async_admin())
'''

# The same checks must bite: an admin client typed as another, a str body, and a name the
# admin package imports but does not export (strict: no implicit re-export).
USER_PROGRAM_WRONG = '''
from typing import assert_type

import nsq_spark as nsq
from nsq_spark.admin import LookupdClient, NsqdClient
from nsq_spark.admin.client import Call

with NsqdClient("127.0.0.1:4151") as admin:
    assert_type(admin, LookupdClient)
nsq.Producer("127.0.0.1:4150").publish("events", "not bytes")
'''

# -- drifted variants of the fakes (each must fail the check) -----------------------------

BROKEN_FAKE = '''
from fake_nsqd import FakeConn, FakeConnections
from nsq_spark._consumer.connection_port import ConnectNsqd, ConsumerConnection


class NoTouch(FakeConn):
    touch = None  # the port needs touch(message_id)


def make(nsqd: FakeConnections, conn: NoTouch) -> tuple[ConnectNsqd, ConsumerConnection]:
    return nsqd, conn
'''

DRIFTED_STAND_IN = '''
from typing import Any

from stand_in_reader import StandInReader
from nsq_spark.spark._fetch_task import ReaderPort
from nsq_spark.spark._reader_cache import Pausable


class NoPause(StandInReader):
    def set_max_in_flight(self, max_in_flight: str) -> None:  # the ports take an int
        pass


def port(reader: NoPause) -> ReaderPort:
    return reader


def cached(reader: NoPause) -> Pausable:
    return reader
'''

DRIFTED_ADMIN = """from admin_fakes import FakeTransport
from nsq_spark.admin.calls import Answer
from nsq_spark.admin.transport import Transport


class NoTimeout(FakeTransport):
    def request(self, method: str, url: str) -> Answer:  # type: ignore[override]
        return self.answer


def port(fake: NoTimeout) -> Transport:
    return fake
"""

DRIFTED_POLLER = '''\
from test_discovery import FakePoller
from nsq_spark._consumer.pool import Poller


class NoTrigger(FakePoller):
    trigger = None  # the port needs trigger()


def port(poller: NoTrigger) -> Poller:
    return poller
'''

DRIFTED_DEAD_LETTER = """
from test_contrib_dead_letter import FakePublisher
from nsq_spark.contrib.dead_letter import DeadLetterPublisher


class NoFuture(FakePublisher):
    def publish_async(self, topic: str, body: bytes, defer_ms: int | None = None) -> bytes:
        return b"OK"  # the port returns a concurrent.futures.Future


def port(p: NoFuture) -> DeadLetterPublisher:
    return p
"""

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

DRIFTED_TELEMETRY = '''
from test_telemetry_unit import FakeTransport
from nsq_spark._publish.transport import Transport


class NoRedrive(FakeTransport):
    redrive = None  # the port needs redrive() -> int


def port(t: NoRedrive) -> Transport:
    return t
'''

#: written into the run's directory: name -> source
WRITTEN = {
    "bad.py": BAD_SCRIPT, "good.py": GOOD_SCRIPT, "user_program.py": USER_PROGRAM,
    "user_program_wrong.py": USER_PROGRAM_WRONG, "broken_fake.py": BROKEN_FAKE,
    "drifted_stand_in.py": DRIFTED_STAND_IN, "drifted_admin.py": DRIFTED_ADMIN,
    "drifted_poller.py": DRIFTED_POLLER, "drifted_dead_letter.py": DRIFTED_DEAD_LETTER,
    "drifted_telemetry.py": DRIFTED_TELEMETRY, "drifted_store.py": DRIFTED_STORE,
}
#: the typed test modules checked where they are
CHECKED_IN_PLACE = [TESTS_DIR / "fake_nsqd.py", SPARK_TESTS_DIR / "stand_in_reader.py",
                    SPARK_TESTS_DIR / "topic_fakes.py",
                    TESTS_DIR / "admin_fakes.py", TESTS_DIR / "test_discovery.py",
                    TESTS_DIR / "test_contrib_dead_letter.py",
                    TESTS_DIR / "test_telemetry_unit.py", TESTS_DIR / "dedup_fakes.py"]
#: checked with mypy's defaults, as they always were (module names)
NOT_STRICT = ["test_contrib_dead_letter", "drifted_dead_letter", "test_telemetry_unit",
              "drifted_telemetry"]

# --strict, then the per-module sections that give the modules above mypy's defaults back
# (warn_redundant_casts is global only: it stays on for them)
CONFIG = """\
[mypy]
strict = True
python_version = 3.11
# as the project's own configuration (setup.cfg): pyarrow and friends ship no stubs
ignore_missing_imports = True

# the test directories are on MYPYPATH, where tests/docker (no __init__.py) would pass for
# the docker SDK (untyped, so Any under ignore_missing_imports) in nsq_spark.testing: Any
[mypy-docker,docker.*]
follow_imports = skip

[mypy-{not_strict}]
disallow_any_generics = False
disallow_subclassing_any = False
disallow_untyped_calls = False
disallow_untyped_defs = False
disallow_incomplete_defs = False
check_untyped_defs = False
disallow_untyped_decorators = False
warn_unused_ignores = False
warn_return_any = False
implicit_reexport = True
strict_equality = False
extra_checks = False
"""

_LINE = re.compile(r"^(?P<path>[^:\s]+\.py):(?P<line>\d+): (?P<kind>error|note): ")


@dataclass
class MypyRun:
    returncode: int
    output: str

    def lines(self, name: str, kind: str = "error") -> list[str]:
        """The ``kind`` lines about the file named ``name`` (its base name)."""
        found = []
        for line in self.output.splitlines():
            m = _LINE.match(line)
            if m and m.group("kind") == kind and Path(m.group("path")).name == name:
                found.append(line)
        return found

    def errors(self, name: str) -> list[str]:
        return self.lines(name)


@pytest.fixture(scope="module")
def mypy_run(tmp_path_factory: pytest.TempPathFactory) -> MypyRun:
    pytest.importorskip("mypy")
    work = tmp_path_factory.mktemp("mypy")
    for name, source in WRITTEN.items():
        (work / name).write_text(textwrap.dedent(source))
    (work / "mypy.ini").write_text(CONFIG.format(not_strict=",".join(NOT_STRICT)))
    # MYPYPATH: the package under test (this checkout, not whatever is installed) and the
    # directories of the checked test modules; follow-imports=silent: report the files
    # named here only, as for an installed package
    env = {**os.environ, "MYPYPATH": os.pathsep.join(
        str(d) for d in (PACKAGE_ROOT, TESTS_DIR, SPARK_TESTS_DIR))}
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", "mypy.ini", "--follow-imports",
         "silent", "--cache-dir", str(work / "cache"), "--no-error-summary",
         "--show-error-codes", "--show-absolute-path", str(PACKAGE_ROOT / "nsq_spark"),
         *WRITTEN, *map(str, CHECKED_IN_PLACE)],
        cwd=work, env=env, capture_output=True, text=True, timeout=280)
    run = MypyRun(proc.returncode, proc.stdout + proc.stderr)
    # 1: type errors were found (the drifted files); 2 would be a crash or a usage error
    assert run.returncode == 1, run.output
    unknown = [line for line in run.output.splitlines() if not _LINE.match(line)]
    assert unknown == [], "\n".join(unknown)
    return run


# -- the top-level names ------------------------------------------------------------------

def test_every_lazy_export_has_a_type_checking_import():
    tree = ast.parse(Path(nsq_spark.__file__).read_text())
    seen: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for imp in node.body:
                assert isinstance(imp, ast.ImportFrom)
                for alias in imp.names:
                    seen[alias.asname or alias.name] = f"{imp.module}.{alias.name}"
                    if alias.asname != "Error":  # the alias: listed in __all__
                        # ``import X as X``: an explicit re-export for mypy --strict
                        assert alias.asname == alias.name, ast.unparse(imp)
    lazy = {name: f"{module}.{name}" for name, module in nsq_spark._EXPORTS.items()}
    lazy.update({name: f"{module}.{attr}" for name, (module, attr) in nsq_spark._ALIASES.items()})
    lazy.update({name: f"nsq_spark.{name}" for name in nsq_spark._SUBMODULES
                 if f"nsq_spark.{name}" in seen.values()})
    assert seen == lazy


def test_all_is_written_out_and_names_exactly_the_lazy_exports():
    """``__all__`` is a literal list (mypy reads no computed one): every lazy name, once."""
    tree = ast.parse(Path(nsq_spark.__file__).read_text())
    (value,) = [n.value for n in tree.body if isinstance(n, ast.Assign)
                and [getattr(t, "id", None) for t in n.targets] == ["__all__"]]
    assert isinstance(value, ast.List)
    literal = [ast.literal_eval(e) for e in value.elts]
    assert sorted(literal) == sorted(["__version__", *nsq_spark._EXPORTS, *nsq_spark._ALIASES])
    assert len(set(literal)) == len(literal)


def test_the_package_passes_mypy_strict(mypy_run: MypyRun):
    package = str(PACKAGE_ROOT / "nsq_spark") + os.sep
    assert not [line for line in mypy_run.output.splitlines()
                if line.startswith(package)], mypy_run.output


def test_mypy_sees_the_real_classes_through_the_top_level_names(mypy_run: MypyRun):
    out, errors = mypy_run.output, mypy_run.errors("bad.py")
    assert mypy_run.errors("good.py") == [], out
    assert any(":6:" in e and '"publish" of "Producer"' in e
               and '"str"' in e and '"bytes"' in e for e in errors), out
    assert any(":7:" in e and '"str"; expected "bytes"' in e for e in errors), out
    assert any(":8:" in e and "message_handler" in e for e in errors), out


def test_a_users_program_passes_mypy_strict(mypy_run: MypyRun):
    """``import nsq_spark as nsq`` with the Reader, the Producer, ``nsq.Message``, the admin
    clients (their ``with`` gives the client's own type) and the Spark helpers: no error
    under --strict. The wrong variant shows each check bites."""
    out = mypy_run.output
    assert mypy_run.errors("user_program.py") == [], out
    wrong = mypy_run.errors("user_program_wrong.py")
    assert any(":6:" in e and '"Call"' in e and "explicitly export" in e for e in wrong), out
    assert any(":9:" in e and "[assert-type]" in e and '"NsqdClient"' in e for e in wrong), out
    assert any(":10:" in e and '"str"' in e and '"bytes"' in e for e in wrong), out


# -- the unit tests' fakes against their ports --------------------------------------------

def test_the_consumer_unit_tests_fake_conforms_to_the_connection_port(mypy_run: MypyRun):
    """tests/fake_nsqd.py is checked by mypy (strict) against the consumer's connection
    port; a fake that drifts from the port fails (the broken variant shows the check
    bites)."""
    assert mypy_run.errors("fake_nsqd.py") == [], mypy_run.output
    broken = mypy_run.errors("broken_fake.py")
    assert any(":11:" in e and "ConsumerConnection" in e for e in broken), mypy_run.output


def test_the_spark_unit_tests_reader_stand_in_conforms_to_its_ports(mypy_run: MypyRun):
    """tests/spark/stand_in_reader.py is checked by mypy (strict) against the fetch task's
    ReaderPort and the reader cache's Pausable; a stand-in that drifts from them fails
    (the drifted variant shows the check bites)."""
    assert mypy_run.errors("stand_in_reader.py") == [], mypy_run.output
    drifted = mypy_run.errors("drifted_stand_in.py")
    assert any(":15:" in e and "ReaderPort" in e for e in drifted), mypy_run.output
    assert any(":19:" in e and "Pausable" in e for e in drifted), mypy_run.output


def test_the_admin_fakes_conform_to_the_transport_ports(mypy_run: MypyRun):
    """tests/admin_fakes.py passes mypy --strict against the ports; a fake that drifts
    from them fails (the drifted variant shows the check bites)."""
    assert mypy_run.errors("admin_fakes.py") == [], mypy_run.output
    drifted = mypy_run.errors("drifted_admin.py")
    assert any(":12:" in e and 'expected "Transport"' in e for e in drifted), mypy_run.output


def test_the_discovery_fakes_conform_to_the_pools_ports(mypy_run: MypyRun):
    """tests/test_discovery.py passes ``mypy --strict`` (so its ``_conforms`` holds: the
    fakes are what the ports say); a fake that drifts from the port fails."""
    assert mypy_run.errors("test_discovery.py") == [], mypy_run.output
    drifted = mypy_run.errors("drifted_poller.py")
    assert any(":10:" in e and "Poller" in e for e in drifted), mypy_run.output


def test_the_dead_letter_fake_and_the_producer_conform_to_the_publisher_port(
        mypy_run: MypyRun):
    """mypy checks tests/test_contrib_dead_letter.py's fake (and the Producer) against
    DeadLetterPublisher; a drifted fake fails (the check bites)."""
    assert mypy_run.errors("test_contrib_dead_letter.py") == [], mypy_run.output
    drifted = mypy_run.errors("drifted_dead_letter.py")
    assert any(":12:" in e and "DeadLetterPublisher" in e for e in drifted), mypy_run.output


def test_the_telemetry_fake_transport_conforms_to_the_port(mypy_run: MypyRun):
    """tests/test_telemetry_unit.py's fake transport is checked against the Producer's
    transport port; a drifted one (no ``redrive``) fails."""
    assert mypy_run.errors("test_telemetry_unit.py") == [], mypy_run.output
    drifted = mypy_run.errors("drifted_telemetry.py")
    notes = mypy_run.lines("drifted_telemetry.py", "note")
    assert any(":11:" in e and 'expected "Transport"' in e for e in drifted), mypy_run.output
    assert any("redrive" in n for n in notes), mypy_run.output


def test_the_dedup_unit_tests_store_stand_ins_conform_to_the_ports(mypy_run: MypyRun):
    """tests/dedup_fakes.py is checked by mypy (strict) against the claim-then-commit port
    and the older one-step interface; a stand-in that drifts fails (the drifted variant
    shows the check bites)."""
    assert mypy_run.errors("dedup_fakes.py") == [], mypy_run.output
    drifted = mypy_run.errors("drifted_store.py")
    assert any(":14:" in e and "ClaimingDeduplicator" in e for e in drifted), mypy_run.output


def test_each_check_reads_only_its_own_files(mypy_run: MypyRun):
    """Every error of the run is in a file some test above expects errors in: a new error
    anywhere else (a fake, a user program, the package) fails a test, never slips by."""
    expect_errors = {"bad.py", "user_program_wrong.py", "broken_fake.py",
                     "drifted_stand_in.py", "drifted_admin.py", "drifted_poller.py",
                     "drifted_dead_letter.py", "drifted_telemetry.py", "drifted_store.py"}
    where = {Path(m.group("path")).name for line in mypy_run.output.splitlines()
             if (m := _LINE.match(line)) and m.group("kind") == "error"}
    assert where == expect_errors, mypy_run.output
