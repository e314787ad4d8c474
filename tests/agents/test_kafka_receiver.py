"""The Kafka receiver's bookkeeping of offsets, on messages given in a set order.

A stub consumer stands in for librdkafka here, and says so: the real case (a broker serving a later batch before an
earlier one) depends on load and timing. Tansu 0.6 did it at 20,000 events/s (5 holes of 36-56 offsets in 400,000,
every message readable afterwards), not at 5,000/s, and cannot be made to do it on demand."""
from __future__ import annotations

from agents.spool import SpoolWriter
from transports.kafka.receiver import ID_HEADER, RUN_HEADER, KafkaReceiver


class _Message:
    def __init__(self, partition: int, offset: int) -> None:
        self._p, self._o = partition, offset

    def error(self):
        return None

    def partition(self):
        return self._p

    def topic(self):
        return "t"

    def offset(self):
        return self._o

    def key(self):
        return None

    def value(self):
        return b"x" * 10

    def headers(self):
        return [(ID_HEADER, f"e-{self._p}-{self._o}".encode()), (RUN_HEADER, b"r")]


class _Consumer:
    def __init__(self, batches) -> None:
        self.batches = list(batches)

    def consume(self, n, timeout):
        return self.batches.pop(0) if self.batches else []

    def poll(self, timeout):
        return None


def test_offsets_the_broker_never_served_are_counted_once_and_logged_once(tmp_path):
    """Partition 0 serves 0-4, then 10-12 (5-9 never served), then 13 and later 20 (14-19 never served); partition 1
    starts at offset 7 (a log's first offset, as after retention: not a hole). 11 offsets are never served, counted
    once, logged once (the log is rate-limited); every served message gets its receive record."""
    batches = [[_Message(0, o) for o in range(5)] + [_Message(1, 7)],
               [_Message(0, o) for o in (10, 11, 12)],
               [_Message(0, 13), _Message(0, 20), _Message(1, 8)]]
    logged: list[str] = []
    spool = SpoolWriter(str(tmp_path / "spool"), segment_bytes=1 << 20)
    r = KafkaReceiver(_Consumer(batches), spool, "t", str(tmp_path), "receiver-kafka", log=logged.append)
    offsets = {"0": 0, "1": 0}
    got = sum(r.poll_once(offsets) for _ in batches)
    assert got == 5 + 1 + 3 + 3 and r.num_received == got
    assert r.num_skipped == 5 + 6, r.num_skipped
    assert offsets == {"0": 21, "1": 9}
    assert len(logged) == 1 and "offset 10 where 5 was next" in logged[0], logged
    assert spool.counters() == {"spooled": got, "lost": 0, "over_budget": False}  # each receive record is in the spool
