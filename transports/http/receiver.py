"""The HTTP receiver agent: a CloudEvents sink that answers 202 at once and records each receive.

Per request: read the event and run IDs (``core.cloudevents``), stamp the receive time, append one receive line to
the disk spool (``agents.spool``; a shipper process tails it into the telemetry topic), then answer ``202``. A
request without an event ID or with malformed JSON gets ``400`` and is counted by reason; one without a run ID is
counted as unattributed unless ``--run`` names a default. ``GET /healthz`` answers the counters as JSON,
``GET /metrics`` in Prometheus' text format (``flightwatch_receiver_*``).

The HTTP/1.1 server (framing by llhttp, limits, connections) is ``transports.http.server``.
"""
from __future__ import annotations

import json
import time
from collections import Counter

from core import cloudevents, contract
from transports.http.server import response

ACCEPTED = b"HTTP/1.1 202 Accepted\r\nContent-Length: 0\r\n\r\n"

class HttpReceiver:
    def __init__(self, spool, agent: str, default_run: str | None = None) -> None:
        self.spool = spool
        self.agent = agent
        self.default_run = default_run
        self.lines = contract.FastLines("", agent)
        self._where: dict[str, str] = {}
        self.num_requests = 0
        self.num_received = 0
        self.num_unattributed = 0
        self.num_malformed_http = 0
        self.malformed: Counter = Counter()  # the same, by reason (Malformed.label)
        self.num_refused = 0        # connections over the cap
        self.timeouts: Counter = Counter()  # requests not complete by their deadline, by part (head, body)
        self.conns: set = set()     # the open connections (``serve`` fills it)
        self.bad: Counter = Counter()
        self._registry = None  # prometheus-client's, made at the first scrape
        self.shared = None      # core.metrics.Shared when several processes serve this port (--workers)

    def counters(self) -> dict:
        out = {"agent": self.agent, "requests": self.num_requests, "received": self.num_received,
               "unattributed": self.num_unattributed, "bad": dict(self.bad), "bad_total": sum(self.bad.values()),
               "malformed_http": self.num_malformed_http, "malformed_by_reason": dict(self.malformed),
               "timeouts": dict(self.timeouts),
               "refused_connections": self.num_refused, "connections": len(self.conns)}
        if self.spool is not None:
            out["telemetry"] = self.spool.counters()
        return out

    def progress(self) -> tuple[tuple, str]:
        c = self.counters()
        t = c.get("telemetry", {})
        return ((c["received"], c["bad_total"], c["unattributed"], t.get("lost", 0)),
                f"receiver {self.agent}: {c['received']:,} received, {c['bad_total']:,} bad requests, "
                f"{c['unattributed']:,} without run ID; spooled {t.get('spooled', 0):,} lost {t.get('lost', 0):,}")

    def collect(self):
        """The counters as Prometheus metric families (prometheus-client's collector protocol: read at scrape time,
        nothing per event)."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        c = self.counters()
        for name, key, text in (("requests", "requests", "POST requests answered"),
                                ("events", "received", "events recorded (attributed to a run)"),
                                ("unattributed", "unattributed", "events without a run ID, not recorded")):
            family = CounterMetricFamily(f"flightwatch_receiver_{name}", text, labels=["agent"])
            family.add_metric([self.agent], c[key])
            yield family
        malformed = CounterMetricFamily("flightwatch_receiver_malformed_http",
                                        "requests that could not be framed or were ambiguous (400/413/431), by reason",
                                        labels=["agent", "reason"])
        for reason, n in c["malformed_by_reason"].items():
            malformed.add_metric([self.agent, reason], n)
        yield malformed
        bad = CounterMetricFamily("flightwatch_receiver_bad_requests", "requests answered 400, by reason",
                                  labels=["agent", "reason"])
        for reason, n in c["bad"].items():
            bad.add_metric([self.agent, reason], n)
        yield bad
        timeouts = CounterMetricFamily("flightwatch_receiver_timeouts",
                                       "requests answered 408: head or body not complete by its deadline",
                                       labels=["agent", "part"])
        for part in ("head", "body"):
            timeouts.add_metric([self.agent, part], c["timeouts"].get(part, 0))
        yield timeouts
        refused = CounterMetricFamily("flightwatch_receiver_refused_connections",
                                      "connections answered 503 and closed: the connection cap was reached", labels=["agent"])
        refused.add_metric([self.agent], c["refused_connections"])
        yield refused
        open_ = GaugeMetricFamily("flightwatch_receiver_connections", "client connections open now", labels=["agent"])
        open_.add_metric([self.agent], c["connections"])
        yield open_
        telemetry = c.get("telemetry")
        if telemetry is not None:
            records = CounterMetricFamily("flightwatch_receiver_telemetry_records",
                                          "receive records spooled, and lost past the spool's budget", labels=["agent", "state"])
            for state in ("spooled", "lost"):
                records.add_metric([self.agent, state], float(telemetry.get(state, 0)))
            yield records
            full = GaugeMetricFamily("flightwatch_receiver_spool_over_budget", "1 while the telemetry spool is full",
                                     labels=["agent"])
            full.add_metric([self.agent], float(telemetry.get("over_budget", 0)))
            yield full

    def metrics_text(self) -> bytes:
        """``GET /metrics``: Prometheus' text format, with HELP and TYPE."""
        from prometheus_client import CollectorRegistry, generate_latest

        if self._registry is None:
            self._registry = CollectorRegistry(auto_describe=False)
            self._registry.register(_Exposition(self))
        return generate_latest(self._registry)

    def handle(self, method: str, path: str, headers: dict, body: bytes) -> bytes:
        """The whole response to one request."""
        if method != "POST":
            return self._get(method, path)
        self.num_requests += 1
        now = time.time_ns()
        try:
            events = cloudevents.parse(headers.get("content-type"), headers, body)
        except cloudevents.BadEvent as e:
            self.bad[e.reason] += 1
            return response(400, e.reason + "\n")
        size = len(body) // len(events)
        where = self._where.get(path)
        if where is None:  # the path it was posted to (``contract.Receive.dest``), made once per path, a bounded few
            if len(self._where) > 1000:
                self._where.clear()
            where = self._where[path] = self.lines.where(path)
        for event_id, run_id in events:
            run_id = run_id or self.default_run
            if run_id is None:
                self.num_unattributed += 1
                continue
            self.num_received += 1
            if self.spool is not None:
                self.spool.append(self.lines.recv(run_id, now, event_id, size, where))
        return ACCEPTED

    def _get(self, method: str, path: str) -> bytes:
        if method == "GET" and path == "/healthz":
            return response(200, json.dumps(self.counters()), "application/json")
        if method == "GET" and path == "/metrics":
            from prometheus_client import CONTENT_TYPE_LATEST

            return response(200, self.metrics_text(), CONTENT_TYPE_LATEST)
        return response(405, "POST CloudEvents here; GET /healthz or /metrics\n")


class _Exposition:
    """What a scrape of this process shows: its own counters, and with --workers those of the other workers and
    of every shipper too (``core.metrics.Shared``), whichever worker the scrape reaches."""

    def __init__(self, receiver: HttpReceiver) -> None:
        self.receiver = receiver

    def collect(self):
        own = self.receiver.collect()
        return own if self.receiver.shared is None else self.receiver.shared.collect(own)


