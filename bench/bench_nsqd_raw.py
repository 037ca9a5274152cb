"""How fast can nsqd itself deliver a backlog? The bound under the Spark benchmark.

N messages of 100 bytes are queued in one channel of one nsqd (v1.3.0, loopback); then P
bare consumer processes -- a plain socket each: IDENTIFY (64 KiB output buffer), SUB,
RDY, and one FIN per message, written once per read; no Reader, no decoding beyond the
frame sizes -- drain it. The clock runs from the consumers' start to the last message
received; nsqd's CPU seconds come from /proc. Whatever a client does on top, it cannot
drain the channel faster than this.

Run from the repo root (one benchmark at a time on the machine)::

    flock /tmp/nsq-spark-bench.lock python -m bench.bench_nsqd_raw [--n 1000000]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import socket
import struct
import sys
import time

_SIZE_TYPE = struct.Struct(">ii")
_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        raw = f.read()
    fields = raw[raw.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def _consume(address: str, topic: str, rdy: int, out: "mp.Queue[tuple[int, float]]") -> None:
    host, port = address.rsplit(":", 1)
    s = socket.create_connection((host, int(port)))
    body = json.dumps({"output_buffer_size": 65536}).encode()
    s.sendall(b"  V2IDENTIFY\n" + struct.pack(">I", len(body)) + body
              + b"SUB %s c\nRDY %d\n" % (topic.encode(), rdy))
    s.settimeout(1.0)  # the backlog is drained when nothing came for 1 s
    buf, got, t0 = b"", 0, time.perf_counter()
    last = t0
    while True:
        try:
            data = s.recv(1 << 20)
        except socket.timeout:
            break
        if not data:
            break
        last = time.perf_counter()
        buf = buf + data if buf else data
        pos, n, fins = 0, len(buf), []
        while n - pos >= 8:
            size, ftype = _SIZE_TYPE.unpack_from(buf, pos)
            end = pos + 4 + size
            if end > n:
                break
            if ftype == 2:
                fins.append(b"FIN " + buf[pos + 18:pos + 34] + b"\n")
                got += 1
            elif buf[pos + 8:end] == b"_heartbeat_":
                fins.append(b"NOP\n")
            pos = end
        buf = buf[pos:]
        if fins:
            s.sendall(b"".join(fins))
    s.close()
    out.put((got, last - t0))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--rdy", type=int, default=2500)
    args = ap.parse_args()

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from bench.bench_spark import _publish
    from nsq_spark.testing import NSQCluster

    print(f"{args.n:,} messages of 100 bytes, RDY {args.rdy} per consumer")
    print("| nsqd --mem-queue-size | consumers | seconds | msg/s | nsqd CPU us/msg |")
    print("|---|---|---|---|---|")
    for mem_queue in (10000, 2 * args.n):
        for procs in (1, 2):
            flags = {"mem_queue_size": mem_queue, "max_rdy_count": max(2500, args.rdy)}
            with NSQCluster(nsqd=1, lookupd=0, **flags) as cluster:
                topic = "raw"
                _publish(cluster.nsqd_http_addresses[0], topic, args.n, 100, "c")
                pid = cluster.nsqds[0].pid
                cpu0 = _cpu_s(pid)
                out: mp.Queue[tuple[int, float]] = mp.Queue()
                ps = [mp.Process(target=_consume, args=(cluster.nsqd_tcp_addresses[0], topic,
                                                        args.rdy, out)) for _ in range(procs)]
                for p in ps:
                    p.start()
                res = [out.get(timeout=600) for _ in ps]
                for p in ps:
                    p.join()
                got = sum(r[0] for r in res)
                secs = max(r[1] for r in res)
                cpu = _cpu_s(pid) - cpu0
                if got != args.n:
                    raise SystemExit(f"consumers got {got} of {args.n} messages")
                print(f"| {mem_queue:,} | {procs} | {secs:.2f} | {got / secs:,.0f} | "
                      f"{1e6 * cpu / got:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
