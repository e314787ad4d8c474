"""The contract between a receiver agent's process and the consumer of its transport, as ``transports.base``
states the load generator's: what each consumer of the system under test keeps, whatever its client.

    consumer = Amqp1Receiver(...)     # or AmqpReceiver, KafkaReceiver: each transport's in transports/<name>/
    consumer.counters()               # {"agent", "received", "unattributed", ..., "telemetry": the spool's}

Per event, in this order, the same for every transport:
  1. **stamp** the receive time (``time.time_ns()``) before anything else is done with the message;
  2. **take** its event ID (the transport's ``cloudEvents_id``/``ce_id``, else the message's own ID) and run ID
     (``cloudEvents_fwrun``/``ce_fwrun``); one without both is counted ``unattributed`` and not recorded;
  3. **record** it: one receive line (``core.contract.FastLines.recv``) appended to the disk spool, which the agent's
     shipper takes to the telemetry topic (the Kafka receiver writes its batch ahead to a file first);
  4. **ack** it to the broker only then (a consumer offset, a ``basic.ack``, an AMQP 1.0 ``accepted``), so a message
     the broker forgets is one the spool holds.
How it is driven (librdkafka's poll, pika's asyncio connection, proton's engine) is the consumer's own. The process
around it is one for every transport (``agents.runner.Process``): spool, shipper, /metrics, clock records, progress
lines, memory trim and shutdown; a transport's ``transports/<name>/process.py`` only checks its flags, connects, and
hands the process its turn (``run_blocking``) or its coroutine (``run_async``).
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class Source(Protocol):
    """One transport's consumer of the system under test, as its agent's process sees it."""

    agent: str
    """The agent's name: the ``agent`` of its receive lines and the label of its metrics."""
    num_received: int
    """Events recorded: stamped, attributed, their lines in the spool."""
    num_unattributed: int
    """Messages without a run or event ID: counted, not recorded."""

    def counters(self) -> dict:
        """``agent``, ``received``, ``unattributed``, the transport's own counts (``connection_losses``, ...), and
        ``telemetry``: the spool's ``spooled`` and ``lost``."""

    def collect(self):
        """The counters as Prometheus metric families (read at scrape time, and synced once a second for the
        process's other scrapers)."""

    def progress(self) -> tuple[tuple, str]:
        """The progress line and the figures it says (``core.logs.Progress``: said when they change)."""
