"""The systems under test the stack can run, in one table: which broker, which receiver agent consumes from it, and
where the load generator aims by default. ``FLIGHTWATCH_SUT`` (``--sut``; ``make up SUT=rabbitmq``) picks one.

    python -m stack up --sut rabbitmq       # RabbitMQ and the AMQP receiver beside the telemetry plane
    python -m loadgen attack --sut rabbitmq # aims at its default queue
"""
from __future__ import annotations

import os
from collections.abc import Callable
from typing import NamedTuple

from core import settings
from core.procs import HOST, sut_bootstrap

DEFAULT_SUT = "tansu"
SUT_QUEUE = "flightwatch.sut"
"""The topic or queue every SUT's default target and receiver share."""


class Sut(NamedTuple):
    broker: str        # the stack's component that runs it
    receiver: str      # the stack's component that consumes from it
    what: str
    address: Callable[[], str]
    """Where the stack serves it (HOST:PORT), from the settings."""
    target: str
    """Its default target, with ``{address}`` and ``{queue}`` (``SUT_QUEUE``) to fill in."""
    port: tuple[str, int] = ("FLIGHTWATCH_SUT_PORT", 29092)
    """Its broker's port on the stack: the setting and its default (``stack.config.PORT_SETTINGS`` takes it)."""
    peer: bool = False
    """Its broker's own load tool runs against it, over its transport (``stack.brokers.Broker.peer``): a scenario's
    ``--peer`` and ``bench.transports`` set that tool's figures beside flightwatch's."""

    @property
    def scheme(self) -> str:
        """The transport it is attacked over: its default target's URL scheme."""
        return self.target.partition("://")[0]


_RABBITMQ_PORT = ("FLIGHTWATCH_RABBITMQ_PORT", 29672)
_ARTEMIS_PORT = ("FLIGHTWATCH_ARTEMIS_PORT", 29616)
_KAFKA_PORT = ("FLIGHTWATCH_KAFKA_PORT", 29192)

SUTS: dict[str, Sut] = {
    "tansu": Sut("sut-broker", "kafka-receiver", "the embedded Tansu broker (Kafka protocol, in memory)",
                 sut_bootstrap, "kafka://{address}/{queue}"),
    "rabbitmq": Sut("rabbitmq", "amqp-receiver", "Debian's RabbitMQ 3.10 (AMQP 0-9-1)",
                    lambda: f"{HOST}:{rabbitmq_port()}", "amqp://guest:guest@{address}/%2F?queue={queue}",
                    port=_RABBITMQ_PORT, peer=True),
    "rabbitmq-amqp1": Sut("rabbitmq", "amqp1-receiver", "the same RabbitMQ over AMQP 1.0 (its amqp1_0 plugin)",
                          lambda: f"{HOST}:{rabbitmq_port()}", "amqp1://guest:guest@{address}//queue/{queue}",
                          port=_RABBITMQ_PORT),
    "artemis": Sut("artemis", "amqp1-receiver", "Apache ActiveMQ Artemis 2.40 from the Maven registry (AMQP 1.0)",
                   lambda: f"{HOST}:{artemis_port()}", "amqp1://artemis:artemis@{address}/{queue}",
                   port=_ARTEMIS_PORT, peer=True),
    "kafka": Sut("kafka", "kafka-receiver", "Apache Kafka 4.4 from the Maven registry, one KRaft node",
                 lambda: f"{HOST}:{kafka_port()}", "kafka://{address}/{queue}", port=_KAFKA_PORT, peer=True),
}


def sut_partitions() -> int:
    """The SUT topic's partitions (FLIGHTWATCH_SUT_PARTITIONS, default 2)."""
    return int(settings.get("FLIGHTWATCH_SUT_PARTITIONS") or 2)


SUT_FILE = "sut"
"""In the stack's folder: the SUT `python -m stack up --sut` started, until `down`; the next commands aim at it."""


def recorded_sut(stack_dir: str) -> str | None:
    """The SUT the stack in ``stack_dir`` was brought up with (``make up SUT=kafka``), until `make down`; None if
    none was recorded."""
    try:
        with open(os.path.join(stack_dir, SUT_FILE)) as f:
            text = f.read().strip()
    except OSError:
        return None
    return text if text in SUTS else None


def record_sut(stack_dir: str, sut: str | None) -> None:
    """Record the SUT the stack runs (None: forget it, at `down`)."""
    path = os.path.join(stack_dir, SUT_FILE)
    if sut is None:
        if os.path.exists(path):
            os.remove(path)
        return
    with open(path, "w") as f:
        f.write(sut + "\n")


def stack_sut(stack_dir: str) -> str:
    """The SUT a command aims at by default: ``FLIGHTWATCH_SUT`` if set, else the stack's recorded one, else
    ``DEFAULT_SUT``."""
    return settings.get("FLIGHTWATCH_SUT") or recorded_sut(stack_dir) or DEFAULT_SUT


def _port(setting: tuple[str, int]) -> int:
    return int(settings.get(setting[0]) or setting[1])


def rabbitmq_port() -> int:
    return _port(_RABBITMQ_PORT)


def artemis_port() -> int:
    return _port(_ARTEMIS_PORT)


def kafka_port() -> int:
    return _port(_KAFKA_PORT)


def receiver_bootstrap(sut: str) -> str:
    """Where the Kafka receiver consumes when it is the SUT's receiver: the SUT's broker (Apache Kafka's port, or
    the embedded Tansu's)."""
    return SUTS[sut].address()


def default_target(sut: str) -> str:
    """Where ``make attack SUT=...`` aims: the SUT's default topic or queue on the stack's port for it."""
    return SUTS[sut].target.format(address=SUTS[sut].address(), queue=SUT_QUEUE)


def check(sut: str) -> str:
    """``sut`` if the stack knows it, else ``ValueError`` naming the ones it does."""
    if sut not in SUTS:
        raise ValueError(f"unknown SUT {sut!r}: one of {', '.join(SUTS)}")
    return sut


def pairs_target(target: str, pairs: int) -> str:
    """An AMQP 1.0 target as ``pairs`` sender-receiver pairs, each on its own address (``transports.amqp.Amqp1Address``)."""
    return target if pairs == 1 else f"{target}{'&' if '?' in target else '?'}pairs={pairs}"


ROUTING_EXCHANGE = "flightwatch.topic"
"""The topic exchange of the routing scenario (``?bindings=N``): its queues are ``flightwatch.topic.q0`` ..."""


def routing_target(bindings: int) -> str:
    """The stack's RabbitMQ as a topic exchange with ``bindings`` queues, each bound with its own key
    (``transports.amqp.AmqpAddress``)."""
    return f"amqp://guest:guest@{HOST}:{rabbitmq_port()}/%2F?exchange={ROUTING_EXCHANGE}&bindings={bindings}"
