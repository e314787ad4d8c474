"""Durations and sizes as every command line takes them: durations as vegeta and k6 users write them (Go's
time.ParseDuration), a bare number as seconds."""
from __future__ import annotations

import pytest

from core.units import parse_duration_ns


@pytest.mark.parametrize("text,ns", [
    ("30s", 30_000_000_000), ("500ms", 500_000_000), ("2m", 120_000_000_000), ("1.5s", 1_500_000_000),
    ("1m30s", 90_000_000_000), ("2h", 7_200_000_000_000), ("250us", 250_000), ("250µs", 250_000), ("10ns", 10),
    ("1h2m3.5s", 3_723_500_000_000), ("1s500ms", 1_500_000_000), (".5s", 500_000_000), ("45", 45_000_000_000),
    (" 2m ", 120_000_000_000), ("0", 0)])
def test_durations_as_go_reads_them(text, ns):
    assert parse_duration_ns(text) == ns


@pytest.mark.parametrize("text", ["", "soon", "1m30", "m", "1 m", "-5s", "1d", "5S", "1m 30s", "30s,", "1.2.3s"])
def test_anything_else_is_one_clear_error(text):
    with pytest.raises(ValueError, match=r"^bad duration .*: use e\.g\. 500ms, 30s, 1m30s, 2h$"):
        parse_duration_ns(text)
