"""Open-loop pacing, pure arithmetic: when the k-th send is *intended*, from the run start.

A schedule is a list of steps, each a constant rate or a linear ramp for a duration:

    "5000"                 5,000/s for the run's --duration
    "1000:60,1200:60"      Knative's pace syntax: 1,000/s for 60 s, then 1,200/s for 60 s
    "100-1000:30,1000:60"  a linear ramp from 100/s to 1,000/s over 30 s, then 1,000/s
    "500:20,1000:10,0:10"  a burst at twice the rate, then 10 s of silence (a step of rate 0 sends nothing)

``intended_ns(k)`` never looks at the clock or at responses: a sender that falls behind
fires at once and records how late it was (the send delay), so coordinated omission shows.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import cached_property

from core.units import parse_duration_ns

NS_PER_S = 1_000_000_000
MAX_RATE_PER_SEC = 10_000_000
"""Rates above this are refused as typos."""

_STEP = re.compile(r"^\s*(\d+(?:\.\d+)?)(?:\s*-\s*(\d+(?:\.\d+)?))?\s*(?::\s*(\d+(?:\.\d+)?\s*(?:ms|s|m)?))?\s*$")


@dataclass(frozen=True)
class Step:
    """``rate_per_sec`` for ``duration_ns``, or a linear ramp from it to ``end_rate_per_sec``."""

    rate_per_sec: float
    duration_ns: int
    end_rate_per_sec: float | None = None

    @property
    def final_rate_per_sec(self) -> float:
        return self.rate_per_sec if self.end_rate_per_sec is None else self.end_rate_per_sec

    def hits(self, t_ns: int) -> float:
        """Sends due in the first ``t_ns`` of this step (fractional)."""
        t = min(max(t_ns, 0), self.duration_ns) / NS_PER_S
        r0, r1 = self.rate_per_sec, self.final_rate_per_sec
        return r0 * t + (r1 - r0) * t * t / (2 * self.duration_ns / NS_PER_S)

    @property
    def count(self) -> int:
        """Sends in the whole step."""
        return math.ceil(self.hits(self.duration_ns) - 1e-6)

    def time_of_hit_ns(self, j: int) -> int:
        """Offset into the step at which its j-th send (from 0) is due."""
        r0, r1 = self.rate_per_sec, self.final_rate_per_sec
        if r0 == r1:
            return (j * NS_PER_S) // int(r0) if float(r0).is_integer() else int(j * NS_PER_S / r0)
        d = self.duration_ns / NS_PER_S
        a = (r1 - r0) / (2 * d)  # hits(t) = r0 t + a t^2 = j
        t = (-r0 + math.sqrt(r0 * r0 + 4 * a * j)) / (2 * a) if a else j / r0
        return int(t * NS_PER_S)


@dataclass(frozen=True)
class Schedule:
    steps: tuple[Step, ...]

    @classmethod
    def constant(cls, rate_per_sec: float, duration_ns: int) -> Schedule:
        return cls((Step(rate_per_sec, duration_ns),)).validated()

    @classmethod
    def parse(cls, text: str, default_duration_ns: int | None = None) -> Schedule:
        """Parse the pace syntax above; a step without ``:seconds`` lasts ``default_duration_ns``."""
        steps = []
        for part in str(text).split(","):
            m = _STEP.match(part)
            if not m:
                raise ValueError(f"bad pace step {part.strip()!r}: use RATE:SECONDS or FROM-TO:SECONDS, e.g. 1000:60")
            start, end, secs = m.groups()
            if secs is None:
                if default_duration_ns is None:
                    raise ValueError(f"pace step {part.strip()!r} needs a duration (RATE:SECONDS)")
                duration_ns = default_duration_ns
            else:
                duration_ns = parse_duration_ns(secs)
            steps.append(Step(float(start), duration_ns, float(end) if end is not None else None))
        return cls(tuple(steps)).validated()

    def validated(self) -> Schedule:
        """The schedule, or ``ValueError``: a step may be silence (rate 0: ``1000:10,0:10``), not the whole."""
        if not self.steps:
            raise ValueError("empty pace")
        for s in self.steps:
            if s.duration_ns <= 0:
                raise ValueError("every pace step needs a duration > 0")
            for r in (s.rate_per_sec, s.final_rate_per_sec):
                if not 0 <= r <= MAX_RATE_PER_SEC:
                    raise ValueError(f"rate {r:g}/s out of range (0 < rate <= {MAX_RATE_PER_SEC:,})")
        if not any(s.count for s in self.steps):
            raise ValueError(f"rate {self.steps[0].rate_per_sec:g}/s out of range (0 < rate <= {MAX_RATE_PER_SEC:,}): "
                             "the pace sends nothing (a step of rate 0 is silence between others: 1000:10,0:10)")
        return self

    def share(self, count: int) -> Schedule:
        """This schedule's rates divided by ``count``: one of ``count`` shards that together send the whole."""
        if count == 1:
            return self
        return Schedule(tuple(Step(s.rate_per_sec / count, s.duration_ns,
                                   None if s.end_rate_per_sec is None else s.end_rate_per_sec / count)
                              for s in self.steps)).validated()

    @property
    def duration_ns(self) -> int:
        return sum(s.duration_ns for s in self.steps)

    @cached_property
    def _starts(self) -> list[tuple[int, int]]:
        """(start ns, hits before) of each step."""
        out, t, hits = [], 0, 0
        for s in self.steps:
            out.append((t, hits))
            t += s.duration_ns
            hits += s.count
        return out

    @property
    def total_hits(self) -> int:
        last = self.steps[-1]
        t0, h0 = self._starts[-1]
        return h0 + last.count

    def intended_ns(self, k: int) -> int | None:
        """Offset from the run start at which send k (from 0) is due; None past the end."""
        for step, (t0, h0) in zip(self.steps, self._starts):
            n = step.count
            if k < h0 + n:
                return t0 + step.time_of_hit_ns(k - h0)
        return None

    def offsets(self, first: int, stride: int):
        """(k, intended offset) of sends first, first + stride, ... in order: ``intended_ns`` without a search per send."""
        k = first
        for step, (t0, h0) in zip(self.steps, self._starts):
            end = h0 + step.count
            r = step.rate_per_sec
            if step.final_rate_per_sec == r and float(r).is_integer():  # time_of_hit_ns's integer case, inlined: per send
                r = int(r)
                while k < end:
                    yield k, t0 + ((k - h0) * NS_PER_S) // r
                    k += stride
            while k < end:
                yield k, t0 + step.time_of_hit_ns(k - h0)
                k += stride

    def step_at(self, elapsed_ns: int) -> int:
        """Index of the step under way at ``elapsed_ns`` (the last one after the end)."""
        for i, (t0, _) in enumerate(self._starts):
            if elapsed_ns < t0 + self.steps[i].duration_ns:
                return i
        return len(self.steps) - 1

    def rate_at(self, elapsed_ns: int) -> float:
        i = self.step_at(elapsed_ns)
        step, (t0, _) = self.steps[i], self._starts[i]
        frac = min(max((elapsed_ns - t0) / step.duration_ns, 0.0), 1.0)
        return step.rate_per_sec + (step.final_rate_per_sec - step.rate_per_sec) * frac

    def steps_from(self, start_ns: int) -> list[dict]:
        """The steps in absolute time from ``start_ns``: ``rate`` at the step's start, ``end_rate``, ``start_ns``,
        ``end_ns`` (what the load generator publishes in its ``run_start``, so a reader never parses pace text)."""
        out, t = [], int(start_ns)
        for s in self.steps:
            out.append({"rate": float(s.rate_per_sec), "end_rate": float(s.final_rate_per_sec), "start_ns": t,
                        "end_ns": t + s.duration_ns})
            t += s.duration_ns
        return out

    def describe(self) -> str:
        return ",".join(
            (f"{s.rate_per_sec:g}" if s.end_rate_per_sec is None else f"{s.rate_per_sec:g}-{s.end_rate_per_sec:g}")
            + f":{s.duration_ns / NS_PER_S:g}" for s in self.steps)
