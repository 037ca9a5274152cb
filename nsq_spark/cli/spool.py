"""``nsq-spark spool redrive DIR``: moves the messages nsqd refused for good
(``DIR/rejected``) back into the spool's queue, once the cause is fixed; the next producer
on ``DIR`` (a running one within a second) sends them. A rejected file with a damaged
record has every intact record moved (those after the damage too), the file as it was kept
in ``DIR/corrupt/``, and the exit status 1.
"""

from __future__ import annotations

import argparse
import os
from typing import IO, Any

from . import _common


def add_parser(sub: Any) -> argparse.ArgumentParser:
    s: argparse.ArgumentParser = sub.add_parser(
        "spool", help="manage a publish spool directory",
        description="Manage a publish spool directory (--spool-dir, "
        "Producer(spool_dir=...)).")
    ss = s.add_subparsers(dest="spool_command", required=True, metavar="{redrive}")
    r = ss.add_parser("redrive",
                      help="send the messages nsqd refused (DIR/rejected) again",
                      description="Move the messages nsqd refused for good (DIR/rejected) "
                      "back into the spool's queue; the next producer on DIR sends them "
                      "(a running one within its rescan interval). Fix the cause first "
                      "(topic name, nsqd's --max-msg-size, ...), or they are refused again.")
    r.add_argument("directory", metavar="DIR", help="the spool directory")
    _common.add_log_level(r)
    return s


def run(args: argparse.Namespace, stderr: IO[str]) -> int:
    """``nsq-spark spool redrive DIR``."""
    directory = args.directory
    from nsq_spark.spool._store import redrive

    if not os.path.isdir(directory):
        raise ValueError(f"{directory} is not a directory: give the spool directory "
                         "(the --spool-dir / spool_dir of the producer)")
    done = redrive(directory)
    text = (f"moved {done.messages:,} message{'s' if done.messages != 1 else ''} in "
            f"{done.files} file{'s' if done.files != 1 else ''} from {directory}/rejected "
            "back into the spool; the next producer on it sends them")
    if done.busy:
        text += (f"; {done.busy} file{' is' if done.busy == 1 else 's are'} still being "
                 "written by a running producer (its Producer.redrive() moves it, or run "
                 "this again after it stops)")
    if done.kept_back_bytes:
        # every intact record was moved (those after a damaged one too); the damaged
        # bytes cannot be sent: said, and the exit status says it too
        text += (f"; kept back {done.kept_back_bytes:,} damaged bytes, which cannot be "
                 f"sent ({'; '.join(done.damaged)}); the files as they were are in "
                 f"{directory}/corrupt/ for inspection")
    stderr.write(text + "\n")
    return _common.EXIT_ERROR if done.kept_back_bytes else _common.EXIT_OK
