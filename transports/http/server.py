"""The HTTP/1.1 server under the HTTP receiver (``transports.http.receiver``): framing, limits and connections.

An asyncio protocol (uvloop when installed) framed by llhttp through ``httptools`` (the parser under uvicorn; 5.7 µs
a request where a hand-written head parser took 11.6): keep-alive, pipelining, Content-Length or chunked bodies,
``Expect: 100-continue``, deadlines for heads and bodies, a cap on connections, a lingering close. A framed request
goes to the receiver's ``handle(method, path, headers, body)``, which returns the whole answer.
"""
from __future__ import annotations

import asyncio
import time
import traceback
from collections import Counter
from dataclasses import dataclass
from http import HTTPStatus
from typing import Protocol

import httptools

MAX_HEAD = 64 * 1024
MAX_FIELDS = 100
"""Header fields a request may carry (more: 431, as nginx's and Go's servers bound them by count or size)."""
ONCE = ("host", "ce-id")
"""Fields a request must not repeat: two Hosts (RFC 9112 3.2: 400), two event IDs (which one is the event?)."""
MAX_BODY = 16 << 20
READ_MAX = 256 * 1024
"""The most one read hands over (asyncio's and uvloop's buffer): the head guard's slack."""
KEEPALIVE_S = 75.0
"""A connection that sends nothing for this long is closed (aiohttp's and nginx's default)."""
SWEEP_S = 1.0
"""How often open connections are checked against their deadlines (10,000 connections: ~2 ms a sweep)."""


@dataclass(frozen=True)
class Limits:
    """What a client may hold: a request's head must be complete ``head_timeout_s`` after its first byte; its body
    within ``body_timeout_s`` or at ``body_min_rate`` bytes/s of its length, whichever allows longer (a chunked
    body: of what has come so far); at most ``max_connections`` open at once, more are answered 503 and closed.
    A request past its deadline is answered 408 and its connection closed; both are counted."""

    head_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    body_min_rate: float = 64 * 1024
    max_connections: int = 10_000

    def body_deadline_s(self, size: int) -> float:
        return max(self.body_timeout_s, size / self.body_min_rate)
LINGER_S = 2.0
"""After its last answer a connection is half-closed and what the client still sends is read and dropped
for this long, so that the answer is not lost to a reset (a "lingering close", as nginx and Apache do)."""

CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


def response(status: int, body: str | bytes = "", content_type: str = "text/plain; charset=utf-8") -> bytes:
    data = body if isinstance(body, bytes) else body.encode()
    return (f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(data)}\r\n\r\n").encode() + data


def closing(answer: bytes) -> bytes:
    """``answer`` saying that the connection closes after it (the header goes at the end of its head)."""
    return answer.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n", 1)


class Malformed(ValueError):
    """Not an HTTP/1.x request this server can frame: answered with ``status``, then the connection is closed;
    counted under ``label`` (``flightwatch_receiver_malformed_http_total{reason}``)."""

    def __init__(self, status: int, reason: str, label: str = "unframeable") -> None:
        super().__init__(reason)
        self.status, self.reason, self.label = status, reason, label



class Handler(Protocol):
    """What the server needs of the application (``transports.http.receiver.HttpReceiver``): the answer to a request,
    and where to count what the server refuses."""
    conns: set
    num_refused: int
    num_malformed_http: int
    malformed: Counter
    timeouts: Counter

    def handle(self, method: str, path: str, headers: dict, body: bytes) -> bytes: ...


IDLE, HEAD, BODY = 0, 1, 2


class _Connection(asyncio.Protocol):
    """One client connection, framed by llhttp (``httptools``): requests are answered in order as they complete.

    llhttp refuses what request smuggling lives on (two Content-Lengths, Content-Length with Transfer-Encoding,
    bare LF, CR/LF/NUL in a field, obs-fold, a chunk size that is not plain hex, an overflowing length): 400.
    Our limits on top: a head over ``MAX_HEAD`` or more than ``MAX_FIELDS`` fields (431), a body over ``MAX_BODY``
    (413), a transfer coding other than chunked, Transfer-Encoding on HTTP/1.0, HTTP/1.1 without Host, two Host or
    two ce-id fields (400); deadlines and a connection cap (``Limits``). Each is counted by reason."""

    __slots__ = ("receiver", "conns", "limits", "transport", "parser", "url", "headers", "body", "head_bytes",
                 "unparsed", "in_head", "last", "ending", "part", "started", "body_size", "fields")

    def __init__(self, receiver: Handler, conns: set, limits: Limits) -> None:
        self.receiver, self.conns, self.limits = receiver, conns, limits
        self.transport = None
        self.parser = httptools.HttpRequestParser(self)
        self.url, self.headers, self.body = b"", {}, None
        self.head_bytes = 0      # the current request's head so far (completed fields)
        self.unparsed = 0        # bytes received since the last completed field while in a head (a trickled field)
        self.in_head = False
        self.last = time.monotonic()
        self.ending = False      # answered its last request: what arrives now is dropped
        self.part = IDLE         # the part of a request being read, and since when (monotonic)
        self.started = 0.0
        self.body_size = None    # the body's Content-Length (None: chunked)
        self.fields = 0          # header fields of the current request

    def connection_made(self, transport) -> None:
        self.transport = transport
        if len(self.conns) >= self.limits.max_connections:
            self.receiver.num_refused += 1
            self.ending = True
            transport.write(closing(response(503, "too many connections\n")))
            transport.close()
            return
        self.conns.add(self)

    def deadline_passed(self, now: float) -> str | None:
        """The part of the request in progress ("head", "body") if it is past its deadline."""
        if self.part == HEAD:
            return "head" if now - self.started > self.limits.head_timeout_s else None
        if self.part == BODY:
            size = self.body_size if self.body_size is not None else len(self.body or b"")
            return "body" if now - self.started > self.limits.body_deadline_s(size) else None
        return None

    def time_out(self, part: str) -> None:
        self.receiver.timeouts[part] += 1
        self.part, self.ending = IDLE, True
        self.headers = self.body = None
        self.transport.write(closing(response(408, f"request {part} not complete in time\n")))
        # a lingering close: the client is still sending, and closed at once its next bytes drew a reset that could
        # destroy the 408 before it was read (CI: a trickling client's read failed with "connection reset by peer")
        self._end()

    def connection_lost(self, exc) -> None:
        self.conns.discard(self)
        self.headers = self.body = None

    def pause_writing(self) -> None:  # a client that does not read its answers stops being read
        self.transport.pause_reading()

    def resume_writing(self) -> None:
        self.transport.resume_reading()

    def _end(self) -> None:
        """Lingering close: half-close after the last answer, drop what still arrives, close after LINGER_S."""
        self.ending, self.part = True, IDLE
        self.headers = self.body = None
        if self.transport.can_write_eof():
            self.transport.write_eof()
        asyncio.get_running_loop().call_later(LINGER_S, self.transport.close)

    def data_received(self, data: bytes) -> None:
        self.last = time.monotonic()
        if self.ending:
            return
        if self.part == IDLE:
            self.part, self.started = HEAD, self.last
        try:
            self.parser.feed_data(data)
            if self.in_head:
                if self.part == IDLE:  # a pipelined request began in a read that completed the one before it
                    self.part, self.started = HEAD, self.last
                self.unparsed += len(data)  # at most one read more than the field in progress
                if self.unparsed > MAX_HEAD + READ_MAX:
                    raise Malformed(431, "request head too large", "head_too_large")
            return
        except httptools.HttpParserUpgrade:
            if not self.ending:  # answered already; this server upgrades to nothing
                self._end()
            return
        except httptools.HttpParserCallbackError as e:
            error = e.__context__
        except httptools.HttpParserError as e:
            if self.ending:  # bytes after a request that closed the connection
                return
            error = Malformed(400, f"malformed request: {e}")
        except Malformed as e:
            error = e
        if isinstance(error, Malformed):
            self.receiver.num_malformed_http += 1
            self.receiver.malformed[error.label] += 1
            answer = response(error.status, error.reason + "\n")
        else:  # a bug of ours: answered 500 and logged
            traceback.print_exception(error)
            answer = response(500, "internal error\n")
        self.transport.write(closing(answer))
        self._end()

    # llhttp's callbacks, in the order a request's parts arrive (no on_message_begin: a call per request saved)
    def on_url(self, url: bytes) -> None:
        if self.in_head:  # the rest of a target that came in pieces
            self.url += url
            self.head_bytes += len(url)
        else:  # a new request
            self.url, self.head_bytes, self.unparsed, self.in_head, self.fields = url, len(url), 0, True, 0
        if self.head_bytes > MAX_HEAD:
            raise Malformed(431, "request head too large", "head_too_large")

    def on_header(self, name: bytes, value: bytes) -> None:
        self.head_bytes += len(name) + len(value) + 4
        self.unparsed = 0
        self.fields += 1
        if self.head_bytes > MAX_HEAD:
            raise Malformed(431, "request head too large", "head_too_large")
        if self.fields > MAX_FIELDS:
            raise Malformed(431, f"more than {MAX_FIELDS} header fields", "too_many_fields")
        key = name.decode("latin-1").lower()
        if key not in self.headers:  # the first of repeated ones (llhttp refuses two Content-Lengths)
            # UTF-8; bytes that are not stay as surrogates, which core.cloudevents refuses
            self.headers[key] = value.decode("utf-8", "surrogateescape").strip(" \t")
        elif key in ONCE:
            raise Malformed(400, f"two {key} fields", f"two_{key.replace('-', '_')}")

    def on_headers_complete(self) -> None:
        self.in_head = False
        self.part, self.started = BODY, self.last
        version = self.parser.get_http_version()
        if version not in ("1.1", "1.0"):  # llhttp takes "POST /" as HTTP/0.9
            raise Malformed(400, "not an HTTP/1.x request", "not_http1")
        te, cl = self.headers.get("transfer-encoding"), self.headers.get("content-length")
        if version == "1.1" and "host" not in self.headers:  # RFC 9112 3.2: a server must answer 400
            raise Malformed(400, "no Host field (HTTP/1.1)", "no_host")
        if version == "1.0" and te is not None:  # RFC 9112 6.1: HTTP/1.0 has no chunked framing; treat as faulty
            raise Malformed(400, "Transfer-Encoding in an HTTP/1.0 request", "http10_transfer_encoding")
        if te is not None and te.lower() != "chunked":
            raise Malformed(400, "unsupported transfer-encoding", "transfer_encoding")
        self.body_size = None if cl is None else int(cl)  # llhttp has checked it is digits and no overflow
        if self.body_size is not None and self.body_size > MAX_BODY:
            raise Malformed(413, "body too large", "body_too_large")
        if self.headers.get("expect", "").lower() == "100-continue" and (te is not None or cl not in (None, "0")):
            self.transport.write(CONTINUE)

    def on_body(self, body: bytes) -> None:
        if self.body is None:
            self.body = body  # usually the whole body: no copy
        else:
            self.body = (self.body if isinstance(self.body, bytearray) else bytearray(self.body)) + body
        if len(self.body) > MAX_BODY:
            raise Malformed(413, "body too large", "body_too_large")

    def on_message_complete(self) -> None:
        if self.ending:
            return
        body = b"" if self.body is None else bytes(self.body)
        answer = self.receiver.handle(self.parser.get_method().decode("latin-1"),
                                      self.url.split(b"?", 1)[0].decode("latin-1"), self.headers, body)
        self.headers, self.body, self.in_head, self.part = {}, None, False, IDLE
        if self.parser.should_keep_alive():
            self.transport.write(answer)
        else:
            self.transport.write(closing(answer))
            self._end()


async def serve(receiver: Handler, host: str, port: int, reuse_port: bool = False, ready=None,
                stop: asyncio.Event | None = None, limits: Limits = Limits()) -> None:
    """Serve until ``stop`` is set (forever without one). Requests are answered as they are parsed: at stop
    nothing is half done, and open connections are closed."""
    conns: set[_Connection] = receiver.conns
    loop = asyncio.get_running_loop()
    srv = await loop.create_server(lambda: _Connection(receiver, conns, limits), host, port,
                                   reuse_port=reuse_port or None, backlog=1024)

    async def sweep() -> None:
        """Close connections past a deadline (408) or silent between requests for KEEPALIVE_S."""
        while True:
            await asyncio.sleep(SWEEP_S)
            now = time.monotonic()
            for c in list(conns):
                part = c.deadline_passed(now)
                if part is not None:
                    c.time_out(part)
                elif c.part == IDLE and now - c.last > KEEPALIVE_S:
                    c.transport.close()

    sweeper = asyncio.create_task(sweep())
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
