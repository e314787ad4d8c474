"""A lean HTTP/1.1 client for sending CloudEvents fast: keep-alive connections, one request each at a time.

aiohttp spends ~150 µs of CPU per request here; a load generator needs less. This client
writes a prebuilt request (headers from a template, the payload as is), parses only the
status line and the body framing (Content-Length or chunked) of the answer, and keeps a
pool of up to ``max_connections`` keep-alive connections. A request that takes longer than
the timeout fails as ``timeout`` and its connection is closed.

The pool reuses the connection released last, and closes one that stayed idle for
``IDLE_TIMEOUT_S``: after a stall of the target (thousands of requests outstanding, as many
connections opened) it shrinks back to what the rate needs, on both sides, instead of keeping
every connection of the stall warm for the rest of the run.
"""
from __future__ import annotations

import asyncio
import time
from collections import deque

from agents.http_receiver import Malformed, dechunk
from loadgen.targets import error_cause

IDLE_TIMEOUT_S = 10.0
"""An idle keep-alive connection is closed after this long (Go's http.Transport has IdleConnTimeout, 90 s)."""


class _Response(Exception):
    pass


class _Conn(asyncio.Protocol):
    """One keep-alive connection; ``pending`` is the future of the request under way."""

    def __init__(self, pool: "HttpPool") -> None:
        self.pool = pool
        self.transport = None
        self.buf = bytearray()
        self.pending: asyncio.Future | None = None
        self.started = 0.0
        self.idle_since = 0.0
        self.closed = False

    def connection_made(self, transport) -> None:
        self.transport = transport

    def connection_lost(self, exc) -> None:
        self.closed = True
        if self.pending is not None and not self.pending.done():
            self.pending.set_result((None, "connection reset" if exc else "server disconnected"))
        self.pending = None
        self.pool.forget(self)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while self.pending is not None:
            parsed = self._parse()
            if parsed is None:
                return
            status, keep = parsed
            fut, self.pending = self.pending, None
            if not fut.done():
                fut.set_result((status, None))
            if keep:
                self.pool.release(self)
            else:
                self.transport.close()

    def _parse(self):
        """(status, keep-alive) once a whole response is in the buffer, else None."""
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return None
        head = bytes(self.buf[:end]).decode("latin-1")
        lines = head.split("\r\n")
        try:
            status = int(lines[0].split(" ", 2)[1])
        except (IndexError, ValueError):
            self.transport.close()
            return None
        headers = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip().lower()
        body_start = end + 4
        if "content-length" in headers:
            total = body_start + int(headers["content-length"])
            if len(self.buf) < total:
                return None
        elif headers.get("transfer-encoding") == "chunked":
            try:
                done, total = dechunk(self.buf, body_start, bytearray())
            except Malformed:
                self.transport.close()
                return None
            if not done:
                return None
        elif status in (204, 304) or 100 <= status < 200:
            total = body_start
        else:  # body ends at close: wait for it
            return None
        del self.buf[:total]
        return status, headers.get("connection") != "close"


class HttpPool:
    def __init__(self, host: str, port: int, max_connections: int, timeout_s: float) -> None:
        self.host, self.port = host, port
        self.max_connections, self.timeout_s = max_connections, timeout_s
        self.idle: deque[_Conn] = deque()
        self.all: set[_Conn] = set()
        self.waiters: deque[asyncio.Future] = deque()
        self.opening = 0
        self._sweeper = None

    def start(self) -> None:
        self._sweeper = asyncio.create_task(self._sweep())

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(0.1)
            now = time.monotonic()
            for c in list(self.all):
                if c.pending is not None and now - c.started > self.timeout_s:
                    fut, c.pending = c.pending, None
                    if not fut.done():
                        fut.set_result((None, "timeout"))
                    c.transport.close()
            self.close_idle(now - IDLE_TIMEOUT_S)

    def close_idle(self, before: float) -> None:
        """Close the connections idle since before ``before`` (the oldest are first in ``idle``)."""
        while self.idle and self.idle[0].idle_since < before:
            c = self.idle.popleft()
            self.all.discard(c)
            if not c.closed:
                c.closed = True
                c.transport.close()

    def forget(self, conn: _Conn) -> None:
        self.all.discard(conn)
        try:
            self.idle.remove(conn)
        except ValueError:
            pass
        self._wake()

    def release(self, conn: _Conn) -> None:
        if self.waiters:
            w = self.waiters.popleft()
            if not w.done():
                w.set_result(conn)
                return
        conn.idle_since = time.monotonic()
        self.idle.append(conn)

    def _wake(self) -> None:
        while self.waiters and len(self.all) + self.opening < self.max_connections:
            w = self.waiters.popleft()
            if not w.done():
                w.set_result(None)  # the waiter may open a connection now
                return

    async def _acquire(self) -> _Conn:
        while True:
            while self.idle:
                c = self.idle.pop()  # the warmest: the others age out
                if not c.closed:
                    return c
            if len(self.all) + self.opening < self.max_connections:
                self.opening += 1
                try:
                    loop = asyncio.get_running_loop()
                    _, conn = await asyncio.wait_for(
                        loop.create_connection(lambda: _Conn(self), self.host, self.port), self.timeout_s)
                finally:
                    self.opening -= 1
                self.all.add(conn)
                return conn
            w = asyncio.get_running_loop().create_future()
            self.waiters.append(w)
            conn = await w
            if conn is not None:
                return conn

    async def request(self, head: bytes, body: bytes) -> tuple[int | None, str | None]:
        try:
            conn = await self._acquire()
        except Exception as e:  # noqa: BLE001
            return None, error_cause(e)
        fut = asyncio.get_running_loop().create_future()
        conn.pending = fut
        conn.started = time.monotonic()
        conn.transport.writelines((head, body))
        return await fut

    async def close(self) -> None:
        if self._sweeper:
            self._sweeper.cancel()
        for c in list(self.all):
            c.transport.close()
