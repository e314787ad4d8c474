"""The transports, each registered once here by its package's descriptor (``transports.base.Transport``): the load
generator's URL schemes and the receiver agent's modes are built from them.

    http://HOST:PORT/PATH                      CloudEvents over HTTP (transports.http)
    kafka://HOST:PORT/TOPIC                    the Kafka protocol (transports.kafka)
    amqp://USER:PASS@HOST:PORT/VHOST?queue=Q   AMQP 0-9-1, RabbitMQ (transports.amqp091)
    amqp1://USER:PASS@HOST:PORT/ADDRESS        AMQP 1.0: Artemis, RabbitMQ's plugin, Dispatch Router (transports.amqp1)
    stomp://USER:PASS@HOST:PORT/DESTINATION    STOMP 1.2: Artemis, ActiveMQ, RabbitMQ's plugin (transports.stomp)

The contract every target keeps is ``transports.base.Target``; adding a transport is a package with its descriptor
and one line here (docs/development/adding-a-transport.md), or, for one of your own outside this repository, an
entry point of your package in ``ENTRY_POINTS``.
"""
from __future__ import annotations

from transports import amqp091, amqp1, http, kafka, stomp
from transports.base import Target, TargetOptions, Transport
from transports.spec import TRANSPORTS, TargetSpec

OURS: tuple[Transport, ...] = (http.TRANSPORT, kafka.TRANSPORT, amqp091.TRANSPORT, amqp1.TRANSPORT, stomp.TRANSPORT)
"""flightwatch's transports, one line each."""


ENTRY_POINTS = "flightwatch.transports"
"""The entry-point group of the transports of your own: a package of yours declares one per transport, its value
the module's descriptor (``[project.entry-points."flightwatch.transports"] stomp = "my_stomp:TRANSPORT"``)."""


def more(ours: tuple[Transport, ...]) -> tuple[tuple[Transport, ...], str | None]:
    """The transports of your own, installed with an entry point in ``ENTRY_POINTS``, and what is wrong with them,
    in one line (None: nothing)."""
    from importlib.metadata import entry_points

    out: list[Transport] = []
    for ep in sorted(entry_points(group=ENTRY_POINTS), key=lambda e: e.name):
        where = f"the transport {ep.name} ({ep.value}, entry point {ENTRY_POINTS})"
        try:
            t = ep.load()
        except Exception as e:  # a package of the user's: whatever it raises is said in one line, not a traceback
            return tuple(out), f"{where}: {type(e).__name__}: {e}"
        if not isinstance(t, Transport):
            return tuple(out), f"{where}: not a transports.base.Transport"
        if set(t.target.SCHEMES) & {s for o in (*ours, *out) for s in o.target.SCHEMES} or \
                t.receiver in {o.receiver for o in (*ours, *out)}:
            return tuple(out), (f"{where}: its schemes ({', '.join(t.target.SCHEMES)}) or its receiver mode "
                                f"({t.receiver}) are another transport's")
        out.append(t)
    return tuple(out), None


MORE, PROBLEM = more(OURS)
"""Transports of your own (``more``), and what is wrong with them: the load generator and the receiver agent say it
and exit 2."""

ALL: tuple[Transport, ...] = OURS + MORE
"""Every transport."""

TRANSPORTS.update({scheme: t.target for t in ALL for scheme in t.target.SCHEMES})
"""URL scheme -> the target class that serves it (the dict ``TargetSpec.parse`` reads)."""

RECEIVERS: dict[str, Transport] = {t.receiver: t for t in ALL}
"""Receiver mode (``python -m agents.receiver MODE``) -> its transport."""

SINKS: tuple[Transport, ...] = tuple(t for t in ALL if t.sink)
"""The transports whose receiver is itself a target (``Transport.sink``): HTTP's CloudEvents sink. The first is the one
the benchmarks attack on the stack (``stack_target``)."""

__all__ = ["ALL", "PROBLEM", "RECEIVERS", "SINKS", "TRANSPORTS", "Target", "TargetOptions", "TargetSpec", "Transport", "make_target", "transport"]


def transport(scheme: str) -> type:
    """The target class for ``scheme`` (``KeyError`` for one no transport serves; ``TargetSpec.parse`` says so first)."""
    return TRANSPORTS[scheme]


def make_target(spec: TargetSpec, opts: TargetOptions) -> Target:
    return transport(spec.scheme)(spec, opts)
