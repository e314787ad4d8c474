"""A lean HTTP/1.1 client for sending CloudEvents fast: keep-alive connections, one request each at a time.

aiohttp spends ~150 µs of CPU per request here; a load generator needs less. This client
writes a prebuilt request (headers from a template, the payload as is), frames the answer with
llhttp (``httptools``: status, Content-Length or chunked, 1xx interim answers), and keeps a
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

import httptools

from transports.errors import error_cause

IDLE_TIMEOUT_S = 10.0
"""An idle keep-alive connection is closed after this long (Go's http.Transport has IdleConnTimeout, 90 s)."""


def _stamp(ctx) -> int:
    return time.time_ns()


def _resolve(fut: asyncio.Future, sent: int, status: int | None, error: str | None) -> None:
    if not fut.done():
        fut.set_result((status, error))


class _Conn(asyncio.Protocol):
    """One keep-alive connection; ``ctx`` is the request under way (None while idle). Responses are framed by
    llhttp (``httptools``): a 1xx is interim (the final answer follows), a response it cannot frame fails the
    request as ``malformed response`` and closes the connection."""

    def __init__(self, pool: HttpPool) -> None:
        self.pool = pool
        self.transport = None
        self.parser = httptools.HttpResponseParser(self)
        self.ctx = None
        self.sent = 0
        self.started = 0.0
        self.idle_since = 0.0
        self.closed = False

    def connection_made(self, transport) -> None:
        self.transport = transport

    def connection_lost(self, exc) -> None:
        self.closed = True
        ctx, self.ctx = self.ctx, None
        if ctx is not None:
            self.pool.on_done(ctx, self.sent, None, "connection reset" if exc else "server disconnected")
        self.pool.forget(self)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self.transport.close()
        except httptools.HttpParserError:
            ctx, self.ctx = self.ctx, None
            if ctx is not None:
                self.pool.on_done(ctx, self.sent, None, "malformed response")
            self.transport.close()

    def on_message_complete(self) -> None:  # llhttp's callback: a whole response
        status = self.parser.get_status_code()
        if 100 <= status < 200:  # interim (100 Continue, 103 Early Hints): the answer is still to come
            return
        ctx, self.ctx = self.ctx, None
        if ctx is None:  # an answer to nothing: this connection cannot be trusted
            self.transport.close()
            return
        self.pool.on_done(ctx, self.sent, status, None)
        if self.parser.should_keep_alive():
            self.pool.release(self)
        else:
            self.transport.close()


class HttpPool:
    """Requests go out on idle keep-alive connections, else wait in a queue for one (opening up to
    ``max_connections``). ``on_write(ctx)`` is called right before a request's bytes are written and gives its
    send stamp; ``on_done(ctx, stamp, status, error)`` once it is answered, failed or timed out. A request that
    fails before it is written (no connection) is stamped at that moment. The defaults serve ``request()``."""

    def __init__(self, host: str, port: int, max_connections: int, timeout_s: float, on_write=_stamp,
                 on_done=_resolve, ssl=None) -> None:
        self.host, self.port = host, port
        self.ssl = ssl  # an ssl.SSLContext for https (the host's name checked against the certificate), or None
        self.max_connections, self.timeout_s = max_connections, timeout_s
        self.on_write, self.on_done = on_write, on_done
        self.idle: deque[_Conn] = deque()
        self.all: set[_Conn] = set()
        self.queue: deque = deque()  # (head, body, ctx) waiting for a connection
        self.opening = 0
        self._sweeper = None

    def start(self) -> None:
        self._sweeper = asyncio.create_task(self._sweep())

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(0.1)
            now = time.monotonic()
            for c in list(self.all):
                if c.ctx is not None and now - c.started > self.timeout_s:
                    ctx, c.ctx = c.ctx, None
                    self.on_done(ctx, c.sent, None, "timeout")
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
        self._open_for_queue()

    def release(self, conn: _Conn) -> None:
        if self.queue and not conn.closed:
            self._write(conn, *self.queue.popleft())
            return
        conn.idle_since = time.monotonic()
        self.idle.append(conn)

    def _write(self, conn: _Conn, head: bytes, body: bytes, ctx) -> None:
        conn.ctx = ctx
        conn.started = time.monotonic()
        conn.sent = self.on_write(ctx)
        conn.transport.writelines((head, body))

    def submit(self, head: bytes, body: bytes, ctx) -> None:
        """Send a request on the warmest idle connection, or queue it for the next free or new one."""
        while self.idle:
            c = self.idle.pop()  # the warmest: the others age out
            if not c.closed:
                self._write(c, head, body, ctx)
                return
        self.queue.append((head, body, ctx))
        self._open_for_queue()

    def _open_for_queue(self) -> None:
        while len(self.queue) > self.opening and len(self.all) + self.opening < self.max_connections:
            self.opening += 1
            asyncio.get_running_loop().create_task(self._open())

    async def _open(self) -> None:
        try:
            loop = asyncio.get_running_loop()
            _, conn = await asyncio.wait_for(loop.create_connection(
                lambda: _Conn(self), self.host, self.port, ssl=self.ssl, server_hostname=self.host if self.ssl else None),
                self.timeout_s)
        except Exception as e:  # noqa: BLE001 - the oldest waiting request fails with the cause; the rest try again
            self.opening -= 1
            if self.queue:
                _, _, ctx = self.queue.popleft()
                self.on_done(ctx, self.on_write(ctx), None, error_cause(e))
            self._open_for_queue()
            return
        self.opening -= 1
        self.all.add(conn)
        self.release(conn)

    async def request(self, head: bytes, body: bytes) -> tuple[int | None, str | None]:
        """One request, awaited: (status, error cause). For a pool built with the default callbacks."""
        fut = asyncio.get_running_loop().create_future()
        self.submit(head, body, fut)
        return await fut

    async def close(self) -> None:
        if self._sweeper:
            self._sweeper.cancel()
        for c in list(self.all):
            c.transport.close()
