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

_CLIENT_PREFIX = "kafka."


def kafka_client_config(options: dict) -> dict:
    """kafka-python settings from source options: ``kafka.<setting>`` passes through (SASL/TLS ...)."""
    from core.kafka_options import typed_value

    cfg = {}
    for key, value in options.items():
        if key.startswith(_CLIENT_PREFIX) and key != "kafka.bootstrap.servers":
            cfg[key[len(_CLIENT_PREFIX):].replace(".", "_")] = typed_value(value) if isinstance(value, str) else value
    servers = options.get("kafka.bootstrap.servers") or options.get("bootstrap.servers") or options["bootstrap"]
    cfg["bootstrap_servers"] = servers.split(",")
    return cfg


class _KafkaPartition(InputPartition):
    def __init__(self, topic: str, partition: int, start: int, end: int) -> None:
        self.topic, self.partition, self.start, self.end = topic, partition, start, end


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
        self._available_now_end: dict | None = None

    def __getstate__(self):
        d = dict(self.__dict__)
        d["_consumer"] = None
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
        for tp in tps:
            hw = c.highwater(tp)
            if hw is not None:
                self._known_end[tp.partition] = max(hw, self._known_end.get(tp.partition, 0))
        return {tp.partition: self._known_end.get(tp.partition, 0) for tp in tps}

    def initialOffset(self) -> dict:
        parts = self._partitions()
        if self.options.get("startingoffsets", "earliest") == "latest":
            return {str(p): o for p, o in self._high_watermarks().items()}
        return {str(p): 0 for p in parts}

    def getDefaultReadLimit(self):
        return ReadMaxRows(self.max_rows) if self.max_rows else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now_end = {str(p): o for p, o in self._high_watermarks().items()}

    def latestOffset(self, start: dict, limit) -> dict:
        latest = self._available_now_end or {str(p): o for p, o in self._high_watermarks().items()}
        end = {p: max(latest.get(p, 0), start.get(p, 0)) for p in set(latest) | set(start)}
        if self._available_now_end is None and self._hold(sum(end[p] - start.get(p, 0) for p in end)):
            return {p: start.get(p, 0) for p in end}
        if isinstance(limit, ReadMaxRows):
            budget = limit.max_rows
            for p in sorted(end, key=int):  # fair share first, then what is left
                share = max(budget // max(len(end), 1), 1)
                end[p] = min(end[p], start.get(p, 0) + share)
        return end

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
        return [
            _KafkaPartition(self.topic, int(p), int(start.get(p, 0)), int(o))
            for p, o in sorted(end.items(), key=lambda kv: int(kv[0]))
            if int(o) > int(start.get(p, 0))
        ]

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
        rows: list[tuple] = []
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


def _decoding(options: dict) -> bool:
    return str(options.get("decode", "false")).lower() == "true"


READ_CHUNK = 10_000
WORKER_FETCH_WAIT_MS = 50
"""librdkafka's fetch.wait.max.ms for read tasks: a fetch past the data the planner saw waits at most this."""
WORKER_QUEUE_KBYTES = 32768
"""What a read task's consumer may fetch ahead within its range (telemetry at 5,000 events/s: ~1.5 MB/s)."""

_CONSUMERS: dict = {}
"""A worker's consumers, one per (client settings, partition), kept between read tasks."""


class _Reading:
    """A worker's librdkafka consumer of one partition, kept between read tasks, assigned only while one reads.

    librdkafka instead of kafka-python: at 5,000 events/s the two read workers took ~0.5 core each, half of it
    in kafka-python's network thread and fetch parsing; librdkafka's threads take ~0.02. Left assigned between
    tasks it would fetch ahead, but every fetch on the embedded Tansu scans what the broker holds: the telemetry
    broker went from 0.09 to 0.31 core. A task's first fetch asks for data that is there, so it is answered at once."""

    def __init__(self, consumer, topic: str, partition: int) -> None:
        self.consumer, self.topic, self.partition = consumer, topic, partition

    def assign(self, offset: int) -> None:
        from confluent_kafka import TopicPartition

        self.consumer.assign([TopicPartition(self.topic, self.partition, offset)])

    def unassign(self) -> None:
        self.consumer.unassign()


def _consumer_key(options: dict, topic: str, partition: int) -> tuple:
    return tuple(sorted((k, str(v)) for k, v in options.items())), topic, partition


def _worker_consumer(options: dict, topic: str, partition: int) -> _Reading:
    from confluent_kafka import Consumer, KafkaException

    from core.kafka_options import librdkafka

    key = _consumer_key(options, topic, partition)
    reading = _CONSUMERS.get(key)
    if reading is not None:
        return reading
    cfg = kafka_client_config(options)
    servers = cfg.pop("bootstrap_servers")
    config = {"bootstrap.servers": ",".join(servers), "group.id": "flightwatch-spark-source",
              "enable.auto.commit": False, "enable.auto.offset.store": False, "enable.partition.eof": False,
              "fetch.wait.max.ms": WORKER_FETCH_WAIT_MS, "queued.max.messages.kbytes": WORKER_QUEUE_KBYTES,
              "fetch.max.bytes": 64 << 20, "max.partition.fetch.bytes": 16 << 20, "receive.message.max.bytes": 80 << 20,
              **librdkafka(cfg)}
    try:  # a broker that is away is retried by librdkafka (the read waits up to its deadline); only bad settings fail here
        reading = _Reading(Consumer(config), topic, partition)
    except KafkaException as e:
        raise RuntimeError(f"cannot read {topic}[{partition}]: Kafka settings refused: {e}") from None
    _CONSUMERS[key] = reading
    return reading


def _drop_worker_consumer(options: dict | tuple, topic: str, partition: int) -> None:
    key = (options if isinstance(options, tuple) else _consumer_key(options, topic, partition)[0]), topic, partition
    reading = _CONSUMERS.pop(key, None)
    if reading is not None:
        try:
            reading.consumer.close()
        except Exception:  # noqa: BLE001 - closing a broken client
            pass


def close_worker_consumers() -> None:
    """Close every consumer this process keeps for read tasks (a test that read in-process, before its broker goes)."""
    for key in list(_CONSUMERS):
        _drop_worker_consumer(*key)


def _kafka_batch(rows: list[tuple]) -> pa.RecordBatch:
    cols = list(zip(*rows))
    return pa.RecordBatch.from_arrays(
        [pa.array(c, type=f.type) for c, f in zip(cols, KAFKA_ARROW_SCHEMA)], schema=KAFKA_ARROW_SCHEMA
    )
