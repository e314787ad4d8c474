"""The HTTP receiver agent: a CloudEvents sink that answers 202 at once and records each receive.

A measuring sink, like Knative's thrpt-receiver: no artificial delay or failure, as little
work per request as it can. Built on aiohttp's low-level server (no router, no middleware)
and uvloop when installed. Per request: parse the event ID and run ID
(``agents.cloudevents``), stamp the receive time in ns, format one receive line and append it
to the disk spool (``agents.spool``) that a shipper process tails into the telemetry topic;
only then answer ``202``. A request the receiver
cannot attribute to an event (no ``ce-id``, malformed JSON) is answered ``400`` and
counted by reason; an event without a run ID is answered ``202`` and counted as
unattributed unless ``--run`` names a default run.

``GET /healthz`` answers the counters as JSON; ``GET /metrics`` the same in Prometheus'
text format (``flightwatch_receiver_*``).
"""
from __future__ import annotations

import asyncio
import json
import time
from collections import Counter

from aiohttp import web

from agents import cloudevents, contract

class HttpReceiver:
    def __init__(self, spool, agent: str, default_run: str | None = None) -> None:
        self.spool = spool
        self.agent = agent
        self.default_run = default_run
        self.lines = contract.FastLines("", agent)
        self.num_requests = 0
        self.num_received = 0
        self.num_unattributed = 0
        self.bad: Counter = Counter()

    def counters(self) -> dict:
        out = {"agent": self.agent, "requests": self.num_requests, "received": self.num_received,
               "unattributed": self.num_unattributed, "bad": dict(self.bad), "bad_total": sum(self.bad.values())}
        if self.spool is not None:
            out["telemetry"] = self.spool.counters()
        return out

    def metrics_text(self) -> str:
        c = self.counters()
        lines = [f'flightwatch_receiver_requests_total{{agent="{self.agent}"}} {c["requests"]}',
                 f'flightwatch_receiver_events_total{{agent="{self.agent}"}} {c["received"]}',
                 f'flightwatch_receiver_unattributed_total{{agent="{self.agent}"}} {c["unattributed"]}']
        lines += [f'flightwatch_receiver_bad_requests_total{{agent="{self.agent}",reason="{r}"}} {n}' for r, n in c["bad"].items()]
        for name, n in c.get("telemetry", {}).items():
            lines.append(f'flightwatch_receiver_telemetry_records{{agent="{self.agent}",state="{name}"}} {n}')
        return "\n".join(lines) + "\n"

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        if request.method != "POST":
            return self._get(request)
        self.num_requests += 1
        try:
            body = await request.read()
            now = time.time_ns()
            events = cloudevents.parse(request.headers.get("Content-Type"), request.headers, body)
        except cloudevents.BadEvent as e:
            self.bad[e.reason] += 1
            return web.Response(status=400, text=e.reason + "\n")
        except (ValueError, web.HTTPException, ConnectionError, asyncio.IncompleteReadError):
            self.bad["unreadable body"] += 1
            return web.Response(status=400, text="unreadable body\n")
        size = len(body) // len(events)
        for event_id, run_id in events:
            run_id = run_id or self.default_run
            if run_id is None:
                self.num_unattributed += 1
                continue
            self.num_received += 1
            if self.spool is not None:
                self.spool.append(self.lines.recv(run_id, now, event_id, size))
        return web.Response(status=202)

    def _get(self, request: web.BaseRequest) -> web.Response:
        if request.path == "/healthz":
            return web.Response(text=json.dumps(self.counters()), content_type="application/json")
        if request.path == "/metrics":
            return web.Response(text=self.metrics_text(), content_type="text/plain")
        return web.Response(status=405, text="POST CloudEvents here; GET /healthz or /metrics\n")


async def serve(receiver: HttpReceiver, host: str, port: int, reuse_port: bool = False, ready=None,
                stop: asyncio.Event | None = None) -> None:
    """Serve until ``stop`` is set (forever without one)."""
    server = web.Server(receiver.handle, access_log=None)
    loop = asyncio.get_running_loop()
    srv = await loop.create_server(server, host, port, reuse_port=reuse_port or None, backlog=1024)
    if ready:
        ready()
    try:
        await (stop.wait() if stop else asyncio.Event().wait())
    finally:
        srv.close()
        await server.shutdown(5)
        await srv.wait_closed()
