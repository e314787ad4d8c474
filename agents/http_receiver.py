"""The HTTP receiver agent: a CloudEvents sink that answers 202 at once and records each receive.

Per request: read the event and run IDs (``core.cloudevents``), stamp the receive time, append one receive line to
the disk spool (``agents.spool``; a shipper process tails it into the telemetry topic), then answer ``202``. A
request without an event ID or with malformed JSON gets ``400`` and is counted by reason; one without a run ID is
counted as unattributed unless ``--run`` names a default. ``GET /healthz`` answers the counters as JSON,
``GET /metrics`` in Prometheus' text format (``flightwatch_receiver_*``).

The HTTP/1.1 server is an asyncio protocol (uvloop when installed) framed by ``core.http1``: keep-alive,
pipelining, Content-Length or chunked bodies, ``Expect: 100-continue``; a connection costs ~1.5 KiB.
"""
from __future__ import annotations

import asyncio
import json
import time
import traceback
from collections import Counter
from http import HTTPStatus

from core import cloudevents, contract
from core.http1 import CHUNKED, MAX_BODY, MAX_HEAD, Malformed, dechunk, parse_head

KEEPALIVE_S = 75.0
"""A connection that sends nothing for this long is closed (aiohttp's and nginx's default)."""
LINGER_S = 2.0
"""After its last answer a connection is half-closed and what the client still sends is read and dropped
for this long, so that the answer is not lost to a reset (a "lingering close", as nginx and Apache do)."""

ACCEPTED = b"HTTP/1.1 202 Accepted\r\nContent-Length: 0\r\n\r\n"
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


def response(status: int, body: str | bytes = "", content_type: str = "text/plain; charset=utf-8") -> bytes:
    data = body if isinstance(body, bytes) else body.encode()
    return (f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(data)}\r\n\r\n").encode() + data


def closing(answer: bytes) -> bytes:
    """``answer`` saying that the connection closes after it (the header goes at the end of its head)."""
    return answer.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n", 1)


class HttpReceiver:
    def __init__(self, spool, agent: str, default_run: str | None = None) -> None:
        self.spool = spool
        self.agent = agent
        self.default_run = default_run
        self.lines = contract.FastLines("", agent)
        self.num_requests = 0
        self.num_received = 0
        self.num_unattributed = 0
        self.num_malformed_http = 0
        self.bad: Counter = Counter()
        self._registry = None  # prometheus-client's, made at the first scrape

    def counters(self) -> dict:
        out = {"agent": self.agent, "requests": self.num_requests, "received": self.num_received,
               "unattributed": self.num_unattributed, "bad": dict(self.bad), "bad_total": sum(self.bad.values()),
               "malformed_http": self.num_malformed_http}
        if self.spool is not None:
            out["telemetry"] = self.spool.counters()
        return out

    def collect(self):
        """The counters as Prometheus metric families (prometheus-client's collector protocol: read at scrape time,
        nothing per event)."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        c = self.counters()
        for name, key, text in (("requests", "requests", "POST requests answered"),
                                ("events", "received", "events recorded (attributed to a run)"),
                                ("unattributed", "unattributed", "events without a run ID, not recorded"),
                                ("malformed_http", "malformed_http", "requests that could not be framed (400/413/431)")):
            family = CounterMetricFamily(f"flightwatch_receiver_{name}", text, labels=["agent"])
            family.add_metric([self.agent], c[key])
            yield family
        bad = CounterMetricFamily("flightwatch_receiver_bad_requests", "requests answered 400, by reason",
                                  labels=["agent", "reason"])
        for reason, n in c["bad"].items():
            bad.add_metric([self.agent, reason], n)
        yield bad
        telemetry = c.get("telemetry")
        if telemetry is not None:
            g = GaugeMetricFamily("flightwatch_receiver_telemetry_records",
                                  "receive records spooled and lost so far; over_budget is 1 while the spool is full",
                                  labels=["agent", "state"])
            for state, n in telemetry.items():
                g.add_metric([self.agent, state], float(n))
            yield g

    def metrics_text(self) -> bytes:
        """``GET /metrics``: Prometheus' text format, with HELP and TYPE."""
        from prometheus_client import CollectorRegistry, generate_latest

        if self._registry is None:
            self._registry = CollectorRegistry(auto_describe=False)
            self._registry.register(self)
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
        for event_id, run_id in events:
            run_id = run_id or self.default_run
            if run_id is None:
                self.num_unattributed += 1
                continue
            self.num_received += 1
            if self.spool is not None:
                self.spool.append(self.lines.recv(run_id, now, event_id, size))
        return ACCEPTED

    def _get(self, method: str, path: str) -> bytes:
        if method == "GET" and path == "/healthz":
            return response(200, json.dumps(self.counters()), "application/json")
        if method == "GET" and path == "/metrics":
            from prometheus_client import CONTENT_TYPE_LATEST

            return response(200, self.metrics_text(), CONTENT_TYPE_LATEST)
        return response(405, "POST CloudEvents here; GET /healthz or /metrics\n")


class _Connection(asyncio.Protocol):
    """One client connection: requests are parsed and answered in order as their bytes arrive."""

    __slots__ = ("receiver", "conns", "transport", "buf", "head", "need", "chunks", "last", "ending")

    def __init__(self, receiver: HttpReceiver, conns: set) -> None:
        self.receiver, self.conns = receiver, conns
        self.transport = None
        self.buf: bytearray | None = None   # bytes not yet consumed (None when there are none)
        self.head = None                    # (method, path, keep-alive, headers) of the request whose body is awaited
        self.need = 0                       # its body's length, or CHUNKED
        self.chunks: bytearray | None = None  # a chunked body read so far
        self.last = time.monotonic()
        self.ending = False                 # answered its last request: what arrives now is dropped

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.conns.add(self)

    def connection_lost(self, exc) -> None:
        self.conns.discard(self)
        self.buf = self.head = self.chunks = None

    def pause_writing(self) -> None:  # a client that does not read its answers stops being read
        self.transport.pause_reading()

    def resume_writing(self) -> None:
        self.transport.resume_reading()

    def _end(self) -> None:
        """Lingering close: half-close after the last answer, drop what still arrives, close after LINGER_S."""
        self.ending = True
        self.buf = self.head = self.chunks = None
        if self.transport.can_write_eof():
            self.transport.write_eof()
        asyncio.get_running_loop().call_later(LINGER_S, self.transport.close)

    def data_received(self, data: bytes) -> None:
        self.last = time.monotonic()
        if self.ending:
            return
        if self.buf is not None:
            self.buf += data
            data = self.buf
        try:
            pos = self._consume(data)
        except Exception as e:  # noqa: BLE001 - other than Malformed, a bug of ours: answered 500 and logged
            if isinstance(e, Malformed):
                self.receiver.num_malformed_http += 1
                answer = response(e.status, e.reason + "\n")
            else:
                traceback.print_exc()
                answer = response(500, "internal error\n")
            self.transport.write(closing(answer))
            self._end()
            return
        if self.ending:
            return
        if pos >= len(data):
            self.buf = None
        elif data is self.buf:
            del self.buf[:pos]
        else:
            self.buf = bytearray(data[pos:])

    def _consume(self, data) -> int:
        """Answer every complete request in ``data``; the position of the first byte not consumed."""
        pos, n = 0, len(data)
        write = self.transport.write
        while pos < n and not self.ending:
            if self.head is None:
                while data.startswith(b"\r\n", pos):  # blank lines before a request line are allowed
                    pos += 2
                end = data.find(b"\r\n\r\n", pos)
                if end < 0:
                    if n - pos > MAX_HEAD:
                        raise Malformed(431, "request head too large")
                    return pos
                if end - pos > MAX_HEAD:
                    raise Malformed(431, "request head too large")
                self.head = parse_head(bytes(data[pos:end]))
                pos = end + 4
                self.need = self._framing(self.head[3])
                if self.need == CHUNKED:
                    self.chunks = bytearray()
                if self.need and n - pos < (self.need if self.need > 0 else 1) and \
                        self.head[3].get("expect", "").lower() == "100-continue":
                    write(CONTINUE)
            if self.need == CHUNKED:
                done, pos = dechunk(data, pos, self.chunks)
                if not done:
                    return pos
                body, self.chunks = bytes(self.chunks), None
            else:
                if n - pos < self.need:
                    return pos
                body = bytes(data[pos:pos + self.need])
                pos += self.need
            method, path, keep_alive, headers = self.head
            self.head = None
            answer = self.receiver.handle(method, path, headers, body)
            conn = headers.get("connection", "").lower()
            if conn == "close" or not (keep_alive or conn == "keep-alive"):
                write(closing(answer))
                self._end()
            else:
                write(answer)
        return pos

    @staticmethod
    def _framing(headers: dict) -> int:
        te, cl = headers.get("transfer-encoding"), headers.get("content-length")
        if te is not None:
            if te.lower() != "chunked" or cl is not None:
                raise Malformed(400, "unsupported transfer-encoding")
            return CHUNKED
        if cl is None:
            return 0
        if not cl.isdigit() or not cl.isascii():
            raise Malformed(400, "malformed content-length")
        length = int(cl)
        if length > MAX_BODY:
            raise Malformed(413, "body too large")
        return length


async def serve(receiver: HttpReceiver, host: str, port: int, reuse_port: bool = False, ready=None,
                stop: asyncio.Event | None = None) -> None:
    """Serve until ``stop`` is set (forever without one). Requests are answered as they are parsed: at stop
    nothing is half done, and open connections are closed."""
    conns: set[_Connection] = set()
    loop = asyncio.get_running_loop()
    srv = await loop.create_server(lambda: _Connection(receiver, conns), host, port,
                                   reuse_port=reuse_port or None, backlog=1024)

    async def close_silent() -> None:
        while True:
            await asyncio.sleep(KEEPALIVE_S / 15)
            before = time.monotonic() - KEEPALIVE_S
            for c in [c for c in conns if c.last < before]:
                c.transport.close()

    sweeper = asyncio.create_task(close_silent())
    if ready:
        ready()
    try:
        await (stop.wait() if stop else asyncio.Event().wait())
    finally:
        sweeper.cancel()
        srv.close()
        for c in list(conns):
            c.transport.close()
        await srv.wait_closed()
