"""End to end with the real parts: Tansu broker, the streaming job in a real Spark session.

A synthetic run of known truth (60 s at 1,000 events/s, lognormal latencies, ~1% never
received, duplicates, errors, late receives, one 3 s pause with no receives, an OOM event,
malformed records) is written to the telemetry topic; the job processes it in many
micro-batches; every window is checked against truth computed independently with numpy.
"""
from __future__ import annotations

import dataclasses
import os
import re
import signal
import subprocess
import threading
import time
import urllib.request

import numpy as np
import pandas as pd
import pytest
from support import ROOT, create_topic, free_port, job_command, job_env, run_job

from loadgen.synthetic import NS, SyntheticSpec, WrittenTwice, generate, produce, truth
from runs import results
from runs.reader import RunReader

pytestmark = pytest.mark.integration

RUN = "e2e"
TIMING_COLUMNS = ["first_written_ns", "last_written_ns"]
BATCH_KEYS = ("num_batches", "computed_at_ns")
"""Summary keys that say how the run was processed, not what was measured."""


@pytest.fixture(scope="module")
def recorded(broker, tmp_path_factory):
    """The synthetic run in a fresh topic, and its ground truth."""
    run = generate(SyntheticSpec(run_id=RUN))
    for attempt in range(3):  # a broker that wrote a retried request twice: the run again, in a topic of its own
        topic = f"telemetry-e2e-{attempt}"
        create_topic(broker, topic)
        try:
            produce(run, broker, topic)
            break
        except WrittenTwice as e:
            print(f"\n{e}: written again to a new topic")
    else:
        raise AssertionError("the broker wrote the synthetic run with duplicates three times")
    return {"bootstrap": broker, "topic": topic, "run": run, "truth": truth(run), "tmp": tmp_path_factory.mktemp("runs")}


def job_args(rec, out, *extra):
    return ["run", "--run", RUN, "--bootstrap", rec["bootstrap"], "--topic", rec["topic"], "--out", str(out),
            "--no-heartbeat", "--available-now", "--trigger", "200ms", *extra]


SCRAPES: list[dict] = []
LAST_TEXT: list[str] = []
"""The last scrape's text, as the job served it (linted by promtool)."""
"""What the live job's /metrics said while it ran (``_scrape``), for the metrics test."""


def _scrape(port: int, stop: threading.Event) -> None:
    """Read the job's /metrics every 50 ms while it runs: each scrape as {sample name: {labels: value}}."""
    from prometheus_client.parser import text_string_to_metric_families

    while not stop.is_set():
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1) as r:
                text = r.read().decode()
        except OSError:
            time.sleep(0.05)
            continue
        scrape: dict = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                scrape.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
        SCRAPES.append(scrape)
        LAST_TEXT[:] = [text]
        time.sleep(0.05)


@pytest.fixture(scope="module")
def live(recorded):
    """An undisturbed run of the job over the recorded telemetry: its folder (its /metrics read meanwhile)."""
    out = recorded["tmp"] / "live"
    port, stop = free_port(), threading.Event()
    scraper = threading.Thread(target=_scrape, args=(port, stop), daemon=True)
    scraper.start()
    try:
        proc = run_job(*job_args(recorded, out, "--max-offsets-per-trigger", "60", "--metrics-listen", f"127.0.0.1:{port}"))
    finally:
        stop.set()
        scraper.join(10)
    (out / "job-output.txt").write_text(proc.stdout + proc.stderr)  # what a failed check quotes (its resets)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "FINISHED" in proc.stdout
    return out


def comparable(windows: pd.DataFrame) -> pd.DataFrame:
    return windows.drop(columns=[c for c in TIMING_COLUMNS if c in windows]).reset_index(drop=True)


def test_every_window_matches_ground_truth(live, recorded):
    t = recorded["truth"]
    w = results.load_windows(str(live)).set_index("window_ns")
    assert w["receive_complete"].all() and w["drops_final"].all()
    # counts: exact, window by window
    for name in ("sent", "received", "dropped", "duplicates", "late", "errors"):
        expected = pd.Series({win: d.get(name, 0) for win, d in t["windows"].items()}, dtype=np.int64)
        got = w[name].reindex(expected.index, fill_value=0)
        assert (got == expected).all(), (f"{name}: {got[got != expected].head()} vs {expected[got != expected].head()}; "
                                          f"the job said: {_job_said(live)}")
        assert int(w[name].sum()) == int(expected.sum())
    # the part of each window inside a gap, to the ns
    silence = pd.Series({win: d.get("silence_ns", 0) / 1e6 for win, d in t["windows"].items()})
    assert (w["silence_ms"].reindex(silence.index, fill_value=0) == silence).all() and w["silence_ms"].sum() == silence.sum() > 2900
    # exemplars: each window's 5 slowest deliveries are truly its slowest, its first 5 drops truly dropped and first
    ids = lambda text: [x.split(" (")[0] for x in text.split("; ")] if text else []  # noqa: E731
    for win in w.index:
        assert ids(w.loc[win, "slowest"]) == t["slowest"].get(win, []), win
        assert ids(w.loc[win, "first_dropped"]) == t["first_dropped"].get(win, []), win
    assert sum(len(v) for v in t["first_dropped"].values()) > 20 and set().union(*map(set, t["first_dropped"].values())) <= t["dropped_ids"]
    # latency percentiles: within 0.1% of numpy's (nearest-rank) values, every window
    worst = 0.0
    for win, (lat_us, lat_intended_us) in t["latency"].items():
        for p in (50, 90, 99):
            for col, data in ((f"latency_us_p{p}", lat_us), (f"latency_intended_us_p{p}", lat_intended_us)):
                exact = np.percentile(data, p, method="inverted_cdf")
                err = abs(w.loc[win, col] - exact) / exact
                worst = max(worst, err)
                assert err <= 0.001, (win, col, w.loc[win, col], exact)
    print(f"worst percentile error {worst:.5%} over {len(t['latency'])} windows")


def _job_said(live) -> str:
    """The job's lines about telemetry resets and lost topics, and its summary's, for a failed check's message."""
    text = (live / "job-output.txt").read_text(errors="replace") if (live / "job-output.txt").exists() else ""
    lines = [x for x in text.splitlines() if re.search(r"reset|lost|gone|went back|recreated|not read", x, re.I)]
    s = results.summarize(str(live))
    return f"{lines[-12:]}; telemetry_reset {s.get('telemetry_reset')}, windows_incomplete {s.get('windows_incomplete')}"


def test_run_summary_matches_ground_truth(live, recorded):
    t, spec = recorded["truth"], recorded["run"].spec
    s = results.summarize(str(live))
    assert s["state"] == "finished"
    assert (s["sent"], s["received"], s["dropped"], s["duplicates"], s["late"], s["errors"]) == (
        t["num_sent"], t["num_received"], t["num_dropped"], t["num_duplicates"], t["num_late"], t["num_errors"])
    assert s["quarantined"] == t["num_malformed"] == len(RunReader(str(live)).quarantine())
    # run-level percentiles merged from the window histograms
    for p in (50, 90, 99):
        exact = np.percentile(t["all_latency_us"], p, method="inverted_cdf")
        assert abs(s["latency_us"][f"p{p}"] - exact) / exact <= 0.001
    # the one pause: its exact edges (the receives around it) and the events in flight at its start
    assert [(g["start_ns"], g["end_ns"], g["in_flight"]) for g in s["gaps"]] == t["gaps"]
    assert len(t["gaps"]) == 1 and 3.0 < s["gaps"][0]["duration_s"] < 3.01
    # the run's 5 slowest deliveries and first 5 drops, merged from the windows' exemplars
    assert [e["event_id"] for e in s["exemplars"]["slowest"]] == t["slowest_run"]
    assert [e["event_id"] for e in s["exemplars"]["first_dropped"]] == t["first_dropped_run"]
    # the OOM event at its time and place; node metrics per window
    assert [(e["at_ns"], e["where"]) for e in s["oom_events"]] == [(spec.start_ns + int(45.5 * NS), "node-a:/leaker")]
    w = results.load_windows(str(live)).set_index("window_ns")
    assert w.loc[spec.start_ns + 45 * NS, "oom_kills"] == 1
    assert w.loc[spec.start_ns + 10 * NS, "node:node-a:cpu_utilization"] == pytest.approx(0.6)


@pytest.mark.faults
def test_the_jobs_prometheus_metrics_are_its_window_table(live, recorded):
    """While the job ran, its /metrics named its latest settled window and gave that window's flight-time and
    send-delay quantiles: each equals the final window table's (the same HDR buckets); the event counters never
    exceed the run's totals and the verdict is one state at a time."""
    run = ()  # no labels: the run's ID is on flightwatch_run_info alone
    w = results.load_windows(str(live)).set_index("window_ns")
    seen = {}
    for s in SCRAPES:
        start = s.get("flightwatch_run_window_start_seconds", {}).get(run)
        if start is not None:
            seen[int(round(start)) * NS] = s
    assert len(seen) >= 5, f"{len(SCRAPES)} scrapes, {len(seen)} windows"
    for window_ns, s in seen.items():
        row = w.loc[window_ns]
        for q, col in (("0.5", "p50"), ("0.9", "p90"), ("0.99", "p99"), ("max", "max")):
            for metric, column in (("flightwatch_run_flight_time", f"latency_us_{col}"),
                                   ("flightwatch_run_send_delay", f"send_delay_us_{col}")):
                name, key = ((f"{metric}_max_seconds", run) if q == "max" else
                             (f"{metric}_seconds", (("quantile", q),)))
                want, got = row[column], s.get(name, {}).get(key)  # seconds, from the table's µs
                assert got == pytest.approx(want / 1e6, rel=1e-12) if want == want else got is None, \
                    (window_ns, name, q, got, want)  # none: no sample
        states = s["flightwatch_run_verdict"]
        assert sum(states.values()) <= 1 and set(v for v in states.values()) <= {0.0, 1.0}
        assert s["flightwatch_run_info"] == {(("run", RUN),): 1.0}
        sent = s["flightwatch_run_events_total"][(("kind", "sent"),)]
        assert 0 < sent <= recorded["truth"]["num_sent"]
        assert (("kind", "dropped"),) not in s["flightwatch_run_events_total"]  # a gauge: it may fall
        assert 0 <= s["flightwatch_run_dropped"][run] <= recorded["truth"]["num_sent"]
    assert sum(len(s.get("flightwatch_run_batches_total", {})) for s in SCRAPES) > 0
    lint = subprocess.run(["promtool", "check", "metrics"], input=LAST_TEXT[0], capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout + lint.stderr  # Prometheus' own linter: names, units, types


def test_a_recomputation_with_another_drop_timeout_matches_its_ground_truth(live, recorded):
    """``replay --drop-timeout 2s`` recomputes the run from its archive into ``<run>/replay-drop2s``: the deliveries
    held by the 3 s pause now come after the timeout, so they are drops (and late receives). Every window's counts
    equal the ground truth computed for a 2 s timeout; the summary names the settings."""
    proc = run_job("replay", "--run", RUN, "--out", str(live), "--drop-timeout", "2s", "--trigger", "100ms")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = live / "replay-drop2s"
    run = recorded["run"]
    t = truth(dataclasses.replace(run, spec=dataclasses.replace(run.spec, drop_timeout_s=2)))
    assert t["num_dropped"] > recorded["truth"]["num_dropped"] + 500  # the pause's backlog
    w = results.load_windows(str(out)).set_index("window_ns")
    for name in ("sent", "received", "dropped", "duplicates", "late", "errors"):
        expected = pd.Series({win: d.get(name, 0) for win, d in t["windows"].items()}, dtype=np.int64)
        got = w[name].reindex(expected.index, fill_value=0)
        assert (got == expected).all(), f"{name}: {got[got != expected].head()} vs {expected[got != expected].head()}"
    s = results.summarize(str(out))
    assert (s["sent"], s["received"], s["dropped"], s["late"]) == (t["num_sent"], t["num_received"], t["num_dropped"], t["num_late"])
    assert s["settings"] == {"window": "1s", "drop_timeout": "2s", "watermark_delay": "5s"}
    assert results.summarize(str(live))["settings"]["drop_timeout"] == "30s"


def test_kill_and_restart_gives_the_undisturbed_results(live, recorded):
    out = recorded["tmp"] / "restarted"
    args = job_args(recorded, out, "--max-offsets-per-trigger", "25")
    proc = subprocess.Popen(job_command(*args), cwd=ROOT, env=job_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    batches = out / "batches"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and len(list(batches.glob("*.json"))) < 8:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # the job and its Spark JVM, by recorded PID group
    proc.wait()
    done_before = len(list(batches.glob("*.json")))
    assert 8 <= done_before < 24, "the kill must land mid-run"
    again = run_job(*args)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "FINISHED" in again.stdout
    pd.testing.assert_frame_equal(comparable(results.load_windows(str(out))), comparable(results.load_windows(str(live))))
    assert results.summarize(str(out))["quarantined"] == recorded["truth"]["num_malformed"]


def test_replay_gives_the_live_results(live):
    """The replay takes the archive in far fewer, larger batches than the live run took (up to 1,000,000 records
    each), and every window and summary figure is the same: the engine does not depend on how records are cut."""
    proc = run_job("replay", "--run", RUN, "--out", str(live), "--trigger", "100ms")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "replay: " in proc.stdout and "records/s" in proc.stdout and "replayed " in proc.stdout, proc.stdout[-2000:]
    replayed = results.load_windows(str(live / "replay"))
    pd.testing.assert_frame_equal(comparable(replayed), comparable(results.load_windows(str(live))))
    live_s, replay_s = results.summarize(str(live)), results.summarize(str(live / "replay"))
    for key in ("sent", "received", "dropped", "duplicates", "late", "errors", "quarantined", "latency_us", "gaps"):
        assert replay_s[key] == live_s[key]
    assert replay_s["num_batches"] < live_s["num_batches"] / 2, (replay_s["num_batches"], live_s["num_batches"])


def test_the_same_run_with_2_and_8_join_partitions_gives_identical_windows_and_summary(live, recorded):
    """The join split by event ID hash into P partitions (``--join-partitions``), each with its own state: live from
    the topic with P = 8 in executor tasks (``--join-on executors``, the cluster's path, here in local mode; other
    micro-batches too), and a replay of the archive in the driver with P = 2, give the P = 1 run's every window and
    summary figure."""
    out = recorded["tmp"] / "p8"
    proc = run_job(*job_args(recorded, out, "--max-offsets-per-trigger", "200", "--join-partitions", "8",
                             "--join-on", "executors"))
    assert proc.returncode == 0 and "FINISHED" in proc.stdout, proc.stderr[-3000:]
    replay = run_job("replay", "--run", RUN, "--out", str(live), "--join-partitions", "2", "--trigger", "100ms")
    assert replay.returncode == 0, replay.stderr[-3000:]
    live_s = results.summarize(str(live))
    for folder in (out, live / "replay"):
        pd.testing.assert_frame_equal(comparable(results.load_windows(str(folder))), comparable(results.load_windows(str(live))))
        s = results.summarize(str(folder))
        assert {k: v for k, v in s.items() if k not in BATCH_KEYS} == {k: v for k, v in live_s.items() if k not in BATCH_KEYS}
