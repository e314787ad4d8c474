"""report.html (``python -m ui.report``, ``flightwatch report``): one self-contained file per run and per scenario
run, from run folders written by the real engine and sink (``tests/ui/test_app.build_run``: a synthetic run of known
truth); opened in Debian's Chromium with the network off by ``test_app``'s browser test."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from support import ROOT
from test_app import build_run

from core import output
from loadgen.synthetic import NS, SyntheticSpec
from ui import report


def _run(tmp_path, run_id="r", **more):
    spec = dict(run_id=run_id, start_ns=1_800_000_000 * NS, duration_s=20, rate_per_sec=200, drop_timeout_s=5,
                num_malformed=0, pause=(8.0, 3.0), oom_at_s=(12.5,))
    return build_run(tmp_path / run_id, SyntheticSpec(**{**spec, **more}))


def test_a_runs_report_is_one_file_with_its_verdict_ledger_charts_and_settings_and_nothing_fetched(tmp_path):
    folder = _run(tmp_path)
    path, size, took = report.write(str(folder))
    text = open(path).read()
    s = json.load(open(folder / "summary.json"))
    assert path == str(folder / "report.html") and size == len(text.encode()) and 0 < took < 60
    # self-contained: Plotly's script inline once, no script, style or image fetched from anywhere
    assert not re.search(r"<(script|link|img)[^>]+(src|href)=", text)
    assert text.count("<script>/**\n* plotly.js v") == 1 and size < 6_000_000, size
    assert html_text(s["verdict"]["message"]) in text
    assert html_text(output.ledger_text(s)) in text and sum(s["ledger"].values()) == s["sent"]
    # the per-second charts, the distribution (log axis), each with the run's data inline
    assert text.count("class=\"plotly-graph-div\"") == 2 + bool(s["verdict"].get("steps"))
    assert '"type":"log"' in text.replace(" ", "") and "Flight time distribution" in text
    assert "drop_timeout" in text and "OOM kills" in text


def test_flightwatch_report_says_where_and_how_big_and_a_wrong_run_is_one_line(tmp_path):
    _run(tmp_path, "demo")
    env = dict(os.environ, PYTHONPATH=ROOT, FLIGHTWATCH_CHECKPOINTS=str(tmp_path))
    ok = subprocess.run([sys.executable, "-m", "flightwatch", "report", "demo"], cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert re.fullmatch(rf"report: {re.escape(str(tmp_path / 'demo' / 'report.html'))} \(\d+\.\d MB, written in "
                        r"\d+\.\d s\)\n", ok.stdout), ok.stdout
    bad = subprocess.run([sys.executable, "-m", "flightwatch", "report", "nosuchrun"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stdout == "" and len(bad.stderr.strip().splitlines()) == 1
    assert bad.stderr.startswith("report: error: no run or scenario run 'nosuchrun'")


def test_a_scenario_runs_report_has_its_table_and_every_cells_run(tmp_path):
    from scenarios import report as scenario
    from scenarios import spec

    sc = spec.load("kafka-matrix", short=True)
    cells = []
    for k, c in enumerate(sc.cells(), 1):
        run_id = f"m-c{k:02d}"
        _run(tmp_path, run_id, rate_per_sec=100 * k)
        s = json.load(open(tmp_path / run_id / "summary.json"))
        cells.append({"cell": c, "run_id": run_id, "exit": 0, "sent": s["sent"], "received": s["received"],
                      "dropped": s["dropped"], "errors": 0, "p50_us": 900, "p99_us": 2000, "ceiling_per_s": 200.0,
                      "limit": None, "state": "ok", "message": "ok"})
    scenario.write(str(tmp_path / "m"), scenario.document(sc, "kafka", "m", cells, 1_800_000_000 * NS, True))
    path, _, _ = report.write(str(tmp_path / "m"))
    text = open(path).read()
    assert "Size and acks matrix: m" in text and all(f"<h2>m-c{k:02d}</h2>" in text for k in (1, 2))
    assert text.count("<script>/**\n* plotly.js v") == 1


def html_text(s: str) -> str:
    import html

    return html.escape(s)
