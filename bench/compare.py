"""Is ``runs compare`` right? Its false-alarm rate and its power, measured on synthetic runs of known distribution.

Usage:
    python -m bench.compare [--pairs 40] [--seconds 30] [--rate 1000]

Each run is a synthetic run of known truth (``loadgen.synthetic``: lognormal flight times, slow stretches that
last seconds, 1% drops) written through the real decoder, engine and sink into a run folder, as the streaming job
and its replay write one (``build_run``). Three sets of ``--pairs`` pairs, every run from its own seed:
the same distribution, p99 shifted by +5%, and by +30% (the lognormal's spread widened so that its p99 moves by
that much; the median stays). Printed: how many pairs the comparison calls a p99 regression, an improvement or
within noise, and any regression of another figure (a false alarm where the distribution is the same).
"""
from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np

NS = 10**9
SIGMA = 0.6
Z99 = 2.3263478740408408  # the standard normal's 99th percentile


def build_run(folder: str, spec, batches: int = 6) -> str:
    """Write a run folder the way the streaming job does (real decode, engine and sink, no Spark)."""
    from loadgen.synthetic import generate, messages
    from streaming import engine
    from streaming.decode import decode_messages
    from streaming.sinks import RunStore

    msgs = messages(generate(spec))
    store = RunStore(str(folder), engine.EngineConfig(spec.run_id, drop_timeout_ns=spec.drop_timeout_s * NS))
    for b, idx in enumerate(np.array_split(np.arange(len(msgs)), batches)):
        store.process_batch(decode_messages([msgs[i][1] for i in idx], [0] * len(idx), list(idx)), b)
    return str(folder)


def spec_for(run_id: str, seed: int, seconds: int, rate: int, p99_shift: float = 0.0, wobble: float = 0.1):
    """A synthetic run whose p99 is ``1 + p99_shift`` times the base distribution's (the median unchanged)."""
    from loadgen.synthetic import SyntheticSpec

    sigma = SIGMA + math.log1p(p99_shift) / Z99
    return SyntheticSpec(run_id=run_id, duration_s=seconds, rate_per_sec=rate, latency_median_us=5000.0,
                         latency_sigma=sigma, drop_fraction=0.01, duplicate_fraction=0.0, error_fraction=0.0,
                         late_count=0, pause=None, oom_at_s=(), num_malformed=0, drop_timeout_s=5, seed=seed,
                         wobble=wobble,
                         config={"target": "kafka://127.0.0.1:19093/bench", "pace": f"{rate}:{seconds}",
                                 "schedule_start_ns": 1_800_000_000 * NS})


def _one(args) -> str:
    folder, run_id, seed, seconds, rate, shift = args
    return build_run(f"{folder}/{run_id}", spec_for(run_id, seed, seconds, rate, shift))


def study(folder: str, pairs: int, seconds: int, rate: int, workers: int = 2, log=print) -> dict:
    """Build the runs, compare each pair: per set, the p99 verdicts and the other figures' regressions."""
    from runs.compare import RunSample, compare

    jobs = [(folder, f"base-{i}", 1000 + i, seconds, rate, 0.0) for i in range(pairs)]
    sets = {"same": 0.0, "+5%": 0.05, "+30%": 0.30}
    shift_of = dict(sets)  # the true change of p99
    for k, (name, shift) in enumerate(sets.items()):
        jobs += [(folder, f"{name}-{i}", 10_000 * (k + 1) + i, seconds, rate, shift) for i in range(pairs)]
    t0 = time.time()
    with ProcessPoolExecutor(workers) as pool:
        for n, _ in enumerate(pool.map(_one, jobs), 1):
            if n % 20 == 0 or n == len(jobs):
                log(f"  built {n}/{len(jobs)} runs ({time.time() - t0:.0f} s)")
    out = {}
    for name in sets:
        verdicts, others, widths, covered, alarms = [], 0, [], 0, 0
        for i in range(pairs):
            rep = compare(RunSample.load(f"{folder}/base-{i}"), RunSample.load(f"{folder}/{name}-{i}"), seed=i)
            alarms += any(r["verdict"] in ("regression", "improvement") for r in rep["whole_run"])
            p99 = next(r for r in rep["whole_run"] if r["metric"] == "p99")
            verdicts.append(p99["verdict"].split(" (")[0])
            widths.append(p99["ci_high"] - p99["ci_low"])
            others += any(r["verdict"] in ("regression", "improvement") for r in rep["whole_run"] if r["metric"] != "p99")
            covered += p99["ci_low"] <= shift_of[name] <= p99["ci_high"]
        out[name] = {"regression": verdicts.count("regression"), "improvement": verdicts.count("improvement"),
                     "within noise": verdicts.count("within noise"), "other_regressions": others,
                     "median_ci_width": float(np.median(widths)), "covered": covered,
                     "false_alarm_pairs": alarms}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.compare", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--pairs", type=int, default=40, help="pairs per set (default %(default)s)")
    ap.add_argument("--seconds", type=int, default=60, help="each run's length (default %(default)s)")
    ap.add_argument("--rate", type=int, default=500, help="each run's events/s (default %(default)s)")
    try:
        a = ap.parse_args(argv)
    except SystemExit as e:
        return 2 if e.code else 0
    if a.pairs < 1 or a.seconds < 5 or a.rate < 10:
        print("bench.compare: error: --pairs >= 1, --seconds >= 5, --rate >= 10", file=sys.stderr)
        return 2
    print(f"bench.compare: {a.pairs} pairs per set, runs of {a.seconds} s at {a.rate}/s "
          f"(lognormal flight times, median 5 ms, slow stretches of ±10%)", flush=True)
    with tempfile.TemporaryDirectory(prefix="fw-compare-") as d:
        res = study(d, a.pairs, a.seconds, a.rate, log=lambda m: print(m, flush=True))
    print(f"\n{'pairs':<8} {'p99 regression':>15} {'improvement':>12} {'within noise':>13} {'other figures judged':>21} "
          f"{'CI holds the truth':>19} {'median CI width':>16}")
    for name, r in res.items():
        print(f"{name:<8} {r['regression']:>9} / {a.pairs:<3} {r['improvement']:>12} {r['within noise']:>13} "
              f"{r['other_regressions']:>21} {r['covered']:>13} / {a.pairs:<3} {r['median_ci_width'] * 100:>15.1f}%")
    same, big = res["same"], res["+30%"]
    false_alarms = same["false_alarm_pairs"] / a.pairs
    print(f"\nfalse alarms on same-distribution pairs (any figure judged a regression or an improvement): "
          f"{false_alarms:.0%} (goal <= 5%); "
          f"+30% p99 detected: {big['regression'] / a.pairs:.0%} (goal >= 95%); "
          f"+5% p99 detected: {res['+5%']['regression'] / a.pairs:.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
