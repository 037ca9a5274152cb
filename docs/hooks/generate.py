"""MkDocs hook: the parts of the site that are generated from the code at build time.

A page asks for a generated part with a marker on a line of its own::

    <!-- generated: spark-read-options -->

and :func:`on_page_markdown` replaces the marker with Markdown made from the code's own
definitions, so that the documentation cannot disagree with them (one source of truth):

- ``spark-read-options``, ``spark-write-options``, ``spark-connection-options``: the
  Spark options, one line per row of :mod:`nsq_spark.spark.options`' ``READ``, ``WRITE``
  and ``CONNECTION`` tables (name, default, unit, bounds, description);
- ``connection-options``, ``reader-options``, ``producer-options``: one line per row of
  ``nsq_spark.config``'s ``CONNECTION`` (the fields of ``ConnectionConfig``), and one per
  argument of the Reader's / Producer's signatures: an option from its row of ``READER``
  / ``PRODUCER``, any other argument from the ``Args:`` of the class's docstring;
- ``cli-reference``: every subcommand's ``--help`` from :func:`nsq_spark.cli.build_parser`;
- ``dedup-chart``: the catch probability of an opposite-of-Bloom filter against buckets
  and delay, an SVG drawn from ``OppositeBloomFilter.probability_remembered`` and a table
  from ``OppositeBloomFilter.size_for``;
- ``benchmarks``: bench/RESULTS.md, each table with a ``<!-- chart: COLUMN -->`` line
  above it followed by a bar chart of that column;
- ``changelog``: CHANGELOG.md, included as it is;
- ``readme``: README.md, the front page, its links pointed at the site's pages.

The generated Markdown goes through MkDocs like any page, so Material's search indexes it.
Nothing here is a copy: an unknown marker fails the build.
"""

from __future__ import annotations

import dataclasses
import html
import inspect
import math
import os
import re
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

REPO = Path(__file__).resolve().parents[2]
# the checkout's code, whichever way mkdocs was started (an installed or editable
# nsq_spark of another checkout must not be documented instead of this one)
sys.path.insert(0, str(REPO))
_loaded = sys.modules.get("nsq_spark")
if _loaded is not None and Path(_loaded.__file__ or "").resolve().parent.parent != REPO:
    raise ImportError(f"nsq_spark was imported from {_loaded.__file__} before the docs hook "
                      f"ran; build with PYTHONPATH={REPO} so the site documents this checkout")

MARKER = re.compile(r"^<!--\s*generated:\s*(?P<name>[a-z0-9-]+)\s*-->\s*$", re.M)


# -- helpers ------------------------------------------------------------------------------

def rst_to_md(text: str) -> str:
    """The reST of the project's docstrings, as Markdown inline text: ````x```` -> `x`,
    ``:func:`x``` / ``:mod:`.x``` -> `x`, ``\\*\\*`` -> ``**``."""
    text = re.sub(r":[a-z]+:`~?\.?([^`]+)`", r"`\1`", text)
    text = text.replace("``", "`").replace("\\*", "*")
    return " ".join(text.split())


_CODE_SPAN = re.compile(r"(`[^`]*`)")


def cell(text: Any) -> str:
    """A Markdown table cell: one line, pipes escaped, and ``<``, ``>``, ``&`` outside
    code spans escaped as HTML (a default such as ``<spoolPath>/_dead_letter`` is text,
    not a tag for the browser to swallow); code spans print as they are."""
    parts = _CODE_SPAN.split(str(text).replace("\n", " "))
    text = "".join(part if i % 2 else html.escape(part, quote=False)
                   for i, part in enumerate(parts))
    return text.replace("|", "\\|").strip()


def table(header: list[str], rows: list[list[Any]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(out) + "\n"


def options_table(header: list[str], rows: list[list[Any]]) -> str:
    """An option table in a ``nsq-options`` block (md_in_html): its description column
    keeps a readable width and the rest wraps (docs/stylesheets/extra.css)."""
    return f'<div class="nsq-options" markdown>\n\n{table(header, rows)}\n</div>\n'


def show_default(value: Any) -> str:
    if value is inspect.Parameter.empty or value is dataclasses.MISSING:
        return "required"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10_000:
        return f"`{value:_}`".replace("_", ",")
    return f"`{value!r}`"


# -- Spark options --------------------------------------------------------------------------

HEADER = ["option", "default", "unit", "bounds", "description"]


def _spark_table(table: Any) -> str:
    """One line per row: its name, the default as a user writes it, unit, bounds, doc."""
    rows = [[f"`{row.name}`", row.default_text, row.unit_text, row.bounds_text,
             rst_to_md(row.doc)] for row in table]
    return options_table(HEADER, rows)


def spark_read_options() -> str:
    from nsq_spark.spark.options import READ

    return _spark_table(READ)


def spark_write_options() -> str:
    from nsq_spark.spark.options import WRITE

    return _spark_table(WRITE)


def spark_connection_options() -> str:
    from nsq_spark.spark.options import CONNECTION

    return _spark_table(CONNECTION)


# -- ConnectionConfig, Reader, Producer -----------------------------------------------------


def docstring_args(obj: Any) -> dict[str, str]:
    """parameter -> its text in the ``Args:`` section of ``obj``'s docstring
    (``a, b: text`` gives both)."""
    doc = inspect.getdoc(obj) or ""
    section = doc.split("Args:", 1)[1] if "Args:" in doc else ""
    args: dict[str, str] = {}
    current: list[str] = []
    for line in section.splitlines():
        if line and not line.startswith(" "):
            break  # the end of the section
        m = re.match(r"^    (\\?\*?\\?\*?[\w, ]+):\s*(.*)$", line)
        if m and not line.startswith("     "):
            current = [n.strip().lstrip("\\*") for n in m.group(1).split(",")]
            for n in current:
                args[n] = m.group(2)
        elif current and line.strip():
            for n in current:
                args[n] += " " + line.strip()
    return {k: rst_to_md(v) for k, v in args.items()}


def connection_options() -> str:
    from nsq_spark.config import CONNECTION

    rows = [[f"`{row.name}`", show_default(row.default), row.unit_text, row.bounds_text,
             rst_to_md(row.doc)] for row in CONNECTION]
    return options_table(HEADER, rows)


def _signature_table(func: Callable[..., Any], doc_of: Any, table: Any) -> str:
    """One line per argument of ``func``: an option from its row of ``table``, any other
    argument from the ``Args:`` of ``doc_of``'s docstring."""
    docs = docstring_args(doc_of)
    rows = []
    for p in list(inspect.signature(func).parameters.values())[1:]:  # past self
        if p.kind is p.VAR_KEYWORD:
            rows.append([f"`**{p.name}`", "", "", "", docs.get(p.name, "") +
                         " (see [Connection options](connection-options.md))"])
            continue
        row = table.find(p.name)
        if row is not None:
            rows.append([f"`{p.name}`", show_default(row.default), row.unit_text,
                         row.bounds_text, rst_to_md(row.doc)])
        else:   # a KeyError names an undocumented argument
            rows.append([f"`{p.name}`", show_default(p.default), "", "", docs[p.name]])
    return options_table(["argument", *HEADER[1:]], rows)


def reader_options() -> str:
    from nsq_spark import Reader
    from nsq_spark.config import READER

    return _signature_table(Reader.__init__, Reader, READER)


def producer_options() -> str:
    from nsq_spark import Producer
    from nsq_spark.config import PRODUCER

    return _signature_table(Producer.__init__, Producer, PRODUCER)


# -- the command line -------------------------------------------------------------------------

def _subcommands(parser: Any, prefix: str) -> Iterator[tuple[str, Any]]:
    yield prefix, parser
    for action in parser._actions:  # argparse has no public walk of its subparsers
        choices = getattr(action, "choices", None)
        if action.__class__.__name__ == "_SubParsersAction" and choices:
            for name, sub in choices.items():
                yield from _subcommands(sub, f"{prefix} {name}")


def cli_reference() -> str:
    from nsq_spark.cli import build_parser

    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "96"  # the same wrapping wherever the site is built
    try:
        parts = []
        for command, parser in _subcommands(build_parser("nsq-spark"), "nsq-spark"):
            parts.append(f"### `{command}`\n\n```text\n{parser.format_help().rstrip()}\n```\n")
        return "\n".join(parts)
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old


# -- charts -------------------------------------------------------------------------------------

_COLOURS = ("#3f51b5", "#e91e63", "#009688", "#ff9800", "#795548", "#607d8b")


def _svg(width: int, height: int, body: list[str], title: str) -> str:
    return ('<div class="nsq-chart">\n'
            f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
            f'width="100%" style="max-width:{width}px" role="img" '
            f'aria-label="{html.escape(title)}"><title>{html.escape(title)}</title>'
            + "".join(body) + "</svg>\n</div>\n")


def dedup_chart(rate: int = 1000) -> str:
    """Catch probability of a duplicate against its delay, one line per bucket count."""
    from nsq_spark.dedup.opposite import OppositeBloomFilter as OBF
    from nsq_spark._validate import MAX_MEMORY_BYTES

    sizes = [10 ** k for k in range(4, 9)]
    delays = [10 ** (i / 20) for i in range(0, 20 * 4 + 1)]  # 1 s .. 10,000 s, log scale
    w, h, left, right, top, bottom = 700, 360, 56, 170, 16, 44
    pw, ph = w - left - right, h - top - bottom

    def x(d: float) -> float:
        return left + pw * math.log10(d) / 4

    def y(p: float) -> float:
        return top + ph * (1 - p)

    body = [f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" '
            'stroke="#999"/>']
    for p in (0, 0.25, 0.5, 0.75, 1):
        body.append(f'<line x1="{left}" x2="{left + pw}" y1="{y(p):.1f}" y2="{y(p):.1f}" '
                    f'stroke="#ddd"/><text x="{left - 6}" y="{y(p) + 4:.1f}" '
                    f'font-size="11" text-anchor="end">{p:.0%}</text>')
    for d, label in ((1, "1 s"), (10, "10 s"), (60, "1 min"), (600, "10 min"),
                     (3600, "1 h"), (10_000, "")):
        body.append(f'<line x1="{x(d):.1f}" x2="{x(d):.1f}" y1="{top}" y2="{top + ph}" '
                    f'stroke="#ddd"/><text x="{x(d):.1f}" y="{top + ph + 16}" '
                    f'font-size="11" text-anchor="middle">{label}</text>')
    body.append(f'<text x="{left + pw / 2}" y="{h - 6}" font-size="12" text-anchor="middle">'
                f'delay of the duplicate, at {rate:,} messages/s</text>')
    for colour, n in zip(_COLOURS, sizes):
        points = " ".join(f"{x(d):.1f},{y(OBF.probability_remembered(n, round(rate * d))):.1f}"
                          for d in delays)
        body.append(f'<polyline points="{points}" fill="none" stroke="{colour}" '
                    'stroke-width="2"/>')
    for i, (colour, n) in enumerate(zip(_COLOURS, sizes)):
        ly = top + 14 + 18 * i
        body.append(f'<line x1="{left + pw + 10}" x2="{left + pw + 30}" y1="{ly - 4}" '
                    f'y2="{ly - 4}" stroke="{colour}" stroke-width="2"/>'
                    f'<text x="{left + pw + 34}" y="{ly}" font-size="11">{n:,} buckets</text>')
    svg = _svg(w, h, body, "catch probability of a duplicate against its delay")

    digest = inspect.signature(OBF).parameters["digest_size"].default
    rows = []
    for window in (60, 600, 3600):
        for probability in (0.5, 0.9, 0.99):
            n = OBF.size_for(rate, window, probability)
            memory = n * digest
            over = " (over the in-process cap: use an exact store)" \
                if memory > MAX_MEMORY_BYTES else ""
            rows.append([f"{window:,} s", f"{probability:.0%}", f"{n:,}",
                         f"{memory / 2 ** 20:,.1f} MiB{over}"])
    sized = table(["window", "catch probability", "buckets (`size_for`)",
                   f"memory at {digest}-byte digests"], rows)
    return (f"{svg}\n*The chance that a duplicate is still caught, against how long after "
            f"the original it arrives, at {rate:,} other messages a second "
            "(`OppositeBloomFilter.probability_remembered`).*\n\n"
            f"The buckets `size_for({rate}, window, probability)` asks for:\n\n{sized}")


_SUFFIX = {"": 1.0, "k": 1e3, "M": 1e6, "G": 1e9}
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:[kMG](?![A-Za-z]))?")


def _first_number(text: str) -> float | None:
    """The first number of a cell, with its k / M / G suffix read (``"332k/280k"`` is
    332,000; ``"1.52M/s"`` 1,520,000; the M of ``"15.3 MiB"`` is a unit, not a suffix)."""
    m = _NUMBER.search(text.replace("**", ""))
    if m is None:
        return None
    digits = m.group(0).rstrip("kMG")
    return float(digits.replace(",", "")) * _SUFFIX[m.group(0)[len(digits):]]


def _show(value: float) -> str:
    """A bar's label: whole numbers with thousands separators, small ones to 3 figures."""
    return f"{value:,.0f}" if abs(value) >= 100 or value.is_integer() else f"{value:.3g}"


def _plain(text: str) -> str:
    return re.sub(r"[`*]", "", text).strip()


def bar_chart(header: list[str], rows: list[list[str]], column: str) -> str:
    """A horizontal bar chart of the column headed ``column`` (compared without Markdown's
    backticks and stars), one bar per row, each bar the cell's first number. A column not
    in the header, or a cell without a number, is an error: the chart would be wrong."""
    names = [_plain(h) for h in header]
    if _plain(column) not in names:
        raise ValueError(f"chart of {column!r}: no such column in {names}")
    col = names.index(_plain(column))
    nums = []
    for row in rows:
        v = _first_number(row[col]) if col < len(row) else None
        if v is None:
            raise ValueError(f"chart of {column!r}: row {row[0]!r} has no number there")
        nums.append(v)
    top = max(nums) or 1.0
    w, left, bar, gap = 640, 260, 18, 6
    h = len(rows) * (bar + gap) + 30
    body = []
    for i, (row, v) in enumerate(zip(rows, nums)):
        yy = 8 + i * (bar + gap)
        label = _plain(row[0])[:40]
        bw = max(1.0, (w - left - 90) * max(v, 0) / top)
        body.append(f'<text x="{left - 6}" y="{yy + 13}" font-size="11" text-anchor="end">'
                    f'{html.escape(label)}</text><rect x="{left}" y="{yy}" width="{bw:.1f}" '
                    f'height="{bar}" fill="{_COLOURS[0]}" data-value="{v:.15g}"/>'
                    f'<text x="{left + bw + 4:.1f}" y="{yy + 13}" font-size="11">'
                    f'{_show(v)}</text>')
    name = names[col]
    body.append(f'<text x="{left}" y="{h - 6}" font-size="12">{html.escape(name)}</text>')
    return _svg(w, h, body, name)


#: The line right above a table of bench/RESULTS.md that asks for a chart of one of its
#: columns: ``<!-- chart: msg/s -->``. A table without one gets no chart.
CHART_MARKER = re.compile(r"^<!--\s*chart:\s*(?P<column>.+?)\s*-->\s*$")


def _split_row(line: str) -> list[str]:
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]


def benchmarks() -> str:
    """bench/RESULTS.md with a chart after each table that asks for one (a
    ``<!-- chart: COLUMN -->`` line right above it, :data:`CHART_MARKER`); its H1 dropped."""
    lines = (REPO / "bench" / "RESULTS.md").read_text().splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("# "):
            i += 1
            continue
        marker = CHART_MARKER.match(line)
        if marker:
            if not (i + 1 < len(lines) and lines[i + 1].startswith("|")):
                raise ValueError(f"bench/RESULTS.md line {i + 1}: a chart marker must be "
                                 "right above a table")
            i += 1
            continue
        if line.startswith("|"):
            above = CHART_MARKER.match(lines[i - 1]) if i else None
            block = []
            while i < len(lines) and lines[i].startswith("|"):
                block.append(lines[i])
                i += 1
            out += block
            rows = [_split_row(r) for r in block]
            if above and len(rows) > 2:
                out += ["", bar_chart(rows[0], rows[2:], above.group("column"))]
            continue
        out.append(line)
        i += 1
    return "\n".join(out) + "\n"


# README links point at files of the repository; on the site, at their pages
_README_LINKS = {"docs/": "", "bench/RESULTS.md": "benchmarks.md", "CHANGELOG.md": "changelog.md"}


def readme() -> str:
    """README.md, the site's front page: its H1 dropped (the page has its own), its links
    to docs/, bench/RESULTS.md and CHANGELOG.md made links to the site's pages."""
    text = re.sub(r"\A# [^\n]*\n", "", (REPO / "README.md").read_text())
    for old, new in _README_LINKS.items():
        text = text.replace(f"]({old}", f"]({new}")
    return text


def changelog() -> str:
    text = (REPO / "CHANGELOG.md").read_text()
    return re.sub(r"\A# [^\n]*\n", "", text)  # the page has its own title


def spark_schema() -> str:
    from nsq_spark.spark._schema import SCHEMA_DDL
    return f"Schema: `{SCHEMA_DDL}`."


GENERATORS: dict[str, Callable[[], str]] = {
    "spark-schema": spark_schema,
    "spark-read-options": spark_read_options,
    "spark-write-options": spark_write_options,
    "spark-connection-options": spark_connection_options,
    "connection-options": connection_options,
    "reader-options": reader_options,
    "producer-options": producer_options,
    "cli-reference": cli_reference,
    "dedup-chart": dedup_chart,
    "benchmarks": benchmarks,
    "changelog": changelog,
    "readme": readme,
}


def expand(markdown: str) -> str:
    """``markdown`` with every generated marker replaced (an unknown name raises)."""
    def one(m: re.Match[str]) -> str:
        name = m.group("name")
        if name not in GENERATORS:
            raise KeyError(f"unknown generated part {name!r}; known: {sorted(GENERATORS)}")
        return GENERATORS[name]()
    return MARKER.sub(one, markdown)


_FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})")
_NOT_A_HEADING = re.compile(r"^(#{1,6})(?=[^#\s])")


def commonmark_headings(markdown: str) -> str:
    """``markdown`` with a ``#`` that starts a line but no heading escaped (``\\#``): for
    CommonMark (GitHub, the pages' tests) ``#24 removed`` is text, a heading needs a space
    after its ``#``s; Python-Markdown would make it a heading. Code blocks are left as
    they are."""
    out, fence = [], ""
    for line in markdown.split("\n"):
        m = _FENCE.match(line)
        if m and (not fence or m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence)):
            fence = "" if fence else m.group(1)
        elif not fence:
            line = _NOT_A_HEADING.sub(lambda h: "\\" + h.group(1), line)
        out.append(line)
    return "\n".join(out)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    return commonmark_headings(expand(markdown))
