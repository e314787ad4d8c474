"""flightwatch dashboard (Streamlit): a load test's flight-time telemetry, live and after the run.

    streamlit run ui/app.py --server.address 127.0.0.1 -- [--checkpoints DIR]      (or: make ui)

Layout only: the figures come from ``ui.data`` (reads the run folders the streaming job
writes) and the charts from ``ui.charts``. Live runs refresh every second inside a fragment
(no page reload); finished runs get the time-range, summary, replay, comparison and export
sections.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import streamlit as st  # noqa: E402

from core import settings  # noqa: E402
from core.output import State  # noqa: E402
from runs.reader import RunReader  # noqa: E402
from ui import charts, data, reports  # noqa: E402

REFRESH_S = 1.0


def checkpoints_dir() -> str:
    ap = argparse.ArgumentParser(prog="ui/app.py", add_help=False)
    settings.add(ap, "FLIGHTWATCH_CHECKPOINTS", "--checkpoints", default=os.path.join(ROOT, "checkpoints"))
    args, _ = ap.parse_known_args(sys.argv[1:])
    return args.checkpoints


@st.cache_resource(max_entries=4, show_spinner=False)
def reader(path: str) -> RunReader:
    """One reader per run (the few last viewed: each holds its run's partials) for the server's life: a refresh
    reads only the batches written since the last."""
    return RunReader(path)


@st.cache_data(max_entries=16, show_spinner=False)
def cached_run(path: str, version: tuple) -> data.RunView:
    return data.load_run(path, reader(path))


@st.cache_data(max_entries=8, show_spinner="comparing (block bootstrap) ...")
def cached_comparison(baseline: str, candidate: str, v1: tuple, v2: tuple) -> dict:
    return data.comparison(baseline, candidate)


def history_view(folder: str) -> None:
    """A scenario's finished runs in order, with the change points of p50, p99 and throughput."""
    from runs import history

    everything = history.points(folder)  # every finished run's summary, read once for the list and the series
    series = history.series_list(folder, everything)
    st.subheader("Scenario history")
    if not series:
        st.info("no finished runs yet: a series is the runs of one --scenario (or of one target kind and schedule)")
        return
    name = st.selectbox("series", sorted(series), format_func=lambda s: f"{s}  ({series[s]} runs)", key="series")
    h = history.history(name, folder, everything)
    for c in h["change_points"]:
        (st.warning if c["worse"] else st.success)(f"change point: {history.change_text(c)}, "
                                                   f"{history.p_text(c['p_value'])}")
    if not h["change_points"]:
        st.info("no significant change" + (" (a change needs two runs on each side)" if len(h["runs"]) < 4 else ""))
    for r in h["left_out"]:
        st.caption(f"left out: {r['run_id']}, another test: {'; '.join(r['differs'])}")
    st.caption(f"rule: {h['rule']}")
    st.plotly_chart(charts.history(h), key="history", width="stretch", config=charts.png_config("flightwatch-history"))
    st.dataframe(data.history_table(h), hide_index=True)


def scenarios_view(folder: str) -> None:
    """The scenario reports (``make scenario``), newest first: the report's tables and its chart, each cell's run."""
    docs = reports.list_scenario_reports(folder)
    st.subheader("Scenario reports")
    if not docs:
        st.info("no scenario reports yet: `make scenario NAME=kafka-matrix` (`python -m scenarios list`)")
        return
    label = {d["run"]: f"{d['run']}  ({'finished' if d.get('finished') else 'running'}; "
                       f"{len(d.get('cells', []))} cells)" for d in docs}
    if st.session_state.get("scenario-report") not in label:  # a link to a scenario run that is not here
        if "scenario-report" in st.session_state:
            st.warning(f"the link names scenario={st.session_state['scenario-report']}: no such scenario run in {folder}")
        st.session_state["scenario-report"] = next(iter(label))
    chosen = st.selectbox("report", list(label), format_func=label.get, key="scenario-report")
    keep_in_link(scenario=chosen)
    doc = next(d for d in docs if d["run"] == chosen)
    draw = {"matrix": charts.scenario_matrix, "pairs": charts.scenario_pairs,
            "routing": charts.scenario_routing, "bursts": charts.scenario_bursts}.get(doc.get("kind"))
    if draw is not None and doc.get("cells"):
        st.plotly_chart(draw(doc), key=f"scenario-{chosen}", width="stretch",
                        config=charts.png_config(f"flightwatch-{chosen}"))
    st.dataframe(reports.scenario_cells(doc), hide_index=True)
    with st.expander("report.md", expanded=False):
        st.code(doc["markdown"], language="markdown")


def current(path: str) -> data.RunView:
    return cached_run(path, data.version(path))


def tiles(view: data.RunView, live: bool) -> None:
    h = data.headline(view, run=reader(view.path))
    cols = st.columns(7)
    if h["finished"]:  # the run's own figures, not its last seconds
        cols[0].metric("rate (run, sent/s)", f"{h['rate']:,.0f}")
        cols[1].metric("received/s (run)", f"{h['received_rate']:,.0f}")
        cols[2].metric("p50 (run)", data.fmt_us(h["p50_run_us"]))
    else:
        cols[0].metric("rate (sent/s)", f"{h['rate']:,.0f}")
        cols[1].metric("received/s", f"{h['received_rate']:,.0f}")
        cols[2].metric("p99 (last 5 s)", data.fmt_us(h["p99_recent_us"]))
    cols[3].metric("p99 (run)", data.fmt_us(h["p99_run_us"]))
    cols[4].metric("loss", data.fmt_ratio(h["loss_ratio"]))
    cols[5].metric("in flight", f"{h['in_flight']:,}")
    cols[6].metric("elapsed", f"{h['elapsed_s']:,.0f} s")


def freshness_line(view: data.RunView, live: bool) -> str:
    state = "LIVE" if live else view.summary.get("state", "")
    w = view.windows
    newest = ""
    if "first_written_ns" in w and w["first_written_ns"].notna().any():
        last = w[w["first_written_ns"].notna()].iloc[-1]
        newest = (f" · newest figures: window t=+{view.t(int(last['window_ns'])):.0f} s, written "
                  f"{time.strftime('%H:%M:%S', time.localtime(last['last_written_ns'] / 1e9))}")
    return f"{state} · run {view.run_id}{newest} · shown {time.strftime('%H:%M:%S')}"


def live_view(view: data.RunView, live: bool, log_latency: bool) -> None:
    """Banner, tiles, the timeline: what refreshes every second."""
    if not view.ready:
        st.info(view.reason)
        return
    banner = data.saturation(view)
    if banner:
        state, message = banner
        show = st.error if state == State.SATURATED else st.info if state == State.OK else st.warning
        show(data.plain(message) if state == State.OK else f"{state.upper()}: {data.plain(message)}")
    for note in data.integrity_notes(view):
        st.warning(note)
    tiles(view, live)
    st.caption(freshness_line(view, live))
    st.plotly_chart(charts.timeline(view, log_latency), key=f"timeline-{view.run_id}", width="stretch",
                    config=charts.png_config(f"flightwatch-{view.run_id}"))


def after_run(view: data.RunView, runs: list[data.RunInfo]) -> None:
    """Time range with exact percentiles, summary, steps, comparison, exports."""
    w = view.windows
    end_s = float(view.t(int(w["window_ns"].max())) + view.window_ns / 1e9)
    st.subheader("Time range")
    m = view.summary.get("measured")  # a run with a warm-up or cool-down opens on its measured span
    top = max(end_s, 1.0)
    start = (min(max(float(view.t(m["from_ns"])), 0.0), top), min(float(view.t(m["to_ns"])), top)) if m else (0.0, top)
    lo, hi = st.slider("seconds since the run's start", 0.0, top, start, step=1.0,
                       key=f"range-{view.run_id}")
    f = data.range_figures(view, lo, hi, reader(view.path))
    cols = st.columns(6)
    cols[0].metric("sent", f"{f['sent']:,}")
    cols[1].metric("received", f"{f['received']:,}")
    cols[2].metric("loss", data.fmt_ratio(f["loss_ratio"]))
    cols[3].metric("p50", data.fmt_us(f["latency_us"]["p50"]))
    cols[4].metric("p99", data.fmt_us(f["latency_us"]["p99"]))
    cols[5].metric("max", data.fmt_us(f["latency_us"]["max"]))
    st.caption("Percentiles over the range are exact (merged from the window histograms), not averages of window percentiles.")
    st.subheader("Summary")
    st.code(data.vegeta_text(view), language=None)
    clocks = view.summary.get("clock_offsets") or []
    if clocks:
        st.caption("Clock offsets per agent against the reference (reference − agent, known to ± round trip / 2). A "
                   "latency measured across two hosts is off by the difference of their offsets: the job corrects each "
                   "stamp by its agent's offset when it is beyond its error (raw with --no-clock-correction).")
        st.dataframe(data.clock_table(clocks), hide_index=True)
    steps = data.step_table(view)
    if len(steps):
        st.subheader("Scalability profile (per pace step)")
        v = view.summary.get("verdict") or {}
        knee = v.get("knee")
        st.caption(f"knee: {knee['rate']:,.0f}/s (p99 {data.fmt_us(knee['p99_us'])}, under {data.fmt_us(v.get('latency_bound_us'))})"
                   if knee else "knee: none found (no step delivered ≥ 99% under the latency bound)")
        if v.get("steps"):
            st.plotly_chart(charts.profile(v), key="profile", width="stretch", config=charts.png_config(f"flightwatch-{view.run_id}-profile"))
        st.dataframe(steps, hide_index=True)
    others = [r.run_id for r in runs if r.run_id != view.run_id]
    if st.session_state.get("compare") not in ["(none)"] + others:  # a link's baseline that is this run itself
        st.session_state["compare"] = "(none)"
    other = st.selectbox("compare with", ["(none)"] + others, key="compare")
    keep_in_link(compare=None if other == "(none)" else other)
    if other != "(none)":
        other_path = next(r.path for r in runs if r.run_id == other)
        ov = current(other_path)
        if ov.ready:
            report = cached_comparison(other_path, view.path, data.version(other_path), data.version(view.path))
            kind, text = data.banner(report)
            getattr(st, kind)(text)  # this run is the candidate, the chosen one its baseline
            if "refused" not in report:
                with st.expander("every figure, for the whole run and each step, with its 95% interval"):
                    st.dataframe(data.comparison_table(report), hide_index=True)
            st.plotly_chart(charts.comparison(view, ov), key="comparison", width="stretch",
                            config=charts.png_config(f"flightwatch-{view.run_id}-vs-{other}"))
            if len(steps) or ov.steps:
                c1, c2 = st.columns(2)
                c1.dataframe(steps, hide_index=True)
                c2.dataframe(data.step_table(ov), hide_index=True)
        else:
            st.info(f"{data.plain(other)}: {data.plain(ov.reason)}")
    st.subheader("Export")
    cols = st.columns(4)
    stem = view.run_id.replace("/", "-")  # a recomputation is run/replay-...
    cols[0].download_button("windows (CSV)", data.windows_csv(view), f"{stem}-windows.csv", "text/csv")
    cols[1].download_button("summary (JSON)", data.summary_json(view), f"{stem}-summary.json", "application/json")
    hlog = data.hlog_path(view)
    if hlog:
        cols[2].download_button("latency (.hlog)", open(hlog, "rb").read(), f"{stem}.hlog", "text/plain")
    cols[3].caption("Charts: the camera button on each chart saves it as PNG.")


def replay_view(info: data.RunInfo, speed: float, log_latency: bool) -> None:
    key = f"replay-{info.run_id}"
    if key not in st.session_state or st.session_state.get("replay-restart"):
        st.session_state[key] = (time.monotonic(), speed)
        st.session_state["replay-restart"] = False
    started, old_speed = st.session_state[key]
    if old_speed != speed:  # a new speed carries on from where the replay is
        st.session_state[key] = (time.monotonic() - (time.monotonic() - started) * old_speed / speed, speed)

    @st.fragment(run_every=REFRESH_S)
    def frame() -> None:
        started, sp = st.session_state[key]
        view = current(info.path)
        if not view.ready:
            st.info(view.reason)
            return
        t = (time.monotonic() - started) * sp
        end_s = float(view.t(int(view.windows["window_ns"].max())) + 1)
        st.progress(min(t / end_s, 1.0), text=f"replay at {sp:g}×: t = {min(t, end_s):.0f} s of {end_s:.0f} s")
        live_view(data.until(view, min(t, end_s)), False, log_latency)

    frame()


def read_link(names: list[str], folder: str) -> str | None:
    """A link's ``?run=``, ``?compare=`` and ``?scenario=`` (``core.links``), once per browser session, into the
    widgets they name; what of it could not be opened, as a line to show (else None)."""
    if st.session_state.get("link-read"):
        return None
    st.session_state["link-read"] = True
    q = st.query_params
    missing = []
    if scenario := q.get("scenario"):
        st.session_state["scenarios-mode"] = True
        st.session_state["scenario-report"] = scenario
    for param, key in (("run", "run"), ("compare", "compare")):
        if (name := q.get(param)) and name in names:
            st.session_state[key] = name
        elif name:
            missing.append(f"{param}={name}")
    return f"the link names {' and '.join(missing)}: no such run in {folder}" if missing else None


def keep_in_link(**names: str | None) -> None:
    """The URL says what is shown: each of ``names`` set (or taken out when None), so that it can be pasted."""
    for k, v in names.items():
        if v and st.query_params.get(k) != v:
            st.query_params[k] = v
        elif not v and k in st.query_params:
            del st.query_params[k]


def main() -> None:
    st.set_page_config(page_title="flightwatch", layout="wide")
    folder = checkpoints_dir()
    runs = data.list_runs(folder)
    st.sidebar.title("flightwatch")
    unopened = read_link([r.run_id for r in runs], folder)
    if unopened:
        st.warning(unopened + " (showing the newest)")
    if runs and st.sidebar.toggle("scenario history", key="history-mode"):
        keep_in_link(run=None, compare=None, scenario=None)
        history_view(folder)
        return
    if st.sidebar.toggle("scenario reports", key="scenarios-mode"):
        keep_in_link(run=None, compare=None)
        scenarios_view(folder)
        return
    keep_in_link(scenario=None)
    if not runs:
        st.info(f"waiting for data: no runs in {folder} yet. Start one with `make attack RATE=5000`.")

        @st.fragment(run_every=REFRESH_S)
        def wait_for_runs() -> None:
            if data.list_runs(folder):
                st.rerun()

        wait_for_runs()
        return
    default = data.default_run(runs)
    names = [r.run_id for r in runs]
    label = {r.run_id: f"{r.run_id}  ({'live' if r.live else 'finished' if r.finished else 'stopped'})" for r in runs}
    chosen = st.session_state.get("run") in names  # a link's (or the user's) run: the widget keeps it
    run_id = st.sidebar.selectbox("run", names, index=None if chosen else names.index(default.run_id),
                                  format_func=label.get, key="run") or default.run_id
    keep_in_link(run=run_id)
    info = next(r for r in runs if r.run_id == run_id)
    live = info.live
    mode = st.sidebar.radio("view", ["live" if live else "whole run", "replay"], key="mode")
    log_latency = st.sidebar.checkbox("latency on a log scale", key="log")
    if mode == "replay":
        speed = st.sidebar.select_slider("replay speed", [1, 2, 5, 10, 20, 50], value=10, key="speed")
        if st.sidebar.button("restart replay"):
            st.session_state["replay-restart"] = True
        replay_view(info, float(speed), log_latency)
        return

    @st.fragment(run_every=REFRESH_S if live else None)
    def panel() -> None:
        view = current(info.path)
        live_now = data.is_live(info.path)
        live_view(view, live_now, log_latency)
        if view.ready and not live_now:
            after_run(view, runs)

    panel()


main()
