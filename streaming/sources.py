"""Streaming sources built on Spark's Python Data Source API.

``flightwatch_kafka`` reads a Kafka topic with kafka-python in assign mode and gives the
same columns as Spark's built-in ``kafka`` source (key, value, topic, partition, offset,
timestamp, timestampType), so the job can switch to ``format("kafka")`` on clusters that
have the connector jar. Offsets are JSON ``{"<partition>": next_offset}``; one Spark
partition per Kafka partition; ``read()`` is stateless and re-reads exactly the range it is
given. The end of a partition is taken from Fetch responses' high watermark, never from
ListOffsets (the embedded Tansu broker under-reports that). With ``.option("decode", "true")``
(the job's default) ``read()`` yields decoded telemetry rows (``streaming.decode.DECODED_SCHEMA``)
itself, so decoding is not a separate ``mapInArrow`` stage, with its own worker round trip.

Idle batching: with ``minBatchMessages`` N, a micro-batch waits until N new messages are there
or ``maxBatchWaitMs`` has passed since the first of them. At idle only machine records come
(a node sample and a heartbeat a second), so the job runs a batch every couple of seconds
instead of every trigger; under load every agent sends several messages a trigger and
nothing waits.

Read tasks run in pyspark's reused Python workers: a worker keeps its consumer between tasks
(a new one costs a connection and a metadata round trip per partition per batch) and calls
``gc.freeze()`` at each task's start, since the pyspark daemon runs a full ``gc.collect()``
after every task, which on a worker that imported pyarrow, pandas and pyspark cost ~50 ms of
CPU a task: at two batches a second, a third of a core for nothing.

The archive's source, for replay, is ``streaming.archive``.
"""
from __future__ import annotations

import gc
import time
from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, SupportsTriggerAvailableNow

from streaming.consumers import (  # noqa: F401 - close_worker_consumers: for tests reading in-process
    _drop_worker_consumer,
    _worker_consumer,
    close_worker_consumers,
    kafka_client_config,
)

KAFKA_SCHEMA = (
    "key binary, value binary, topic string, partition int, offset bigint, "
    "timestamp timestamp, timestampType int"
)
KAFKA_ARROW_SCHEMA = pa.schema([
    pa.field("key", pa.binary()), pa.field("value", pa.binary()), pa.field("topic", pa.string()),
    pa.field("partition", pa.int32()), pa.field("offset", pa.int64()),
    pa.field("timestamp", pa.timestamp("us", tz="UTC")), pa.field("timestampType", pa.int32()),
])
READ_WAIT_S = 600
"""How long a read task waits for the broker (away, restarting) before failing its batch; the job
resumes from its checkpoint when restarted."""
HIGHWATER_WAIT_S = 1.0
"""How long the planner waits for every partition's high watermark before using what it has."""

class _KafkaPartition(InputPartition):
    def __init__(self, topic: str, partition: int, start: int, end: int, reset: dict | None = None) -> None:
        self.topic, self.partition, self.start, self.end = topic, partition, start, end
        self.reset = reset  # the first read after the broker lost its data also writes the record that says so


RESET_KEYS = ("topic_id", "resets", "reset_at_ns", "reset_reason", "reset_lost")
"""Offsets are ``{"<partition>": next offset}`` plus these: the topic's ID, how many times the broker lost its data,
and for the batch that found out, when, why and how many messages it knew of and had not read."""


def _parts(offsets: dict) -> dict[str, int]:
    """The partitions' offsets of an offset dict (without ``RESET_KEYS``)."""
    return {p: int(o) for p, o in offsets.items() if p not in RESET_KEYS}


class KafkaDataSource(DataSource):
    """``spark.readStream.format("flightwatch_kafka").option("bootstrap", ...).option("subscribe", topic)``.

    Options: ``bootstrap`` (host:port,...), ``subscribe`` (one topic), ``startingOffsets``
    (earliest | latest), ``maxOffsetsPerTrigger`` (messages per micro-batch), and any
    ``kafka.<setting>`` for the client (e.g. ``kafka.security_protocol``).
    """

    @classmethod
    def name(cls) -> str:
        return "flightwatch_kafka"

    def schema(self):
        if _decoding(self.options):
            from pyspark.sql.pandas.types import from_arrow_schema

            from streaming.decode import DECODED_SCHEMA

            return from_arrow_schema(DECODED_SCHEMA)
        return KAFKA_SCHEMA

    def streamReader(self, schema) -> KafkaStreamReader:
        return KafkaStreamReader(dict(self.options))


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: dict) -> None:
        self.options = options
        self.topic = options["subscribe"]
        self.max_rows = int(options["maxoffsetspertrigger"]) if options.get("maxoffsetspertrigger") else None
        self.decode = _decoding(options)
        self.min_messages = int(options.get("minbatchmessages", 1))
        self.max_wait_s = int(options.get("maxbatchwaitms", 0)) / 1000
        self._pending_since: float | None = None
        self._consumer = None
        self._known_end: dict[int, int] = {}
        self._fresh_end: dict[int, int] = {}  # what the last fetch answered, even below what is known
        self._available_now_end: dict | None = None
        self._admin = None
        self._behind = 0  # planning calls in a row that found a partition's end below the job's offsets

    def __getstate__(self):
        d = dict(self.__dict__)
        d["_consumer"] = d["_admin"] = None
        return d

    # --- planning (driver side) ---
    def _client(self):
        if self._consumer is None:
            from kafka import KafkaConsumer

            self._consumer = KafkaConsumer(
                enable_auto_commit=False, fetch_max_wait_ms=20, max_partition_fetch_bytes=1024,
                **kafka_client_config(self.options),
            )
        return self._consumer

    def _partitions(self) -> list[int]:
        parts = self._client().partitions_for_topic(self.topic)
        if not parts:
            if self._known_end:  # the broker is away: keep planning from what is known, read nothing new
                return sorted(self._known_end)
            raise RuntimeError(f"topic {self.topic!r} does not exist")
        return sorted(parts)

    def _high_watermarks(self) -> dict[int, int]:
        """Each partition's high watermark from a fresh Fetch response (exact, unlike ListOffsets on Tansu)."""
        from kafka import TopicPartition

        c = self._client()
        tps = [TopicPartition(self.topic, p) for p in self._partitions()]
        if set(c.assignment()) != set(tps):
            c.assign(tps)
        for tp in tps:  # start one record before the known end: the fetch answers at once
            c.seek(tp, max(self._known_end.get(tp.partition, 0) - 1, 0))
            c._subscription.assignment[tp].highwater = None  # only a fresh answer counts
        deadline = time.monotonic() + HIGHWATER_WAIT_S
        while time.monotonic() < deadline and any(c.highwater(tp) is None for tp in tps):
            c.poll(timeout_ms=50, max_records=1, update_offsets=False)
        self._fresh_end = {}
        for tp in tps:
            hw = c.highwater(tp)
            if hw is not None:
                self._fresh_end[tp.partition] = hw
                self._known_end[tp.partition] = max(hw, self._known_end.get(tp.partition, 0))
        return {tp.partition: self._known_end.get(tp.partition, 0) for tp in tps}

    def _topic_id(self) -> str | None:
        """The topic's ID (a broker that lost its data, restarted on memory storage, has it recreated under a new
        one); None while the broker is away or does not say."""
        from confluent_kafka import TopicCollection
        from confluent_kafka.admin import AdminClient

        from core.kafka_options import librdkafka

        try:
            if self._admin is None:
                cfg = kafka_client_config(self.options)
                self._admin = AdminClient({"bootstrap.servers": ",".join(cfg.pop("bootstrap_servers")), **librdkafka(cfg)})
            found = self._admin.describe_topics(TopicCollection([self.topic]), request_timeout=2)[self.topic].result(3)
            return str(found.topic_id)
        except Exception:  # noqa: BLE001 - away or unknown: no signal either way
            return None

    def _reset(self, start: dict, topic_id: str | None) -> str | None:
        """Why the broker no longer holds what ``start`` points into, or None: the topic has a new ID; or, where
        topic IDs are not known, a partition's end below where the job is, in two fresh fetches in a row (one
        answer could be a stale fetch's, and a false reset would read the topic again from its start)."""
        if topic_id is not None and start.get("topic_id") not in (None, topic_id):
            return f"the topic was recreated (ID {start['topic_id']} -> {topic_id})"
        behind = {p: (o, self._fresh_end[int(p)]) for p, o in _parts(start).items()
                  if int(p) in self._fresh_end and self._fresh_end[int(p)] < o}
        self._behind = (self._behind + 1) if behind and (topic_id is None or "topic_id" not in start) else 0
        if self._behind >= 2:
            self._behind = 0
            return "its end offsets went back (" + ", ".join(f"partition {p}: {o} -> {e}" for p, (o, e) in sorted(behind.items())) + ")"
        return None

    def initialOffset(self) -> dict:
        parts = self._partitions()
        topic_id = {"topic_id": tid} if (tid := self._topic_id()) else {}
        if self.options.get("startingoffsets", "earliest") == "latest":
            return {**{str(p): o for p, o in self._high_watermarks().items()}, **topic_id}
        return {**{str(p): 0 for p in parts}, **topic_id}

    def getDefaultReadLimit(self):
        return ReadMaxRows(self.max_rows) if self.max_rows else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now_end = {str(p): o for p, o in self._high_watermarks().items()}

    def latestOffset(self, start: dict, limit) -> dict:
        latest = self._available_now_end or {str(p): o for p, o in self._high_watermarks().items()}
        topic_id = self._topic_id()
        keep = {"topic_id": topic_id or start.get("topic_id"), "resets": start.get("resets", 0)}
        keep = {k: v for k, v in keep.items() if v}
        if (why := self._reset(start, topic_id)) is not None:
            return self._after_reset(start, why, keep)
        start = _parts(start)
        end = {p: max(latest.get(p, 0), start.get(p, 0)) for p in set(latest) | set(start)}
        if self._available_now_end is None and self._hold(sum(end[p] - start.get(p, 0) for p in end)):
            return {**{p: start.get(p, 0) for p in end}, **keep}
        if isinstance(limit, ReadMaxRows):
            budget = limit.max_rows
            for p in sorted(end, key=int):  # fair share first, then what is left
                share = max(budget // max(len(end), 1), 1)
                end[p] = min(end[p], start.get(p, 0) + share)
        return {**end, **keep}

    def _after_reset(self, start: dict, why: str, keep: dict) -> dict:
        """The broker lost its data: read the new log from its start; the batch carries when, why and how much (the
        job logs it, once, when its engine takes the batch's ``reset`` record: ``streaming.sinks``)."""
        lost = sum(max(self._known_end.get(int(p), 0) - o, 0) for p, o in _parts(start).items())
        self._known_end, self._available_now_end = {}, None
        end = {str(p): o for p, o in self._high_watermarks().items()}
        return {**end, **keep, "resets": start.get("resets", 0) + 1, "reset_at_ns": time.time_ns(),
                "reset_reason": why, "reset_lost": lost}

    def _hold(self, num_new: int, now: float | None = None) -> bool:
        """Whether ``num_new`` new messages wait for more (fewer than ``min_messages``, not yet ``max_wait_s``)."""
        if num_new <= 0 or num_new >= self.min_messages:
            self._pending_since = None
            return False
        now = time.monotonic() if now is None else now
        if self._pending_since is None:
            self._pending_since = now
        if now - self._pending_since < self.max_wait_s:
            return True
        self._pending_since = None
        return False

    def reportLatestOffset(self):
        return {str(p): o for p, o in self._known_end.items()} or None

    def partitions(self, start: dict, end: dict):
        reset = None
        if end.get("resets", 0) > start.get("resets", 0):  # the new log is read from its start
            reset = {"at_ns": end["reset_at_ns"], "reason": end["reset_reason"], "count": end["reset_lost"]}
            start = {}
        start, end = _parts(start), _parts(end)
        out = [_KafkaPartition(self.topic, int(p), start.get(p, 0), o)
               for p, o in sorted(end.items(), key=lambda kv: int(kv[0])) if o > start.get(p, 0)]
        if reset is not None:  # the first task also writes the record that says so
            out = out or [_KafkaPartition(self.topic, int(min(end, key=int, default="0")), 0, 0)]
            out[0].reset = reset
        return out

    def commit(self, end: dict) -> None:
        pass

    def stop(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    # --- reading (executor side): stateless, exactly [start, end) ---
    def read(self, partition: _KafkaPartition) -> Iterator[pa.RecordBatch]:
        gc.freeze()  # what this worker holds now is never scanned again by the daemon's per-task collect
        deadline = time.monotonic() + READ_WAIT_S
        reading = _worker_consumer(self.options, partition.topic, partition.partition)
        reading.assign(partition.start)
        consumer = reading.consumer
        rows: list[tuple] = [_reset_row(partition)] if partition.reset else []
        next_offset = partition.start
        ok = False
        try:
            while next_offset < partition.end:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"timed out reading {partition.topic}[{partition.partition}] at {next_offset} "
                                       f"(end {partition.end}) after {READ_WAIT_S} s")
                for m in consumer.consume(min(partition.end - next_offset, READ_CHUNK), 0.05):
                    if m.error() is not None:  # partition EOF, a broker away: librdkafka retries by itself
                        continue
                    offset = m.offset()
                    if offset < next_offset or offset >= partition.end:
                        continue
                    ts_type, ts_ms = m.timestamp()
                    rows.append((m.key(), m.value(), partition.topic, partition.partition, offset, ts_ms * 1000,
                                 ts_type - 1 if ts_type > 0 else -1))
                    next_offset = offset + 1
                if len(rows) >= 4096:
                    yield from self._out(rows)
                    rows = []
            ok = True
        finally:
            if ok:
                reading.unassign()
            else:  # a failed or abandoned read: the next task starts from a fresh consumer
                _drop_worker_consumer(self.options, partition.topic, partition.partition)
        if rows:
            yield from self._out(rows)

    def _out(self, rows: list[tuple]) -> Iterator[pa.RecordBatch]:
        if not self.decode:
            yield _kafka_batch(rows)
            return
        from streaming.decode import DECODED_SCHEMA, decode_messages

        _, values, _, partitions, offsets, _, _ = zip(*rows)
        yield from decode_messages(list(values), list(partitions), list(offsets)).cast(DECODED_SCHEMA).to_batches()


def _reset_row(partition: _KafkaPartition) -> tuple:
    """A Kafka row (offset -1: no message of the topic) carrying the job's ``reset`` record, for every run."""
    from core import contract

    r = partition.reset
    line = contract.encode([contract.TelemetryReset(contract.ANY_RUN, "job", int(r["at_ns"]), where=partition.topic,
                                                    reason=r["reason"], count=int(r["count"]))])
    return (b"job", line, partition.topic, partition.partition, -1, int(r["at_ns"]) // 1000, -1)


def _decoding(options: dict) -> bool:
    return str(options.get("decode", "false")).lower() == "true"


READ_CHUNK = 10_000


def _kafka_batch(rows: list[tuple]) -> pa.RecordBatch:
    cols = list(zip(*rows))
    return pa.RecordBatch.from_arrays(
        [pa.array(c, type=f.type) for c, f in zip(cols, KAFKA_ARROW_SCHEMA)], schema=KAFKA_ARROW_SCHEMA
    )
