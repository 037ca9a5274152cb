"""The documentation site builds with no warning and works in a real browser.

``mkdocs build --strict`` (a broken link, a missing page or reference, any warning fails
it) builds the site into a temporary directory once per run; the checks then read what it
built: the option tables generated from the code are on their pages and in the search
index. A headless Chromium (Debian's ``chromium`` and ``chromedriver``,
``scripts/install-docs-browser``) opens every page over a loopback HTTP server: no
console error (level SEVERE) on any page (a ``console.error`` of its own, made first,
must be captured, so that the check can fail), Material's search box finds
``maxMessagesPerTrigger`` on the Spark page, and a screenshot of the Spark page is kept
under ``test-artifacts/`` (its path is printed). Without Chromium, chromedriver or
selenium the browser test skips and says which is missing.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
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
    from nsq_spark.config import READER_LIMITS
    from nsq_spark.spark.options import READ_OPTIONS, READER_CACHE_OPTIONS, WRITE_OPTIONS

    spark_page = (site / "spark" / "index.html").read_text()
    for name in READ_OPTIONS + READER_CACHE_OPTIONS + WRITE_OPTIONS:
        assert f"<code>{name}</code>" in spark_page, f"Spark option {name} not on the page"
    consuming = (site / "consuming" / "index.html").read_text()
    for name in READER_LIMITS:
        assert f"<code>{name}</code>" in consuming, f"Reader argument {name} not on the page"
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


@pytest.mark.timeout(120)
def test_search_finds_max_messages_per_trigger_on_the_spark_page(served: str, browser: Any):
    browser.get(served)
    query = "input[data-md-component='search-query']"
    if not any(e.is_displayed() for e in browser.find_elements("css selector", query)):
        # a narrow window shows a search button instead of the box
        browser.find_element("css selector", "label.md-header__button[for='__search']").click()
    box = _wait(lambda: [e for e in browser.find_elements("css selector", query)
                         if e.is_displayed()], 10, "the search box")[0]
    box.click()
    box.send_keys("maxMessagesPerTrigger")
    links = _wait(lambda: [a.get_attribute("href") for a in browser.find_elements(
        "css selector", ".md-search-result__link")], 15, "search results")
    # the Spark page itself, not /reference/spark/ or another page that mentions it
    assert any(urllib.parse.urlsplit(href or "").path == "/spark/" for href in links), links


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
