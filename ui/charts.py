"""Plotly figures of a run (no Streamlit, no I/O): one shared time axis, seconds since the run's start.

``timeline`` stacks the panels an operator reads together: throughput, latency, in flight and
losses, node CPU (and flightwatch's own share of it) and memory, network drops. OOM kills are dashed vertical lines across all
panels, gaps shaded intervals, pace steps dotted lines; each has a text label.
"""
from __future__ import annotations

import html

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from core.output import TELEMETRY_INCOMPLETE
from ui.data import RunView, node_series

COLORS = {"sent": "#1f77b4", "received": "#2ca02c", "errors": "#d62728", "p50": "#9467bd", "p90": "#8c564b",
          "p99": "#e377c2", "max": "#7f7f7f", "in_flight": "#ff7f0e", "dropped": "#d62728", "late": "#bcbd22"}
OOM_COLOR = "crimson"
PANELS = ("events/s", "latency (ms)", "in flight · drops · late", "node CPU · memory (%)", "network drops/s")


def _line(fig, x, y, name, row, color=None, dash=None, legendgroup=None, width=1.6, ids=None, ids_label=""):
    """A line; ``ids`` (a text per point): the events behind it, shown on hover (the window's exemplars)."""
    extra = {}
    if ids is not None:
        extra = dict(text=[html.escape(t) if t else "" for t in ids],
                     hovertemplate=f"%{{y:.4g}}<br>{ids_label}: %{{text}}<extra>{html.escape(name)}</extra>")
    fig.add_trace(go.Scatter(x=x, y=y, name=name, mode="lines+markers" if ids is not None else "lines",
                             marker=dict(size=3), line=dict(color=color, dash=dash, width=width),
                             legendgroup=legendgroup or name, connectgaps=False, **extra), row=row, col=1)


def _ms(series):
    return None if series is None else series / 1000.0


INCOMPLETE_COLOR = "#6a3d9a"


LEFT_OUT_COLOR = "#bbbbbb"


def _spans(window_ns, length_ns: int) -> list[tuple[int, int]]:
    """Consecutive windows as (start, end) spans."""
    out: list[tuple[int, int]] = []
    for t in sorted(int(x) for x in window_ns):
        if out and t <= out[-1][1]:
            out[-1] = (out[-1][0], t + length_ns)
        else:
            out.append((t, t + length_ns))
    return out


def left_out_spans(view: RunView) -> list[tuple[float, float, str]]:
    """The run's warm-up and cool-down as (start s, end s, name) on the time axis: greyed, as left out."""
    m = view.summary.get("measured")
    if not m or not view.steps:
        return []
    first, last = view.steps[0].start_s, view.steps[-1].end_s
    lo, hi = float(view.t(m["from_ns"])), float(view.t(m["to_ns"]))
    return [(a, b, what) for a, b, what in ((first, lo, "warm-up"), (hi, last, "cool-down")) if b > a]


def add_markers(fig: go.Figure, view: RunView) -> None:
    """OOM kills (dashed lines), gaps (shaded), windows flightwatch's own telemetry outage left incomplete (shaded
    apart: not the SUT's) and pace steps (dotted), across every panel."""
    w = view.windows
    if TELEMETRY_INCOMPLETE in w and len(w):
        lost = w.loc[w[TELEMETRY_INCOMPLETE].fillna(0) > 0, "window_ns"].to_numpy()
        for start, end in _spans(lost, view.window_ns):
            x0, x1 = view.t(start), view.t(end)
            fig.add_shape(type="rect", xref="x", yref="paper", x0=x0, x1=x1, y0=0, y1=1, fillcolor=INCOMPLETE_COLOR,
                          opacity=0.15, line_width=0, layer="below")
            fig.add_annotation(x=(x0 + x1) / 2, xref="x", yref="paper", y=0.95, yanchor="top",
                               text="telemetry incomplete", showarrow=False, font=dict(size=11, color=INCOMPLETE_COLOR),
                               hovertext="flightwatch's own telemetry lost records here (its broker restarted): "
                                         "not judged, not the SUT's")
    for x0, x1, what in left_out_spans(view):
        fig.add_shape(type="rect", xref="x", yref="paper", x0=x0, x1=x1, y0=0, y1=1, fillcolor=LEFT_OUT_COLOR,
                      opacity=0.35, line_width=0, layer="below")
        fig.add_annotation(x=(x0 + x1) / 2, xref="x", yref="paper", y=0.93, yanchor="top", text=what,
                           showarrow=False, font=dict(size=10, color="#777"),
                           hovertext=f"{what}: sent and counted, but left out of the latency figures and of "
                                     "`runs compare` (--warmup, --cooldown)")
    for g in view.gaps:
        x0, x1 = view.t(g["start_ns"]), view.t(g["end_ns"])
        fig.add_shape(type="rect", xref="x", yref="paper", x0=x0, x1=x1, y0=0, y1=1, fillcolor="#888", opacity=0.18,
                      line_width=0, layer="below")
        fig.add_annotation(x=(x0 + x1) / 2, xref="x", yref="paper", y=0.985, yanchor="top", text="gap",
                           showarrow=False, font=dict(size=11, color="#555"),
                           hovertext=f"{(g['end_ns'] - g['start_ns']) / 1e6:,.1f} ms without a delivery, "
                                     f"{g.get('in_flight', '?')} in flight at its start")
    for o in view.oom:
        x = view.t(o["at_ns"])
        fig.add_shape(type="line", xref="x", yref="paper", x0=x, x1=x, y0=0, y1=1,
                      line=dict(color=OOM_COLOR, dash="dash", width=1.5))
        victim = o.get("victim")
        fig.add_annotation(x=x, xref="x", yref="paper", y=1.0, yanchor="bottom",
                           text="OOM" + (f": {html.escape(victim)}" if victim else ""), showarrow=False,
                           font=dict(size=11, color=OOM_COLOR),
                           hovertext=html.escape(f"{o.get('source')}: {o.get('where')}" + (f", killed {victim}" if victim else "")))
    for st in view.steps[1:]:
        fig.add_shape(type="line", xref="x", yref="y domain", x0=st.start_s, x1=st.start_s, y0=0, y1=1,
                      line=dict(color="#999", dash="dot", width=1))
    for st in view.steps:
        fig.add_annotation(x=st.start_s, xref="x", yref="y domain", y=1.0, xanchor="left", yanchor="top",
                           text=f"step {st.index}: {st.label}", showarrow=False, font=dict(size=10, color="#666"))


def timeline(view: RunView, log_latency: bool = False, intended: bool = True, height: int = 1150) -> go.Figure:
    w = view.windows
    fig = make_subplots(rows=5, cols=1, shared_xaxes=True, vertical_spacing=0.035, subplot_titles=PANELS,
                        row_heights=[0.22, 0.26, 0.18, 0.18, 0.16])
    if w.empty:
        return fig
    x = view.t(w["window_ns"].to_numpy())
    # 1: throughput
    _line(fig, x, w["sent"], "sent/s", 1, COLORS["sent"])
    _line(fig, x, w["received"], "received/s", 1, COLORS["received"])
    _line(fig, x, w["errors"], "errors/s", 1, COLORS["errors"])
    # 2: latency, actual send time (solid) and intended (dotted: coordinated omission shows as the gap between them)
    for p in ("p50", "p90", "p99", "max"):
        col = f"latency_us_{p}"
        if col in w:
            slowest = w["slowest"] if p in ("p99", "max") and "slowest" in w else None
            _line(fig, x, _ms(w[col]), f"{p}", 2, COLORS[p], width=2.2 if p == "p99" else 1.4, ids=slowest, ids_label="slowest")
        icol = f"latency_intended_us_{p}"
        if intended and p in ("p50", "p99") and icol in w:
            _line(fig, x, _ms(w[icol]), f"{p} from intended", 2, COLORS[p], dash="dot")
    # 3: in flight, drops and late receives
    _line(fig, x, w["in_flight"], "in flight", 3, COLORS["in_flight"])
    _line(fig, x, w["dropped"], "dropped/s", 3, COLORS["dropped"], dash="dash",
          ids=w["first_dropped"] if "first_dropped" in w else None, ids_label="first dropped")
    _line(fig, x, w["late"], "late/s", 3, COLORS["late"], dash="dot")
    if "misrouted" in w and w["misrouted"].fillna(0).any():  # received where it was not sent: a routing fault
        _line(fig, x, w["misrouted"], "misrouted/s", 3, COLORS["errors"], dash="dashdot")
    # 4: node CPU and memory, per node
    cpu = node_series(w, "cpu_util")
    used, avail = node_series(w, "mem_used_bytes"), node_series(w, "mem_available_bytes")
    for node, s in cpu.items():
        _line(fig, x, s * 100, f"cpu {node}", 4)
    cores = node_series(w, "cpu_cores")
    for node, s in node_series(w, "observer_cpu").items():  # flightwatch's own share of the node, apart from the SUT's
        if node in cores:
            _line(fig, x, 100 * s / cores[node], f"flightwatch cpu {node}", 4, dash="dot")
    for node, s in used.items():
        if node in avail:
            _line(fig, x, 100 * s / (s + avail[node]), f"memory {node}", 4, dash="dash")
    # 5: network drops, per node
    rx, tx = node_series(w, "net_rx_drops_per_s"), node_series(w, "net_tx_drops_per_s")
    for node in sorted(set(rx) | set(tx)):
        total = rx.get(node, 0) + tx.get(node, 0)
        _line(fig, x, total if not np.isscalar(total) else np.full(len(x), total), f"net drops {node}", 5)
    add_markers(fig, view)
    fig.update_yaxes(type="log" if log_latency else "linear", row=2, col=1)
    fig.update_yaxes(rangemode="tozero", row=1, col=1)
    fig.update_yaxes(range=[0, 105], row=4, col=1)
    fig.update_xaxes(title_text="seconds since the run's start", row=5, col=1)
    fig.update_layout(height=height, margin=dict(l=60, r=20, t=50, b=40), uirevision=view.run_id,
                      legend=dict(orientation="h", yanchor="bottom", y=1.03, x=0), hovermode="x unified")
    return fig


def comparison(a: RunView, b: RunView, height: int = 650) -> go.Figure:
    """Two runs on the same axes (seconds since each run's start): throughput and p99."""
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=("events/s", "latency p99 (ms)"))
    for view, dash in ((a, None), (b, "dash")):
        w = view.windows
        if w.empty:
            continue
        x = view.t(w["window_ns"].to_numpy())
        _line(fig, x, w["sent"], f"{view.run_id} sent/s", 1, COLORS["sent"], dash)
        _line(fig, x, w["received"], f"{view.run_id} received/s", 1, COLORS["received"], dash)
        if "latency_us_p99" in w:
            _line(fig, x, _ms(w["latency_us_p99"]), f"{view.run_id} p99", 2, COLORS["p99"], dash)
    fig.update_xaxes(title_text="seconds since each run's start", row=2, col=1)
    fig.update_layout(height=height, margin=dict(l=60, r=20, t=50, b=40), legend=dict(orientation="h", y=1.08),
                      hovermode="x unified")
    return fig


PNG_CONFIG = {"displaylogo": False, "toImageButtonOptions": {"format": "png", "scale": 2}}


def png_config(name: str) -> dict:
    """Plotly's own 'download as PNG' button (rendered by the browser), named after the run."""
    return {**PNG_CONFIG, "toImageButtonOptions": {**PNG_CONFIG["toImageButtonOptions"], "filename": name.replace("/", "-")}}


def profile(verdict: dict, height: int = 420) -> go.Figure:
    """Scalability profile: achieved rates and p99 per offered rate (one point per pace step), the knee marked."""
    rows = verdict.get("steps") or []
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    x = [r["rate"] for r in rows]
    fig.add_trace(go.Scatter(x=x, y=[r["sent_per_s"] for r in rows], name="sent/s", mode="lines+markers",
                             line=dict(color=COLORS["sent"])))
    fig.add_trace(go.Scatter(x=x, y=[r["received_per_s"] for r in rows], name="received/s", mode="lines+markers",
                             line=dict(color=COLORS["received"])))
    fig.add_trace(go.Scatter(x=x, y=[(r["p99_us"] or 0) / 1000 for r in rows], name="p99 (ms)", mode="lines+markers",
                             line=dict(color=COLORS["p99"], dash="dot")), secondary_y=True)
    knee = verdict.get("knee")
    if knee:
        fig.add_shape(type="line", xref="x", yref="paper", x0=knee["rate"], x1=knee["rate"], y0=0, y1=1,
                      line=dict(color="#2ca02c", dash="dash"))
        fig.add_annotation(x=knee["rate"], xref="x", yref="paper", y=1.0, yanchor="bottom", text="knee", showarrow=False)
    fig.update_xaxes(title_text="offered rate (events/s)")
    fig.update_yaxes(title_text="events/s", secondary_y=False)
    fig.update_yaxes(title_text="p99 (ms)", secondary_y=True, type="log")
    fig.update_layout(height=height, margin=dict(l=60, r=60, t=40, b=40), legend=dict(orientation="h", y=1.12))
    return fig


def history(h: dict, height: int = 520) -> go.Figure:
    """A series' runs in order: p50 and p99 (ms) above, delivered throughput below; each change point a dashed
    line before the first run after it, labelled with the figure and the change."""
    runs = h["runs"]
    x = [r["run_id"] for r in runs]
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08, subplot_titles=("flight time (ms)", "delivered/s"))
    for name in ("p50", "p99"):
        _line(fig, x, [None if r[f"{name}_us"] is None else r[f"{name}_us"] / 1000 for r in runs], name, 1, COLORS[name])
    _line(fig, x, [r["delivered_per_s"] for r in runs], "delivered/s", 2, COLORS["received"])
    for c in h["change_points"]:
        fig.add_vline(x=c["index"] - 0.5, line=dict(color=OOM_COLOR, dash="dash", width=1.5))
        fig.add_annotation(x=c["index"] - 0.5, y=1.02, yref="paper", showarrow=False, font=dict(color=OOM_COLOR),
                           text=html.escape(f"{c['metric']} {c['change']:+.0%} from {c['first_run']}"))
    fig.update_xaxes(type="category")
    fig.update_layout(height=height, margin=dict(t=60, b=40, l=60, r=20), legend=dict(orientation="h"))
    return fig


def scenario_matrix(doc: dict, height: int = 480) -> go.Figure:
    """A matrix scenario's cells: the throughput ceiling (bars, above) and the flight p99 (below) against the row
    axis, one series per combination of the column axes (the Event Streams report's charts)."""
    rows, cols = doc["rows"], doc["columns"]
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.1,
                        subplot_titles=("throughput ceiling (/s)", "flight p99 (ms)"))
    series: dict[str, list[dict]] = {}
    for c in doc["cells"]:
        series.setdefault(", ".join(f"{a}={c['cell'].get(a)}" for a in cols) or "all", []).append(c)
    for name, cells in series.items():
        x = [str(c["cell"].get(rows)) for c in cells]
        fig.add_trace(go.Bar(x=x, y=[c.get("ceiling_per_s") for c in cells], name=name, legendgroup=name), row=1, col=1)
        fig.add_trace(go.Bar(x=x, y=[None if c.get("p99_us") is None else c["p99_us"] / 1000 for c in cells],
                             name=name, legendgroup=name, showlegend=False), row=2, col=1)
    fig.update_xaxes(type="category", title_text=rows, row=2, col=1)
    fig.update_layout(barmode="group", height=height, margin=dict(t=60, b=40, l=60, r=20), legend=dict(orientation="h"))
    return fig


def scenario_pairs(doc: dict, height: int = 420) -> go.Figure:
    """A pairs scenario's flight time against the number of pairs: pooled p50 and p99, and across the pairs the
    median pair's p99, the p99 of the pairs' p99s and the worst pair's (the Dispatch Router tests' chart)."""
    cells = [c for c in doc["cells"] if c.get("pairs")]
    x = [f"{c['cell']['pairs']:,}" for c in cells]
    fig = go.Figure()
    for name, get in (("p50", lambda c: c.get("p50_us")), ("p99", lambda c: c.get("p99_us")),
                      ("pairs' p99: median", lambda c: c["pairs"]["pair_p99_median_us"]),
                      ("pairs' p99: p99", lambda c: c["pairs"]["pair_p99_p99_us"]),
                      ("worst pair's p99", lambda c: c["pairs"]["worst_pair_p99_us"])):
        fig.add_trace(go.Scatter(x=x, y=[None if get(c) is None else get(c) / 1000 for c in cells], name=name,
                                 mode="lines+markers"))
    fig.update_xaxes(type="category", title_text="pairs")
    fig.update_yaxes(title_text="flight time (ms)", type="log")
    fig.update_layout(height=height, margin=dict(t=30, b=40, l=60, r=20), legend=dict(orientation="h"))
    return fig


def scenario_routing(doc: dict, height: int = 480) -> go.Figure:
    """A routing scenario against the number of bindings (log axis): the broker's CPU per message above, the flight
    time's p50 and p99 below (the RabbitMQ post's charts)."""
    cells = [c for c in doc["cells"] if not c.get("problem")]
    x = [c["cell"]["bindings"] for c in cells]
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.1,
                        subplot_titles=("broker CPU per message (µs)", "flight time (ms)"))
    _line(fig, x, [(c.get("broker") or {}).get("cpu_us_per_message") for c in cells], "broker CPU/message", 1,
          COLORS["received"])
    for name in ("p50", "p99"):
        _line(fig, x, [None if c.get(f"{name}_us") is None else c[f"{name}_us"] / 1000 for c in cells], name, 2,
              COLORS[name])
    fig.update_xaxes(type="log", title_text="bindings (queues)", row=2, col=1)
    fig.update_layout(height=height, margin=dict(t=60, b=40, l=60, r=20), legend=dict(orientation="h"))
    return fig


def scenario_bursts(doc: dict, height: int = 480) -> go.Figure:
    """A bursts scenario: the flight p99 of the sustained load and of each burst (above), and each receiver's
    throughput (below), a group of bars per cell (its number of receivers)."""
    fig = make_subplots(rows=2, cols=1, vertical_spacing=0.15,
                        subplot_titles=("flight p99 (ms): sustained, each burst", "throughput of each receiver (/s)"))
    for c in doc["cells"]:
        b = c.get("bursts")
        if not b:
            continue
        name = f"{c['cell'].get('receivers', '?')} receivers"
        labels = ["sustained"] + [f"burst {i}" for i in range(1, len(b["bursts"]) + 1)]
        p99 = [b["sustained"]["p99_us"]] + [x["p99_us"] for x in b["bursts"]]
        fig.add_trace(go.Bar(x=labels, y=[None if v is None else v / 1000 for v in p99], name=name, legendgroup=name),
                      row=1, col=1)
        agents = sorted(b["receivers"])
        fig.add_trace(go.Bar(x=agents, y=[b["receivers"][a]["per_s"] for a in agents], name=name, legendgroup=name,
                             showlegend=False), row=2, col=1)
    fig.update_layout(barmode="group", height=height, margin=dict(t=60, b=40, l=60, r=20), legend=dict(orientation="h"))
    return fig
