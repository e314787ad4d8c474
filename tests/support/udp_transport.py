"""A transport of a user's own, outside flightwatch's repository: events as UDP datagrams on loopback, installed with
an entry point in ``flightwatch.transports`` (``transports.registry.more``). A stand-in written for the test of that: no
broker speaks it, and UDP has no acknowledgement (a send is done when the datagram leaves; one lost is a drop).

Its descriptor (``TRANSPORT``) names its target (``UdpTarget``: ``udp://HOST:PORT``), its receiver mode (``udp``),
its receiver's source (``UdpReceiver``), flags and process (``add_flags``, ``main``), all in this one module: the whole
of what a transport brings, with nothing of flightwatch's changed.
"""
from __future__ import annotations

import argparse
import socket
import sys
import time

from core import contract, metrics
from core.units import parse_size, split_host_port
from transports.base import Book, Runner, TargetOptions, Transport, flag, no_consumers, one_receiver

DATAGRAM = "{run} {id} "
"""A datagram: the run ID and the event ID, then the payload's filler."""


class UdpTarget:
    SCHEMES = ("udp",)
    RECEIVER = "udp"
    DEFAULT_PORT = 18999
    TLS_PORT = None
    EXAMPLE = "udp://127.0.0.1:18999"
    TAKES_KAFKA_OPTIONS = False
    polled = False

    def __init__(self, spec, opts: TargetOptions) -> None:
        self.spec, self.opts, self.sock, self.book = spec, opts, None, None

    @staticmethod
    def receiver_args(spec) -> list[str]:
        return ["udp", "--listen", f"{spec.host}:{spec.port}"]

    share_args = staticmethod(one_receiver)
    consumers = staticmethod(no_consumers)

    @staticmethod
    def receiver_place(flags: list[str]) -> str | None:
        listen = flag(flags, "--listen", None)
        return f"udp://{listen}" if listen else None

    @staticmethod
    def reachable(spec, timeout_s: float) -> None:
        return None  # no connection to open: a datagram nobody reads is a drop, which the run shows

    @staticmethod
    def check(scheme: str, path: str, userinfo: str | None, query: str) -> str:
        if path not in ("", "/") or query:
            raise ValueError("a udp:// target is HOST:PORT alone")
        return "/"

    async def connect(self) -> None:
        socket.getaddrinfo(self.spec.host, self.spec.port, type=socket.SOCK_DGRAM)

    def start(self, book: Book) -> None:
        self.book = book
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.connect((self.spec.host, self.spec.port))

    def send(self, event_id: str, intended_ns: int) -> None:
        head = DATAGRAM.format(run=self.opts.run_id, id=event_id).encode()
        data = head + b"x" * max(0, self.opts.payload_bytes - len(head))
        sent = time.time_ns()
        self.book.sent(event_id, intended_ns, sent)
        try:
            self.sock.send(data)
        except OSError as e:  # a refused port (the ICMP of an earlier datagram), a full buffer
            self.book.done(event_id, sent, None, type(e).__name__)
            return
        self.book.done(event_id, sent, None, None)

    def poll(self, timeout_s: float) -> int:
        return 0

    async def close(self) -> None:
        if self.sock is not None:
            self.sock.close()

    def shaping(self) -> dict | None:
        return None


class UdpReceiver:
    """The source: per datagram, stamp, take its run and event IDs, record (``agents.source``); nothing to ack."""

    def __init__(self, sock: socket.socket, spool, agent: str) -> None:
        self.sock, self.spool, self.agent = sock, spool, agent
        self.lines = contract.FastLines("", agent)
        self.num_received = self.num_unattributed = 0

    def turn(self) -> None:
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            return
        now = time.time_ns()
        parts = data.split(b" ", 2)
        if len(parts) < 3 or not parts[0] or not parts[1]:
            self.num_unattributed += 1
            return
        self.spool.append(self.lines.recv(parts[0].decode(), now, parts[1].decode(), len(data)))
        self.num_received += 1

    def counters(self) -> dict:
        return {"agent": self.agent, "received": self.num_received, "unattributed": self.num_unattributed,
                "telemetry": self.spool.counters()}

    def collect(self):
        yield metrics.family("counter", "flightwatch_udp_receiver_events", "datagrams recorded", ["agent"],
                             [((self.agent,), self.num_received)])

    def progress(self) -> tuple[tuple, str]:
        return ((self.num_received, self.num_unattributed),
                f"receiver {self.agent}: {self.num_received:,} received, {self.num_unattributed:,} without IDs")


def add_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--listen", default=f"127.0.0.1:{UdpTarget.DEFAULT_PORT}", metavar="HOST:PORT")
    p.add_argument("--state-dir", required=True)
    p.add_argument("--spool-budget", default="64MiB")
    p.add_argument("--metrics-listen", type=metrics.listen_arg, default="none")


def main(a, runner: Runner) -> int:
    try:
        host, port = split_host_port(a.listen, "--listen")
        budget = parse_size(a.spool_budget)
    except ValueError as e:
        print(f"receiver: error: {e}", file=sys.stderr)
        return 2
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    sock.bind((host, port))
    sock.settimeout(0.1)
    process = runner.Process.in_state_dir(a, budget)
    source = UdpReceiver(sock, process.spool, a.agent)
    try:
        process.start(source, a.metrics_listen)
        process.log(f"receiver {a.agent}: udp://{host}:{port} -> spool {process.spool.dir}", flush=True)
        process.run_blocking(source.turn)
    finally:
        sock.close()
        process.close()
    return 0


TRANSPORT = Transport("udp", UdpTarget, "UDP datagrams on loopback (a test's transport)", sys.modules[__name__],
                      add_flags, main)
