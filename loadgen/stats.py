"""Attack statistics: per-second intervals that workers accumulate and the parent merges.

Workers ``add`` each send and each completion to the interval of the second in which it
happened and ship finished intervals as plain dicts (``snapshot``); the parent ``merge``s
them (associative: counts add, sparse histogram buckets add) into the live lines and the
final report. Latencies are µs in the project's HdrHistogram buckets.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from core import histogram

NS_PER_S = 1_000_000_000
FINAL_S = 1 << 62
"""What a worker ships when it is done: every second it will ever have is shipped."""


def _sparse(values_us: list[int]) -> dict[int, int]:
    if not values_us:
        return {}
    v = np.asarray(values_us, dtype=np.int64)
    v = v[histogram.in_range(v)]
    idx, cnt = histogram.sparse_counts(v)
    return dict(zip(idx.tolist(), cnt.tolist()))


@dataclass
class Interval:
    """One second of one worker (or of all, once merged)."""

    second: int
    sent: int = 0
    completed: int = 0
    ok: int = 0
    bytes_out: int = 0
    codes: Counter = field(default_factory=Counter)
    errors: Counter = field(default_factory=Counter)
    latency_sum_us: int = 0
    latency_min_us: int | None = None
    latency_buckets: dict = field(default_factory=dict)
    delay_buckets: dict = field(default_factory=dict)
    _lat: list = field(default_factory=list, repr=False)
    _delay: list = field(default_factory=list, repr=False)

    def add_send(self, delay_ns: int, bytes_out: int) -> None:
        self.sent += 1
        self.bytes_out += bytes_out
        self._delay.append(max(delay_ns, 0) // 1000)

    def add_ok(self, latency_ns: int) -> None:
        """``add_completion`` of an answer without status or error (a Kafka ack, a confirm): the same counts."""
        self.completed += 1
        self.ok += 1
        lat_us = latency_ns // 1000 if latency_ns > 0 else 0
        self._lat.append(lat_us)
        self.latency_sum_us += lat_us
        if self.latency_min_us is None or lat_us < self.latency_min_us:
            self.latency_min_us = lat_us

    def add_completion(self, latency_ns: int, status: int | None, error: str | None, ok: bool) -> None:
        self.completed += 1
        if status is not None:
            self.codes[str(status)] += 1
        if error is not None:
            self.errors[error] += 1
        elif status is not None and not ok:
            self.errors[f"http {status}"] += 1
        if ok:
            self.ok += 1
        lat_us = max(latency_ns, 0) // 1000
        self._lat.append(lat_us)
        self.latency_sum_us += lat_us
        self.latency_min_us = lat_us if self.latency_min_us is None else min(self.latency_min_us, lat_us)

    def snapshot(self) -> dict:
        """A plain, picklable dict with the raw values folded into histogram buckets."""
        return {"second": self.second, "sent": self.sent, "completed": self.completed, "ok": self.ok,
                "bytes_out": self.bytes_out, "codes": dict(self.codes), "errors": dict(self.errors),
                "latency_sum_us": self.latency_sum_us, "latency_min_us": self.latency_min_us,
                "latency_buckets": _merge_buckets(self.latency_buckets, _sparse(self._lat)),
                "delay_buckets": _merge_buckets(self.delay_buckets, _sparse(self._delay))}

    @classmethod
    def from_snapshot(cls, d: dict) -> Interval:
        i = cls(d["second"])
        i.merge(d)
        return i

    def merge(self, d: dict) -> None:
        self.sent += d["sent"]
        self.completed += d["completed"]
        self.ok += d["ok"]
        self.bytes_out += d["bytes_out"]
        self.codes.update(d["codes"])
        self.errors.update(d["errors"])
        self.latency_sum_us += d["latency_sum_us"]
        if d["latency_min_us"] is not None:
            self.latency_min_us = d["latency_min_us"] if self.latency_min_us is None else min(self.latency_min_us, d["latency_min_us"])
        self.latency_buckets = _merge_buckets(self.latency_buckets, d["latency_buckets"])
        self.delay_buckets = _merge_buckets(self.delay_buckets, d["delay_buckets"])

    def latency_percentiles(self, pcts) -> list[int | None]:
        return _pcts(self.latency_buckets, pcts)

    def delay_percentiles(self, pcts) -> list[int | None]:
        return _pcts(self.delay_buckets, pcts)


def _merge_buckets(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0) + v
    return out


def _pcts(buckets: dict, pcts) -> list[int | None]:
    if not buckets:
        return [None] * len(pcts)
    return histogram.percentiles(np.fromiter(buckets.keys(), np.int64), np.fromiter(buckets.values(), np.int64), list(pcts))


class RunStats:
    """All intervals of a run, merged from every worker, in bounded memory.

    A second stays open while some worker may still add to it. Once every worker has shipped
    everything before it (``shipped``), it is closed: folded into the run's total, kept as one
    summary row (``rows``) and handed to ``on_close`` (the .hlog writer), and its histograms are
    dropped. A 15-minute attack keeps a few open seconds, not 900 seconds of histograms.
    """

    def __init__(self, workers: int = 1, on_close=None) -> None:
        self.open: dict[int, Interval] = {}
        self.rows: list[dict] = []
        self.on_close = on_close
        self._total = Interval(-1)
        self._through = dict.fromkeys(range(workers), 0)  # worker -> every second before this is shipped
        self._closed = 0  # every second before this is closed

    def merge(self, snapshot: dict) -> None:
        s = snapshot["second"]
        if s < self._closed:  # cannot happen with monotonic clocks; never lose it if it does
            self._total.merge(snapshot)
            return
        if s in self.open:
            self.open[s].merge(snapshot)
        else:
            self.open[s] = Interval.from_snapshot(snapshot)

    def shipped(self, worker: int, before_s: int) -> list[Interval]:
        """Worker has shipped every second before before_s: the seconds this closes, in order."""
        self._through[worker] = max(self._through.get(worker, 0), before_s)
        return self._close_until(min(self._through.values()))

    def close_all(self) -> list[Interval]:
        """Close whatever is still open (the attack is over)."""
        return self._close_until(FINAL_S)

    def _close_until(self, until_s: int) -> list[Interval]:
        if until_s >= FINAL_S:  # every worker is done: close what there is, no empty seconds to infinity
            until_s = max(self.open, default=self._closed - 1) + 1
        closed = []
        for s in range(self._closed, until_s):  # a second nobody touched closes empty: a quiet second is a figure too
            iv = self.open.pop(s, None) or Interval(s)
            self._total.merge(iv.snapshot())
            self.rows.append(interval_row(iv))
            if self.on_close is not None:
                self.on_close(iv)
            closed.append(iv)
        self._closed = max(self._closed, until_s)
        return closed

    def total(self) -> Interval:
        """The whole run so far: closed seconds and those still open."""
        t = Interval(-1)
        t.merge(self._total.snapshot())
        for i in self.open.values():
            t.merge(i.snapshot())
        return t


def interval_row(iv: Interval) -> dict:
    """The per-second line of the JSON report."""
    p50, p99 = iv.latency_percentiles((50, 99))
    (d99,) = iv.delay_percentiles((99,))
    return {"second": iv.second, "sent": iv.sent, "completed": iv.completed, "errors": sum(iv.errors.values()),
            "latency_p50_us": p50, "latency_p99_us": p99, "send_delay_p99_us": d99}
