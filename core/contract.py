"""The telemetry contract: every record any flightwatch agent writes, defined once.

A record is flat and typed; units sit in the field names. On the wire, many records
travel in one Kafka message as NDJSON (one JSON object a line, ``None`` fields left
out), keyed by the agent's name so one agent's records stay in order on one partition.
Every record carries the schema version ``v``.

The Arrow schema (and from it the Spark schema) is derived from the dataclasses below,
never retyped: ``ARROW_SCHEMA`` is the union of all record kinds' fields.
"""
from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    import pyarrow as pa

SCHEMA_VERSION = 1
"""Version stamped into every record as ``v``; the job quarantines any other."""

ANY_RUN = "*"
"""Run ID of records about the machines rather than one run (node samples, OOM kills, restarts,
clock offsets): every run's job takes those that fall within the run's time span."""
SHARED_KINDS = ("node", "oom", "restart", "clock", "lost", "held", "reset")
"""Record kinds that may carry ``ANY_RUN``."""

MIN_TS_NS = 946_684_800 * 10**9
"""Earliest timestamp accepted (2000-01-01T00:00:00Z): anything earlier is quarantined."""
MAX_TS_NS = 4_102_444_800 * 10**9
"""Latest timestamp accepted (2100-01-01T00:00:00Z): anything later is quarantined."""


@dataclass(frozen=True)
class Record:
    """Fields every record has. ``at_ns`` is the record's event time (Unix ns)."""

    run_id: str
    agent: str
    at_ns: int
    KIND: ClassVar[str] = ""
    REQUIRED: ClassVar[tuple[str, ...]] = ("run_id", "agent", "at_ns")

    def to_dict(self) -> dict:
        d = {"v": SCHEMA_VERSION, "kind": self.KIND}
        for name, value in self.__dict__.items():
            if value is not None:
                d[name] = value
        return d


SEND_HOLD_NS = 100_000_000
"""How long a sender may hold a send's record after its stamp, to write it with its answer as one line
(``Send.acked_at_ns``): a third fewer lines a run. So a sender's lines are in the order they were written, not of
their stamps: a line written at ``t`` says that every send stamped before ``t - SEND_HOLD_NS`` has been written.
A send still unanswered then is written alone, and its ``Ack`` follows."""


@dataclass(frozen=True)
class Send(Record):
    """One event sent to the system under test. ``intended_at_ns`` comes from the pacer. A send written with its
    answer (``SEND_HOLD_NS``) also carries what its ``Ack`` would: ``acked_at_ns``, ``status`` and ``error``.
    ``route``: where it was sent, when the target is several places flightwatch chose among (``?pairs=N``: pair k,
    ``?bindings=N``: the queue bound with route k's key); a receive on another route is misrouted (``Receive``)."""

    event_id: str = ""
    intended_at_ns: int = 0
    bytes_out: int | None = None
    worker: int | None = None
    acked_at_ns: int | None = None
    status: int | None = None
    error: str | None = None
    route: int | None = None
    KIND: ClassVar[str] = "send"
    REQUIRED: ClassVar[tuple[str, ...]] = Record.REQUIRED + ("event_id", "intended_at_ns")


@dataclass(frozen=True)
class Receive(Record):
    """One delivery of an event seen by a receiver agent (``at_ns`` = receive time), with where it arrived:
    ``dest`` (the Kafka topic, the AMQP 0-9-1 queue, the AMQP 1.0 address, the HTTP path), ``route`` (the route of
    that place among the target's: the pair or binding, the Kafka partition) and ``key`` (the AMQP 0-9-1 routing key
    it was published with). A receive whose ``route`` is not its send's is misrouted, never an on-time receive."""

    event_id: str = ""
    bytes_in: int | None = None
    dest: str | None = None
    route: int | None = None
    key: str | None = None
    KIND: ClassVar[str] = "recv"
    REQUIRED: ClassVar[tuple[str, ...]] = Record.REQUIRED + ("event_id",)


@dataclass(frozen=True)
class Ack(Record):
    """The target's answer to one send (``at_ns`` = ack time); ``error`` names a failure's cause."""

    event_id: str = ""
    sent_at_ns: int = 0
    status: int | None = None
    error: str | None = None
    KIND: ClassVar[str] = "ack"
    REQUIRED: ClassVar[tuple[str, ...]] = Record.REQUIRED + ("event_id", "sent_at_ns")

    @property
    def failed(self) -> bool:
        return is_failure(self.status, self.error)


@dataclass(frozen=True)
class NodeSample(Record):
    """One node metric at one instant; ``missing`` marks a failed or slow scrape (a hole)."""

    node: str = ""
    metric: str = ""
    value: float | None = None
    missing: bool | None = None
    KIND: ClassVar[str] = "node"
    REQUIRED: ClassVar[tuple[str, ...]] = Record.REQUIRED + ("node", "metric")


@dataclass(frozen=True)
class OomEvent(Record):
    """OOM kills seen by one detector: ``source`` is vmstat, cgroup or k8s; ``where`` the place (node, cgroup path,
    or namespace/pod/container@node); ``victim`` what the kernel killed, as it said (``pid 123 (python)``)."""

    source: str = ""
    where: str | None = None
    count: int | None = None
    victim: str | None = None
    KIND: ClassVar[str] = "oom"
    REQUIRED: ClassVar[tuple[str, ...]] = Record.REQUIRED + ("source",)


@dataclass(frozen=True)
class ContainerRestart(Record):
    """A container restarted (Kubernetes): ``where`` is namespace/pod/container@node, ``reason`` why it ended."""

    where: str | None = None
    reason: str | None = None
    count: int | None = None
    KIND: ClassVar[str] = "restart"
    REQUIRED: ClassVar[tuple[str, ...]] = Record.REQUIRED + ("where",)


@dataclass(frozen=True)
class ClockOffset(Record):
    """This agent's clock against a reference: ``offset_us`` = reference − agent, known to ± ``rtt_us`` / 2."""

    reference: str = ""
    offset_us: float = 0.0
    rtt_us: float = 0.0
    KIND: ClassVar[str] = "clock"
    REQUIRED: ClassVar[tuple[str, ...]] = Record.REQUIRED + ("reference", "offset_us", "rtt_us")


@dataclass(frozen=True)
class TelemetryLost(Record):
    """Records an agent had to refuse (its buffer or spool over budget): ``count`` since its previous
    report, ``reason`` which budget. Never silent: the run's summary adds them up per agent."""

    count: int = 0
    reason: str | None = None
    KIND: ClassVar[str] = "lost"
    REQUIRED: ClassVar[tuple[str, ...]] = Record.REQUIRED + ("count",)


@dataclass(frozen=True)
class TelemetryHeld(Record):
    """An agent's telemetry held back on its way to the broker, then delivered (its host's path to the broker cut,
    the broker slow or away): ``at_ns`` when the hold began (the first message that waited), ``value`` the longest
    wait in seconds, ``count`` the records that waited ``core.held.HELD_S`` or more. flightwatch's own outage, never the
    SUT's: the verdict names it."""

    count: int = 0
    value: float = 0.0
    KIND: ClassVar[str] = "held"
    REQUIRED: ClassVar[tuple[str, ...]] = Record.REQUIRED + ("count", "value")


@dataclass(frozen=True)
class TelemetryReset(Record):
    """The telemetry broker lost what it held (restarted on memory storage, a topic recreated): written by the job's
    Kafka source when it finds out, with ``where`` (the topic), ``reason`` (the signal) and ``count`` (messages it
    knew of and had not read: at least that many are gone). The job resumes at the new log's start."""

    where: str | None = None
    reason: str | None = None
    count: int | None = None
    KIND: ClassVar[str] = "reset"


@dataclass(frozen=True)
class RunStart(Record):
    """A run began; ``config`` is the run's configuration as a JSON object string."""

    config: str | None = None
    KIND: ClassVar[str] = "run_start"


@dataclass(frozen=True)
class RunStop(Record):
    """A run ended (``reason``: completed, aborted, ...); no sends after ``at_ns``."""

    reason: str | None = None
    KIND: ClassVar[str] = "run_stop"


@dataclass(frozen=True)
class Heartbeat(Record):
    """An agent is alive at ``at_ns``: moves event time on when there is nothing else to say."""

    KIND: ClassVar[str] = "heartbeat"


RECORD_TYPES: tuple[type[Record], ...] = (
    Send, Receive, Ack, NodeSample, OomEvent, ContainerRestart, ClockOffset, TelemetryLost, TelemetryHeld,
    TelemetryReset, RunStart, RunStop, Heartbeat,
)
KINDS: dict[str, type[Record]] = {t.KIND: t for t in RECORD_TYPES}

def _field_types() -> dict[str, str]:
    """Every field of every record kind, in the decoded telemetry's column order, with its Python type's name."""
    types = {"v": "int", "kind": "str"}
    for rtype in RECORD_TYPES:
        for f in dataclasses.fields(rtype):
            types.setdefault(f.name, str(f.type).replace(" | None", "").strip())
    return types


_PY_TYPES = _field_types()
FIELD_NAMES = tuple(_PY_TYPES)


@functools.cache
def _arrow() -> tuple[pa.Schema, dict[str, pa.DataType]]:
    import pyarrow as pa

    types = {"int": pa.int64(), "str": pa.string(), "float": pa.float64(), "bool": pa.bool_()}
    schema = pa.schema([pa.field(name, types[py]) for name, py in _PY_TYPES.items()])
    return schema, {f.name: f.type for f in schema}


def __getattr__(name: str):
    """``ARROW_SCHEMA`` (every field of every record kind, all nullable: the decoded telemetry's columns) and
    ``FIELD_TYPES`` (each field's Arrow type), made at their first use: a process that writes telemetry and never
    decodes it does not import pyarrow (a receiver's import: 0.27 CPU-s, 0.46 with it)."""
    if name == "ARROW_SCHEMA":
        return _arrow()[0]
    if name == "FIELD_TYPES":
        return _arrow()[1]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


TIMESTAMP_FIELDS = tuple(n for n in FIELD_NAMES if n.endswith("_ns"))
COUNT_FIELDS = ("bytes_out", "bytes_in", "count")


def is_failure(status: int | None, error: str | None) -> bool:
    """An ack is a failure when it names an error or its status is not 2xx (``failures`` over arrays)."""
    return error is not None or (status is not None and not 200 <= status < 300)


def failures(status, error):
    """``is_failure`` over arrays: ``status`` as floats (NaN for none), ``error`` as objects (None for none)."""
    import numpy as np
    import pandas as pd

    return pd.notna(error) | (~np.isnan(status) & ((status < 200) | (status >= 300)))


def encode(records: Iterable[Record | dict | str]) -> bytes:
    """Records to one wire message: NDJSON, compact, ``None`` fields left out.

    A ``str`` item is taken as an already encoded line (see ``FastLines``).
    """
    dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
    return "\n".join(
        r if isinstance(r, str) else dumps(r if isinstance(r, dict) else r.to_dict()) for r in records
    ).encode()


class FastLines:
    """Send and ack lines for the load generator's hot path, formatted without building records.

    Gives byte-for-byte what ``encode([Send(...)])`` / ``encode([Ack(...)])`` give (tested).
    """

    def __init__(self, run_id: str, agent: str) -> None:
        dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
        prefix = f'"run_id":{dumps(run_id)},"agent":{dumps(agent)}'
        self._send = '{"v":%d,"kind":"send",%s,"at_ns":%%d,"event_id":%%s,"intended_at_ns":%%d,"bytes_out":%%d,"worker":%%d' % (
            SCHEMA_VERSION, prefix)
        self._ack = '{"v":%d,"kind":"ack",%s,"at_ns":%%d,"event_id":%%s,"sent_at_ns":%%d' % (SCHEMA_VERSION, prefix)
        self._dumps = dumps

        self._recv = '{"v":%d,"kind":"recv","run_id":%%s,"agent":%s,"at_ns":%%%%d,"event_id":%%%%s,"bytes_in":%%%%d' % (
            SCHEMA_VERSION, dumps(agent))
        self._recv_by_run: dict[str, str] = {}

    def _quote(self, text: str) -> str:
        """JSON string literal; the common plain-ASCII case without the encoder."""
        if text.isascii() and text.isprintable() and '"' not in text and "\\" not in text:
            return '"' + text + '"'
        return self._dumps(text)

    def recv(self, run_id: str, at_ns: int, event_id: str, bytes_in: int, where: str = "}") -> str:
        """A receive line (receivers serve many runs: the run ID is given per record); ``where`` is the line's end
        from ``where`` (the place it arrived at, made once per place)."""
        fmt = self._recv_by_run.get(run_id)
        if fmt is None:
            if len(self._recv_by_run) > 1000:
                self._recv_by_run.clear()
            fmt = self._recv_by_run[run_id] = self._recv % self._dumps(run_id).replace("%", "%%")
        return fmt % (at_ns, self._quote(event_id), bytes_in) + where

    def where(self, dest: str | None = None, route: int | None = None, key: str | None = None) -> str:
        """The end of a receive line naming where it arrived (``Receive.dest``, ``route``, ``key``): a receiver makes
        it once per place (queue, link, partition) and hands it to ``recv``."""
        out = ',"dest":' + self._dumps(dest) if dest is not None else ""
        if route is not None:
            out += ',"route":%d' % route
        return out + (',"key":' + self._dumps(key) if key is not None else "") + "}"

    def send(self, at_ns: int, event_id: str, intended_at_ns: int, bytes_out: int, worker: int,
             route: int | None = None) -> str:
        line = self._send % (at_ns, self._quote(event_id), intended_at_ns, bytes_out, worker)
        return line + ("}" if route is None else ',"route":%d}' % route)

    def send_acked(self, at_ns: int, event_id: str, intended_at_ns: int, bytes_out: int, worker: int, acked_at_ns: int,
                   status: int | None, error: str | None, route: int | None = None) -> str:
        """A send written with its answer (``SEND_HOLD_NS``)."""
        line = self._send % (at_ns, self._quote(event_id), intended_at_ns, bytes_out, worker) + ',"acked_at_ns":%d' % acked_at_ns
        line = self._answer(line, status, error)
        return line if route is None else line[:-1] + ',"route":%d}' % route

    def ack(self, at_ns: int, event_id: str, sent_at_ns: int, status: int | None, error: str | None) -> str:
        return self._answer(self._ack % (at_ns, self._quote(event_id), sent_at_ns), status, error)

    def _answer(self, line: str, status: int | None, error: str | None) -> str:
        if status is not None:
            line += ',"status":%d' % status
        if error is not None:
            line += ',"error":' + self._dumps(error)
        return line + "}"


def decode(message: bytes) -> list[Record]:
    """One wire message back to typed records (strict: raises ValueError on a bad line).

    The streaming job does not use this (it decodes whole batches with Arrow and
    quarantines bad lines); it is the reference for tests and small tools.
    """
    out = []
    for line in message.splitlines():
        if not line.strip():
            continue
        d = json.loads(line)
        if d.pop("v", None) != SCHEMA_VERSION:
            raise ValueError("unsupported schema version")
        rtype = KINDS.get(d.pop("kind", None))
        if rtype is None:
            raise ValueError("unknown kind")
        out.append(rtype(**d))
    return out
