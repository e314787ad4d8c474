"""Scenarios as data (``scenarios.spec``), their CLI's bad input, and the report's tables (``scenarios.report``) from
cells of known figures; the scenarios themselves run in ``tests/system/test_scenarios.py``."""
from __future__ import annotations

import subprocess
import sys

import pytest
from support import ROOT

from scenarios import report, spec

GOOD = {"title": "T", "seed": "S report", "method": "m", "kind": "matrix", "sut": "kafka", "pace": "100:2",
        "axes": {"payload": [128, 1024], "acks": ["1", "all"]}, "short": {"pace": "50:1", "axes": {"payload": [128]}}}


def test_every_scenario_in_the_folder_loads_in_both_forms():
    assert "kafka-matrix" in spec.names()
    for name in spec.names():
        full, short = spec.load(name), spec.load(name, short=True)
        assert full.cells() and short.cells() and len(short.cells()) <= len(full.cells())
        assert short.schedule().duration_ns < full.schedule().duration_ns


def test_cells_are_every_combination_the_last_axis_fastest_and_only_restricts_one_axis():
    sc = spec.parse("x", "x.toml", GOOD)
    assert sc.cells() == [{"payload": 128, "acks": "1"}, {"payload": 128, "acks": "all"},
                          {"payload": 1024, "acks": "1"}, {"payload": 1024, "acks": "all"}]
    assert sc.only("payload", ["1024"]).cells() == [{"payload": 1024, "acks": "1"}, {"payload": 1024, "acks": "all"}]
    assert (sc.rows, sc.columns) == ("payload", ("acks",))
    short = spec.parse("x", "x.toml", GOOD, short=True)
    assert (short.pace, short.axes) == ("50:1", {"payload": [128], "acks": ["1", "all"]}) and short.short


@pytest.mark.parametrize("change, words", [
    ({"colour": "red"}, "unknown key 'colour'"),
    ({"kind": "pie"}, "kind 'pie' is not one of matrix"),
    ({"sut": "mq"}, "SUT 'mq' is not one of the stack's"),
    ({"pace": "fast"}, "bad pace step"),
    ({"warmup": "a bit"}, "bad duration"),
    ({"axes": {"colour": [1]}}, "unknown axis 'colour'"),
    ({"axes": {"payload": []}}, "a non-empty list"),
    ({"axes": {"payload": [1, "2"]}}, "of one type"),
    ({"suts": ["kafka", "rabbitmq"]}, "axis 'acks' means something on tansu, kafka only"),
    ({"report": {"rows": "acks", "columns": ["size"]}}, "[report] names 'size', which is not an axis"),
    ({"title": ""}, "'title' must be given"),
])
def test_a_wrong_scenario_file_is_refused_naming_the_file_and_the_key(change, words):
    with pytest.raises(spec.ScenarioError) as e:
        spec.parse("x", "/s/x.toml", {**GOOD, **change})
    assert str(e.value).startswith("/s/x.toml: ") and words in str(e.value)
    with pytest.raises(spec.ScenarioError, match="has no axis 'pairs'"):
        spec.parse("x", "x.toml", GOOD).only("pairs", ["10"])


def cli(*args):
    return subprocess.run([sys.executable, "-m", "scenarios", *args], cwd=ROOT, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("args, words", [
    (["run", "nope"], "no scenario 'nope' (there are: "),
    (["run", "kafka-matrix", "--sut", "artemis"], "runs on kafka, not on artemis"),
    (["run", "kafka-matrix", "--only", "payload"], "bad --only 'payload'"),
    (["run", "kafka-matrix", "--only", "size=1"], "has no axis 'size'"),
    (["run", "kafka-matrix", "--only", "payload=big"], "are not ints"),
    (["run", "kafka-matrix", "--bogus"], "unrecognized arguments"),
])
def test_bad_input_is_one_line_and_exit_2(args, words):
    p = cli(*args)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and words in lines[0], p.stderr


def test_list_and_show_say_what_each_scenario_runs():
    p = cli("list")
    assert p.returncode == 0 and "kafka-matrix" in p.stdout and "Event Streams" in p.stdout
    p = cli("show", "kafka-matrix", "--only", "payload=128")
    assert p.returncode == 0 and "4 cells:" in p.stdout and "c04  payload=128,acks=all,partitions=3" in p.stdout


def _cell(payload, acks, ceiling, p99_us, limit=None):
    return {"cell": {"payload": payload, "acks": acks}, "run_id": f"r-{payload}-{acks}", "exit": 0, "sent": 100,
            "received": 100, "dropped": 0, "errors": 0, "p50_us": 1000, "p99_us": p99_us, "ceiling_per_s": ceiling,
            "limit": limit, "state": "ok", "message": "ok", "cpu_us_per_event": 40.0}


def test_the_matrix_report_has_the_seeds_shape_rows_by_size_columns_by_the_other_axes():
    sc = spec.parse("m", "m.toml", GOOD)
    cells = [_cell(128, "1", 8000, 2500, "loadgen-bound at 16,000/s"), _cell(128, "all", 4000, 3500, "saturated at 8,000/s"),
             _cell(1024, "1", 2000, 9000)]
    text = report.markdown(report.document(sc, "kafka", "scen-1", cells, 1_800_000_000 * 10**9, False))
    assert "| payload | acks=1 | acks=all |" in text
    assert "| 128 B | 8,000/s | 4,000/s |" in text
    assert "| 1,024 B | 2,000/s (every step ok: the ceiling is higher) | not run |" in text
    assert "| 128 B | 2.50 ms | 3.50 ms |" in text and "(**not finished**: the cells so far)" in text
    assert text.count("| payload=") == 3 and "loadgen-bound at 16,000/s" in text


def test_a_ramps_limit_is_the_first_step_past_its_knee_that_was_not_ok():
    from scenarios.runner import limit

    steps = [{"step": 1, "rate": 1000.0, "state": "ok"}, {"step": 2, "rate": 2000.0, "state": "degrading"},
             {"step": 3, "rate": 4000.0, "state": "ok"}, {"step": 4, "rate": 6000.0, "state": "observer-bound"},
             {"step": 5, "rate": 8000.0, "state": "saturated"}]
    assert limit(steps, 3) == "observer-bound at 6,000/s"  # the wobble at 2,000/s, below the knee, is not it
    assert limit(steps, None) == "degrading at 2,000/s" and limit(steps[:3], 3) is None
