"""A probe before the load: a few events to the target, and a wait until a receiver has recorded them.

Without a receiver where the system under test delivers, every event it took would count as dropped and the
verdict would blame it. The probe's events carry a run of their own (``<run>.probe``), so they are never in the
run's figures; the load generator writes no send record for them. It reads the telemetry topic (and its time
slices, ``core.slices``) from where it ended when the probe began, for a receive record of that run.

    probe_receivers(cfg, within_s=10)   # UsageError (one line, exit 2) if no receiver recorded one in time
"""
from __future__ import annotations

import asyncio
import time
import uuid

from core import contract
from transports.errors import UsageError
from transports.registry import TargetOptions, make_target, transport

PROBES = 3
"""Events the probe sends: one is enough to show a receiver is there; three ride over one the SUT refuses."""
TOPICS_EVERY_S = 1.0
"""How often the reader looks for new time slices of the telemetry topic."""


class _Book:
    """The probe's accounts: its sends' answers (``transports.base.Book``)."""

    def __init__(self) -> None:
        self.taken: set[str] = set()
        self.refused: dict[str, str] = {}

    def sent(self, eid: str, intended: int, at: int, route: int | None = None) -> None:
        pass

    def done(self, eid: str, sent: int, status: int | None, error: str | None) -> None:
        if error is None:
            self.taken.add(eid)
        else:
            self.refused[eid] = error


class _Reader:
    """Receive records of one run in the telemetry topic and its slices, written after it was made."""

    def __init__(self, bootstrap: str, topic: str, options: dict | None) -> None:
        from confluent_kafka import Consumer

        from core.kafka_options import librdkafka
        from core.slices import NO_TOPIC_CREATION

        self.base = topic
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"flightwatch-probe-{uuid.uuid4().hex}",
                                  "enable.auto.commit": False, "auto.offset.reset": "earliest",
                                  **NO_TOPIC_CREATION, **librdkafka(dict(options or {}))})
        self.known: set[str] = set()
        self.assign(at_end=True)
        self.looked = time.monotonic()

    def assign(self, at_end: bool) -> None:
        """Every topic of ours not assigned yet: from its end (those there before the probe) or its start (new)."""
        from confluent_kafka import TopicPartition

        from core.slices import is_ours

        topics = self.consumer.list_topics(timeout=10).topics
        new = []
        for name in sorted(t for t in topics if is_ours(self.base, t) and t not in self.known):
            for p in topics[name].partitions:
                offset = self.consumer.get_watermark_offsets(TopicPartition(name, p), timeout=10)[1] if at_end else 0
                new.append(TopicPartition(name, p, offset))
            self.known.add(name)
        if new:
            self.consumer.incremental_assign(new)

    def recorded(self, run_id: str, ids: set[str], within_s: float) -> dict[str, str]:
        """{event ID: the agent that recorded it} for the events of ``ids`` received in ``run_id``, once one is
        seen or ``within_s`` passed."""
        seen: dict[str, str] = {}
        deadline = time.monotonic() + within_s
        while not seen and time.monotonic() < deadline:
            if time.monotonic() - self.looked >= TOPICS_EVERY_S:
                self.assign(at_end=False)
                self.looked = time.monotonic()
            msg = self.consumer.poll(0.2)
            if msg is None or msg.error() is not None:
                continue
            try:
                records = contract.decode(msg.value())
            except ValueError:  # not for us to judge: the job quarantines it
                continue
            for r in records:
                if r.KIND == "recv" and r.run_id == run_id and r.event_id in ids:
                    seen[r.event_id] = r.agent
        return seen

    def close(self) -> None:
        self.consumer.close()


async def _send(cfg, run_id: str, ids: list[str], within_s: float) -> _Book:
    """The probe's events through the target, answered (or ``within_s`` passed)."""
    target = make_target(cfg.target, TargetOptions(min(cfg.timeout_s, within_s), len(ids), run_id, cfg.payload_bytes,
                                                   cfg.sut_kafka_options))
    book = _Book()
    await target.connect()
    try:
        target.start(book)
        for eid in ids:
            target.send(eid, time.time_ns())
        deadline = time.monotonic() + within_s
        while len(book.taken) + len(book.refused) < len(ids) and time.monotonic() < deadline:
            if target.polled:
                target.poll(0.05)
            else:
                await asyncio.sleep(0.02)
    finally:
        await target.close()
    return book


def hint(cfg) -> str:
    """What to do when no receiver recorded the probe: where a receiver must be, for this target."""
    args = transport(cfg.target.scheme).receiver_args(cfg.target)
    if args is None:
        return ("the system under test must deliver to a receiver of flightwatch's (make up starts one: "
                "python -m agents.receiver http, or the stack's at http://127.0.0.1:18080/)")
    # where the user's system delivers may be another topic than the target's: its partitions are not routes there
    shown = " ".join(a for a in args if a not in ("--from-end", "--routes"))
    return (f"start one where the SUT delivers (python -m agents.receiver {shown} ...), or let flightwatch start "
            "it (make attack without NO_RECEIVER, or --receiver auto)")


def probe_receivers(cfg, within_s: float, log=print) -> None:
    """``PROBES`` events to the target, counted apart; returns once a receiver recorded one, else ``UsageError``."""
    if not cfg.telemetry_bootstrap:
        return
    run_id = f"{cfg.run_id}.probe"
    ids = [f"probe-{uuid.uuid4().hex[:12]}-{i}" for i in range(PROBES)]
    t0 = time.monotonic()
    reader = _Reader(cfg.telemetry_bootstrap, cfg.telemetry_topic, cfg.kafka_options)
    try:
        book = asyncio.run(_send(cfg, run_id, ids, within_s))
        if not book.taken:
            why = "; ".join(sorted(set(book.refused.values()))) or "no answer"
            raise UsageError(f"the probe sent to {cfg.target} was not taken ({why}): nothing was sent")
        seen = reader.recorded(run_id, set(book.taken), max(0.0, within_s - (time.monotonic() - t0)))
    finally:
        reader.close()
    if not seen:
        raise UsageError(f"no receiver recorded the probe sent to {cfg.target} within {within_s:g} s: {hint(cfg)}")
    log(f"probe: recorded by {', '.join(sorted(set(seen.values())))} {time.monotonic() - t0:.1f} s after it was "
        f"sent ({len(book.taken)} probe events, run {run_id}, not in the run's figures)")
