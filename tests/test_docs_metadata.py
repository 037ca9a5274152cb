"""The machine-readable facts the docs site prints agree with the code that checks them.

The option tables of the site are generated from ``nsq_spark.spark.options``'
``*_OPTION_FACTS`` and ``nsq_spark.config``'s ``*_LIMITS`` (docs/hooks/generate.py).
These tests hold those tables to the parsers and checks themselves: every option has its
facts and a description, every default printed is the default applied, and every bound
printed is the bound enforced (the bound accepted, one step past it refused). No sockets.
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
from nsq_spark.config import (CONNECTION_LIMITS, PRODUCER_LIMITS, READER_LIMITS, ConfigError,
                              ConnectionConfig, Limit, check_producer_options,
                              check_reader_options)
from nsq_spark.consumer.reader import Reader
from nsq_spark.publish.producer import Producer
from nsq_spark.spark import options as spark_options
from nsq_spark.spark.options import (CONNECTION_OPTION_FACTS, CONNECTION_OPTIONS,
                                     READ_OPTION_FACTS, READ_OPTIONS, READER_CACHE_OPTIONS,
                                     WRITE_OPTION_FACTS, WRITE_OPTIONS, NSQOptionError,
                                     parse_read_options, parse_write_options)

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "docs" / "hooks"))
import generate  # noqa: E402  (docs/hooks/generate.py, the mkdocs hook)

pytestmark = pytest.mark.unit

READ_ONLY = tuple(n for n in READ_OPTIONS + READER_CACHE_OPTIONS if n not in CONNECTION_OPTIONS)
WRITE_ONLY = tuple(n for n in WRITE_OPTIONS if n not in CONNECTION_OPTIONS)
BASE_READ = {"topic": "events", "channel": "docs", "nsqdTcpAddresses": "127.0.0.1:4150"}
BASE_WRITE = {"topic": "events", "nsqdTcpAddresses": "127.0.0.1:4150"}


def snake(name: str) -> str:
    return re.sub(r"(?<!^)([A-Z])", r"_\1", name).lower()


# -- Spark options ------------------------------------------------------------------------------

def test_every_spark_option_has_facts_and_a_description_and_no_fact_is_stale():
    docs = generate.spark_option_docs()
    assert set(READ_OPTION_FACTS) == set(READ_ONLY)
    assert set(WRITE_OPTION_FACTS) == set(WRITE_ONLY)
    assert set(CONNECTION_OPTION_FACTS) == set(CONNECTION_OPTIONS)
    for name in READ_ONLY:
        assert READ_OPTION_FACTS[name].doc or docs.get(name), f"{name}: no description"
    for facts in (WRITE_OPTION_FACTS, CONNECTION_OPTION_FACTS):
        for name, f in facts.items():
            assert f.doc, f"{name}: no description"


def _number(text: str) -> float | bool | None:
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    try:
        return float(low.replace(",", ""))
    except ValueError:
        return None


@pytest.mark.parametrize("name", [n for n in READ_ONLY
                                  if _number(READ_OPTION_FACTS[n].default) is not None])
def test_a_read_default_printed_is_the_default_applied(name: str):
    parsed = parse_read_options(BASE_READ, streaming=False)
    assert getattr(parsed, snake(name)) == _number(READ_OPTION_FACTS[name].default)


@pytest.mark.parametrize("name", [n for n in WRITE_ONLY
                                  if _number(WRITE_OPTION_FACTS[n].default) is not None])
def test_a_write_default_printed_is_the_default_applied(name: str):
    parsed = parse_write_options(BASE_WRITE)
    field = {"maxBatchBytes": "max_batch_bytes"}.get(name, snake(name))
    assert getattr(parsed, field) == _number(WRITE_OPTION_FACTS[name].default)


_BOUNDS = re.compile(r"^(> |>= |\d[\d,]* \.\. )")


@pytest.mark.parametrize("facts, limits", [
    (READ_OPTION_FACTS, spark_options.READ_OPTION_LIMITS),
    (WRITE_OPTION_FACTS, spark_options.WRITE_OPTION_LIMITS),
    (CONNECTION_OPTION_FACTS, spark_options.CONNECTION_OPTION_LIMITS),
], ids=["read", "write", "connection"])
def test_every_numeric_spark_option_prints_the_limit_its_parser_uses(facts, limits):
    numeric = {n for n, f in facts.items() if _BOUNDS.match(f.bounds)}
    assert numeric == set(limits)


# written out here, not built from the Limits the facts are built from (that could not
# fail): the unit and bounds the docs table prints, and the part the parser's error for
# a value that is no number gives
@pytest.mark.parametrize("name, unit, bounds, said", [
    ("maxMessagesPerTrigger", "messages", ">= 1", ">= 1"),
    ("readerCacheIdleTimeout", "seconds", "> 0 .. 300, and at most half of msgTimeout",
     "> 0 .. 300,"),
    ("maxFetchPeriod", "seconds", "> 0 .. 31,536,000", "> 0 .. 31,536,000,"),
    ("spoolChunkSize", "messages", ">= 1, at most maxInFlight", ">= 1"),
])
def test_a_spark_option_prints_and_is_refused_with_its_own_bounds(name, unit, bounds, said,
                                                                    tmp_path):
    assert (READ_OPTION_FACTS[name].unit, READ_OPTION_FACTS[name].bounds) == (unit, bounds)
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


def _spark_probes(limit: Limit) -> tuple[list[float], list[float]]:
    accept, refuse = _probes(limit, integer=limit.unit != "seconds")
    assert accept and refuse
    return accept, refuse


@pytest.mark.parametrize("name", sorted({**spark_options.READ_OPTION_LIMITS,
                                         **spark_options.CONNECTION_OPTION_LIMITS}))
def test_a_read_bound_printed_is_the_bound_enforced(name: str, tmp_path):
    limit = {**spark_options.READ_OPTION_LIMITS, **spark_options.CONNECTION_OPTION_LIMITS}[name]
    accept, refuse = _spark_probes(limit)
    for value in accept:
        parse_read_options(_spark_probe_options(name, value, tmp_path), streaming=False)
    for value in refuse:
        with pytest.raises(NSQOptionError, match=name):
            parse_read_options(_spark_probe_options(name, value, tmp_path), streaming=False)


@pytest.mark.parametrize("name", sorted(spark_options.WRITE_OPTION_LIMITS))
def test_a_write_bound_printed_is_the_bound_enforced(name: str):
    accept, refuse = _spark_probes(spark_options.WRITE_OPTION_LIMITS[name])
    for value in accept:
        parse_write_options({**BASE_WRITE, name: str(value)})
    for value in refuse:
        with pytest.raises(NSQOptionError, match=name):
            parse_write_options({**BASE_WRITE, name: str(value)})


def test_the_seconds_bounds_printed_include_the_year_cap():
    for name in ("maxTriggerDelay", "maxFetchPeriod", "idleTimeout", "backlogPollInterval",
                 "redeliveryWindow"):
        assert f"{config.MAX_SECONDS:,}" in READ_OPTION_FACTS[name].bounds, name
    assert f"{config.MAX_SECONDS:,}" in WRITE_OPTION_FACTS["publishTimeout"].bounds
    assert READ_OPTION_FACTS["maxBytesPerTrigger"].bounds == f"1 .. {2 ** 63 - 1:,}"


def test_spool_chunk_size_is_at_most_max_in_flight_as_printed():
    assert "at most maxInFlight" in READ_OPTION_FACTS["spoolChunkSize"].bounds
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
        assert READ_OPTION_FACTS[name].default.startswith("none"), name
        assert getattr(parsed, snake(name)) is None, name
    assert READ_OPTION_FACTS["maxAttempts"].default.startswith("0 ")
    assert parsed.max_attempts == 0
    assert parsed.max_in_flight == spark_options.DEFAULT_MAX_IN_FLIGHT
    # the connection options' defaults are ConnectionConfig's (in ms here)
    defaults = ConnectionConfig()
    assert _number(CONNECTION_OPTION_FACTS["deflateLevel"].default) == defaults.deflate_level
    assert _number(CONNECTION_OPTION_FACTS["heartbeatInterval"].default) == \
        defaults.heartbeat_interval * 1000
    assert f"({spark_options.NSQD_MSG_TIMEOUT * 1000:.0f})" in \
        CONNECTION_OPTION_FACTS["msgTimeout"].default


def test_the_deflate_level_bounds_printed_are_enforced():
    assert CONNECTION_OPTION_FACTS["deflateLevel"].bounds == "1 .. 9"
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


def _is_integer_option(default: Any, annotation: str) -> bool:
    return isinstance(default, int) and "float" not in annotation or (
        default is None and "int" in annotation and "float" not in annotation)


def test_every_numeric_connection_field_has_limits():
    numeric = {f.name for f in dataclasses.fields(ConnectionConfig)
               if re.search(r"\b(int|float)\b", str(f.type)) and "bool" not in str(f.type)}
    assert numeric == set(CONNECTION_LIMITS)


@pytest.mark.parametrize("name", sorted(CONNECTION_LIMITS))
def test_a_connection_bound_printed_is_the_bound_enforced(name: str):
    f = next(f for f in dataclasses.fields(ConnectionConfig) if f.name == name)
    accept, refuse = _probes(CONNECTION_LIMITS[name], _is_integer_option(f.default, str(f.type)))
    for value in accept:
        ConnectionConfig(**{name: value})
    for value in refuse:
        with pytest.raises(ConfigError, match=name):
            ConnectionConfig(**{name: value})


def _reader_defaults() -> dict[str, Any]:
    return {p.name: p.default for p in inspect.signature(Reader.__init__).parameters.values()}


def _numeric_arguments(func: Any) -> set[str]:
    """The arguments of ``func`` annotated as numbers (``int``, ``float``, ``float | None``),
    whatever their default: a number that defaults to None is a number too."""
    return {p.name for p in inspect.signature(func).parameters.values()
            if re.search(r"\b(int|float)\b", str(p.annotation))
            and "bool" not in str(p.annotation)}


def test_every_numeric_reader_argument_has_limits_and_every_argument_a_description():
    params = inspect.signature(Reader.__init__).parameters.values()
    numeric = _numeric_arguments(Reader.__init__)
    assert "low_rdy_timeout" in numeric  # float | None, default None
    assert numeric == set(READER_LIMITS)
    documented = generate.docstring_args(Reader)
    for p in list(params)[1:]:
        assert p.name in documented, f"Reader's docstring does not describe {p.name}"


@pytest.mark.parametrize("name", sorted(READER_LIMITS))
def test_a_reader_bound_printed_is_the_bound_enforced(name: str):
    defaults = _reader_defaults()
    annotation = str(inspect.signature(Reader.__init__).parameters[name].annotation)
    accept, refuse = _probes(READER_LIMITS[name],
                             _is_integer_option(defaults[name], annotation))
    for value in accept:
        check_reader_options({**defaults, name: value})
    for value in refuse:
        with pytest.raises(ConfigError, match=name):
            check_reader_options({**defaults, name: value})


def _producer_defaults() -> dict[str, Any]:
    wanted = inspect.signature(check_producer_options).parameters
    return {p.name: p.default for p in inspect.signature(Producer.__init__).parameters.values()
            if p.name in wanted}


def test_every_checked_producer_argument_has_limits_and_every_argument_a_description():
    checked = set(inspect.signature(check_producer_options).parameters) - {"strategy"}
    assert checked == set(PRODUCER_LIMITS)
    documented = generate.docstring_args(Producer)
    for p in list(inspect.signature(Producer.__init__).parameters.values())[1:]:
        assert p.name in documented, f"Producer's docstring does not describe {p.name}"


@pytest.mark.parametrize("name", sorted(PRODUCER_LIMITS))
def test_a_producer_bound_printed_is_the_bound_enforced(name: str):
    defaults = _producer_defaults()
    annotation = str(inspect.signature(Producer.__init__).parameters[name].annotation)
    accept, refuse = _probes(PRODUCER_LIMITS[name],
                             _is_integer_option(defaults[name], annotation))
    for value in accept:
        check_producer_options(**{**defaults, name: value})
    for value in refuse:
        with pytest.raises(ConfigError, match=name):
            check_producer_options(**{**defaults, name: value})


def test_limit_bounds_read_as_words():
    assert Limit("s", 0, 10, lo_open=True).bounds() == "> 0 .. 10"
    assert Limit("s", 1, 60, special="-1: off").bounds() == "1 .. 60; -1: off"
    assert Limit("bytes", 1).bounds() == ">= 1"
    assert Limit("s", 0.5, 1.5).bounds() == "0.5 .. 1.5"
    assert config.MAX_ATTEMPTS == 65535 and spark_options.MAX_ATTEMPTS == 65535


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
