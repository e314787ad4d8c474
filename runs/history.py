"""A series' history: its finished runs in time order, their p50, p99 and throughput, and its significant changes.

    >>> h = history("checkout-kafka")              # runs started with --scenario checkout-kafka
    >>> [(c["metric"], c["first_run"], c["label"], c["p_value"]) for c in h["change_points"]]
    [('p99', 'attack-20261126-101500', 'v2.4.0', 0.002)]

Runs belong to the series of their ``--scenario`` name; a run without one belongs to the series of its target kind
and schedule (``kafka 5000:60``). The runs come from the index (``runs.index``). Only runs of the same test are
judged: those whose target, pace, payload, workers, trim and job settings match the series' newest run; the others
are listed as left out, with the setting that differs.

A change is found per figure in three steps, on the figures' logarithms:

1. PELT (``ruptures``) proposes change points, with a penalty scaled by the run-to-run noise estimated from the series
   itself; a change point needs two runs on each side.
2. As E-Divisive does (Matteson and James), the whole series is first tested for a change anywhere in it, the search
   paid for: Student's t at its best split, times the number of splits (Bonferroni). Above ``ALPHA``, nothing is said:
   this holds the false-change rate per history to ``ALPHA`` however many points PELT proposes.
3. Each proposal is tested the same way within the segment between its neighbours; those with p > ``ALPHA``, or
   smaller than ``MIN_CHANGE`` (the floor ``runs compare`` calls within noise), are merged away, the least
   significant first, and the rest tested again. Twenty quiet relay runs moved by +4% and back, significantly
   (p = 0.014): real, and below what anyone would act on.

E-Divisive's own permutation test (``test="permutation"``) is kept for the measurement: ``bench.changepoints`` chose
the t test, and measures the false-change rate per history that docs/benchmarks/calibration.md states.
"""
from __future__ import annotations

import numpy as np

from core.rundir import CHECKPOINTS
from runs.index import RunPoint, points

FIGURES = ("p50", "p99", "delivered")
WORSE_UP = {"p50": True, "p99": True, "delivered": False}
"""Which way a figure gets worse: a rise of latency, a fall of throughput."""
PENALTY = 2.0
"""PELT's penalty per change point, in units of the noise's variance times ln(runs) (``bench.changepoints``)."""
MIN_RUNS = 2
"""Runs a segment needs: a change point has at least this many runs on each side."""
ALPHA = 0.05
"""A change is kept when its test's p-value is at most this."""
PERMUTATIONS = 999
TEST = "t"
"""How a proposal is tested: ``t`` (Student's t, Bonferroni over the splits) or ``permutation``."""
MIN_CHANGE = 0.05
"""The smallest change said, relative (``--min-change``): ``runs compare``'s ``--noise`` floor."""
NOISE_FLOOR = 0.01
"""The least run-to-run noise (sd of the log figures) PELT's penalty and the tests assume: runs 1% apart are not
told apart."""


def rule(min_change: float = MIN_CHANGE) -> str:
    return (f"PELT proposes (penalty {PENALTY:g} σ² ln n); the whole series, then each proposal within its neighbours, "
            f"is tested with Student's t times the splits searched (Bonferroni), and kept at p ≤ {ALPHA:g} and a "
            f"change of at least ±{min_change:.0%}")


def noise(log_values: np.ndarray) -> float:
    """The run-to-run noise (sd) of a series of log figures, robust to its change points: the median absolute
    difference of consecutive runs, scaled to a normal's sd."""
    d = np.diff(np.asarray(log_values, float))
    return float(np.median(np.abs(d)) * 1.4826 / np.sqrt(2)) if len(d) else 0.0


def split_statistic(x: np.ndarray) -> np.ndarray:
    """The largest standardised difference of means over the splits of each row of ``x`` (``MIN_RUNS`` a side)."""
    n = x.shape[-1]
    c = np.cumsum(x, axis=-1)
    j = np.arange(MIN_RUNS, n - MIN_RUNS + 1)
    left = c[..., j - 1] / j
    right = (c[..., -1:] - c[..., j - 1]) / (n - j)
    return np.max(np.abs(left - right) * np.sqrt(j * (n - j) / n), axis=-1)


def p_value(segment: np.ndarray, rng: np.random.Generator) -> float:
    """The permutation p-value of a change somewhere in ``segment``: how often its runs, shuffled, split as far."""
    if len(segment) < 2 * MIN_RUNS:
        return 1.0
    observed = split_statistic(segment)
    shuffled = rng.permuted(np.tile(segment, (PERMUTATIONS, 1)), axis=1)
    return float((1 + np.sum(split_statistic(shuffled) >= observed - 1e-12)) / (PERMUTATIONS + 1))


def t_p_value(segment: np.ndarray, at: int) -> float:
    """The p-value of a change at ``at`` in ``segment``: Student's t of the two sides' means (pooled variance, at
    least ``NOISE_FLOOR``), times the splits the search chose from (Bonferroni: the search is paid for)."""
    from scipy.special import stdtr  # Student's t's CDF: t.sf(x, df) is stdtr(df, -x), without importing scipy.stats

    a, b = segment[:at], segment[at:]
    if min(len(a), len(b)) < MIN_RUNS:
        return 1.0
    df = len(segment) - 2
    sd = max(np.sqrt((np.sum((a - a.mean()) ** 2) + np.sum((b - b.mean()) ** 2)) / df), NOISE_FLOOR)
    t = abs(a.mean() - b.mean()) / (sd * np.sqrt(1 / len(a) + 1 / len(b)))
    return float(min(1.0, 2 * stdtr(df, -t) * (len(segment) - 2 * MIN_RUNS + 1)))


def change_points(values, penalty: float = PENALTY, test: str | None = None,
                  min_change: float = MIN_CHANGE) -> list[tuple[int, float]]:
    """The significant changes of a series of positive figures: (index of the first run after it, p-value)."""
    import ruptures as rpt

    x = np.log(np.asarray(values, float))
    if len(x) < 2 * MIN_RUNS or not np.isfinite(x).all():
        return []
    sd = max(noise(x), NOISE_FLOOR)
    algo = rpt.Pelt(model="l2", min_size=MIN_RUNS, jump=1).fit(x.reshape(-1, 1))
    return significant(x, [int(b) for b in algo.predict(pen=penalty * sd ** 2 * np.log(len(x)))[:-1]], test or TEST,
                       min_change)


def significant(x: np.ndarray, proposed: list[int], test: str = "t",
                min_change: float = MIN_CHANGE) -> list[tuple[int, float]]:
    """The proposed change points that the test keeps (``t``: ``t_p_value``; ``permutation``: ``p_value``, seeded so
    that a history reads the same every time) and that move the segment means' ratio by ``min_change`` at least, each
    with its p-value."""
    rng = np.random.default_rng(0)
    # first, as E-Divisive does: is there a change anywhere in the whole series? Under no change at all this holds
    # the false-change rate per history to ALPHA, however many change points PELT proposes
    whole = (min((t_p_value(x, j) for j in range(MIN_RUNS, len(x) - MIN_RUNS + 1)), default=1.0) if test == "t" else
             p_value(x, rng))
    if whole > ALPHA:
        return []

    def tested(lo: int, at: int, hi: int) -> float:  # the change at ``at`` between its neighbours
        if abs(x[at:hi].mean() - x[lo:at].mean()) < np.log1p(min_change):
            return 1.0  # too small to say, however significant
        return t_p_value(x[lo:hi], at - lo) if test == "t" else p_value(x[lo:hi], rng)

    cps = list(proposed)
    while cps:
        edges = [0, *cps, len(x)]
        ps = [tested(*edges[k:k + 3]) for k in range(len(cps))]
        worst = int(np.argmax(ps))
        if ps[worst] <= ALPHA:
            return list(zip(cps, ps))
        del cps[worst]
    return []


def differs(fp: dict, ref: dict) -> list[str]:
    """The settings in which a run's fingerprint differs from the reference's (a setting one of them does not
    record, from an older flightwatch, is taken as the same)."""
    return [f"{k} {fp[k]} (not {ref[k]})" for k in sorted(set(fp) & set(ref)) if fp[k] != ref[k]]


def history(name: str, checkpoints: str | None = None, everything: list[RunPoint] | None = None,
            min_change: float = MIN_CHANGE) -> dict:
    """The series ``name``: its runs of the same test as its newest (oldest first), the runs left out and why, and per
    figure its significant changes (the first run after each, its label, the medians before and after, the p-value).
    ``LookupError`` with the known series when there is no such series. ``everything``: the finished runs' points
    when the caller has read them already (``runs.index.points``)."""
    everything = points(checkpoints) if everything is None else everything
    series = [p for p in everything if p.series == name]
    if not series:
        known = sorted({p.series for p in everything})
        raise LookupError(f"no finished runs in series {name!r}" + (f" (series: {', '.join(known)})" if known else
                                                                    f" (no finished runs in {checkpoints or CHECKPOINTS})"))
    ref = series[-1].fingerprint
    runs, left_out = [], []
    for p in series:
        if (d := differs(p.fingerprint, ref)):
            left_out.append({"run_id": p.run_id, "differs": d})
        else:
            runs.append(p)
    found = []
    for fig in FIGURES:
        vals = [r.figure(fig) for r in runs]
        if any(v is None or v <= 0 for v in vals):
            continue
        cps = change_points(vals, min_change=min_change)
        edges = [0, *(i for i, _ in cps), len(vals)]
        for k, (i, p) in enumerate(cps):
            before, after = np.median(vals[edges[k]:i]), np.median(vals[i:edges[k + 2]])
            found.append({"metric": fig, "index": i, "first_run": runs[i].run_id, "label": runs[i].label,
                          "before": float(before), "after": float(after), "change": float(after / before - 1),
                          "p_value": p, "worse": bool((after > before) == WORSE_UP[fig])})
    return {"series": name, "runs": [r.__dict__ for r in runs], "left_out": left_out, "change_points": found,
            "rule": rule(min_change)}


def recent_changes(h: dict, recent: int, regressions_only: bool = True) -> list[dict]:
    """The changes whose first run is among the series' ``recent`` newest runs (``--fail-on-change``)."""
    n = len(h["runs"])
    return [c for c in h["change_points"] if c["index"] >= n - recent and (c["worse"] or not regressions_only)]


def series_list(checkpoints: str | None = None, everything: list[RunPoint] | None = None) -> dict[str, int]:
    """Every series with finished runs, and how many (``everything``: the points, if read already)."""
    out: dict[str, int] = {}
    for p in points(checkpoints) if everything is None else everything:
        out[p.series] = out.get(p.series, 0) + 1
    return out


def text(h: dict) -> str:
    lines = [f"series {h['series']}: {len(h['runs'])} finished runs of the same test, oldest first", "",
             f"{'run':<34} {'label':<14} {'p50':>10} {'p99':>10} {'delivered/s':>12}"]
    for i, r in enumerate(h["runs"]):
        cp = [c for c in h["change_points"] if c["index"] == i]
        note = "  <- change: " + ", ".join(f"{c['metric']} {c['change']:+.0%}" for c in cp) if cp else ""
        lines.append(f"{r['run_id']:<34} {(r.get('label') or '-')[:14]:<14} {_ms(r['p50_us']):>10} "
                     f"{_ms(r['p99_us']):>10} {r['delivered_per_s'] or 0:>12,.1f}{note}")
    for r in h.get("left_out", []):
        lines.append(f"left out: {r['run_id']}, another test: {'; '.join(r['differs'])}")
    lines.append("")
    if not h["change_points"]:
        lines.append("no significant change" + (" (a change needs two runs on each side)"
                                                if len(h["runs"]) < 2 * MIN_RUNS else ""))
    for c in h["change_points"]:
        lines.append(f"change point: {change_text(c)} (median {_fig(c['before'], c['metric'])} -> {_fig(c['after'], c['metric'])}; "
                     f"{p_text(c['p_value'])}{'' if c['worse'] else ', better'})")
    lines.append(f"rule: {h.get('rule') or rule()}")
    return "\n".join(lines) + "\n"


def change_text(c: dict) -> str:
    """A change as every reader says it: ``p99 +40% from run hist-6 (build-6)``."""
    return f"{c['metric']} {c['change']:+.0%} from run {c['first_run']}" + (f" ({c['label']})" if c.get("label") else "")


def p_text(p: float) -> str:
    return "p < 0.001" if p < 0.001 else f"p = {p:.3f}"


def _ms(us) -> str:
    return "-" if us is None else f"{us / 1000:.2f} ms"


def _fig(v: float, metric: str) -> str:
    return f"{v:,.1f}/s" if metric == "delivered" else _ms(v)
