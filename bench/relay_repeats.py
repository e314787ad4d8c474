"""The regression verdict on real repeats of this machine: 30 s HTTP runs through a relay whose delay has a known
median, repeated; then runs with that median raised by 20%.

    python -m bench.relay_repeats [--repeats 20] [--changed 2] [--rate 500] [--seconds 30] [--delay 10ms]
    python -m bench.relay_repeats --judge checkpoints/relay-repeats-<time>.json   # judge those runs again

The stack must be up (`make up`): each run is `loadgen attack --stream` (the run's own streaming job), at ``--rate``
for ``--seconds`` through ``bench.capacity_relay --forward-delay`` in front of the stack's HTTP receiver, in the
series ``relay-repeat`` (warm-up 5 s, cool-down 1 s). The first ``--repeats`` runs have the delay's median at
``--delay`` and are labelled with it; the last ``--changed`` runs have it 20% higher. Then:

  false alarms   each unchanged run from the 4th on, against the 3 runs before it (`runs compare --baseline r1,r2,r3`):
                 any figure judged a regression or an improvement is a false alarm (with its 95% upper bound)
  detection      each changed run against the last 3 unchanged runs: flight p50 must be judged a regression, and
                 the change's interval is printed beside the relay's +20%
  history        `runs history relay-repeat` on all of them: the p50 change named at the first changed run; any
                 change point among the unchanged runs is printed: the machine moved under them (the relay's
                 delay did not), so it is reported, not judged

Figures are printed and written to checkpoints/relay-repeats-<UTC time>.json; exit 1 when the changed runs are not
all flagged, or the history does not name the first changed run. A run takes about a minute (the job's start and
the drop timeout), so the default is ~25 minutes: a benchmark, not a test (its short form is in the system tests).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from core.procs import free_port, stop_process
from core.rundir import CHECKPOINTS, ROOT, RunPaths, write_json
from stack.config import Stack

STACK = Stack.configured()
"""The stack this benchmark drives, as the settings name it."""

SERIES = "relay-repeat"
CHANGE = 0.20
BASELINES = 3


def run(run_id: str, port: int, delay_s: float, seed: int, rate: int, seconds: int, label: str, relay_log) -> dict:
    """One attack through a relay of that delay (its complaints appended to ``relay_log``); its summary."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    relay_log.write(f"{run_id}\n")
    relay_log.flush()
    relay = subprocess.Popen([sys.executable, "-m", "bench.capacity_relay", str(port),
                              f"http://127.0.0.1:{STACK.ports['http-receiver']}/", "--forward-delay", str(delay_s),
                              "--seed", str(seed)], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                             stderr=relay_log)
    try:
        out = subprocess.run([sys.executable, "-m", "loadgen", "attack", "--run", run_id, "--stream", "--quiet",
                              "--target", f"http://127.0.0.1:{port}/", "--rate", str(rate), "--duration", f"{seconds}s",
                              "--warmup", "5s", "--cooldown", "1s", "--drop-timeout", "5s", "--scenario", SERIES,
                              "--label", label], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    finally:
        stop_process(relay)
    path = RunPaths.of_run(run_id, CHECKPOINTS).summary_file
    if not os.path.exists(path):
        raise RuntimeError(f"run {run_id} left no summary: {out.stderr.strip()[-300:]}")
    with open(path) as f:
        return json.load(f)


def judge(ids: list[str], changed: list[str], log=print) -> dict:
    """The false alarms among the unchanged runs, the changed runs' verdicts and the series' history."""
    from bench.calibrate import flagged, upper_bound
    from runs import history
    from runs.compare import RunSample, compare

    samples = {i: RunSample.load(RunPaths.of_run(i, CHECKPOINTS).root) for i in ids + changed}
    alarms = []
    for k in range(BASELINES, len(ids)):
        found = flagged([samples[i] for i in ids[k - BASELINES:k]], samples[ids[k]], seed=k)
        alarms.append(found)
        log(f"  {ids[k]} against the {BASELINES} before it: {', '.join(found) or 'nothing'} flagged")
    detections = []
    for k, c in enumerate(changed):
        rep = compare([samples[i] for i in ids[-BASELINES:]], samples[c], seed=1000 + k)
        p50 = next(r for r in rep["whole_run"] if r["metric"] == "p50")
        detections.append({"run": c, "verdict": p50["verdict"], "change": p50["change"], "ci": [p50["ci_low"],
                                                                                              p50["ci_high"]]})
        log(f"  {c} (+{CHANGE:.0%} delay) against the last {BASELINES} unchanged: p50 {p50['verdict']}, "
            f"{p50['change']:+.1%} ({p50['ci_low']:+.1%} … {p50['ci_high']:+.1%})")
    h = history.history(SERIES)
    mine = set(ids + changed)
    cps = [c for c in h["change_points"] if c["first_run"] in mine]
    n = len(alarms)
    k = sum(bool(a) for a in alarms)
    return {"comparisons": n, "false_alarms": k, "false_alarm_rate": k / n if n else None,
            "upper": upper_bound(k, n) if n else None, "alarms": alarms, "detections": detections,
            "change_points": cps, "false_change_points": [c for c in cps if c["first_run"] in ids]}


def main(argv=None) -> int:
    from core.cli import OneLineParser
    from core.units import parse_duration_ns

    ap = OneLineParser(prog="python -m bench.relay_repeats", description=__doc__.split("\n\n")[0],
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--repeats", type=int, default=20, help="unchanged runs (default %(default)s, at least 4)")
    ap.add_argument("--changed", type=int, default=2, help="runs with the delay 20%% higher (default %(default)s)")
    ap.add_argument("--rate", type=int, default=500,
                    help="events/s (default %(default)s: at 1,000/s the relay, one Python process beside the job on "
                         "two cores, held events for seconds in 5 of 12 runs, a real change of the system under test)")
    ap.add_argument("--seconds", type=int, default=30, help="each run's length (default %(default)s)")
    ap.add_argument("--delay", default="10ms", help="the relay's median delay (default %(default)s)")
    ap.add_argument("--judge", metavar="FILE", help="run nothing: judge again the runs of an earlier figures file")
    try:
        a = ap.parse_args(argv)
        delay_s = parse_duration_ns(a.delay) / 1e9
    except SystemExit as e:
        return 2 if e.code else 0
    except ValueError as e:
        print(f"bench.relay_repeats: error: {e}", file=sys.stderr)
        return 2
    if a.repeats < BASELINES + 1 or a.changed < 1 or a.rate < 1 or a.seconds < 10 or delay_s <= 0:
        print("bench.relay_repeats: error: --repeats >= 4, --changed >= 1, --rate >= 1, --seconds >= 10 and "
              "--delay > 0", file=sys.stderr)
        return 2
    if a.judge:
        try:
            with open(a.judge) as f:
                old = json.load(f)
        except (OSError, ValueError) as e:
            print(f"bench.relay_repeats: error: cannot read {a.judge}: {e}", file=sys.stderr)
            return 2
        return conclude(dict(judge(old["runs"], old["changed"]), **{k: old[k] for k in (
            "rate", "seconds", "delay_ms", "runs", "changed")}), a.judge)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    port = free_port()
    ids, changed = [], []
    t0 = time.monotonic()
    with open(os.path.join(CHECKPOINTS, f"relay-repeats-{stamp}-relay.log"), "a") as relay_log:
        for i in range(a.repeats + a.changed):
            is_changed = i >= a.repeats
            d = delay_s * (1 + CHANGE) if is_changed else delay_s
            run_id = f"relay-{stamp}-{i:02d}"
            s = run(run_id, port, d, seed=i, rate=a.rate, seconds=a.seconds, label=f"delay {d * 1e3:g} ms",
                    relay_log=relay_log)
            (changed if is_changed else ids).append(run_id)
            lat = (s.get("measured") or {}).get("latency_us") or s.get("latency_us") or {}
            print(f"[{(time.monotonic() - t0) / 60:5.1f} min] {run_id}: delay median {d * 1e3:g} ms, "
                  f"received {s.get('received'):,} of {s.get('sent'):,}, p50 {lat.get('p50', 0) / 1e3:.2f} ms, "
                  f"p99 {lat.get('p99', 0) / 1e3:.2f} ms", flush=True)
    res = judge(ids, changed)
    res.update(rate=a.rate, seconds=a.seconds, delay_ms=delay_s * 1e3, runs=ids, changed=changed)
    return conclude(res, os.path.join(CHECKPOINTS, f"relay-repeats-{stamp}.json"))


def conclude(res: dict, path: str) -> int:
    """Write the figures, print them; 0 when every changed run is flagged and no change point is among the others."""
    write_json(path, res)
    named = any(c["metric"] == "p50" and c["first_run"] == res["changed"][0] for c in res["change_points"])
    ok = all(d["verdict"] == "regression" for d in res["detections"]) and named
    print(f"\nfalse alarms: {res['false_alarms']} of {res['comparisons']} comparisons against {BASELINES} runs "
          f"({res['false_alarm_rate']:.1%}, 95% upper {res['upper']:.1%})")
    print("detection: " + ", ".join(f"{d['run']} p50 {d['verdict']} {d['change']:+.1%}" for d in res["detections"]))
    print("history: " + ("; ".join(f"{c['metric']} {c['change']:+.0%} from {c['first_run']} ({c['label']}), "
                                   f"p = {c['p_value']:.2g}" for c in res["change_points"]) or "no change point"))
    print(f"change points among the unchanged runs: {len(res['false_change_points'])}")
    print(f"written: {path}\nrelay repeats: {'PASSED' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
