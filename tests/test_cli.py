"""Bad input to the job's command line: one line on stderr, exit code 2, no traceback."""
import pytest

from conftest import free_port, run_job

CASES = [
    # (arguments, words the one-line error must contain)
    (["run", "--run", "x", "--bogus"], "unrecognized arguments"),
    (["run"], "required"),
    (["run", "--run", "x", "--drop-timeout", "soon"], "bad duration"),
    (["run", "--run", "x", "--window", "7s"], "divide"),
    (["run", "--run", "x", "--max-offsets-per-trigger", "0"], "positive"),
    (["frobnicate"], "invalid choice"),
    (["summary", "--run", "no-such-run", "--checkpoints", "/nonexistent"], "no run at"),
    (["replay", "--run", "no-such-run", "--checkpoints", "/nonexistent"], "nothing to replay"),
]


@pytest.mark.parametrize("args,words", CASES, ids=[" ".join(a) for a, _ in CASES])
def test_bad_flags(args, words):
    proc = run_job(*args, timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in proc.stderr


def test_unreachable_bootstrap():
    port = free_port()  # nothing listens there
    proc = run_job("run", "--run", "x", "--bootstrap", f"127.0.0.1:{port}", timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert lines == [lines[0]] and "cannot reach the telemetry broker" in lines[0]


def test_help_explains():
    proc = run_job("run", "--help", timeout=60)
    assert proc.returncode == 0 and "--drop-timeout" in proc.stdout and "--bootstrap" in proc.stdout
