"""The contract between the attack loop (``loadgen.attack``) and a transport's target, as OpenMessaging Benchmark's
``BenchmarkProducer`` states its own: a few methods, each with one promise.

    target = make_target(spec, TargetOptions(...))
    await target.connect()        # ConnectionError (one line) if the SUT cannot be reached or refuses us
    target.start(book)
    target.send(event_id, intended_ns)   # -> book.sent(..., stamp) right before the bytes leave,
                                         #    book.done(...) once the SUT acked, confirmed, settled or refused it
    target.poll(timeout_s)        # polled targets only: serve acks for up to timeout_s (their I/O has its own thread)
    await target.close()          # flush what is in flight (bounded), then close
"""
from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar, Protocol


class Book(Protocol):
    """A worker's accounts (``loadgen.attack.Book``), as a target sees them."""

    def sent(self, eid: str, intended: int, at: int, route: int | None = None) -> None:
        """The send stamp ``at`` (epoch ns), taken right before the event's bytes are handed to the wire; ``route``:
        where it went among the places the target picks from (a pair, a binding, a Kafka partition), None for one."""

    def done(self, eid: str, sent: int, status: int | None, error: str | None) -> None:
        """The SUT's answer: ``status`` an HTTP code (None elsewhere), ``error`` a short stable cause or None when
        the SUT took the event (a 2xx, a Kafka ack, a publisher confirm, an AMQP 1.0 ``accepted``)."""


@dataclass(frozen=True)
class TargetOptions:
    """What every target is given, from the attack's flags."""
    timeout_s: float = 30.0
    max_inflight: int = 1000
    run_id: str = ""
    payload_bytes: int = 2048
    kafka_options: dict | None = field(default=None)
    """The Kafka target's producer settings (``--kafka-option`` over FLIGHTWATCH_SUT_KAFKA_OPTIONS); None elsewhere."""


def flag(argv: list[str], name: str, default: str | None) -> str | None:
    """The value of ``name`` in a command line (``default`` if it is not there)."""
    return argv[argv.index(name) + 1] if name in argv[:-1] else default


def no_receiver_args(spec) -> None:
    """A target's ``receiver_args`` when the load generator cannot start its receiver."""
    return None


def one_receiver(spec, i: int, count: int) -> list[str]:
    """A target's ``share_args`` when one receiver must take all (``ValueError`` for more)."""
    if count > 1:
        raise ValueError(f"{spec.scheme}:// takes one receiver: each one more would record every event again")
    return []


def no_consumers(spec) -> None:
    """A target's ``consumers`` when its transport cannot tell who else consumes its place."""
    return None


def tcp_reachable(spec, timeout_s: float) -> str | None:
    """A target's ``reachable`` over TCP: None if a connection to its host and port opens, else why not."""
    from core.procs import tcp_unreachable

    return tcp_unreachable(spec.host, spec.port, timeout_s)


def url_receiver_place(flags: list[str]) -> str | None:
    """A target's ``receiver_place`` when its receiver is given the target's URL: its ``--url`` (None without one)."""
    return flag(flags, "--url", None)


class Target(Protocol):
    """One transport's load target. Class attributes say how the attack loop drives it and how it is addressed."""

    SCHEMES: ClassVar[tuple[str, ...]]
    RECEIVER: ClassVar[str]
    """The receiver agent's mode for this transport (``python -m agents.receiver MODE``)."""
    DEFAULT_PORT: ClassVar[int]
    TLS_PORT: ClassVar[int | None]
    """The port of the scheme's TLS form (``SECURE``), None for a transport without one here."""
    SECURE: ClassVar[dict[str, str]] = {}
    """Each plain scheme of its ``SCHEMES`` with its TLS form (``core.tls``: ``https``, ``amqps``); none for a
    transport whose TLS is its client's settings (Kafka) or that has none here."""
    EXAMPLE: ClassVar[str]
    """One address, as ``--help`` and a bad target's error show it."""
    TAKES_KAFKA_OPTIONS: ClassVar[bool]
    polled: ClassVar[bool]
    """True: the driver calls ``poll`` between turns (the client has I/O threads of its own); False: the target
    lives on the worker's asyncio loop."""

    @staticmethod
    def receiver_args(spec) -> list[str] | None:
        """``python -m agents.receiver``'s arguments for a receiver that consumes where this target's load goes, for
        the load generator to start for a run (``loadgen.follow``); None if it cannot."""

    @staticmethod
    def share_args(spec, i: int, count: int) -> list[str]:
        """More of the receiver's arguments when it is ``i`` of ``count`` started for a run (``--receivers``), so that
        the ``count`` share the place, each event recorded once; ``ValueError`` if they cannot."""

    @staticmethod
    def consumers(spec) -> int | None:
        """How many consumers the target's place has now, when its transport can tell (AMQP 0-9-1: a queue's
        consumer count); None when it cannot. Each one not flightwatch's takes events that will count as dropped."""

    @staticmethod
    def receiver_place(flags: list[str]) -> str | None:
        """Where a receiver agent of ``RECEIVER`` mode started with ``flags`` consumes, as a target URL; None if
        that is no place a target names."""

    @staticmethod
    def check(scheme: str, path: str, userinfo: str | None, query: str) -> str:
        """The address' path as the target keeps it, or ``ValueError`` saying what is wrong."""

    @staticmethod
    def reachable(spec, timeout_s: float) -> str | None:
        """None if the target's place answers, else why not: the load generator waits for it (``--wait``) before
        the attack. ``tcp_reachable`` for a transport over TCP."""

    async def connect(self) -> None: ...

    def start(self, book: Book) -> None: ...

    def send(self, event_id: str, intended_ns: int) -> None: ...

    def poll(self, timeout_s: float) -> int: ...

    async def close(self) -> None: ...

    def shaping(self) -> dict | None:
        """The client settings that shaped latency, as they took effect, for the report (None: nothing to say)."""


class Runner(Protocol):
    """What a transport's receiver process is given to run in (``agents.runner``, the one receiver process): it
    brings its source; the runner, the spool, shipper, /metrics, duties and shutdown."""

    Process: type
    """``agents.runner.Process``: ``Process.in_state_dir(a, budget_bytes)`` for a receiver with a ``--state-dir``
    (or ``Process(a, agent, spool_dir, budget_bytes, shipper_log, log, warn)``), then ``start``, ``run_blocking`` or
    ``run_async``, ``close``."""


@dataclass(frozen=True)
class Transport:
    """A transport, as its package describes it (``transports/<name>/__init__.py``, ``TRANSPORT``): what
    ``transports.registry`` builds the load generator's schemes and the receiver agent's modes from, so that no
    component names it."""

    name: str
    """Its package's name."""
    target: type
    """Its target class (``Target``): the load side, one per URL scheme in its ``SCHEMES``."""
    receiver_help: str
    """The mode's line in ``python -m agents.receiver --help``."""
    receiver_module: object
    """The module of its receiver's source, whose docstring is the mode's ``--help``."""
    add_receiver_flags: Callable[[argparse.ArgumentParser], None]
    """The mode's own flags (the telemetry's and the clock reference's are every mode's)."""
    receive: Callable[[argparse.Namespace, Runner], int]
    """Its receiver process' main, given its flags and the runner: 0 when stopped, 2 on bad settings or a broker
    that refuses it at the start."""
    stack_flags: Callable[[object], list[str]] | None = None
    """Its receiver's own flags when the stack runs it (the component ``MODE-receiver``), given the stack
    (``stack.config.Stack``: its folder, ports, metrics ports and SUT); the stack adds the telemetry's and the clock
    reference's. None: the stack runs none."""
    metrics_listen: tuple[str, int] | None = None
    """Its receiver's ``--metrics-listen`` setting and default port, when the stack's receiver of it serves /metrics on
    a port of its own (None: on its listening port, or not at all)."""
    positions: tuple[str, ...] = ()
    """Files in its receiver's state folder that hold positions in its broker, which a fresh in-memory broker voids
    (the stack removes them when it starts the broker anew; the spool stays: what it holds is still to be shipped)."""
    sink: bool = False
    """Its receiver is itself a target: the load generator sends to it with no broker between (a CloudEvents sink),
    so a scenario may attack the stack's receiver of it (``target = NAME`` in a scenario's file) instead of a SUT."""
    stack_port: tuple[str, int] | None = None
    """The port the stack's receiver of it listens on, when it listens (a sink): its setting and default. The stack
    gives the component ``MODE-receiver`` that port; a scenario attacks it there (``stack_target``)."""

    def stack_target(self) -> str:
        """The stack's receiver of this sink as a target: its scheme's URL on its ``stack_port``."""
        if not (self.sink and self.stack_port):
            raise ValueError(f"the stack's {self.receiver} receiver is no target (transport {self.name} is no sink)")
        from core import settings
        from core.procs import HOST

        env, default = self.stack_port
        return f"{self.target.SCHEMES[0]}://{HOST}:{int(settings.get(env) or default)}/"

    @property
    def receiver(self) -> str:
        """Its receiver agent's mode (``python -m agents.receiver MODE``; the stack's ``MODE-receiver``): its
        target's ``RECEIVER``."""
        return self.target.RECEIVER
