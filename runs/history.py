"""A scenario's history: its finished runs in time order, their p50, p99 and throughput, and the change points.

    >>> h = history("checkout-kafka")              # runs started with --scenario checkout-kafka
    >>> [(c["metric"], c["first_run"]) for c in h["change_points"]]
    [('p99', 'attack-20261126-101500')]

Runs belong to the series of their ``--scenario`` name; a run without one belongs to the series of its target kind
and schedule (``kafka 5000:60``). A change point is found per figure by PELT (``ruptures``) on the figures'
logarithms, with a penalty scaled by the run-to-run noise estimated from the series itself; PELT won the
measurement in ``bench.changepoints``. A change point needs two runs after it: one bad run is an outlier until the
next run confirms it (``runs compare`` judges a single run against its baseline).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from core.rundir import CHECKPOINTS, RunPaths
from runs.reader import RunReader, read_json

FIGURES = ("p50", "p99", "delivered")
PENALTY = 4.0
"""Penalty per change point, in units of the noise's variance times ln(runs) (measured: ``bench.changepoints``)."""
MIN_RUNS = 2
"""Runs a segment needs: a change point has at least this many runs on each side."""


@dataclass(frozen=True)
class RunPoint:
    """One finished run of a series: when it started and its whole-run figures."""

    run_id: str
    series: str
    started_at_ns: int
    p50_us: float | None
    p99_us: float | None
    delivered_per_s: float | None

    def figure(self, name: str) -> float | None:
        return {"p50": self.p50_us, "p99": self.p99_us, "delivered": self.delivered_per_s}[name]


def series_name(attack: dict) -> str:
    """A run's series: its ``--scenario``, else its target kind and schedule."""
    from runs.runinfo import target_kind

    if attack.get("scenario"):
        return str(attack["scenario"])
    return f"{target_kind(attack)} {attack.get('pace', '?')}"


def run_point(root: str) -> RunPoint | None:
    """A finished run's point (None for a run that is not finished or sent nothing)."""
    from runs import runinfo

    try:
        summary = read_json(RunPaths(root).summary_file)
    except (OSError, ValueError):
        return None
    if summary.get("state") != "finished" or not summary.get("sent"):
        return None
    attack = summary.get("attack")
    if attack is None:  # a run closed before summaries kept the attack's configuration
        attack = runinfo.attack_config(RunReader(root).partials("events"))
    seconds = _schedule_s(attack) or summary.get("num_windows") or 0
    lat = summary.get("latency_us") or {}
    return RunPoint(run_id=summary["run_id"], series=series_name(attack),
                    started_at_ns=int(summary.get("started_at_ns") or os.stat(root).st_mtime_ns),
                    p50_us=lat.get("p50"), p99_us=lat.get("p99"),
                    delivered_per_s=summary["received"] / seconds if seconds else None)


def _schedule_s(attack: dict) -> float | None:
    """The schedule's length in seconds, from its steps or its pace text (None if neither is known)."""
    from core.pacer import Schedule

    steps = attack.get("steps") or []
    if steps:
        return (steps[-1]["end_ns"] - steps[0]["start_ns"]) / 1e9
    try:
        return Schedule.parse(str(attack["pace"])).duration_ns / 1e9 if attack.get("pace") else None
    except ValueError:
        return None


def points(checkpoints: str | None = None) -> list[RunPoint]:
    """Every finished run under ``checkpoints`` (``CHECKPOINTS``), oldest first."""
    folder = checkpoints or CHECKPOINTS
    out = []
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        p = run_point(os.path.join(folder, name))
        if p is not None:
            out.append(p)
    return sorted(out, key=lambda p: p.started_at_ns)


def noise(log_values: np.ndarray) -> float:
    """The run-to-run noise (sd) of a series of log figures, robust to its change points: the median absolute
    difference of consecutive runs, scaled to a normal's sd."""
    d = np.diff(np.asarray(log_values, float))
    return float(np.median(np.abs(d)) * 1.4826 / np.sqrt(2)) if len(d) else 0.0


def change_points(values) -> list[int]:
    """Indices of the first run after each change point in a series of positive figures."""
    import ruptures as rpt

    x = np.log(np.asarray(values, float))
    if len(x) < 2 * MIN_RUNS or not np.isfinite(x).all():
        return []
    sd = max(noise(x), 0.01)  # a series quieter than 1% is not told apart from exact repeats
    algo = rpt.Pelt(model="l2", min_size=MIN_RUNS, jump=1).fit(x.reshape(-1, 1))
    return [int(b) for b in algo.predict(pen=PENALTY * sd ** 2 * np.log(len(x)))[:-1]]


def history(name: str, checkpoints: str | None = None, everything: list[RunPoint] | None = None) -> dict:
    """The series ``name``: its runs (oldest first) and, per figure, its change points (the first run after each,
    with the medians before and after it). ``LookupError`` with the known series when there is no such series.
    ``everything``: the finished runs' points when the caller has read them already (``points``)."""
    everything = points(checkpoints) if everything is None else everything
    runs = [p for p in everything if p.series == name]
    if not runs:
        known = sorted({p.series for p in everything})
        raise LookupError(f"no finished runs in series {name!r}" + (f" (series: {', '.join(known)})" if known else
                                                                    f" (no finished runs in {checkpoints or CHECKPOINTS})"))
    found = []
    for fig in FIGURES:
        vals = [r.figure(fig) for r in runs]
        if any(v is None or v <= 0 for v in vals):
            continue
        cps = change_points(vals)
        edges = [0, *cps, len(vals)]
        for k, i in enumerate(cps):
            before, after = np.median(vals[edges[k]:i]), np.median(vals[i:edges[k + 2]])
            found.append({"metric": fig, "index": i, "first_run": runs[i].run_id, "before": float(before),
                          "after": float(after), "change": float(after / before - 1)})
    return {"series": name, "runs": [r.__dict__ for r in runs], "change_points": found}


def series_list(checkpoints: str | None = None, everything: list[RunPoint] | None = None) -> dict[str, int]:
    """Every series with finished runs, and how many (``everything``: the points, if read already)."""
    out: dict[str, int] = {}
    for p in points(checkpoints) if everything is None else everything:
        out[p.series] = out.get(p.series, 0) + 1
    return out


def text(h: dict) -> str:
    lines = [f"series {h['series']}: {len(h['runs'])} finished runs, oldest first", "",
             f"{'run':<34} {'p50':>10} {'p99':>10} {'delivered/s':>12}"]
    for i, r in enumerate(h["runs"]):
        cp = [c for c in h["change_points"] if c["index"] == i]
        note = "  <- change: " + ", ".join(f"{c['metric']} {c['change']:+.0%}" for c in cp) if cp else ""
        lines.append(f"{r['run_id']:<34} {_ms(r['p50_us']):>10} {_ms(r['p99_us']):>10} "
                     f"{r['delivered_per_s'] or 0:>12,.1f}{note}")
    lines.append("")
    if not h["change_points"]:
        lines.append("no change points" + (" (a change point needs two runs on each side)"
                                           if len(h["runs"]) < 2 * MIN_RUNS else ""))
    for c in h["change_points"]:
        lines.append(f"change point: {c['metric']} {c['change']:+.0%} from run {c['first_run']} "
                     f"(median {_fig(c['before'], c['metric'])} -> {_fig(c['after'], c['metric'])})")
    return "\n".join(lines) + "\n"


def _ms(us) -> str:
    return "-" if us is None else f"{us / 1000:.2f} ms"


def _fig(v: float, metric: str) -> str:
    return f"{v:,.1f}/s" if metric == "delivered" else _ms(v)
