"""Time-sliced telemetry topics: the embedded broker's memory stays bounded on long runs.

The embedded telemetry broker (Tansu 0.6, memory storage) frees nothing before a topic is deleted: retention does
not free memory and DeleteRecords is not implemented. So on it, writers put telemetry into one topic per slice of
wall-clock time, ``<topic>.slice-<start unix s>-<length s>`` (``flightwatch.telemetry.slice-1764079260-60``), and
the streaming job deletes a slice once it has archived all of it and no writer writes there any more
(``streaming.sources``). The job always reads the topic itself and every slice of it, oldest first, so writers that
slice and writers that do not can share a run.

``FLIGHTWATCH_TELEMETRY_SLICE``: ``auto`` (the default: 60 s slices on the embedded stack's telemetry broker,
127.0.0.1:19092 or its FLIGHTWATCH_TELEMETRY_PORT; one topic anywhere else, as on a real Kafka cluster), ``off``, or
a length (``30s``, ``5m``).

A writer picks the slice when it hands a message to its producer, and gives up a delivery after
``DELIVERY_TIMEOUT_S`` (then writes it again, into the slice of that time): no message lands in a slice later than
that after its end, and the job waits ``RETIRE_GRACE_S`` past a slice's end before deleting it.
"""
from __future__ import annotations

import re
import time

from core import settings


def embedded_bootstrap() -> str:
    """The embedded stack's telemetry broker (``stack``: FLIGHTWATCH_TELEMETRY_PORT, default 19092)."""
    return f"127.0.0.1:{settings.get('FLIGHTWATCH_TELEMETRY_PORT', '19092')}"


DEFAULT_SLICE_S = 60
DELIVERY_TIMEOUT_S = 20
"""A writer's producer gives up a message after this (then writes it again, into the current slice)."""
RETIRE_GRACE_S = 90
"""How long past a slice's end the job waits before deleting it: more than ``DELIVERY_TIMEOUT_S``, and more than
the 60 s after which Spark stops an idle Python worker (one holding a consumer of the slice: ``streaming.consumers``).
With 60 s slices the broker holds 90-150 s of telemetry. Tansu keeps ~0.7 MiB of each deleted topic (measured: a
30-minute soak at 5,000 events/s with 20 s slices drifted +2.5 MiB/min over 86 deletions), so slices are not shorter."""
NO_TOPIC_CREATION = {"allow.auto.create.topics": False}
"""For every long-lived librdkafka client that knows slices (admin clients too): its metadata refreshes, every
5 minutes, would otherwise have the broker create again each slice it knows that the job deleted."""
_SLICE = re.compile(r"\.slice-(\d{1,12})-(\d{1,7})$")


def slice_seconds(bootstrap: str, setting: str | None = None) -> int:
    """The slice length writers to ``bootstrap`` use (0: one topic), from ``FLIGHTWATCH_TELEMETRY_SLICE``;
    ValueError on a setting that is not auto, off or a whole number of seconds of at least 10."""
    from core.units import parse_duration_ns

    text = (setting if setting is not None else settings.get("FLIGHTWATCH_TELEMETRY_SLICE", "auto")).strip().lower()
    if text == "auto":
        return DEFAULT_SLICE_S if bootstrap.strip() == embedded_bootstrap() else 0
    if text in ("off", "0", "none"):
        return 0
    try:
        ns = parse_duration_ns(text)
    except ValueError:
        ns = 0
    if ns % 1_000_000_000 or ns < 10_000_000_000:
        raise ValueError(f"bad FLIGHTWATCH_TELEMETRY_SLICE {text!r}: auto, off, or whole seconds of at least 10s, e.g. 60s")
    return ns // 1_000_000_000


def setting_problem(bootstrap: str) -> str | None:
    """The one-line error of a bad ``FLIGHTWATCH_TELEMETRY_SLICE``, for a command's start; None if it is good."""
    try:
        slice_seconds(bootstrap)
    except ValueError as e:
        return str(e)
    return None


def slice_name(base: str, length_s: int, now_s: float) -> str:
    start = int(now_s) // length_s * length_s
    return f"{base}.slice-{start}-{length_s}"


def parse_slice(base: str, topic: str) -> tuple[int, int] | None:
    """(start unix s, length s) of a slice of ``base``; None for ``base`` itself and any other topic."""
    if not topic.startswith(base):
        return None
    m = _SLICE.fullmatch(topic[len(base):])
    return (int(m.group(1)), int(m.group(2))) if m and int(m.group(2)) > 0 else None


def split_slice(topic: str) -> tuple[str, int, int] | None:
    """(base topic, start unix s, length s) of any slice; None for a topic that is not one."""
    m = _SLICE.search(topic)
    return (topic[:m.start()], int(m.group(1)), int(m.group(2))) if m and m.start() > 0 else None


def is_ours(base: str, topic: str) -> bool:
    """Whether the job reads ``topic`` for ``base``: the topic itself or one of its slices."""
    return topic == base or parse_slice(base, topic) is not None


def read_order(base: str, topic: str) -> tuple[int, str]:
    """Sort key: the topic itself first, then its slices oldest first."""
    s = parse_slice(base, topic)
    return (-1 if s is None else s[0], topic)


class TelemetryTopic:
    """The topic a telemetry message goes to now: ``str(topic)`` is the base topic; ``topic()`` the one to write to.

    When slicing, the writer creates each slice (and the next one) as it first writes into it, with the base topic's
    partitions, and its producer never has a topic created by asking for it (``producer_settings``): the brokers
    create a topic a client only asks about, so writers would bring back every slice the job deleted."""

    def __init__(self, base: str, length_s: int = 0, bootstrap: str = "", options: dict | None = None) -> None:
        self.base, self.length_s, self.bootstrap, self.options = base, length_s, bootstrap, options
        self._current = ""
        self._created: set[str] = set()
        self._partitions = 0
        self._admin = None
        self._retry_at = 0.0

    @classmethod
    def for_broker(cls, base: str, bootstrap: str, options: dict | None = None) -> TelemetryTopic:
        return cls(base, slice_seconds(bootstrap), bootstrap, options)

    def __call__(self, now_s: float | None = None) -> str:
        if not self.length_s:
            return self.base
        now = time.time() if now_s is None else now_s
        name = slice_name(self.base, self.length_s, now)
        if name != self._current or (name not in self._created and time.monotonic() >= self._retry_at):
            self._current = name
            self._create([name, slice_name(self.base, self.length_s, now + self.length_s)])
        return name

    def __str__(self) -> str:
        return self.base

    def forget(self, name: str) -> None:
        """A write into ``name`` failed: the next message makes sure it exists (a telemetry broker that restarted
        empty has none of the slices this writer created)."""
        self._created.discard(name)

    def _create(self, names: list[str]) -> None:
        """Create the slices not yet created; a broker away is tried again a second later (a message meanwhile
        waits in its producer, then is written again into the slice of its time)."""
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient, NewTopic

        from core.kafka_options import client_options, librdkafka

        names = [n for n in names if n not in self._created]
        if not names or not self.bootstrap:
            return
        try:
            if self._admin is None:
                opts = client_options() if self.options is None else self.options
                self._admin = AdminClient({"bootstrap.servers": self.bootstrap, **NO_TOPIC_CREATION, **librdkafka(opts)})
            if not self._partitions:
                found = self._admin.list_topics(self.base, timeout=3).topics.get(self.base)
                self._partitions = len(found.partitions) if found is not None and found.partitions else 2
            futures = self._admin.create_topics([NewTopic(n, self._partitions, 1) for n in names], request_timeout=3)
            for n, f in futures.items():
                try:
                    f.result(5)
                except KafkaException as e:
                    if e.args[0].name() != "TOPIC_ALREADY_EXISTS":
                        raise
                self._created.add(n)
        except Exception:  # noqa: BLE001 - away or refused: the next message tries again
            self._retry_at = time.monotonic() + 1.0

    def producer_settings(self) -> dict:
        """A writer's librdkafka settings when slicing: it never has a topic created by asking for it, and gives up a
        delivery after ``DELIVERY_TIMEOUT_S``, or after 5 s without the slice's metadata (the writer then forgets the
        slice and creates it again: a broker back empty)."""
        if not self.length_s:
            return {}
        return {"message.timeout.ms": DELIVERY_TIMEOUT_S * 1000, "topic.metadata.propagation.max.ms": 5000,
                **NO_TOPIC_CREATION}
