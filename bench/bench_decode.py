"""Decoding benchmark: frames per second of the sans-IO decoder, no sockets.

A buffer of message frames (100-byte bodies, as nsqd sends them) is cut into 1 MiB chunks
(what one read returns on a busy connection) and fed to:

* ``FrameDecoder.feed``: the consumer path, building a ``Message`` per frame;
* ``FrameDecoder.feed_blocks``: the columnar path (MessageBlocks, no object per frame),
  alone and with the blocks' FIN commands built (``fin_commands``);
* ``decode_frames``: the generic decoder, ``(frame_type, data)`` tuples;
* ``snappy + FrameDecoder`` / ``deflate + FrameDecoder``: the compressed stream wrappers
  (nsqd-style framed snappy, raw deflate with sync flushes), decompress a chunk, decode it;
* ``pynsq per frame``: pynsq 0.9.1's own functions as its connection uses them, one frame at
  a time (``unpack_response`` then ``decode_message``), for comparison.

Run from the repo root::

    flock /tmp/nsq-spark-bench.lock python -m bench.bench_decode
"""

from __future__ import annotations

import argparse
import os
import struct
import sys
import time
import zlib
from typing import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import cramjam  # noqa: E402

from nsq_spark._codecs import DeflateStream, SnappyStream  # noqa: E402
from nsq_spark.protocol import FrameDecoder, decode_frames, encode_message_frame  # noqa: E402

CHUNK = 1024 * 1024


def make_stream(n: int, body_size: int) -> bytes:
    ts = time.time_ns()
    return b"".join(encode_message_frame(b"%016x" % i, b"x" * body_size, ts + i, 1)
                    for i in range(n))


def chunks(data: bytes, size: int = CHUNK) -> list[bytes]:
    return [data[i:i + size] for i in range(0, len(data), size)]


def bench(fn: Callable[[], int], repeat: int) -> float:
    best = 0.0
    for _ in range(repeat):
        t0 = time.perf_counter()
        frames = fn()
        best = max(best, frames / (time.perf_counter() - t0))
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--frames", type=int, default=500_000)
    ap.add_argument("--body-size", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()

    stream = make_stream(args.frames, args.body_size)
    raw_chunks = chunks(stream)
    n = args.frames
    results: dict[str, float] = {}

    def ours() -> int:
        dec = FrameDecoder()
        got = 0
        for c in raw_chunks:
            msgs, _ = dec.feed(c)
            got += len(msgs)
        assert got == n
        return got

    results["FrameDecoder.feed (Message objects)"] = bench(ours, args.repeat)

    def blocks(fin: bool) -> int:
        dec = FrameDecoder()
        got = 0
        for c in raw_chunks:
            bl, _ = dec.feed_blocks(c)
            got += sum(map(len, bl))
            if fin:
                for b in bl:
                    b.fin_commands()
        assert got == n
        return got

    results["FrameDecoder.feed_blocks (MessageBlocks)"] = bench(lambda: blocks(False),
                                                                args.repeat)
    results["FrameDecoder.feed_blocks + fin_commands"] = bench(lambda: blocks(True),
                                                               args.repeat)

    def generic() -> int:
        tail = b""
        got = 0
        for c in raw_chunks:
            data = tail + c
            frames, used = decode_frames(data)
            tail = data[used:]
            got += len(frames)
        assert got == n
        return got

    results["decode_frames (tuples)"] = bench(generic, args.repeat)

    snappy_stream = b"".join(bytes(cramjam.snappy.compress(c)) for c in chunks(stream, 65536))
    snappy_chunks = chunks(snappy_stream)

    def snappy() -> int:
        codec, dec, got = SnappyStream(), FrameDecoder(), 0
        for c in snappy_chunks:
            msgs, _ = dec.feed(codec.decompress(c))
            got += len(msgs)
        assert got == n
        return got

    results["snappy + FrameDecoder"] = bench(snappy, args.repeat)

    comp = zlib.compressobj(6, zlib.DEFLATED, -15)
    deflate_stream = b"".join(comp.compress(c) + comp.flush(zlib.Z_SYNC_FLUSH)
                              for c in chunks(stream, 65536))
    deflate_chunks = chunks(deflate_stream)

    def deflate() -> int:
        codec, dec, got = DeflateStream(6), FrameDecoder(), 0
        for c in deflate_chunks:
            msgs, _ = dec.feed(codec.decompress(c))
            got += len(msgs)
        assert got == n
        return got

    results["deflate + FrameDecoder"] = bench(deflate, args.repeat)

    try:
        from nsq import protocol as pynsq_protocol
    except ImportError:  # pragma: no cover
        pynsq_protocol = None
    if pynsq_protocol is not None:
        size = struct.Struct(">l")

        def pynsq() -> int:
            # what pynsq's connection does per frame: read the size, read the body,
            # unpack the frame, decode the message
            pos, got, data = 0, 0, stream
            end = len(data)
            while pos < end:
                (sz,) = size.unpack(data[pos:pos + 4])
                body = data[pos + 4:pos + 4 + sz]
                frame, payload = pynsq_protocol.unpack_response(body)
                if frame == pynsq_protocol.FRAME_TYPE_MESSAGE:
                    pynsq_protocol.decode_message(payload)
                    got += 1
                pos += 4 + sz
            assert got == n
            return got

        results["pynsq 0.9.1 per frame (unpack_response + decode_message)"] = bench(pynsq, args.repeat)

    print(f"{args.frames} frames of {args.body_size}-byte messages, {CHUNK // 1024} KiB chunks, "
          f"best of {args.repeat}")
    for k, v in results.items():
        print(f"{k:60s} {v:12,.0f} frames/s")


if __name__ == "__main__":
    main()
