"""Every code block of README.md and of every documentation page (docs/**/*.md) runs as
written, against real nsqd, nsqlookupd and redis.

Blocks are found with markdown-it-py (a CommonMark parser: blocks inside list items come
out dedented, as a reader copies them). Each ``python`` block runs alone in a fresh
interpreter, each ``sh`` block in bash (``set -euo pipefail``) with an ``nsq-spark``
command that runs this checkout's code; both in an empty temporary directory, after the
pages' example addresses (README's) are replaced by those of a fresh cluster (two nsqd, one
nsqlookupd; a third nsqd, ``127.0.0.1:4350``, for a block that names it) and, when a block
names them, of a redis-server / memcached.

An HTML comment on the line above a block says how to treat it:

- ``<!-- fragment: REASON -->``: not a program (a signature, a make target, a Spark
  snippet); skipped, with REASON shown.
- ``<!-- runs until interrupted -->``: a consumer that runs until a signal (``nsq.run()``);
  it gets SIGINT once it has printed one of the messages the test published before it
  started, and must then exit 0.
- ``<!-- runs with Spark -->``: a self-contained Spark program (``local[2]``); it runs
  under the ``spark`` marker, with its ``/tmp/nsq-spool``, ``/tmp/nsq-ckpt`` and
  ``/tmp/nsq-data`` paths replaced by temporary directories of the test, as a user runs
  it: from a venv that is not activated, ``PYSPARK_PYTHON`` unset and a ``python3`` on the
  PATH that has no nsq-spark and no pyspark (:func:`unactivated_env`). It reads what the
  test published (and writes it to ``/tmp/nsq-data`` or the console, which the test
  checks), or publishes its own input and checks its result with top-level ``assert``
  statements.
- ``<!-- starts servers -->``: starts nsqd / nsqlookupd in the background (the
  getting-started page); it runs with the page's other blocks, in their order, in
  tests/test_getting_started.py.

The pages in :data:`IN_ORDER` run as a whole, their blocks in order, sharing the servers
they start: tests/test_getting_started.py, not here.

Blocks without a language (the layout tree) are not code, nor are ``text`` / ``json``
blocks. The Spark connector's blocks that need a session of the reader's or a cluster's
storage are fragments (tests/spark and tests/cluster run the connector itself); those
that start their own local Spark run, marked ``spark``. Parts of pages that the site
generates at build time (``<!-- generated: NAME -->``, docs/hooks/generate.py) are not
in the page's source, so not here; tests/test_docs_site.py builds them.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

markdown_it = pytest.importorskip("markdown_it")

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
DOCS = REPO / "docs"
# README.md, then every page of the site (docs/hooks holds the build's code, no page)
PAGES = [README] + sorted(p for p in DOCS.rglob("*.md") if "hooks" not in p.parts)
RUN_TIMEOUT = 60.0       # seconds one block may run
INTERRUPT_AFTER = 20.0   # a "runs until interrupted" block must print within this

_MARKER = re.compile(r"^\s*<!--\s*(fragment:\s*(?P<reason>.*?)|(?P<interrupt>runs until "
                     r"interrupted)|(?P<spark>runs with Spark)|(?P<servers>starts servers))"
                     r"\s*-->\s*$")
#: pages whose blocks run in order, as a whole (tests/test_getting_started.py)
IN_ORDER = ("docs/getting-started.md",)
# a Spark block's paths -> the test's temporary directories of the same names
SPARK_PATHS = ("/tmp/nsq-spool", "/tmp/nsq-ckpt", "/tmp/nsq-data")
RUN_TIMEOUT_SPARK = 240.0  # a JVM's start, a query, on 2 cores
_RUNNABLE = {"python": "python", "py": "python", "sh": "sh", "bash": "sh", "shell": "sh",
             "console": "sh"}


@dataclass
class Block:
    page: str                 # path relative to the repository: README.md, docs/spark.md
    line: int                 # 1-based line of the opening fence
    lang: str                 # "python" or "sh"
    code: str
    section: str
    fragment: str | None      # the reason, for fragments
    interrupt: bool
    spark: bool = False       # a local Spark program (the spark marker)
    servers: bool = False     # starts servers in the background (runs in page order)

    @property
    def id(self) -> str:
        slug = re.sub(r"[^a-z0-9]+", "-", self.section.lower()).strip("-")
        return f"{self.page}:L{self.line}-{self.lang}-{slug}"

    @property
    def where(self) -> str:
        return f"{self.page} line {self.line}"


def page_blocks(text: str, page: str = "README.md") -> list[Block]:
    """The runnable-language blocks of ``text`` (the page ``page``), with their markers
    and sections."""
    lines = text.splitlines()
    tokens = markdown_it.MarkdownIt("commonmark").parse(text)
    blocks: list[Block] = []
    section = ""
    for i, tok in enumerate(tokens):
        if tok.type == "heading_open" and tok.tag == "h2":
            section = tokens[i + 1].content.strip()
        if tok.type != "fence" or tok.map is None:
            continue
        lang = _RUNNABLE.get(tok.info.strip().split(" ")[0].lower()) if tok.info else None
        if lang is None:
            continue
        start = tok.map[0]
        above = next((lines[j] for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        m = _MARKER.match(above)
        blocks.append(Block(
            page=page, line=start + 1, lang=lang, code=tok.content, section=section,
            fragment=(m.group("reason") or "fragment") if m and m.group("reason") is not None
            else None,
            interrupt=bool(m and m.group("interrupt")),
            spark=bool(m and m.group("spark")), servers=bool(m and m.group("servers"))))
    return blocks


def spark_paths(code: str, tmp_path: Path) -> str:
    """A Spark block's ``/tmp/nsq-*`` paths, made the test's own."""
    for path in SPARK_PATHS:
        code = code.replace(path, str(tmp_path / path.rsplit("/", 1)[1]))
    return code


#: the python3 a machine has of its own: the standard library only (``-S``: no
#: site-packages, so neither nsq-spark nor pyspark), as on a fresh system
_SYSTEM_PYTHON = """#!/bin/sh
# python3 from the PATH: a Python without nsq-spark or pyspark (tests/test_docs_blocks.py)
exec "{python}" -S "$@"
"""


def unactivated_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a user who runs ``venv/bin/python app.py`` without activating
    the venv: no ``VIRTUAL_ENV``, no ``PYSPARK_PYTHON`` / ``PYSPARK_DRIVER_PYTHON``, no
    ``PYTHONPATH``, the venv's ``bin`` not on the PATH, and first on the PATH a ``python3``
    (and ``python``) that has neither nsq-spark nor pyspark. The suite's venv runs this
    checkout's code (compat editable install), so nothing else is needed to test it."""
    fake = tmp_path / "system-bin"
    fake.mkdir(exist_ok=True)
    base = getattr(sys, "_base_executable", None) or os.path.realpath(sys.executable)
    for name in ("python3", "python"):
        shim = fake / name
        shim.write_text(_SYSTEM_PYTHON.format(python=base))
        shim.chmod(0o755)
    venv_bin = str(Path(sys.executable).parent)
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != venv_bin]
    env = {k: v for k, v in os.environ.items()
           if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYSPARK_PYTHON",
                        "PYSPARK_DRIVER_PYTHON", "PYTHONHOME")}
    env.update(PATH=os.pathsep.join([str(fake), *path]), PYTHONUNBUFFERED="1")
    return env


def _page_name(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


BLOCKS = [b for path in PAGES for b in page_blocks(path.read_text(), _page_name(path))]


# -- the extractor and the markers (no processes) ----------------------------------------

@pytest.mark.unit
def test_the_extractor_finds_blocks_markers_and_list_item_blocks():
    text = (
        "## One\n\n<!-- fragment: a signature -->\n```python\nf(x) -> int\n```\n\n"
        "- item:\n\n  ```python\n  import os\n  print(os.sep)\n  ```\n\n"
        "## Two\n\n<!-- runs until interrupted -->\n\n```sh\necho hi\n```\n\n"
        "```\nnot code\n```\n\n<!-- runs with Spark -->\n```python\nspark\n```\n\n"
        "<!-- starts servers -->\n```sh\nnsqd &\n```\n")
    blocks = page_blocks(text)
    assert [(b.line, b.lang, b.section, b.fragment, b.interrupt, b.spark, b.servers)
            for b in blocks] == [
        (4, "python", "One", "a signature", False, False, False),
        (10, "python", "One", None, False, False, False),
        (19, "sh", "Two", None, True, False, False),
        (28, "python", "Two", None, False, True, False),
        (33, "sh", "Two", None, False, False, True)]
    assert blocks[1].code == "import os\nprint(os.sep)\n"   # dedented out of the list item


@pytest.mark.unit
def test_the_pages_are_the_readme_and_every_docs_page():
    names = [_page_name(p) for p in PAGES]
    assert names[0] == "README.md"
    for expected in ("docs/index.md", "docs/getting-started.md", "docs/spark.md",
                     "docs/reference/index.md"):
        assert expected in names
    assert not any(n.startswith("docs/hooks/") for n in names)


@pytest.mark.unit
def test_every_fragment_says_why_and_most_blocks_run():
    assert BLOCKS, "no code blocks found in README.md and docs/"
    for b in BLOCKS:
        if b.fragment is not None:
            assert len(b.fragment) > 10, f"{b.where}: say why it is a fragment"
    runnable = [b for b in BLOCKS if b.fragment is None]
    assert len(runnable) >= 15
    assert any(b.page == "README.md" for b in runnable)
    spark = [b for b in BLOCKS if b.spark]
    assert {b.page for b in spark} >= {"README.md", "docs/getting-started.md"}
    # servers started in the background only where the page runs as a whole, in order
    assert {b.page for b in BLOCKS if b.servers} <= set(IN_ORDER)
    for b in spark:  # nothing of the reader's machine: its paths are the test's
        paths = re.findall(r'"(/[^"]*)"', b.code)
        assert not re.search(r'"(hdfs|s3a?)://', b.code) and "lookupd1" not in b.code, b.where
        assert paths and all(p.startswith(SPARK_PATHS) for p in paths), b.where


@pytest.mark.unit
@pytest.mark.parametrize("path", PAGES, ids=_page_name)
def test_every_marker_is_followed_by_a_block(path: Path):
    lines = path.read_text().splitlines()
    for n, line in enumerate(lines):
        if _MARKER.match(line):
            following = next((x for x in lines[n + 1:] if x.strip()), "")
            assert following.strip().startswith("```"), \
                f"{_page_name(path)} line {n + 1}: a marker must be right above a code block"


# -- running them ---------------------------------------------------------------------------

def _http_post(address: str, path: str, body: bytes) -> None:
    req = urllib.request.Request(f"http://{address}{path}", data=body, method="POST")
    urllib.request.urlopen(req, timeout=5).read()


def _addresses(block: Block, cluster, request) -> dict[str, str]:
    """The pages' example address -> the real one."""
    nsqd, lookupd = cluster.nsqds, cluster.lookupds
    mapping = {
        "127.0.0.1:4150": nsqd[0].tcp_address, "127.0.0.1:4151": nsqd[0].http_address,
        "127.0.0.1:4250": nsqd[1].tcp_address, "127.0.0.1:4251": nsqd[1].http_address,
        "127.0.0.1:4160": lookupd[0].tcp_address, "127.0.0.1:4161": lookupd[0].http_address,
    }
    if "127.0.0.1:4350" in block.code:   # a block of three nsqd: a third one, for it
        cluster.add_nsqd()
        mapping["127.0.0.1:4350"] = nsqd[2].tcp_address
        mapping["127.0.0.1:4351"] = nsqd[2].http_address
    if "127.0.0.1:6379" in block.code:
        redis = request.getfixturevalue("redis_server")
        mapping["127.0.0.1:6379"] = f"127.0.0.1:{redis.port}"
    if "127.0.0.1:11211" in block.code:
        host, port = request.getfixturevalue("memcached_server").address
        mapping["127.0.0.1:11211"] = f"{host}:{port}"
    return mapping


def _substitute(code: str, mapping: dict[str, str]) -> str:
    return re.sub(r"127\.0\.0\.1:\d+\b", lambda m: mapping.get(m.group(0), m.group(0)), code)


def _command(block: Block, code: str, workdir: Path) -> list[str]:
    if block.lang == "python":
        (workdir / "block.py").write_text(code)
        return [sys.executable, "block.py"]
    # `nsq-spark` as installed by pip, but running this checkout's code
    bindir = workdir / "bin"
    bindir.mkdir()
    shim = bindir / "nsq-spark"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m nsq_spark "$@"\n')
    shim.chmod(0o755)
    (workdir / "block.sh").write_text(f'export PATH="{bindir}:$PATH"\n{code}')
    return ["bash", "-euo", "pipefail", "block.sh"]


def _marks(b: Block) -> list[Any]:
    if b.fragment:
        return [pytest.mark.skip(reason=f"{b.where} is a fragment: {b.fragment}")]
    return [pytest.mark.spark] if b.spark else []


@pytest.mark.nsqd
@pytest.mark.timeout(300)
@pytest.mark.nsq_cluster(nsqd=2, lookupd=1)
@pytest.mark.parametrize("block", [pytest.param(b, id=b.id, marks=_marks(b)) for b in BLOCKS
                                   if b.page not in IN_ORDER])
def test_docs_block_runs(block: Block, nsq_cluster, request, tmp_path):
    code = _substitute(block.code, _addresses(block, nsq_cluster, request))
    if block.spark:
        pytest.importorskip("pyspark", reason="the spark extra is not installed")
        code = spark_paths(code, tmp_path)
    # something to consume, on every topic the pages' consumers read
    published = [b"readme-%d" % i for i in range(5)]
    for topic in ("events", "orders"):
        _http_post(nsq_cluster.nsqd_http_addresses[0], f"/mpub?topic={topic}",
                   b"\n".join(published))
    workdir = tmp_path / "cwd"
    workdir.mkdir()
    if block.spark:  # as a user runs it: the venv's python, the venv not activated
        env = unactivated_env(tmp_path)
    else:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]),
            "PYTHONUNBUFFERED": "1"}
    env.pop("NSQ_AUTH_SECRET", None)
    proc = subprocess.Popen(_command(block, code, workdir), cwd=workdir, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        if block.interrupt:
            out = _read_until(proc, b"readme-", INTERRUPT_AFTER)
            proc.send_signal(signal.SIGINT)
            rest, err = proc.communicate(timeout=RUN_TIMEOUT)
            out += rest
            assert b"readme-" in out, \
                f"{block.where} printed none of the published messages"
        else:
            out, err = proc.communicate(
                timeout=RUN_TIMEOUT_SPARK if block.spark else RUN_TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    report = (f"{block.where} ({block.section}) exited {proc.returncode}\n"
              f"--- code as run:\n{code}\n--- stdout:\n{out.decode(errors='replace')}\n"
              f"--- stderr:\n{err.decode(errors='replace')}")
    assert proc.returncode == 0, report
    assert b"Traceback" not in err, report
    if block.spark:  # the query read what the test published, and wrote it where it says
        data = tmp_path / "nsq-data"
        if data.exists():
            import pyarrow.parquet as pq

            bodies = pq.read_table(str(data)).column("body").to_pylist()
            assert sorted(bodies) == sorted(published), report
        elif "\nassert " not in code:  # the console sink: one batch, with its rows
            assert b"Batch: 0" in out and out.count(b"|") > 10, report
        # else: a block that publishes its own input asserts its own result (exit 0)


def _read_until(proc: subprocess.Popen[bytes], needle: bytes, timeout: float) -> bytes:
    """stdout of ``proc`` until ``needle`` appears (or ``timeout`` s, or it exits)."""
    assert proc.stdout is not None
    os.set_blocking(proc.stdout.fileno(), False)
    got = b""
    deadline = time.monotonic() + timeout
    while needle not in got and time.monotonic() < deadline and proc.poll() is None:
        chunk = proc.stdout.read()
        if chunk:
            got += chunk
        else:
            time.sleep(0.05)
    os.set_blocking(proc.stdout.fileno(), True)
    return got
