"""What the dashboard shows, read from the run folders the streaming job writes (no Streamlit here).

Everything is a plain function of a run folder (``checkpoints/<run>/``): the window table, the summary, OOM
markers, gaps, pace steps. Nothing is read or connected at import. A run folder that is empty or half-written gives a
``RunView`` with ``ready = False`` and a reason, never an exception.
"""
from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from core import output
from core.rundir import RunPaths, is_run_folder
from runs import results, runinfo
from runs.reader import RunReader

NS = 1_000_000_000
LIVE_AFTER_S = 10.0
"""A run whose job wrote a batch within this many seconds, and is not finished, is live."""


@dataclass(frozen=True)
class RunInfo:
    run_id: str
    path: str
    updated_s: float      # wall time of the job's newest batch file
    finished: bool

    @property
    def live(self) -> bool:
        return not self.finished and time.time() - self.updated_s < LIVE_AFTER_S


def _newest_batch(path: str) -> tuple[int, float]:
    """(number of batch files, mtime of the newest) in a run folder's batches/."""
    d = RunPaths(path).batches
    try:
        names = [n for n in os.listdir(d) if n.startswith("batch-") and n.endswith(".json")]
    except OSError:
        return 0, 0.0
    if not names:
        return 0, 0.0
    return len(names), max(os.path.getmtime(os.path.join(d, n)) for n in names)


def version(path: str) -> tuple[int, float]:
    """Changes whenever the job writes a batch: a cache key for everything read from the folder."""
    return _newest_batch(path)


def run_name(path: str) -> str:
    """A run's name here: its folder's; a replay or recomputation in a run's folder is ``run/replay-drop10s``."""
    path = os.path.normpath(path)
    parent, name = os.path.split(path)
    return f"{os.path.basename(parent)}/{name}" if is_run_folder(parent) else name


def run_info(path: str) -> RunInfo:
    n, mtime = _newest_batch(path)
    paths = RunPaths(path)
    return RunInfo(run_name(path), path, mtime or os.path.getmtime(paths.run_file), os.path.exists(paths.summary_file))


def is_live(path: str) -> bool:
    return run_info(path).live


def folder_names(checkpoints: str) -> list[str]:
    """What a checkpoints folder holds (none if it is not there yet)."""
    try:
        return os.listdir(checkpoints)
    except OSError:
        return []


def list_runs(checkpoints: str) -> list[RunInfo]:
    """Runs in a checkpoints folder, and their replays and recomputations (``<run>/replay*``), newest first."""
    out = []
    for name in folder_names(checkpoints):
        path = os.path.join(checkpoints, name)
        if not is_run_folder(path):
            continue
        out.append(run_info(path))
        out += [run_info(os.path.join(path, sub)) for sub in sorted(os.listdir(path))
                if sub.startswith("replay") and is_run_folder(os.path.join(path, sub))]
    return sorted(out, key=lambda r: r.updated_s, reverse=True)


def default_run(runs: list[RunInfo]) -> RunInfo | None:
    """The live run if there is one, else the newest."""
    live = [r for r in runs if r.live]
    return (live or runs or [None])[0]


@dataclass
class PaceStep:
    index: int
    start_s: float
    end_s: float
    rate: float          # events/s at the step's start (a ramp's start rate)
    label: str


@dataclass
class RunView:
    run_id: str
    path: str
    ready: bool
    reason: str = ""
    windows: pd.DataFrame = field(default_factory=pd.DataFrame)
    summary: output.Summary = field(default_factory=dict)
    config: dict = field(default_factory=dict)
    t0_ns: int = 0                      # time axis origin: the run's start (its first window when unknown)
    window_ns: int = NS
    oom: list[dict] = field(default_factory=list)
    gaps: list[dict] = field(default_factory=list)
    steps: list[PaceStep] = field(default_factory=list)
    newest_written_ns: int | None = None
    finished: bool = False

    def t(self, at_ns) -> np.ndarray | float:
        """Seconds since the run's start."""
        return (np.asarray(at_ns, dtype=np.int64) - self.t0_ns) / NS if not np.isscalar(at_ns) else (at_ns - self.t0_ns) / NS


def step_bands(events: pd.DataFrame, t0_ns: int) -> list[PaceStep]:
    """The schedule's steps (``runinfo.pace_steps``: aligned to the schedule's exact start), in seconds since t0."""
    out = []
    for i, st in enumerate(runinfo.pace_steps(events)):
        r0, r1 = st["rate"], st["end_rate"]
        out.append(PaceStep(i + 1, (st["start_ns"] - t0_ns) / NS, (st["end_ns"] - t0_ns) / NS, r0,
                            f"{r0:,.0f}" + (f"→{r1:,.0f}" if r1 != r0 else "") + "/s"))
    return out


def load_run(path: str, run: RunReader | None = None) -> RunView:
    """Everything the dashboard shows about one run, as of now. ``run``: the run's reader, kept between refreshes
    so that each reads only the batches written since the last."""
    run_id = run_name(path)
    run = run or RunReader(path)
    try:
        cfg = run.settings()
    except (OSError, ValueError):
        return RunView(run_id, path, False, "waiting for data: the streaming job has not started this run yet")
    try:
        windows = results.load_windows(run, encode_hdr=False)
    except (OSError, ValueError, KeyError) as e:  # a batch being written right now: next refresh
        return RunView(run_id, path, False, f"waiting for data ({type(e).__name__} while the job writes)")
    if windows.empty or output.SENT not in windows:
        return RunView(run_id, path, False, "waiting for data: no telemetry for this run yet")
    events = run.partials("events")
    summary = results.summarize(run, windows)
    start_ns = summary.get("started_at_ns")
    window_ns = int(cfg["window_ns"])
    t0 = (start_ns // window_ns * window_ns) if start_ns is not None else int(windows["window_ns"].min())
    view = RunView(run_id, path, True, windows=windows, summary=summary, config=runinfo.attack_config(events), t0_ns=t0,
                   window_ns=window_ns, finished=summary.get("state") == output.Lifecycle.FINISHED)
    view.oom = summary.get("oom_events", [])
    view.gaps = summary.get("gaps", [])
    view.steps = step_bands(events, t0)
    if output.LAST_WRITTEN_NS in windows:
        lw = windows[output.LAST_WRITTEN_NS].dropna()
        view.newest_written_ns = int(lw.max()) if len(lw) else None
    return view


def node_series(windows: pd.DataFrame, metric: str) -> dict[str, pd.Series]:
    """Per node, one metric's values by window (columns ``output.node_column(node, metric)``)."""
    out = {}
    for c in windows.columns:
        if c.startswith(output.NODE) and c.endswith(":" + metric):
            out[c[len(output.NODE):-len(metric) - 1]] = windows[c]
    return out


def complete(view: RunView) -> pd.DataFrame:
    """The windows whose receive figures are final (the watermark has passed them)."""
    w = view.windows
    return w[w[output.RECEIVE_COMPLETE]] if output.RECEIVE_COMPLETE in w else w


_MARKDOWN_SPECIAL = re.compile(r"([\\`*_{}\[\]<>#~$|!&])")


def plain(text) -> str:
    """Text from telemetry (agent, node and run names, reasons) made inert for Streamlit's Markdown:
    the characters that start emphasis, links, images, HTML, entities, code or LaTeX are
    backslash-escaped and line breaks become spaces, so it shows as typed and runs nothing."""
    return _MARKDOWN_SPECIAL.sub(r"\\\1", " ".join(str(text).splitlines()))


def integrity_notes(view: RunView) -> list[str]:
    """What the operator must know before trusting the figures: telemetry an agent refused (its events count as
    dropped) or held (flightwatch's outage), a telemetry broker that lost its data, a run that did not end normally."""
    s = view.summary
    notes = [f"telemetry lost: {plain(agent)} refused {n:,} records (over its buffer budget while the telemetry broker "
             "was away); their events count as dropped" for agent, n in sorted((s.get("telemetry_lost") or {}).items())]
    for agent, h in sorted((s.get("telemetry_held") or {}).items()):
        notes.append(f"telemetry held: {plain(agent)}'s records waited up to {h['longest_s']:.1f} s on their way to the "
                     f"telemetry broker ({h['records']:,} records), then arrived: flightwatch's outage, not the SUT's")
    for r in s.get("telemetry_reset") or []:
        notes.append(f"telemetry broker lost its data ({plain(r.get('reason'))}): {s.get('windows_incomplete', 0)} windows "
                     f"are incomplete and not judged; {s.get('unaccounted', 0):,} sends are unaccounted, not counted as dropped")
    if s.get("aborted"):
        why = "; ".join(plain(r.get("reason")) for r in s.get("stop_reasons") or [] if r.get("reason"))
        notes.append(f"run {why or 'aborted'}")
    return notes


def headline(view: RunView, now_ns: int | None = None, run: RunReader | None = None) -> dict:
    """The tiles. While a run goes on: its current rates (the newest complete window), p99 over the last 5 s and
    over the run, loss, in flight, elapsed. Once it is finished: its own figures instead of its last seconds
    (rates over the seconds it sent in, p50 and p99 of the run); ``finished`` says which."""
    w = complete(view)
    w = w[w[output.SENT] > 0] if len(w) else w
    last = w.tail(5)
    s = view.summary
    end_ns = s.get("stopped_at_ns") if view.finished and s.get("stopped_at_ns") else (now_ns or time.time_ns())
    out = {"finished": view.finished, "p99_run_us": (s.get(output.LATENCY) or {}).get("p99"),
           "loss_ratio": s.get("loss_ratio"), "elapsed_s": max(0.0, (end_ns - view.t0_ns) / NS),
           "in_flight": int(view.windows[output.IN_FLIGHT].iloc[-1]) if len(view.windows) else 0}
    if view.finished:  # the run's own: a last, partial window is not its rate
        sending_s = len(w) * view.window_ns / NS
        return {**out, "rate": s.get("sent", 0) / sending_s if sending_s else 0.0,
                "received_rate": s.get("received", 0) / sending_s if sending_s else 0.0,
                "p50_run_us": (s.get(output.LATENCY) or {}).get("p50")}
    p99_recent = None
    if len(last):
        p99_recent = results.merged_percentiles(run or view.path, output.LATENCY, int(last[output.WINDOW].min()),
                                                int(last[output.WINDOW].max()) + view.window_ns)["p99"]
    return {**out, "rate": float(last[output.SENT].iloc[-1]) if len(last) else 0.0,
            "received_rate": float(last[output.RECEIVED].iloc[-1]) if len(last) else 0.0, "p99_recent_us": p99_recent}


def saturation(view: RunView) -> tuple[output.State, str] | None:
    """The saturation detector's verdict (``runs.saturation``, as in the run's summary) for the banner:
    (state, message), or None while all is well."""
    v = view.summary.get("verdict") or {}
    if not v.get("state"):
        return None
    state = output.State(v["state"])
    if state != output.State.OK:
        return state, v["message"]
    if v.get("telemetry_incomplete_windows") or v.get("stalls") or v.get("observer_bound_at"):
        # ok, with flightwatch's outage, a stall or a few windows where flightwatch itself was the limit named
        return state, v["message"]
    return None


def range_figures(view: RunView, start_s: float, end_s: float, run: RunReader | None = None) -> dict:
    """Exact figures over [start_s, end_s) of the run: counts summed, percentiles merged from the histograms."""
    lo, hi = view.t0_ns + int(start_s * NS), view.t0_ns + int(end_s * NS)
    w = view.windows[(view.windows["window_ns"] >= lo) & (view.windows["window_ns"] < hi)]
    out = {c: int(w[c].sum()) for c in output.TOTALS}
    out["seconds"] = (hi - lo) / NS
    out["loss_ratio"] = out[output.DROPPED] / out[output.SENT] if out[output.SENT] else None
    hists = (run or RunReader(view.path)).partials("hists")  # read once for the three histograms
    for h in output.HISTS:
        out[h] = results.merged_percentiles(view.path, h, lo, hi, hists=hists)
    return out


def until(view: RunView, t_s: float) -> RunView:
    """The run as it stood at t_s seconds (replay): windows up to then, markers up to then."""
    cut = view.t0_ns + int(t_s * NS)
    w = view.windows[view.windows["window_ns"] < cut]
    out = RunView(view.run_id, view.path, view.ready, windows=w, summary=view.summary, config=view.config, t0_ns=view.t0_ns,
                  window_ns=view.window_ns, steps=view.steps, finished=False)
    out.oom = [o for o in view.oom if o["at_ns"] < cut]
    out.gaps = [g for g in view.gaps if g["start_ns"] < cut]
    return out


def fmt_us(us) -> str:
    """A latency in µs, three significant figures (what the histograms resolve)."""
    if us is None or us != us:
        return "–"
    for scale, unit in ((1e6, "s"), (1e3, "ms"), (1.0, "µs")):
        if us >= scale or unit == "µs":
            v = us / scale
            return f"{v:.0f} {unit}" if v >= 100 else f"{v:.1f} {unit}" if v >= 10 else f"{v:.2f} {unit}"
    return "–"


def fmt_ratio(r) -> str:
    return "–" if r is None or r != r else f"{r:.2%}"


def vegeta_text(view: RunView) -> str:
    """The run's flight-time figures in the layout of vegeta's text report."""
    s = view.summary
    lat = s.get("latency_us") or {}
    lat_i = s.get("latency_intended_us") or {}
    dur = max((s.get("stopped_at_ns") or 0) - (s.get("started_at_ns") or 0), 0) / NS
    sent, recv = s.get("sent", 0), s.get("received", 0)
    lines = [
        f"Requests      [total, rate]                     {sent}, {sent / dur if dur else 0:.2f}",
        f"Duration      [sending]                         {dur:.3f}s",
        f"Latencies     [p50, p90, p99, max]              {', '.join(fmt_us(lat.get(k)) for k in ('p50', 'p90', 'p99', 'max'))}",
        f"  intended    [p50, p90, p99, max]              {', '.join(fmt_us(lat_i.get(k)) for k in ('p50', 'p90', 'p99', 'max'))}",
        f"Delivered     [received, ratio]                 {recv}, {recv / sent if sent else 0:.4%}",
        f"Lost          [dropped, late, duplicates]       {s.get('dropped', 0)}, {s.get('late', 0)}, {s.get('duplicates', 0)}",
        f"Errors        [total]                           {s.get('errors', 0)}",
        f"Ledger        [every sent event once]           {output.ledger_text(s)}",
        f"Gaps          [count, seconds]                  {len(s.get('gaps', []))}, {sum(g['duration_s'] for g in s.get('gaps', [])):.1f}",
        f"OOM kills     [total]                           {s.get('oom_kills', 0)}",
        f"Quarantined   [records]                         {s.get('quarantined', 0)}",
    ]
    errs = s.get("errors_by_cause") or {}
    if errs:
        lines.append("Error Set:")
        lines += [f"{cause}: {n}" for cause, n in sorted(errs.items(), key=lambda kv: -kv[1])]
    return "\n".join(lines)


def step_table(view: RunView) -> pd.DataFrame:
    """Per pace step, the saturation verdict's profile (exact figures): achieved rates, success, p50/p99, state."""
    rows = (view.summary.get("verdict") or {}).get("steps") or []
    return pd.DataFrame([{"step": r["step"], "pace": st.label, "from_s": st.start_s, "to_s": st.end_s,
                          "sent_per_s": r["sent_per_s"], "received_per_s": r["received_per_s"],
                          "success": r["success_ratio"], "p50_ms": _ms(r["p50_us"]), "p99_ms": _ms(r["p99_us"]),
                          "state": r["state"]} for r, st in zip(rows, view.steps)])


def _ms(us):
    return None if us is None else us / 1000


def clock_table(clocks: list[dict]) -> pd.DataFrame:
    return pd.DataFrame([{"agent": c["agent"], "offset_ms": c["offset_us"] / 1000, "± ms": c["rtt_us"] / 2000,
                          "max |offset| ms": c["max_abs_offset_us"] / 1000, "samples": c["samples"], "stamps":
                          "corrected" if c.get("corrected") else "raw, beyond ±1 ms" if c["flagged"] else "raw"} for c in clocks])


def hlog_path(view: RunView) -> str | None:
    p = RunPaths(view.path).latency_log()
    return p if os.path.exists(p) else None


def windows_csv(view: RunView) -> bytes:
    w = view.windows.copy()
    w.insert(1, "t_s", view.t(w["window_ns"].to_numpy()))
    return w.to_csv(index=False).encode()


def summary_json(view: RunView) -> bytes:
    return json.dumps(view.summary, indent=1, default=lambda o: o.item() if hasattr(o, "item") else str(o)).encode()


def comparison(baseline_path: str, candidate_path: str) -> dict:
    """The comparison of a run with a baseline (``runs.compare``): its report, or ``{"refused": reason}`` when the
    two are not the same test or one is not finished."""
    from runs import compare

    try:
        return compare.compare(compare.RunSample.load(baseline_path), compare.RunSample.load(candidate_path))
    except compare.Incomparable as e:
        return {"refused": str(e)}


def banner(report: dict) -> tuple[str, str]:
    """(kind, text) of a comparison's banner: error for a regression, success for an improvement, info otherwise."""
    if "refused" in report:
        return "warning", f"not compared: {report['refused']}"
    h = report["headline"]
    kind = "error" if h.startswith("regression") else "success" if h.startswith("improvement") else "info"
    return kind, f"{h} (candidate {report['candidate']} against baseline {report['baseline']})"


def comparison_table(report: dict) -> pd.DataFrame:
    """The whole run's and each step's changes, one row each."""
    from runs.compare import BY_NAME, signed

    rows = []
    for scope, changes in [("whole run", report["whole_run"])] + [
            (f"step {s['step']} ({s['rate']:,.0f}/s)", s["changes"]) for s in report["steps"]]:
        for r in changes:
            m = BY_NAME[r["metric"]]
            rows.append({"scope": scope, "figure": r["label"], "baseline": r["baseline"], "candidate": r["candidate"],
                         "change": signed(r["change"], m) if r["change"] is not None else "",
                         "95% CI": f"{signed(r['ci_low'], m)} … {signed(r['ci_high'], m)}" if r["ci_low"] is not None else "",
                         "verdict": r["verdict"]})
    return pd.DataFrame(rows)


def history_table(h: dict) -> pd.DataFrame:
    """A series' runs, oldest first, with the change points marked on the first run after each."""
    marks: dict[int, list[str]] = {}
    for c in h["change_points"]:
        marks.setdefault(c["index"], []).append(f"{c['metric']} {c['change']:+.0%}")
    return pd.DataFrame([{"run": r["run_id"], "label": r.get("label") or "", "p50_ms": _ms(r["p50_us"]),
                          "p99_ms": _ms(r["p99_us"]),
                          "delivered_per_s": r["delivered_per_s"], "change point": ", ".join(marks.get(i, []))}
                         for i, r in enumerate(h["runs"])])
