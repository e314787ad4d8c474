"""The job's live figures as Prometheus metrics, served by the driver (prometheus-client) on 127.0.0.1:19401 by
default (``--metrics-listen``), for the same Grafana board as the system under test:

    flightwatch_run_info{run}                     1: which run the job serves (join on it: below)
    flightwatch_run_events_total{kind}            sent, received, errors (windows so far; by send time,
                                                  received by receive time, as the window table)
    flightwatch_run_dropped                       events declared dropped so far: a gauge, since a late
                                                  delivery takes a declared drop back
    flightwatch_run_gap_windows_total             windows with no delivery while events were in flight
    flightwatch_run_in_flight                     events in flight at the end of the latest window
    flightwatch_run_window_start_seconds          the latest settled window (its start, Unix seconds) ...
    flightwatch_run_flight_time_seconds{quantile} ... its flight time, a summary: quantile 0.5, 0.9, 0.99
    flightwatch_run_flight_time_max_seconds       ... and its largest
    flightwatch_run_send_delay_seconds{quantile}  ... its send delay (actual - intended send time)
    flightwatch_run_send_delay_max_seconds        ... and its largest
    flightwatch_run_observer_cpu_cores            flightwatch's own CPU in that window, where known
    flightwatch_run_verdict{state}                1 for the verdict's current state, 0 for the others
    flightwatch_run_batches_total                 micro-batches processed
    flightwatch_run_finished                      1 once the run is closed

The run's ID is a label of the info metric alone, as ``kube_pod_info`` carries a pod's: the other series keep
the same labels from run to run, so a Prometheus that scrapes run after run on one address reuses them rather
than keeping ~30 new series per run in its head block for up to three hours (a run's figures by ID:
``flightwatch_run_events_total * on(job, instance) group_left(run) flightwatch_run_info{run="..."}``).

A snapshot is taken after each batch, from the live verdict's window table (``streaming.live``); a scrape reads
the snapshot and nothing else: no cost per event. Times are in seconds, as Prometheus' naming asks.
"""
from __future__ import annotations

import threading

import numpy as np

from core import output
from runs.table import PERCENTILES, percentile_figures

QUANTILES = {f"p{p}": str(p / 100) for p in PERCENTILES} | {"max": "max"}
"""The window table's figure names (``latency_us_p99``, ...) and the ``quantile`` label each is exported as (the
largest goes to a ``_max_seconds`` gauge of its own: a quantile of 1 on a gauge cannot be aggregated)."""


def window_figures(parts: list | None) -> dict[str, float]:
    """{quantile label: µs} of one window's histogram bucket parts [(bucket indexes, counts), ...], merged as the
    window table merges them (``table.percentile_figures``); {} if none."""
    if not parts:
        return {}
    figs = percentile_figures(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))
    return {label: float(figs[name]) for name, label in QUANTILES.items() if figs[name] is not None}


def row_figures(row, hist: str) -> dict[str, float]:
    """{quantile label: µs} of one row of the full window table (``results.load_windows``) for ``hist``."""
    out = {label: row.get(f"{hist}_{name}") for name, label in QUANTILES.items()}
    return {k: float(v) for k, v in out.items() if v is not None and v == v}


def snapshot(run_id: str, table, verdict: dict | None, figures, batches: int, finished: bool) -> dict:
    """What a scrape shows, from a window table (the live one, ``LiveWindows.table``, or the run's full one) and
    ``figures(row)``: the (flight time, send delay) figures of its latest settled window's row."""
    settled = table[table["settled"]] if len(table) and "settled" in table else table.iloc[:0]
    latest = settled.iloc[-1] if len(settled) else None
    flight, delay = figures(latest) if latest is not None else ({}, {})
    observer = [c for c in table.columns if c.endswith(":observer_cpu")]
    cpu = None
    if latest is not None and observer:
        values = [float(latest[c]) for c in observer if latest[c] == latest[c]]
        cpu = sum(values) if values else None
    return {
        "run": run_id,
        "events": {k: int(table[k].sum()) if k in table else 0 for k in (output.SENT, output.RECEIVED, output.DROPPED, output.ERRORS)},
        "gap_windows": int(table["gap"].sum()) if "gap" in table else 0,
        "in_flight": int(table["in_flight"].iloc[-1]) if len(table) else 0,
        "window_start_s": int(latest["window_ns"]) / 1e9 if latest is not None else None,
        "flight_time_us": flight, "send_delay_us": delay, "observer_cpu": cpu,
        "state": (verdict or {}).get("state"), "batches": batches, "finished": finished,
    }


def final_snapshot(run_id: str, windows, verdict: dict | None, batches: int) -> dict:
    """The snapshot of a closed run, from its full window table (``results.load_windows``)."""
    return snapshot(run_id, windows, verdict, lambda row: (row_figures(row, "latency_us"),
                                                           row_figures(row, "send_delay_us")), batches, True)


class JobMetrics:
    """prometheus-client's collector protocol over the latest snapshot (``publish`` after each batch)."""

    def __init__(self) -> None:
        self._snap: dict | None = None
        self._lock = threading.Lock()
        self.server = None

    def publish(self, snap: dict) -> None:
        with self._lock:
            self._snap = snap

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        from core import metrics

        with self._lock:
            s = self._snap
        if s is None:
            return
        info = GaugeMetricFamily("flightwatch_run_info", "1: the run the job serves (its ID is this label alone)",
                                 labels=["run"])
        info.add_metric([s["run"]], 1.0)
        yield info
        events = CounterMetricFamily("flightwatch_run_events", "events of the run so far, by kind (window table sums)",
                                     labels=["kind"])
        for kind, n in s["events"].items():
            if kind != output.DROPPED:
                events.add_metric([kind], n)
        yield events
        yield _one(GaugeMetricFamily, "flightwatch_run_dropped",
                   "events declared dropped so far (falls when a late delivery takes a declared drop back)",
                   s["events"].get(output.DROPPED, 0))
        yield _one(CounterMetricFamily, "flightwatch_run_gap_windows",
                   "windows with no delivery while events were in flight", s["gap_windows"])
        yield _one(GaugeMetricFamily, "flightwatch_run_in_flight", "events in flight at the end of the latest window",
                   s["in_flight"])
        yield _one(CounterMetricFamily, "flightwatch_run_batches", "micro-batches processed", s["batches"])
        yield _one(GaugeMetricFamily, "flightwatch_run_finished", "1 once the run is closed", float(s["finished"]))
        if s["window_start_s"] is not None:
            yield _one(GaugeMetricFamily, "flightwatch_run_window_start_seconds",
                       "start of the latest settled window (Unix seconds): the window of the figures below",
                       s["window_start_s"])
        for name, key, text in (("flightwatch_run_flight_time", "flight_time_us",
                                 "flight time in the latest settled window"),
                                ("flightwatch_run_send_delay", "send_delay_us",
                                 "send delay (actual - intended send time) in the latest settled window")):
            yield metrics.quantiles(f"{name}_seconds", f"{text}, by quantile (of that window, not cumulative)", [],
                                    [((), q, v / 1e6) for q, v in s[key].items() if q != "max"])
            if "max" in s[key]:
                yield _one(GaugeMetricFamily, f"{name}_max_seconds", f"{text}: the largest", s[key]["max"] / 1e6)
        if s["observer_cpu"] is not None:
            yield _one(GaugeMetricFamily, "flightwatch_run_observer_cpu_cores",
                       "cores used by flightwatch itself in the latest settled window", s["observer_cpu"])
        v = GaugeMetricFamily("flightwatch_run_verdict", "1 for the saturation verdict's current state",
                              labels=["state"])
        for state in output.State:
            v.add_metric([state.value], 1.0 if s["state"] == state else 0.0)
        yield v

    def serve(self, listen: str, log=print) -> bool:
        """Serve ``/metrics`` on ``listen`` (HOST:PORT) in a thread; False (logged) if it cannot bind."""
        from core import metrics

        self.server = metrics.serve(self, listen, log)
        return self.server is not None

    def close(self) -> None:
        from core import metrics

        metrics.stop(self.server)
        self.server = None


def _one(family, name: str, text: str, value: float):
    return family(name, text, value=value)
