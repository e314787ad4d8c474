"""AMQP 0-9-1 (RabbitMQ): pika's asyncio connection, publisher confirms, many publishes in flight.

    amqp://guest:guest@127.0.0.1:29672/%2F?queue=flightwatch.sut     (``transports.amqp`` has the address' options)
    amqp://guest:guest@127.0.0.1:29672/%2F?exchange=fw.topic&bindings=100   event k with the routing key fw.<k mod 100>

pika, not aiormq or aio-pika: at 5,000 messages/s with confirms it took 70 µs of CPU a publish against aiormq's 215
(``python -m bench.amqp_clients``). Each event is one ``basic.publish`` with ``mandatory`` set, its frames written by
``PublishFrames`` (byte for byte pika's) and handed to pika's transport, its send stamp taken right before that. Its
outcome comes back as the broker's confirm: an ack (taken), a nack, a return before the ack (unroutable: counted as
``returned no route``), or the channel or connection closing first (counted by the broker's reason). A connection
that is lost is opened again every ``RECONNECT_S`` while the attack runs; sends meanwhile fail at once as ``not
connected``.
"""
from __future__ import annotations

import asyncio
import itertools
import os
import struct
import time

from transports import amqp
from transports.base import Book, TargetOptions, tcp_reachable, url_receiver_place
from transports.http.target import CE_SOURCE, CE_TYPE

RECONNECT_S = 0.5
"""How often a lost connection is tried again while the attack runs."""
PEEK_S = 5.0
"""How long the look at a queue's consumers before a run may take (``consumers``)."""
_LONG = struct.Struct(">q")
CONTENT_TYPE = "application/octet-stream"


def _shortstr(text: str) -> bytes:
    raw = text.encode()
    if len(raw) > 255:
        raise ValueError(f"{text[:40]!r}...: over 255 bytes, too long for an AMQP 0-9-1 short string")
    return bytes((len(raw),)) + raw


class PublishFrames:
    """The frames of one event's ``basic.publish`` (method, content header, body), as bytes.

    pika marshals them in Python for every publish: 30% of the generator's samples at 5,000/s (py-spy; the method
    frame and the body's are the same for every event, and BasicProperties.encode walks the headers table each time).
    Here pika marshals the method and body frames once; the content header is written by hand per event, with its
    fixed parts joined once: ``content-type``, the ``headers`` table (the fixed CloudEvents headers, then the event
    ID as a long string and the send stamp as a long long, as pika writes them), ``delivery-mode`` and
    ``message-id``. The tests decode what this writes with pika's own frame decoder."""

    def __init__(self, channel_number: int, exchange: str, routing_key: str | list[str], payload: bytes, body_max: int,
                 content_type: str, fixed: dict[str, str], id_key: str, stamp_key: str, delivery_mode: int) -> None:
        import pika
        from pika import frame

        keys = [routing_key] if isinstance(routing_key, str) else routing_key  # a method frame per route, made once
        self._heads = [frame.Method(channel_number, pika.spec.Basic.Publish(exchange=exchange, routing_key=key,
                                                                           mandatory=True)).marshal() for key in keys]
        body = b"".join(frame.Body(channel_number, payload[i:i + body_max]).marshal()
                        for i in range(0, len(payload), body_max))
        self._head, self._body = self._heads[0], body
        self._frame = struct.pack(">BH", 2, channel_number)  # a content header frame on this channel
        flags = (pika.spec.BasicProperties.FLAG_CONTENT_TYPE | pika.spec.BasicProperties.FLAG_HEADERS
                 | pika.spec.BasicProperties.FLAG_DELIVERY_MODE | pika.spec.BasicProperties.FLAG_MESSAGE_ID)
        self._props = struct.pack(">HHQH", pika.spec.BasicProperties.INDEX, 0, len(payload), flags) + \
            _shortstr(content_type)
        self._fixed = b"".join(_shortstr(k) + b"S" + struct.pack(">I", len(v.encode())) + v.encode()
                               for k, v in fixed.items()) + _shortstr(id_key) + b"S"
        self._stamp_key = _shortstr(stamp_key) + b"l"
        self._mode = bytes((delivery_mode,))

    def frames(self, event_id: str, sent_ns: int, route: int = 0) -> bytes:
        """The event's frames, published with routing key ``route`` (its index in the keys given)."""
        eid = event_id.encode()
        if len(eid) > 255:  # the message ID is a short string
            raise ValueError(f"event ID {event_id[:40]!r}...: over 255 bytes, too long for an AMQP 0-9-1 message ID")
        table = self._fixed + struct.pack(">I", len(eid)) + eid + self._stamp_key + _LONG.pack(sent_ns)
        payload = (self._props + struct.pack(">I", len(table)) + table + self._mode + bytes((len(eid),)) + eid)
        return (self._heads[route] + self._frame + struct.pack(">I", len(payload)) + payload + b"\xce" + self._body)


class Amqp091Target:
    SCHEMES = ("amqp", "amqps")
    RECEIVER = "amqp"
    TLS_PORT = 5671
    SECURE = amqp.SECURE
    DEFAULT_PORT = 5672
    EXAMPLE = "amqp://USER:PASSWORD@HOST:PORT/VHOST?queue=NAME (RabbitMQ)"
    TAKES_KAFKA_OPTIONS = False
    polled = False

    @staticmethod
    def receiver_args(spec) -> list[str]:
        """The receiver agent on the queue the load goes to (for an exchange, a queue of its own bound with the
        routing key; with ``?bindings=N``, every queue), given the URL with its user alone: the load generator hands
        it the password in its environment (``core.secrets.child_env``), where no command line shows it."""
        return ["amqp", "--url", spec.with_user()]

    receiver_place = staticmethod(url_receiver_place)
    reachable = staticmethod(tcp_reachable)

    @staticmethod
    def share_args(spec, i: int, count: int) -> list[str]:
        """Competing consumers of the target's queue; an exchange's receivers would each bind a queue of its own
        (every event recorded ``count`` times): one."""
        if count > 1 and amqp.AmqpAddress.parse(spec.path, spec.query, spec.scheme).queue is None:
            raise ValueError("an exchange's receivers each bind a queue of their own: one receiver, or aim at a queue")
        return []

    @staticmethod
    def consumers(spec) -> int | None:
        """The target queue's consumers now (a passive declare); None for an exchange, a queue not there yet, or a
        broker that does not answer within ``PEEK_S`` (the attack's own connect says why)."""
        import pika

        address = amqp.AmqpAddress.parse(spec.path, spec.query, spec.scheme)
        if address.queue is None:
            return None
        params = address.pika_params(spec.host, spec.port, spec.userinfo)
        params.socket_timeout = params.stack_timeout = params.blocked_connection_timeout = PEEK_S
        try:
            conn = pika.BlockingConnection(params)
        except pika.exceptions.AMQPError:
            return None
        try:
            return conn.channel().queue_declare(address.queue, passive=True).method.consumer_count
        except pika.exceptions.AMQPError:
            return None
        finally:
            if conn.is_open:
                conn.close()

    def __init__(self, spec, opts: TargetOptions) -> None:

        self.spec, self.opts = spec, opts
        amqp.quiet_clients()
        self.address = amqp.AmqpAddress.parse(spec.path, spec.query, spec.scheme)
        self.params = self.address.pika_params(spec.host, spec.port, spec.userinfo)
        self.payload = os.urandom(opts.payload_bytes)
        self.book: Book | None = None
        self.conn = self.channel = None
        self.pending: dict[int, tuple[str, int]] = {}   # delivery tag -> (event ID, send stamp)
        self.returned: dict[str, str] = {}              # event ID -> cause, until its confirm comes
        self.tag = 0
        self.closing = False
        self._opened: asyncio.Future | None = None
        self._tasks: list[asyncio.Task] = []
        self._fixed = {"cloudEvents_specversion": "1.0", "cloudEvents_source": CE_SOURCE, "cloudEvents_type": CE_TYPE,
                       amqp.RUN_HEADER: opts.run_id}
        self._mode = 2 if self.address.durable else 1
        self.frames: PublishFrames | None = None
        self._probe_queue = None

    @staticmethod
    def check(scheme: str, path: str, userinfo: str | None, query: str) -> str:
        amqp.AmqpAddress.parse(path or "/", query, scheme)
        return path or "/"

    def shaping(self) -> dict | None:
        a = self.address
        return {"confirms": True, "mandatory": True, "delivery_mode": self._mode, "exchange": a.exchange,
                "routing_key": a.routing_key, "queue": a.queue, "vhost": a.vhost, "bindings": a.bindings}

    # --- the connection -------------------------------------------------------------------------------------------

    async def connect(self) -> None:
        """Open the connection and channel, turn confirms on, declare the queue (or check it exists), and find out
        whether an event is within the broker's size limit (``_probe_size``)."""
        await self._open()
        await self._probe_size()

    async def _probe_size(self) -> None:
        """RabbitMQ refuses a message over its ``max_message_size`` by closing the channel, and AMQP 0-9-1 does not
        tell a client the limit: one event-sized message, on a channel of its own, to a queue of its own (declared
        exclusive, deleted after), finds it before the attack. ``ValueError`` in one line when it is refused."""
        import pika

        loop = asyncio.get_running_loop()
        outcome: asyncio.Future = loop.create_future()
        size = len(self.payload)

        def settle(value) -> None:
            if not outcome.done():
                outcome.set_result(value)

        def opened(ch) -> None:
            ch.add_on_close_callback(lambda _ch, reason: settle(reason))
            ch.confirm_delivery(lambda frame: settle(frame.method),
                                callback=lambda _f: ch.queue_declare("", exclusive=True, callback=declared(ch)))

        def declared(ch):
            def publish(frame) -> None:
                # the body alone: RabbitMQ weighs a message by its body's size (the content header's body-size)
                ch.basic_publish("", frame.method.queue, self.payload, pika.BasicProperties(delivery_mode=1))
                self._probe_queue = (ch, frame.method.queue)
            return publish

        self._probe_queue = None
        self.conn.channel(on_open_callback=opened)
        try:
            answer = await asyncio.wait_for(outcome, self.opts.timeout_s)
        except TimeoutError:
            return  # no answer: the attack says what happens to its events
        if isinstance(answer, pika.spec.Basic.Ack):
            ch, queue = self._probe_queue
            ch.queue_delete(queue, callback=lambda _f: ch.close())
            return
        text = str(answer.args[1]) if isinstance(answer, BaseException) and len(answer.args) >= 2 else str(answer)
        if "larger than" in text:  # RabbitMQ: PRECONDITION_FAILED - message size N is larger than configured max size M
            raise ValueError(f"an event of {size:,} bytes is over the broker's max_message_size ({text}): give a "
                             "smaller --payload, or raise the broker's limit")

    async def _open(self) -> None:
        from pika.adapters.asyncio_connection import AsyncioConnection

        amqp.require_pika_internals()  # PikaMismatch (one line, exit 2) before any connection: never a SUT error
        amqp.coalesce_pika_writes()

        loop = asyncio.get_running_loop()
        self._opened = loop.create_future()
        self.conn = AsyncioConnection(self.params, on_open_callback=self._on_connection,
                                      on_open_error_callback=self._on_open_error, on_close_callback=self._on_closed,
                                      custom_ioloop=loop)
        try:
            await asyncio.wait_for(self._opened, self.opts.timeout_s)
        except TimeoutError:
            raise ConnectionError(f"amqp {self.spec}: no AMQP 0-9-1 handshake within {self.opts.timeout_s:g} s: is "
                                  f"{self.spec.host}:{self.spec.port} an AMQP broker?") from None

    def _fail_open(self, why: str) -> None:
        if self._opened is not None and not self._opened.done():
            self._opened.set_exception(ConnectionError(f"amqp {self.spec}: {why}"))

    def _on_open_error(self, _conn, error: BaseException) -> None:
        self._fail_open(amqp.open_failure(error))

    def _on_connection(self, conn) -> None:
        conn.channel(on_open_callback=self._on_channel)

    def _on_channel(self, channel) -> None:
        channel.add_on_close_callback(self._on_channel_closed)
        channel.add_on_return_callback(self._on_return)
        channel.confirm_delivery(self._on_confirm, callback=lambda _f: self._declare(channel))

    def _declare(self, channel) -> None:
        a = self.address
        if a.bindings:  # the topic exchange the receiver binds its queues to (the same declaration: idempotent)
            channel.exchange_declare(a.exchange, "topic", durable=a.durable, callback=lambda _f: self._ready(channel))
            return
        if a.queue is None:
            self._ready(channel)
            return
        channel.queue_declare(a.queue, passive=not a.declare, durable=a.durable,
                              callback=lambda _f: self._ready(channel))

    def _ready(self, channel) -> None:
        self._fail_pending("channel closed: replaced")  # none are left by now: the old channel's failed as it closed
        self.tag = 0  # a channel numbers its publishes from 1
        a, conn = self.address, channel.connection
        keys = [key for _queue, key in a.routes()] if a.bindings else a.routing_key
        self.frames = PublishFrames(channel.channel_number, a.exchange, keys, self.payload,
                                    conn._body_max_length, CONTENT_TYPE, self._fixed, amqp.ID_HEADER,
                                    amqp.SENT_HEADER, self._mode)
        self.channel = channel
        if self._opened is not None and not self._opened.done():
            self._opened.set_result(None)

    def _on_channel_closed(self, channel, reason) -> None:
        self.channel = None
        self._fail_open(f"{amqp.close_cause(reason)} ({reason})")
        self._fail_pending("channel closed: " + amqp.close_cause(reason))
        if self.conn is not None and self.conn.is_open and not self.closing:
            self.conn.close()  # a new connection and channel (``_reconnect``)

    def _on_closed(self, _conn, reason) -> None:
        self.channel = None
        self._fail_open(f"{amqp.close_cause(reason)} ({reason})")
        self._fail_pending("connection closed: " + amqp.close_cause(reason))

    def _fail_pending(self, cause: str) -> None:
        pending, self.pending = self.pending, {}
        if pending and self.book is None:
            return
        for eid, sent in pending.values():
            self.book.done(eid, sent, None, cause)
        self.returned.clear()

    async def _reconnect(self) -> None:
        while not self.closing:
            await asyncio.sleep(RECONNECT_S)
            if self.channel is None and (self.conn is None or self.conn.is_closed):
                try:
                    await self._open()
                except ConnectionError:
                    continue

    async def _expire(self) -> None:
        """Sends unconfirmed past the timeout fail as ``timeout`` (their confirm, if it comes, is then ignored)."""
        while not self.closing:
            await asyncio.sleep(1.0)
            limit = time.time_ns() - int(self.opts.timeout_s * 1e9)
            old = [tag for tag, (_eid, sent) in self.pending.items() if sent < limit]
            for tag in old:
                eid, sent = self.pending.pop(tag)
                self.book.done(eid, sent, None, "timeout")

    # --- sends and their outcomes ---------------------------------------------------------------------------------

    def start(self, book: Book) -> None:
        self.book = book
        self._tasks = [asyncio.ensure_future(self._reconnect()), asyncio.ensure_future(self._expire())]

    def send(self, event_id: str, intended_ns: int) -> None:
        import pika

        book, channel = self.book, self.channel
        bindings = self.address.bindings  # event k to routing key k mod N
        route = int(event_id.rpartition("-")[2]) % bindings if bindings else None
        sent = time.time_ns()
        book.sent(event_id, intended_ns, sent, route)
        if channel is None:
            book.done(event_id, sent, None, "not connected")
            return
        try:
            if not (channel.is_open and channel.connection.is_open):  # its transport is gone once the stream is lost
                raise pika.exceptions.ChannelWrongStateError("Channel is closed.")
            # what channel.basic_publish would write, marshalled by PublishFrames (pika's write path from there on;
            # its private parts are checked before the first connection: amqp.require_pika_internals)
            channel.connection._output_marshaled_frames((self.frames.frames(event_id, sent, route or 0),))
        except (pika.exceptions.AMQPError, OSError) as e:  # the channel closed under us: that send's error, by its kind
            # (anything else is flightwatch's own bug: it is raised, never booked as the SUT's error)
            book.done(event_id, sent, None, "channel closed: " + amqp.close_cause(e))
            return
        self.tag += 1
        self.pending[self.tag] = (event_id, sent)

    def _on_return(self, _channel, method, properties, _body) -> None:
        self.returned[properties.message_id] = "returned " + method.reply_text.lower().replace("_", " ")

    def _on_confirm(self, frame) -> None:
        import pika

        method = frame.method
        error = None if isinstance(method, pika.spec.Basic.Ack) else "nack"
        # ``pending`` is in publish order (tags rise): a multiple confirm's tags are its head, not a scan of it all
        tags = (list(itertools.takewhile(method.delivery_tag.__ge__, self.pending)) if method.multiple
                else [method.delivery_tag])
        book, returned = self.book, self.returned
        for tag in tags:
            entry = self.pending.pop(tag, None)
            if entry is None:  # expired as a timeout already
                continue
            eid, sent = entry
            book.done(eid, sent, None, (returned.pop(eid, None) or error) if returned else error)

    def poll(self, timeout_s: float) -> int:
        raise NotImplementedError("an AMQP 0-9-1 target lives on the event loop")

    async def close(self) -> None:
        """Wait for the confirms still due (at most the send timeout), then close."""
        deadline = time.monotonic() + self.opts.timeout_s
        while self.pending and self.channel is not None and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        self.closing = True
        for t in self._tasks:
            t.cancel()
        if self.conn is not None and self.conn.is_open:
            closed = asyncio.get_running_loop().create_future()
            self.conn.add_on_close_callback(lambda *_: closed.done() or closed.set_result(None))
            self.conn.close()
            try:
                await asyncio.wait_for(closed, 5)
            except TimeoutError:
                pass
