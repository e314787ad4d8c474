"""The Kafka protocol: the target (``target``), the consumer that receives (``receiver``) and its process
(``process``)."""
from __future__ import annotations

from core.procs import KAFKA_RECEIVER_METRICS_PORT
from transports.base import Transport
from transports.kafka import process, receiver
from transports.kafka.target import KafkaTarget

TRANSPORT = Transport("kafka", KafkaTarget, "consume the SUT topic (Kafka protocol)", receiver,
                      process.add_flags, process.main, stack_flags=process.stack_flags,
                      metrics_listen=("FLIGHTWATCH_KAFKA_RECEIVER_METRICS_LISTEN", KAFKA_RECEIVER_METRICS_PORT),
                      positions=("wal", "wal.tmp"))
