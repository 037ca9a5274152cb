"""The documentation site builds with no warning and works in a real browser.

``mkdocs build --strict`` (a broken link, a missing page or reference, any warning fails
it) builds the site into a temporary directory once per run; the checks then read what it
built: the option tables generated from the code are on their pages and in the search
index. A headless Chromium (Debian's ``chromium`` and ``chromedriver``,
``scripts/install-docs-browser``) opens every page over a loopback HTTP server: no
console error (level SEVERE) on any page (a ``console.error`` of its own, made first,
must be captured, so that the check can fail), Material's search box finds
``maxMessagesPerTrigger``, ``spark.speculation``, ``speculation`` and ``speculative`` on
the Spark page (and a word on no page finds nothing), no element of any page is wider
than the page's content column and every option table's description column keeps a
readable width (an element made too wide, and a description column squeezed, on purpose
must be caught first), and a screenshot of the Spark page is kept under
``test-artifacts/`` (its path is printed). Without Chromium, chromedriver or selenium the
browser test skips and says which is missing.

What the build must not show: a reST role of the docstrings as literal text (``:meth:``;
they become links, or plain names where the target is not on the site), a line of an
included file that starts with ``#`` but is no heading turned into one (bench/RESULTS.md's
``#24 removed), ...``). Each check first shows it would catch the fault.
"""

from __future__ import annotations

import functools
import html as html_lib
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any, Iterator

import pytest

REPO = Path(__file__).resolve().parent.parent
ARTIFACTS = REPO / "test-artifacts" / "docs"
CHROMIUM = os.environ.get("CHROMIUM_BIN", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("CHROMEDRIVER_BIN", "/usr/bin/chromedriver")
BUILD_TIMEOUT = 120.0

pytest.importorskip("mkdocs", reason="the docs extra is not installed: pip install -e '.[docs]'")
pytestmark = pytest.mark.docs


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built by ``mkdocs build --strict`` from this checkout."""
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=BUILD_TIMEOUT)
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stderr}"
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("WARNING")]
    assert not warnings, "\n".join(warnings)
    return out


def _pages(site: Path) -> list[str]:
    """Every page of the site, as a path under its root ("" is the front page)."""
    pages = sorted(p.parent.relative_to(site).as_posix() + "/"
                   for p in site.rglob("index.html"))
    return ["" if p == "./" else p for p in pages if not p.startswith(("assets/", "search/"))]


# -- the build ---------------------------------------------------------------------------------

@pytest.mark.timeout(180)
def test_the_site_builds_strict_with_every_page(site: Path):
    pages = _pages(site)
    for expected in ("", "getting-started/", "consuming/", "publishing/", "spark/", "dedup/",
                     "testing/", "coming-from-pynsq/", "operations/", "benchmarks/",
                     "reference/", "reference/reader/", "changelog/"):
        assert expected in pages, f"page {expected!r} missing from {pages}"


@pytest.mark.timeout(180)
def test_every_spark_and_reader_option_is_on_its_page_and_in_the_search_index(site: Path):
    from nsq_spark.config import READER
    from nsq_spark.spark.options import CONNECTION, READ, WRITE

    spark_page = (site / "spark" / "index.html").read_text()
    for row in [*READ, *WRITE, *CONNECTION]:
        assert f"<code>{row.name}</code>" in spark_page, f"Spark option {row.name} not on the page"
    consuming = (site / "consuming" / "index.html").read_text()
    for row in READER:
        assert f"<code>{row.name}</code>" in consuming, f"Reader argument {row.name} not on the page"
    index = json.loads((site / "search" / "search_index.json").read_text())
    found = {doc["location"].split("#")[0] for doc in index["docs"]
             if "maxMessagesPerTrigger" in doc["text"]}
    assert "spark/" in found, found
    for name in ("maxInFlight", "max_backoff_duration", "heartbeat_interval"):
        assert any(name in doc["text"] for doc in index["docs"]), name


@pytest.mark.timeout(180)
def test_the_generated_parts_are_rendered(site: Path):
    # the theme's icons are <svg> too: count the charts by their own class
    dedup = (site / "dedup" / "index.html").read_text()
    assert dedup.count('class="nsq-chart"') == 1 and "buckets" in dedup
    assert dedup.count("<polyline") == 5  # one line per bucket count
    bench = (site / "benchmarks" / "index.html").read_text()
    assert bench.count('class="nsq-chart"') >= 5
    # a default with <...> in it is text, not a tag the browser swallows
    spark = (site / "spark" / "index.html").read_text()
    assert "&lt;spoolPath&gt;/_dead_letter" in spark
    assert "<spoolPath>" not in spark
    operations = (site / "operations" / "index.html").read_text()
    for command in ("nsq-spark publish", "nsq-spark tail", "nsq-spark spool redrive",
                    "nsq-spark install-nsq"):
        assert command in operations
    changelog = (site / "changelog" / "index.html").read_text()
    assert "Unreleased" in changelog
    assert "generated:" not in "".join(p.read_text() for p in site.rglob("*.html"))


# -- what the build must not show -------------------------------------------------------------

#: a reST role as mkdocstrings' Markdown prints it: ``:meth:<code>x</code>`` (or with the
#: backticks left)
LITERAL_ROLE = re.compile(r":(?:py:)?(?:meth|func|class|mod|attr|data|exc|obj|const):"
                          r"(?:<code>|`)")
SOURCE_ROLE = re.compile(r":(?:meth|func|class|mod|attr|data|exc|obj):`")


def test_the_role_detector_catches_a_literal_role():
    """The positive control of the next test: its detector sees what the site printed
    before (``:meth:<code>set_message_handler</code>``)."""
    assert LITERAL_ROLE.search("with :meth:<code>set_message_handler</code> (pynsq)")
    assert LITERAL_ROLE.search("see :class:`Reader`")
    assert not LITERAL_ROLE.search('<a class="autorefs" href="#x"><code>run()</code></a>')


@pytest.mark.timeout(180)
def test_no_page_prints_a_rest_role_and_the_roles_became_links(site: Path):
    # the docstrings do use the roles: the check below is not vacuous
    in_source = sum(len(SOURCE_ROLE.findall(p.read_text()))
                    for p in (REPO / "nsq_spark").rglob("*.py"))
    assert in_source > 100, in_source
    literal = {page.relative_to(site).as_posix(): len(LITERAL_ROLE.findall(page.read_text()))
               for page in site.rglob("*.html")}
    assert {page: n for page, n in literal.items() if n} == {}
    links = sum(page.read_text().count('class="autorefs autorefs-internal"')
                for page in (site / "reference").rglob("*.html"))
    assert links > 100, links  # most of them point at the object's own documentation


def _headings(page_html: str) -> list[str]:
    return [html_lib.unescape(re.sub(r"<[^>]+>", "", h)).replace("¶", "").strip()
            for h in re.findall(r"<h[1-6][^>]*>(.*?)</h[1-6]>", page_html, re.S)]


def test_a_hash_line_that_is_no_heading_stays_text():
    """The positive control of the next test: bench/RESULTS.md has such a line, and the
    hook keeps it text where Python-Markdown alone would make it a heading."""
    import markdown

    sys.path.insert(0, str(REPO / "docs" / "hooks"))
    import generate

    results = (REPO / "bench" / "RESULTS.md").read_text()
    assert re.search(r"^#[^#\s]", results, re.M), "no such line left to check"
    text = "## Real\n\n#24 removed), and far\n\n```sh\n#!/bin/sh\n```\n"
    plain = markdown.markdown(text, extensions=["fenced_code"])
    assert _headings(plain) == ["Real", "24 removed), and far"]
    escaped = markdown.markdown(generate.commonmark_headings(text), extensions=["fenced_code"])
    assert _headings(escaped) == ["Real"] and "#!/bin/sh" in escaped


@pytest.mark.timeout(180)
def test_the_benchmarks_page_has_exactly_the_headings_of_bench_results(site: Path):
    results = (REPO / "bench" / "RESULTS.md").read_text()
    # a heading's inline code (`publish_id`) renders as the text inside the backticks
    expected = [re.sub(r"`([^`]*)`", r"\1", m.group(2)).strip()
                for m in re.finditer(r"^(#{2,6}) (.+)$", results, re.M)]
    shown = _headings((site / "benchmarks" / "index.html").read_text())
    assert shown[0] == "Benchmarks"  # the page's own title; RESULTS.md's H1 is dropped
    assert shown[1:] == expected


#: "see "X" above/below": the quoted section or phrase must be on that side of it
_POINTER = re.compile(r'\bsee "(?P<what>[^"\n]{4,80})"(?P<between>[^".]{0,40}?)'
                      r'\b(?P<side>above|below)\b')


def wrong_pointers(text: str) -> list[str]:
    wrong = []
    flat = " ".join(text.split())
    for m in _POINTER.finditer(flat):
        quoted = m.start() + len('see "')
        others = [i for i in (x.start() for x in re.finditer(re.escape(m.group("what")), flat))
                  if i != quoted]
        ok = (any(i < m.start() for i in others) if m.group("side") == "above"
              else any(i > m.end() for i in others))
        if not ok:
            wrong.append(m.group(0))
    return wrong


def test_a_see_above_that_points_below_is_caught():
    text = 'steps (see "Reading the figures" above).\n\nReading the figures: the runs...'
    assert wrong_pointers(text) == ['see "Reading the figures" above']
    assert wrong_pointers(text.replace("above", "below")) == []


def test_every_see_above_or_below_points_the_right_way():
    pages = [REPO / "README.md", REPO / "bench" / "RESULTS.md",
             *(p for p in (REPO / "docs").rglob("*.md") if "hooks" not in p.parts)]
    wrong = {p.relative_to(REPO).as_posix(): w for p in pages
             if (w := wrong_pointers(p.read_text()))}
    assert wrong == {}


# -- a real browser ---------------------------------------------------------------------------

class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def served(site: Path) -> Iterator[str]:
    """The built site over HTTP on a free loopback port."""
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not shutil.which(p)]
    if missing:
        pytest.skip(f"{', '.join(missing)} not found: scripts/install-docs-browser installs "
                    "Debian's chromium and chromium-driver")
    webdriver = pytest.importorskip("selenium.webdriver",
                                    reason="selenium is not installed (the test extra)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                "--disable-gpu", "--window-size=1280,2000"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = webdriver.ChromeService(executable_path=CHROMEDRIVER)
    driver = webdriver.Chrome(options=options, service=service)
    try:
        yield driver
    finally:
        driver.quit()


def _wait(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


@pytest.mark.timeout(120)
def test_every_page_loads_in_chromium_without_console_errors(site: Path, served: str,
                                                            browser: Any):
    errors: list[str] = []
    pages = _pages(site)

    def severe(page: str) -> list[str]:
        found = [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]
        errors.extend(f"{page}: {m}" for m in found if "docs-canary" not in m)
        return found

    # the positive control: a console error the page makes is one this test captures
    browser.get(served)
    _wait(lambda: browser.execute_script("return document.readyState") == "complete",
          10, "the front page to load")
    browser.execute_script('console.error("docs-canary")')
    _wait(lambda: any("docs-canary" in m for m in severe("(canary)")), 10,
          "the canary console.error to be captured as a SEVERE log entry")
    for page in pages:
        browser.get(served + page)
        _wait(lambda: browser.execute_script("return document.readyState") == "complete",
              10, f"{page} to load")
        assert browser.find_elements("css selector", "article h1"), f"{page}: no title"
        severe(page)
    time.sleep(0.5)
    severe(pages[-1])  # what the last page logged after its load
    assert not errors, "console errors:\n" + "\n".join(errors)
    assert len(pages) >= 15


def _search(browser: Any, served: str, words: str) -> list[str]:
    """The paths of the pages Material's search box lists for ``words``."""
    browser.get(served)
    query = "input[data-md-component='search-query']"
    if not any(e.is_displayed() for e in browser.find_elements("css selector", query)):
        # a narrow window shows a search button instead of the box
        browser.find_element("css selector", "label.md-header__button[for='__search']").click()
    box = _wait(lambda: [e for e in browser.find_elements("css selector", query)
                         if e.is_displayed()], 10, "the search box")[0]
    box.click()
    box.send_keys(words)
    # the search has answered when its meta line says how many documents matched
    _wait(lambda: "match" in browser.find_element(
        "css selector", ".md-search-result__meta").text.lower(), 15, f"results for {words!r}")
    return [urllib.parse.urlsplit(a.get_attribute("href") or "").path
            for a in browser.find_elements("css selector", ".md-search-result__link")]


@pytest.mark.timeout(120)
def test_search_finds_dotted_camel_case_and_inflected_names_on_the_spark_page(
        served: str, browser: Any):
    # the positive control: a word on no page lists nothing, so a listed page is a finding
    assert _search(browser, served, "zzqxnotaword") == []
    # the Spark page itself, not /reference/spark/ or another page that mentions it;
    # "speculation" is inside spark.speculation=true, "speculative" in "Speculative
    # execution": each was one word of the index before (a dot and = did not split)
    for words in ("maxMessagesPerTrigger", "spark.speculation", "speculation",
                  "speculative"):
        links = _search(browser, served, words)
        assert "/spark/" in links, (words, links)


#: Elements (outside code blocks, which scroll by design) that reach past the page's
#: content column, and the width of each option table's description column.
_MEASURE = """
const article = document.querySelector("article.md-content__inner");
const column = article.parentElement.getBoundingClientRect().right + 0.5;
const wide = [];
for (const el of article.querySelectorAll("*")) {
  if (el.closest("pre")) continue;
  const r = el.getBoundingClientRect();
  if (r.width > 0 && r.right > column)
    wide.push(el.tagName + "." + el.className + " ends at " + Math.round(r.right) +
              " > " + Math.round(column) + ": " + (el.textContent || "").trim().slice(0, 40));
}
const descriptions = Array.from(article.querySelectorAll(".nsq-options table")).map(
  t => Math.round(t.rows[0].cells[t.rows[0].cells.length - 1].getBoundingClientRect().width));
return {wide: wide.slice(0, 5), descriptions: descriptions};
"""
#: narrower than this, a description column reads a few words a line (it was ~130 px)
MIN_DESCRIPTION_PX = 250


@pytest.mark.timeout(180)
def test_no_element_is_wider_than_its_column_and_option_descriptions_are_readable(
        site: Path, served: str, browser: Any):
    # the positive control: an element made too wide, and a description column squeezed,
    # on purpose are caught by the same measurement
    browser.get(served + "spark/")
    _wait(lambda: browser.execute_script("return document.readyState") == "complete",
          10, "the Spark page")
    browser.execute_script("""
        const wide = document.createElement("div");
        wide.style.width = "3000px"; wide.textContent = "too wide";
        document.querySelector("article.md-content__inner").appendChild(wide);
        const t = document.querySelector(".nsq-options table");
        t.style.display = "table"; t.style.tableLayout = "fixed"; t.style.width = "500px";""")
    control = browser.execute_script(_MEASURE)
    assert any("too wide" in w for w in control["wide"]), control
    assert min(control["descriptions"]) < MIN_DESCRIPTION_PX, control
    problems: dict[str, Any] = {}
    tables = 0
    for page in _pages(site):
        browser.get(served + page)
        _wait(lambda: browser.execute_script("return document.readyState") == "complete",
              10, f"{page} to load")
        found = browser.execute_script(_MEASURE)
        tables += len(found["descriptions"])
        narrow = [w for w in found["descriptions"] if w < MIN_DESCRIPTION_PX]
        if found["wide"] or narrow:
            problems[page or "/"] = {"wide": found["wide"], "narrow descriptions": narrow}
    assert problems == {}
    assert tables >= 6  # the Spark (3), Reader, Producer and connection option tables


@pytest.mark.timeout(120)
def test_a_screenshot_of_the_spark_page_is_kept(served: str, browser: Any):
    browser.get(served + "spark/")
    _wait(lambda: browser.execute_script("return document.readyState") == "complete",
          10, "the Spark page")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "spark.png"
    assert browser.save_screenshot(str(shot))
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
    print(f"screenshot of the Spark page: {shot}")
