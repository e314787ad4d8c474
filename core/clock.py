"""Clock offset between hosts, NTP-style, against one reference clock.

Agents on different hosts stamp send and receive times with different clocks; a flight
time measured across hosts is off by the clocks' offset. The node-metrics agent serves a
**clock reference** on UDP (default 127.0.0.1:19123); every other agent runs a few NTP-style
exchanges against it and writes a ``clock`` record with its offset and the round trip:

    t0 client sends ─▶ t1 reference receives, t2 reference answers ─▶ t3 client receives
    offset = ((t1 − t0) + (t2 − t3)) / 2      (reference clock − this clock)
    rtt    = (t3 − t0) − (t2 − t1)

Of ``samples`` exchanges the one with the smallest round trip is kept (NTP's clock filter);
the offset is then known to within ± rtt / 2. The reference and the probe as a command: ``agents.clock``.
"""
from __future__ import annotations

import os
import socket
import struct
import threading
import time

from core import contract
from core.units import split_host_port

DEFAULT_REFERENCE = "127.0.0.1:19123"
REPORT_EVERY_S = 5.0
"""How often every agent measures its offset again and writes a clock record: the job corrects its stamps by the
estimate in force (``streaming.clocks``), and one made before a run starts is there for the run's first event."""
_REQUEST = struct.Struct("!qQ")      # t0, nonce
_REPLY = struct.Struct("!qQqq")      # t0, nonce, t1, t2


def split_address(text: str) -> tuple[str, int]:
    return split_host_port(text, "clock address", DEFAULT_REFERENCE)


class ClockReference:
    """Answers clock requests on a UDP socket from a background thread. ``skew_ns`` shifts its clock (tests)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 19123, skew_ns: int = 0) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((host, port))
        self.sock.settimeout(0.5)
        self.address = "%s:%d" % self.sock.getsockname()
        self.skew_ns = skew_ns
        self.num_answered = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="clock-reference", daemon=True)

    def start(self) -> ClockReference:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data, peer = self.sock.recvfrom(64)
            except TimeoutError:
                continue
            except OSError:
                return
            t1 = time.time_ns() + self.skew_ns
            if len(data) != _REQUEST.size:
                continue
            t0, nonce = _REQUEST.unpack(data)
            try:
                self.sock.sendto(_REPLY.pack(t0, nonce, t1, time.time_ns() + self.skew_ns), peer)
                self.num_answered += 1
            except OSError:
                pass

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.sock.close()


def estimate(reference: str, samples: int = 8, timeout_s: float = 0.5) -> tuple[int, int] | None:
    """(offset_ns, rtt_ns) of the best of ``samples`` exchanges, or None if the reference never answered."""
    host, port = split_address(reference)
    best = None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(timeout_s)
        for _ in range(samples):
            nonce = int.from_bytes(os.urandom(8), "big")
            t0 = time.time_ns()
            try:
                s.sendto(_REQUEST.pack(t0, nonce), (host, port))
                while True:
                    data = s.recv(64)
                    t3 = time.time_ns()
                    if len(data) == _REPLY.size:
                        r0, rnonce, t1, t2 = _REPLY.unpack(data)
                        if rnonce == nonce and r0 == t0:
                            break
            except OSError:  # timeout, refused (ICMP port unreachable on loopback)
                continue
            rtt = (t3 - t0) - (t2 - t1)
            offset = ((t1 - t0) + (t2 - t3)) // 2
            if best is None or rtt < best[1]:
                best = (offset, rtt)
    return best


def estimate_record(reference: str, agent: str, samples: int = 8, timeout_s: float = 0.2) -> contract.ClockOffset | None:
    """This host's offset against the reference as a telemetry record (for every run), or None."""
    try:
        est = estimate(reference, samples, timeout_s)
    except (ValueError, OSError):
        return None
    if est is None:
        return None
    offset_ns, rtt_ns = est
    return contract.ClockOffset(contract.ANY_RUN, agent, time.time_ns(), reference=reference,
                                offset_us=offset_ns / 1e3, rtt_us=rtt_ns / 1e3)


def report(write, agent: str, reference: str, log) -> None:
    """Estimate this host's clock offset against the reference; ``write`` the clock record (or log why not)."""
    if reference == "none":
        return
    rec = estimate_record(reference, agent)
    if rec is None:
        log(f"{agent}: clock reference {reference} not answering; clock offset not reported", flush=True)
    else:
        write(rec)
