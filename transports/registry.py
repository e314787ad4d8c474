"""Where the load goes: one module per transport, each registered once in ``TRANSPORTS``.

    http://HOST:PORT/PATH                      CloudEvents over HTTP (transports.http.target)
    kafka://HOST:PORT/TOPIC                    the Kafka protocol (transports.kafka.target)
    amqp://USER:PASS@HOST:PORT/VHOST?queue=Q   AMQP 0-9-1, RabbitMQ (transports.amqp091.target)
    amqp1://USER:PASS@HOST:PORT/ADDRESS        AMQP 1.0: Artemis, RabbitMQ's plugin, Dispatch Router (transports.amqp1.target)

The contract every target keeps is ``transports.base.Target``; adding a transport is a module with one class
that keeps it, and one line here (docs/development/adding-a-transport.md).
"""
from __future__ import annotations

from transports.amqp091.target import Amqp091Target
from transports.amqp1.target import Amqp1Target
from transports.base import Target, TargetOptions
from transports.http.target import HttpTarget
from transports.kafka.target import KafkaTarget
from transports.spec import TRANSPORTS, TargetSpec

TRANSPORTS.update({scheme: cls for cls in (HttpTarget, KafkaTarget, Amqp091Target, Amqp1Target) for scheme in cls.SCHEMES})
"""URL scheme -> the target class that serves it (the dict ``TargetSpec.parse`` reads)."""

__all__ = ["TRANSPORTS", "Target", "TargetOptions", "TargetSpec", "make_target", "transport"]


def transport(scheme: str) -> type:
    """The target class for ``scheme`` (``KeyError`` for one no transport serves; ``TargetSpec.parse`` says so first)."""
    return TRANSPORTS[scheme]


def make_target(spec: TargetSpec, opts: TargetOptions) -> Target:
    return transport(spec.scheme)(spec, opts)
