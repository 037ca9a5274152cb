"""What parsing options costs: the Spark options (a sink task parses its write options
on its executor, every task), ``ConnectionConfig`` and the Reader's and the Producer's
options, in microseconds per call. No sockets, no Spark: the parsers alone.

    python -m bench.bench_options [--calls 2000] [--repeat 9]

Each figure is the best of ``--repeat`` runs of ``--calls`` calls (the least disturbed by
the other jobs of the machine). Side by side with another revision:

    python -m bench.ab --before <rev> --rounds 3 -- bench_options
"""

from __future__ import annotations

import argparse
import timeit
from typing import Any, Callable

#: A sink task's options as Spark hands them over (keys lower-cased, values text).
WRITE = {"topic": "events", "nsqdtcpaddresses": "127.0.0.1:4150,127.0.0.1:4250",
         "batchsize": "500", "publishtimeout": "30", "tlsv1": "false",
         "checkpointlocation": "/tmp/checkpoint", "nsq.output_buffer_timeout": "5"}
#: A streaming source's options.
READ = {"topic": "events", "channel": "archive", "nsqdtcpaddresses": "127.0.0.1:4150",
        "nsqdhttpaddresses": "127.0.0.1:4151", "spoolpath": "/tmp/spool",
        "maxinflight": "5000", "numpartitions": "4", "minmessagespertrigger": "10",
        "maxtriggerdelay": "5s"}


def cases() -> dict[str, Callable[[], Any]]:
    from nsq_spark.config import ConnectionConfig
    from nsq_spark.spark.options import parse_read_options, parse_write_options

    out: dict[str, Callable[[], Any]] = {
        "parse_write_options": lambda: parse_write_options(WRITE),
        "parse_read_options": lambda: parse_read_options(READ, streaming=True),
        "ConnectionConfig()": ConnectionConfig,
        "ConnectionConfig.from_options(5 options)": lambda: ConnectionConfig.from_options(
            timeout=2.0, heartbeat_interval=10, msg_timeout=30, snappy=True,
            user_agent="bench/1"),
    }
    try:  # the rows' dataclasses (absent before them)
        from nsq_spark.config import ProducerOptions, ReaderOptions

        out["ReaderOptions(3 options)"] = lambda: ReaderOptions(
            max_in_flight=100, max_tries=3, lookupd_poll_interval=15)
        out["ProducerOptions(3 options)"] = lambda: ProducerOptions(
            max_tries=3, retry_deadline=5.0, replicas=2)
    except ImportError:
        pass
    return out


def measure(calls: int, repeat: int) -> dict[str, float]:
    """name -> microseconds per call (best of ``repeat``)."""
    return {name: min(timeit.repeat(f, number=calls, repeat=repeat)) / calls * 1e6
            for name, f in cases().items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=9)
    args = parser.parse_args(argv)
    for name, us in measure(args.calls, args.repeat).items():
        print(f"{name:45s} {us:8.1f} us")


if __name__ == "__main__":
    main()
