"""The AMQP 1.0 receiver: consume an address of an AMQP 1.0 broker (Artemis, RabbitMQ's plugin, Dispatch Router) and
record the receive time of every event.

proton's engine driven by hand (``transports.amqp1.engine``) in the agent's own thread. Per message: stamp the receive time,
read the event ID (the ``cloudEvents_id`` application property, else the message ID) and run ID
(``cloudEvents_fwrun``) with ``transports.amqp1.codec``, append one receive line to the disk spool, then accept it (the
broker forgets it once accepted: it is recorded by then). The link grants ``--prefetch`` credit, topped up at half.
A lost connection is opened again every ``RECONNECT_S``; a message that is not AMQP 1.0 is counted apart
(``malformed``) and accepted, so the broker does not give it again and again.
"""
from __future__ import annotations

import time

from core import contract
from transports import amqp
from transports.amqp1.codec import read_event
from transports.amqp1.engine import EngineLink, pair_addresses

PREFETCH = 1000
PAIR_PREFETCH_MIN = 20
"""With ``?pairs=N``, each link's credit is ``--prefetch`` / N, at least this."""
RECONNECT_S = 0.5
_ID, _RUN = amqp.ID_HEADER.encode(), amqp.RUN_HEADER.encode()


class Amqp1Receiver:
    """Consumes one address; ``serve(seconds)`` serves the connection for that long, reconnecting while the broker
    is away."""

    def __init__(self, host: str, port: int, userinfo: str | None, address: amqp.Amqp1Address, spool, agent: str,
                 prefetch: int = PREFETCH, log=print, warn=None) -> None:
        self.host, self.port, self.userinfo, self.address = host, port, userinfo, address
        self.spool, self.agent, self.prefetch = spool, agent, prefetch
        self.log, self.warn = log, warn or log
        self.lines = contract.FastLines("", agent)
        # where each link's events arrive: its address and, with pairs, its pair (``contract.Receive``)
        self._where = [self.lines.where(a, i if address.pairs > 1 else None)
                       for i, a in enumerate(pair_addresses(address.address, address.pairs))]
        self.num_received = self.num_unattributed = self.num_malformed = 0
        self.num_connection_losses = self.num_connects = 0
        self.link: EngineLink | None = None
        self._next_try = 0.0
        self._was_open = False

    def counters(self) -> dict:
        out = {"agent": self.agent, "received": self.num_received, "unattributed": self.num_unattributed,
               "malformed": self.num_malformed, "redelivered": 0, "connects": self.num_connects,
               "connection_losses": self.num_connection_losses,
               "connected": int(self.link is not None and self.link.opened and self.link.closed is None)}
        if self.spool is not None:
            out["telemetry"] = self.spool.counters()
        return out

    def collect(self):
        return amqp.amqp_families(self)

    def progress(self) -> tuple[tuple, str]:
        return amqp.amqp_progress(self, "malformed")

    def _open(self) -> None:
        pairs = self.address.pairs  # credit per link: 10/s a pair needs little, and 1,000 links share the budget
        link = EngineLink(self.host, self.port, self.userinfo, self.address.address, sending=False,
                          prefetch=self.prefetch if pairs == 1 else max(self.prefetch // pairs, PAIR_PREFETCH_MIN),
                          name=f"flightwatch-{self.agent}", pairs=pairs, durable=self.address.durable,
                          tls=self.address.tls)
        link.on_message = self.on_message
        link.on_lost = lambda why: self.lost(link, why)
        self.link, self._was_open = link, False
        link.open()

    def connect(self, within_s: float) -> None:
        """The first connection: ``ConnectionError`` with the broker's reason."""
        try:
            self._open()
        except OSError as e:
            raise ConnectionError(e.strerror or str(e)) from None
        self.link.attach(within_s)
        self.num_connects += 1
        self._was_open = True

    def process(self, timeout_s: float) -> None:
        link = self.link
        if link is None:
            time.sleep(timeout_s)
            return
        link.pump(timeout_s)
        if link.opened and not self._was_open and link.closed is None:
            self._was_open = True
            if self.num_connects:
                self.log(f"receiver {self.agent}: consuming again ({self.address.address})")
            self.num_connects += 1

    def serve(self, seconds: float) -> None:
        """The connection for ``seconds``; a lost one reopened every ``RECONNECT_S``."""
        end = time.monotonic() + seconds
        while (now := time.monotonic()) < end:
            link = self.link
            if link is not None and link.closed is not None:
                link.close(0)
                self.link = link = None
            if link is None and now >= self._next_try:
                self._next_try = now + RECONNECT_S
                try:
                    self._open()
                except OSError:  # the broker still away: tried again after RECONNECT_S
                    self.link = None
            self.process(min(end - now, 0.1))

    def lost(self, link: EngineLink, why: str) -> None:
        """The connection or link went away."""
        if link is not self.link:
            return
        if self._was_open:
            self.num_connection_losses += 1
            self.warn(f"receiver {self.agent}: {why}; reconnecting every {RECONNECT_S:g} s")
        self._next_try = time.monotonic() + RECONNECT_S

    def on_message(self, message, pair: int = 0) -> None:
        now = time.time_ns()
        try:
            event_id, run_id, size = read_event(message, _ID, _RUN)
        except ValueError:
            self.num_malformed += 1
            return
        if event_id and run_id:
            self.num_received += 1
            if self.spool is not None:
                self.spool.append(self.lines.recv(run_id, now, event_id, size, self._where[pair]))
        else:
            self.num_unattributed += 1

    def close(self) -> None:
        if self.link is not None:
            self.link.close(0.05)
            self.link = None
