"""The load generator's figures as Prometheus metrics while it attacks (``--metrics-listen``, default
127.0.0.1:19404): what it sent and got back, and its latest complete second. Updated once a second from the
merged per-second figures of every worker (``RunStats``): nothing per event, and one target for all workers.
The run's ID is a label of ``flightwatch_loadgen_info`` alone (as ``streaming.metrics`` says why): the other series
keep their labels from run to run."""
from __future__ import annotations

import threading

from core import metrics

LABELS = ["sender"]


class AttackMetrics:
    def __init__(self, run_id: str, sender: str) -> None:
        self.run_id = run_id
        self.key = (sender,)
        self.lock = threading.Lock()
        self.totals = {"sent": 0, "completed": 0, "ok": 0, "bytes_out": 0}
        self.errors: dict[str, int] = {}
        self.latest: dict[str, float] = {}
        self.in_flight = 0
        self.scheduled = 0.0
        self.bound_seconds = 0
        self.finished = 0

    def second(self, iv, scheduled: float, in_flight: int, bound: bool) -> None:
        """A second every worker is done with (``loadgen.stats.Interval``)."""
        p50, p90, p99 = iv.latency_percentiles((50, 90, 99))
        d50, d99 = iv.delay_percentiles((50, 99))
        with self.lock:
            for k in self.totals:
                self.totals[k] += getattr(iv, k)
            for cause, n in iv.errors.items():
                self.errors[cause] = self.errors.get(cause, 0) + n
            self.latest = {"second": iv.second, "sent": iv.sent, "completed": iv.completed,
                           "latency": {"0.5": p50, "0.9": p90, "0.99": p99}, "delay": {"0.5": d50, "0.99": d99}}
            self.in_flight, self.scheduled = in_flight, scheduled
            self.bound_seconds += bool(bound)

    def collect(self):
        with self.lock:
            totals, errors, latest = dict(self.totals), dict(self.errors), dict(self.latest)
            in_flight, scheduled, bound, finished = self.in_flight, self.scheduled, self.bound_seconds, self.finished
        k = self.key
        yield metrics.family("gauge", "flightwatch_loadgen_info", "1: the run this sender attacks for (its ID is this "
                             "label alone)", ["run", *LABELS], [((self.run_id, *k), 1)])
        yield metrics.family("counter", "flightwatch_loadgen_requests",
                             "requests by outcome: sent, completed (answered or failed), ok (2xx or acknowledged)",
                             [*LABELS, "outcome"], [((*k, name), totals[name]) for name in ("sent", "completed", "ok")])
        yield metrics.family("counter", "flightwatch_loadgen_errors", "failed requests by cause", [*LABELS, "cause"],
                             [((*k, cause), n) for cause, n in sorted(errors.items())])
        yield metrics.family("counter", "flightwatch_loadgen_bytes_out", "payload bytes sent", LABELS,
                             [(k, totals["bytes_out"])])
        yield metrics.family("gauge", "flightwatch_loadgen_in_flight", "requests sent and not yet answered", LABELS,
                             [(k, in_flight)])
        yield metrics.family("gauge", "flightwatch_loadgen_scheduled_rate", "the pace's rate now, events/s", LABELS,
                             [(k, scheduled)])
        yield metrics.family("counter", "flightwatch_loadgen_bound_seconds",
                             "seconds in which the generator sent less than its schedule asked", LABELS, [(k, bound)])
        if latest:
            yield metrics.family("gauge", "flightwatch_loadgen_second_rate",
                                 "the latest complete second's sends and completions", [*LABELS, "outcome"],
                                 [((*k, "sent"), latest["sent"]), ((*k, "completed"), latest["completed"])])
            yield metrics.quantiles("flightwatch_loadgen_request_latency_seconds",
                                    "the latest complete second's request latency (send stamp to answer), by quantile",
                                    LABELS, [(k, q, v / 1e6) for q, v in latest["latency"].items() if v is not None])
            yield metrics.quantiles("flightwatch_loadgen_send_delay_seconds",
                                    "the latest complete second's send delay (actual - intended send time), by quantile",
                                    LABELS, [(k, q, v / 1e6) for q, v in latest["delay"].items() if v is not None])
        yield metrics.family("gauge", "flightwatch_loadgen_finished", "1 once the attack has ended", LABELS,
                             [(k, finished)])
