"""``runs compare`` on run folders written by the real decoder, engine and sink from synthetic
runs of known distribution (``bench.compare.build_run``; no Spark): figures against numpy ground truth, the
bootstrap's blocks, the verdicts on pairs of known difference, the gate and the refusals (``runs history``'s too).
The history itself is in ``test_history``."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from bench.compare import build_run, spec_for
from loadgen.synthetic import generate
from runs import bootstrap, compare
from runs.compare import Gate, Incomparable, RunSample

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NS = 10**9
SECONDS, RATE = 60, 300


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("runs")


def run_of(folder, run_id, seed, shift=0.0, **spec):
    s = spec_for(run_id, seed, SECONDS, RATE, shift)
    for k, v in spec.items():
        setattr(s, k, v)
    if not os.path.exists(folder / run_id / "summary.json"):
        build_run(str(folder / run_id), s)
    return str(folder / run_id), s


def nearest_rank(values, p):
    v = np.sort(values)
    return v[max(math.ceil(p / 100 * len(v) - 1e-9), 1) - 1]


def test_figures_are_exact_against_the_injected_data(folder):
    root, spec = run_of(folder, "truth", 1)
    sample = RunSample.load(root)
    run = generate(spec)
    # the sending span's windows: receives in time whose receive lies in them, sends in them
    first, last = sample.windows.min(), sample.windows.max() + NS
    ok = (run.recv_ns > 0) & (run.recv_ns - run.sent_ns <= spec.drop_timeout_s * NS)
    inside = ok & (run.recv_ns >= first) & (run.recv_ns < last)
    lat_us = (run.recv_ns[inside] - run.sent_ns[inside]) // 1000
    fig = bootstrap.figures(sample.scope)
    for p in (50, 90, 99):
        truth = nearest_rank(lat_us, p)
        assert truth <= fig[f"p{p}"][0] <= truth * (1 + 1 / 1024) + 1, p  # HDR: the bucket's highest value
    assert lat_us.max() <= fig["max"][0] <= lat_us.max() * (1 + 1 / 1024) + 1
    sent_in = ((run.sent_ns >= first) & (run.sent_ns < last)).sum()
    assert fig["achieved"][0] == pytest.approx(sent_in / len(sample.windows))
    assert fig["delivered"][0] == pytest.approx(inside.sum() / len(sample.windows))
    dropped = ((run.recv_ns < 0) & (run.sent_ns >= first) & (run.sent_ns < last)).sum()
    assert fig["loss"][0] == pytest.approx(100 * dropped / sent_in)
    delay_us = (run.sent_ns - run.intended_ns)[(run.sent_ns >= first) & (run.sent_ns < last)] // 1000
    assert nearest_rank(delay_us, 99) <= fig["send_delay_p99"][0] <= nearest_rank(delay_us, 99) * (1 + 1 / 1024) + 1


def test_block_weights_draw_whole_blocks_of_consecutive_windows():
    w = bootstrap.block_weights(23, 5, 300, np.random.default_rng(0))
    assert w.shape == (300, 23) and (w.sum(axis=1) == 23).all()
    assert w.min() >= 0 and w.max() <= 5  # a window is in at most 5 blocks
    # a window's neighbours come with it: draws of neighbours correlate, of far windows they do not
    c = np.corrcoef(w.T)
    assert np.mean([c[i, i + 1] for i in range(5, 17)]) > 0.5 > np.mean([c[i, i + 10] for i in range(5, 12)]) + 0.3
    # never wrapping the run's end to its start: the last window and the first are never in one block
    assert abs(c[0, 22]) < 0.15 and c[0, 1] > 0.5 and c[21, 22] > 0.5


def test_the_block_length_follows_the_series_own_autocorrelation():
    """Politis-White on AR(1) series of 600 windows: none for white noise, longer the longer the memory (for an
    AR(1) of coefficient φ the rule's block is (2 G² / D)^(1/3) n^(1/3), G/γ0 = 2φ/(1-φ)², D/γ0² = 4/3 ((1+φ)/(1-φ))²:
    about 8 at φ = 0.6 and 17 at 0.85 for n = 600)."""
    rng = np.random.default_rng(3)

    def ar(phi, n=600):
        x = np.zeros(n)
        for t in range(1, n):
            x[t] = phi * x[t - 1] + rng.normal()
        return x
    assert bootstrap.block_length(rng.normal(size=600)) <= 2
    b6, b85 = bootstrap.block_length(ar(0.6)), bootstrap.block_length(ar(0.85))
    assert 5 <= b6 <= 14 and 11 <= b85 <= 30 and b85 > b6, (b6, b85)
    assert bootstrap.block_length(np.ones(50)) == 1 and bootstrap.block_length(ar(0.99, 30)) <= 10


def test_holm_rejects_step_down_at_the_family_wise_rate():
    assert bootstrap.holm([0.001, 0.04, 0.03, 0.5]) == [True, False, False, False]  # 0.03 > 0.05/3
    assert bootstrap.holm([0.001, 0.012, 0.02, 0.04]) == [True, True, True, True]   # 0.012 <= 0.05/3, 0.02 <= 0.05/2
    assert bootstrap.holm([0.2, 0.01]) == [False, True]


def test_a_run_against_itself_is_within_noise(folder):
    root, _ = run_of(folder, "truth", 1)
    rep = compare.compare(RunSample.load(root), RunSample.load(root))
    for r in rep["whole_run"]:
        assert r["verdict"] in ("not judged", "no interval") or r["verdict"].startswith("within noise"), r
        if r["ci_low"] is not None:
            assert r["change"] == 0 and r["ci_low"] <= 0 <= r["ci_high"], r
    assert rep["headline"].startswith("within noise (±")


def test_verdicts_on_pairs_of_known_difference(folder):
    """Six pairs of the same distribution and six with p99 +30% (the median unchanged): the same are never a
    regression or an improvement; every +30% is a p99 regression; the intervals hold the true change. These runs have
    no run-to-run effect, and are compared so (``run_spread=0``). The full study, 40 pairs a set with +5% too, is
    ``python -m bench.compare``; with run-level effects, ``python -m bench.calibrate``."""
    same, shifted = [], []
    for i in range(6):
        base = RunSample.load(run_of(folder, f"b{i}", 100 + i)[0])
        same.append(compare.compare(base, RunSample.load(run_of(folder, f"s{i}", 200 + i)[0]), seed=i, run_spread=0.0))
        shifted.append(compare.compare(base, RunSample.load(run_of(folder, f"x{i}", 300 + i, 0.30)[0]), seed=i,
                                       run_spread=0.0))
    p99 = lambda rep: next(r for r in rep["whole_run"] if r["metric"] == "p99")  # noqa: E731
    # a 95% interval: it holds the true change (0, +30%) in most pairs (all 12 here but one)
    covered = [p99(r)["ci_low"] <= 0 <= p99(r)["ci_high"] for r in same] + [
        p99(r)["ci_low"] <= 0.30 <= p99(r)["ci_high"] for r in shifted]
    assert sum(covered) >= 11, covered
    for rep in same:
        assert not any(r["verdict"] in ("regression", "improvement") for r in rep["whole_run"]), compare.text(rep)
    for rep in shifted:
        assert p99(rep)["verdict"] == "regression", compare.text(rep)
        assert rep["headline"].startswith("regression: ") and "p99 +" in rep["headline"]
        p50 = next(x for x in rep["whole_run"] if x["metric"] == "p50")
        assert p50["verdict"].startswith("within noise"), compare.text(rep)


def test_a_baseline_of_three_runs_measures_their_spread_and_judges_the_candidate_against_all(folder):
    """Three baseline runs: their run-to-run spread is measured (not assumed) and said; an unchanged candidate is
    within noise on every figure, a p99 +30% one a p99 regression; the CLI takes them as --baseline r1,r2,r3 and as a
    series' last runs before the candidate."""
    bases = [RunSample.load(run_of(folder, f"b{i}", 100 + i)[0]) for i in range(3)]
    same = compare.compare(bases, RunSample.load(run_of(folder, "s0", 200)[0]))
    shifted = compare.compare(bases, RunSample.load(run_of(folder, "x0", 300, 0.30)[0]))
    assert same["baselines"] == ["b0", "b1", "b2"] and same["windows"]["baseline"] == 3 * same["windows"]["candidate"]
    assert not any(r["verdict"] in ("regression", "improvement") for r in same["whole_run"]), compare.text(same)
    assert next(r for r in shifted["whole_run"] if r["metric"] == "p99")["verdict"] == "regression", compare.text(shifted)
    assert 0 <= same["run_spread"]["p99"] < 0.05 and same["block_windows"] >= 1
    p = cli("compare", "--baseline", "b0,b1,b2", "x0", "--fail-on-regression", "p99>+10%", checkpoints=folder)
    assert p.returncode == 1 and "compare: baseline b0, b1, b2 -> candidate x0" in p.stdout, p.stdout + p.stderr
    assert "run-to-run spread, from the baseline runs: p50 ±" in p.stdout and "the baseline runs drawn first" in p.stdout
    for i in range(4):
        s = spec_for(f"ser-{i}", 700 + i, 20, 300)
        s.start_ns = (1_800_000_000 + 100 * i) * NS
        s.config = dict(s.config, scenario="nightly-b", schedule_start_ns=s.start_ns, pace="300:20")
        build_run(str(folder / f"ser-{i}"), s)
    p = cli("compare", "--baseline-series", "nightly-b", "--last", "2", "ser-3", checkpoints=folder)
    assert p.returncode == 0 and p.stdout.startswith("compare: baseline ser-1, ser-2 -> candidate ser-3"), p.stdout


def test_each_pace_step_is_compared(folder):
    steps = {"pace": "150:30,300:30", "steps": [
        {"rate": 150.0, "end_rate": 150.0, "start_ns": 1_800_000_000 * NS, "end_ns": 1_800_000_030 * NS},
        {"rate": 300.0, "end_rate": 300.0, "start_ns": 1_800_000_030 * NS, "end_ns": 1_800_000_060 * NS}]}
    a = RunSample.load(run_of(folder, "step-a", 5, config=dict(spec_for("x", 0, SECONDS, RATE).config, **steps))[0])
    b = RunSample.load(run_of(folder, "step-b", 6, 0.3, config=dict(spec_for("x", 0, SECONDS, RATE).config, **steps))[0])
    rep = compare.compare(a, b)
    assert [(s["step"], s["rate"]) for s in rep["steps"]] == [(1, 150.0), (2, 300.0)]
    for s, scope in zip(rep["steps"], a.steps):
        assert scope[1].n == 30  # the windows wholly inside the step
        assert next(r for r in s["changes"] if r["metric"] == "p99")["change"] > 0.1
    assert "step 2 (300/s)" in compare.text(rep)


def test_runs_that_are_not_the_same_test_are_refused(folder):
    a = RunSample.load(run_of(folder, "truth", 1)[0])
    other = dict(spec_for("x", 0, SECONDS, RATE).config, pace="2000:60")
    b = RunSample.load(run_of(folder, "other-pace", 2, config=other)[0])
    with pytest.raises(Incomparable, match="different schedules"):
        compare.compare(a, b)
    http = dict(spec_for("x", 0, SECONDS, RATE).config, target="http://127.0.0.1:8080/")
    c = RunSample.load(run_of(folder, "other-kind", 2, config=http)[0])
    with pytest.raises(Incomparable, match="different target kinds: truth attacked kafka://, other-kind http://"):
        compare.compare(a, c)


def cli(*args, checkpoints):
    return subprocess.run([sys.executable, "-m", "runs", *args], capture_output=True, text=True, cwd=ROOT,
                          env=dict(os.environ, FLIGHTWATCH_CHECKPOINTS=str(checkpoints), FLIGHTWATCH_UI_PORT="18501"),
                          timeout=120)


def test_cli_gate_and_json(folder):
    """One baseline run: the output says its run-to-run spread is unknown and takes the stated 5% for both runs, which
    a +30% p99 over 60 s does not clear at a 10% gate; with the spread given as none (these synthetic runs have no
    run effect) the gate is crossed, and exits 1."""
    run_of(folder, "b0", 100)
    run_of(folder, "x0", 300, 0.30)
    assumed = cli("compare", "b0", "x0", "--fail-on-regression", "p99>+10%", checkpoints=folder)
    assert assumed.returncode == 0, assumed.stdout
    lines = assumed.stdout.splitlines()
    assert "judged figures, family-wise 5%" in lines[1] and "Politis-White" in lines[1] and "Holm across the " in lines[1]
    assert lines[2].startswith("run-to-run spread: unknown with one baseline run; times taken to spread ±5%")
    assert lines[-1] == "dashboard: http://127.0.0.1:18501/?run=x0&compare=b0"  # the link opens this comparison
    p = cli("compare", "b0", "x0", "--fail-on-regression", "p99>+10%", "--fail-on-regression", "p50>+10%",
            "--run-spread", "0%", checkpoints=folder)
    assert p.returncode == 1, p.stderr
    assert p.stderr.strip() == "regression gate crossed: p99>+10%"
    lines = p.stdout.splitlines()
    assert any(line.startswith("regression: ") for line in lines[:5]) and "flight p99" in p.stdout
    saved = json.load(open(folder / "x0" / "compare.json"))
    assert saved["baseline"] == "b0" and saved["gates"] == [{"gate": "p99>+10%", "crossed": True},
                                                           {"gate": "p50>+10%", "crossed": False}]
    # the lower bound is under +50%: that gate holds
    assert cli("compare", "b0", "x0", "--fail-on-regression", "p99>+50%", "--run-spread", "0%",
               checkpoints=folder).returncode == 0


@pytest.mark.parametrize("args, message", [
    (["compare", "b0", "nope"], "runs compare: error: no run 'nope' (not a run folder, nor a run in "),
    (["compare", "b0", "x0", "--fail-on-regression", "p99>10ms"], "runs compare: error: bad --fail-on-regression 'p99>10ms'"),
    (["compare", "b0", "x0", "--fail-on-regression", "max>+10%"], "runs compare: error: bad --fail-on-regression 'max>+10%': max is one value"),
    (["compare", "b0", "x0", "--noise", "lots"], "runs compare: error: bad --noise 'lots'"),
    (["compare", "b0", "other-kind"], "runs compare: error: different target kinds"),
    (["compare", "b0", "unfinished"], "runs compare: error: run unfinished is not finished"),
    (["history", "no-such-series"], "runs history: error: no finished runs in series 'no-such-series' (series: "),
    (["compare", "b0"], "runs compare: error: give BASELINE CANDIDATE, or --baseline R1,R2,... CANDIDATE"),
    (["compare", "--baseline", "b0,x0", "x0"], "runs compare: error: the candidate x0 is one of its baseline runs"),
    (["compare", "--baseline-series", "nope", "x0"], "runs compare: error: no finished runs in series 'nope'"),
    (["compare", "b0", "x0", "--run-spread", "120%"], "runs compare: error: bad --run-spread '120%'"),
])
def test_bad_input_is_one_line_and_exit_2(folder, args, message):
    run_of(folder, "b0", 100)
    run_of(folder, "x0", 300, 0.30)
    run_of(folder, "other-kind", 2, config=dict(spec_for("x", 0, SECONDS, RATE).config, target="http://127.0.0.1:8080/"))
    os.makedirs(folder / "unfinished", exist_ok=True)
    (folder / "unfinished" / "run.json").write_text("{}")
    p = cli(*args, checkpoints=folder)
    assert p.returncode == 2 and len(p.stderr.splitlines()) == 1 and p.stderr.startswith(message), p.stderr


def test_gate_parsing():
    g = Gate.parse("p99>+10%")
    assert (g.metric.name, g.above, g.limit) == ("p99", True, pytest.approx(0.10))
    g = Gate.parse("delivered<-5%")
    assert (g.above, g.limit) == (False, pytest.approx(-0.05))
    assert Gate.parse("loss>+0.5%").limit == pytest.approx(0.5)  # loss in percentage points
    row = {"metric": "delivered", "ci_low": -0.09, "ci_high": -0.06}
    assert g.crossed({"whole_run": [row]}) and not g.crossed({"whole_run": [dict(row, ci_high=-0.04)]})


def test_warmup_and_cooldown_are_left_out_of_the_latency_figures_and_the_comparison(folder):
    """A run that set ``--warmup 10s --cooldown 5s``: its summary's ``measured`` percentiles are the injected
    receives' in the 45 s between (nearest rank, to the HDR bucket), its counts stay the whole run's, and
    ``runs compare`` takes only those windows and says what it left out."""
    root, spec = run_of(folder, "trimmed", 3)
    spec.config = dict(spec.config, warmup_s=10.0, cooldown_s=5.0)
    build_run(root + "-t", spec)
    summary = json.load(open(os.path.join(root + "-t", "summary.json")))
    run = generate(spec)
    start = spec.config["schedule_start_ns"]
    lo, hi = start + 10 * NS, start + (SECONDS - 5) * NS
    m = summary["measured"]
    assert (m["from_ns"], m["to_ns"], m["num_windows"]) == (lo, hi, SECONDS - 15)
    ok = (run.recv_ns > 0) & (run.recv_ns - run.sent_ns <= spec.drop_timeout_s * NS)
    inside = ok & (run.recv_ns >= lo) & (run.recv_ns < hi)
    lat_us = (run.recv_ns[inside] - run.sent_ns[inside]) // 1000
    for p in (50, 99):
        truth = nearest_rank(lat_us, p)
        assert truth <= m["latency_us"][f"p{p}"] <= truth * (1 + 1 / 1024) + 1, p
    assert m["received"] == inside.sum()
    assert summary["sent"] == len(run.sent_ns)  # the whole run's counts: nothing is left uncounted
    sample = RunSample.load(root + "-t")
    assert sample.windows.min() == lo and sample.windows.max() == hi - NS and sample.trim == (10.0, 5.0)
    rep = compare.compare(RunSample.load(root), sample)
    assert rep["windows"]["candidate"] == SECONDS - 15
    assert "left out, warm-up and cool-down: 0 s and 0 s of the baseline, 10 s and 5 s of the candidate" in compare.text(rep)
