"""Where the load goes: one module per transport, each registered once in ``TRANSPORTS``.

    http://HOST:PORT/PATH                      CloudEvents over HTTP (loadgen.targets.http)
    kafka://HOST:PORT/TOPIC                    the Kafka protocol (loadgen.targets.kafka)
    amqp://USER:PASS@HOST:PORT/VHOST?queue=Q   AMQP 0-9-1, RabbitMQ (loadgen.targets.amqp091)
    amqp1://USER:PASS@HOST:PORT/ADDRESS        AMQP 1.0: Artemis, RabbitMQ's plugin, Dispatch Router (loadgen.targets.amqp1)

The contract every target keeps is ``loadgen.targets.base.Target``; adding a transport is a module with one class
that keeps it, and one line here (docs/development/adding-a-transport.md).
"""
from __future__ import annotations

from loadgen.targets.amqp091 import Amqp091Target
from loadgen.targets.amqp1 import Amqp1Target
from loadgen.targets.base import Target, TargetOptions
from loadgen.targets.http import HttpTarget
from loadgen.targets.kafka import KafkaTarget
from loadgen.targets.spec import TRANSPORTS, TargetSpec

TRANSPORTS.update({scheme: cls for cls in (HttpTarget, KafkaTarget, Amqp091Target, Amqp1Target) for scheme in cls.SCHEMES})
"""URL scheme -> the target class that serves it (the dict ``TargetSpec.parse`` reads)."""

__all__ = ["TRANSPORTS", "Target", "TargetOptions", "TargetSpec", "make_target", "transport"]


def transport(scheme: str) -> type:
    """The target class for ``scheme`` (``KeyError`` for one no transport serves; ``TargetSpec.parse`` says so first)."""
    return TRANSPORTS[scheme]


def make_target(spec: TargetSpec, opts: TargetOptions) -> Target:
    return transport(spec.scheme)(spec, opts)
