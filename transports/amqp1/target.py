"""AMQP 1.0 (ActiveMQ Artemis, Qpid Dispatch Router, RabbitMQ's plugin, Azure Service Bus): python-qpid-proton.

    amqp1://guest:guest@127.0.0.1:29672//queue/flightwatch.sut     RabbitMQ 3.x's plugin: the address is /queue/NAME
    amqp1://artemis:artemis@127.0.0.1:61616/flightwatch.sut         Artemis: the queue's (or address') plain name
    ...?settle=presettled                                            at most once: no outcome is awaited
    ...?durable=true                                                 durable messages and terminus (RabbitMQ: a durable queue)
    ...?pairs=1000                                                   1,000 links, to ADDRESS.0 ... ADDRESS.999

The URL's path, less its first ``/``, is the link's target address (``transports.amqp`` has the grammar). Each event is one
transfer, unsettled by default (at least once): its outcome comes back as the broker's disposition, counted by kind
(``accepted`` is taken; ``rejected``, ``released``, ``modified`` are errors by cause) and its latency is the load
generator's. The CloudEvents AMQP binding's names carry the attributes as application properties
(``cloudEvents_id``, ...; the event ID is also the message ID) and the send stamp is ``fw_sent_ns``, an AMQP long
(epoch ns). proton's engine is driven by hand (``transports.amqp1.engine``) in the worker's own thread, by ``poll`` as
librdkafka's is, and each event is encoded by ``transports.amqp1.codec``; a connection that is lost is opened again every
``RECONNECT_S`` while the attack runs, and sends meanwhile fail as ``not connected``.
"""
from __future__ import annotations

import asyncio
import os
import time

from transports import amqp
from transports.amqp1.codec import EventEncoder
from transports.amqp1.engine import EngineLink
from transports.base import Book, TargetOptions, no_consumers, one_receiver, tcp_reachable, url_receiver_place
from transports.http.target import CE_SOURCE, CE_TYPE

RECONNECT_S = 0.5
CONTENT_TYPE = "application/octet-stream"


class Amqp1Target:
    SCHEMES = ("amqp1", "amqp1s")
    RECEIVER = "amqp1"
    TLS_PORT = 5671
    SECURE = amqp.SECURE_1
    DEFAULT_PORT = 5672
    EXAMPLE = "amqp1://USER:PASSWORD@HOST:PORT/ADDRESS (AMQP 1.0: Artemis, RabbitMQ's //queue/NAME)"
    TAKES_KAFKA_OPTIONS = False
    polled = True

    @staticmethod
    def receiver_args(spec) -> list[str]:
        """The receiver agent with a link on the address the load goes to (with ``?pairs=N``, one on each pair's),
        given the URL with its user alone: the load generator hands it the password in its environment
        (``core.secrets.child_env``), where no command line shows it."""
        return ["amqp1", "--url", spec.with_user()]

    receiver_place = staticmethod(url_receiver_place)
    reachable = staticmethod(tcp_reachable)
    consumers = staticmethod(no_consumers)  # a link's peers are the broker's to know (Artemis: its management)
    share_args = staticmethod(one_receiver)  # an address may be multicast: each link a copy of its own

    def __init__(self, spec, opts: TargetOptions) -> None:
        self.spec, self.opts = spec, opts
        self.address = amqp.Amqp1Address.parse(spec.path, spec.query, spec.scheme)
        self.presettled = self.address.settle == "presettled"
        self.payload = os.urandom(opts.payload_bytes)
        self.encoder = EventEncoder({"cloudEvents_specversion": "1.0", "cloudEvents_source": CE_SOURCE,
                                     "cloudEvents_type": CE_TYPE, amqp.RUN_HEADER: opts.run_id}, self.payload,
                                    CONTENT_TYPE, amqp.ID_HEADER, amqp.SENT_HEADER, self.address.durable)
        self.book: Book | None = None
        self.link: EngineLink | None = None
        self.pending: dict = {}  # delivery -> (event ID, send stamp)
        self._next_try = 0.0
        self._next_expiry = 0.0
        self._tag = 0
        self.attached_ns: int | None = None  # every link attached (epoch ns), before the first send

    @staticmethod
    def check(scheme: str, path: str, userinfo: str | None, query: str) -> str:
        amqp.Amqp1Address.parse(path, query, scheme)
        return path

    def shaping(self) -> dict | None:
        out = {"settle": self.address.settle, "durable": self.address.durable, "address": self.address.address}
        if self.address.pairs > 1:  # the report shows every sender attached before the first send (``attached_ns``)
            out["pairs"] = self.address.pairs
        return out

    # --- the connection -------------------------------------------------------------------------------------------

    def _open(self) -> None:
        link = EngineLink(self.spec.host, self.spec.port, self.spec.userinfo, self.address.address, sending=True,
                          settled=self.presettled, name="flightwatch-loadgen", pairs=self.address.pairs,
                          durable=self.address.durable, tls=self.address.tls)
        link.on_outcome = self.outcome
        link.on_lost = lambda why: self.lost(link, why)
        self.link = link
        link.open(min(self.opts.timeout_s, 5.0))

    async def connect(self) -> None:
        """Open the connection and the sending link; ``ConnectionError`` with the broker's reason."""
        try:
            self._open()
            self.link.attach(min(self.opts.timeout_s, 10.0) + self.address.pairs / 100)  # 1,000 links: 10 s more
            self.attached_ns = self.link.attached_ns
        except OSError as e:
            raise ConnectionError(f"amqp1 {self.spec}: {e.strerror or e}") from None
        except ConnectionError as e:
            self._close_now()
            raise ConnectionError(f"amqp1 {self.spec}: {e}") from None
        try:
            self._check_size()
        except ValueError:
            self._close_now()
            raise

    def lost(self, link: EngineLink, why: str) -> None:
        """The connection or link went away: every send still awaiting its outcome fails with ``why``."""
        if link is not self.link:
            return
        self._next_try = time.monotonic() + RECONNECT_S
        pending, self.pending = self.pending, {}
        if self.book is not None:
            for eid, sent in pending.values():
                self.book.done(eid, sent, None, why)

    def _close_now(self) -> None:
        if self.link is not None:
            self.link.close(0.01)
            self.link = None

    # --- sends and their outcomes ---------------------------------------------------------------------------------

    def start(self, book: Book) -> None:
        self.book = book

    def send(self, event_id: str, intended_ns: int) -> None:
        book, link = self.book, self.link
        pairs = self.address.pairs
        pair = int(event_id.rpartition("-")[2]) % pairs if pairs > 1 else None  # event k to pair k mod N
        sent = time.time_ns()
        book.sent(event_id, intended_ns, sent, pair)
        if link is None or not link.opened or link.closed is not None:
            book.done(event_id, sent, None, "not connected")
            return
        self._tag += 1
        d = link.send(self._tag.to_bytes(8, "big"), self.encoder.encode(event_id, sent), self.presettled, pair or 0)
        if self.presettled:
            book.done(event_id, sent, None, None)
        else:
            self.pending[d] = (event_id, sent)

    def _check_size(self) -> None:
        """An event over the ``max-message-size`` the broker gave the link when it attached fails every send:
        ``ValueError`` before the attack, in one line (the size is the event as encoded, properties and all)."""
        limit = self.link.max_message_size if self.link is not None else 0
        size = len(self.encoder.encode("x" * 40, time.time_ns()))
        if limit and size > limit:
            raise ValueError(f"an event of {len(self.payload):,} bytes ({size:,} as an AMQP message) is over the "
                             f"broker's max-message-size for {self.address.address} ({limit:,}): give a smaller "
                             "--payload, or raise the broker's limit")

    def outcome(self, delivery, error: str | None) -> None:
        """The broker's outcome of one transfer: ``accepted`` (None) is taken, the others are errors by cause."""
        entry = self.pending.pop(delivery, None)
        if entry is not None:
            self.book.done(entry[0], entry[1], None, error)

    def poll(self, timeout_s: float) -> int:
        """Serve the connection for up to ``timeout_s``; reopen a lost one; fail sends past the timeout."""
        now = time.monotonic()
        link = self.link
        if link is not None and link.closed is not None:
            link.close(0)
            self.link = link = None
        if link is None and self.book is not None and now >= self._next_try:
            self._next_try = now + RECONNECT_S
            try:
                self._open()
                link = self.link
            except OSError:  # the broker still away: tried again after RECONNECT_S
                self.link = link = None
        if link is not None:
            link.pump(timeout_s)
        else:
            time.sleep(timeout_s)
        if now >= self._next_expiry:
            self._next_expiry = now + 1.0
            limit = time.time_ns() - int(self.opts.timeout_s * 1e9)
            for d in [d for d, (_e, s) in self.pending.items() if s < limit]:
                eid, sent = self.pending.pop(d)
                self.book.done(eid, sent, None, "timeout")
        return 0

    async def close(self) -> None:
        """Serve outcomes still due, and send what still waits for credit (at most the send timeout), then close."""
        deadline = time.monotonic() + self.opts.timeout_s
        while (self.link is not None and self.link.closed is None and (self.pending or not self.link.flushed())
               and time.monotonic() < deadline):
            self.link.pump(0.02)
            await asyncio.sleep(0)
        self._close_now()
