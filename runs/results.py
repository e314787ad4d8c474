"""A run's results: the window table, exact merged percentiles, the verdict and the summary, read from its folder
(``runs.reader``) and computed by ``runs.table``.

Each function takes a run folder or a ``RunReader`` of it (a reader kept for the run's life reads each file once).
Everything here works on a live run (the job still writing) and on a finished one.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from core import output
from core.output import Lifecycle
from core.units import duration_text
from runs import runinfo, table
from runs.reader import RunReader
from runs.table import percentile_figures


def load_windows(run: RunReader | str, encode_hdr: bool = True) -> pd.DataFrame:
    """The run's window table (``table.window_table``): one row per 1 s window from the first to the last with data.

    ``encode_hdr``: include each window's encoded HdrHistogram (``latency_hdr``; costly, the
    dashboard does without)."""
    run = RunReader.of(run)
    batches = run.batches()
    if batches.empty:
        return pd.DataFrame()
    return table.window_table(run.settings(), batches, run.partials("counts"), run.partials("hists"), run.partials("events"),
                              encode_hdr)


def merged_percentiles(run: RunReader | str, hist: str = output.LATENCY, start_ns: int | None = None, end_ns: int | None = None,
                       hists: pd.DataFrame | None = None) -> dict:
    """Exact (HDR-precision) percentiles over any time range, merged from the window histograms.

    ``hists``: the run's histogram partials when the caller has them already loaded.
    """
    h = RunReader.of(run).partials("hists") if hists is None else hists
    if h.empty:
        return percentile_figures(np.array([], np.int64), np.array([], np.int64))
    h = h[h["hist"] == hist]
    if start_ns is not None:
        h = h[h["window_ns"] >= start_ns]
    if end_ns is not None:
        h = h[h["window_ns"] < end_ns]
    return percentile_figures(h["bucket"].to_numpy(), h["count"].to_numpy())


def gap_records(events: pd.DataFrame) -> list[dict]:
    """The run's gaps (``runs.table.gaps``) as records: start and end ns, duration, events in flight."""
    return [{"start_ns": int(g.start_ns), "end_ns": int(g.end_ns), "duration_s": float(g.duration_s),
             "in_flight": int(g.in_flight)} for g in table.gaps(events).itertuples()]


def run_verdict(run: RunReader | str, windows: pd.DataFrame, events: pd.DataFrame, hists: pd.DataFrame | None = None,
                cfg: dict | None = None, percentiles=None, gaps: list[dict] | None = None) -> output.Verdict:
    """The saturation verdict and scalability profile (``runs.saturation``) with exact per-step figures.

    ``percentiles(lo, hi)``: latency percentiles over the windows in [lo, hi) (default: ``merged_percentiles``
    over the histogram partials, ``hists`` if given)."""
    from runs import saturation
    from runs import verdict as verdicts

    run = RunReader.of(run)
    cfg = run.settings() if cfg is None else cfg
    steps = runinfo.pace_steps(events)
    if percentiles is None:
        h = run.partials("hists") if hists is None else hists

        def percentiles(lo: int, hi: int) -> dict:
            return merged_percentiles(run, output.LATENCY, lo, hi, hists=h)
    counts = windows.set_index("window_ns")

    half = cfg["window_ns"] // 2

    def figures(lo: int, hi: int) -> dict:  # the windows whose middle lies in [lo, hi), as the detector assigns them
        lo, hi = lo - half, hi - half
        return {**saturation.step_counts(counts[(counts.index >= lo) & (counts.index < hi)]), output.LATENCY: percentiles(lo, hi)}
    outages = runinfo.records(events, "reset", ["at_ns", "reason"]) if not events.empty else []
    gaps = gap_records(events) if gaps is None else gaps
    return verdicts.verdict(windows, steps, cfg["window_ns"], figures,
                            cfg.get("latency_bound_us", saturation.DEFAULT_LATENCY_BOUND_US), outages=outages, gaps=gaps,
                            held=runinfo.telemetry_held(events),
                            ooms=runinfo.records(events, "oom", ["at_ns", "source", "where"]),
                            stopped=runinfo.receivers_stopped(events))


def live_verdict(run: RunReader | str) -> output.Verdict | None:
    """The verdict over the windows written so far (what the job publishes after each batch); None before data."""
    run = RunReader.of(run)
    windows = load_windows(run, encode_hdr=False)
    if windows.empty or output.SENT not in windows:
        return None
    return run_verdict(run, windows, run.partials("events"))


def summarize(run: RunReader | str, windows: pd.DataFrame | None = None) -> output.Summary:
    """Run-level figures: totals, exact run percentiles, errors by cause, gaps, OOM events."""
    run = RunReader.of(run)
    cfg = run.settings()
    windows = load_windows(run) if windows is None else windows
    batches = run.batches()
    if windows.empty:
        return {"run_id": cfg["run_id"], "state": Lifecycle.WAITING}
    total = {c: int(windows[c].sum()) for c in output.SUMMARY_TOTALS}
    incomplete = windows[windows[output.TELEMETRY_INCOMPLETE] > 0][output.WINDOW]
    errors = {c[len(output.ERRORS_BY_CAUSE):]: int(windows[c].sum()) for c in windows.columns if c.startswith(output.ERRORS_BY_CAUSE)}
    events = run.partials("events")
    gaps = gap_records(events)
    hists = run.partials("hists")
    ooms = runinfo.records(events, "oom", ["at_ns", "source", "where", "count", "victim"] if "victim" in events else
                    ["at_ns", "source", "where", "count"])
    by_source: dict[str, int] = {}
    for o in ooms:
        by_source[o["source"]] = by_source.get(o["source"], 0) + int(o["count"] or 1)
    total[output.OOM_KILLS] = output.oom_kills(by_source.values())
    starts = events[events["kind"] == "run_start"]["at_ns"] if not events.empty else []
    stops = events[events["kind"] == "run_stop"]["at_ns"] if not events.empty else []
    finished = bool(len(batches) and batches["finished"].any())
    attack = runinfo.attack_config(events)
    return {
        "run_id": cfg["run_id"],
        "state": Lifecycle.FINISHED if finished else Lifecycle.RUNNING,
        "attack": attack,
        "settings": {key[:-3]: duration_text(cfg[key]) for key in ("window_ns", "drop_timeout_ns", "watermark_delay_ns")},
        "started_at_ns": int(min(starts)) if len(starts) else None,
        "stopped_at_ns": int(max(stops)) if len(stops) else None,
        "stop_reasons": runinfo.records(events, "run_stop", ["at_ns", "agent", "reason"]),
        "aborted": bool(len(stops)) and any(str(r).startswith(("aborted", "failed"))
                                            for r in events.loc[events["kind"] == "run_stop", "reason"].dropna()),
        "num_windows": int(len(windows)),
        **total,
        "ledger": output.ledger(total),
        "loss_ratio": (total[output.DROPPED] / total[output.SENT]) if total[output.SENT] else None,
        "errors_by_cause": errors,
        "quarantined": int(batches["num_quarantined"].sum()) if len(batches) else 0,
        **{name: merged_percentiles(run, name, hists=hists)
           for name in output.HISTS},
        "measured": measured(runinfo.measured_span(attack, runinfo.pace_steps(events), cfg["window_ns"]), windows, hists),
        "exemplars": table.exemplar_records(events),
        # a silence inside a hole in the telemetry is not the SUT's gap
        "gaps": [g for g in gaps if not _overlaps(incomplete, g["start_ns"], g["end_ns"], cfg["window_ns"])],
        "oom_events": ooms,
        "oom_kills_by_source": by_source,
        "container_restarts": runinfo.records(events, "restart", ["at_ns", "where", "reason", "count"]),
        "clock_offsets": runinfo.clock_offsets(events, cfg.get("clock_correction", True)),
        "telemetry_lost": runinfo.telemetry_lost(events),
        "telemetry_held": runinfo.telemetry_held(events),  # flightwatch's own path to its broker, not the SUT
        # the telemetry broker lost its data: when, why, how many unread messages at least; windows that lost records
        "telemetry_reset": [dict(r, count=None if r["count"] is None else int(r["count"]))
                            for r in runinfo.records(events, "reset", ["at_ns", "where", "reason", "count"])],
        "windows_incomplete": int(len(incomplete)),
        "trustworthy_fraction": 1 - len(incomplete) / len(windows),
        # while live, the job's own verdict (one detector for the UI, the CLI and CI); at the end, recomputed here
        "verdict": (live if not finished and (live := run.verdict())
                    else run_verdict(run, windows, events, hists, cfg, gaps=gaps)),
        "watermark_ns": int(batches["watermark_ns"].max()) if len(batches) else None,
        "num_batches": int(len(batches)),
    }


def measured(span: dict | None, windows: pd.DataFrame, hists: pd.DataFrame) -> dict | None:
    """The run's figures over its measured span (``runs.runinfo.measured_span``: the schedule less its warm-up and
    cool-down): the span, its windows, the events sent and received in them, and the percentiles of every histogram.
    None for a run that left nothing out. The counts above it stay the whole run's: every event is accounted for."""
    if span is None:
        return None
    inside = windows[runinfo.in_span(windows[output.WINDOW], span)]
    return {**span, "num_windows": int(len(inside)), output.SENT: int(inside[output.SENT].sum()),
            output.RECEIVED: int(inside[output.RECEIVED].sum()),
            **{name: merged_percentiles(None, name, span["from_ns"], span["to_ns"], hists) for name in output.HISTS}}


def _overlaps(windows: pd.Series, start_ns: int, end_ns: int, window_ns: int) -> bool:
    """Whether [start_ns, end_ns) meets any of these windows."""
    w = windows.to_numpy()
    return bool(((w < end_ns) & (w + window_ns > start_ns)).any())
