"""End-of-attack reports: figures first (``figures``), then formats: vegeta-style text, JSON, .hlog."""
from __future__ import annotations

import json
import time

import numpy as np

from core import histogram
from loadgen.stats import NS_PER_S, Interval, RunStats

PCTS = (50, 90, 95, 99)


def figures(stats: RunStats, attack_ns: int, wait_ns: int, target: str, rate_per_sec: float | None) -> dict:
    t = stats.total()
    p = t.latency_percentiles(PCTS)
    d = t.delay_percentiles((50, 99))
    lat_max = histogram.max_value(np.fromiter(t.latency_buckets.keys(), np.int64), np.fromiter(t.latency_buckets.values(), np.int64)) if t.latency_buckets else None
    duration_s = (attack_ns + wait_ns) / NS_PER_S
    return {
        "target": target,
        "requests": t.sent,
        "completed": t.completed,
        "rate_per_sec": t.sent / (attack_ns / NS_PER_S) if attack_ns else 0.0,
        "requested_rate_per_sec": rate_per_sec,
        "throughput_per_sec": t.ok / duration_s if duration_s else 0.0,
        "duration_s": {"total": duration_s, "attack": attack_ns / NS_PER_S, "wait": wait_ns / NS_PER_S},
        "latency_us": {"min": t.latency_min_us, "mean": (t.latency_sum_us / t.completed) if t.completed else None,
                       **{f"p{q}": v for q, v in zip(PCTS, p)}, "max": lat_max},
        "send_delay_us": {"p50": d[0], "p99": d[1]},
        "bytes_out": {"total": t.bytes_out, "mean": t.bytes_out / t.sent if t.sent else 0},
        "success_ratio": t.ok / t.sent if t.sent else 0.0,
        "status_codes": dict(sorted(t.codes.items())),
        "errors": dict(sorted(t.errors.items())),
        "intervals": stats.rows,
    }


def _ms(us) -> str:
    return "-" if us is None else (f"{us / 1000:.3f}ms" if us < 10_000_000 else f"{us / 1e6:.3f}s")


def text(f: dict) -> str:
    """vegeta's text report layout."""
    lat = f["latency_us"]
    rate = f"{f['rate_per_sec']:.2f}"
    lines = [
        f"Requests      [total, rate, throughput]         {f['requests']}, {rate}, {f['throughput_per_sec']:.2f}",
        *([f"Unsent        [due at the end, of scheduled]    {f['unsent']}, {f['scheduled']}"] if f.get("unsent") else []),
        f"Duration      [total, attack, wait]             {f['duration_s']['total']:.3f}s, {f['duration_s']['attack']:.3f}s, {f['duration_s']['wait']:.3f}s",
        "Latencies     [min, mean, 50, 90, 95, 99, max]  " + ", ".join(_ms(lat[k]) for k in ("min", "mean", "p50", "p90", "p95", "p99", "max")),
        f"Send delay    [50, 99]                          {_ms(f['send_delay_us']['p50'])}, {_ms(f['send_delay_us']['p99'])}",
        f"Bytes Out     [total, mean]                     {f['bytes_out']['total']}, {f['bytes_out']['mean']:.2f}",
        f"Success       [ratio]                           {100 * f['success_ratio']:.2f}%",
        *([f"CPU           [total, per event]                {f['cpu']['total_s']:.2f}s, {f['cpu']['us_per_event']:.1f}µs"]
          if f.get("cpu") else []),
        *(["Producer      [" + ", ".join(f["client"]) + "]  "
           + ", ".join(str(v).lower() for v in f["client"].values())] if f.get("client") else []),
        "Status Codes  [code:count]                      " + "  ".join(f"{c}:{n}" for c, n in f["status_codes"].items()),
        "Error Set:",
        *[f"{n} x {e}" for e, n in f["errors"].items()],
    ]
    return "\n".join(lines) + "\n"


def write_json(f: dict, path: str) -> None:
    with open(path, "w") as out:
        json.dump(f, out, indent=1)


class HlogWriter:
    """Request latency (µs), one interval histogram per second, in HdrHistogram's log format,
    written as each second closes (``RunStats(on_close=...)``) rather than held to the end."""

    def __init__(self, path: str) -> None:
        from hdrh.log import HistogramLogWriter

        self.path = path
        self.intervals = 0
        self._out = open(path, "w")
        self._w = HistogramLogWriter(self._out)
        self._w.output_comment("flightwatch loadgen: request latency in microseconds")
        self._w.output_log_format_version()

    def start(self, start_ns: int) -> None:
        # hdrh's output_start_time is broken (it treats ms as s); write the header line it means
        iso = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start_ns / NS_PER_S))
        self._out.write(f"#[StartTime: {start_ns / NS_PER_S:.3f} (seconds since epoch), {iso}]\n")
        self._w.output_legend()
        self._out.flush()

    def write(self, iv: Interval) -> None:
        if not iv.latency_buckets:
            return
        h = histogram.to_hdr(np.fromiter(iv.latency_buckets.keys(), np.int64), np.fromiter(iv.latency_buckets.values(), np.int64))
        self._w.output_interval_histogram(h, start_time_stamp_sec=float(iv.second) or 1e-9,
                                          end_time_stamp_sec=float(iv.second + 1), max_value_unit_ratio=1000.0)
        self._out.flush()
        self.intervals += 1

    def close(self) -> None:
        self._out.close()
