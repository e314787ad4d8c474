"""The AMQP 0-9-1 receiver: consume a RabbitMQ queue and record the receive time of every event.

pika's asyncio connection (70 µs of CPU a message consumed with manual acks at 5,000/s, against aiormq's 141:
``python -m bench.amqp_clients``). Per delivery: stamp the receive time, read the event ID (the
``cloudEvents_id`` header, else the message ID) and run ID (``cloudEvents_fwrun``), append one receive line to the
disk spool (a shipper tails it into the telemetry topic), then ack. Acks go once per read from the socket, as one
``basic.ack`` with ``multiple`` set, after the lines are in the spool: a delivery is acked only once it is recorded.
With ``--auto-ack`` the broker forgets a message as it sends it (less work for both, and a message the receiver
never recorded is lost, as with any auto-ack consumer).

A delivery the broker marks as redelivered is counted (``redelivered``): the broker sent it again because an earlier
delivery was not acked (a consumer or connection that went away). Whether it is a duplicate is the job's call.
An address with an exchange and no queue consumes through a server-named exclusive queue bound with the routing key;
with ``?bindings=N``, a topic exchange, N named queues each bound with its own key, every one consumed.
"""
from __future__ import annotations

import asyncio
import time

from core import contract
from transports import amqp

PREFETCH = 1000
"""Unacked deliveries the broker may have in flight to the receiver (``basic.qos``)."""
PREFETCH_MIN = 20
"""With ``?bindings=N``, each queue's consumer may have ``PREFETCH`` / N in flight, at least this."""
RECONNECT_S = 0.5


class AmqpReceiver:
    """Consumes one queue; ``run`` until ``stop`` is set, reconnecting while the broker is away."""

    def __init__(self, params, address: amqp.AmqpAddress, spool, agent: str, prefetch: int = PREFETCH,
                 auto_ack: bool = False, log=print, warn=None) -> None:
        self.params = params  # pika's connection parameters (``AmqpAddress.from_url``)
        amqp.quiet_clients()
        self.address, self.spool, self.agent = address, spool, agent
        self.prefetch, self.auto_ack = prefetch, auto_ack
        self.log, self.warn = log, warn or log
        self.lines = contract.FastLines("", agent)
        self._places: dict[str, tuple[str, int | None]] = {}    # consumer tag -> its queue and route
        self._where_by: dict[tuple[str, str], str] = {}          # (consumer tag, routing key) -> a receive line's end
        self.num_received = self.num_unattributed = self.num_redelivered = 0
        self.num_connects = self.num_connection_losses = 0
        self.conn = self.channel = None
        self.last_error: str | None = None
        self.consumed_ns: int | None = None  # when it last began consuming every queue (epoch ns)
        self._opened: asyncio.Future | None = None
        self._lost: asyncio.Event | None = None
        self._ack_tag = 0
        self._ack_scheduled = False

    def counters(self) -> dict:
        out = {"agent": self.agent, "received": self.num_received, "unattributed": self.num_unattributed,
               "redelivered": self.num_redelivered, "connects": self.num_connects,
               "connection_losses": self.num_connection_losses, "connected": int(self.channel is not None)}
        if self.spool is not None:
            out["telemetry"] = self.spool.counters()
        return out

    def collect(self):
        return amqp.amqp_families(self)

    def progress(self) -> tuple[tuple, str]:
        return amqp.amqp_progress(self, "redelivered")

    async def connect(self) -> None:
        """Open, declare (or check) the queue and start consuming; ``ConnectionError`` with the broker's reason."""
        from pika.adapters.asyncio_connection import AsyncioConnection

        loop = asyncio.get_running_loop()
        self._opened, self._lost = loop.create_future(), asyncio.Event()
        self.conn = AsyncioConnection(self.params, on_open_callback=lambda c: c.channel(on_open_callback=self._on_channel),
                                      on_open_error_callback=lambda _c, e: self._fail(e),
                                      on_close_callback=self._on_closed, custom_ioloop=loop)
        await self._opened
        self.num_connects += 1

    def _fail(self, error) -> None:
        if self._opened is not None and not self._opened.done():
            self._opened.set_exception(ConnectionError(amqp.open_failure(error)))

    def _on_closed(self, _conn, reason) -> None:
        self.channel = None
        self.last_error = f"{amqp.close_cause(reason)} ({reason})"
        self._fail(reason)
        if self._lost is not None:
            self._lost.set()

    def _on_channel(self, channel) -> None:
        channel.add_on_close_callback(self._on_channel_closed)
        a = self.address
        if a.bindings:  # a topic exchange, a queue and a binding for each route, every queue consumed
            channel.exchange_declare(a.exchange, "topic", durable=a.durable,
                                     callback=lambda _f: self._bind_all(channel, a.routes()))
        elif a.queue is None:  # an exchange: a queue of our own, bound to it
            channel.queue_declare("", exclusive=True, auto_delete=True,
                                  callback=lambda f: channel.queue_bind(f.method.queue, a.exchange, a.routing_key,
                                                                        callback=lambda _b: self._consume(channel,
                                                                                                          f.method.queue)))
        else:
            channel.queue_declare(a.queue, passive=not a.declare, durable=a.durable,
                                  callback=lambda _f: self._consume(channel, a.queue))

    def _bind_all(self, channel, routes: list[tuple[str, str]]) -> None:
        """Declare and bind each route's queue, one after the other (pika runs one synchronous method at a time on a
        channel), then consume them all; ``routes`` is what is left to declare."""
        if not routes:
            self._consume(channel, *[q for q, _key in self.address.routes()])
            return
        (queue, key), rest = routes[0], routes[1:]
        channel.queue_declare(queue, durable=self.address.durable, callback=lambda _f: channel.queue_bind(
            queue, self.address.exchange, key, callback=lambda _b: self._bind_all(channel, rest)))

    def _consume(self, channel, *queues: str) -> None:
        def go(_f) -> None:
            routes = {q: i for i, (q, _key) in enumerate(self.address.routes())} if self.address.bindings else {}
            for queue in queues:
                tag = channel.basic_consume(queue, self._on_message, auto_ack=self.auto_ack)
                self._places[tag] = (queue, routes.get(queue))
            self.channel = channel
            self.consumed_ns = time.time_ns()
            if not self._opened.done():
                self._opened.set_result(None)
        # per consumer: many queues share the budget (each of 1,000 bindings needs little at a fixed total rate)
        per_queue = self.prefetch if len(queues) == 1 else max(self.prefetch // len(queues), PREFETCH_MIN)
        channel.basic_qos(prefetch_count=per_queue, callback=go)

    def _on_channel_closed(self, _channel, reason) -> None:
        self.channel = None
        self._fail(reason)
        self.last_error = f"{amqp.close_cause(reason)} ({reason})"
        if self.conn is not None and self.conn.is_open:
            self.conn.close()

    def _on_message(self, channel, method, props, body) -> None:
        now = time.time_ns()
        headers = props.headers or {}
        event_id = _text(headers.get(amqp.ID_HEADER)) or props.message_id
        run_id = _text(headers.get(amqp.RUN_HEADER))
        if method.redelivered:
            self.num_redelivered += 1
        if event_id and run_id:
            self.num_received += 1
            if self.spool is not None:
                self.spool.append(self.lines.recv(run_id, now, event_id, len(body), self._where(method)))
        else:
            self.num_unattributed += 1
        if not self.auto_ack:
            self._ack_tag = method.delivery_tag
            if not self._ack_scheduled:  # one ack for what this read from the socket delivered
                self._ack_scheduled = True
                asyncio.get_running_loop().call_soon(self._ack, channel)

    def _where(self, method) -> str:
        """Where a delivery arrived, as its receive line ends (``contract.Receive``): the queue its consumer reads,
        that queue's route among the bindings, and the routing key it was published with (left out when it is the
        queue's name: a publish to the queue itself); made once per pair of consumer and key."""
        got = self._where_by.get((method.consumer_tag, method.routing_key))
        if got is None:
            if len(self._where_by) > 10_000:  # keys the system under test made up: bounded
                self._where_by.clear()
            queue, route = self._places.get(method.consumer_tag, (None, None))
            key = method.routing_key if method.routing_key != queue else None  # the default exchange's key: the queue
            got = self._where_by[(method.consumer_tag, method.routing_key)] = self.lines.where(queue, route, key)
        return got

    def _ack(self, channel) -> None:
        self._ack_scheduled = False
        if channel.is_open:
            channel.basic_ack(self._ack_tag, multiple=True)

    async def run(self, stop: asyncio.Event) -> None:
        """Consume until ``stop``; a lost connection is opened again every ``RECONNECT_S``, said once per loss."""
        while not stop.is_set():
            if self.channel is None:
                try:
                    await self.connect()
                    if self.num_connects > 1:
                        self.log(f"receiver {self.agent}: consuming again ({self.address.where()})")
                except ConnectionError as e:
                    self.last_error = str(e)
                    await _wait(stop, RECONNECT_S)
                    continue
            waiter = asyncio.ensure_future(self._lost.wait())
            stopper = asyncio.ensure_future(stop.wait())
            await asyncio.wait([waiter, stopper], return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            stopper.cancel()
            if self._lost.is_set() and not stop.is_set():
                self.num_connection_losses += 1
                self.warn(f"receiver {self.agent}: connection lost ({self.last_error}); reconnecting every "
                          f"{RECONNECT_S:g} s")
                self.channel = None
        await self.close()

    async def close(self) -> None:
        if self.conn is not None and self.conn.is_open:
            self.conn.close()
            try:
                await asyncio.wait_for(self._lost.wait(), 5)
            except TimeoutError:
                pass


def _text(value) -> str | None:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value if isinstance(value, str) and value else None


async def _wait(event: asyncio.Event, seconds: float) -> None:
    try:
        await asyncio.wait_for(event.wait(), seconds)
    except TimeoutError:
        pass
