"""The bootstrap behind ``runs.compare``: a run's windows resampled in blocks, the figures of each resample, and the
interval of a change from two runs' resamples.

    >>> w = block_weights(n=60, block=5, reps=2000, rng=np.random.default_rng(0))   # (2000 × 60) draw counts
    >>> figures(scope, w)["p99"]                                                       # 2000 resampled p99s

A resample sums the drawn windows' histogram buckets (eight at a time: HDR precision 1/256 instead of 1/2048, so the
interval is good to under 1% at an eighth of the work) and counts, and takes the percentile or the rate of the sums;
``figures(scope)`` without weights is the run's own, exact.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from core import histogram, output

LEVEL = 0.95
_COARSE_BITS = 3  # buckets summed 8 at a time in the bootstrap (never across a power of two: 1024 sub-buckets each)
_PERCENTILE_OF = {"p50": (output.LATENCY, 50), "p90": (output.LATENCY, 90), "p99": (output.LATENCY, 99),
                  "send_delay_p50": (output.SEND_DELAY, 50), "send_delay_p99": (output.SEND_DELAY, 99)}


@dataclass
class Scope:
    """The windows of a run (or of one pace step) a comparison resamples: per window its sent, received and dropped
    counts, and its flight-time and send-delay histograms as (window row, bucket, count) triples."""

    window_s: float
    sent: np.ndarray
    received: np.ndarray
    dropped: np.ndarray
    hists: dict[str, pd.DataFrame] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return len(self.sent)


def block_weights(n: int, block: int, reps: int, rng: np.random.Generator) -> np.ndarray:
    """(reps × n) how often each of n windows is drawn in each moving-block resample of n windows: blocks of
    ``block`` consecutive windows starting anywhere a whole block fits, never wrapping the run's end to its start
    (the two are not neighbours: a warm-up's edge would be joined to a cool-down's)."""
    block = max(1, min(block, n))
    k = math.ceil(n / block)
    starts = rng.integers(0, n - block + 1, size=(reps, k))
    idx = (starts[:, :, None] + np.arange(block)).reshape(reps, -1)[:, :n]
    flat = (np.arange(reps)[:, None] * n + idx).ravel()
    return np.bincount(flat, minlength=reps * n).reshape(reps, n).astype(np.float64)


def block_length(series: np.ndarray, most: int | None = None) -> int:
    """The block length (in windows) for a block bootstrap of ``series``, from its own autocorrelation: Politis and
    White's rule (2004, with Patton, Politis and White's 2009 correction) for the circular/moving-block bootstrap. The
    autocorrelation is read up to the first lag m after which K_N = max(5, sqrt(log10 n)) lags in a row stay under
    2 sqrt(log10 n / n); a flat-top window of 2m lags gives G and g(0), and the block is (2 G² / D)^(1/3) n^(1/3),
    D = 4/3 g(0)². At least 1, at most ``most`` (default n / 3)."""
    x = np.asarray(series, np.float64)
    x = x[np.isfinite(x)]
    n = len(x)
    most = max(1, most or n // 3)
    if n < 8 or np.var(x) == 0:
        return 1
    x = x - x.mean()
    lags = min(n - 1, max(10, int(math.ceil(math.sqrt(n))) * 2 + 5))
    acov = np.array([np.dot(x[:n - k], x[k:]) / n for k in range(lags + 1)])
    rho = acov / acov[0]
    kn = max(5, int(math.ceil(math.sqrt(math.log10(n)))))
    bound = 2 * math.sqrt(math.log10(n) / n)
    m = next((k for k in range(1, lags - kn + 1) if np.all(np.abs(rho[k:k + kn]) < bound)), lags - kn)
    big_m = min(2 * max(m, 1), lags)
    k = np.arange(-big_m, big_m + 1)
    t = np.abs(k) / big_m
    flat_top = np.where(t <= 0.5, 1.0, np.where(t <= 1.0, 2 * (1 - t), 0.0))
    r = acov[np.abs(k)]
    g = float(np.sum(flat_top * np.abs(k) * r))
    g0 = float(np.sum(flat_top * r))
    d = 4 / 3 * g0 ** 2
    if d <= 0 or g == 0:
        return 1
    return int(min(most, max(1, round((2 * g * g / d) ** (1 / 3) * n ** (1 / 3)))))


def _percentiles_of_rows(sums: np.ndarray, highs: np.ndarray, ps: list[float]) -> list[np.ndarray]:
    """Per row of bucket counts (columns in bucket order): the value at each percentile of ``ps`` by nearest rank."""
    cum = np.cumsum(sums, axis=1)
    total = cum[:, -1] if cum.shape[1] else np.zeros(len(sums))
    outs = []
    for p in ps:
        target = np.maximum(np.ceil(p / 100 * total - 1e-9), 1)
        col = (cum < target[:, None]).sum(axis=1)
        out = highs[np.minimum(col, len(highs) - 1)].astype(np.float64) if len(highs) else np.full(len(sums), np.nan)
        outs.append(np.where(total > 0, out, np.nan))
    return outs


def figures(scope: Scope, weights: np.ndarray | None = None, only: tuple[str, ...] | None = None) -> dict[str, np.ndarray]:
    """The judged figures of a scope (``only``: these percentiles, with the counts' figures), per row of ``weights``
    (window draw counts; None: the scope itself, exact)."""
    exact = weights is None
    w = np.ones((1, scope.n)) if exact else weights
    n = w.sum(axis=1)
    sent, received, dropped = w @ scope.sent, w @ scope.received, w @ scope.dropped
    with np.errstate(invalid="ignore", divide="ignore"):
        out = {"achieved": sent / (n * scope.window_s), "delivered": received / (n * scope.window_s),
               "loss": np.where(sent > 0, dropped / sent * 100, np.nan)}
    wanted = {name: hp for name, hp in _PERCENTILE_OF.items() if only is None or name in only}
    for hist in dict.fromkeys(h for h, _ in wanted.values()):  # each histogram's resamples summed once
        names = [name for name, (h, _) in wanted.items() if h == hist]
        values = _hist_percentiles(scope.hists[hist], w, [wanted[name][1] for name in names], exact, scope.n)
        out.update(zip(names, values))
    if exact:
        h = scope.hists[output.LATENCY]
        out["max"] = np.array([histogram.max_value(h["bucket"].to_numpy(), h["count"].to_numpy()) or np.nan], float)
    return out


def _hist_percentiles(h: pd.DataFrame, w: np.ndarray, ps: list[float], exact: bool, n: int) -> list[np.ndarray]:
    """Each percentile of ``ps`` of one histogram, per row of ``w``."""
    if h.empty:
        return [np.full(len(w), np.nan) for _ in ps]
    bucket = h["bucket"].to_numpy(np.int64) if exact else h["bucket"].to_numpy(np.int64) >> _COARSE_BITS
    cols, col_of = np.unique(bucket, return_inverse=True)
    highs = histogram.bucket_high(cols if exact else (cols << _COARSE_BITS) + (1 << _COARSE_BITS) - 1)
    dense = np.zeros((n, len(cols)))
    np.add.at(dense, (h["row"].to_numpy(np.int64), col_of), h["count"].to_numpy(np.float64))
    outs = [np.empty(len(w)) for _ in ps]
    for lo in range(0, len(w), 250):  # (resamples × buckets) in slices: a long run's matrix stays small
        for out, part in zip(outs, _percentiles_of_rows(w[lo:lo + 250] @ dense, highs, ps)):
            out[lo:lo + 250] = part
    return outs


def pooled(scopes: list[Scope]) -> Scope:
    """Several runs' windows as one scope (the baseline runs, one after the other)."""
    if len(scopes) == 1:
        return scopes[0]
    offsets = np.cumsum([0] + [s.n for s in scopes])
    out = Scope(scopes[0].window_s, *(np.concatenate([getattr(s, k) for s in scopes]) for k in ("sent", "received",
                                                                                                 "dropped")))
    for name in scopes[0].hists:
        out.hists[name] = pd.concat([s.hists[name].assign(row=s.hists[name]["row"] + off)
                                     for s, off in zip(scopes, offsets)], ignore_index=True)
    return out


def hierarchical_weights(scopes: list[Scope], block: int, reps: int, rng: np.random.Generator) -> np.ndarray:
    """(reps × all windows) draw counts of a two-level resample: the runs drawn with replacement (as many as there
    are), then blocks within each run drawn, each time a run is drawn anew. One run: its blocks alone."""
    r = len(scopes)
    counts = rng.multinomial(r, [1 / r] * r, size=reps) if r > 1 else np.ones((reps, 1), np.int64)
    out = np.zeros((reps, sum(s.n for s in scopes)))
    off = 0
    for i, s in enumerate(scopes):
        for j in range(int(counts[:, i].max())):
            out[:, off:off + s.n] += block_weights(s.n, block, reps, rng) * (counts[:, i] > j)[:, None]
        off += s.n
    return out


def smooth(resampled: dict[str, np.ndarray], rng: np.random.Generator) -> dict[str, np.ndarray]:
    """The resampled percentiles spread uniformly across their coarse bucket (as wide as 8/1024 of the value at most):
    otherwise a p50 whose spread is a bucket or two takes a few values only, and its interval's ends fall on them (the
    p50 intervals of identical runs held 0 in 88% of them, ``bench.calibrate``, instead of 95%)."""
    half = (1 << _COARSE_BITS) / 2048
    return {k: v * np.exp(rng.uniform(-half, half, len(v))) if k in _PERCENTILE_OF else v for k, v in resampled.items()}


def per_window(scope: Scope, name: str) -> np.ndarray:
    """One figure of each window alone (its p50, its delivered rate, ...): the series a block length is read from."""
    return figures(scope, np.eye(scope.n), only=(name,))[name] if scope.n else np.array([])


def changes(base: np.ndarray, cand: np.ndarray, points: bool, runs: int = 1) -> np.ndarray:
    """The resampled changes: log ratios (``points``: differences), the finite ones. With ``runs`` baseline runs
    drawn with replacement, the baseline's spread is widened by sqrt(runs / (runs - 1)): drawing n of n runs spreads
    their mean that much too little."""
    with np.errstate(invalid="ignore", divide="ignore"):
        b, c = (base, cand) if points else (np.log(base), np.log(cand))
        ok = np.isfinite(b) & np.isfinite(c)
        b, c = b[ok], c[ok]
        if runs > 1 and len(b):
            b = np.median(b) + (b - np.median(b)) * math.sqrt(runs / (runs - 1))
        return c - b


def small_sample(blocks: float, level: float = LEVEL) -> float:
    """How much wider than the resamples' spread an interval is drawn when a run has few independent blocks: Student's
    t over the normal quantile, with the shorter run's blocks less one degrees of freedom (a block bootstrap's spread
    of a 60-window run of 10 blocks is too narrow by about that much: its intervals held the truth 88% of the time
    without it, ``bench.calibrate``)."""
    # scipy.special's quantiles, the very functions scipy.stats' t.ppf and norm.ppf call: importing scipy.stats costs
    # 1.1 s of CPU more, in every process that compares
    from scipy.special import ndtri, stdtrit

    return float(stdtrit(max(math.ceil(blocks) - 1, 1), 0.5 + level / 2) / ndtri(0.5 + level / 2))


def _centred(change: float, d: np.ndarray, points: bool, scale: float) -> np.ndarray:
    """The resampled changes moved so that their median is the exact change (the resamples sum coarser buckets), their
    spread widened by ``scale`` (``small_sample``)."""
    return (d - np.median(d)) * scale + (change if points else math.log1p(change))


def interval(change: float, d: np.ndarray, points: bool = False, level: float = LEVEL,
             scale: float = 1.0) -> tuple[float | None, float | None]:
    """The percentile interval of a change from its resampled changes ``d`` (``changes``), centred on the exact
    change; None when too few resamples were finite."""
    if len(d) < 20:
        return None, None
    lo, hi = np.quantile(_centred(change, d, points, scale), [(1 - level) / 2, (1 + level) / 2])
    return (float(lo), float(hi)) if points else (math.expm1(lo), math.expm1(hi))


def p_value(change: float, d: np.ndarray, floor: float, points: bool = False, scale: float = 1.0) -> tuple[float, str]:
    """Two-sided bootstrap p-value that the change lies beyond ±``floor`` (relative, or points), and which way:
    (p, "up" or "down")."""
    if len(d) < 20:
        return 1.0, "up"
    c = _centred(change, d, points, scale)
    up, down = (floor, -floor) if points else (math.log1p(floor), math.log1p(-min(floor, 0.99)))
    p_up = (np.count_nonzero(c <= up) + 1) / (len(c) + 1)      # the resamples not above +floor
    p_down = (np.count_nonzero(c >= down) + 1) / (len(c) + 1)  # not below -floor
    return min(1.0, 2 * min(p_up, p_down)), "up" if p_up <= p_down else "down"


def holm(p: list[float], alpha: float = 1 - LEVEL) -> list[bool]:
    """Holm's step-down rule: which of the hypotheses are rejected with the family-wise error rate at ``alpha``."""
    order = np.argsort(p, kind="stable")
    out = [False] * len(p)
    for rank, i in enumerate(order):
        if p[i] > alpha / (len(p) - rank):
            break
        out[i] = True
    return out
