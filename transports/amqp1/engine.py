"""One AMQP 1.0 link over its own socket, with proton's engine driven by hand: no reactor, no handler objects. With
``pairs=N``, N links on the one connection, to ``ADDRESS.0`` ... ``ADDRESS.<N-1>``: ``send(..., pair=i)`` picks one,
and the link is open once the broker attached all of them.

    link = EngineLink(host, port, userinfo, address, sending=True, settled=False, tls=None)  # tls: a core.tls.Tls
    link.on_outcome = lambda delivery, error: ...   # sender: the broker's outcome (None: accepted; else its cause)
    link.on_message = lambda message_bytes, pair: ...  # receiver: one whole message and its link's pair (0 ... N-1);
                                                     # it is accepted after the call
    link.on_lost = lambda why: ...                  # the link, session or connection went away (a short cause)
    link.open()                                     # OSError if the socket cannot be opened
    link.attach(within_s)                           # ConnectionError with the broker's reason, or none in time
    link.pump(timeout_s)                            # socket I/O and proton's events, for up to timeout_s
    link.send(tag, message_bytes)                   # -> the delivery (the key its outcome comes back with)

Why by hand: with proton's reactor (``proton.reactor.Container`` and a ``MessagingHandler``) an event cost 390 µs of
CPU in the load generator and 310 µs in the receiver at 2,000/s against Artemis, 50-57% of it proton's Python
dispatch (py-spy). Here the per-event path is a few calls into proton's C engine through its own cffi module
(``cproton_ffi``); the setup (SASL, the link's terminus) goes through proton's Python classes as before. One link
per socket: the load generator and the receiver each need one.
"""
from __future__ import annotations

import select
import socket
import time

from core import tls
from transports import amqp

READ_BYTES = 256 * 1024
TICK_S = 0.25


def pair_addresses(address: str, pairs: int) -> list[str]:
    """The addresses of ``pairs`` sender-receiver pairs, each its own: ``address`` alone for one, else
    ``address.0`` ... ``address.<pairs-1>`` (the Dispatch Router tests' one address per pair)."""
    return [address] if pairs == 1 else [f"{address}.{i}" for i in range(pairs)]


class EngineLink:
    def __init__(self, host: str, port: int, userinfo: str | None, address: str, sending: bool,
                 settled: bool = False, prefetch: int = 1000, name: str = "flightwatch", pairs: int = 1,
                 durable: bool = False, tls=None) -> None:
        from cproton_ffi import ffi, lib
        from proton import Collector, Connection, Transport

        self.ffi, self.lib = ffi, lib
        self.host, self.port, self.address, self.sending, self.prefetch = host, port, address, sending, prefetch
        self.tls = tls
        self.opened = False
        self.attached_ns: int | None = None  # when the broker had attached every link (epoch ns)
        self.closed: str | None = None  # why, once the link, session or connection went away
        self.detail = ""  # the broker's own words on why it closed it, if it gave any
        self.on_outcome = self.on_message = None
        self.on_lost = lambda why: None
        self.sock: socket.socket | None = None
        self.conn = Connection()
        self.conn.container = f"{name}-{id(self):x}"
        self.conn.hostname = host
        self.transport = Transport()
        user, _, password = (userinfo or ":").partition(":")
        if user:  # no user: no SASL layer at all (Artemis and RabbitMQ's plugin take an anonymous open)
            sasl = self.transport.sasl()
            sasl.allow_insecure_mechs = True
            self.conn.user, self.conn.password = user, password
        self.transport.bind(self.conn)
        if self.tls is not None:  # amqp1s: TLS under SASL, the certificate and the host's name checked (core.tls)
            from proton import SSL

            self.ssl = SSL(self.transport, tls.domain())
            self.ssl.peer_hostname = host
        self.collector = Collector()
        self.conn.collect(self.collector)
        self.conn.open()
        self.session = self.conn.session()
        self.session.open()
        self.links = [self._link(a, n, sending, settled, prefetch, durable)
                      for a, n in zip(pair_addresses(address, pairs), pair_addresses(name, pairs))]
        self.link = self.links[0]
        self._t, self._c, self._l = self.transport._impl, self.collector._impl, self.link._impl
        self._ls = [link._impl for link in self.links]
        self._pair_of = {link: i for i, link in enumerate(self._ls)}  # cffi pointers hash by their address
        self._open_links = 0
        self._out = bytearray(READ_BYTES)
        self._out_c = ffi.from_buffer(self._out)
        self._in = bytearray(READ_BYTES)
        self._in_view = memoryview(self._in)
        self._next_tick = 0.0
        self._terminal = (lib.PN_REJECTED, lib.PN_RELEASED, lib.PN_MODIFIED)

    def _link(self, address: str, name: str, sending: bool, settled: bool, prefetch: int, durable: bool):
        from proton import Link, Terminus

        if sending:
            link = self.session.sender(name)
            link.target.address = address
            link.source.address = name
            if settled:
                link.snd_settle_mode = Link.SND_SETTLED
        else:
            link = self.session.receiver(name)
            link.source.address = address
            link.target.address = name
        if durable:  # the broker's end of the link outlives a restart: RabbitMQ's plugin declares a durable queue for it
            (link.target if sending else link.source).durability = Terminus.CONFIGURATION
        link.open()
        if not sending:
            link.flow(prefetch)
        return link

    # --- the socket -----------------------------------------------------------------------------------------------

    def open(self, timeout_s: float = 5.0) -> None:
        """Connect the socket (``OSError`` if it cannot be); the AMQP open and attach follow in ``pump``."""
        self.sock = socket.create_connection((self.host, self.port), timeout=timeout_s)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.setblocking(False)

    def attach(self, within_s: float) -> None:
        """Serve the connection until the broker attached the link; ``ConnectionError`` with its reason if it did not
        within ``within_s``, or refused it (a broker that refuses an address attaches the link, then detaches it at
        once: so 0.1 s more is served after the attach)."""
        hint = f"is {self.host}:{self.port} an AMQP 1.0 broker?"
        deadline = time.monotonic() + within_s
        while not self.opened and self.closed is None:
            if time.monotonic() > deadline:
                raise ConnectionError(f"no AMQP 1.0 link within {within_s:g} s: {hint}")
            self.pump(0.05)
        if self.closed is None:
            self.pump(0.1)
        if self.closed is not None:
            if self.closed == "connection lost" and not self.opened:  # ended with no reason: likely no AMQP 1.0 broker
                raise ConnectionError(f"{self.closed}: {hint}")
            said = getattr(self.transport.condition, "description", None) or ""
            if self.tls is not None and "SSL" in said:
                raise ConnectionError(tls.diagnose(self.host, self.port, self.tls) or said)
            if self.tls is None and tls.speaks_tls(said):
                raise ConnectionError("the port speaks TLS: use amqp1s:// (with ?cafile=PATH, the CA that signed its "
                                      "certificate)")
            raise ConnectionError(f"{self.closed} ({self.detail})" if self.detail else self.closed)

    def _write(self) -> None:
        lib, t = self.lib, self._t
        while (pending := lib.pn_transport_pending(t)) > 0:
            n = lib.pn_transport_peek(t, self._out_c, min(pending, READ_BYTES))
            if n < 0:
                break
            try:
                sent = self.sock.send(memoryview(self._out)[:n])
            except BlockingIOError:
                return
            except OSError:  # reset, refused, ...: one stable cause, as for an end of input
                self._broken("connection lost")
                return
            lib.pn_transport_pop(t, sent)
            if sent < n:
                return
        if pending < 0 and self.sock is not None:  # proton closed its output: the connection is over
            self._broken(None)

    def _read(self) -> None:
        lib, t = self.lib, self._t
        for _ in range(8):
            capacity = lib.pn_transport_capacity(t)
            if capacity <= 0:
                if capacity < 0:
                    self._broken(None)
                return
            try:
                n = self.sock.recv_into(self._in_view[:min(capacity, READ_BYTES)])
            except BlockingIOError:
                return
            except OSError:  # reset, refused, ...: one stable cause, as for an end of input
                self._broken("connection lost")
                return
            if n == 0:
                self._broken("connection lost")
                return
            lib.pn_transport_push(t, self.ffi.from_buffer(self._in_view[:n]), n)
            self._events()
            if n < capacity and n < READ_BYTES:
                return

    def _broken(self, why: str | None) -> None:
        """The socket is done. The cause: what proton already knew (a refused login: ``unauthorized access``), else
        the socket's end (proton, told of it next, would call that a framing error)."""
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        known = self.transport.condition
        # the first cause stays: a remote close before this one wins
        self._lost(amqp.condition_text("connection lost", known) if known is not None else why or "connection lost")
        self.lib.pn_transport_close_tail(self._t)
        self.lib.pn_transport_close_head(self._t)
        self._events()

    def pump(self, timeout_s: float) -> None:
        """Write what proton has, wait up to ``timeout_s`` for the socket, read, serve proton's events, write."""
        if self.sock is None:
            if timeout_s > 0:
                time.sleep(timeout_s)
            return
        now = time.monotonic()
        if now >= self._next_tick:
            self._next_tick = now + TICK_S
            self.lib.pn_transport_tick(self._t, int(now * 1000))
        self._events()
        self._write()
        if self.sock is None:
            return
        wants_write = self.lib.pn_transport_pending(self._t) > 0
        try:
            r, w, _ = select.select((self.sock,), (self.sock,) if wants_write else (), (), max(timeout_s, 0.0))
        except (OSError, ValueError):
            self._broken(None)
            return
        if r:
            self._read()
        if self.sock is not None:
            self._events()
            self._write()

    # --- proton's events ------------------------------------------------------------------------------------------

    def _events(self) -> None:
        lib, c, null = self.lib, self._c, self.ffi.NULL
        sending = self.sending
        while (ev := lib.pn_collector_peek(c)) != null:
            kind = lib.pn_event_type(ev)
            if kind == lib.PN_DELIVERY:
                d = lib.pn_event_delivery(ev)
                if sending:
                    if lib.pn_delivery_updated(d):
                        state = lib.pn_delivery_remote_state(d)
                        if state == lib.PN_ACCEPTED:
                            self.on_outcome(d, None)
                            lib.pn_delivery_settle(d)
                        elif state in self._terminal or lib.pn_delivery_settled(d):
                            self.on_outcome(d, self._outcome_text(d, state))
                            lib.pn_delivery_settle(d)
                elif lib.pn_delivery_readable(d) and not lib.pn_delivery_partial(d):
                    self._receive(d)
            elif kind == lib.PN_LINK_REMOTE_OPEN:
                self._open_links += 1
                if self._open_links >= len(self._ls):  # every link attached: the link (the pairs) is open
                    self.opened = True
                    self.attached_ns = time.time_ns()
            elif kind in (lib.PN_LINK_REMOTE_CLOSE, lib.PN_LINK_REMOTE_DETACH):
                from proton import Link

                self._closed_by("link closed", Link.wrap(lib.pn_event_link(ev)).remote_condition)
            elif kind == lib.PN_SESSION_REMOTE_CLOSE:  # RabbitMQ's plugin ends the session for an address it refuses
                self._closed_by("session closed", self.session.remote_condition)
            elif kind == lib.PN_CONNECTION_REMOTE_CLOSE:
                self._closed_by("connection closed", self.conn.remote_condition)
            elif kind == lib.PN_TRANSPORT_ERROR:
                self._lost(amqp.condition_text("connection lost", self.transport.condition))
            lib.pn_collector_pop(c)

    def _outcome_text(self, d, state: int) -> str:
        """A refusal's cause: ``rejected: <the broker's condition>``, ``released``, ``modified``."""
        from proton import Delivery

        if state == self.lib.PN_REJECTED:
            return amqp.condition_text("rejected", Delivery.wrap(d).remote.condition)
        return {self.lib.PN_RELEASED: "released", self.lib.PN_MODIFIED: "modified"}.get(state,
                                                                                       "settled without outcome")

    def _receive(self, d) -> None:
        lib = self.lib
        link = self._l if len(self._ls) == 1 else lib.pn_delivery_link(d)
        size = lib.pn_delivery_pending(d)
        buf = bytearray(size)
        lib.pn_link_recv(link, self.ffi.from_buffer(buf), size)
        lib.pn_link_advance(link)
        self.on_message(buf, 0 if len(self._ls) == 1 else self._pair_of.get(link, 0))
        if not lib.pn_delivery_settled(d):  # a pre-settled transfer has no outcome to give
            lib.pn_delivery_update(d, lib.PN_ACCEPTED)
        lib.pn_delivery_settle(d)
        credit = lib.pn_link_credit(link)
        if credit < self.prefetch // 2:
            lib.pn_link_flow(link, self.prefetch - credit)

    def _closed_by(self, what: str, cond) -> None:
        """The broker closed the link, session or connection: the short cause, and its description for ``attach``'s
        error (RabbitMQ: ``inequivalent arg 'durable' for queue ...``)."""
        if self.closed is None and cond is not None and cond.description:
            self.detail = str(cond.description)
        self._lost(amqp.condition_text(what, cond))

    def _lost(self, why: str) -> None:
        if self.closed is None:
            self.closed = why
            self.on_lost(why)

    # --- sends ----------------------------------------------------------------------------------------------------

    def send(self, tag: bytes, message: bytes, settle: bool = False, pair: int = 0):
        """One transfer of ``message`` (already encoded) on link ``pair``; its delivery, the key of its outcome."""
        lib, ffi = self.lib, self.ffi
        link = self._ls[pair]
        d = lib.pn_delivery(link, (len(tag), ffi.from_buffer(tag)))
        lib.pn_link_send(link, ffi.from_buffer(message), len(message))
        lib.pn_link_advance(link)
        if settle:
            lib.pn_delivery_settle(d)
        return d

    def flushed(self) -> bool:
        """Every transfer has left: none waits for credit in proton, no byte waits for the socket."""
        return (all(self.lib.pn_link_queued(link) == 0 for link in self._ls)
                and self.lib.pn_transport_pending(self._t) <= 0)

    @property
    def max_message_size(self) -> int:
        """What the broker gave the link on attach (0: no limit)."""
        return self.link.remote_max_message_size

    def close(self, linger_s: float = 0.05) -> None:
        """Close the connection, give the broker ``linger_s`` to see it, and the socket."""
        if self.sock is not None:
            self.conn.close()
            end = time.monotonic() + linger_s
            while self.sock is not None and time.monotonic() < end:
                self.pump(0.01)
            if self.sock is not None:
                self.sock.close()
                self.sock = None
