"""Pass/fail thresholds for a load test, as a CI job uses them (pure: parsing and evaluation).

    METRIC OP VALUE[UNIT] [for DURATION]

    METRIC  p50 p90 p95 p99 max mean   request latency (ms by default; us, ms, s)
            success                    share of requests answered 2xx (99% as a percent, or 0.99 as a ratio)
            errors                     failed requests (count)
            rate                       requests sent per second
            loss                       events sent but never received (0.1% or 0.001; a bare 1 or more is
                                       refused: a percent needs %; flight figures from the
                                       streaming job, so only with --stream and without "for")
    OP      < <= > >=

Without ``for``, a threshold is judged on the whole run. With ``for 10s`` it is crossed when
it holds in each of 10 consecutive seconds (judged on each second's own figures): a sustained
breach, not one slow second. ``--fail-on`` judges at the end (exit 1); ``--abort-on`` judges
every second while the attack runs and stops it at the first breach (exit 3), as k6's
``abortOnFail`` does.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from core import output
from core.units import parse_duration_ns

LATENCY = ("p50", "p90", "p95", "p99", "max", "mean")
METRICS = LATENCY + ("success", "errors", "rate", "loss")
_SYNTAX = re.compile(r"^\s*(\w+)\s*(<=|>=|<|>)\s*([\d.]+)\s*(us|ms|s|%)?\s*(?:for\s+(\S+))?\s*$")
EXAMPLES = "e.g. 'p99>500ms', 'p99>500ms for 10s', 'success<99%', 'errors>0', 'rate<4900', 'loss>0.1%'"


@dataclass(frozen=True)
class Threshold:
    metric: str
    op: str
    limit: float          # µs for latencies, a ratio for success and loss
    for_s: int = 0        # 0: judged on the whole run
    text: str = ""

    @classmethod
    def parse(cls, text: str, flag: str = "--fail-on") -> Threshold:
        m = _SYNTAX.match(text)
        if not m or m.group(1) not in METRICS:
            raise ValueError(f"bad {flag} {text!r}: {EXAMPLES}")
        metric, op, value, unit, dur = m.groups()
        try:
            v = float(value)
        except ValueError:
            raise ValueError(f"bad {flag} {text!r}: {value!r} is not a number") from None
        if metric in LATENCY:
            if unit == "%":
                raise ValueError(f"bad {flag} {text!r}: a latency takes us, ms or s")
            v *= {"us": 1, "ms": 1_000, "s": 1_000_000, None: 1_000}[unit]
        elif metric in ("success", "loss"):  # a percent says so; a bare number is a ratio, never guessed
            if unit not in ("%", None):
                raise ValueError(f"bad {flag} {text!r}: {metric} takes a percent (1%) or a ratio (0.01)")
            if unit is None and (v > 1 or v == 1 and metric == "loss"):
                raise ValueError(f"bad {flag} {text!r}: a bare {value} is read as a ratio ({v:g} = {v * 100:g}%); "
                                 f"write {metric}{op}{value}% for a percent, or a ratio such as {metric}{op}0.01")
            if unit == "%" and v > 100:
                raise ValueError(f"bad {flag} {text!r}: a percent is at most 100%")
            v = v / 100 if unit == "%" else v
        elif unit:
            raise ValueError(f"bad {flag} {text!r}: {metric} takes no unit")
        for_s = 0
        if dur:
            try:
                for_s = int(round(parse_duration_ns(dur) / 1e9))
            except ValueError as e:
                raise ValueError(f"bad {flag} {text!r}: {e}") from None
            if for_s < 1:
                raise ValueError(f"bad {flag} {text!r}: 'for' needs at least 1s")
        if metric == "loss" and (for_s or flag == "--abort-on"):
            raise ValueError(f"bad {flag} {text!r}: loss is known once the streaming job closes the run: "
                             "use it with --fail-on, without 'for'")
        return cls(metric, op, v, for_s, text.strip())

    def holds(self, value: float | None) -> bool:
        """The condition is met (a missing figure meets it: nothing measured is not a pass)."""
        if value is None:
            return True
        return {"<": value < self.limit, ">": value > self.limit, "<=": value <= self.limit, ">=": value >= self.limit}[self.op]


def run_value(t: Threshold, figures: dict, flight: output.Summary | None = None) -> float | None:
    """The whole run's figure for a threshold: the load generator's report, and the flight summary (the streaming
    job's, ``core.output.Summary``) for loss."""
    if t.metric in LATENCY:
        return figures["latency_us"][t.metric]
    if t.metric == "success":
        return figures["success_ratio"]
    if t.metric == "rate":
        return figures["rate_per_sec"]
    if t.metric == "errors":
        return sum(figures["errors"].values())
    return (flight or {}).get("loss_ratio")


def second_value(t: Threshold, iv) -> float | None:
    """One second's figure (``loadgen.stats.Interval``)."""
    if t.metric in ("p50", "p90", "p95", "p99"):
        return iv.latency_percentiles((int(t.metric[1:]),))[0]
    if t.metric == "max":
        return iv.latency_percentiles((100,))[0]
    if t.metric == "mean":
        return iv.latency_sum_us / iv.completed if iv.completed else None
    if t.metric == "success":
        return iv.ok / iv.completed if iv.completed else None
    if t.metric == "errors":
        return sum(iv.errors.values())
    if t.metric == "rate":
        return iv.sent
    return None


class Sustained:
    """Counts consecutive seconds in which a threshold holds; ``feed`` answers True once it has held long enough."""

    def __init__(self, t: Threshold) -> None:
        self.t, self.run, self.crossed_at = t, 0, None

    def feed(self, second: int, value: float | None) -> bool:
        self.run = self.run + 1 if self.t.holds(value) else 0
        if self.run >= max(self.t.for_s, 1) and self.crossed_at is None:
            self.crossed_at = second
        return self.crossed_at is not None
