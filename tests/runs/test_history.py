"""``runs history`` and the run index: the index the real sink writes as it closes a run, kept up to date and
rebuilt; series checked for the same test; significant changes with their p-values against an independent
computation, named by the first run after them and its label; ``--fail-on-change``; and the false-change rate per
history, measured, at most 5% (the un-tested detector's above it, so that the measurement can fail)."""
from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys

import numpy as np
import pytest

from bench.compare import build_run, spec_for
from runs import history, index

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NS = 10**9


def cli(*args, checkpoints):
    return subprocess.run([sys.executable, "-m", "runs", *args], capture_output=True, text=True, cwd=ROOT,
                          env=dict(os.environ, FLIGHTWATCH_CHECKPOINTS=str(checkpoints)), timeout=120)


def nightly(folder, i, shift=0.0, pace="500:10", label=None, seed=500):
    s = spec_for(f"hist-{i}", seed + i, 10, 500, shift, wobble=0.02)
    s.start_ns = (1_800_000_000 + 100 * i) * NS
    s.config = dict(s.config, scenario="nightly", schedule_start_ns=s.start_ns, pace=pace,
                    **({"label": label} if label else {}))
    return build_run(str(folder / f"hist-{i}"), s)


@pytest.fixture(scope="module")
def series(tmp_path_factory):
    """Ten runs of one scenario, p99 +40% from the seventh on (the median unchanged), each labelled with its build;
    and an eleventh run of another pace in the same scenario."""
    folder = tmp_path_factory.mktemp("history")
    for i in range(10):
        nightly(folder, i, 0.40 if i >= 6 else 0.0, label=f"build-{i}")
    return folder


def test_the_sink_indexes_the_run_as_it_closes_it(series):
    rows = sqlite3.connect(series / index.FILE).execute("SELECT run_id, series, label, p99_us FROM runs").fetchall()
    assert sorted(r[0] for r in rows) == [f"hist-{i}" for i in range(10)]  # written at close, before any read
    assert {r[1] for r in rows} == {"nightly"} and {r[2] for r in rows} == {f"build-{i}" for i in range(10)}
    summary = json.load(open(series / "hist-3" / "summary.json"))
    assert dict((r[0], r[3]) for r in rows)["hist-3"] == summary["latency_us"]["p99"]


def test_the_index_follows_the_folders_and_rebuilds(tmp_path):
    for i in range(3):
        nightly(tmp_path, i)
    os.makedirs(tmp_path / "running")
    assert [p.run_id for p in index.points(str(tmp_path))] == ["hist-0", "hist-1", "hist-2"]
    os.rename(tmp_path / "hist-1", tmp_path / "elsewhere")  # a folder gone, another come (copied in, not closed here)
    os.remove(tmp_path / index.FILE)
    nightly(tmp_path, 3)
    assert [p.run_id for p in index.points(str(tmp_path))] == ["hist-0", "hist-1", "hist-2", "hist-3"]
    import shutil
    shutil.rmtree(tmp_path / "elsewhere")
    assert [p.run_id for p in index.points(str(tmp_path))] == ["hist-0", "hist-2", "hist-3"]
    # a summary rewritten (the run re-closed by a replay): its new figures are read, not the indexed ones
    path = tmp_path / "hist-2" / "summary.json"
    doc = json.load(open(path))
    doc["latency_us"]["p99"] = 12345.0
    path.write_text(json.dumps(doc))
    assert next(p for p in index.points(str(tmp_path)) if p.run_id == "hist-2").p99_us == 12345.0
    p = cli("index", "--rebuild", checkpoints=tmp_path)
    assert p.returncode == 0 and p.stdout.startswith("3 finished runs in ") and "(rebuilt)" in p.stdout


def test_history_names_the_first_run_after_a_change_with_its_label_and_p_value(series):
    h = history.history("nightly", str(series))
    assert [r["run_id"] for r in h["runs"]] == [f"hist-{i}" for i in range(10)] and h["left_out"] == []
    assert [(c["metric"], c["first_run"], c["label"]) for c in h["change_points"]] == [("p99", "hist-6", "build-6")]
    c = h["change_points"][0]
    assert c["change"] == pytest.approx(0.40, abs=0.08) and c["worse"]
    # the p-value, computed independently: a pooled t-test of the log p99s either side, times the 7 possible splits
    from scipy import stats  # here, not at the top: a worker that collects this module would import it for nothing

    x = np.log([r["p99_us"] for r in h["runs"]])
    t = stats.ttest_ind(x[:6], x[6:], equal_var=True)
    assert c["p_value"] == pytest.approx(min(1.0, t.pvalue * 7), rel=1e-6) and c["p_value"] < 0.001
    p = cli("history", "nightly", checkpoints=series)
    assert p.returncode == 0 and "change point: p99 +" in p.stdout and "from run hist-6 (build-6)" in p.stdout
    assert "<- change: p99" in next(line for line in p.stdout.splitlines() if line.startswith("hist-6 "))
    assert cli("history", checkpoints=series).stdout.split() == ["10", "runs", "nightly"]


def test_fail_on_change_for_ci(series):
    """The change's first run is the 4th newest: the gate fails when it looks that far back, not by default (3)."""
    p = cli("history", "nightly", "--fail-on-change", "--recent", "4", checkpoints=series)
    assert p.returncode == 1, p.stderr
    assert p.stderr.strip().startswith("change in series 'nightly': p99 +") and "from run hist-6 (build-6)" in p.stderr
    assert cli("history", "nightly", "--fail-on-change", checkpoints=series).returncode == 0
    bad = cli("history", "--fail-on-change", checkpoints=series)
    assert bad.returncode == 2 and bad.stderr.strip() == "runs history: error: --fail-on-change needs a series NAME"


def test_runs_of_another_test_are_left_out_and_named(tmp_path):
    for i in range(4):
        nightly(tmp_path, i)
    nightly(tmp_path, 4, pace="400:10")
    nightly(tmp_path, 5)
    h = history.history("nightly", str(tmp_path))
    assert [r["run_id"] for r in h["runs"]] == ["hist-0", "hist-1", "hist-2", "hist-3", "hist-5"]
    assert h["left_out"] == [{"run_id": "hist-4", "differs": ["pace 400:10 (not 500:10)"]}]
    assert "left out: hist-4, another test: pace 400:10 (not 500:10)" in history.text(h)


def test_change_points_and_their_significance_on_known_series():
    rng = np.random.default_rng(3)
    flat = np.exp(rng.normal(0, 0.05, 30))
    assert history.change_points(flat) == []
    step = flat * np.where(np.arange(30) >= 18, 1.3, 1.0)
    [(at, p)] = history.change_points(step)
    assert at == 18 and p < 1e-4
    # two runs on each side are enough for a large step, as long as the runs are quiet
    short = np.exp(rng.normal(0, 0.02, 6)) * np.array([1, 1, 1, 1.5, 1.5, 1.5])
    assert [i for i, _ in history.change_points(short)] == [3]
    # the permutation test, E-Divisive's kind, agrees where it can reach: p is the shuffles' share at least as far
    [(at, p)] = history.change_points(step, test="permutation")
    assert at == 18 and p == pytest.approx(1 / (history.PERMUTATIONS + 1))


def test_the_false_change_rate_per_history_is_at_most_5_percent():
    """400 histories of 20 runs without a change (noise 5% or 10%): the share in which runs.history reports a change
    is at most 5%; PELT's proposals alone, untested, go past it (so this measurement can fail)."""
    from bench.changepoints import histories

    data = [(x, noise) for x, at, _, noise in histories(1600, 20, np.random.default_rng(11)) if at is None]
    assert len(data) == 400
    flagged = sum(bool(history.change_points(np.exp(x))) for x, _ in data)
    assert flagged / len(data) <= 0.05, flagged
    import ruptures as rpt
    untested = sum(bool(rpt.Pelt(model="l2", min_size=2, jump=1).fit(x.reshape(-1, 1)).predict(
        pen=history.PENALTY * max(history.noise(x), 0.01) ** 2 * np.log(len(x)))[:-1]) for x, _ in data)
    assert untested / len(data) > 0.05, untested


def test_an_index_that_cannot_be_opened_falls_back_to_reading_the_folders(tmp_path):
    for i in range(2):
        nightly(tmp_path, i)
    os.remove(tmp_path / index.FILE)
    os.makedirs(tmp_path / index.FILE)  # in its place, something SQLite cannot open (as a read-only copy of the runs)
    assert [p.run_id for p in index.points(str(tmp_path))] == ["hist-0", "hist-1"]
