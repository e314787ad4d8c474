"""Which change-point detector for a scenario's history? Measured on synthetic histories of known change points.

Usage:
    python -m bench.changepoints [--series 400] [--runs 20]

A history is a series of per-run figures (say p99): lognormal run-to-run noise (5% or 10%), and either no change or
one step of +10%, +30% or -30% at a random run. Each detector runs on the figures' logarithms with its penalty
scaled by the noise it estimates from the series itself (``runs.history.noise``); the "+ permutation" ones keep only
the proposals that ``runs.history``'s permutation test finds significant. Printed per detector: how often it finds
the change within one run of where it is (recall), how many change points it reports where there is none (false ones
per history), and the share of histories without a change in which it reports one (the false-change rate per
history, with its 95% upper bound). ``runs.history`` uses the winner.

apache-otava and MongoDB's signal-processing-algorithms (e-divisive) are not measured: neither installs beside this
project's numpy (otava pins numpy 2.2, signal-processing-algorithms numpy < 2 and Python 3.11 with gevent).
"""
from __future__ import annotations

import argparse
import sys

import numpy as np


def detectors() -> dict:
    """name -> f(log_values, noise_sd) -> change-point indices (the first run after each change)."""
    import ruptures as rpt

    from runs import history

    def pen(x, sd, c):
        return c * max(sd, 1e-3) ** 2 * np.log(len(x))

    def fit(algo, c):
        return lambda x, sd: [b for b in algo().fit(x.reshape(-1, 1)).predict(pen=pen(x, sd, c))[:-1]]

    def tested(c, test):  # PELT's proposals, kept by runs.history's test
        return lambda x, sd: [i for i, _ in history.change_points(np.exp(x), penalty=c, test=test)]
    return {
        "Pelt l2, pen 2σ²ln n": fit(lambda: rpt.Pelt(model="l2", min_size=2, jump=1), 2),
        "Pelt l2, pen 4σ²ln n": fit(lambda: rpt.Pelt(model="l2", min_size=2, jump=1), 4),
        "Pelt l2, pen 6σ²ln n": fit(lambda: rpt.Pelt(model="l2", min_size=2, jump=1), 6),
        "Binseg l2, pen 4σ²ln n": fit(lambda: rpt.Binseg(model="l2", min_size=2, jump=1), 4),
        "BottomUp l2, pen 4σ²ln n": fit(lambda: rpt.BottomUp(model="l2", min_size=2, jump=1), 4),
        "Pelt 1σ²ln n + permutation": tested(1.0, "permutation"),
        "Pelt 2σ²ln n + permutation": tested(2.0, "permutation"),
        "Pelt 4σ²ln n + permutation": tested(4.0, "permutation"),
        "Pelt 1σ²ln n + t (Bonferroni)": tested(1.0, "t"),
        "Pelt 2σ²ln n + t (Bonferroni)": tested(2.0, "t"),
        "Pelt 4σ²ln n + t (Bonferroni)": tested(4.0, "t"),
        f"runs.history (the choice, {history.PENALTY:g}σ²)": tested(history.PENALTY, history.TEST),
    }


def histories(n_series: int, runs: int, rng: np.random.Generator):
    """(log values, true change index or None) per synthetic history."""
    out = []
    for i in range(n_series):
        noise = (0.05, 0.10)[i % 2]
        shift = (0.0, 0.10, 0.30, -0.30)[(i // 2) % 4]
        x = rng.normal(0, noise, runs)
        at = None
        if shift:
            at = int(rng.integers(3, runs - 2))
            x[at:] += np.log1p(shift)
        out.append((x, at, shift, noise))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.changepoints", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--series", type=int, default=400, help="synthetic histories (default %(default)s)")
    ap.add_argument("--runs", type=int, default=20, help="runs per history (default %(default)s)")
    try:
        a = ap.parse_args(argv)
    except SystemExit as e:
        return 2 if e.code else 0
    if a.series < 8 or a.runs < 8:
        print("bench.changepoints: error: --series and --runs must be >= 8", file=sys.stderr)
        return 2
    from bench.calibrate import upper_bound
    from runs.history import noise

    data = histories(a.series, a.runs, np.random.default_rng(11))
    nulls = sum(at is None for _, at, _, _ in data)
    print(f"bench.changepoints: {a.series} histories of {a.runs} runs (noise 5% or 10%; no change, +10%, +30% or -30%; "
          f"{nulls} without a change)")
    print(f"\n{'detector':<34} {'recall +10%':>12} {'recall ±30%':>12} {'false per history':>18} "
          f"{'no-change histories with a change (95% upper)':>48}")
    for name, detect in detectors().items():
        found = {0.10: [], 0.30: []}
        false = flagged = 0
        for x, at, shift, _ in data:
            cps = detect(x, noise(x))
            hits = [c for c in cps if at is not None and abs(c - at) <= 1]
            false += len(cps) - min(len(hits), 1)
            flagged += at is None and bool(cps)
            if at is not None:
                found[abs(shift)].append(bool(hits))
        print(f"{name:<34} {np.mean(found[0.10]):>12.0%} {np.mean(found[0.30]):>12.0%} {false / len(data):>18.3f} "
              f"{flagged:>29} / {nulls:<4} {flagged / nulls:>5.1%} ({upper_bound(flagged, nulls):.1%})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
