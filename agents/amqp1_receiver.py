"""The AMQP 1.0 receiver: consume an address of an AMQP 1.0 broker (Artemis, RabbitMQ's plugin, Dispatch Router) and
record the receive time of every event.

python-qpid-proton's reactor in the agent's own thread. Per message: stamp the receive time, read the event ID
(the ``cloudEvents_id`` application property, else the message ID) and run ID (``cloudEvents_fwrun``), append one
receive line to the disk spool, then accept it (the broker forgets it once accepted: it is recorded by then). The
link grants ``--prefetch`` credit. A lost connection is opened again every ``RECONNECT_S``.
"""
from __future__ import annotations

import time

from core import amqp, contract

PREFETCH = 1000
RECONNECT_S = 0.5
KEEP_ALIVE_S = 10 * 365 * 86400.0
"""A timer that never fires: proton's reactor ends once it has neither a connection nor a timer."""


class Amqp1Receiver:
    """Consumes one address; ``serve(seconds)`` runs the reactor for that long, reconnecting while the broker is away."""

    def __init__(self, host: str, port: int, userinfo: str | None, address: amqp.Amqp1Address, spool, agent: str,
                 prefetch: int = PREFETCH, log=print, warn=None) -> None:
        amqp.quiet_clients()
        self.host, self.port, self.userinfo, self.address = host, port, userinfo, address
        self.spool, self.agent, self.prefetch = spool, agent, prefetch
        self.log, self.warn = log, warn or log
        self.lines = contract.FastLines("", agent)
        self.num_received = self.num_unattributed = self.num_connection_losses = self.num_connects = 0
        self.container = self.conn = self.link = None
        self.opened = False
        self.error: str | None = None
        self._next_try = 0.0

    def counters(self) -> dict:
        out = {"agent": self.agent, "received": self.num_received, "unattributed": self.num_unattributed,
               "redelivered": 0, "connects": self.num_connects, "connection_losses": self.num_connection_losses,
               "connected": int(self.opened and self.link is not None)}
        if self.spool is not None:
            out["telemetry"] = self.spool.counters()
        return out

    def _open(self) -> None:
        from proton.reactor import Container

        if self.container is None:
            self.container = Container(_handler(self))
            self.container.start()
            self.container.schedule(KEEP_ALIVE_S, None)  # a reactor with no connection left ends: this keeps it
        user, _, password = (self.userinfo or ":").partition(":")
        self.opened, self.error = False, None
        self.conn = self.container.connect(url=f"amqp://{self.host}:{self.port}", reconnect=False, user=user or None,
                                           password=password or None, allow_insecure_mechs=True, sasl_enabled=bool(user))
        self.link = self.container.create_receiver(self.conn, self.address.address)

    def connect(self, within_s: float) -> None:
        """The first connection: ``ConnectionError`` with the broker's reason."""
        self._open()
        deadline = time.monotonic() + within_s
        while self.error is None and not self.opened:
            if time.monotonic() > deadline:
                self.error = (f"no AMQP 1.0 link within {within_s:g} s: is {self.host}:{self.port} an AMQP 1.0 broker?")
                break
            self.process(0.05)
        if self.opened:  # a broker that refuses an address attaches, then detaches at once
            self.process(0.1)
        if self.error is not None:
            raise ConnectionError(self.error)
        self.num_connects += 1

    def process(self, timeout_s: float) -> None:
        self.container.timeout = timeout_s
        self.container.process()

    def serve(self, seconds: float) -> None:
        """The reactor for ``seconds``; a lost connection reopened every ``RECONNECT_S``."""
        end = time.monotonic() + seconds
        while (now := time.monotonic()) < end:
            if self.link is None and now >= self._next_try:
                self._next_try = now + RECONNECT_S
                self._open()
            self.process(min(end - now, 0.1))

    def lost(self, connection, why: str) -> None:
        """The connection or link went away (events of an earlier connection, arriving late, are let go)."""
        if connection != self.conn:  # proton wraps one C connection in new Python objects: == compares the C one
            return
        if self.link is not None and self.opened:
            self.num_connection_losses += 1
            self.warn(f"receiver {self.agent}: {why}; reconnecting every {RECONNECT_S:g} s")
        self.error, self.link = why, None
        self._next_try = time.monotonic() + RECONNECT_S

    def on_message(self, event) -> None:
        now = time.time_ns()
        msg = event.message
        props = msg.properties or {}
        event_id = _text(props.get(amqp.ID_HEADER)) or _text(msg.id)
        run_id = _text(props.get(amqp.RUN_HEADER))
        if event_id and run_id:
            self.num_received += 1
            body = msg.body
            if self.spool is not None:
                self.spool.append(self.lines.recv(run_id, now, event_id, len(body) if body is not None else 0))
        else:
            self.num_unattributed += 1

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.process(0.05)
        if self.container is not None:
            self.container.stop()


def _text(value) -> str | None:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value) if value is not None and value != "" else None


def _handler(receiver: Amqp1Receiver):
    from proton.handlers import MessagingHandler

    class Events(MessagingHandler):
        def __init__(self) -> None:
            super().__init__(prefetch=receiver.prefetch, auto_accept=True)

        def on_link_opened(self, event) -> None:
            if event.link.is_receiver and event.connection == receiver.conn:
                receiver.opened = True
                if receiver.num_connects:
                    receiver.log(f"receiver {receiver.agent}: consuming again ({receiver.address.address})")

        def on_message(self, event) -> None:
            receiver.on_message(event)

        def on_link_error(self, event) -> None:
            receiver.lost(event.connection, amqp.condition_text("link closed", event.link.remote_condition))

        def on_session_error(self, event) -> None:  # RabbitMQ's plugin ends the session for an address it refuses
            receiver.lost(event.connection, amqp.condition_text("session closed", event.session.remote_condition))
            event.connection.close()

        def on_connection_error(self, event) -> None:
            receiver.lost(event.connection, amqp.condition_text("connection closed", event.connection.remote_condition))

        def on_transport_error(self, event) -> None:
            receiver.lost(event.connection, amqp.condition_text("connection lost", event.transport.condition))

        def on_disconnected(self, event) -> None:
            if receiver.link is not None:
                receiver.lost(event.connection, "connection lost")
    return Events()
