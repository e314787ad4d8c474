"""Each pair's figures from a run's archive (``scenarios.pairs``), against the injected data: a synthetic run with
drops, refusals, duplicates, late receives and a stall, written by the real decoder, engine and sink (no Spark),
its events dealt to 7 pairs as the load generator deals them (event k to pair k mod 7)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from loadgen.synthetic import NS
from scenarios import pairs

PAIRS = 7


def nearest(v, p):
    v = np.sort(v)
    return float(v[max(math.ceil(p / 100 * len(v)), 1) - 1]) if len(v) else None


@pytest.fixture(scope="module")
def run(synthetic):
    return synthetic("pairs", duration_s=20, rate_per_sec=350, drop_fraction=0.02, duplicate_fraction=0.01,
                     error_fraction=0.01, late_count=9, pause=(8.0, 2.0), num_malformed=3)


def test_each_pairs_counts_and_percentiles_are_the_injected_ones(run):
    root, spec, truth = run
    rows = pairs.per_pair(pairs.events(root), PAIRS, spec.drop_timeout_s * NS)
    assert list(rows["pair"]) == list(range(PAIRS))
    k = np.arange(len(truth.sent_ns))
    dup = np.array([int(e.rsplit("-", 1)[1]) for e in truth.dup_ids], dtype=np.int64)
    for pair in range(PAIRS):
        mine = k % PAIRS == pair
        got = mine & (truth.recv_ns > 0)
        flight = truth.recv_ns - truth.sent_ns
        in_time = got & (flight <= spec.drop_timeout_s * NS)
        r = rows.iloc[pair]
        assert (r["sent"], r["received"], r["lost"], r["late"], r["duplicates"]) == (
            mine.sum(), got.sum(), (mine & ~got).sum(), (got & ~in_time).sum(), (dup % PAIRS == pair).sum()), pair
        assert r["p50_us"] == nearest(flight[in_time] / 1000, 50) and r["p99_us"] == nearest(flight[in_time] / 1000, 99)
        delay = (truth.sent_ns - truth.intended_ns)[mine] / 1000
        assert r["send_delay_p99_us"] == nearest(delay, 99)


def test_the_distribution_across_pairs_and_the_jobs_totals_agree(run):
    root, spec, _ = run
    import json

    summary = json.load(open(f"{root}/summary.json"))
    f = pairs.pair_figures(root, PAIRS, spec.drop_timeout_s * NS, summary)
    assert f["disagreements"] == []
    p99s = [r["p99_us"] for r in f["per_pair"]]
    assert f["pairs"] == PAIRS and f["worst_pair_p99_us"] == max(p99s) and p99s[f["worst_pair"]] == max(p99s)
    assert f["pair_p99_median_us"] == nearest(p99s, 50) and f["pair_p99_p99_us"] == max(p99s)  # 7 pairs: p99 is the top
    assert f["pairs_with_loss"] == sum(r["lost"] > 0 for r in f["per_pair"]) > 0
    # a job's total that the pairs do not add up to is named
    assert pairs.consistent(pd_rows(f), dict(summary, sent=summary["sent"] + 1)) == [
        f"sent: pairs {summary['sent']:,}, job {summary['sent'] + 1}"]


def pd_rows(f):
    import pandas as pd

    return pd.DataFrame(f["per_pair"])


def test_a_measured_span_leaves_the_warm_up_out_of_each_pairs_percentiles_not_of_its_counts(run):
    root, spec, truth = run
    lo, hi = spec.start_ns + 5 * NS, spec.start_ns + 15 * NS
    whole = pairs.per_pair(pairs.events(root), PAIRS, spec.drop_timeout_s * NS)
    rows = pairs.per_pair(pairs.events(root), PAIRS, spec.drop_timeout_s * NS, (lo, hi))
    assert rows[["sent", "received", "lost", "late", "duplicates"]].equals(whole[["sent", "received", "lost", "late", "duplicates"]])
    k = np.arange(len(truth.sent_ns))
    flight = truth.recv_ns - truth.sent_ns
    for pair in (0, 6):
        sel = (k % PAIRS == pair) & (truth.recv_ns >= lo) & (truth.recv_ns < hi) & (flight <= spec.drop_timeout_s * NS)
        assert rows.iloc[pair]["p99_us"] == nearest(flight[sel] / 1000, 99)
        sends = (k % PAIRS == pair) & (truth.sent_ns >= lo) & (truth.sent_ns < hi)
        assert rows.iloc[pair]["send_delay_p99_us"] == nearest((truth.sent_ns - truth.intended_ns)[sends] / 1000, 99)
