"""The option tables the docs site prints agree with the code that checks the options.

Every option is one row (``nsq_spark._options``): the Spark options' ``READ``, ``WRITE``
and ``CONNECTION`` tables (``nsq_spark.spark.options``), and ``nsq_spark.config``'s
``CONNECTION``, ``READER`` and ``PRODUCER``; the site prints them (docs/hooks/generate.py)
and the parsers check by them. These tests hold the rows to what the parsers and the
facades do: every option has a description, every default printed is the default applied,
every bound printed is the bound enforced (the bound accepted, one step past it refused),
and every row of the Reader and the Producer is an argument of theirs with the row's
default. No sockets.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from nsq_spark import config
from nsq_spark._options import Option
from nsq_spark.config import (CONNECTION, PRODUCER, READER, ConfigError, ConnectionConfig,
                              Limit, ProducerOptions, ReaderOptions)
from nsq_spark._consumer.reader import Reader
from nsq_spark._publish.producer import Producer
from nsq_spark.spark import options as spark_options
from nsq_spark.spark.options import (READ, WRITE, NSQOptionError, parse_read_options,
                                     parse_write_options)

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "docs" / "hooks"))
import generate  # noqa: E402  (docs/hooks/generate.py, the mkdocs hook)

pytestmark = pytest.mark.unit

SPARK_CONNECTION = spark_options.CONNECTION
BASE_READ = {"topic": "events", "channel": "docs", "nsqdTcpAddresses": "127.0.0.1:4150"}
BASE_WRITE = {"topic": "events", "nsqdTcpAddresses": "127.0.0.1:4150"}
ALL_TABLES = {"spark read": READ, "spark write": WRITE, "spark connection": SPARK_CONNECTION,
              "connection": CONNECTION, "reader": READER, "producer": PRODUCER}


# -- every table ---------------------------------------------------------------------------------

@pytest.mark.parametrize("table", sorted(ALL_TABLES))
def test_every_option_has_a_description_and_a_row_of_its_own(table: str):
    rows = list(ALL_TABLES[table])
    assert rows
    for row in rows:
        assert row.doc.strip(), f"{table} option {row.name}: no description"
    assert len({r.name.lower() for r in rows}) == len(rows)


@pytest.mark.parametrize("table", sorted(ALL_TABLES))
def test_every_table_is_printed_whole_by_the_docs_site(table: str):
    printed = {"spark read": generate.spark_read_options,
               "spark write": generate.spark_write_options,
               "spark connection": generate.spark_connection_options,
               "connection": generate.connection_options,
               "reader": generate.reader_options,
               "producer": generate.producer_options}[table]()
    for row in ALL_TABLES[table]:
        line = next(ln for ln in printed.splitlines() if ln.startswith(f"| `{row.name}` |"))
        assert generate.cell(row.bounds_text) in line and generate.cell(row.unit_text) in line


def _number(text: str) -> float | bool | None:
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    try:
        return float(low.replace(",", ""))
    except ValueError:
        return None


# -- Spark options ------------------------------------------------------------------------------

@pytest.mark.parametrize("name", [r.name for r in READ
                                  if r.attr and _number(r.default_text) is not None])
def test_a_read_default_printed_is_the_default_applied(name: str):
    parsed = parse_read_options(BASE_READ, streaming=False)
    assert getattr(parsed, READ[name].attr) == _number(READ[name].default_text)


@pytest.mark.parametrize("name", [r.name for r in WRITE
                                  if r.attr and _number(r.default_text) is not None])
def test_a_write_default_printed_is_the_default_applied(name: str):
    parsed = parse_write_options(BASE_WRITE)
    assert getattr(parsed, WRITE[name].attr) == _number(WRITE[name].default_text)


# written out here, not built from the rows (that could not fail): the unit and bounds
# the docs table prints, and the part the parser's error for a value that is no number
# gives
@pytest.mark.parametrize("name, unit, bounds, said", [
    ("maxMessagesPerTrigger", "messages", ">= 1", ">= 1"),
    ("readerCacheIdleTimeout", "seconds", "> 0 .. 300, and at most half of msgTimeout",
     "> 0 .. 300,"),
    ("maxFetchPeriod", "seconds", "> 0 .. 31,536,000", "> 0 .. 31,536,000,"),
    ("spoolChunkSize", "messages", ">= 1, at most maxInFlight", ">= 1"),
])
def test_a_spark_option_prints_and_is_refused_with_its_own_bounds(name, unit, bounds, said,
                                                                    tmp_path):
    assert (READ[name].unit_text, READ[name].bounds_text) == (unit, bounds)
    with pytest.raises(NSQOptionError) as info:
        parse_read_options(_spark_probe_options(name, "x", tmp_path), streaming=False)
    assert f"option '{name}'" in str(info.value) and said in str(info.value), info.value


def _spark_probe_options(name: str, value: Any, tmp_path: Path) -> dict[str, str]:
    """The read options that probe ``name`` at ``value``, with what it needs beside it."""
    needs: dict[str, str] = {}
    if name == "maxAttempts" and value > 0:
        needs["deadLetterPath"] = str(tmp_path)  # somewhere for the dead letters
    if name in ("minMessagesPerTrigger", "maxTriggerDelay"):
        needs["nsqdHttpAddresses"] = "127.0.0.1:4151"  # the backlog measured
        if name == "maxTriggerDelay":
            needs["minMessagesPerTrigger"] = "1"
    if name == "readerCacheIdleTimeout":  # at most half of msgTimeout: room for the cap
        share = spark_options.READER_CACHE_SHARE_OF_MSG_TIMEOUT
        needs["msgTimeout"] = str(int(spark_options.MAX_READER_CACHE_IDLE / share * 1000))
    if name == "deflateLevel":
        needs["deflate"] = "true"
    return {**BASE_READ, **needs, name: str(value)}


def _spark_probes(row: Option) -> tuple[list[float], list[float]]:
    assert row.limit is not None
    accept, refuse = _probes(row.limit, integer=row.kind == "int")
    assert accept and refuse
    return accept, refuse


@pytest.mark.parametrize("name", [r.name for r in READ if r.limit is not None]
                         + [r.name for r in SPARK_CONNECTION if r.limit is not None])
def test_a_read_bound_printed_is_the_bound_enforced(name: str, tmp_path):
    row = READ.find(name) or SPARK_CONNECTION[name]
    accept, refuse = _spark_probes(row)
    for value in accept:
        parse_read_options(_spark_probe_options(name, value, tmp_path), streaming=False)
    for value in refuse:
        with pytest.raises(NSQOptionError, match=name):
            parse_read_options(_spark_probe_options(name, value, tmp_path), streaming=False)


def _write_probe_options(name: str, value: Any) -> dict[str, str]:
    needs = {"writeQuorum": {"replicas": "20"}}.get(name, {})
    return {**BASE_WRITE, "nsqdTcpAddresses": ",".join(f"127.0.0.1:{4150 + i}"
                                                      for i in range(20)),
            **needs, name: str(value)}


@pytest.mark.parametrize("name", [r.name for r in WRITE if r.limit is not None])
def test_a_write_bound_printed_is_the_bound_enforced(name: str):
    accept, refuse = _spark_probes(WRITE[name])
    for value in accept:
        parse_write_options(_write_probe_options(name, value))
    for value in refuse:
        with pytest.raises(NSQOptionError, match=name):
            parse_write_options(_write_probe_options(name, value))


def test_the_seconds_bounds_printed_include_the_year_cap():
    for name in ("maxTriggerDelay", "maxFetchPeriod", "idleTimeout", "backlogPollInterval",
                 "redeliveryWindow"):
        assert f"{config.MAX_SECONDS:,}" in READ[name].bounds_text, name
    assert f"{config.MAX_SECONDS:,}" in WRITE["publishTimeout"].bounds_text
    assert READ["maxBytesPerTrigger"].bounds_text == f"1 .. {2 ** 63 - 1:,}"


def test_spool_chunk_size_is_at_most_max_in_flight_as_printed():
    assert "at most maxInFlight" in READ["spoolChunkSize"].bounds_text
    assert READ["spoolChunkSize"].default_text == "maxInFlight // 2"
    for max_in_flight in (1, 7, 2500):
        opts = {**BASE_READ, "maxInFlight": str(max_in_flight)}
        parsed = parse_read_options(opts, streaming=False)
        assert parsed.spool_chunk_size == max(1, max_in_flight // 2)  # the printed default
        parse_read_options({**opts, "spoolChunkSize": str(max_in_flight)}, streaming=False)
        with pytest.raises(NSQOptionError, match="spoolChunkSize"):
            parse_read_options({**opts, "spoolChunkSize": str(max_in_flight + 1)},
                               streaming=False)


def test_the_defaults_printed_in_words_are_the_defaults_applied():
    parsed = parse_read_options(BASE_READ, streaming=False)
    for name in ("maxMessagesPerTrigger", "minMessagesPerTrigger", "maxBytesPerTrigger",
                 "dedup"):
        assert READ[name].default_text.startswith("none"), name
        assert getattr(parsed, re.sub(r"([A-Z])", r"_\1", name).lower()) is None, name
    assert READ["maxAttempts"].default_text.startswith("0 ")
    assert parsed.max_attempts == 0
    assert parsed.max_in_flight == 2500 and READ["maxInFlight"].default_text == "2500"
    assert parse_read_options({**BASE_READ, "spoolPath": "/s"}, streaming=True).drop_copies
    assert not parsed.drop_copies and READ["dropCopies"].default_text == "true (streaming)"
    # the connection options' defaults are ConnectionConfig's (in ms here)
    defaults = ConnectionConfig()
    assert _number(SPARK_CONNECTION["deflateLevel"].default_text) == defaults.deflate_level
    assert _number(SPARK_CONNECTION["heartbeatInterval"].default_text) == \
        defaults.heartbeat_interval * 1000
    assert f"({spark_options.NSQD_MSG_TIMEOUT * 1000:.0f})" in \
        SPARK_CONNECTION["msgTimeout"].default_text
    write = parse_write_options(BASE_WRITE)
    assert not write.publish_ids and write.replicas is None and write.write_quorum is None


def test_the_deflate_level_bounds_printed_are_enforced():
    assert SPARK_CONNECTION["deflateLevel"].bounds_text == "1 .. 9"
    base = {**BASE_READ, "deflate": "true"}
    parse_read_options({**base, "deflateLevel": "9"}, streaming=False)
    with pytest.raises(NSQOptionError, match="deflateLevel"):
        parse_read_options({**base, "deflateLevel": "10"}, streaming=False)


# -- ConnectionConfig, Reader, Producer -------------------------------------------------------

def _specials(limit: Limit) -> set[float]:
    return {float(v) for v in re.findall(r"(-?\d+)(?: or None)?:", limit.special)}


def _probes(limit: Limit, integer: bool) -> tuple[list[float], list[float]]:
    """Values the check must accept, and values it must refuse."""
    step = 1 if integer else 0.5
    accept: list[float] = []
    refuse: list[float] = []
    if limit.lo is not None:
        (refuse if limit.lo_open else accept).append(limit.lo)
        if limit.lo - step not in _specials(limit):
            refuse.append(limit.lo - step)
    if limit.hi is not None:
        accept.append(limit.hi)
        refuse.append(limit.hi + step)
    conv = int if integer else float
    return [conv(v) for v in accept], [conv(v) for v in refuse]


def _numeric(annotations: dict[str, Any]) -> set[str]:
    """The names annotated as numbers (``int``, ``float``, ``float | None``), whatever
    their default: a number that defaults to None is a number too (one that may be words,
    ``str | int``, is not)."""
    return {name for name, annotation in annotations.items()
            if re.search(r"\b(int|float)\b", str(annotation))
            and not re.search(r"\b(bool|str)\b", str(annotation))}


@pytest.mark.parametrize("cls, table", [(ConnectionConfig, CONNECTION),
                                        (ReaderOptions, READER),
                                        (ProducerOptions, PRODUCER)])
def test_every_numeric_field_has_its_unit_and_bounds(cls, table):
    fields = {f.name: f.type for f in dataclasses.fields(cls)}
    assert _numeric(fields) == set(table.limits())
    assert [r.name for r in table] == list(fields)  # every field is a row


@pytest.mark.parametrize("name", sorted(CONNECTION.limits()))
def test_a_connection_bound_printed_is_the_bound_enforced(name: str):
    row = CONNECTION[name]
    accept, refuse = _probes(row.limit, row.kind == "int")
    for value in accept:
        ConnectionConfig(**{name: value})
    for value in refuse:
        with pytest.raises(ConfigError, match=name):
            ConnectionConfig(**{name: value})


@pytest.mark.parametrize("facade, table", [(Reader, READER), (Producer, PRODUCER)],
                         ids=["Reader", "Producer"])
def test_every_row_is_an_argument_of_its_facade_with_the_row_s_default(facade, table):
    params = inspect.signature(facade.__init__).parameters
    for row in table:
        assert row.name in params, f"{facade.__name__} has no argument {row.name}"
        assert params[row.name].default is row.default, row.name
    documented = generate.docstring_args(facade)
    for p in list(params.values())[1:]:
        assert p.name in documented, f"{facade.__name__}'s docstring does not describe {p.name}"
    assert "low_rdy_timeout" in READER.limits()  # float | None, default None


@pytest.mark.parametrize("name", sorted(READER.limits()))
def test_a_reader_bound_printed_is_the_bound_enforced(name: str):
    row = READER[name]
    accept, refuse = _probes(row.limit, row.kind == "int")
    for value in accept:
        ReaderOptions(**{name: value})
    for value in refuse:
        with pytest.raises(ConfigError, match=name):
            ReaderOptions(**{name: value})


@pytest.mark.parametrize("name", sorted(PRODUCER.limits()))
def test_a_producer_bound_printed_is_the_bound_enforced(name: str):
    row = PRODUCER[name]
    needs = {"write_quorum": {"replicas": config.MAX_REPLICAS}}.get(name, {})
    if row.needs == "spool_dir":
        needs = {"spool_dir": "/nowhere"}   # only checked, never opened here
    accept, refuse = _probes(row.limit, row.kind == "int")
    for value in accept:
        ProducerOptions(**{**needs, name: value})
    for value in refuse:
        with pytest.raises(ConfigError, match=name):
            ProducerOptions(**{**needs, name: value})


def test_limit_bounds_read_as_words():
    assert Limit("s", 0, 10, lo_open=True).bounds() == "> 0 .. 10"
    assert Limit("s", 1, 60, special="-1: off").bounds() == "1 .. 60; -1: off"
    assert Limit("bytes", 1).bounds() == ">= 1"
    assert Limit("s", 0.5, 1.5).bounds() == "0.5 .. 1.5"
    assert config.MAX_ATTEMPTS == 65535 and spark_options.MAX_ATTEMPTS == 65535
    assert Limit("s", 0, 1, special="0: off").bounds() == "0 .. 1; 0: off"


# -- the generators themselves ------------------------------------------------------------------

def test_an_unknown_generated_marker_fails_the_build():
    with pytest.raises(KeyError, match="no-such-part"):
        generate.expand("# T\n\n<!-- generated: no-such-part -->\n")


def test_the_dedup_chart_is_drawn_from_size_for():
    from nsq_spark.dedup.opposite import OppositeBloomFilter

    chart = generate.dedup_chart(rate=1000)
    assert f"{OppositeBloomFilter.size_for(1000, 3600, 0.9):,}" in chart
    assert chart.count("<polyline") == 5


def _bars(chart: str) -> list[float]:
    return [float(v) for v in re.findall(r'<rect [^>]*data-value="([^"]+)"', chart)]


def test_a_benchmark_chart_plots_the_column_its_marker_names():
    chart = generate.bar_chart(["consumer", "messages", "msg/s", "note"],
                               [["pynsq", "200,000", "24,000", "x"],
                                ["ours", "200,000", "**2,001,288**", "y"]], "msg/s")
    assert _bars(chart) == [24_000, 2_001_288]
    assert ">2,001,288</text>" in chart and "e+06" not in chart
    assert 'class="nsq-chart"' in chart
    with pytest.raises(ValueError, match="no such column"):
        generate.bar_chart(["a", "b"], [["x", "1"]], "msg/s")
    with pytest.raises(ValueError, match="no number"):
        generate.bar_chart(["a", "b"], [["x", "none"]], "b")


def test_benchmark_numbers_read_their_k_and_m_suffixes():
    assert generate._first_number("332k/280k") == 332_000
    assert generate._first_number("1.52M/s") == 1_520_000
    assert generate._first_number("**1,894,249**") == 1_894_249
    assert generate._first_number("15.3 MiB") == 15.3          # a unit, not mega
    assert generate._first_number("4.226 s = 236,622") == 4.226
    assert generate._first_number("-") is None


def _results_charts() -> dict[str, str]:
    """Header line of each table of the benchmarks page -> the chart drawn right after it."""
    lines = generate.benchmarks().splitlines()
    charts = {}
    for i, line in enumerate(lines):
        if line.startswith("|") and (i == 0 or not lines[i - 1].startswith("|")):
            end = next(j for j in range(i, len(lines) + 1)
                       if j == len(lines) or not lines[j].startswith("|"))
            if end + 1 < len(lines) and lines[end + 1] == '<div class="nsq-chart">':
                charts[line] = lines[end + 2]
    return charts


def test_the_consumer_comparison_chart_plots_msg_per_s_not_the_message_count():
    header = "| consumer | messages | msg/s | peak RSS | CPU us/msg |"
    lines = (REPO / "bench" / "RESULTS.md").read_text().splitlines()
    rows = []
    for line in lines[lines.index(header) + 2:]:
        if not line.startswith("|"):
            break
        rows.append(generate._split_row(line))
    msg_s = [float(r[2].replace(",", "")) for r in rows]
    assert [float(r[1].replace(",", "")) for r in rows].count(200_000) >= 3  # the trap
    assert _bars(_results_charts()[header]) == msg_s


def test_every_benchmark_chart_plots_a_rate_or_the_nsq_source_not_a_baseline():
    charts = _results_charts()
    assert len(charts) >= 5
    for header, chart in charts.items():
        title = re.search(r"<title>(.*?)</title>", chart).group(1)  # type: ignore[union-attr]
        assert "/s" in title or title in ("nsq source", "one call, new", "bytes per remembered key"), \
            (header, title)
        assert "ceiling" not in title


def test_a_chart_marker_not_above_a_table_fails_the_build(monkeypatch, tmp_path):
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "RESULTS.md").write_text("<!-- chart: msg/s -->\n\ntext\n")
    monkeypatch.setattr(generate, "REPO", tmp_path)
    with pytest.raises(ValueError, match="right above a table"):
        generate.benchmarks()


def test_a_table_cell_escapes_html_outside_code_spans():
    assert generate.cell("<spoolPath>/_dead_letter") == "&lt;spoolPath&gt;/_dead_letter"
    assert generate.cell("`<class 'dict'>` & a | b") == "`<class 'dict'>` &amp; a \\| b"
    assert generate.cell("> 0 .. 10") == "&gt; 0 .. 10"


def test_the_readme_links_become_site_links():
    text = generate.readme()
    assert "](docs/" not in text and "](CHANGELOG.md)" not in text
    assert "](spark.md)" in text and "](benchmarks.md)" in text
