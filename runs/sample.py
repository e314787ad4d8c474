"""One finished run as a comparison reads it (``runs.compare``): its windows inside the schedule, less the warm-up,
the cool-down and any window whose telemetry flightwatch lost, as a bootstrap ``Scope``, whole and per pace step."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from core import output
from core.output import Lifecycle
from core.rundir import RunPaths
from runs import runinfo
from runs.bootstrap import Scope
from runs.reader import RunReader, read_json


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
        if summary.get("state") != Lifecycle.FINISHED:
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
