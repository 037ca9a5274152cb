"""The Spark source's Arrow conversion of fetched blocks (``blocks_to_batch``), per
message: what the ``trace_parent`` and ``publish_id`` columns cost when no body has an
envelope, and when all have one (traced: version 2; published: version 3, a publish id
and its CRC-32; published+traced: version 3 with a traceparent).

    python -m bench.bench_trace_column            # or through bench.ab, before vs after

A chunk of 1,250 messages of 100 bytes (what a fetch task converts at a time), the best
of 7 runs of 400 calls. ``traced`` bodies carry the version-2 envelope (on a tree
without it they are plain bodies of the same size, so the row is comparable)."""

from __future__ import annotations

import time


def best_ns_per_message(blocks, calls: int = 400, runs: int = 7) -> float:
    from nsq_spark.spark._schema import blocks_to_batch

    n = sum(map(len, blocks))
    for _ in range(50):
        blocks_to_batch(blocks, "t", "c")
    best = float("inf")
    for _ in range(runs):
        t0 = time.perf_counter()
        for _ in range(calls):
            blocks_to_batch(blocks, "t", "c")
        best = min(best, (time.perf_counter() - t0) / calls / n * 1e9)
    return best


def main(argv: list[str] | None = None) -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=400)
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args(argv)
    from nsq_spark.protocol import FrameDecoder, encode_message_frame
    from nsq_spark.spool import _format as envelope

    class Responder:
        address = "127.0.0.1:4150"

    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    plain = b"x" * 100
    traced = plain
    if hasattr(envelope, "TRACED_ENVELOPE_MAGIC"):
        traced = envelope.wrap_envelope(plain, parent)
    published = published_traced = plain
    try:  # the publish envelope (nsq_spark.envelope, issue 32)
        from nsq_spark import envelope as v3

        published = v3.stamp(plain, bytes(range(16)))
        published_traced = v3.stamp(plain, bytes(range(16)), parent)
    except (ImportError, AttributeError):
        pass
    for label, body in (("plain", plain), ("traced", traced), ("published", published),
                        ("published+traced", published_traced)):
        data = b"".join(encode_message_frame(b"%016d" % i, body, 1_700_000_000_000_000_000, 1)
                        for i in range(1250))
        blocks, _ = FrameDecoder(Responder()).feed_blocks(data)
        best = best_ns_per_message(blocks, args.calls, args.runs)
        print(f"blocks_to_batch {label:<16} {best:7.1f} ns/message",
              flush=True)


if __name__ == "__main__":
    main()
