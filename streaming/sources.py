"""Streaming sources built on Spark's Python Data Source API.

``flightwatch_kafka`` reads a Kafka topic and its time slices (``core.slices``: the embedded
broker's telemetry, deleted once read) and gives the same columns as Spark's built-in ``kafka``
source (key, value, topic, partition, offset, timestamp, timestampType), so the job can switch to
``format("kafka")`` on clusters that have the connector jar (which reads the one topic). Offsets
are JSON per topic and partition (``streaming.topics``, which plans them); one Spark partition per
Kafka partition; ``read()`` is stateless and re-reads exactly the range it is given. The end of a partition is taken from Fetch responses' high watermark, never from
ListOffsets (the embedded Tansu broker under-reports that). With ``.option("decode", "true")``
(the job's default) ``read()`` yields decoded telemetry rows (``streaming.decode.DECODED_SCHEMA``)
itself, so decoding is not a separate ``mapInArrow`` stage, with its own worker round trip.

Idle batching: with ``minBatchMessages`` N, a micro-batch waits until N new messages are there
or ``maxBatchWaitMs`` has passed since the first of them. At idle only machine records come
(a node sample and a heartbeat a second), so the job runs a batch every couple of seconds
instead of every trigger; under load every agent sends several messages a trigger and
nothing waits. After ``QUIET_AFTER_S`` in which messages came slower than ``BUSY_RATE``, the job
is quiet: a batch waits up to ``quietBatchWaitMs``, and only messages coming at that rate (a run
began) start one at once. A run's close, its drop timeout after its last send, falls in the
minute before, with batches as often as before: from its last stop to its close, the job's own heartbeats come ten a
second (``streaming.job.CLOSING_HEARTBEAT_S``), more than ``minBatchMessages`` a trigger, so nothing waits.

Read tasks run in pyspark's reused Python workers: a worker keeps its consumer between tasks
(a new one costs a connection and a metadata round trip per partition per batch) and calls
``gc.freeze()`` at each task's start, since the pyspark daemon runs a full ``gc.collect()``
after every task, which on a worker that imported pyarrow, pandas and pyspark cost ~50 ms of
CPU a task: at two batches a second, a third of a core for nothing.

The archive's source, for replay, is ``streaming.archive``.
"""
from __future__ import annotations

import time
from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, SupportsTriggerAvailableNow

from core.slices import NO_TOPIC_CREATION, RETIRE_GRACE_S, is_ours, read_order
from streaming import topics
from streaming.consumers import (
    client_config,
    close_worker_consumers,  # noqa: F401 - for tests reading in-process
    topic_id_text,
)
from streaming.partition_read import PartitionRead

KAFKA_SCHEMA = (
    "key binary, value binary, topic string, partition int, offset bigint, "
    "timestamp timestamp, timestampType int"
)
HIGHWATER_WAIT_S = 1.0
"""How long the planner waits for every partition's high watermark before using what it has."""
QUIET_AFTER_S = 60.0
"""A minute in which messages came slower than ``BUSY_RATE`` (machine records only): the job is quiet."""
BUSY_RATE = 5.0
"""Messages a second that say a run is on: at idle a node sample, a heartbeat and the job's own records come, ~2 a
second; in a run each writer (the load generator, each receiver) sends one every 100 ms at least."""

class _KafkaPartition(InputPartition):
    def __init__(self, topic: str, partition: int, start: int, end: int, reset: dict | None = None,
                 topic_id: str | None = None) -> None:
        self.topic, self.partition, self.start, self.end, self.topic_id = topic, partition, start, end, topic_id
        self.reset = reset  # the first read after the broker lost its data also writes the record that says so


class KafkaDataSource(DataSource):
    """``spark.readStream.format("flightwatch_kafka").option("bootstrap", ...).option("subscribe", topic)``.

    Options: ``bootstrap`` (host:port,...), ``subscribe`` (one topic), ``startingOffsets``
    (earliest | latest), ``maxOffsetsPerTrigger`` (messages per micro-batch), ``decode`` (true: decoded rows),
    ``run`` (with ``decode``: only the rows that run's job reads, ``streaming.membership``) and any
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
    """Reads the topic and its time slices (``core.slices``; offsets and planning: ``streaming.topics``)."""

    def __init__(self, options: dict) -> None:
        self.options = options
        self.topic = options["subscribe"]
        self.max_rows = int(options["maxoffsetspertrigger"]) if options.get("maxoffsetspertrigger") else None
        self.decode = _decoding(options)
        self.run_id = options.get("run")
        self.min_messages = int(options.get("minbatchmessages", 1))
        self.max_wait_s = int(options.get("maxbatchwaitms", 0)) / 1000
        # no idle wait (a batch at every trigger) is no quiet wait either
        self.quiet_wait_s = max(int(options.get("quietbatchwaitms", 0)) / 1000, self.max_wait_s) if self.max_wait_s else 0.0
        self._busy_at = time.monotonic()  # the last planning that saw messages come at BUSY_RATE (at first, the start)
        self._last_new = 0  # the new messages the last planning saw (a batch that waits keeps its start)
        self._last_at = self._busy_at  # when it planned
        self.grace_s = int(options.get("slicegracems", RETIRE_GRACE_S * 1000)) / 1000
        self._pending_since: float | None = None
        self._known_end: dict[tuple[str, int], int] = {}
        self._fresh_end: dict[tuple[str, int], int] = {}  # what the last fetch answered, even below what is known
        self._available_now_end: dict | None = None
        self._admin = None
        self._strikes: dict[str, int] = {}  # plannings in a row that found a topic gone or behind the job

    def __getstate__(self):
        d = dict(self.__dict__)
        d["_admin"] = None
        return d

    # --- planning (driver side) ---
    def _new_consumer(self):
        """A librdkafka consumer for one planning's high watermarks, closed at its end: librdkafka 2.16 crashed the
        process (a segfault in ``rd_kafka_metadata_cache_find``) when a topic a live consumer had fetched from was
        deleted, even unassigned, and slices are deleted, brokers restarted empty. One costs ~1.6 ms of CPU and ~23 ms
        (measured on the embedded broker); kept assigned it would also fetch ahead, and every fetch on Tansu scans
        what the broker holds. The topics are listed by the admin client, which fetches nothing."""
        from confluent_kafka import Consumer

        return Consumer({
            "group.id": "flightwatch-spark-planner",
            "enable.auto.commit": False, "enable.auto.offset.store": False, "enable.partition.eof": True,
            "auto.offset.reset": "earliest", "fetch.wait.max.ms": 20, "max.partition.fetch.bytes": 1024,
            "queued.max.messages.kbytes": 64,
            **NO_TOPIC_CREATION, **client_config(self.options)})  # asking about a deleted slice must not create it

    def _admin_client(self):
        if self._admin is None:
            from confluent_kafka.admin import AdminClient

            self._admin = AdminClient({**NO_TOPIC_CREATION, **client_config(self.options)})
        return self._admin

    def _listing(self) -> dict[str, tuple[str | None, list[int]]] | None:
        """The topic and its slices on the broker: ID and partitions (a Metadata request, and a DescribeTopicPartitions
        for the IDs); None if it is away."""
        from confluent_kafka import KafkaException, TopicCollection

        try:
            found = self._admin_client().list_topics(timeout=5).topics
        except KafkaException:
            return None
        ours = sorted(t for t, m in found.items() if is_ours(self.topic, t) and m.error is None)
        ids: dict[str, str | None] = {}
        if ours:
            try:
                described = self._admin_client().describe_topics(TopicCollection(ours), request_timeout=5)
            except KafkaException:
                return None
            for t, f in described.items():
                try:
                    ids[t] = topic_id_text(f.result(10).topic_id)
                except Exception:  # noqa: BLE001 - deleted meanwhile: not listed
                    ids.pop(t, None)
        return {t: (ids.get(t), sorted(found[t].partitions)) for t in ours if t in ids}

    def _high_watermarks(self, listing: dict) -> None:
        """Each partition's high watermark from a fresh Fetch response (exact, unlike ListOffsets on Tansu): the
        consumer is assigned one record before the known end, so the broker answers at once with that record (or the
        partition's end), and the watermark cached from that answer is read. A partition that does not answer there
        (its log is shorter now: a broker that lost its data) is asked again from its last record."""
        from confluent_kafka import OFFSET_END, KafkaError, TopicPartition

        pending = {(t, p) for t, (_, parts) in listing.items() for p in parts}
        self._fresh_end = {}
        if not pending:
            return
        c = self._new_consumer()
        try:
            for start, share in ((lambda k: max(self._known_end.get(k, 0) - 1, 0), 0.5), (lambda k: OFFSET_END, 1.0)):
                if not pending:
                    break
                c.assign([TopicPartition(t, p, start((t, p))) for t, p in sorted(pending)])
                deadline = time.monotonic() + HIGHWATER_WAIT_S * share
                while pending and time.monotonic() < deadline:
                    for m in c.consume(len(pending), 0.05):
                        k = (m.topic(), m.partition())
                        if k not in pending or (m.error() is not None and m.error().code() != KafkaError._PARTITION_EOF):
                            continue
                        hw = c.get_watermark_offsets(TopicPartition(*k), cached=True)[1]
                        if hw >= 0:
                            self._fresh_end[k] = hw
                            pending.discard(k)
        finally:
            c.close()

    def _view(self) -> topics.View:
        listing = self._listing()
        if listing is not None:
            self._high_watermarks(listing)
        return topics.View(listing, self._fresh_end, self._known_end)

    def _learn(self, start: dict, end: dict) -> None:
        """Keep the highest end seen of each topic read on; a topic read anew (a new slice, one the broker lost, one
        back under a new ID) from this planning's answers."""
        going_on = set(topics.start_of(end, start, self.topic)) | set(topics.retired_of(start)) if start else set()
        known = {}
        for k, hw in self._known_end.items():
            if k[0] in going_on:
                known[k] = hw
        reading = set(end["topics"]) | set(topics.retired_of(end))
        for k, hw in self._fresh_end.items():
            if k[0] in reading:
                known[k] = max(hw, known.get(k, 0))
        self._known_end = {k: v for k, v in known.items() if k[0] in reading}

    def initialOffset(self) -> dict:
        view = self._view()
        if not view.listing:
            raise RuntimeError(f"topic {self.topic!r} does not exist" if view.listing is not None
                               else f"telemetry broker {self.options.get('bootstrap')} unreachable")
        latest = self.options.get("startingoffsets", "earliest") == "latest"
        ends = {t: {str(p): self._fresh_end.get((t, p), 0) if latest else 0 for p in parts}
                for t, (_, parts) in view.listing.items()}
        self._learn({}, {"topics": ends})
        return topics.offsets_of(ends, {t: tid for t, (tid, _) in view.listing.items() if tid}, {}, 0)

    def getDefaultReadLimit(self):
        return ReadMaxRows(self.max_rows) if self.max_rows else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        listing = self._listing() or {}
        self._high_watermarks(listing)
        self._available_now_end = {t: {str(p): self._fresh_end.get((t, p), 0) for p in parts}
                                   for t, (_, parts) in listing.items()}

    def latestOffset(self, start: dict, limit) -> dict:
        made = topics.plan(start, self._view(), self.topic, self._strikes, grace_s=self.grace_s)
        end = made.end
        self._learn(start, end)
        for t in made.delete:
            self._delete(t)
        if made.reset is not None:  # the job logs it, once, when its engine takes the batch's ``reset`` record
            self._available_now_end = None
            return end
        ends, begin = topics.topic_offsets(end, self.topic), topics.start_of(end, start, self.topic)
        if self._available_now_end is not None:  # up to what was there when asked, no more
            for t, parts in ends.items():
                cap = self._available_now_end.get(t, {})
                for p in parts:
                    parts[p] = max(min(parts[p], cap.get(p, 0)), begin.get(t, {}).get(p, 0))
                end["topics"][t].update(parts)
        pairs = topics.ordered(self.topic, ends)
        new = sum(ends[t][p] - begin.get(t, {}).get(p, 0) for t, p in pairs)
        if self._available_now_end is None and self._hold(new):
            return start
        if isinstance(limit, ReadMaxRows):  # oldest first: a slice's records before the next one's
            budget = limit.max_rows
            for t in sorted(ends, key=lambda t: read_order(self.topic, t)):
                share = max(budget // max(len(ends[t]), 1), 1) if budget > 0 else 0
                for p in sorted(ends[t], key=int):
                    was = begin.get(t, {}).get(p, 0)
                    ends[t][p] = min(ends[t][p], was + share)
                    budget -= ends[t][p] - was
        for t, parts in ends.items():
            end["topics"][t].update(parts)
        return end

    def _delete(self, topic: str) -> None:
        """Delete a slice read to its end (``streaming.topics``); a failure is tried again at the next planning."""
        try:
            self._admin_client().delete_topics([topic], request_timeout=5)[topic].result(10)
        except Exception:  # noqa: BLE001 - away: it stays retired, and is deleted later
            pass

    def _hold(self, num_new: int, now: float | None = None) -> bool:
        """Whether ``num_new`` new messages wait for more: fewer than ``min_messages`` and not yet ``max_wait_s``;
        once quiet, not yet ``quiet_wait_s`` and none coming at ``BUSY_RATE`` since the last planning."""
        now = time.monotonic() if now is None else now
        arrived, self._last_new = num_new - self._last_new, num_new
        if arrived >= BUSY_RATE * max(now - self._last_at, 0.5):  # a batch that ran long: more arrived since
            self._busy_at = now
        self._last_at = now
        quiet = now - self._busy_at >= QUIET_AFTER_S
        if num_new <= 0 or (num_new >= self.min_messages and not quiet):
            self._pending_since, self._last_new = None, 0
            return False
        if self._pending_since is None:
            self._pending_since = now
        if now - self._pending_since < (self.quiet_wait_s if quiet else self.max_wait_s):
            return True
        self._pending_since, self._last_new = None, 0
        return False

    def reportLatestOffset(self):
        known: dict = {}
        for (t, p), o in self._known_end.items():
            known.setdefault(t, {})[str(p)] = o
        return {"topics": known} if known else None

    def partitions(self, start: dict, end: dict):
        reset = None
        if end.get("resets", 0) > start.get("resets", 0):  # a lost topic is read again from its start
            reset = {"at_ns": end["reset_at_ns"], "reason": end["reset_reason"], "count": end["reset_lost"]}
        begin, ends = topics.start_of(end, start, self.topic), topics.topic_offsets(end, self.topic)
        ids = topics.topic_ids(end)
        out = [_KafkaPartition(t, int(p), begin.get(t, {}).get(p, 0), ends[t][p], topic_id=ids.get(t))
               for t, p in topics.ordered(self.topic, ends) if ends[t][p] > begin.get(t, {}).get(p, 0)]
        if reset is not None:  # the first task also writes the record that says so
            out = out or [_KafkaPartition(self.topic, 0, 0, 0)]
            out[0].reset = reset
        return out

    def commit(self, end: dict) -> None:
        pass

    def stop(self) -> None:
        self._admin = None

    # --- reading (executor side): stateless, exactly [start, end) ---
    def read(self, partition: _KafkaPartition) -> Iterator[pa.RecordBatch]:
        return PartitionRead(self.options, partition, self.decode, self.run_id).rows()


def _decoding(options: dict) -> bool:
    return str(options.get("decode", "false")).lower() == "true"
