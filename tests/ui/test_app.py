"""The dashboard: Streamlit AppTest for its states, and a real browser on the live pipeline.

The AppTest runs use run folders written by the real engine and sink (``RunStore``) from
a synthetic run of known truth, decoded in-process (no Spark needed). The browser test runs
everything for real: the broker, the streaming job in Spark, the Streamlit server and Debian's
Chromium driven by Playwright.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pandas as pd
import pytest
from support import ROOT, create_topic, free_port, job_command, job_env, wait_for_first_batch

from core.procs import wait_port
from loadgen.synthetic import NS, SyntheticSpec, generate, messages
from runs import results
from streaming import engine
from streaming.decode import decode_messages
from streaming.sinks import RunStore
from ui import data

APP = os.path.join(ROOT, "ui", "app.py")


def build_run(folder, spec: SyntheticSpec, batches: int = 8, finish: bool = True, drop_timeout_s: int | None = None):
    """Write a run folder the way the streaming job does (real decode, engine and sink, no Spark); the engine's drop
    timeout is the spec's unless given (a recomputation)."""
    msgs = messages(generate(spec))
    store = RunStore(str(folder), engine.EngineConfig(spec.run_id, drop_timeout_ns=(drop_timeout_s or spec.drop_timeout_s) * NS))
    chunks = np.array_split(np.arange(len(msgs)), batches)
    for b, idx in enumerate(chunks if finish else chunks[: batches // 2]):
        table = decode_messages([msgs[i][1] for i in idx], [0] * len(idx), list(idx))
        store.process_batch(table, b)
    return folder


@pytest.fixture
def app(monkeypatch):
    """Run the dashboard script under AppTest over a checkpoints folder."""
    from streamlit.testing.v1 import AppTest

    def run(checkpoints):
        monkeypatch.setenv("FLIGHTWATCH_CHECKPOINTS", str(checkpoints))
        return AppTest.from_file(APP, default_timeout=60).run()
    return run


def metric(at, label: str) -> str:
    return next(m.value for m in at.metric if m.label == label)


def test_empty_checkpoints_folder_waits_for_data(app, tmp_path):
    at = app(tmp_path)
    assert not at.exception
    assert "waiting for data" in at.info[0].value and not at.metric


def test_a_run_without_telemetry_yet_waits_for_data(app, tmp_path):
    RunStore(str(tmp_path / "fresh"), engine.EngineConfig("fresh"))  # what the job writes when it starts
    at = app(tmp_path)
    assert not at.exception
    assert at.info[0].value.startswith("waiting for data") and not at.metric


def test_finished_run_shows_the_jobs_figures(app, tmp_path):
    spec = SyntheticSpec(run_id="done", start_ns=1_800_000_000 * NS, duration_s=20, rate_per_sec=200, pause=(8.0, 3.0),
                         oom_at_s=(12.5,), drop_timeout_s=5, num_malformed=3)
    build_run(tmp_path / "done", spec)
    summary = json.load(open(tmp_path / "done" / "summary.json"))
    assert summary["state"] == "finished"
    at = app(tmp_path)
    assert not at.exception
    assert metric(at, "p99 (run)") == data.fmt_us(summary["latency_us"]["p99"])
    assert metric(at, "loss") == data.fmt_ratio(summary["loss_ratio"])
    # a finished run's tiles are its own figures, not its last seconds: 200/s over the 20 s it sent in
    assert metric(at, "rate (run, sent/s)") == f"{summary['sent'] / 20:,.0f}" == "200"
    assert metric(at, "received/s (run)") == f"{summary['received'] / 20:,.0f}"
    assert metric(at, "p50 (run)") == data.fmt_us(summary["latency_us"]["p50"])
    assert not [m for m in at.metric if m.label in ("rate (sent/s)", "p99 (last 5 s)")]
    text = at.code[0].value
    assert f"Requests      [total, rate]                     {summary['sent']}," in text
    assert re.search(r"Gaps\s+\[count, seconds\]\s+1, 3\.0", text) and re.search(r"OOM kills\s+\[total\]\s+1", text)
    # the time range slider over the whole run gives the run's exact percentiles
    assert [m.value for m in at.metric if m.label == "p99"] == [data.fmt_us(summary["latency_us"]["p99"])]
    # and over a sub-range, exactly the merged-histogram figures
    view = data.load_run(str(tmp_path / "done"))
    lo, hi = 2.0, 8.0
    at.slider[0].set_range(lo, hi).run()
    f = data.range_figures(view, lo, hi)
    assert metric(at, "sent") == f"{f['sent']:,}"
    assert f["latency_us"] == results.merged_percentiles(str(tmp_path / "done"), "latency_us", view.t0_ns + 2 * NS, view.t0_ns + 8 * NS)


def test_each_agents_clock_offset_is_shown_with_its_error_and_whether_its_stamps_were_corrected(app, tmp_path):
    """The receiver's clock 3 ms behind the reference (corrected), the sender's within its estimate's error (kept)."""
    from core import contract

    spec = SyntheticSpec(run_id="clocks", start_ns=1_800_000_000 * NS, duration_s=6, rate_per_sec=100, drop_timeout_s=2)
    at_ns = spec.start_ns + NS
    offsets = [contract.ClockOffset(contract.ANY_RUN, "receiver-0", at_ns, reference="ref:1", offset_us=3000.0, rtt_us=60.0),
               contract.ClockOffset(contract.ANY_RUN, "sender-0", at_ns, reference="ref:1", offset_us=-12.0, rtt_us=40.0)]
    msgs = [(b"clock", contract.encode(offsets), at_ns)] + messages(generate(spec))
    store = RunStore(str(tmp_path / "clocks"), engine.EngineConfig(spec.run_id, drop_timeout_ns=2 * NS))
    for b, idx in enumerate(np.array_split(np.arange(len(msgs)), 4)):
        store.process_batch(decode_messages([msgs[i][1] for i in idx], [0] * len(idx), list(idx)), b)
    at = app(tmp_path)
    assert not at.exception
    shown = next(d.value for d in at.dataframe if "stamps" in d.value.columns).set_index("agent")
    assert shown.loc["receiver-0", "offset_ms"] == 3.0 and shown.loc["receiver-0", "± ms"] == 0.03
    assert shown.loc["receiver-0", "stamps"] == "corrected" and shown.loc["sender-0", "stamps"] == "raw"


def test_half_written_run_is_shown_as_far_as_it_goes(app, tmp_path):
    spec = SyntheticSpec(run_id="half", start_ns=1_800_000_000 * NS, duration_s=20, rate_per_sec=100, drop_timeout_s=5)
    build_run(tmp_path / "half", spec, finish=False)
    os.remove(next((tmp_path / "half" / "batches").glob("batch-*.json")))  # a batch the job has not finished writing
    at = app(tmp_path)
    assert not at.exception
    assert at.metric and not (tmp_path / "half" / "summary.json").exists()


def test_comparison_and_replay(app, tmp_path):
    base = dict(start_ns=1_800_000_000 * NS, duration_s=12, drop_timeout_s=5, num_malformed=0, pause=None, oom_at_s=())
    build_run(tmp_path / "a", SyntheticSpec(run_id="a", rate_per_sec=100, **base))
    build_run(tmp_path / "b", SyntheticSpec(run_id="b", rate_per_sec=300, latency_median_us=9000, **base))
    at = app(tmp_path)
    at.selectbox(key="compare").set_value("a" if at.selectbox(key="run").value == "b" else "b").run()
    assert not at.exception
    assert len(at.get("plotly_chart")) == 2  # the timeline and the comparison on the same axes
    at.sidebar.radio(key="mode").set_value("replay").run()
    assert not at.exception
    progress = at.get("progress")[0].proto.text
    assert progress.startswith("replay at 10×: t = ") and progress.endswith(" s")
    assert metric(at, "rate (sent/s)")  # the run as it stood at the replay's position


def test_a_run_is_compared_with_its_recomputation(app, tmp_path):
    """``replay --drop-timeout 2s`` writes ``<run>/replay-drop2s``: the dashboard lists it beside its run, shows its
    own figures and compares the two."""
    spec = SyntheticSpec(run_id="a", start_ns=1_800_000_000 * NS, duration_s=12, rate_per_sec=100, drop_timeout_s=5,
                         num_malformed=0, pause=(4.0, 3.0), oom_at_s=())
    build_run(tmp_path / "a", spec)
    build_run(tmp_path / "a" / "replay-drop2s", spec, drop_timeout_s=2)
    runs = {r.run_id: r for r in data.list_runs(str(tmp_path))}
    assert set(runs) == {"a", "a/replay-drop2s"} and all(r.finished for r in runs.values())
    own, recomputed = (json.load(open(tmp_path / "a" / p / "summary.json")) for p in (".", "replay-drop2s"))
    assert recomputed["settings"]["drop_timeout"] == "2s" and recomputed["dropped"] > own["dropped"] + 50  # the pause
    at = app(tmp_path)
    at.selectbox(key="run").set_value("a/replay-drop2s").run()
    assert not at.exception
    assert metric(at, "loss") == data.fmt_ratio(recomputed["loss_ratio"])
    at.selectbox(key="compare").set_value("a").run()
    assert not at.exception
    assert len(at.get("plotly_chart")) == 2  # the timeline and the comparison on the same axes


def test_banner_shows_the_detectors_verdict(app, tmp_path):
    # a run whose receiver stops for 3 s: a gap, confirmed saturation while it lasts
    spec = SyntheticSpec(run_id="stall", start_ns=1_800_000_000 * NS, duration_s=20, rate_per_sec=100, pause=(8.0, 3.0),
                         oom_at_s=(), drop_timeout_s=5, num_malformed=0)
    build_run(tmp_path / "stall", spec)
    v = json.load(open(tmp_path / "stall" / "summary.json"))["verdict"]
    assert v["saturated_at"]["evidence"][-1] == "gap: no deliveries"
    at = app(tmp_path)
    assert not at.exception
    assert at.error[0].value == f"SATURATED: {v['message']}"


# --- the real thing: pipeline, server, browser --------------------------------------------------

def test_the_dashboard_runs_with_the_same_settings_wherever_it_is_started():
    """`make up` (stack.ui_command), `make ui` and the Kubernetes Deployment start Streamlit with the same settings,
    its toolbar in viewer mode (no developer menu for an operator); only the address and port differ."""
    import yaml

    from stack.__main__ import ROOT, ui_command

    def settings(args):
        args = [str(a) for a in args]
        flags = args[args.index(next(a for a in args if a.endswith("app.py"))) + 1:]
        return {k: v for k, v in zip(flags[::2], flags[1::2]) if k not in ("--server.address", "--server.port")}

    ours = settings(ui_command(18501))
    assert ours["--client.toolbarMode"] == "viewer" and ours["--browser.gatherUsageStats"] == "false"
    makefile = open(os.path.join(ROOT, "Makefile")).read()
    recipe = re.search(r"^ui:.*\n((?:\t.*\n)+)", makefile, re.M).group(1).replace("\\\n", " ")
    assert recipe.split()[:2] == ["$(FLIGHTWATCH)", "ui"]  # make ui is flightwatch ui
    from flightwatch.cli import argv_of

    assert settings(argv_of("ui", ["--server.port", "18777"])) == ours
    with open(os.path.join(ROOT, "deploy", "base", "ui.yaml")) as f:
        pod = next(d for d in yaml.safe_load_all(f) if d and d["kind"] == "Deployment")
    assert settings(pod["spec"]["template"]["spec"]["containers"][0]["args"]) == ours


def start_streamlit(checkpoints, port):
    return subprocess.Popen([sys.executable, "-m", "streamlit", "run", APP, "--server.address", "127.0.0.1", "--server.port",
                             str(port), "--server.headless", "true", "--browser.gatherUsageStats", "false",
                             "--client.toolbarMode", "viewer", "--server.fileWatcherType", "none"],
                            cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT, FLIGHTWATCH_CHECKPOINTS=str(checkpoints)),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def produce_in_real_time(run_msgs, broker, topic, stop):
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=broker, linger_ms=5)
    for key, value, arrival_ns in run_msgs:
        while not stop.is_set() and time.time_ns() < arrival_ns:
            time.sleep(min(0.05, max(0.0, (arrival_ns - time.time_ns()) / 1e9)))
        if stop.is_set():
            break
        producer.send(topic, key=key, value=value)
    producer.flush()
    producer.close()


CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


@pytest.mark.integration
def test_live_dashboard_in_a_real_browser(broker, tmp_path):
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium")
    assert chromium, "Debian chromium is needed (apt-get install chromium)"
    topic, run_id = "tel-ui", "ui-live"
    create_topic(broker, topic)
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    shots = tmp_path / "screenshots"
    shots.mkdir()
    port = free_port()
    ui = start_streamlit(checkpoints, port)
    job = subprocess.Popen(job_command("run", "--run", run_id, "--bootstrap", broker, "--topic", topic, "--checkpoints",
                                       str(checkpoints), "--no-heartbeat", "--drop-timeout", "5s", "--trigger", "500ms"),
                           cwd=ROOT, env=job_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    stop = threading.Event()
    seen: dict[int, float] = {}  # window t (s) -> wall time it first showed
    captions: dict[str, int] = {}  # what the caption read, for a failure's message
    try:
        assert wait_port(port, 60), "streamlit did not start"
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1500, "height": 2000}, accept_downloads=True)
            page.goto(f"http://127.0.0.1:{port}/")
            page.get_by_text("waiting for data").first.wait_for(timeout=60_000)  # before any telemetry
            page.screenshot(path=str(shots / "0-waiting.png"))
            wait_for_first_batch(broker, topic, run_id, checkpoints / run_id / "batches")
            # The run starts now that the job runs, in real time: 24 s at 200 events/s, no receive in
            # [8 s, 11 s) (a gap), an OOM kill at 12.5 s.
            start_ns = (time.time_ns() // NS + 2) * NS
            spec = SyntheticSpec(run_id=run_id, start_ns=start_ns, duration_s=24, rate_per_sec=200, pause=(8.0, 3.0),
                                 oom_at_s=(12.5,), drop_timeout_s=5, num_malformed=3, heartbeat_until_s=24 + 5 + 8)
            producer = threading.Thread(target=produce_in_real_time, args=(messages(generate(spec)), broker, topic, stop),
                                        daemon=True)
            producer.start()
            # live: the caption names the newest window; note when each first shows
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and not (tmp_path / "checkpoints" / run_id / "summary.json").exists():
                cap = page.locator("text=/newest figures: window t=\\+\\d+ s/").all_inner_texts()
                m = re.search(r"(LIVE) · run .* window t=\+(\d+) s", cap[0]) if cap else None
                captions[cap[0] if cap else "(no caption)"] = captions.get(cap[0] if cap else "(no caption)", 0) + 1
                if m:
                    seen.setdefault(int(m.group(2)), time.time())
                    if int(m.group(2)) >= 21 and not (shots / "1-live.png").exists():
                        # the OOM marker and the gap shading's label, read while live (a refresh redraws the
                        # charts: an empty read mid-redraw is retried for up to 5 s)
                        until = time.monotonic() + 5
                        while True:
                            labels = page.locator("text.annotation-text").all_text_contents()
                            if {"OOM", "gap"} <= set(labels) or time.monotonic() > until:
                                break
                            time.sleep(0.2)
                        assert "OOM" in labels, labels
                        assert "gap" in labels, labels
                        page.screenshot(path=str(shots / "1-live.png"), full_page=True)
                time.sleep(0.1)
            if len(seen) < 5:
                page.screenshot(path=str(shots / "1-not-live.png"), full_page=True)
            assert len(seen) >= 5, (f"live updates seen for windows {sorted(seen)}; the captions read (times): "
                                    f"{list(captions.items())[-8:]}; the page as it was: {shots / '1-not-live.png'}")
            assert (shots / "1-live.png").exists()
            assert job.wait(60) == 0
            page.get_by_text("Summary").first.wait_for(timeout=30_000)  # the finished run's sections
            time.sleep(2)
            summary = json.load(open(checkpoints / run_id / "summary.json"))
            value = lambda label: page.locator('[data-testid="stMetric"]', has_text=label).first.locator(
                '[data-testid="stMetricValue"]').inner_text()
            assert value("p99 (run)") == data.fmt_us(summary["latency_us"]["p99"])
            assert value("loss") == data.fmt_ratio(summary["loss_ratio"])
            labels = page.locator("text.annotation-text").all_text_contents()
            assert "OOM" in labels and "gap" in labels, labels
            page.screenshot(path=str(shots / "2-finished.png"), full_page=True)
            # the gap is shaded over its exact interval; hovering a p99 point names the window's slowest events
            fig = page.evaluate("""() => { const gd = document.querySelector('.js-plotly-plot');
                const i = gd.data.findIndex(t => t.name === 'p99');
                const j = gd.data[i].text.findIndex(t => t);
                const t = gd.data[i];
                Plotly.Fx.hover(gd, [{curveNumber: i, pointNumber: j}], [(t.xaxis || 'x') + (t.yaxis || 'y')]);
                return {rects: gd.layout.shapes.filter(s => s.type === 'rect').map(s => [s.x0, s.x1]),
                        hover: document.querySelector('.hoverlayer').textContent, text: gd.data[i].text[j]}; }""")
            (gap,) = summary["gaps"]
            assert len(fig["rects"]) == 1 and abs((fig["rects"][0][1] - fig["rects"][0][0]) - gap["duration_s"]) < 1e-6, fig
            assert 2.99 < gap["duration_s"] < 3.1, gap
            assert "slowest" in fig["hover"] and fig["text"].split(" (")[0] in fig["hover"], fig
            # exports: the chart as PNG (Plotly's camera button) and the window table as CSV
            chart = page.locator(".js-plotly-plot").first
            chart.hover()
            with page.expect_download(timeout=30_000) as png:
                chart.locator('.modebar-btn[data-title="Download plot as a PNG"]').click()
            png.value.save_as(shots / "chart.png")
            assert png.value.suggested_filename == f"flightwatch-{run_id}.png"
            assert (shots / "chart.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
            with page.expect_download(timeout=30_000) as csv:
                page.get_by_role("button", name="windows (CSV)").click()
            csv.value.save_as(tmp_path / "windows.csv")
            open_links(page, port, checkpoints, run_id, shots)
            open_report(browser, checkpoints / run_id, shots)
            browser.close()
        exported = pd.read_csv(tmp_path / "windows.csv")
        assert exported["sent"].sum() == summary["sent"] and exported["dropped"].sum() == summary["dropped"]
        # the exemplars go out with the windows: the slowest IDs where there were deliveries, the first drops where drops
        assert exported.loc[exported["received"] > 0, "slowest"].notna().all()
        assert exported.loc[exported["dropped"] > 0, "first_dropped"].notna().all()
        assert abs(exported["silence_ms"].sum() - 1000 * summary["gaps"][0]["duration_s"]) < 1e-3
    finally:
        stop.set()
        for p in (job, ui):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(30)
    # Freshness: from the job writing a window's first figures to the browser showing that window.
    w = results.load_windows(str(checkpoints / run_id))
    view = data.load_run(str(checkpoints / run_id))
    w["t"] = np.round(view.t(w["window_ns"].to_numpy())).astype(int)
    lag = pd.Series({t: seen[t] - w.loc[w["t"] == t, "first_written_ns"].iloc[0] / 1e9 for t in seen
                     if (w["t"] == t).any() and w.loc[w["t"] == t, "first_written_ns"].notna().all()})
    report = {"windows": len(lag), "median_s": float(lag.median()), "max_s": float(lag.max())}
    (tmp_path / "freshness.json").write_text(json.dumps(report))
    print(f"\nfreshness (job writes a window -> browser shows it): {report}; screenshots in {shots}")
    # How many windows the browser can show depends on how often the job's batches land (one every
    # 1-3 s on two cores, busier in CI). What the dashboard owes: every window that was the job's
    # newest for a while shows, and soon after it was written.
    reigns = newest_window_reigns(w, seen_until_ns=int(max(seen.values()) * 1e9))
    missed = sorted(t for t, reign_s in reigns.items() if reign_s >= 4.0 and t not in seen)
    assert not missed, f"newest for 4 s or more but never shown: windows {missed}; shown {sorted(seen)}"
    assert report["median_s"] <= 2.5, report
    if os.environ.get("DOCS_SHOTS"):  # make docs-shots: the documentation's pictures, from this run
        publish_shots(shots, os.environ["DOCS_SHOTS"])


DOCS_SHOTS = {"1-live.png": "dashboard-live.png", "2-finished.png": "dashboard-finished.png",
              "5-link-scenario.png": "scenario-report.png", "6-report-offline.png": "report-html.png"}
"""The screenshots the documentation shows (``make docs-shots``), by the names it gives them."""


def publish_shots(shots, dest: str, width: int = 1000, height: int = 1000) -> None:
    """The top of each page the documentation shows, 1,500 px wide, scaled to ``width`` and in 256 colours: a picture
    of modest size (~100-200 KB) for ``docs/img/``."""
    from PIL import Image

    os.makedirs(dest, exist_ok=True)
    for name, as_name in DOCS_SHOTS.items():
        with Image.open(shots / name) as im:
            top = im.convert("RGB").crop((0, 0, im.width, min(im.height, int(height * im.width / width))))
            top = top.resize((width, int(top.height * width / top.width)), Image.LANCZOS)
            top.quantize(256, method=Image.Quantize.MEDIANCUT).save(os.path.join(dest, as_name), optimize=True)


def open_report(browser, run_dir, shots) -> None:
    """The run's report.html (``ui.report``) in a tab with the network off: every chart drawn from its inline data,
    the ledger shown."""
    from ui import report

    path, size, took = report.write(str(run_dir))
    context = browser.new_context(offline=True, viewport={"width": 1500, "height": 2000})
    page = context.new_page()
    page.goto(f"file://{path}")
    charts = page.locator(".js-plotly-plot")
    # every chart drawn: each of its traces in the SVG (Plotly draws them from the data inline in the file)
    page.wait_for_function("() => Array.from(document.querySelectorAll('.js-plotly-plot')).every("
                           "d => d._fullData && d._fullData.length > 0 && d.querySelectorAll('.scatterlayer .trace, "
                           ".barlayer .trace').length == d._fullData.filter(t => t.visible !== false).length)",
                           timeout=30_000)
    assert charts.count() >= 2 and page.get_by_text("Ledger: every sent event in one bucket").is_visible()
    summary = json.load(open(run_dir / "summary.json"))
    assert page.get_by_text(re.compile(re.escape(f"sent {summary['sent']:,} = "))).first.is_visible()
    page.screenshot(path=str(shots / "6-report-offline.png"), full_page=True)
    print(f"\nreport.html: {size / 1e6:.2f} MB, written in {took:.2f} s, {charts.count()} charts drawn offline")
    context.close()


def open_links(page, port: int, checkpoints, run_id: str, shots) -> None:
    """Links pasted into a fresh tab open what they name (``core.links``): ``?run=`` an older run than the newest,
    ``?run=&compare=`` the comparison, ``?scenario=`` a scenario report; each stays in the address bar."""
    from scenarios import report, spec

    build_run(checkpoints / "older", SyntheticSpec(run_id="older", start_ns=1_800_000_000 * NS, duration_s=12,
                                                   rate_per_sec=100, drop_timeout_s=5, num_malformed=0, pause=None,
                                                   oom_at_s=()))
    sc = spec.load("kafka-matrix", short=True)
    cells = [{"cell": c, "run_id": f"m-c{k}", "exit": 0, "sent": 100, "received": 100, "dropped": 0, "errors": 0,
              "p50_us": 900, "p99_us": 2000, "ceiling_per_s": 2000.0, "limit": None, "state": "ok", "message": "ok"}
             for k, c in enumerate(sc.cells())]
    report.write(str(checkpoints / "scen-a"), report.document(sc, "kafka", "scen-a", cells, 1_800_000_000 * NS, True))
    def shown(label: str) -> str:  # a selectbox's label and its value (in its input, or as text)
        return page.locator('[data-testid="stSelectbox"]', has_text=label).first.evaluate(
            "e => e.innerText + ' ' + Array.from(e.querySelectorAll('input')).map(i => i.value).join(' ')")
    page.goto(f"http://127.0.0.1:{port}/?run=older")
    page.get_by_text("Summary").first.wait_for(timeout=30_000)
    assert "older" in shown("run") and "run=older" in page.url, (shown("run"), page.url)
    page.screenshot(path=str(shots / "3-link-run.png"), full_page=True)
    page.goto(f"http://127.0.0.1:{port}/?run={run_id}&compare=older")
    page.get_by_text("compare with").first.wait_for(timeout=30_000)
    assert "older" in shown("compare with") and run_id in shown("run") and "compare=older" in page.url, (
        shown("compare with"), shown("run"), page.url)
    page.screenshot(path=str(shots / "4-link-compare.png"), full_page=True)
    page.goto(f"http://127.0.0.1:{port}/?scenario=scen-a")
    page.get_by_text("Scenario reports").first.wait_for(timeout=30_000)
    assert "scen-a" in shown("report") and "scenario=scen-a" in page.url, (shown("report"), page.url)
    page.screenshot(path=str(shots / "5-link-scenario.png"), full_page=True)


def newest_window_reigns(w: pd.DataFrame, seen_until_ns: int) -> dict[int, float]:
    """For each window that was the newest one written (what the caption names) before seen_until_ns,
    for how many seconds it stayed the newest: from its batch's write until a later window's, at most
    until seen_until_ns (when the test stopped looking)."""
    written = w[w["first_written_ns"].notna() & (w["first_written_ns"] < seen_until_ns)]
    changes = []  # (write time, window that became the newest)
    for at_ns, group in written.groupby("first_written_ns", sort=True):
        top = int(group["t"].max())
        if not changes or top > changes[-1][1]:
            changes.append((at_ns, top))
    ends = [at for at, _ in changes[1:]] + [seen_until_ns]
    return {t: (end - at) / 1e9 for (at, t), end in zip(changes, ends)}


def test_integrity_notes_show_lost_telemetry_and_an_aborted_run():
    view = data.RunView("r", "/nowhere", True, summary={
        "telemetry_lost": {"receiver-http": 15103},
        "telemetry_held": {"receiver-http": {"from_ns": 1, "until_ns": 7 * 10**9, "longest_s": 6.993, "records": 13963}},
        "aborted": True, "stop_reasons": [{"agent": "job", "reason": "aborted: no record from 1 of 1 load generator(s)"}]})
    notes = data.integrity_notes(view)
    assert notes[0].startswith("telemetry lost: receiver-http refused 15,103 records")
    assert notes[1] == ("telemetry held: receiver-http's records waited up to 7.0 s on their way to the telemetry broker "
                        "(13,963 records), then arrived: flightwatch's outage, not the SUT's")
    assert notes[2] == "run aborted: no record from 1 of 1 load generator(s)"
    assert data.integrity_notes(data.RunView("r", "/nowhere", True, summary={"telemetry_lost": {}})) == []


def test_integrity_notes_show_a_telemetry_reset():
    view = data.RunView("r", "/nowhere", True, summary={
        "telemetry_reset": [{"at_ns": 1, "where": "t", "reason": "the topic was recreated (ID a -> b)", "count": 0}],
        "windows_incomplete": 9, "unaccounted": 61})
    assert data.integrity_notes(view) == [f"telemetry broker lost its data ({data.plain('the topic was recreated (ID a -> b)')}): "
                                          "9 windows are incomplete and not judged; 61 sends are unaccounted, not counted as dropped"]


def test_comparison_banner_says_whether_it_is_a_regression(app, tmp_path):
    """The comparison view of a run with p99 doubled over its baseline opens with the regression and its interval, as
    ``runs compare`` words it; the other way round it is an improvement; another schedule is refused in a line. (One
    baseline run: its run-to-run spread is unknown and taken as ±5%, so the change must be a large one.)"""
    from bench.compare import build_run as build
    from bench.compare import spec_for

    build(str(tmp_path / "base"), spec_for("base", 1, 40, 300))
    build(str(tmp_path / "worse"), spec_for("worse", 2, 40, 300, 1.0))
    build(str(tmp_path / "other"), _with_pace(spec_for("other", 3, 40, 300), "150:40"))
    expected = data.comparison(str(tmp_path / "base"), str(tmp_path / "worse"))["headline"]
    assert expected.startswith("regression: ") and "p99 +" in expected
    at = app(tmp_path)
    at.selectbox(key="run").set_value("worse").run()
    at.selectbox(key="compare").set_value("base").run()
    assert not at.exception
    assert at.error[0].value == f"{expected} (candidate worse against baseline base)"
    at.selectbox(key="run").set_value("base").run()
    at.selectbox(key="compare").set_value("worse").run()
    assert at.success[0].value.startswith("improvement: ") and "p99 -" in at.success[0].value
    at.selectbox(key="compare").set_value("other").run()
    assert at.warning[0].value.startswith("not compared: different schedules: other paced 150:40, base paced 300:40")


def _with_pace(spec, pace):
    spec.config = dict(spec.config, pace=pace)
    return spec


def test_history_view_marks_the_change_point(app, tmp_path):
    from bench.compare import build_run as build
    from bench.compare import spec_for

    for i in range(6):
        s = spec_for(f"n{i}", 40 + i, 10, 300, 0.5 if i >= 3 else 0.0, wobble=0.02)
        s.start_ns = (1_800_000_000 + 100 * i) * NS
        s.config = dict(s.config, scenario="nightly", pace="300:10", schedule_start_ns=s.start_ns)
        build(str(tmp_path / f"n{i}"), s)
    at = app(tmp_path)
    at.sidebar.toggle(key="history-mode").set_value(True).run()
    assert not at.exception
    assert at.selectbox(key="series").value == "nightly"
    assert [w.value for w in at.warning] == [next(w.value for w in at.warning if "p99" in w.value)]
    assert at.warning[0].value.startswith("change point: p99 +") and "from run n3, p = 0.0" in at.warning[0].value
    assert any(c.value.startswith("rule: PELT proposes") for c in at.caption)
    assert list(at.dataframe[0].value["run"]) == [f"n{i}" for i in range(6)]


def test_warmup_and_cooldown_are_greyed_and_the_range_opens_on_the_measured_span(app, tmp_path):
    """A run that set ``--warmup 4s --cooldown 2s``: the timeline greys its first 4 and last 2 seconds (named), and
    the time range's exact figures open on the 14 s between."""
    from bench.compare import build_run as build
    from bench.compare import spec_for
    from ui import charts

    s = spec_for("trimmed", 7, 20, 300)
    s.config = dict(s.config, pace="300:20", schedule_start_ns=s.start_ns, warmup_s=4.0, cooldown_s=2.0)
    build(str(tmp_path / "trimmed"), s)
    view = data.load_run(str(tmp_path / "trimmed"))
    spans = charts.left_out_spans(view)
    assert [(round(a - view.steps[0].start_s, 3), round(b - view.steps[0].start_s, 3), what) for a, b, what in spans] \
        == [(0.0, 4.0, "warm-up"), (18.0, 20.0, "cool-down")]
    fig = charts.timeline(view)
    assert sum(1 for sh in fig.layout.shapes if sh.fillcolor == charts.LEFT_OUT_COLOR) == 2
    at = app(tmp_path)
    lo, hi = at.slider(key="range-trimmed").value
    assert hi - lo == 14.0


def test_scenario_reports_are_listed_beside_the_runs_with_their_cells_and_chart(app, tmp_path):
    """A scenario report (``scenarios.report.write``) in the checkpoints folder: the sidebar's "scenario reports"
    lists it, newest first, with a row per cell and the matrix chart (a bar per cell in each panel)."""
    from scenarios import report, spec

    sc = spec.load("kafka-matrix").only("payload", [1024])  # 1 KiB x acks 1, all x 1, 3 partitions: 4 cells
    cells = [{"cell": c, "run_id": f"m-c{k}", "exit": 0, "sent": 100, "received": 100, "dropped": 0, "errors": 0,
              "p50_us": 900, "p99_us": 2000 + k, "ceiling_per_s": 2000.0, "limit": None, "state": "ok", "message": "ok"}
             for k, c in enumerate(sc.cells())]
    report.write(str(tmp_path / "older"), report.document(sc, "kafka", "older", cells[:1], 1_800_000_000 * NS, False))
    report.write(str(tmp_path / "m"), report.document(sc, "kafka", "m", cells, 1_800_000_100 * NS, True))
    at = app(tmp_path)
    at.sidebar.toggle(key="scenarios-mode").set_value(True).run()
    assert not at.exception
    assert at.selectbox(key="scenario-report").value == "m"
    table = at.dataframe[0].value
    assert list(table["run"]) == [f"m-c{k}" for k in range(4)] and list(table["p99"]) == ["2.00 ms", "2.00 ms", "2.00 ms", "2.00 ms"]
    from ui import charts

    fig = charts.scenario_matrix(report.document(sc, "kafka", "m", cells, 0, True))
    assert len(fig.data) == 8 and all(len(t.x) == 1 for t in fig.data)  # 4 series (acks x partitions), 2 panels


def test_the_pairs_and_routing_reports_draw_their_seeds_charts(app, tmp_path):
    """A pairs report: flight time against the number of pairs, pooled and across the pairs (5 series, a point per
    cell); a routing report: the broker's CPU per message and the flight time against bindings, on a log axis."""
    from scenarios import report, spec
    from ui import charts

    base = {"exit": 0, "sent": 100, "received": 100, "late": 0, "dropped": 0, "errors": 0, "p50_us": 900,
            "p99_us": 3000, "state": "ok", "message": "ok"}
    dist = {"pair_p99_median_us": 2000, "pair_p99_p99_us": 5000, "worst_pair_p99_us": 6000, "worst_pair": 3,
            "lost": 0, "pairs_with_loss": 0, "attached": {}}
    pairs_doc = report.document(spec.load("dispatch-pairs"), "artemis", "p", [
        {**base, "cell": {"pairs": n, "payload": 100}, "run_id": f"p-{n}", "pairs": dist} for n in (10, 100)], 0, True)
    fig = charts.scenario_pairs(pairs_doc)
    assert len(fig.data) == 5 and list(fig.data[1].x) == ["10", "100"] and list(fig.data[4].y) == [6.0, 6.0]
    routing_doc = report.document(spec.load("routing-scalability"), "rabbitmq", "r", [
        {**base, "cell": {"bindings": n}, "run_id": f"r-{n}",
         "broker": {"cpu_us_per_message": 40.0 + n / 100, "cpu_us_per_message_p90": 50.0, "seconds": 3,
                    "per_second_us": [40.0, 41.0, 39.0]}} for n in (1, 10, 100)], 0, True)
    fig = charts.scenario_routing(routing_doc)
    assert list(fig.data[0].y) == [40.01, 40.1, 41.0] and fig.layout.xaxis2.type == "log"
    text = report.markdown(routing_doc)
    assert "| 10 | 100 | 100 | 0 | 0.90 ms | 3.00 ms | 40.1 µs, 50.0 µs | 3 |" in text and "**Routing cost: " in text
    bursts_doc = report.document(spec.load("bursts"), "tansu", "b", [
        {**base, "cell": {"receivers": 2}, "run_id": "b-2", "bursts": {
            "sustained": {"p99_us": 1000}, "bursts": [{"p99_us": 3000}, {"p99_us": 5000}],
            "receivers": {"receiver-http-0": {"per_s": 300.0}, "receiver-http-1": {"per_s": 200.0}}}}], 0, True)
    fig = charts.scenario_bursts(bursts_doc)
    assert list(fig.data[0].y) == [1.0, 3.0, 5.0] and list(fig.data[1].y) == [300.0, 200.0]
    report.write(str(tmp_path / "r"), routing_doc)
    at = app(tmp_path)
    at.sidebar.toggle(key="scenarios-mode").set_value(True).run()
    assert not at.exception and len(at.dataframe[0].value) == 3


def test_a_link_opens_the_run_the_comparison_and_the_scenario_it_names_and_the_url_follows(app, tmp_path, monkeypatch):
    """``?run=`` opens that run, not the newest; ``?compare=`` its comparison; ``?scenario=`` that scenario report;
    a run that is not there is said so, over the newest. As the user changes the view the URL says what is shown
    (``st.query_params``), so that a link pasted from the address bar opens it again."""
    from streamlit.testing.v1 import AppTest

    from scenarios import report, spec

    base = dict(start_ns=1_800_000_000 * NS, duration_s=12, drop_timeout_s=5, num_malformed=0, pause=None, oom_at_s=())
    build_run(tmp_path / "older", SyntheticSpec(run_id="older", rate_per_sec=100, **base))
    build_run(tmp_path / "newer", SyntheticSpec(run_id="newer", rate_per_sec=300, **{**base, "start_ns": base["start_ns"] + 60 * NS}))
    sc = spec.load("kafka-matrix", short=True)
    cells = [{"cell": c, "run_id": f"m-c{k}", "exit": 0, "sent": 100, "received": 100, "dropped": 0, "errors": 0,
              "p50_us": 900, "p99_us": 2000, "ceiling_per_s": 2000.0, "limit": None, "state": "ok", "message": "ok"}
             for k, c in enumerate(sc.cells())]
    for name, at_ns in (("scen-a", 1_800_000_000 * NS), ("scen-b", 1_800_000_100 * NS)):
        report.write(str(tmp_path / name), report.document(sc, "kafka", name, cells, at_ns, True))
    monkeypatch.setenv("FLIGHTWATCH_CHECKPOINTS", str(tmp_path))

    def opened(**query: str) -> AppTest:
        at = AppTest.from_file(APP, default_timeout=60)
        at.query_params.update(query)
        at.run()
        assert not at.exception, at.exception
        return at

    newest = opened()
    assert newest.selectbox(key="run").value == "newer" and newest.query_params["run"] == "newer"
    at = opened(run="older")
    assert at.selectbox(key="run").value == "older" and metric(at, "rate (run, sent/s)") == "100"
    assert at.query_params["run"] == "older" and not at.warning
    at = opened(run="newer", compare="older")
    assert at.selectbox(key="compare").value == "older" and len(at.get("plotly_chart")) == 2
    assert at.query_params["compare"] == "older"
    at.selectbox(key="compare").set_value("(none)").run()
    assert "compare" not in at.query_params  # the URL follows the user
    at = opened(scenario="scen-a")
    assert at.sidebar.toggle(key="scenarios-mode").value and at.selectbox(key="scenario-report").value == "scen-a"
    assert at.query_params["scenario"] == "scen-a" and "run" not in at.query_params
    at = opened(run="killkafka")
    assert at.selectbox(key="run").value == "newer"
    assert [w.value for w in at.warning] == [f"the link names run=killkafka: no such run in {tmp_path} (showing the newest)"]
