"""STOMP 1.2 (ActiveMQ Artemis, ActiveMQ Classic, RabbitMQ's STOMP plugin), on the worker's asyncio loop.

    stomp://artemis:artemis@127.0.0.1:61613/flightwatch.sut          a queue (Artemis: ANYCAST, the default)
    ...?type=multicast                                              an address every subscription gets a copy of
    ...?persistent=true                                             the broker keeps each message on disk

Each event is one SEND frame with a ``receipt`` (its event ID): the broker's RECEIPT is its acknowledgement, the load
generator's latency; an ERROR frame fails the send it names (or every one in flight, as the broker closes the
connection after it). The CloudEvents attributes ride as headers (``ce-id``, ``ce-source``, ...: the HTTP binding's
names), the run ID as ``ce-fwrun``, the send stamp as ``fw-sent-ns`` (epoch ns). Artemis reads ``destination-type``
and the receiver's ``subscription-type`` for the routing (others ignore them). A lost connection is opened again every
``RECONNECT_S`` while the attack runs; sends meanwhile fail as ``not connected``.
"""
from __future__ import annotations

import asyncio
import os
import time
from urllib.parse import parse_qsl

from transports.base import Book, TargetOptions, no_consumers, one_receiver, tcp_reachable, url_receiver_place
from transports.stomp.codec import FrameError, FrameReader, SendFrames, frame

RECONNECT_S = 0.5
ID_HEADER, RUN_HEADER, SENT_HEADER = "ce-id", "ce-fwrun", "fw-sent-ns"
TYPES = ("anycast", "multicast")
OPTIONS = ("type", "persistent")


def options(path: str, query: str) -> tuple[str, str, bool]:
    """(the destination, its routing type, persistent) of a stomp:// URL's path and query; ``ValueError`` saying
    what is wrong."""
    destination = path[1:] if path.startswith("/") else path
    if not destination:
        raise ValueError("a stomp:// target names its destination: stomp://HOST:PORT/DESTINATION")
    q = dict(parse_qsl(query, keep_blank_values=True))
    unknown = sorted(set(q) - set(OPTIONS))
    if unknown:
        raise ValueError(f"unknown option {unknown[0]!r} (stomp:// takes {', '.join(OPTIONS)})")
    kind = q.get("type", "anycast").lower()
    if kind not in TYPES:
        raise ValueError(f"?type={q['type']}: anycast or multicast")
    persistent = q.get("persistent", "false").lower()
    if persistent not in ("true", "false"):
        raise ValueError(f"?persistent={q['persistent']}: true or false")
    return destination, kind, persistent == "true"


def connect_frame(userinfo: str | None, host: str) -> bytes:
    """CONNECT for STOMP 1.2 (``host`` is the virtual host: the broker's name), with its login when the URL has one,
    without heart-beats: Artemis then keeps an idle connection for its connection TTL (a minute)."""
    headers = {"accept-version": "1.2", "host": host, "heart-beat": "0,0"}
    if userinfo is not None:
        user, _, password = userinfo.partition(":")
        headers |= {"login": user, "passcode": password}
    return frame("CONNECT", headers)


def refusal(f) -> str:
    """An ERROR frame as one line: its ``message`` header and the first line of its body."""
    detail = f.body.decode("utf-8", "replace").strip().splitlines()
    return f.headers.get("message", "error") + (f" ({detail[0][:160]})" if detail else "")


class StompTarget:
    SCHEMES = ("stomp",)
    RECEIVER = "stomp"
    DEFAULT_PORT = 61613
    TLS_PORT = None
    SECURE = {}  # no TLS scheme of its own
    EXAMPLE = "stomp://USER:PASSWORD@HOST:PORT/DESTINATION (STOMP 1.2: Artemis, ActiveMQ, RabbitMQ's plugin)"
    TAKES_KAFKA_OPTIONS = False
    polled = False

    @staticmethod
    def receiver_args(spec) -> list[str]:
        """The receiver agent subscribed where the load goes, given the URL with its user alone (its password in
        its environment, ``core.secrets.child_env``)."""
        return ["stomp", "--url", spec.with_user()]

    receiver_place = staticmethod(url_receiver_place)
    reachable = staticmethod(tcp_reachable)
    consumers = staticmethod(no_consumers)    # a destination's subscribers are the broker's to know
    share_args = staticmethod(one_receiver)   # a multicast address gives each subscription a copy of its own

    @staticmethod
    def check(scheme: str, path: str, userinfo: str | None, query: str) -> str:
        options(path, query)
        return path

    def __init__(self, spec, opts: TargetOptions) -> None:
        self.spec, self.opts = spec, opts
        self.destination, self.kind, self.persistent = options(spec.path, spec.query)
        fixed = {"destination-type": self.kind.upper(), "content-type": "application/octet-stream",
                 "ce-specversion": "1.0", "ce-source": "flightwatch/loadgen", "ce-type": "dev.flightwatch.load",
                 RUN_HEADER: opts.run_id}
        if self.persistent:
            fixed["persistent"] = "true"
        self.frames = SendFrames(self.destination, fixed, ID_HEADER, SENT_HEADER, os.urandom(opts.payload_bytes))
        self.book: Book | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.pending: dict[str, int] = {}  # event ID (its receipt) -> send stamp
        self.tasks: list[asyncio.Task] = []
        self.closing = False
        self._first = None  # the connection ``connect`` opened: its reader, for ``start``

    def shaping(self) -> dict | None:
        return {"destination": self.destination, "type": self.kind, "persistent": self.persistent}

    # --- the connection -------------------------------------------------------------------------------------------

    async def _open(self, timeout_s: float) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, FrameReader]:
        """A connection the broker said CONNECTED to; ``ConnectionError`` with its refusal, ``OSError`` if none opens."""
        reader, writer = await asyncio.wait_for(asyncio.open_connection(self.spec.host, self.spec.port), timeout_s)
        frames = FrameReader()
        writer.write(connect_frame(self.spec.userinfo, self.spec.host))
        try:
            while True:
                data = await asyncio.wait_for(reader.read(65536), timeout_s)
                if not data:
                    raise ConnectionError("the broker closed the connection before CONNECTED")
                for f in frames.feed(data):
                    if f.command == "CONNECTED":
                        return reader, writer, frames
                    if f.command == "ERROR":
                        raise ConnectionError(refusal(f))
        except (TimeoutError, ConnectionError, FrameError) as e:
            writer.close()
            if isinstance(e, asyncio.TimeoutError):
                raise ConnectionError(f"no CONNECTED within {timeout_s:g} s: is it a STOMP port?") from None
            raise ConnectionError(str(e)) from None

    async def connect(self) -> None:
        """Open the connection; ``ConnectionError`` in one line if the broker cannot be reached or refuses us."""
        try:
            reader, self.writer, frames = await self._open(min(self.opts.timeout_s, 10.0))
        except OSError as e:
            raise ConnectionError(f"stomp {self.spec}: {getattr(e, 'strerror', None) or e}") from None
        self._first = (reader, frames)

    def start(self, book: Book) -> None:
        self.book = book
        reader, frames = self._first
        self.tasks = [asyncio.get_running_loop().create_task(self._serve(reader, frames)),
                      asyncio.get_running_loop().create_task(self._expire())]

    async def _serve(self, reader: asyncio.StreamReader, frames: FrameReader) -> None:
        """Receipts and errors, for as long as the attack runs; a lost connection opened again every RECONNECT_S."""
        while not self.closing:
            why = await self._read(reader, frames)
            self._lost(why)
            while not self.closing:
                await asyncio.sleep(RECONNECT_S)
                try:
                    reader, self.writer, frames = await self._open(min(self.opts.timeout_s, 5.0))
                    break
                except (OSError, ConnectionError):
                    continue

    async def _read(self, reader: asyncio.StreamReader, frames: FrameReader) -> str:
        """Serve one connection until it ends: why it ended, as a send's error."""
        book = self.book
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    return "connection lost"
                for f in frames.feed(data):
                    if f.command == "RECEIPT":
                        eid = f.headers.get("receipt-id", "")
                        sent = self.pending.pop(eid, None)
                        if sent is not None:
                            book.done(eid, sent, None, None)
                    elif f.command == "ERROR":  # the broker closes the connection after it
                        eid = f.headers.get("receipt-id", "")
                        sent = self.pending.pop(eid, None)
                        if sent is not None:
                            book.done(eid, sent, None, "error: " + f.headers.get("message", "refused")[:80])
                        else:
                            return "error: " + f.headers.get("message", "refused")[:80]
        except FrameError:
            return "malformed frame"
        except OSError:
            return "connection lost"

    def _lost(self, why: str) -> None:
        writer, self.writer = self.writer, None
        if writer is not None:
            writer.close()
        pending, self.pending = self.pending, {}
        for eid, sent in pending.items():
            self.book.done(eid, sent, None, why)

    async def _expire(self) -> None:
        """Sends unanswered for the timeout fail as ``timeout`` (checked every second)."""
        while not self.closing:
            await asyncio.sleep(1.0)
            limit = time.time_ns() - int(self.opts.timeout_s * 1e9)
            for eid in [e for e, s in self.pending.items() if s < limit]:
                self.book.done(eid, self.pending.pop(eid), None, "timeout")

    # --- sends ----------------------------------------------------------------------------------------------------

    def send(self, event_id: str, intended_ns: int) -> None:
        book, writer = self.book, self.writer
        sent = time.time_ns()
        book.sent(event_id, intended_ns, sent)
        if writer is None or writer.is_closing():
            book.done(event_id, sent, None, "not connected")
            return
        self.pending[event_id] = sent
        writer.write(self.frames.encode(event_id, sent))

    def poll(self, timeout_s: float) -> int:
        return 0

    async def close(self) -> None:
        """Wait for the receipts still due (at most the send timeout), then DISCONNECT and close."""
        deadline = time.monotonic() + self.opts.timeout_s
        while self.pending and self.writer is not None and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        self.closing = True
        for t in self.tasks:
            t.cancel()
        writer, self.writer = self.writer, None
        if writer is not None:
            try:
                writer.write(frame("DISCONNECT"))
                await asyncio.wait_for(writer.drain(), 1.0)
            except (TimeoutError, OSError):
                pass
            writer.close()
