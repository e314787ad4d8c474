"""The Kafka receiver: consume a topic of the system under test and record the receive time of every event.

librdkafka's consumer (confluent-kafka). Each consumed record gives a receive record: event ID from the record key (or the ``ce_id``
header), run ID from the ``ce_fwrun`` header the load generator sets (or ``fw_run``, as older runs did), receive
time = when the
agent saw it.

It never waits on telemetry: receive records go to a disk spool (``agents.spool``) that a shipper process tails into
the telemetry topic, as the HTTP receiver's do, so a telemetry broker that is slow or away never holds up consuming
(its events would wait in the SUT and their flight time would be flightwatch's outage). The spool is bounded; lines
past its budget are counted as lost and said so in the telemetry.

Restart-safe without losing or double-reporting: before a batch's receive records go to the spool, the batch (with
the offsets after it) is appended to ``<state-dir>/wal`` (``core.wal``: it survives a crash or kill -9 of the agent
at any point, not a power loss of the host). On restart the agent spools that batch again *identically* and continues
from its offsets; the streaming job treats an identical repeat of a first delivery (same event ID and receive time) as
a telemetry repeat, not a duplicate.
"""
from __future__ import annotations

import json
import os
import time

from core import cloudevents, contract
from core.wal import WriteAheadLog

FETCH_MAX_WAIT_MS = 25
"""A Kafka broker holds a fetch until a message comes or this long. Tansu 0.6 (the embedded SUT) holds it this
long under a steady flow, so it bounds what the receiver adds to flight time: at 5,000/s, consume latency
p50/p99 was 138/266 ms at 500 ms, 32/60 at 100, 13/24 at 25, 9/16 at 10; its CPU over 30 s, 0.33 core at 10,
0.28 at 25, 0.23 at 50 (fewer fetches). Idle, 40 round trips a second cost the receiver 0.005 core and the
broker, holding a finished run's 300,000 events, 0.025."""
CONSUME_BATCH = 5000
TOPIC_CHECK_S = 1.0
"""How often the receiver asks for the SUT topic's ID (``KafkaReceiver.check_topic``): one small request."""
RUN_HEADER = cloudevents.KAFKA_RUN_HEADER
ID_HEADER = cloudevents.KAFKA_ID_HEADER


def _header(headers, name: str) -> str | None:
    for k, v in headers or ():
        if k == name and v is not None:
            return v.decode("utf-8", "replace")
    return None


class KafkaReceiver:
    """Consumes every partition of the SUT topic with librdkafka (confluent-kafka's ``Consumer``)."""

    def __init__(self, consumer, spool, topic: str, state_dir: str, agent: str, log=print, warn=None, admin=None,
                 from_end: bool = False, share: tuple[int, int] = (0, 1), routes: bool = False) -> None:
        """``spool``: an ``agents.spool.SpoolWriter`` (``append(line) -> bool``, never blocks). ``from_end``: a first
        start (no write-ahead log yet) takes up each partition at its end, not its start (a topic of the user's, with
        what other runs and other producers left in it). ``share`` (I, N): the partitions p with p mod N == I, one of
        N receivers that split the topic (competing consumers without a group: ``--receivers N``). ``routes``: each
        receive names its partition as its route (``contract.Receive``): the topic is where the load generator sends,
        so a receive on another partition than its send's is misrouted."""
        self.consumer, self.spool, self.topic, self.admin = consumer, spool, topic, admin
        self.from_end, self.share, self.routes = from_end, share, routes
        self.wal = WriteAheadLog(os.path.join(state_dir, "wal"))
        self.agent, self.log, self.warn = agent, log, warn or log
        self.lines = contract.FastLines("", agent)
        self._where: dict[tuple[str, int], str] = {}  # (topic, partition) -> a receive line's end (``contract.Receive``)
        os.makedirs(state_dir, exist_ok=True)
        self.num_received = 0
        self.num_unattributed = 0
        self.num_errors = 0
        self.num_skipped = 0  # offsets the broker never served: a later offset came first (see poll_once)
        self.positioned: set[str] = set()  # partitions whose next offset is known (from the log, or read since)
        self.topic_id: str | None = None   # the SUT topic's ID: a new one means its log was lost (``check_topic``)
        self.num_resets = 0
        self._skip_logged = -1e9

    def counters(self) -> dict:
        """The ``agents.source.Source`` counts, with the consumer's own."""
        out = {"agent": self.agent, "received": self.num_received, "unattributed": self.num_unattributed,
               "consumer_errors": self.num_errors, "skipped_offsets": self.num_skipped, "topic_resets": self.num_resets}
        if self.spool is not None:
            out["telemetry"] = self.spool.counters()
        return out

    def collect(self):
        """The counters as Prometheus metric families, read at scrape time."""
        from core.metrics import family

        agent = self.agent
        for name, value, text in (("events", self.num_received, "events received from the SUT topic and recorded"),
                                  ("unattributed", self.num_unattributed,
                                   "messages without a run or event ID, not recorded"),
                                  ("consumer_errors", self.num_errors, "errors the consumer reported (a broker away, "
                                   "...)"),
                                  ("skipped_offsets", self.num_skipped, "offsets the broker never served: a later one "
                                   "came first, and the consumer moved on (their events count as dropped)"),
                                  ("topic_resets", self.num_resets, "times the SUT topic came back under a new ID (its "
                                   "log lost) and was read again from its start")):
            yield family("counter", f"flightwatch_kafka_receiver_{name}", text, ["agent"], [((agent,), value)])
        c = self.spool.counters()
        yield family("counter", "flightwatch_kafka_receiver_spooled_records", "receive records put in the telemetry "
                     "spool (the shipper sends them on)", ["agent"], [((agent,), c["spooled"])])
        yield family("counter", "flightwatch_kafka_receiver_spool_lost_records", "receive records refused: the spool "
                     "was over its budget (the telemetry broker away for long)", ["agent"], [((agent,), c["lost"])])
        yield family("gauge", "flightwatch_kafka_receiver_spool_over_budget", "1 while the spool is over its budget",
                     ["agent"], [((agent,), int(c["over_budget"]))])

    def progress(self) -> tuple[tuple, str]:
        c = self.counters()
        t = c["telemetry"]
        return ((c["received"], c["unattributed"], c["consumer_errors"], c["skipped_offsets"], c["topic_resets"],
                 t["lost"]),
                f"receiver {self.agent}: {c['received']:,} received, {c['unattributed']:,} without run/event ID, "
                f"{c['consumer_errors']:,} consumer errors, {c['skipped_offsets']:,} offsets never served, "
                f"{c['topic_resets']} topic resets; telemetry spooled {t['spooled']:,} lost {t['lost']:,}")

    def _write_ahead(self, offsets: dict, records: list[str]) -> None:
        """First line: the offsets after the batch; then the batch's receive records, one per line."""
        self.wal.write("\n".join([json.dumps(offsets), *records]).encode())

    def _send(self, records: list[str]) -> None:
        append = self.spool.append
        for line in records:
            append(line)

    def start(self) -> dict:
        """Assign every partition; resume from the write-ahead log (re-sending its batch), or from the start (from the
        end with ``from_end``: those offsets are written ahead at once, so a restart resumes from them)."""
        from confluent_kafka import KafkaException, TopicPartition

        parts = None
        for _ in range(100):
            try:
                topic = self.consumer.list_topics(self.topic, timeout=5).topics.get(self.topic)
            except KafkaException:
                topic = None
            parts = sorted(topic.partitions) if topic is not None and topic.error is None else None
            if parts:
                break
            time.sleep(0.1)
        if not parts:
            raise RuntimeError(f"topic {self.topic!r} not found")
        parts = self._mine(parts)
        if not parts:
            raise RuntimeError(f"topic {self.topic!r} has fewer partitions than receivers share it "
                               f"(this is share {self.share[0]} of {self.share[1]})")
        offsets = {str(p): 0 for p in parts}
        if (last := self.wal.last()) is not None:
            lines = last.decode().split("\n")
            offsets.update(json.loads(lines[0]))
            self.positioned.update(json.loads(lines[0]))
            if lines[1:]:
                self._send(lines[1:])  # identical re-send of the batch that may not have arrived
                self.log(f"resumed: spooled again {len(lines) - 1} receive records of the last batch")
        elif self.from_end:
            for p in parts:
                offsets[str(p)] = self.consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=10)[1]
            self.positioned.update(offsets)
            self._write_ahead(offsets, [])
            self.log(f"from the topic's end: {sum(offsets.values()):,} earlier records in {len(parts)} partitions "
                     "left alone")
        self.consumer.assign([TopicPartition(self.topic, p, int(offsets[str(p)])) for p in parts])
        return offsets

    def _mine(self, parts: list[int]) -> list[int]:
        """This receiver's share of the topic's partitions."""
        i, n = self.share
        return [p for p in parts if p % n == i]

    def check_topic(self, offsets: dict) -> bool:
        """Whether the SUT topic came back under a new ID (a broker on memory storage that was restarted, a topic
        deleted and created): then its new log is read from the start, on whatever partitions it has now. Tansu
        answers a fetch past a log's end with nothing, not an out-of-range error, so without this the receiver waits
        at its old offsets and then skips the new log's first records. True if it was reset."""
        from confluent_kafka import TopicCollection, TopicPartition

        if self.admin is None:
            return False
        try:
            found = self.admin.describe_topics(TopicCollection([self.topic]), request_timeout=2)[self.topic].result(3)
        except Exception:  # noqa: BLE001 - the broker away, the topic not there yet: ask again later
            return False
        topic_id, parts = str(found.topic_id), self._mine(sorted(p.id for p in found.partitions))
        if self.topic_id in (None, topic_id):
            self.topic_id = topic_id
            return False
        self.warn(f"topic {self.topic} came back under a new ID ({self.topic_id} -> {topic_id}, {len(parts)} partitions): "
                  "the SUT broker lost its data; reading its new log from the start")
        self.topic_id = topic_id
        self.num_resets += 1
        offsets.clear()
        offsets.update({str(p): 0 for p in parts})
        self.positioned = set(offsets)
        self.consumer.assign([TopicPartition(self.topic, p, 0) for p in parts])
        return True

    def _skipped(self, part: str, expected: int, got: int) -> None:
        """The broker served ``got`` where ``expected`` was next. A consumer moves on from there, as every Kafka
        consumer does: offsets of transaction markers and compacted records are never served, and events in a hole
        are never received (the job counts them dropped, as the SUT's own consumers would miss them). Seen with
        Tansu 0.6 at 20,000 events/s: a fetch at the log's end returned a batch before an earlier one was readable
        (5 holes of 36-56 offsets in 400,000, all readable later). Logged at most every 10 s."""
        self.num_skipped += got - expected
        if time.monotonic() - self._skip_logged >= 10:
            self._skip_logged = time.monotonic()
            self.warn(f"partition {part}: the broker served offset {got} where {expected} was next ({got - expected} "
                     f"offsets never served; {self.num_skipped:,} so far): a transaction marker or compaction, or "
                     "the broker made a later batch readable before an earlier one (those events count as dropped)")

    def poll_once(self, offsets: dict, timeout_ms: int = 100) -> int:
        # consume(n, timeout) waits for n messages or the timeout, so at 5,000/s every batch waited the whole
        # timeout (flight p50 +50 ms): take what is there, else wait for one message, then take the rest
        batch = self.consumer.consume(CONSUME_BATCH, 0)
        if not batch:
            first = self.consumer.poll(timeout_ms / 1000)
            if first is None:
                return 0
            batch = [first, *self.consumer.consume(CONSUME_BATCH - 1, 0)]
        now = time.time_ns()
        records = []
        recv, lines = records.append, self.lines
        for m in batch:
            if m.error() is not None:  # a consumer event (partition EOF, broker transport): nothing to record
                self.num_errors += 1
                continue
            headers = m.headers()
            key = m.key()
            event_id = _header(headers, ID_HEADER) or (key.decode("utf-8", "replace") if key else None)
            run_id = _header(headers, RUN_HEADER) or _header(headers, cloudevents.LEGACY_KAFKA_RUN_HEADER)
            part, offset = str(m.partition()), m.offset()
            if offset > offsets.get(part, offset) and part in self.positioned:  # not a log's first offset
                self._skipped(part, offsets[part], offset)
            elif offset < offsets.get(part, offset):
                self.warn(f"partition {part}: the log went back from offset {offsets[part]} to {offset} (the SUT broker "
                          "lost its data, or the topic was recreated): reading on from there")
            offsets[part] = offset + 1
            self.positioned.add(part)
            if not event_id or not run_id:
                self.num_unattributed += 1
                continue
            value = m.value()
            place = (m.topic(), m.partition())
            where = self._where.get(place) or self._where.setdefault(
                place, lines.where(place[0], place[1] if self.routes else None))
            recv(lines.recv(run_id, now, event_id, len(value) if value else 0, where))
        self._write_ahead(offsets, records)
        self._send(records)
        self.num_received += len(records)
        return len(records)
