"""Bursts' figures from a run's archive (``scenarios.bursts``), against the injected data: a synthetic run whose
receives stall for 2 s (its backlog then drains), read with a schedule whose burst step is those 2 s."""
from __future__ import annotations

import numpy as np
import pytest

from loadgen.synthetic import NS
from scenarios import bursts
from scenarios.pairs import nearest_rank


@pytest.fixture(scope="module")
def run(synthetic):
    return synthetic("bursty", duration_s=16, rate_per_sec=300, drop_fraction=0.0, duplicate_fraction=0.0,
                     error_fraction=0.0, late_count=0, pause=(8.0, 2.0))


def test_each_burst_its_flight_time_and_recovery_and_each_receivers_throughput(run):
    root, spec, truth = run
    t0 = spec.start_ns
    steps = [{"rate": 300.0, "start_ns": t0, "end_ns": t0 + 8 * NS},
             {"rate": 600.0, "start_ns": t0 + 8 * NS, "end_ns": t0 + 10 * NS},  # the burst: what the stall held
             {"rate": 0.0, "start_ns": t0 + 10 * NS, "end_ns": t0 + 12 * NS},
             {"rate": 300.0, "start_ns": t0 + 12 * NS, "end_ns": t0 + 16 * NS}]
    f = bursts.burst_figures(root, steps)
    flight = (truth.recv_ns - truth.sent_ns) / 1000
    in_burst = (truth.intended_ns >= t0 + 8 * NS) & (truth.intended_ns < t0 + 10 * NS)
    (b,) = f["bursts"]
    assert (b["step"], b["rate"], b["sent"], b["received"], b["unreceived"]) == (2, 600.0, in_burst.sum(), in_burst.sum(), 0)
    assert b["p99_us"] == nearest_rank(flight[in_burst], 99)
    assert b["recovery_s"] == pytest.approx((truth.recv_ns[in_burst].max() - (t0 + 10 * NS)) / 1e9)
    sustained = (truth.intended_ns < t0 + 8 * NS) | (truth.intended_ns >= t0 + 12 * NS)  # not the burst, nor the silence
    assert f["sustained"]["sent"] == sustained.sum() and f["sustained"]["p99_us"] == nearest_rank(flight[sustained], 99)
    assert f["receivers"] == {"receiver-0": {"received": len(truth.sent_ns), "per_s": len(truth.sent_ns) / 14}}
    assert np.isclose(b["max_us"], flight[in_burst].max())
