"""AMQP 1.0 (Artemis, RabbitMQ's plugin, Dispatch Router): the target (``target``), the consumer that receives
(``receiver``) and its process (``process``), on the protocol's own codec (``codec``) and engine (``engine``)."""
from __future__ import annotations

from core.procs import AMQP_RECEIVER_METRICS_PORT
from transports.amqp1 import process, receiver
from transports.amqp1.target import Amqp1Target
from transports.base import Transport

TRANSPORT = Transport("amqp1", Amqp1Target, "consume an AMQP 1.0 address (Artemis, RabbitMQ's plugin)",
                      receiver, process.add_flags, process.main, stack_flags=process.stack_flags,
                      metrics_listen=("FLIGHTWATCH_AMQP_RECEIVER_METRICS_LISTEN", AMQP_RECEIVER_METRICS_PORT))
