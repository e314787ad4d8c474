"""The STOMP receiver: subscribe to a destination of a STOMP 1.2 broker and record the receive time of every event.

One blocking socket, served in the runner's turns. Per MESSAGE frame: stamp the receive time, read the event ID
(``ce-id``) and run ID (``ce-fwrun``) from its headers, append one receive line to the disk spool. The subscription
acknowledges by ``client`` (cumulative): after each read's frames are recorded, one ACK of the last one takes them all,
so the broker forgets nothing that is not recorded. Artemis gives a subscription a window of ``--window`` bytes
unacknowledged (its ``consumer-window-size``). A lost connection is opened again every ``RECONNECT_S``; a frame without
the IDs is counted apart (``unattributed``), and bytes that are no STOMP end the connection as ``malformed``.
"""
from __future__ import annotations

import socket
import time

from core import contract, metrics
from transports.stomp.codec import FrameError, FrameReader, frame
from transports.stomp.target import ID_HEADER, RUN_HEADER, connect_frame, refusal

RECONNECT_S = 0.5
WINDOW_BYTES = 4 << 20
"""The bytes a subscription may hold unacknowledged (``--window``): about 2,000 events of 2 KiB."""


class StompReceiver:
    """Subscribes to one destination; ``serve(seconds)`` serves the connection for that long, reconnecting while the
    broker is away."""

    def __init__(self, host: str, port: int, userinfo: str | None, destination: str, kind: str, spool, agent: str,
                 window: int = WINDOW_BYTES, log=print, warn=None) -> None:
        self.host, self.port, self.userinfo, self.destination, self.kind = host, port, userinfo, destination, kind
        self.spool, self.agent, self.window = spool, agent, window
        self.log, self.warn = log, warn or log
        self.lines = contract.FastLines("", agent)
        self._where = self.lines.where(destination)
        self.num_received = self.num_unattributed = self.num_malformed = 0
        self.num_connects = self.num_connection_losses = 0
        self.sock: socket.socket | None = None
        self.frames = FrameReader()
        self._next_try = 0.0

    def counters(self) -> dict:
        out = {"agent": self.agent, "received": self.num_received, "unattributed": self.num_unattributed,
               "malformed": self.num_malformed, "connects": self.num_connects,
               "connection_losses": self.num_connection_losses, "connected": int(self.sock is not None)}
        if self.spool is not None:
            out["telemetry"] = self.spool.counters()
        return out

    def collect(self):
        labels = (self.agent,)
        yield metrics.family("counter", "flightwatch_stomp_receiver_events", "MESSAGE frames recorded", ["agent"],
                             [(labels, self.num_received)])
        yield metrics.family("counter", "flightwatch_stomp_receiver_unattributed",
                             "MESSAGE frames without an event or run ID", ["agent"], [(labels, self.num_unattributed)])
        yield metrics.family("counter", "flightwatch_stomp_receiver_connection_losses", "connections lost", ["agent"],
                             [(labels, self.num_connection_losses)])
        yield metrics.family("gauge", "flightwatch_stomp_receiver_connected", "1 while subscribed", ["agent"],
                             [(labels, int(self.sock is not None))])
        t = self.spool.counters() if self.spool is not None else {}
        yield metrics.family("counter", "flightwatch_stomp_receiver_telemetry_records", "receive records spooled, and "
                             "lost past the spool's budget", ["agent", "state"],
                             [((self.agent, s), t.get(s, 0)) for s in ("spooled", "lost")])

    def progress(self) -> tuple[tuple, str]:
        return ((self.num_received, self.num_unattributed, self.num_connection_losses),
                f"receiver {self.agent}: {self.num_received:,} received, {self.num_unattributed:,} without IDs, "
                f"{self.num_connection_losses} connections lost")

    # --- the connection -------------------------------------------------------------------------------------------

    def connect(self, within_s: float) -> None:
        """Connect and subscribe: ``ConnectionError`` with the broker's refusal, ``OSError`` if no connection opens."""
        sock = socket.create_connection((self.host, self.port), timeout=within_s)
        try:
            sock.sendall(connect_frame(self.userinfo, self.host))
            frames = FrameReader()
            deadline = time.monotonic() + within_s
            connected = False
            while not connected:
                if time.monotonic() > deadline:
                    raise ConnectionError(f"no CONNECTED within {within_s:g} s: is it a STOMP port?")
                data = sock.recv(65536)
                if not data:
                    raise ConnectionError("the broker closed the connection before CONNECTED")
                for f in frames.feed(data):
                    if f.command == "ERROR":
                        raise ConnectionError(refusal(f))
                    connected |= f.command == "CONNECTED"
            sock.sendall(frame("SUBSCRIBE", {"id": "0", "destination": self.destination, "ack": "client",
                                             "subscription-type": self.kind.upper(),
                                             "consumer-window-size": str(self.window)}))
        except (OSError, ConnectionError, FrameError) as e:
            sock.close()
            if isinstance(e, TimeoutError):
                raise ConnectionError(f"no CONNECTED within {within_s:g} s: is it a STOMP port?") from None
            raise ConnectionError(str(e)) from None
        sock.settimeout(0.1)
        self.sock, self.frames = sock, frames
        self.num_connects += 1

    def serve(self, seconds: float) -> None:
        """The connection for ``seconds``; a lost one opened again every ``RECONNECT_S``."""
        end = time.monotonic() + seconds
        while (now := time.monotonic()) < end:
            if self.sock is None:
                if now < self._next_try:
                    time.sleep(min(self._next_try - now, end - now))
                    continue
                self._next_try = now + RECONNECT_S
                try:
                    self.connect(5.0)
                    self.log(f"receiver {self.agent}: subscribed again ({self.destination})")
                except (OSError, ConnectionError):
                    continue
            self._read()

    def _read(self) -> None:
        try:
            data = self.sock.recv(1 << 20)
        except TimeoutError:
            return
        except OSError as e:
            self._lost(f"connection lost ({e.strerror or e})")
            return
        now = time.time_ns()
        if not data:
            self._lost("connection lost")
            return
        try:
            frames = self.frames.feed(data)
        except FrameError as e:
            self.num_malformed += 1
            self._lost(f"malformed frame ({e})")
            return
        last_ack = None
        for f in frames:
            if f.command == "MESSAGE":
                h = f.headers
                event_id, run_id = h.get(ID_HEADER), h.get(RUN_HEADER)
                if event_id and run_id:
                    self.num_received += 1
                    if self.spool is not None:
                        self.spool.append(self.lines.recv(run_id, now, event_id, f.size, self._where))
                else:
                    self.num_unattributed += 1
                last_ack = h.get("ack", last_ack)
            elif f.command == "ERROR":
                self._lost(f"the broker said {refusal(f)}")
                return
        if last_ack is not None:
            try:
                self.sock.sendall(frame("ACK", {"id": last_ack}))
            except OSError as e:
                self._lost(f"connection lost ({e.strerror or e})")

    def _lost(self, why: str) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        self.num_connection_losses += 1
        self.warn(f"receiver {self.agent}: {why}; reconnecting every {RECONNECT_S:g} s")
        self._next_try = time.monotonic() + RECONNECT_S

    def close(self) -> None:
        if self.sock is not None:
            try:
                self.sock.sendall(frame("DISCONNECT"))
            except OSError:
                pass
            self.sock.close()
            self.sock = None
