"""``runs compare``'s calibration (``bench.calibrate``) in a short form: 40 synthetic sets of each kind (5 baseline
runs and a candidate, 120 windows each, slow stretches and a run effect). The product meets the goals (false alarms
<= 5% with the upper bound under 7.5%, coverage >= 93%, detection >= 95%) but the detection of p50 +15% (93.5% in
the full study); two broken judges fail them, as they must:
a constant-width interval misses the +15% p50, and a bootstrap without blocks covers too little where the windows
carry the interval. The full study, 200
sets of each kind, is ``python -m bench.calibrate`` (docs/benchmarks/calibration.md)."""
from __future__ import annotations

import pytest

from bench import calibrate

pytestmark = pytest.mark.serial  # both cores busy for a minute: beside make test's Spark jobs, one failed to start
WORKERS = 2
"""Processes of the study (each set is seeded by its kind and number: the figures do not depend on how many)."""


def test_the_product_meets_its_goals_but_one():
    """No false alarm, coverage at least 93%, p99 +30% always found. p50 +15% is found in 93.5% of the full study's
    200 sets, short of the 95% goal (docs/benchmarks/calibration.md): here at least 85% of 40, so that a worse judge fails."""
    r = calibrate.study(40, 5, 120, 250, "product", log=lambda m: None, workers=WORKERS)
    text = calibrate.report(r, "product")
    assert r["same"]["any_flag"] == 0 and r["verdict"]["false_alarms_upper"] < 0.075, text
    assert r["verdict"]["coverage"] >= 0.93 and r["p99 +30%"]["detected"] >= 0.95, text
    assert r["p50 +15%"]["detected"] >= 0.85, text


def test_a_constant_width_interval_fails_the_detection_goal():
    r = calibrate.study(20, 3, 60, 250, "constant", log=lambda m: None, workers=WORKERS, kinds=("p50 +15%",))
    assert r["p50 +15%"]["detected"] < 0.95, calibrate.report(r, "constant")


def test_a_bootstrap_without_blocks_covers_far_less_where_the_windows_carry_the_interval():
    """One baseline run, no run effect and none assumed, slow stretches of coefficient 0.7: the interval is the
    windows' bootstrap alone. Without blocks (the slow stretches taken for independent seconds) it covers the truth
    far less often than with them, and fails the goal. (The block bootstrap too falls short of 93% here, at 120
    windows: docs/benchmarks/calibration.md. From five baseline runs on, the runs' own spread carries the interval.)"""
    model = (0.7, 0.05, 0.0)
    good = calibrate.study(40, 1, 120, 250, "product", log=lambda m: None, workers=WORKERS, spread=0.0, model=model,
                           kinds=("same",))
    bad = calibrate.study(40, 1, 120, 250, "noblocks", log=lambda m: None, workers=WORKERS, spread=0.0, model=model,
                          kinds=("same",))
    assert bad["verdict"]["coverage"] < 0.93, calibrate.report(bad, "noblocks")
    assert bad["verdict"]["coverage"] <= good["verdict"]["coverage"] - 0.05, (good["verdict"], bad["verdict"])
