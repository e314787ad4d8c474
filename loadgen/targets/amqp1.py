"""AMQP 1.0 (ActiveMQ Artemis, Qpid Dispatch Router, RabbitMQ's plugin, Azure Service Bus): python-qpid-proton.

    amqp1://guest:guest@127.0.0.1:29672//queue/flightwatch.sut     RabbitMQ 3.x's plugin: the address is /queue/NAME
    amqp1://artemis:artemis@127.0.0.1:61616/flightwatch.sut         Artemis: the queue's (or address') plain name
    ...?settle=presettled                                            at most once: no outcome is awaited

The URL's path, less its first ``/``, is the link's target address (``core.amqp`` has the grammar). Each event is one
transfer, unsettled by default (at least once): its outcome comes back as the broker's disposition, counted by kind
(``accepted`` is taken; ``rejected``, ``released``, ``modified`` are errors by cause) and its latency is the load
generator's. The CloudEvents AMQP binding's names carry the attributes as application properties
(``cloudEvents_id``, ...; the event ID is also the message ID) and the send stamp is ``fw_sent_ns``, an AMQP long
(epoch ns). proton's reactor runs in the worker's own thread, driven by ``poll`` as librdkafka's is; a connection
that is lost is opened again every ``RECONNECT_S`` while the attack runs, and sends meanwhile fail as
``not connected``.
"""
from __future__ import annotations

import asyncio
import functools
import os
import time

from core import amqp
from loadgen.targets.base import Book, TargetOptions
from loadgen.targets.http import CE_SOURCE, CE_TYPE

RECONNECT_S = 0.5
KEEP_ALIVE_S = 10 * 365 * 86400.0
"""A timer that never fires: proton's reactor ends once it has neither a connection nor a timer, and serves nothing
after that (a lost connection then spun ``poll`` and was never opened again)."""


class Amqp1Target:
    SCHEMES = ("amqp1",)
    DEFAULT_PORT = 5672
    EXAMPLE = "amqp1://USER:PASSWORD@HOST:PORT/ADDRESS (AMQP 1.0: Artemis, RabbitMQ's //queue/NAME)"
    TAKES_KAFKA_OPTIONS = False
    polled = True

    def __init__(self, spec, opts: TargetOptions) -> None:
        self.spec, self.opts = spec, opts
        amqp.quiet_clients()
        self.address = amqp.Amqp1Address.parse(spec.path, spec.query)
        self.payload = os.urandom(opts.payload_bytes)
        self.book: Book | None = None
        self.container = self.conn = self.sender = None
        self.pending: dict[bytes, tuple[str, int]] = {}  # delivery tag -> (event ID, send stamp)
        self.error: str | None = None
        self.opened = False
        self._next_try = 0.0
        self._next_expiry = 0.0
        self._tag = 0
        self._fixed = {"cloudEvents_specversion": "1.0", "cloudEvents_source": CE_SOURCE, "cloudEvents_type": CE_TYPE,
                       amqp.RUN_HEADER: opts.run_id}

    @staticmethod
    def check(path: str, userinfo: str | None, query: str) -> str:
        amqp.Amqp1Address.parse(path, query)
        return path

    def shaping(self) -> dict | None:
        return {"settle": self.address.settle, "address": self.address.address}

    # --- the connection -------------------------------------------------------------------------------------------

    def _open(self) -> None:
        from proton.reactor import AtMostOnce, Container

        if self.container is None:
            self.container = Container(_events(self))
            self.container.start()
            self.container.schedule(KEEP_ALIVE_S, None)  # a reactor with no connection left ends: this keeps it
        user, _, password = (self.spec.userinfo or ":").partition(":")
        self.opened, self.error = False, None
        self.conn = self.container.connect(url=f"amqp://{self.spec.host}:{self.spec.port}", reconnect=False,
                                           user=user or None, password=password or None,
                                           allow_insecure_mechs=True, sasl_enabled=bool(user))
        options = AtMostOnce() if self.address.settle == "presettled" else None
        self.sender = self.container.create_sender(self.conn, self.address.address, options=options)

    async def connect(self) -> None:
        """Open the connection and the sending link; ``ConnectionError`` with the broker's reason."""
        self._open()
        deadline = time.monotonic() + min(self.opts.timeout_s, 10.0)
        while not self.opened and self.error is None:
            if time.monotonic() > deadline:
                self.error = (f"no AMQP 1.0 link within {min(self.opts.timeout_s, 10.0):g} s: is "
                              f"{self.spec.host}:{self.spec.port} an AMQP 1.0 broker?")
                break
            self._process(0.05)
            await asyncio.sleep(0)
        if self.error is None:  # a broker that refuses an address attaches the link, then detaches it at once
            self._process(0.1)
        if self.error is not None:
            why = self.error
            self._close_now()
            raise ConnectionError(f"amqp1 {self.spec}: {why}")
        try:
            self._check_size()
        except ValueError:
            self._close_now()
            raise

    def _process(self, timeout_s: float) -> None:
        self.container.timeout = timeout_s
        self.container.process()

    def lost(self, connection, why: str) -> None:
        """The connection or link went away: every send still awaiting its outcome fails with ``why``. Events of an
        earlier connection (a failed attempt's, arriving late) are not the current one's, and are let go."""
        if connection != self.conn:  # proton wraps one C connection in new Python objects: == compares the C one
            return
        self.error = why
        self.sender = None
        self._next_try = time.monotonic() + RECONNECT_S
        pending, self.pending = self.pending, {}
        if self.book is not None:
            for eid, sent in pending.values():
                self.book.done(eid, sent, None, why)

    def _close_now(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self._process(0.01)
        if self.container is not None:
            self.container.stop()
            self.container = None
        self.conn = self.sender = None

    # --- sends and their outcomes ---------------------------------------------------------------------------------

    def start(self, book: Book) -> None:
        self.book = book

    def send(self, event_id: str, intended_ns: int) -> None:
        from proton import Message

        book, sender = self.book, self.sender
        sent = time.time_ns()
        book.sent(event_id, intended_ns, sent)
        if sender is None or not self.opened:
            book.done(event_id, sent, None, "not connected")
            return
        self._tag += 1
        tag = str(self._tag)
        sender.send(self._message(Message, event_id, sent), tag=tag)
        if self.address.settle == "presettled":
            book.done(event_id, sent, None, None)
        else:
            self.pending[tag.encode()] = (event_id, sent)

    def _message(self, message_class, event_id: str, sent: int):
        props = dict(self._fixed)
        props[amqp.ID_HEADER] = event_id
        props[amqp.SENT_HEADER] = sent
        return message_class(body=self.payload, id=event_id, content_type="application/octet-stream", properties=props)

    def _check_size(self) -> None:
        """An event over the ``max-message-size`` the broker gave the link when it attached fails every send:
        ``ValueError`` before the attack, in one line (the size is the event as encoded, properties and all)."""
        from proton import Message

        limit = self.sender.remote_max_message_size if self.sender is not None else 0
        size = len(self._message(Message, "x" * 40, time.time_ns()).encode())
        if limit and size > limit:
            raise ValueError(f"an event of {len(self.payload):,} bytes ({size:,} as an AMQP message) is over the "
                             f"broker's max-message-size for {self.address.address} ({limit:,}): give a smaller "
                             "--payload, or raise the broker's limit")

    def outcome(self, delivery, error: str | None) -> None:
        entry = self.pending.pop(delivery.tag if isinstance(delivery.tag, bytes) else delivery.tag.encode(), None)
        if entry is not None:
            self.book.done(entry[0], entry[1], None, error)

    def poll(self, timeout_s: float) -> int:
        """Serve the reactor for up to ``timeout_s``; reopen a lost connection; fail sends past the timeout."""
        now = time.monotonic()
        if self.sender is None and self.book is not None and now >= self._next_try:
            self._next_try = now + RECONNECT_S
            try:
                self._open()
            except Exception as e:  # noqa: BLE001 - the broker away: tried again after RECONNECT_S
                self.error = str(e)
        if self.container is not None:
            self._process(timeout_s)
        else:
            time.sleep(timeout_s)
        if now >= self._next_expiry:
            self._next_expiry = now + 1.0
            limit = time.time_ns() - int(self.opts.timeout_s * 1e9)
            for tag in [t for t, (_e, s) in self.pending.items() if s < limit]:
                eid, sent = self.pending.pop(tag)
                self.book.done(eid, sent, None, "timeout")
        return 0

    async def close(self) -> None:
        """Serve outcomes still due (at most the send timeout), then close."""
        deadline = time.monotonic() + self.opts.timeout_s
        while self.pending and self.sender is not None and time.monotonic() < deadline:
            self._process(0.02)
            await asyncio.sleep(0)
        self._close_now()


@functools.cache
def _events_class():
    """proton's handler class for targets, made once (proton is imported on first use)."""
    from proton import Delivery
    from proton.handlers import MessagingHandler

    class Events(MessagingHandler):
        """proton's events for one target: link opened, outcomes, errors."""

        def __init__(self, target: Amqp1Target) -> None:
            super().__init__(auto_settle=True)
            self.target = target

        def on_link_opened(self, event) -> None:
            if event.link.is_sender and event.connection == self.target.conn:
                self.target.opened = True

        def on_accepted(self, event) -> None:
            self.target.outcome(event.delivery, None)

        def on_rejected(self, event) -> None:
            self.target.outcome(event.delivery, amqp.condition_text("rejected", event.delivery.remote.condition))

        def on_released(self, event) -> None:
            self.target.outcome(event.delivery, "modified" if event.delivery.remote_state == Delivery.MODIFIED
                                else "released")

        def on_link_error(self, event) -> None:
            self.target.lost(event.connection, amqp.condition_text("link closed", event.link.remote_condition))

        def on_session_error(self, event) -> None:  # RabbitMQ's plugin ends the session for an address it refuses
            self.target.lost(event.connection, amqp.condition_text("session closed", event.session.remote_condition))
            event.connection.close()

        def on_connection_error(self, event) -> None:
            self.target.lost(event.connection, amqp.condition_text("connection closed", event.connection.remote_condition))

        def on_transport_error(self, event) -> None:
            self.target.lost(event.connection, amqp.condition_text("connection lost", event.transport.condition))

        def on_disconnected(self, event) -> None:
            if self.target.sender is not None:
                self.target.lost(event.connection, "connection lost")
    return Events


def _events(target: Amqp1Target):
    return _events_class()(target)
