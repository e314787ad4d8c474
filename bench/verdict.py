"""Saturation verdict benchmark: how soon a live reader sees it, and how often it cries wolf.

Usage:
    python -m bench.verdict [--repeat 5] [--capacity 250] [--pace 100:5,200:5,300:5,400:5]

Each repetition is the capacity test's run with real parts (``bench.capacity_run``): the load generator
paces through the steps into a CloudEvents relay that forwards at most ``--capacity`` events/s to the HTTP
receiver agent, with the streaming job live on a fresh Tansu broker. Per repetition: the step where saturation
was flagged, the wall-clock time from the end of the first saturated window to a live reader seeing the
verdict (the goal is at most 3 s), and false alarms: steps below capacity judged saturated (the goal is 0).
Medians at the end.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from core.output import State

NS = 10**9


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.verdict", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--repeat", type=int, default=5, help="runs (default %(default)s)")
    ap.add_argument("--capacity", type=float, default=250, help="the relay's events/s (default %(default)s)")
    ap.add_argument("--pace", default="100:5,200:5,300:5,400:5", help="rate:seconds steps (default %(default)s)")
    try:
        a = ap.parse_args(argv)
    except SystemExit as e:
        return 2 if e.code else 0
    if a.repeat < 1 or a.capacity <= 0:
        print("bench.verdict: error: --repeat and --capacity must be positive", file=sys.stderr)
        return 2
    from bench.capacity_run import capacity_run
    from core.procs import free_port, stop_process
    from stack.tansu import start_tansu

    rates = [float(s.split(":")[0]) for s in a.pace.split(",")]
    below = [i + 1 for i, r in enumerate(rates) if r < a.capacity]
    with tempfile.TemporaryDirectory(prefix="bench-verdict-") as tmp:
        port = free_port()
        broker_proc = start_tansu(port, open(os.path.join(tmp, "tansu.log"), "wb"), "bench-verdict")
        broker = f"127.0.0.1:{port}"
        lags, alarms = [], 0
        print(f"{'run':>4} {'flagged at':>12} {'lag s':>6} {'false alarms':>13}  states", flush=True)
        try:
            for k in range(a.repeat):
                run_dir = Path(tmp) / f"r{k}"
                run_dir.mkdir()
                t0 = time.monotonic()
                s = capacity_run(broker, run_dir, f"verdict{k}", a.pace, ["--capacity", str(a.capacity)])
                v = s["verdict"]
                states = [r["state"] for r in v["steps"]]
                false = [r["step"] for r in v["steps"] if r["step"] in below and r["state"] == State.SATURATED]
                at = v.get("saturated_at") or {}
                if at.get("step") in below:
                    false.append(f"flagged at step {at['step']}")
                live = s["seen_live"].get("saturated")
                lag = (live["seen_ns"] - (live["saturated_at"]["window_ns"] + NS)) / NS if live else None
                if lag is not None:
                    lags.append(lag)
                alarms += len(false)
                print(f"{k + 1:>4} {('step ' + str(at.get('step'))) if at else '-':>12} "
                      f"{(f'{lag:.2f}' if lag is not None else '-'):>6} {len(false):>13}  {states} "
                      f"({time.monotonic() - t0:.0f} s)", flush=True)
        finally:
            stop_process(broker_proc)
    print(f"\nverdict lag, median of {len(lags)}: {statistics.median(lags):.2f} s (goal <= 3 s, max {max(lags):.2f})"
          if lags else "\nverdict lag: never flagged")
    print(f"false alarms on steps below capacity ({', '.join(map(str, below))}): {alarms} in {a.repeat} runs (goal 0)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
