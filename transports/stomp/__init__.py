"""STOMP 1.2 (ActiveMQ Artemis, ActiveMQ Classic, RabbitMQ's STOMP plugin): the target (``target``), the subscription
that receives (``receiver``) and its process (``process``), on the protocol's frames (``codec``)."""
from __future__ import annotations

from transports.base import Transport
from transports.stomp import process, receiver
from transports.stomp.target import StompTarget

TRANSPORT = Transport("stomp", StompTarget, "subscribe to a STOMP destination (Artemis, ActiveMQ, RabbitMQ's plugin)",
                      receiver, process.add_flags, process.main)
