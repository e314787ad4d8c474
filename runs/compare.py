"""Is the candidate run worse than the baseline, beyond the noise? Two finished runs of the same schedule and target
kind, compared for the whole run and per pace step, each difference with a 95% confidence interval.

    >>> base, cand = RunSample.load("checkpoints/attack-a"), RunSample.load("checkpoints/attack-b")
    >>> compare(base, cand)["headline"]
    'regression: p99 +38% (95% CI +21%…+55%)'

A run's windows are those wholly inside its schedule (a step's, inside the step), less those whose telemetry
flightwatch lost (``telemetry_incomplete``: its own outage, left unjudged as the saturation verdict leaves them).
The interval comes from a circular-block bootstrap over them (``runs.bootstrap``): each resample strings together
blocks of ``block_s`` consecutive windows (windows are autocorrelated: a stall spans several), sums their histogram
buckets and counts, and takes the percentile or rate of the sums. Each run is resampled on its own; the change is
``candidate / baseline - 1`` (loss: the difference in percentage points), and its interval is the change ± Student's
t times the resamples' standard error of the log ratio, with as many degrees of freedom as the shorter run has
blocks less one: a short run has few independent stretches, and its interval is wide.

A change is a regression when the whole interval lies beyond the noise floor on the bad side (``noise``, default ±5%;
for a time also ±``floor_us``, default 1 ms; loss ±0.1 points), an improvement when it lies beyond it on the good
side, and within noise otherwise. The maximum and the knee are single values: shown, never judged.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from core import output
from core.rundir import RunPaths
from runs import runinfo
from runs.bootstrap import LEVEL, Scope, block_weights, figures, interval
from runs.reader import RunReader, read_json

BLOCK_S = 5
"""Windows a bootstrap block strings together: several seconds, as long as a typical stall."""
RESAMPLES = 2000
NOISE = 0.05
"""Relative changes whose interval reaches inside ±5% are within noise."""
LOSS_NOISE_POINTS = 0.1
"""Loss changes whose interval reaches inside ±0.1 percentage points are within noise."""
FLOOR_US = 1000.0
"""Changes of a time smaller than 1 ms are within noise: on a shared 2-core machine, repeats of one HTTP run at
2,000/s differed by 20 µs at p50 and 400 µs at p99 (+22%, +41%) with nothing changed but the machine's state."""


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
class Incomparable(ValueError):
    """Two runs that cannot be compared (not finished, another schedule or target kind): the one-line reason."""


@dataclass
class RunSample:
    """What a comparison needs of one finished run, read once from its folder."""

    run_id: str
    root: str
    target_kind: str
    pace: str
    scenario: str | None
    summary: dict
    window_ns: int
    windows: np.ndarray            # window_ns of the sending span
    scope: Scope                   # the whole run
    steps: list[tuple[dict, Scope]]
    left_out: int = 0              # windows of the sending span left out: telemetry incomplete (our outage)
    trim: tuple[float, float] = (0.0, 0.0)  # the run's --warmup and --cooldown (s), left out of every figure

    @classmethod
    def load(cls, root: str) -> RunSample:
        """The run in folder ``root``; ``Incomparable`` when it is not a finished run."""
        paths = RunPaths(root)
        try:
            summary = read_json(paths.summary_file)
        except (OSError, ValueError):
            raise Incomparable(f"run {_name(root)} is not finished (no summary.json in {root})") from None
        if summary.get("state") != "finished":
            raise Incomparable(f"run {_name(root)} is not finished ({summary.get('state')})")
        reader = RunReader(root)
        cfg = reader.settings()
        events = reader.partials("events")
        attack = summary.get("attack") or runinfo.attack_config(events)
        windows = pd.read_parquet(paths.windows_file)
        hists = reader.partials("hists")
        window_ns = int(cfg["window_ns"])
        sending = windows[windows[output.SENT] > 0]["window_ns"]
        if sending.empty:
            raise Incomparable(f"run {_name(root)} sent nothing")
        span = windows[(windows["window_ns"] >= sending.min()) & (windows["window_ns"] <= sending.max())]
        # a window that lost telemetry to flightwatch's own outage holds no figures of the SUT's: left out
        holes = (span[output.TELEMETRY_INCOMPLETE] > 0 if output.TELEMETRY_INCOMPLETE in span
                 else pd.Series(False, index=span.index))
        span = span[~holes]
        paced = runinfo.pace_steps(events)

        def inside(lo: int, hi: int) -> pd.DataFrame:  # a window wholly inside [lo, hi): one the schedule covers in
            # part (its first and last, a step's edges) holds part of a second, and would make a paced rate look noisy
            return span[(span["window_ns"] >= lo) & (span["window_ns"] + window_ns <= hi)]
        if paced:
            span = inside(paced[0]["start_ns"], paced[-1]["end_ns"])
        # the warm-up and cool-down the run set are left out of every figure compared
        measured = runinfo.measured_span(attack, paced, window_ns)
        span = span[runinfo.in_span(span["window_ns"], measured)]
        run_scope = _scope(span, hists, window_ns)
        steps = [(s, _scope(inside(s["start_ns"], s["end_ns"]), hists, window_ns)) for s in paced]
        if span.empty:
            raise Incomparable(f"run {_name(root)} has no window left once its warm-up and cool-down are left out")
        return cls(run_id=str(cfg.get("run_id", _name(root))), root=root, target_kind=runinfo.target_kind(attack),
                   pace=str(attack.get("pace", "")), scenario=attack.get("scenario"), summary=summary,
                   window_ns=window_ns, windows=span["window_ns"].to_numpy(np.int64), scope=run_scope, steps=steps,
                   left_out=int(holes.sum()),
                   trim=(measured["warmup_s"], measured["cooldown_s"]) if measured else (0.0, 0.0))

    @property
    def knee(self) -> float | None:
        knee = (self.summary.get("verdict") or {}).get("knee")
        return float(knee["rate"]) if knee else None


def _name(root: str) -> str:
    return root.rstrip("/").rsplit("/", 1)[-1]


def _scope(windows: pd.DataFrame, hists: pd.DataFrame, window_ns: int) -> Scope:
    col = lambda name: windows[name].to_numpy(np.float64) if name in windows else np.zeros(len(windows))  # noqa: E731
    scope = Scope(window_ns / 1e9, col(output.SENT), col(output.RECEIVED), col(output.DROPPED))
    row = pd.Series(np.arange(len(windows)), index=windows["window_ns"].to_numpy(np.int64))
    for name in (output.LATENCY, output.SEND_DELAY):
        h = hists[(hists["hist"] == name) & hists["window_ns"].isin(row.index)] if not hists.empty else hists
        scope.hists[name] = pd.DataFrame({"row": row.reindex(h["window_ns"]).to_numpy(np.int64) if len(h) else [],
                                          "bucket": h["bucket"].to_numpy(np.int64) if len(h) else [],
                                          "count": h["count"].to_numpy(np.float64) if len(h) else []})
    return scope


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


def judge(m: Metric, change: float | None, low: float | None, high: float | None, noise: float,
          baseline: float | None = None, floor_us: float = FLOOR_US) -> str:
    """regression, improvement or within noise: where the interval lies against ±noise (a time's: and against
    ±``floor_us`` of the baseline's value)."""
    if not m.judged or change is None:
        return "not judged"
    if low is None or high is None:
        return "no interval"
    floor = LOSS_NOISE_POINTS if m.points else max(noise, floor_us / baseline if m.timed and baseline else 0.0)
    worse_low, better_high = (low, high) if m.higher_is_worse else (-high, -low)
    if worse_low > floor:
        return "regression"
    if better_high < -floor:
        return "improvement"
    return f"within noise (±{max(abs(low), abs(high)) * (1 if m.points else 100):.{2 if m.points else 0}f}" \
           f"{' pt' if m.points else '%'})"


def compare_scopes(base: Scope, cand: Scope, block_s: float = BLOCK_S, reps: int = RESAMPLES, seed: int = 0,
                   noise: float = NOISE, knees: tuple[float | None, float | None] = (None, None),
                   floor_us: float = FLOOR_US) -> list[Change]:
    """Every metric of two scopes: figures, change, interval and verdict."""
    rng = np.random.default_rng(seed)
    bx, cx = figures(base), figures(cand)
    if base.n == 0 or cand.n == 0:
        return [Change(m, None, None, None) for m in METRICS]
    block = max(1, round(block_s / base.window_s))
    bb = figures(base, block_weights(base.n, block, reps, rng))
    cb = figures(cand, block_weights(cand.n, block, reps, rng))
    out = []
    for m in METRICS:
        if m.name == "knee":
            b, c = knees
        else:
            b, c = _finite(bx[m.name][0]), _finite(cx[m.name][0])
        ch, lo, hi = _change(m, b, c), None, None
        if m.judged and ch is not None:
            lo, hi = interval(ch, bb[m.name], cb[m.name], min(base.n, cand.n) / block, m.points)
        out.append(Change(m, b, c, ch, lo, hi, judge(m, ch, lo, hi, noise, b, floor_us)))
    return out


def _finite(x) -> float | None:
    return float(x) if x is not None and np.isfinite(x) else None


def compare(base: RunSample, cand: RunSample, block_s: float = BLOCK_S, reps: int = RESAMPLES, seed: int = 0,
            noise: float = NOISE, floor_us: float = FLOOR_US) -> dict:
    """The comparison of two runs, as ``compare.json`` holds it: settings, the whole run's changes, each step's,
    and the headline verdict. ``Incomparable`` when they are not the same test."""
    comparable(base, cand)
    whole = compare_scopes(base.scope, cand.scope, block_s, reps, seed, noise, (base.knee, cand.knee), floor_us)
    steps = []
    for i, ((bs, bscope), (_, cscope)) in enumerate(zip(base.steps, cand.steps)):
        if len(base.steps) > 1:
            steps.append({"step": i + 1, "rate": bs["rate"], "end_rate": bs["end_rate"],
                          "changes": [c.record() for c in compare_scopes(bscope, cscope, block_s, reps, seed + i + 1, noise,
                                                                                 floor_us=floor_us)
                                      if c.metric.name != "knee"]})
    return {"baseline": base.run_id, "candidate": cand.run_id, "target_kind": base.target_kind, "pace": base.pace,
            "level": LEVEL, "block_s": block_s, "resamples": reps, "noise": noise, "floor_us": floor_us,
            "loss_noise_points": LOSS_NOISE_POINTS,
            "windows": {"baseline": base.scope.n, "candidate": cand.scope.n},
            "windows_left_out": {"baseline": base.left_out, "candidate": cand.left_out},
            "trim": {"baseline": list(base.trim), "candidate": list(cand.trim)},
            "headline": headline(whole), "whole_run": [c.record() for c in whole], "steps": steps}


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
    lines = [f"compare: baseline {report['baseline']} -> candidate {report['candidate']} ({report['target_kind']}, pace "
             f"{report['pace']}; {report['level']:.0%} CI from a block bootstrap, {report['block_s']:g} s blocks, "
             f"{report['resamples']} resamples; within noise: ±{report['noise']:.0%}, times ±{report['floor_us'] / 1000:g} ms, "
             f"loss ±{report['loss_noise_points']} pt)",
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
