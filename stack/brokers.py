"""The brokers the embedded stack can run as the system under test, one ``Broker`` each: how it starts, is addressed,
stopped and renewed. ``python -m stack`` reads their fields instead of branching on a broker's name; a new broker is
its module in ``stack/`` and one line of ``BROKERS``.

    BROKERS["kafka"].command(stack)   # its command line when it is the stack's SUT, else None
"""
from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from core.suts import SUTS, sut_partitions
from stack import artemis, debian, kafka, rabbitmq
from stack.peer import Peer
from stack.tansu import tansu_command

if TYPE_CHECKING:
    from stack.config import Stack


@dataclass(frozen=True)
class Broker:
    """A SUT broker of the stack (its component's name is its key in ``BROKERS``)."""

    make: Callable[[Stack, str], list[str] | None]
    """Its command line, given the stack and its folder (``<stack>/<name>``); None if it cannot be had."""
    start_s: float = 15.0
    """How long its port may take to open."""
    amqp: bool = False
    """Addressed as amqp://HOST:PORT (else HOST:PORT, the Kafka protocol)."""
    session: bool = False
    """A script with its VM and helpers: stopped as the whole session it leads."""
    renew_wipe: tuple[str, ...] = ()
    """Folders under its own that hold its queues or log on disk: removed at ``renew-sut``, so it starts empty."""
    environment: Callable[[Stack, str], dict] | None = None
    """Its environment, given the stack and its folder (None: the stack's own)."""
    unavailable: str = ""
    """What to say when its command cannot be had ("": its ``make`` said it already)."""
    always: bool = False
    """Its command is made whatever the SUT (no download, no install: the in-memory Tansu)."""
    peer: Peer | None = None
    """Its own load tool, kept in its module (``stack.peers`` runs it against a SUT of it that ``core.suts.Sut.peer``
    says it speaks to)."""
    start_alone: Callable[[int, str, object], subprocess.Popen] | None = None
    """Started alone on a port and in a folder of its own, with its log (``bench.transports``): its process."""
    stop_alone: Callable[[int], None] | None = None
    """Stop what ``start_alone`` started, by its PID."""
    purge: Callable[[int, str], None] | None = None
    """A queue of it emptied between runs (None: a log, kept)."""

    def command(self, stack: Stack, name: str) -> list[str] | None:
        """Its command line when it runs in this stack (it is the SUT's broker, or ``always``), else None."""
        if not self.always and SUTS[stack.sut].broker != name:
            return None
        return self.make(stack, os.path.join(stack.dir, name))


def _maven(make: Callable[[Stack, str], list[str]]) -> Callable[[Stack, str], list[str] | None]:
    """A broker fetched from the Maven registry: its command, or None with why said in one line."""
    def made(stack: Stack, folder: str) -> list[str] | None:
        try:
            return make(stack, folder)
        except RuntimeError as e:
            print(f"stack: error: {e}", file=sys.stderr)
            return None
    return made


BROKERS: dict[str, Broker] = {
    "sut-broker": Broker(lambda stack, _: tansu_command(stack.ports["sut-broker"]), always=True),
    "rabbitmq": Broker(lambda stack, _: rabbitmq.command() if debian.ensure_rabbitmq() else None,
                       start_s=rabbitmq.START_S, amqp=True, session=True, renew_wipe=("mnesia",),
                       environment=lambda stack, folder: rabbitmq.environment(stack.ports["rabbitmq"], folder),
                       unavailable=rabbitmq.INSTALL_HINT, peer=rabbitmq.PEER, start_alone=rabbitmq.start_rabbitmq,
                       stop_alone=rabbitmq.stop_rabbitmq, purge=rabbitmq.purge),
    "artemis": Broker(_maven(lambda stack, folder: artemis.command(artemis.prepare(stack.ports["artemis"], folder))),
                      start_s=artemis.START_S, amqp=True, session=True, renew_wipe=(os.path.join("instance", "data"),),
                      peer=artemis.PEER, start_alone=artemis.start_dropping, stop_alone=artemis.stop_artemis,
                      purge=artemis.purge),
    "kafka": Broker(_maven(lambda stack, folder: kafka.command(stack.ports["kafka"], folder, sut_partitions())),
                    start_s=kafka.START_S, session=True, renew_wipe=("data",), peer=kafka.PEER,
                    start_alone=kafka.start_kafka, stop_alone=kafka.stop_kafka),
}
"""The stack's SUT brokers by component name (``core.suts.Sut.broker``), in the order ``up`` starts them."""
