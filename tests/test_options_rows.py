"""The option rows and their one parser (nsq_spark._options), on tables made here: a row
checks its values by its kind and bounds, an unknown name is told the closest known one,
keys may be compared without case, an option that needs another or excludes one fails
instead of being ignored, a secret is never shown, text values are parsed by their rows
on first use, and a facade's docstring gets each row's description. No sockets."""

from __future__ import annotations

import dataclasses
import inspect
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nsq_spark._options import (Option, OptionTable, check_fields, closest, documented,
                                option, parse_duration, rows_of)
from nsq_spark.errors import ConfigError
from nsq_spark._validate import REDACTED, SECONDS_OR_ZERO, Limit

pytestmark = pytest.mark.unit


class RowError(ConfigError):
    """The error class a table raises (the Spark options raise NSQOptionError)."""


SPARK_LIKE = OptionTable([
    Option("maxInFlight", "int", 2500, attr="max_in_flight",
           limit=Limit("messages", 1, 1_000_000), doc="messages in flight"),
    Option("idleTimeout", "seconds", 1.0, attr="idle_timeout", doc="seconds idle"),
    Option("pollInterval", "seconds", 0.1, limit=SECONDS_OR_ZERO,
           special={0: "at every trigger"}, doc="seconds between polls"),
    Option("tlsV1", "flag", False, doc="TLS"),
    Option("tlsCaFile", parse=lambda text, param: text, needs="tlsV1", doc="CA file"),
    Option("snappy", "flag", False, excludes=("deflate",), doc="snappy"),
    Option("deflate", "flag", False, doc="deflate"),
    Option("authSecret", parse=lambda text, param: text, secret=True, doc="secret"),
], what="option", error=RowError, ignore_case=True)


# -- one row --------------------------------------------------------------------------------


def test_a_row_checks_its_kind_and_bounds_naming_the_option():
    row = SPARK_LIKE["maxInFlight"]
    assert row.check_value(7) == 7
    for bad in (0, 1_000_001, 1.5, True, "5", math.nan):
        with pytest.raises(ConfigError, match=r"^maxInFlight="):
            row.check_value(bad)
    with pytest.raises(RowError, match="^option 'maxInFlight'=0: give an int of messages"):
        row.check_value(0, "option 'maxInFlight'", RowError)


def test_a_special_value_is_accepted_and_printed_with_its_meaning():
    row = SPARK_LIKE["pollInterval"]
    assert row.check_value(0) == 0
    assert row.bounds_text == "0 .. 31,536,000; 0: at every trigger"
    flagged = Option("hb", "seconds", 30, limit=Limit("seconds", 1, 60), special={-1: "off"},
                     none="nsqd's default")
    assert flagged.check_value(-1) == -1 and flagged.check_value(None) is None
    assert flagged.bounds_text == "1 .. 60; -1: off; None: nsqd's default"
    with pytest.raises(ConfigError, match=r"or -1 \(off\) or None \(nsqd's default\)"):
        flagged.check_value(0)


def test_a_choice_names_the_closest_and_every_choice():
    row = Option("strategy", "choice", "exponential", choices=("exponential", "full_jitter"))
    assert row.check_value("full_jitter") == "full_jitter"
    with pytest.raises(ConfigError, match=r"^strategy='full-jitter': did you mean "
                       r"'full_jitter'\? give one of 'exponential', 'full_jitter'$"):
        row.check_value("full-jitter")
    assert row.unit_text == "'exponential' or 'full_jitter'"


def test_what_the_docs_print_of_a_row():
    assert SPARK_LIKE["idleTimeout"].bounds_text == "> 0 .. 31,536,000"  # seconds: > 0
    assert SPARK_LIKE["idleTimeout"].unit_text == "seconds"
    assert SPARK_LIKE["idleTimeout"].default_text == "1"
    assert SPARK_LIKE["tlsV1"].default_text == "false"
    assert SPARK_LIKE["tlsV1"].unit_text == "boolean"
    assert Option("n", "int", limit=Limit("ids", 1), shown="maxInFlight // 2",
                  rule=", at most maxInFlight").bounds_text == ">= 1, at most maxInFlight"


def test_a_bad_row_fails_where_it_is_written():
    with pytest.raises(ValueError, match="needs a limit"):
        Option("n", "int")
    with pytest.raises(ValueError, match="kind"):
        Option("n", "integer")
    with pytest.raises(ValueError, match="not a row"):
        OptionTable([Option("a", "flag", needs="b")], what="option")
    with pytest.raises(ValueError, match="names two rows"):
        OptionTable([Option("a", "flag"), Option("b", "flag", aliases=("a",))], what="option")


# -- text values (Spark) --------------------------------------------------------------------


def test_keys_are_compared_without_case_and_values_parsed_by_their_rows():
    given = SPARK_LIKE.read({"MAXINFLIGHT": " 5000 ", "idletimeout": "500ms", "tlsv1": "yes"})
    assert given.get("maxInFlight") == 5000
    assert given.get("idleTimeout") == 0.5
    assert given.get("tlsV1") is True
    assert given.get("pollInterval") == 0.1            # not given: the row's default
    assert given.get("pollInterval", 3.0) == 3.0       # or one computed by the caller
    assert given.fields() == {"max_in_flight": 5000, "idle_timeout": 0.5}


def test_a_value_is_parsed_only_when_read():
    given = SPARK_LIKE.read({"maxInFlight": "many"})
    assert given.text("maxInFlight") == "many"
    with pytest.raises(RowError, match="option 'maxInFlight' must be an integer >= 1, "
                                       "not 'many'"):
        given.get("maxInFlight")


def test_a_blank_value_is_not_given():
    given = SPARK_LIKE.read({"maxInFlight": "  ", "authSecret": ""})
    assert not given.given("maxInFlight") and given.get("maxInFlight") == 2500


@pytest.mark.parametrize("key, closest_name", [
    ("maxinflite", "maxInFlight"), ("idleTimout", "idleTimeout"), ("TLSV", "tlsV1")])
def test_an_unknown_key_names_the_closest_known_one(key, closest_name):
    with pytest.raises(RowError, match=f"unknown option '{key}' for x; did you mean "
                                       f"'{closest_name}'\\?"):
        SPARK_LIKE.read({key: "1"}, context=" for x")


def test_an_unknown_key_far_from_every_name_lists_them_and_known_keys_pass():
    with pytest.raises(RowError, match="known options: maxInFlight, idleTimeout"):
        SPARK_LIKE.read({"zzzzzzzz": "1"})
    SPARK_LIKE.read({"path": "/x", "nsq.msg_timeout": "5"}, known=("path",),
                    prefixes=("nsq.",))
    with pytest.raises(RowError, match="unknown option 'nsq.'"):
        SPARK_LIKE.read({"nsq.": "5"}, prefixes=("nsq.",))


def test_an_option_without_the_one_it_needs_fails_before_its_value_is_read():
    with pytest.raises(RowError, match="option 'tlsCaFile' only takes effect with 'tlsV1' = "
                                       "true; set .option\\(\"tlsV1\", \"true\"\\) or remove"):
        SPARK_LIKE.read({"tlsCaFile": "/ca.pem"})
    assert SPARK_LIKE.read({"tlsCaFile": "/ca.pem", "tlsv1": "true"}).get("tlsCaFile") == \
        "/ca.pem"


def test_options_that_exclude_each_other_fail_together_not_alone():
    with pytest.raises(RowError, match="options 'snappy' and 'deflate' are exclusive"):
        SPARK_LIKE.read({"snappy": "true", "deflate": "true"})
    SPARK_LIKE.read({"snappy": "true", "deflate": "false"})


def test_a_secret_is_redacted_by_its_row_or_by_its_name():
    shown = SPARK_LIKE.redact({"authSecret": "hunter2", "maxInFlight": "5",
                               "nsq.auth_secret": "hunter2", "url": "redis://:pw@h:1/0"})
    assert shown == {"authSecret": REDACTED, "maxInFlight": "5",
                     "nsq.auth_secret": REDACTED, "url": f"redis://:{REDACTED}@h:1/0"}


@given(st.floats(min_value=0, max_value=1e6, allow_nan=False),
       st.sampled_from([("ms", 1e-3), ("s", 1.0), ("m", 60.0), ("h", 3600.0),
                        (" minutes", 60.0), ("", 1.0)]))
def test_a_duration_is_its_number_times_its_unit(number, unit_scale):
    unit, scale = unit_scale
    assert parse_duration(f"{number!r}{unit}") == pytest.approx(number * scale)


def test_a_duration_that_is_not_one_is_none():
    assert parse_duration("soon") is None and parse_duration("5 fortnights") is None
    assert math.isinf(parse_duration("inf") or 0)   # refused by the range check


def test_closest_ignores_case_and_says_nothing_when_nothing_is_close():
    assert closest("MAXINFLITE", ["maxInFlight"], end="?") == "did you mean 'maxInFlight'?"
    assert closest("zzz", ["maxInFlight"]) == ""


# -- rows as dataclass fields ---------------------------------------------------------------


def _needs_spool(obj: object, needed: Option, rows: list[Option]) -> str:
    return f"{', '.join(r.name for r in rows)} only apply with {needed.name}"


@dataclasses.dataclass(frozen=True)
class Options:
    """A facade's options, as ReaderOptions and ProducerOptions are."""

    retries: int = option(5, kind="int", limit=Limit("attempts", 1, 10), doc="attempts")
    timeout: float | None = option(None, kind="seconds", none="for ever", doc="seconds")
    spool: str | None = option(None, doc="a directory")
    spool_size: int = option(100, kind="int", limit=Limit("bytes", 1), needs="spool",
                             doc="spool bytes")
    spool_sync: bool = option(True, kind="flag", needs="spool", doc="sync the spool")
    token: str | None = option(None, kind="text", none="none", secret=True, doc="a token")

    def __post_init__(self) -> None:
        check_fields(self, TABLE, needs_error=_needs_spool)


TABLE = rows_of(Options, what="test option")


def test_a_dataclass_of_rows_checks_every_field_and_what_each_needs():
    assert Options(retries=10, timeout=2.5, spool="/s", spool_size=7).spool_size == 7
    with pytest.raises(ConfigError, match=r"^retries=11: give an int of attempts from 1 "
                                          "to 10"):
        Options(retries=11)
    with pytest.raises(ConfigError, match="^spool_size, spool_sync only apply with spool$"):
        Options(spool_size=7, spool_sync=False)
    assert Options(spool_size=100).spool is None   # the default needs nothing


def test_a_secret_field_is_never_in_the_repr():
    assert "hunter2" not in repr(Options(token="hunter2"))


def test_the_table_of_a_dataclass_has_its_fields_names_and_defaults():
    assert [r.name for r in TABLE] == [f.name for f in dataclasses.fields(Options)]
    assert TABLE["retries"].default == 5 and TABLE["retries"].attr == "retries"
    assert TABLE.limits() == {"retries": Limit("attempts", 1, 10),
                              "timeout": TABLE["timeout"].limit,
                              "spool_size": Limit("bytes", 1)}


def test_a_default_outside_its_own_bounds_fails_when_the_table_is_made():
    @dataclasses.dataclass(frozen=True)
    class Bad:
        n: int = option(0, kind="int", limit=Limit("things", 1))

    with pytest.raises(ConfigError, match="n=0"):
        rows_of(Bad, what="bad option")


def test_a_facade_documented_by_its_rows_lists_them_in_its_args():
    @documented(TABLE, before="**rest")
    class Facade:
        """Does things.

        Args:
            first: the first argument.
            **rest: more.
        """

    doc = inspect.getdoc(Facade) or ""
    args = doc.split("Args:")[1]
    assert args.index("first:") < args.index("retries: attempts") < args.index("**rest:")
    assert "    token: a token" in args


def test_the_options_benchmark_runs_every_case():
    from bench import bench_options

    figures = bench_options.measure(calls=1, repeat=1)
    assert set(figures) == {"parse_write_options", "parse_read_options", "ConnectionConfig()",
                            "ConnectionConfig.from_options(5 options)",
                            "ReaderOptions(3 options)", "ProducerOptions(3 options)"}
    assert all(us > 0 for us in figures.values())
