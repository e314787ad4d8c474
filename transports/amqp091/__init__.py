"""AMQP 0-9-1 (RabbitMQ): the target (``target``), the consumer that receives (``receiver``) and its process
(``process``); the addresses both AMQP transports share are ``transports.amqp``."""
from __future__ import annotations

from core.procs import AMQP_RECEIVER_METRICS_PORT
from transports.amqp091 import process, receiver
from transports.amqp091.target import Amqp091Target
from transports.base import Transport

TRANSPORT = Transport("amqp091", Amqp091Target, "consume a RabbitMQ queue (AMQP 0-9-1)", receiver,
                      process.add_flags, process.main, stack_flags=process.stack_flags,
                      metrics_listen=("FLIGHTWATCH_AMQP_RECEIVER_METRICS_LISTEN", AMQP_RECEIVER_METRICS_PORT))
