"""What saying where each event arrived costs: the receive line's ``dest``, ``route`` and ``key`` and the send line's
``route`` (``core.contract``), per transport, against the same lines without them.

Usage:
    python -m bench.where [--lines 200000] [--repeats 5]

For each place an event arrives at (the HTTP path, a Kafka topic's partition, an AMQP 0-9-1 queue, a queue of a
binding with its key, an AMQP 1.0 pair's address), one core, medians of ``--repeats``:

  bytes       a receive line without and with where it arrived, raw and in lz4 (the telemetry's compression,
              ``core.kafka_options.TELEMETRY_COMPRESSION``) per message of 200 lines, as the shipper sends them
  format      µs a line in the receiver (``FastLines.recv``, the place's end made once, as the receivers keep it)
  decode      µs a record in the job's decoder (``streaming.decode.decode_messages``), messages of 200 lines

and the send line with and without its route (pairs, bindings, a Kafka partition).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from core import contract  # noqa: E402

T0 = 1_800_000_000 * 10**9
PER_MESSAGE = 200
PLACES = [  # (its row's label, (dest, route, key) as a receiver writes them): sample places, no transport's setting
    ("HTTP path", ("/", None, None)),
    ("Kafka partition", ("flightwatch.sut", 1, None)),
    ("AMQP 0-9-1 queue", ("flightwatch.sut", None, None)),
    ("AMQP 0-9-1 binding", ("flightwatch.topic.q42", 42, "fw.42")),
    ("AMQP 1.0 pair", ("/queue/flightwatch.sut.42", 42, None)),
]


def receive_lines(n: int, where: str) -> list[str]:
    fast = contract.FastLines("", "receiver-kafka")
    return [fast.recv("run-20261129", T0 + i * 200_000, f"loadgen-0-{i}", 2048, where) for i in range(n)]


def per_line_us(fn, n: int, repeats: int) -> float:
    fn()  # warm: the first call pays for imports and caches
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) / n * 1e6)
    return statistics.median(times)


def messages(lines: list[str]) -> list[bytes]:
    return [contract.encode(lines[k:k + PER_MESSAGE]) for k in range(0, len(lines), PER_MESSAGE)]


def lz4_bytes(msgs: list[bytes]) -> float:
    import lz4.frame

    return sum(len(lz4.frame.compress(m)) for m in msgs[:200]) / (min(len(msgs), 200) * PER_MESSAGE)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lines", type=int, default=200_000, help="lines a case (default %(default)s)")
    ap.add_argument("--repeats", type=int, default=5, help="repetitions, medians reported (default %(default)s)")
    a = ap.parse_args(argv)
    if a.lines < PER_MESSAGE or a.repeats < 1:
        ap.error("--lines at least 200 and --repeats at least 1")
    from streaming.decode import decode_messages

    fast = contract.FastLines("", "receiver-kafka")
    n = a.lines
    print(f"receive lines: {n:,} a case, one core, medians of {a.repeats}")
    print(f"{'where it arrived':22} {'bytes raw':>14} {'bytes lz4':>12} {'format µs':>14} {'decode µs':>14}")
    base = None
    for name, place in [("(none: before)", None), *PLACES]:
        where = "}" if place is None else fast.where(*place)
        lines = receive_lines(n, where)
        msgs = messages(lines)
        raw = sum(map(len, lines)) / n
        packed = lz4_bytes(msgs)
        fmt = per_line_us(lambda w=where: [fast.recv("run-20261129", T0 + i, "loadgen-0-1", 2048, w) for i in range(n)],
                          n, a.repeats)
        dec = per_line_us(lambda m=msgs: decode_messages(m, [0] * len(m), list(range(len(m)))), n,
                          max(a.repeats // 2, 1))
        if base is None:
            base = (raw, packed, fmt, dec)
            print(f"{name:22} {raw:14.1f} {packed:12.2f} {fmt:14.3f} {dec:14.3f}")
        else:
            print(f"{name:22} {raw:7.1f} ({raw - base[0]:+5.1f}) {packed:5.2f} ({packed - base[1]:+5.2f}) "
                  f"{fmt:6.3f} ({fmt - base[2]:+6.3f}) {dec:6.3f} ({dec - base[3]:+6.3f})")
    sends = [fast_send(route) for route in (None, 42)]
    print(f"send line: {len(sends[0])} bytes, with its route {len(sends[1])} ({len(sends[1]) - len(sends[0]):+d})")
    return 0


def fast_send(route: int | None) -> str:
    return contract.FastLines("run-20261129", "loadgen-0").send(T0, "loadgen-0-12345", T0 - 1000, 2048, 0, route)


if __name__ == "__main__":
    sys.exit(main())
