"""Unit tests of the command-line tools: parsing, input splitting, progress, errors that
come before any connection. (Publishing and tailing against real nsqd are in
test_cli_nsqd.py.)"""

from __future__ import annotations

import io

import pytest

from nsq_spark import cli
from nsq_spark.cli import _common, publish

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


def test_publish_sends_to_every_address_as_to_nsq_unless_replicas_say_fewer():
    def replication(*extra: str, addrs: tuple[str, ...] = ("h:1", "h:2", "h:1")):
        argv = ["publish", "--topic", "t", *extra]
        for a in addrs:
            argv += ["--nsqd-tcp-address", a]
        return publish._replication(cli.build_parser().parse_args(argv))

    # a repeated address counts once, as to_nsq's map of producers does
    assert replication() == {"replicas": 2, "write_quorum": None, "publish_ids": False}
    assert replication("--write-quorum", "1", "--publish-ids") == \
        {"replicas": 2, "write_quorum": 1, "publish_ids": True}
    assert replication("--replicas", "1") == {}            # one nsqd a line, as before
    assert replication("--replicas", "1", "--publish-ids") == {"publish_ids": True}
    assert replication(addrs=("h:1",)) == {}
    with pytest.raises(ValueError, match="--replicas 3: only 2 distinct"):
        replication("--replicas", "3")
    with pytest.raises(ValueError, match="--write-quorum 2 needs --replicas"):
        replication("--replicas", "1", "--write-quorum", "2")


@pytest.mark.parametrize("argv", [
    ["publish", "--nsqd-tcp-address", "h:1"],                       # no topic
    ["publish", "--topic", "t", "--nsqd-tcp-address", "h:1", "--spool-fsync", "soon"],
    ["publish", "--topic", "t", "--nsqd-tcp-address", "h:1", "--delimiter", "ab"],
    ["publish", "--topic", "t", "--nsqd-tcp-address", "h:1", "--replicas", "0"],
    ["frobnicate"],
])
def test_bad_usage_exits_2(argv, capsys):
    assert cli.main(argv) == cli.EXIT_USAGE
    assert "error" in capsys.readouterr().err


def _batches(data: bytes, delim=b"\n", size=2, skip=False):
    return list(publish._batches([("in", io.BytesIO(data))], delim, size, skip))


def test_lines_become_batches_with_their_input_bytes():
    # as to_nsq: the body is what lies between two delimiters, a \r included
    out = _batches(b"a\nbb\r\nccc\nd")
    assert out == [([b"a", b"bb\r"], 6), ([b"ccc", b"d"], 5)]
    assert _batches(b"x|y|z|", delim=b"|", size=10) == [([b"x", b"y", b"z"], 6)]
    assert _batches(b"") == []


@pytest.mark.parametrize("skip", [False, True])  # --skip-empty: the default now
def test_empty_lines_are_skipped_as_to_nsq_does_and_counted_once(skip, caplog):
    with caplog.at_level("WARNING", logger="nsq_spark.cli"):
        assert _batches(b"a\n\nb\n\n\n", skip=skip) == [([b"a", b"b"], 5), ([], 2)]
    (warning,) = [r.getMessage() for r in caplog.records]
    assert "skipped 3 empty messages (first at in:2)" in warning


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


def test_version_is_printed_and_exits_0(capsys):
    from nsq_spark import __version__

    assert cli.main(["--version"]) == cli.EXIT_OK
    assert capsys.readouterr().out.strip() == f"nsq-spark {__version__}"


def _conn_opts(argv: list[str]) -> dict:
    args = cli.build_parser().parse_args(
        ["publish", "--topic", "t", "--nsqd-tcp-address", "h:1", *argv])
    return _common.connection_options(args)


def test_tls_flags_become_connection_options(tmp_path):
    assert _conn_opts([]) == {}
    assert _conn_opts(["--tls"]) == {"tls_v1": True}
    assert _conn_opts(["--tls-ca-file", "ca.pem", "--tls-cert-file", "c.pem",
                       "--tls-key-file", "k.pem", "--tls-no-verify"]) == {
        "tls_v1": True, "tls_ca_file": "ca.pem", "tls_cert_file": "c.pem",
        "tls_key_file": "k.pem", "tls_verify": False}


def test_the_auth_secret_comes_from_a_file_or_the_environment_never_argv(
        tmp_path, monkeypatch, capsys):
    monkeypatch.delenv(cli.AUTH_SECRET_ENV, raising=False)
    secret_file = tmp_path / "secret"
    secret_file.write_text("s3cret-from-file\nignored second line\n")
    assert _conn_opts(["--auth-secret-file", str(secret_file)]) == {
        "auth_secret": "s3cret-from-file"}
    monkeypatch.setenv(cli.AUTH_SECRET_ENV, "s3cret-from-env")
    assert _conn_opts([]) == {"auth_secret": "s3cret-from-env"}
    # the file wins over the environment
    assert _conn_opts(["--auth-secret-file", str(secret_file)])["auth_secret"] == \
        "s3cret-from-file"
    # there is no flag that takes the secret itself
    assert cli.main(["publish", "--topic", "t", "--nsqd-tcp-address", "h:1",
                     "--auth-secret", "visible-in-ps"]) == cli.EXIT_USAGE
    capsys.readouterr()
    secret_file.write_text("\n")
    with pytest.raises(ValueError, match="first line is empty"):
        _conn_opts(["--auth-secret-file", str(secret_file)])
    rc = cli.main(["publish", "--topic", "t", "--nsqd-tcp-address", "h:1",
                   "--auth-secret-file", str(tmp_path / "missing")], stdin=io.BytesIO(b"x\n"))
    assert rc == cli.EXIT_ERROR
    assert "--auth-secret-file" in capsys.readouterr().err


def test_spool_summary_never_claims_more_than_nsqd_acknowledged():
    args = cli.build_parser().parse_args(
        ["publish", "--topic", "t", "--nsqd-tcp-address", "h:1", "--spool-dir", "/sp",
         "--flush-timeout", "0.5"])
    text = publish._spool_summary(args, 100, {"acked": 0, "pending_bytes": 1234,
                                          "last_error": "connection refused"}, False)
    assert text.startswith("spooled 100 messages for t in /sp; nsqd acknowledged 0;")
    assert "1,234 bytes were NOT acknowledged within --flush-timeout=0.5s" in text
    assert "connection refused" in text and "published" not in text
    text = publish._spool_summary(args, 1, {"acked": 101, "orphans_claimed": 1}, True)
    assert "acknowledged 101 (leftovers of earlier runs included)" in text
    assert text.endswith("nothing left in the spool\n")
    args.quiet = True
    assert publish._spool_summary(args, 1, {"acked": 1}, True) == ""
    assert "NOT acknowledged" in publish._spool_summary(args, 1, {"acked": 0}, False)


def test_a_missing_nsq_binary_names_the_command_that_provides_it(monkeypatch, tmp_path):
    from nsq_spark.testing import HarnessError, find_binary

    monkeypatch.setenv("NSQ_BIN_DIR", str(tmp_path))
    with pytest.raises(HarnessError) as err:
        find_binary("nsqd-that-does-not-exist")
    text = str(err.value)
    assert "nsq-spark install-nsq" in text and "NSQ_BIN_DIR" in text and str(tmp_path) in text
    assert "scripts/" not in text


# -- no abbreviation, no secret echoed ------------------------------------------------------

SECRET = "hunter2-not-a-file"


@pytest.mark.parametrize("command", ["publish", "tail"])
@pytest.mark.parametrize("spelling", [["-auth", SECRET], ["-auth-secret", SECRET],
                                      ["--auth-secret", SECRET], [f"--auth-secret={SECRET}"],
                                      ["--auth", SECRET], [f"-auth={SECRET}"]])
def test_secret_options_are_not_abbreviations_and_their_value_is_never_echoed(
        command, spelling, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a file named like the secret would be opened: none here
    argv = [command, "--topic", "t", "--nsqd-tcp-address", "127.0.0.1:1", *spelling]
    assert cli.main(argv) == cli.EXIT_USAGE
    out = capsys.readouterr()
    assert SECRET not in out.err and SECRET not in out.out
    assert "unrecognized arguments: " + spelling[0].split("=")[0] in out.err


def test_a_secret_given_before_the_command_is_not_echoed_either(capsys):
    assert cli.main(["--auth-secret", SECRET, "publish"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert SECRET not in err and "invalid choice: '***'" in err


@pytest.mark.parametrize("argv", [
    ["publish", "--top", "t", "--nsqd-tcp-address", "h:1"],
    ["publish", "-top", "t", "--nsqd-tcp-address", "h:1"],
    ["tail", "--topic", "t", "-nsqd", "h:1"],
    ["tail", "--topic", "t", "--nsqd-tcp-address", "h:1", "--max-in", "5"],
    ["--vers"],
])
def test_no_option_is_taken_by_a_prefix(argv, capsys):
    assert cli.main(argv) == cli.EXIT_USAGE
    assert "error" in capsys.readouterr().err


def test_every_parser_and_subparser_refuses_abbreviations():
    import argparse

    from nsq_spark._strict_argparse import StrictParser

    def with_subparsers(parser):
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        return [parser, *[q for a in subs for p in a.choices.values()
                          for q in with_subparsers(p)]]

    parser = cli.build_parser()
    parsers = with_subparsers(parser)
    assert len(parsers) >= 4
    assert "nsq-spark spool redrive" in {p.prog for p in parsers}   # nested ones too
    assert all(not p.allow_abbrev for p in parsers)
    assert all(isinstance(p, StrictParser) for p in parsers)
    with pytest.raises(SystemExit):
        parsers[1].parse_args(["--top", "t"])


def test_install_nsq_takes_no_abbreviation(capsys):
    from nsq_spark import install

    assert install.main(["--bin", "/nonexistent"]) == 2
    assert "unrecognized arguments: --bin" in capsys.readouterr().err


def test_redaction_keeps_what_is_not_secret():
    from nsq_spark._strict_argparse import redact, secret_values

    argv = ["--auth-secret-file", "/etc/s", "--token=abc", "--password", "pw", "--topic", "t"]
    assert secret_values(argv) == ["abc", "pw"]
    assert redact("got abc and pw for topic t, file /etc/s", argv) == \
        "got *** and *** for topic t, file /etc/s"


@pytest.mark.parametrize("name", ["--auth", "-auth-secret", "--api-key", "--apikey",
                                  "--private-key", "--session-token", "--credentials",
                                  "-password", "--secret"])
def test_the_command_line_hides_what_the_options_rule_calls_secret(name):
    from nsq_spark import _validate as validate
    from nsq_spark._strict_argparse import secret_values

    assert validate.is_secret_name(name)
    assert secret_values([name, "v1", f"{name}=v2"]) == ["v1", "v2"]
    # a ...-file option names where the secret is, not the secret: its path is shown
    assert secret_values([f"{name}-file", "/p", f"{name}_file=/q"]) == []
    assert validate.redact_options({name.lstrip("-"): "v"}) == {name.lstrip("-"): "***"}


def test_names_without_a_secret_are_shown_on_the_command_line_and_in_options():
    from nsq_spark import _validate as validate
    from nsq_spark._strict_argparse import secret_values

    for name in ["--topic", "--channel", "--nsqd-tcp-address", "--max-in-flight"]:
        assert not validate.is_secret_name(name)
        assert secret_values([name, "v"]) == []
