"""What the commands share: exit statuses, flags made from option rows, the Go tools'
single-dash spellings, durations, and the TLS/AUTH flags of ``publish`` and ``tail``.

Standard library and the option rows only (``nsq_spark.config``, ``nsq_spark._options``):
the parser works before the dependencies are installed (``install-nsq``).
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from nsq_spark._options import Option
from nsq_spark.errors import ConfigError
from nsq_spark._validate import MAX_SECONDS, Limit

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_SPOOLED, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
AUTH_SECRET_ENV = "NSQ_AUTH_SECRET"
LOG_LEVELS = ["debug", "info", "warning", "error"]


def add(p: argparse.ArgumentParser | argparse._ArgumentGroup, *names: str, **kw: Any) -> None:
    """An option with its Go-style single-dash alias (``--topic`` and ``-topic``)."""
    aliases = [n for n in names]
    for n in names:
        if n.startswith("--") and len(n) > 3:
            aliases.append(n[1:])
    p.add_argument(*aliases, **kw)


def flag_type(row: Option, flag: str) -> Any:
    """An argparse ``type`` that reads ``flag``'s text as ``row`` takes it (its kind's
    conversion, or its own ``parse``) and checks it by the row (the one number rule:
    finite, in range), the flag named in the error."""
    kind = {"int": int, "number": float, "seconds": float}.get(row.kind)

    def parse(text: str) -> Any:
        try:
            if row.parse is not None:
                return row.parse(text, flag)
            if kind is None:
                return row.check_value(text, flag)
            try:
                value = kind(text)
            except ValueError:
                raise argparse.ArgumentTypeError(
                    f"{flag} {text!r}: give {'an integer' if kind is int else 'a number'}"
                ) from None
            return row.check_value(value, flag)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    parse.__name__ = kind.__name__ if kind is not None else "value"  # argparse's wording
    return parse


def add_option(p: argparse.ArgumentParser | argparse._ArgumentGroup, row: Option,
               *names: str, go_aliases: bool = True, **kw: Any) -> None:
    """A flag read and checked by ``row`` (:func:`flag_type`); its default and help the
    row's unless ``kw`` gives its own (a library option the command words otherwise);
    ``names`` (default: ``--<row name>``) with their Go-style aliases."""
    names = names or ("--" + row.name.replace("_", "-"),)
    kw.setdefault("help", row.doc)
    kw.setdefault("default", row.default)
    kw["type"] = flag_type(row, names[0])
    if go_aliases:
        add(p, *names, **kw)
    else:
        p.add_argument(*names, **kw)


# -- durations -------------------------------------------------------------------------------

#: The admin commands' durations: Go's (``2s``, ``500ms``, ``1m``) or seconds, at least
#: 10 ms (nsq_stat's and nsqadmin's flags).
DURATION = Option("duration", "seconds", limit=Limit("seconds", 0.01, MAX_SECONDS))


def seconds(text: str, flag: str) -> float:
    """``text`` as a duration (``2s``, ``500ms``, ``1m``, or seconds) by
    :data:`DURATION`'s rule, ``flag`` named in the error."""
    try:
        return float(DURATION.parse_text(text, flag, ConfigError))
    except ConfigError as exc:
        if "must be a number" in str(exc):
            raise argparse.ArgumentTypeError(
                f"{flag} {text!r}: give a duration such as 2s, 500ms or 1m") from None
        raise argparse.ArgumentTypeError(str(exc)) from None


def duration(flag: str) -> Any:
    """An argparse ``type`` for a duration, named ``flag`` in its errors."""
    def parse(text: str) -> float:
        return seconds(text, flag)
    parse.__name__ = "duration"
    return parse


class DurationAction(argparse.Action):
    """Stores a duration as :func:`duration` does, but parsed here, where the option
    string typed is known: an error names ``--status-every`` when that was typed, not
    the option's first name ``--interval``."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        try:
            value = seconds(str(values), option_string or self.option_strings[0])
        except argparse.ArgumentTypeError as exc:
            raise argparse.ArgumentError(self, str(exc)) from None
        setattr(namespace, self.dest, value)


def add_log_level(p: argparse.ArgumentParser) -> None:
    add(p, "--log-level", default="warning", choices=LOG_LEVELS, help="log level (stderr)")


# -- TLS and AUTH (publish, tail) --------------------------------------------------------------


def add_connection_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("TLS and AUTH (for a secured nsqd)")
    add(g, "--tls", action="store_true", help="upgrade connections to TLS (nsqd --tls-*)")
    add(g, "--tls-ca-file", metavar="PEM", help="CA certificates to verify nsqd with "
        "(default: the system's)")
    add(g, "--tls-cert-file", metavar="PEM", help="client certificate (nsqd "
        "--tls-client-auth-policy)")
    add(g, "--tls-key-file", metavar="PEM", help="key of --tls-cert-file")
    add(g, "--tls-no-verify", action="store_true",
        help="do not verify nsqd's certificate (tests only)")
    add(g, "--auth-secret-file", metavar="FILE",
        help=f"file holding the AUTH secret (first line); or set ${AUTH_SECRET_ENV}. "
        "Never given on the command line, where other users could read it")


def connection_options(args: argparse.Namespace) -> dict[str, Any]:
    """ConnectionConfig options from the TLS/AUTH flags (see add_connection_options)."""
    opts: dict[str, Any] = {}
    tls_files = {"tls_ca_file": args.tls_ca_file, "tls_cert_file": args.tls_cert_file,
                 "tls_key_file": args.tls_key_file}
    if args.tls or any(tls_files.values()) or args.tls_no_verify:
        opts["tls_v1"] = True
        opts.update({k: v for k, v in tls_files.items() if v})
        if args.tls_no_verify:
            opts["tls_verify"] = False
    secret: str | None = None
    if args.auth_secret_file:
        try:
            with open(args.auth_secret_file, encoding="utf-8") as f:
                secret = f.readline().rstrip("\r\n")
        except OSError as exc:
            raise OSError(exc.errno, f"--auth-secret-file {args.auth_secret_file}: "
                          f"cannot read it: {exc.strerror}") from exc
        if not secret:
            raise ValueError(f"--auth-secret-file {args.auth_secret_file}: the first line "
                             "is empty; put the secret there")
    elif os.environ.get(AUTH_SECRET_ENV):
        secret = os.environ[AUTH_SECRET_ENV]
    if secret:
        opts["auth_secret"] = secret
    return opts
