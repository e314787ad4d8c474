"""Routing cost as bindings grow (RabbitMQ's "Measuring Scalability" method): the broker's CPU per message at each
number of bindings, and whether it stays flat.

The broker's CPU is sampled once a second during each cell (``CpuSampler``: its whole process tree, psutil), and its
cost per message is taken second by second over the cell's measured span: the CPU of that second over the messages
the receiver got in it (the run's windows). Across the cells, ``log(cost) = a + b log10(bindings)`` is fitted to the
cells' mean costs; ``exp(b) - 1`` is the growth per tenfold of bindings. Its 95% interval comes from resampling
each cell's seconds (a bootstrap over the seconds within each cell, the cells kept). The verdict: ``flat`` when the
whole interval lies within ±``FLAT_PER_DECADE``, ``grows`` when it lies above it, else ``undecided``, with the
interval.
"""
from __future__ import annotations

import threading
import time

import numpy as np
import pandas as pd

from core.observer import tree_cpu_s

FLAT_PER_DECADE = 0.10
"""A growth of the broker's CPU per message below 10% for each tenfold of bindings is called flat."""
RESAMPLES = 2000


class CpuSampler:
    """The CPU seconds of a process and its children, once a second in a thread of its own: ``samples`` holds
    ``(epoch ns, CPU s)``. ``stop()`` ends it."""

    def __init__(self, pid: int, every_s: float = 1.0) -> None:
        self.pid, self.every_s = pid, every_s
        self.samples: list[tuple[int, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            cpu = tree_cpu_s(self.pid)
            if cpu is not None:
                self.samples.append((time.time_ns(), cpu))
            self._stop.wait(self.every_s)

    def stop(self) -> list[tuple[int, float]]:
        self._stop.set()
        self._thread.join(5)
        return self.samples


def cost_per_second(samples: list[tuple[int, float]], windows: pd.DataFrame, span: tuple[int, int],
                    window_ns: int = 10**9) -> np.ndarray:
    """The broker's CPU µs per message received, for each window wholly in ``span`` that received any: the CPU
    interpolated at the window's bounds from the samples."""
    if len(samples) < 2 or windows.empty:
        return np.zeros(0)
    t = np.array([s[0] for s in samples], np.float64)
    cpu = np.array([s[1] for s in samples], np.float64)
    w = windows[(windows["window_ns"] >= span[0]) & (windows["window_ns"] + window_ns <= span[1])
                & (windows["received"] > 0)]
    w = w[(w["window_ns"] >= t[0]) & (w["window_ns"] + window_ns <= t[-1])]
    if w.empty:
        return np.zeros(0)
    start = w["window_ns"].to_numpy(np.float64)
    used = np.interp(start + window_ns, t, cpu) - np.interp(start, t, cpu)
    return used * 1e6 / w["received"].to_numpy(np.float64)


def _fit(x: np.ndarray, means: np.ndarray) -> float:
    return float(np.polyfit(x, np.log(means), 1)[0])


def slope(bindings: list[int], costs: list[np.ndarray], seed: int = 0) -> dict:
    """The growth of the cost per tenfold of bindings, its 95% interval and the verdict (see the module)."""
    keep = [(b, c) for b, c in zip(bindings, costs) if len(c) and np.all(c > 0)]
    if len(keep) < 2:
        return {"verdict": "undecided", "why": "fewer than two sizes with a measured cost"}
    x = np.log10([b for b, _ in keep])
    b = _fit(x, np.array([c.mean() for _, c in keep]))
    rng = np.random.default_rng(seed)
    draws = np.array([_fit(x, np.array([rng.choice(c, len(c)).mean() for _, c in keep])) for _ in range(RESAMPLES)])
    lo, hi = np.exp(np.percentile(draws, [2.5, 97.5])) - 1
    growth = float(np.exp(b) - 1)
    if -FLAT_PER_DECADE <= lo and hi <= FLAT_PER_DECADE:
        verdict = "flat"
    elif lo > FLAT_PER_DECADE:
        verdict = "grows"
    else:
        verdict = "undecided"
    return {"verdict": verdict, "growth_per_decade": growth, "ci_low": float(lo), "ci_high": float(hi),
            "level": 0.95, "flat_within": FLAT_PER_DECADE, "sizes": [int(b) for b, _ in keep],
            "seconds": [int(len(c)) for _, c in keep]}


def verdict_text(s: dict) -> str:
    if "growth_per_decade" not in s:
        return f"{s['verdict']}: {s.get('why', '')}"
    return (f"{s['verdict']}: the broker's CPU per message {s['growth_per_decade']:+.1%} for each tenfold of bindings "
            f"(95% interval {s['ci_low']:+.1%} … {s['ci_high']:+.1%}; flat is within ±{s['flat_within']:.0%})")
