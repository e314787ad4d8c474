"""Is the candidate run worse than the baseline, beyond the noise? A finished run against one baseline run or
several of the same schedule and target kind, compared for the whole run and per pace step, each difference with a
95% confidence interval.

    >>> bases = [RunSample.load(f"checkpoints/nightly-{i}") for i in (1, 2, 3)]
    >>> compare(bases, RunSample.load("checkpoints/candidate"))["headline"]
    'regression: p99 +38% (95% CI +21%…+55%)'

A run's windows are those wholly inside its schedule (a step's, inside the step), less its warm-up and cool-down and
those whose telemetry flightwatch lost (``telemetry_incomplete``: its own outage, left unjudged as the saturation
verdict leaves them). The interval comes from a block bootstrap (``runs.bootstrap``): the baseline runs are drawn
with replacement, then blocks of consecutive windows within each (a moving block, never wrapping a run's end to its
start), their histogram buckets and counts summed; the candidate's blocks likewise. The block length comes from the
runs' own autocorrelation (Politis and White's rule), unless given. A run as a whole moves too (a noisy neighbour, a
JIT path): several baseline runs measure that run-to-run spread and it is added to the candidate's (from five on,
their spread also sets the interval's least width: the prediction interval of one more run); with one baseline run it
is unknown, and a stated default (``RUN_SPREAD``) is taken for the times of both runs. The change is
``candidate / baseline - 1`` (loss: the difference in percentage points); its interval is the resampled changes'
2.5 and 97.5 percentiles, centred on the exact change and widened by Student's t for the few blocks or few baseline
runs there are.

A change is judged a regression or an improvement when it is beyond the noise floor (``noise``, default ±5%,
relative; loss ±0.1 points; ``floor_us``: an absolute floor for times as well, off by default) with the figures taken
together: each figure's bootstrap p-value of lying within ±floor, and Holm's rule across the judged figures at a
family-wise 5%. Else it is within noise. The maximum and the knee are single values: shown, never judged.
``python -m bench.calibrate`` measures the false alarms, the detection and the intervals' coverage.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from runs.bootstrap import (
    LEVEL,
    Scope,
    block_length,
    block_weights,
    changes,
    figures,
    hierarchical_weights,
    holm,
    interval,
    p_value,
    per_window,
    pooled,
    small_sample,
    smooth,
)
from runs.sample import Incomparable, RunSample  # noqa: F401 (read here by the CLI, the UI and the tests)

RESAMPLES = 2000
NOISE = 0.05
"""Relative changes whose interval reaches inside ±5% are within noise."""
LOSS_NOISE_POINTS = 0.1
"""Loss changes whose interval reaches inside ±0.1 percentage points are within noise."""
FLOOR_US = 0.0
"""An absolute floor for times (``--floor``), off by default: a fixed 1 ms hid a 20% change at a 5 ms p50 and any
at HTTP's 0.1 ms; the relative floor and the run-to-run spread (``RUN_SPREAD``) hold the machine's noise instead."""


@dataclass(frozen=True)
class Metric:
    """One compared figure: its name (as ``--fail-on-regression`` spells it), label, and which way is worse."""

    name: str
    label: str
    higher_is_worse: bool
    points: bool = False    # loss: changes in percentage points, not relative
    judged: bool = True     # max and knee: one value, no interval, never judged
    timed: bool = False     # a time: changes smaller than the floor (``floor_us``) are within noise too


METRICS = (
    Metric("p50", "flight p50", True, timed=True), Metric("p90", "flight p90", True, timed=True),
    Metric("p99", "flight p99", True, timed=True),
    Metric("max", "flight max", True, judged=False),
    Metric("send_delay_p50", "send delay p50", True, timed=True),
    Metric("send_delay_p99", "send delay p99", True, timed=True),
    Metric("achieved", "achieved /s", False), Metric("delivered", "delivered /s", False),
    Metric("loss", "loss", True, points=True),
    Metric("knee", "knee /s", False, judged=False))
BY_NAME = {m.name: m for m in METRICS}
def comparable(base: RunSample, cand: RunSample) -> None:
    """``Incomparable`` with the reason when the two runs are not the same test."""
    if base.target_kind != cand.target_kind:
        raise Incomparable(f"different target kinds: {base.run_id} attacked {base.target_kind}://, "
                           f"{cand.run_id} {cand.target_kind}://")
    if base.pace != cand.pace:
        raise Incomparable(f"different schedules: {base.run_id} paced {base.pace or '?'}, {cand.run_id} paced {cand.pace or '?'} "
                           "(RATE:SECONDS,...)")


@dataclass
class Change:
    """One figure of the baseline and the candidate, the change and its interval (None where not judged)."""

    metric: Metric
    baseline: float | None
    candidate: float | None
    change: float | None       # relative (0.38 = +38%), or percentage points for loss
    low: float | None = None
    high: float | None = None
    verdict: str = "not judged"

    def text(self) -> str:
        """'p99 +38% (95% CI +21…+55%)'."""
        if self.change is None:
            return f"{self.metric.name}: no figure"
        ci = f" (95% CI {signed(self.low, self.metric)}…{signed(self.high, self.metric)})" if self.low is not None else ""
        return f"{self.metric.name} {signed(self.change, self.metric)}{ci}"

    def record(self) -> dict:
        return {"metric": self.metric.name, "label": self.metric.label, "baseline": self.baseline,
                "candidate": self.candidate, "change": self.change, "ci_low": self.low, "ci_high": self.high,
                "unit": "points" if self.metric.points else "ratio", "verdict": self.verdict}


def signed(x: float | None, m: Metric) -> str:
    if x is None:
        return "?"
    return f"{x:+.2f} pt" if m.points else f"{x * 100:+.0f}%"


def _change(m: Metric, base: float | None, cand: float | None) -> float | None:
    if base is None or cand is None or not np.isfinite(base) or not np.isfinite(cand):
        return None
    if m.points:
        return cand - base
    return cand / base - 1 if base else None


RUN_SPREAD = 0.05
"""The run-to-run spread (sd of the log) a time is taken to have where it cannot be measured: with one baseline run,
for both runs; with two, the measured spread is shrunk toward it with ``PRIOR_DF`` degrees of freedom; from three on,
the runs' own spread is taken. Repeats on this machine moved p99 by 5 to 14% and HTTP p50 by more (docs/benchmarks/calibration.md)."""
PRIOR_DF = 2
PREDICTIVE_FROM = 5
"""From this many baseline runs on, their own spread sets the least width of an interval (``predictive``): with
three, Student's t of 2 degrees of freedom made a +30% p99 "within noise" (+10%…+56%)."""


def verdict_of(m: Metric, low: float | None, high: float | None, rejected: bool, way: str) -> str:
    """regression or improvement when the multiple-comparison rule rejected "within ±floor", else within noise."""
    if low is None or high is None:
        return "no interval"
    if rejected:
        return "regression" if (way == "up") == m.higher_is_worse else "improvement"
    return f"within noise (±{max(abs(low), abs(high)) * (1 if m.points else 100):.{2 if m.points else 0}f}" \
           f"{' pt' if m.points else '%'})"


def run_spreads(bases: list[Scope], exact: list[dict], block: int, rng: np.random.Generator,
                default: float) -> dict[str, float]:
    """Each judged figure's run-to-run spread (sd, on its change's scale): several baseline runs' figures spread
    beyond what their own windows explain, shrunk toward ``default`` for times; one run: ``default`` for times, none
    for rates and loss (a paced rate does not wander from run to run)."""
    out = {}
    inner = [figures(b, block_weights(b.n, block, 200, rng)) for b in bases] if len(bases) > 1 else []
    for m in METRICS:
        prior = default if m.timed else 0.0
        if len(bases) < 2 or not m.judged:
            out[m.name] = prior
            continue
        with np.errstate(invalid="ignore", divide="ignore"):
            f = (lambda v: v) if m.points else np.log
            x = np.array([f(e[m.name][0]) for e in exact])
            within = np.nanmean([np.nanvar(f(i[m.name]), ddof=1) for i in inner])
        x = x[np.isfinite(x)]
        est = max(0.0, float(np.var(x, ddof=1)) - float(within)) if len(x) > 1 and np.isfinite(within) else 0.0
        df = len(x) - 1
        shrink = PRIOR_DF if df < 2 else 0  # two runs say too little alone: shrunk toward the default
        sd = float(np.sqrt((df * est + shrink * prior ** 2) / (df + shrink))) if df + shrink else prior
        out[m.name] = sd
    return out


def predictive(m: Metric, exact_runs: list[dict], d: np.ndarray) -> float:
    """From ``PREDICTIVE_FROM`` baseline runs on, how much the resampled changes' spread must widen to be the classical prediction
    interval of one more run, whatever it holds within and between runs: the baseline runs' own spread of the figure
    times sqrt(1 + 1/R) and Student's t with R - 1 degrees of freedom (a spread read from few runs is uncertain)."""
    from scipy.special import ndtri, stdtrit  # t.ppf and norm.ppf without importing scipy.stats (runs.bootstrap)

    with np.errstate(invalid="ignore", divide="ignore"):
        x = np.array([e[m.name][0] for e in exact_runs], np.float64)
        x = x if m.points else np.log(x)
    x = x[np.isfinite(x)]
    sd = float(np.std(d, ddof=1)) if len(d) > 1 else 0.0
    if len(x) < 3 or sd <= 0:
        return 0.0
    want = float(np.std(x, ddof=1)) * np.sqrt(1 + 1 / len(x)) * stdtrit(len(x) - 1, 0.5 + LEVEL / 2)
    return want / (sd * ndtri(0.5 + LEVEL / 2))


def compare_scopes(bases: list[Scope], cand: Scope, block: int | None = None, reps: int = RESAMPLES, seed: int = 0,
                   noise: float = NOISE, knees: tuple[float | None, float | None] = (None, None),
                   floor_us: float = FLOOR_US, run_spread: float = RUN_SPREAD) -> tuple[list[Change], dict]:
    """Every metric of the baseline runs' scopes against the candidate's: figures, change, interval and verdict;
    and how it was judged (the block length, the run-to-run spreads, the rule)."""
    rng = np.random.default_rng(seed)
    if cand.n == 0 or any(b.n == 0 for b in bases):
        return [Change(m, None, None, None) for m in METRICS], {}
    if block is None:  # from the data: the longest any run's p50 or delivered rate asks for
        block = max(block_length(per_window(sc, name)) for sc in (*bases, cand) for name in ("p50", "delivered"))
    pool = pooled(bases)
    bx, cx = figures(pool), figures(cand)
    bb = smooth(figures(pool, hierarchical_weights(bases, block, reps, rng)), rng)
    cb = smooth(figures(cand, block_weights(cand.n, block, reps, rng)), rng)
    each = [figures(b) for b in bases] if len(bases) > 1 else []  # each baseline run's own figures, exact
    spreads = run_spreads(bases, each, block, rng, run_spread)
    exact_runs = each if len(bases) >= PREDICTIVE_FROM else []
    scale = small_sample(min(cand.n, *(b.n for b in bases)) / block)  # few blocks say little of the spread
    rows = []
    for m in METRICS:
        b, c = knees if m.name == "knee" else (_finite(bx[m.name][0]), _finite(cx[m.name][0]))
        ch = _change(m, b, c)
        if not m.judged or ch is None:
            rows.append([m, b, c, ch, None, None, 1.0, "up"])
            continue
        d = changes(bb[m.name], cb[m.name], m.points, len(bases))
        sd = spreads[m.name] * (np.sqrt(2) if len(bases) == 1 else 1.0)  # one baseline: both runs' own effects
        if sd > 0:
            d = d + rng.normal(0.0, sd, len(d))
        k = max(scale, predictive(m, exact_runs, d) if exact_runs else 0.0)
        lo, hi = interval(ch, d, m.points, scale=k)
        floor = LOSS_NOISE_POINTS if m.points else max(noise, floor_us / b if m.timed and b else 0.0)
        rows.append([m, b, c, ch, lo, hi, *p_value(ch, d, floor, m.points, k)])
    judged = [i for i, r in enumerate(rows) if r[0].judged and r[3] is not None]
    rejected = dict(zip(judged, holm([rows[i][6] for i in judged])))
    out = [Change(m, b, c, ch, lo, hi, verdict_of(m, lo, hi, rejected[i], way) if i in rejected else "not judged")
           for i, (m, b, c, ch, lo, hi, _p, way) in enumerate(rows)]
    return out, {"block_windows": int(block), "run_spread": spreads, "judged": len(judged)}


def _finite(x) -> float | None:
    return float(x) if x is not None and np.isfinite(x) else None


def compare(bases: RunSample | list[RunSample], cand: RunSample, block_s: float | None = None, reps: int = RESAMPLES,
            seed: int = 0, noise: float = NOISE, floor_us: float = FLOOR_US, run_spread: float = RUN_SPREAD) -> dict:
    """The comparison of the candidate with one or more baseline runs, as ``compare.json`` holds it: settings, the
    whole run's changes, each step's, and the headline verdict. ``Incomparable`` when they are not the same test."""
    bases = bases if isinstance(bases, list) else [bases]
    for base in bases:
        comparable(base, cand)
    block = None if block_s is None else max(1, round(block_s * 1e9 / cand.window_ns))
    whole, how = compare_scopes([b.scope for b in bases], cand.scope, block, reps, seed, noise,
                                (_mean([b.knee for b in bases]), cand.knee), floor_us, run_spread)
    steps = []
    for i, (bs, cscope) in enumerate(cand.steps):
        if len(cand.steps) > 1:
            bscopes = [b.steps[i][1] for b in bases]
            changes_, _ = compare_scopes(bscopes, cscope, how.get("block_windows", block), reps, seed + i + 1, noise,
                                         floor_us=floor_us, run_spread=run_spread)
            steps.append({"step": i + 1, "rate": bs["rate"], "end_rate": bs["end_rate"],
                          "changes": [c.record() for c in changes_ if c.metric.name != "knee"]})
    base = bases[0]
    return {"baseline": ",".join(b.run_id for b in bases), "baselines": [b.run_id for b in bases],
            "candidate": cand.run_id, "target_kind": base.target_kind, "pace": base.pace,
            "level": LEVEL, "block_windows": how.get("block_windows"), "block_rule": "given" if block_s else
            "Politis-White, from the runs' per-window p50 and delivered rate", "window_s": cand.window_ns / 1e9,
            "resamples": reps, "noise": noise, "floor_us": floor_us, "loss_noise_points": LOSS_NOISE_POINTS,
            "run_spread": how.get("run_spread", {}), "run_spread_default": run_spread,
            "multiple_comparisons": f"Holm across the {how.get('judged', 0)} judged figures, family-wise {1 - LEVEL:.0%}",
            "windows": {"baseline": sum(b.scope.n for b in bases), "candidate": cand.scope.n},
            "windows_left_out": {"baseline": sum(b.left_out for b in bases), "candidate": cand.left_out},
            "trim": {"baseline": list(base.trim), "candidate": list(cand.trim)},
            "headline": headline(whole), "whole_run": [c.record() for c in whole], "steps": steps}


def _mean(xs: list[float | None]) -> float | None:
    xs = [x for x in xs if x is not None]
    return float(np.mean(xs)) if xs else None


def headline(changes: list[Change]) -> str:
    """'regression: p99 +38% (95% CI +21…+55%)', 'improvement: ...', or 'within noise (±6%)' (p99's interval)."""
    bad = [c for c in changes if c.verdict == "regression"]
    good = [c for c in changes if c.verdict == "improvement"]
    if bad:
        return "regression: " + "; ".join(c.text() for c in bad) + ("; improvement: " + "; ".join(c.text() for c in good)
                                                                    if good else "")
    if good:
        return "improvement: " + "; ".join(c.text() for c in good)
    p99 = next((c for c in changes if c.metric.name == "p99"), None)
    if p99 is not None and p99.verdict.startswith("within noise"):
        return p99.verdict
    return "within noise"


# --- the gate

_GATE = re.compile(r"^\s*([a-z_0-9]+)\s*([<>])\s*([+-]?\d+(?:\.\d+)?)\s*%\s*$")


@dataclass(frozen=True)
class Gate:
    """``--fail-on-regression 'p99>+10%'``: fails when the interval's lower bound of p99's change is above +10%
    (``delivered<-5%``: its upper bound below -5%). Loss is in percentage points: ``loss>+0.5%``."""

    text: str
    metric: Metric
    above: bool
    limit: float

    @classmethod
    def parse(cls, text: str) -> Gate:
        m = _GATE.match(text)
        if not m:
            raise ValueError(f"bad --fail-on-regression {text!r}: METRIC>+N% or METRIC<-N%, e.g. 'p99>+10%'")
        name, op, number = m.groups()
        if name not in BY_NAME:
            raise ValueError(f"bad --fail-on-regression {text!r}: unknown metric {name!r} "
                             f"(one of {', '.join(x.name for x in METRICS if x.judged)})")
        metric = BY_NAME[name]
        if not metric.judged:
            raise ValueError(f"bad --fail-on-regression {text!r}: {name} is one value, with no interval to gate on")
        value = float(number)
        return cls(text.strip(), metric, op == ">", value if metric.points else value / 100)

    def crossed(self, report: dict) -> bool:
        row = next(r for r in report["whole_run"] if r["metric"] == self.metric.name)
        if row["ci_low"] is None:
            return False
        return row["ci_low"] > self.limit if self.above else row["ci_high"] < self.limit


# --- text

def text(report: dict) -> str:
    """The comparison as the terminal shows it: the headline, then a table for the whole run and each step."""
    bases = report.get("baselines") or [report["baseline"]]
    spread = report.get("run_spread") or {}
    lines = [f"compare: baseline {', '.join(bases)} -> candidate {report['candidate']} ({report['target_kind']}, pace "
             f"{report['pace']})",
             f"how: {report['level']:.0%} percentile intervals from a block bootstrap ({report['resamples']} resamples; "
             f"blocks of {report.get('block_windows')} windows, {report.get('block_rule', 'given')}"
             + (", the baseline runs drawn first" if len(bases) > 1 else "") + f"); {report.get('multiple_comparisons')}; "
             f"within noise: ±{report['noise']:.0%}" + (f", times ±{report['floor_us'] / 1000:g} ms" if report["floor_us"]
                                                         else "") + f", loss ±{report['loss_noise_points']} pt",
             ("run-to-run spread: unknown with one baseline run; times taken to spread "
              f"±{report.get('run_spread_default', 0):.0%} a run (--run-spread), rates and loss not at all"
              if len(bases) == 1 else "run-to-run spread, from the baseline runs: " + ", ".join(
                  f"{k} ±{v:.1%}" for k, v in spread.items() if k in ("p50", "p99", "delivered") and v is not None)),
             report["headline"], ""]
    out = report.get("windows_left_out") or {}
    if any(out.values()):
        lines.insert(1, f"left out, telemetry incomplete (flightwatch's own outage, not the SUT's): {out['baseline']} "
                        f"windows of the baseline, {out['candidate']} of the candidate")
    trim = report.get("trim") or {}
    if any(any(t) for t in trim.values()):
        lines.insert(1, "left out, warm-up and cool-down: " + ", ".join(
            f"{t[0]:g} s and {t[1]:g} s of the {who}" for who, t in trim.items()))
    lines += _table("whole run", report["whole_run"])
    for s in report["steps"]:
        rate = f"{s['rate']:,.0f}/s" if s["rate"] == s["end_rate"] else f"{s['rate']:,.0f}-{s['end_rate']:,.0f}/s"
        lines += ["", *_table(f"step {s['step']} ({rate})", s["changes"])]
    return "\n".join(lines) + "\n"


def _table(title: str, rows: list[dict]) -> list[str]:
    out = [f"{title:<16} {'baseline':>11} {'candidate':>11} {'change':>9} {'95% CI':>17}  verdict"]
    for r in rows:
        m = BY_NAME[r["metric"]]
        ci = f"{signed(r['ci_low'], m)}…{signed(r['ci_high'], m)}" if r["ci_low"] is not None else ""
        out.append(f"{m.label:<16} {_value(r['baseline'], m):>11} {_value(r['candidate'], m):>11} "
                   f"{signed(r['change'], m) if r['change'] is not None else '':>9} {ci:>17}  {r['verdict']}")
    return out


def _value(v: float | None, m: Metric) -> str:
    if v is None:
        return "-"
    if m.name == "loss":
        return f"{v:.3f}%"
    if m.name in ("achieved", "delivered", "knee"):
        return f"{v:,.1f}"
    return f"{v / 1000:.2f} ms" if v >= 1000 else f"{v:.0f} µs"
