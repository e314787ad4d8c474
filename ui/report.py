"""report.html: a run (or a scenario run) as one self-contained file to hand on: no server, no network, Plotly's
script and every figure's data inline, as k6's exported dashboard, Gatling's and Locust's reports are.

    python -m ui.report RUN                       # checkpoints/RUN/report.html (RUN: an ID or a run's folder)
    python -m ui.report SCENARIO_RUN              # a scenario run's folder: every cell and the peers' rows
    flightwatch report RUN [--out FILE]

A run's report: the verdict with its evidence, the tiles, the ledger, the per-second charts the dashboard has (rates,
p50/p90/p99 from actual and intended send time, in flight, drops, late, node and flightwatch CPU; pace steps, gaps,
stalls and OOM kills marked), the latency distribution (HdrHistogram's percentile plot, log scale), the scalability
profile, the comparison with its baseline (the run's ``compare.json``), the settings, clock offsets, exemplars and
errors by cause. ``flightwatch attack --stream`` (``make attack``) writes it when the run has closed.
"""
from __future__ import annotations

import argparse
import html
import json
import os
import sys
import time

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio

from core import histogram, output
from core.rundir import CHECKPOINTS, RunPaths, is_run_folder
from ui import charts, data
from ui.reports import scenario_cells

REPORT_HTML = "report.html"
STATE_COLOURS = {"ok": "#1b7f3b", "degrading": "#b26a00", "observer-bound": "#6b4fa0", "loadgen-bound": "#6b4fa0",
                 "saturated": "#b3261e", "telemetry-incomplete": "#555555"}
CSS = """body{font-family:system-ui,sans-serif;margin:24px auto;max-width:1400px;color:#1d1d1f;padding:0 16px}
h1{font-size:1.5em;margin-bottom:4px}h2{font-size:1.15em;margin-top:28px;border-bottom:1px solid #ddd}
.banner{color:#fff;padding:10px 14px;border-radius:6px;margin:12px 0}.tiles{display:flex;flex-wrap:wrap;gap:10px}
.tile{border:1px solid #ddd;border-radius:6px;padding:8px 12px;min-width:120px}.tile b{display:block;font-size:1.3em}
table{border-collapse:collapse;font-size:.9em;margin:6px 0}td,th{border:1px solid #ddd;padding:3px 8px;text-align:right}
th{background:#f4f4f4}.muted{color:#666;font-size:.9em}pre{background:#f7f7f7;padding:8px;overflow-x:auto}"""


class Page:
    """The report's parts in order; Plotly's script goes inline once, with the first chart."""

    def __init__(self, title: str) -> None:
        self.title, self.parts, self.charts = title, [], 0

    def add(self, text: str) -> None:
        self.parts.append(text)

    def h2(self, text: str) -> None:
        self.add(f"<h2>{html.escape(text)}</h2>")

    def p(self, text: str, cls: str = "") -> None:
        self.add(f"<p class='{cls}'>{html.escape(text)}</p>")

    def table(self, frame: pd.DataFrame) -> None:
        if len(frame):
            self.add(frame.to_html(index=False, escape=True, border=0, na_rep=""))

    def chart(self, fig: go.Figure, name: str) -> None:
        self.add(pio.to_html(fig, include_plotlyjs=self.charts == 0, full_html=False, div_id=f"chart-{self.charts}",
                             config={"displaylogo": False, "toImageButtonOptions": {"filename": name}}))
        self.charts += 1

    def html(self) -> str:
        return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(self.title)}</title>"
                f"<style>{CSS}</style></head><body>{''.join(self.parts)}</body></html>")


def distribution(view: data.RunView, hists: pd.DataFrame) -> go.Figure:
    """The flight time's percentile plot, as HdrHistogram plots it: latency against 1/(1 - percentile) on a log
    axis, from the run's merged histogram (each bucket's highest value)."""
    fig = go.Figure()
    h = hists[hists["hist"] == output.LATENCY] if len(hists) else hists
    if len(h):
        counts = h.groupby("bucket")["count"].sum()
        counts = counts[counts > 0].sort_index()
        q = np.cumsum(counts.to_numpy()) / counts.sum()
        x = 1 / np.maximum(1 - q, 1e-7)
        y = histogram.bucket_high(counts.index.to_numpy()) / 1000
        fig.add_trace(go.Scatter(x=x, y=y, mode="lines", name="flight time", line=dict(width=2),
                                 hovertemplate="%{customdata}: %{y:.3f} ms<extra></extra>",
                                 customdata=[f"p{100 * v:.4g}" for v in q]))
    ticks = [1, 2, 10, 100, 1000, 10_000, 100_000]
    fig.update_xaxes(type="log", tickvals=ticks, ticktext=["0%", "50%", "90%", "99%", "99.9%", "99.99%", "99.999%"],
                     title_text="percentile")
    fig.update_yaxes(title_text="flight time (ms)", rangemode="tozero")
    fig.update_layout(height=420, margin=dict(l=60, r=20, t=30, b=40), showlegend=False)
    return fig


def _tiles(view: data.RunView) -> str:
    s, lat = view.summary, view.summary.get(output.LATENCY) or {}
    h = data.headline(view)
    tiles = [("sent", f"{s.get('sent', 0):,}"), ("received", f"{s.get('received', 0):,}"),
             ("loss", data.fmt_ratio(s.get("loss_ratio"))), ("rate (sent/s)", f"{h['rate']:,.0f}"),
             *[(p, data.fmt_us(lat.get(p))) for p in ("p50", "p90", "p99", "max")],
             ("errors", f"{s.get('errors', 0):,}"), ("gaps", f"{len(s.get('gaps') or [])}"),
             ("OOM kills", f"{s.get('oom_kills', 0)}"), ("elapsed", f"{h['elapsed_s']:,.0f} s")]
    return "<div class='tiles'>" + "".join(f"<div class='tile'>{html.escape(k)}<b>{html.escape(v)}</b></div>"
                                           for k, v in tiles) + "</div>"


def _banner(view: data.RunView) -> str:
    v = view.summary.get("verdict") or {}
    state = v.get("state") or view.summary.get("state", "")
    colour = STATE_COLOURS.get(state, "#555555")
    return f"<div class='banner' style='background:{colour}'>{html.escape(v.get('message') or state)}</div>"


def run_section(page: Page, view: data.RunView, hists: pd.DataFrame, head: str = "h1") -> None:
    """One run's report into ``page`` (a scenario's cells are each one)."""
    s = view.summary
    attack = view.config or {}
    page.add(f"<{head}>{html.escape(view.run_id)}</{head}>")
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(s["started_at_ns"] / 1e9)) if s.get("started_at_ns") else "-"
    page.p(f"{attack.get('target', '')} · {attack.get('pace') or attack.get('rate', '')} · started {started} · "
           f"{s.get('state', '')}", "muted")
    page.add(_banner(view))
    for note in data.integrity_notes(view):
        page.p(note)
    page.add(_tiles(view))
    page.h2("Ledger: every sent event in one bucket")
    led = s.get("ledger") or output.ledger(s)
    page.p(output.ledger_text(s) + (f"; beside it: duplicates {s.get('duplicates', 0):,}, orphan receives "
                                    f"{s.get('orphan_receives', 0):,}"))
    page.table(pd.DataFrame([{"bucket": k.replace("_", " "), "events": f"{n:,}"} for k, n in led.items()]))
    page.h2("Per second")
    page.chart(charts.timeline(view), f"flightwatch-{view.run_id}")
    page.h2("Flight time distribution")
    page.chart(distribution(view, hists), f"flightwatch-{view.run_id}-distribution")
    v = s.get("verdict") or {}
    if v.get("steps"):
        page.h2("Scalability profile (per pace step)")
        page.chart(charts.profile(v), f"flightwatch-{view.run_id}-profile")
        page.table(data.step_table(view))
    _comparison(page, view)
    page.h2("Settings, clocks and exemplars")
    page.table(pd.DataFrame([{"setting": k, "value": json.dumps(val) if isinstance(val, (dict, list)) else str(val)}
                             for k, val in {**(s.get("settings") or {}), **attack}.items()]))
    if s.get("clock_offsets"):
        page.table(data.clock_table(s["clock_offsets"]))
    if s.get("errors_by_cause"):
        page.table(pd.DataFrame([{"error": k, "count": n} for k, n in sorted(s["errors_by_cause"].items(),
                                                                               key=lambda kv: -kv[1])]))
    for kind, rows in (s.get("exemplars") or {}).items():  # the events behind the percentiles and the drops
        if rows:
            page.p(f"exemplars, {kind.replace('_', ' ')}: the events to look up in the system's logs", "muted")
            page.table(pd.DataFrame(rows).drop(columns=[c for c in ("at_ns", "sent_at_ns") if c in rows[0]]))
    page.add(f"<pre>{html.escape(data.vegeta_text(view))}</pre>")


def _comparison(page: Page, view: data.RunView) -> None:
    path = RunPaths(view.path).compare_file
    if not os.path.exists(path):
        return
    try:
        with open(path) as f:
            rep = json.load(f)
    except (OSError, ValueError):
        return
    page.h2(f"Against its baseline ({', '.join(rep['baseline']) if isinstance(rep.get('baseline'), list) else rep.get('baseline')})")
    page.p(data.banner(rep)[1])
    if "refused" not in rep:
        page.table(data.comparison_table(rep))


def run_report(path: str) -> str:
    """A run's report.html, as text."""
    from runs.reader import RunReader

    run = RunReader(path)
    view = data.load_run(path, run)
    page = Page(f"flightwatch: {data.run_name(path)}")
    if not view.ready:
        page.add(f"<h1>{html.escape(view.run_id)}</h1>")
        page.p(view.reason)
        return page.html()
    run_section(page, view, run.partials("hists"))
    page.p(f"written by flightwatch at {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())} from {path}", "muted")
    return page.html()


def scenario_report(folder: str) -> str:
    """A scenario run's report.html: its seed's chart and table, the peers' rows, then every cell's run."""
    from runs.reader import RunReader

    with open(os.path.join(folder, "report.json")) as f:
        doc = json.load(f)
    page = Page(f"flightwatch: {doc.get('run', os.path.basename(folder))}")
    page.add(f"<h1>{html.escape(doc.get('title', ''))}: {html.escape(doc.get('run', ''))}</h1>")
    page.p(" ".join(str(doc.get("method", "")).split()), "muted")
    draw = {"matrix": charts.scenario_matrix, "pairs": charts.scenario_pairs, "routing": charts.scenario_routing,
            "bursts": charts.scenario_bursts}.get(doc.get("kind"))
    if draw is not None and doc.get("cells"):
        page.chart(draw(doc), f"flightwatch-{doc.get('run')}")
    page.table(scenario_cells(doc))
    peers = [c["peer"] for c in doc.get("cells", []) if c.get("peer")]
    if peers:
        page.h2("Beside the broker's own tool")
        page.table(pd.json_normalize(peers))
    root = os.path.dirname(os.path.abspath(folder))
    for c in doc.get("cells", []):
        path = os.path.join(root, c.get("run_id") or "")
        if c.get("run_id") and os.path.isdir(path):
            run = RunReader(path)
            view = data.load_run(path, run)
            if view.ready:
                run_section(page, view, run.partials("hists"), head="h2")
    return page.html()


def write(target: str, out: str | None = None) -> tuple[str, int, float]:
    """report.html for a run or a scenario run (an ID under the checkpoints folder, or a folder): (its path, bytes,
    seconds it took)."""
    t0 = time.monotonic()
    folder = target if os.path.isdir(target) else os.path.join(CHECKPOINTS, target)
    if os.path.exists(os.path.join(folder, "report.json")) and not is_run_folder(folder):
        text = scenario_report(folder)
    elif is_run_folder(folder):
        text = run_report(folder)
    else:
        raise ValueError(f"no run or scenario run {target!r} (not a folder with run.json or report.json, nor one in "
                         f"{CHECKPOINTS})")
    path = out or os.path.join(folder, REPORT_HTML)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)
    return path, len(text.encode()), time.monotonic() - t0


def main(argv: list[str] | None = None) -> int:
    from core.cli import OneLineParser

    p = OneLineParser(prog="python -m ui.report", description=__doc__.split("\n\n")[0],
                      epilog=__doc__.split("\n\n")[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", help="the run (its ID or folder), or a scenario run's folder")
    p.add_argument("--out", help="where to write it (default: the run's folder, report.html)")
    try:
        a = p.parse_args(argv)
        path, size, took = write(a.run, a.out)
    except SystemExit as e:
        return 2 if e.code else 0
    except ValueError as e:
        print(f"report: error: {e}", file=sys.stderr)
        return 2
    print(f"report: {path} ({size / 1e6:.1f} MB, written in {took:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
