"""Unit tests of the command-line tools: parsing, input splitting, progress, errors that
come before any connection. (Publishing and tailing against real nsqd are in
test_cli_nsqd.py.)"""

from __future__ import annotations

import io

import pytest

from nsq_spark import cli

pytestmark = pytest.mark.unit


def test_go_style_and_gnu_style_options_parse_alike():
    p = cli.build_parser()
    a = p.parse_args(["publish", "-topic", "t", "-nsqd-tcp-address", "h:1",
                      "--nsqd-tcp-address", "h:2", "f1", "f2"])
    assert a.topic == "t" and a.nsqd_tcp_addresses == ["h:1", "h:2"] and a.files == ["f1", "f2"]
    assert a.delimiter == b"\n" and a.spool_fsync == "always"
    a = p.parse_args(["publish", "--topic", "t", "--nsqd-tcp-address", "h:1",
                      "--spool-fsync", "50", "--delimiter", "\\t"])
    assert a.spool_fsync == 50 and a.delimiter == b"\t"
    a = p.parse_args(["tail", "-topic", "a", "--topic", "b", "-lookupd-http-address", "l:1",
                      "-n", "5", "-print-topic"])
    assert a.topics == ["a", "b"] and a.count == 5 and a.print_topic


@pytest.mark.parametrize("argv", [
    ["publish", "--nsqd-tcp-address", "h:1"],                       # no topic
    ["publish", "--topic", "t", "--nsqd-tcp-address", "h:1", "--spool-fsync", "soon"],
    ["publish", "--topic", "t", "--nsqd-tcp-address", "h:1", "--delimiter", "ab"],
    ["frobnicate"],
])
def test_bad_usage_exits_2(argv, capsys):
    assert cli.main(argv) == cli.EXIT_USAGE
    assert "error" in capsys.readouterr().err


def _batches(data: bytes, delim=b"\n", size=2, skip=False):
    return list(cli._batches([("in", io.BytesIO(data))], delim, size, skip))


def test_lines_become_batches_with_their_input_bytes():
    out = _batches(b"a\nbb\r\nccc\nd")
    assert out == [([b"a", b"bb"], 6), ([b"ccc", b"d"], 5)]
    assert _batches(b"x|y|z|", delim=b"|", size=10) == [([b"x", b"y", b"z"], 6)]
    assert _batches(b"") == []


def test_empty_lines_are_an_error_unless_skipped():
    with pytest.raises(ValueError, match=r"in:2: empty message.*--skip-empty"):
        _batches(b"a\n\nb\n")
    assert _batches(b"a\n\nb\n", skip=True) == [([b"a", b"b"], 5)]


def test_progress_draws_a_bar_when_the_size_is_known():
    err = io.StringIO()
    p = cli.Progress(err, total_bytes=1000, quiet=False)
    p.update(10, 500)
    p.done()
    text = err.getvalue()
    assert "50.0%" in text and "100.0%" not in text.splitlines()[0]
    assert "[" + "#" * 15 in text and "10 msgs" in text
    err = io.StringIO()
    p = cli.Progress(err, total_bytes=None, quiet=False)
    p.update(3, 30)
    p.done()
    assert "3 msgs" in err.getvalue() and "[" not in err.getvalue()
    err = io.StringIO()
    p = cli.Progress(err, total_bytes=10, quiet=True)
    p.update(1, 1)
    p.done()
    assert err.getvalue() == ""


def test_missing_input_file_fails_before_connecting(tmp_path, capsys):
    rc = cli.main(["publish", "--topic", "t", "--nsqd-tcp-address", "127.0.0.1:1",
                   str(tmp_path / "nope.txt")])
    assert rc == cli.EXIT_ERROR
    assert "cannot read input file" in capsys.readouterr().err


def test_bad_topic_and_flag_combinations_are_explained(capsys):
    assert cli.main(["publish", "--topic", "no spaces", "--nsqd-tcp-address", "h:1"],
                    stdin=io.BytesIO(b"x\n")) == cli.EXIT_ERROR
    assert "invalid topic name" in capsys.readouterr().err
    assert cli.main(["tail", "--topic", "t"]) == cli.EXIT_ERROR
    assert "--lookupd-http-address" in capsys.readouterr().err


def test_unwritable_spool_dir_is_a_clear_error(tmp_path, capsys):
    f = tmp_path / "file"
    f.write_text("x")
    rc = cli.main(["publish", "--topic", "t", "--nsqd-tcp-address", "127.0.0.1:1",
                   "--spool-dir", str(f / "spool")], stdin=io.BytesIO(b"x\n"))
    assert rc == cli.EXIT_ERROR
    assert "spool directory" in capsys.readouterr().err
