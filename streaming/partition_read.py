"""One read task of the ``flightwatch_kafka`` source (``streaming.sources``): exactly the offsets ``[start, end)`` of
one partition of one topic, stateless, in a pyspark Python worker that keeps its consumer between tasks
(``streaming.consumers``).

Records of a suspect consumer (new, or after a client error) are handed on only once the broker confirms the topic
is the one planned; a read whose topic the broker lost stops and says so (the next planning reads the new log). With
``decode`` the rows are decoded telemetry (``streaming.decode.DECODED_SCHEMA``), only those the run's job reads
when ``run_id`` is given (``streaming.membership``); else Kafka's columns (``KAFKA_ARROW_SCHEMA``).
"""
from __future__ import annotations

import gc
import sys
import time
from collections.abc import Iterator

import pyarrow as pa

from streaming.consumers import (
    CONFIRM_WAIT_S,
    STALL_CHECK_S,
    _drop_worker_consumer,
    _worker_consumer,
    release_worker_consumer,
    topic_state,
)

KAFKA_ARROW_SCHEMA = pa.schema([
    pa.field("key", pa.binary()), pa.field("value", pa.binary()), pa.field("topic", pa.string()),
    pa.field("partition", pa.int32()), pa.field("offset", pa.int64()),
    pa.field("timestamp", pa.timestamp("us", tz="UTC")), pa.field("timestampType", pa.int32()),
])
READ_WAIT_S = 600
"""How long a read task waits for the broker (away, restarting) before failing its batch; the job
resumes from its checkpoint when restarted."""
READ_CHUNK = 10_000


def _kafka_batch(rows: list[tuple]) -> pa.RecordBatch:
    cols = list(zip(*rows))
    return pa.RecordBatch.from_arrays(
        [pa.array(c, type=f.type) for c, f in zip(cols, KAFKA_ARROW_SCHEMA)], schema=KAFKA_ARROW_SCHEMA
    )


class PartitionRead:
    """``rows()``: the partition's range as Arrow record batches (``partition``: ``streaming.sources._KafkaPartition``)."""

    def __init__(self, options: dict, partition, decode: bool, run_id: str | None) -> None:
        self.options, self.partition, self.decode, self.run_id = options, partition, decode, run_id

    def rows(self) -> Iterator[pa.RecordBatch]:
        partition = self.partition
        gc.freeze()  # what this worker holds now is never scanned again by the daemon's per-task collect
        deadline = time.monotonic() + READ_WAIT_S
        topic_id = getattr(partition, "topic_id", None)
        reading = _worker_consumer(self.options, partition.topic, partition.partition, topic_id)
        reading.assign(partition.start)
        consumer = reading.consumer
        marker = [_reset_row(partition)] if partition.reset else []
        rows: list[tuple] = list(marker)
        next_offset = partition.start
        lost = ""
        check_at = time.monotonic() + STALL_CHECK_S
        try:
            while next_offset < partition.end:
                now = time.monotonic()
                if now > deadline:
                    raise RuntimeError(f"timed out reading {partition.topic}[{partition.partition}] at {next_offset} "
                                       f"(end {partition.end}) after {READ_WAIT_S} s")
                if now > check_at:  # stalled: the broker may have lost the topic (the next planning says so)
                    check_at = now + STALL_CHECK_S
                    state, why = topic_state(self.options, partition.topic, topic_id)
                    if state == "lost":
                        lost = why
                        break
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
                    check_at = time.monotonic() + STALL_CHECK_S
                if len(rows) >= 4096:
                    lost = self._confirm(reading, partition, deadline)
                    if lost:
                        break
                    yield from self._out(rows)
                    rows = marker = []  # the reset record is handed on once
            if not lost and len(rows) > len(marker):
                lost = self._confirm(reading, partition, deadline)
        finally:
            if next_offset >= partition.end and not lost:
                reading.unassign()
                release_worker_consumer(self.options, partition.topic, partition.partition)
            else:  # a failed, abandoned or lost read: the next task starts from a fresh consumer
                _drop_worker_consumer(self.options, partition.topic, partition.partition)
        if lost:  # what it read may be the new log's, under the old offsets: the next planning reads that log anew
            print(f"flightwatch source: {partition.topic}[{partition.partition}] {lost}: offsets {partition.start}.."
                  f"{partition.end} not read ({len(rows) - len(marker)} messages read since set aside)", file=sys.stderr,
                  flush=True)
            rows = marker
        if rows:
            yield from self._out(rows)

    def _confirm(self, reading, partition, deadline: float) -> str:
        """Before records of a suspect consumer (new, or after a client error) are handed on: why the topic is not the
        one planned, or "" once the broker says it is (asked again while it does not answer)."""
        while reading.suspect:
            reading.suspect = False  # an error from here on marks it again
            state, why = topic_state(self.options, partition.topic, getattr(partition, "topic_id", None))
            if state == "lost":
                return why
            if state == "unknown":
                reading.suspect = True
                if time.monotonic() > deadline:
                    raise RuntimeError(f"cannot confirm {partition.topic} is the topic planned: {why}")
                time.sleep(CONFIRM_WAIT_S)
        return ""

    def _out(self, rows: list[tuple]) -> Iterator[pa.RecordBatch]:
        if not self.decode:
            yield _kafka_batch(rows)
            return
        from streaming import membership
        from streaming.decode import DECODED_SCHEMA, decode_messages

        _, values, _, partitions, offsets, _, _ = zip(*rows)
        table = decode_messages(list(values), list(partitions), list(offsets)).cast(DECODED_SCHEMA)
        yield from (membership.read(table, self.run_id) if self.run_id else table).to_batches()


def _reset_row(partition) -> tuple:
    """A Kafka row (offset -1: no message of the topic) carrying the job's ``reset`` record, for every run."""
    from core import contract

    r = partition.reset
    line = contract.encode([contract.TelemetryReset(contract.ANY_RUN, "job", int(r["at_ns"]), where=partition.topic,
                                                    reason=r["reason"], count=int(r["count"]))])
    return (b"job", line, partition.topic, partition.partition, -1, int(r["at_ns"]) // 1000, -1)
