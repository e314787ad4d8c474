"""The Kafka Python Data Source against the real broker: exact ends, deterministic re-reads, admission control."""
import json
import time
import uuid

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows
from support import create_topic

from streaming.sources import KafkaStreamReader, close_worker_consumers
from streaming.topics import topic_offsets

pytestmark = pytest.mark.integration

NUM_MESSAGES = 1012


@pytest.fixture(scope="module")
def topic(broker):
    """A topic of its own each time the module's fixture is built: a worker that comes back to the module (a steal)
    builds it again on the same session broker, which filled one fixed topic twice."""
    name = f"sources-test-{uuid.uuid4().hex[:8]}"
    create_topic(broker, name, partitions=2)
    producer = KafkaProducer(bootstrap_servers=broker, linger_ms=20)
    for i in range(NUM_MESSAGES):
        producer.send(name, value=b"m%d" % i, partition=i % 2)
    producer.flush()
    producer.close()
    yield name
    close_worker_consumers()


def reader(broker, topic, **options):
    return KafkaStreamReader({"bootstrap": broker, "subscribe": topic, **options})


def _produce(bootstrap: str, topic: str, prefix: bytes, n: int) -> None:
    """``n`` messages ``<prefix>0`` ... into partition 0, acknowledged."""
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    for i in range(n):
        producer.send(topic, value=prefix + b"%d" % i, partition=0)
    producer.flush()
    producer.close()


def _parts(offsets: dict, topic: str | None = None) -> dict[str, int]:
    """The partitions' offsets of one topic (the only one if not named) in a source's offsets."""
    ends = topic_offsets(offsets, topic or "")
    return ends[topic] if topic else next(iter(ends.values()))


def test_end_offsets_are_exact_where_list_offsets_under_reports(broker, topic):
    r = reader(broker, topic)
    ends = _parts(r.latestOffset(r.initialOffset(), ReadAllAvailable()))  # the partitions' (offsets carry the topic ID too)
    assert ends == {"0": NUM_MESSAGES // 2, "1": NUM_MESSAGES // 2}
    consumer = KafkaConsumer(bootstrap_servers=broker)
    listed = consumer.end_offsets([TopicPartition(topic, 0), TopicPartition(topic, 1)])
    consumer.close()
    # Tansu's ListOffsets may answer less; the reader must never trust it
    assert all(v <= NUM_MESSAGES // 2 for v in listed.values())
    r.stop()


def test_reading_a_range_twice_gives_the_same_rows(broker, topic):
    r = reader(broker, topic)
    parts = r.partitions({"0": 100, "1": 0}, {"0": 300, "1": 506})
    assert [(p.partition, p.start, p.end) for p in parts] == [(0, 100, 300), (1, 0, 506)]
    first = [b.to_pylist() for p in parts for b in r.read(p)]
    second = [b.to_pylist() for p in parts for b in r.read(p)]
    rows = [row for batch in first for row in batch]
    assert first == second and len(rows) == 200 + 506
    assert [row["offset"] for row in rows if row["partition"] == 0] == list(range(100, 300))
    assert {row["value"] for row in rows if row["partition"] == 0} == {b"m%d" % (2 * o) for o in range(100, 300)}


def test_a_kept_consumer_reads_consecutive_ranges_and_one_back_exactly(broker, topic):
    """A worker keeps its consumer between read tasks: consecutive ranges, and one back, are each read exactly."""
    r = reader(broker, topic)
    offsets = []
    for start, end in ((0, 50), (50, 51), (51, 400), (10, 20), (400, 506)):
        rows = [row for b in r.read(r.partitions({"1": start}, {"1": end})[0]) for row in b.to_pylist()]
        offsets.append([row["offset"] for row in rows])
        assert {row["value"] for row in rows} == {b"m%d" % (2 * o + 1) for o in range(start, end)}
        assert all(row["timestampType"] == 0 and row["partition"] == 1 for row in rows)  # CreateTime, as Spark's
    assert offsets == [list(range(s, e)) for s, e in ((0, 50), (50, 51), (51, 400), (10, 20), (400, 506))]


def test_admission_control_caps_messages_per_batch(broker, topic):
    r = reader(broker, topic, maxoffsetspertrigger="100")
    assert r.getDefaultReadLimit() == ReadMaxRows(100)
    start = r.initialOffset()
    end = r.latestOffset(start, ReadMaxRows(100))
    assert sum(_parts(end).values()) - sum(_parts(start).values()) == 100
    assert _parts(r.latestOffset(end, ReadAllAvailable())) == {"0": 506, "1": 506}
    r.stop()


def test_available_now_stops_at_the_end_seen_at_start(broker, topic):
    r = reader(broker, topic)
    r.prepareForTriggerAvailableNow()
    producer = KafkaProducer(bootstrap_servers=broker)
    producer.send(topic, value=b"later", partition=0)
    producer.flush()
    producer.close()
    assert _parts(r.latestOffset(r.initialOffset(), ReadAllAvailable())) == {"0": 506, "1": 506}
    r.stop()


def test_offsets_carry_the_topics_id_and_a_recreated_topic_is_read_from_its_start(broker):
    """A broker that lost its data has the topic under a new ID: the next offsets say so (a reset, when, why and
    how many messages the reader knew of and had not read), and the batch reads the new log from its start, its
    first task also giving the job's ``reset`` record."""
    from kafka.admin import KafkaAdminClient

    name = "sources-reset"
    create_topic(broker, name, partitions=2)
    producer = KafkaProducer(bootstrap_servers=broker)
    for i in range(20):
        producer.send(name, value=b"old%d" % i, partition=i % 2)
    producer.flush()
    r = reader(broker, name)
    start = r.latestOffset(r.initialOffset(), ReadAllAvailable())
    assert _parts(start) == {"0": 10, "1": 10} and start["topics"][name]["id"]
    admin = KafkaAdminClient(bootstrap_servers=broker)
    admin.delete_topics([name])
    admin.close()
    create_topic(broker, name, partitions=2)
    for i in range(6):
        producer.send(name, value=b"new%d" % i, partition=i % 2)
    producer.flush()
    producer.close()
    end = r.latestOffset(start, ReadAllAvailable())
    assert _parts(end) == {"0": 3, "1": 3} and end["topics"][name]["id"] != start["topics"][name]["id"] and end["resets"] == 1
    assert "recreated" in end["reset_reason"] and end["reset_lost"] == 0
    parts = r.partitions(start, end)
    assert [(p.partition, p.start, p.end) for p in parts] == [(0, 0, 3), (1, 0, 3)]
    rows = [row for p in parts for b in r.read(p) for row in b.to_pylist()]
    assert sorted(row["value"] for row in rows if row["offset"] >= 0) == sorted(b"new%d" % i for i in range(6))
    (marker,) = [row for row in rows if row["offset"] < 0]
    assert b'"kind":"reset"' in marker["value"] and b"recreated" in marker["value"]
    again = r.latestOffset(end, ReadAllAvailable())  # the next batch goes on from there, with no reset
    assert _parts(again) == {"0": 3, "1": 3} and again["resets"] == 1 and "reset_reason" not in again
    assert r.partitions(end, again) == []
    r.stop()
    # offsets without the topic's ID (a checkpoint of an older version) past the log's end: a reset only once two
    # fresh fetches in a row say so (one could be a stale answer, and a false reset reads the topic again)
    r = reader(broker, name)
    old = {"0": 50, "1": 50}
    first = r.latestOffset(old, ReadAllAvailable())
    assert _parts(first, name) == old and "resets" not in first
    second = r.latestOffset(old, ReadAllAvailable())
    assert second["resets"] == 1 and "went back" in second["reset_reason"] and _parts(second, name) == {"0": 3, "1": 3}
    assert [(p.topic, p.partition, p.start, p.end) for p in r.partitions(old, second)] == [(name, 0, 0, 3), (name, 1, 0, 3)]
    r.stop()


@pytest.mark.parametrize("fate", ["recreated", "deleted"])
def test_a_read_planned_on_a_topic_the_broker_lost_ends_instead_of_waiting(broker, fate):
    """A batch planned just before the telemetry broker restarted empty: its read tasks wait for offsets the new log
    will never hold. After ``STALL_CHECK_S`` without a record a task asks the broker whether the topic is still the
    one planned (its ID); recreated or deleted, the task ends with what it read, and the next planning reports the
    reset. A topic that is still there is waited for."""
    from kafka.admin import KafkaAdminClient

    from streaming.consumers import STALL_CHECK_S, topic_state

    name = f"sources-lost-{fate}"
    create_topic(broker, name, partitions=1)
    _produce(broker, name, b"old", 8)
    r = reader(broker, name)
    start = r.initialOffset()
    end = r.latestOffset(start, ReadAllAvailable())
    (part,) = r.partitions(start, end)
    assert (part.start, part.end) == (0, 8) and part.topic_id
    part.start = 4  # half of it read by an earlier batch, the rest planned
    assert topic_state(r.options, name, part.topic_id) == ("same", "")  # still the one planned: a stalled read waits on
    admin = KafkaAdminClient(bootstrap_servers=broker)
    admin.delete_topics([name])
    admin.close()
    if fate == "recreated":
        create_topic(broker, name, partitions=1)
        _produce(broker, name, b"new", 1)  # the new log holds fewer than the planned start
    t0 = time.monotonic()
    rows = [row for b in r.read(part) for row in b.to_pylist()]
    took = time.monotonic() - t0
    assert rows == [] and STALL_CHECK_S <= took < 4 * STALL_CHECK_S, took
    if fate == "recreated":  # the next planning says what happened, and reads the new log from its start
        again = r.latestOffset(end, ReadAllAvailable())
        assert again["resets"] == 1 and "recreated" in again["reset_reason"] and _parts(again, name) == {"0": 1}
    r.stop()


def test_a_read_planned_before_the_broker_restarted_empty_never_hands_on_the_new_logs_records(tmp_path):
    """The telemetry broker killed (by its PID) and started again empty, the topic created again, and its new log
    already longer than a batch planned on the old one: the planned offsets now hold other records. The read task's
    kept consumer lost its connection (librdkafka's error callback), so before handing anything on it asks whether
    the topic is the one planned; it is not, so the task sets aside what it read and the next planning reads the new
    log from its start, with the reset."""
    import os
    import signal

    from support import free_port

    from stack.tansu import start_tansu

    port = free_port()
    bootstrap, name = f"127.0.0.1:{port}", "sources-restarted"
    broker = start_tansu(port, open(tmp_path / "tansu-1.log", "wb"), "flightwatch-restarted")
    try:
        create_topic(bootstrap, name, partitions=1)
        _produce(bootstrap, name, b"old", 8)
        r = reader(bootstrap, name)
        start = r.initialOffset()
        end = r.latestOffset(start, ReadAllAvailable())
        (part,) = r.partitions(start, end)
        part.end = 4  # an earlier batch: read by a consumer the worker keeps
        assert [row["value"] for b in r.read(part) for row in b.to_pylist()] == [b"old%d" % i for i in range(4)]
        part.start, part.end = 4, 8  # the batch planned just before the crash
        os.kill(broker.pid, signal.SIGKILL)
        broker.wait()
        broker = start_tansu(port, open(tmp_path / "tansu-2.log", "wb"), "flightwatch-restarted")
        create_topic(bootstrap, name, partitions=1)
        _produce(bootstrap, name, b"new", 10)
        assert [row for b in r.read(part) for row in b.to_pylist()] == []
        again = r.latestOffset(end, ReadAllAvailable())
        assert again["resets"] == 1 and "recreated" in again["reset_reason"] and _parts(again, name) == {"0": 10}
        (part,) = r.partitions(end, again)
        assert (part.start, part.end) == (0, 10)
        assert sorted(row["value"] for b in r.read(part) for row in b.to_pylist() if row["offset"] >= 0) == \
            sorted(b"new%d" % i for i in range(10))
        r.stop()
    finally:
        close_worker_consumers()
        broker.send_signal(signal.SIGKILL)
        broker.wait()


def test_time_slices_are_read_in_order_exactly_once_and_deleted_once_read(broker):
    """Real writers (the load generator's librdkafka writer and the agents' kafka-python one) write numbered records
    into 5 s slices for 16 s while the source plans and reads as Spark would (each batch from the last one's end,
    a 1 s grace): every record is read exactly once, slices past their grace are deleted from the broker once read,
    and writers never bring a deleted slice back (their producers do not create topics by asking for them)."""
    from kafka.admin import KafkaAdminClient

    from core.kafka_options import telemetry_producer
    from core.slices import TelemetryTopic, parse_slice
    from core.telemetry import TelemetryWriter

    base = "sources-sliced"
    create_topic(broker, base, partitions=3)
    writers = []
    for kind, make in (("rd", lambda t: telemetry_producer(broker, {}, **t.producer_settings())),
                       ("rd-5ms", lambda t: telemetry_producer(broker, {}, **{"linger.ms": 5}, **t.producer_settings()))):
        topic = TelemetryTopic(base, 5, broker, {})
        writers.append((kind, TelemetryWriter(make(topic), topic, agent=kind, records_per_message=20, linger_s=0.05)))
    r = reader(broker, base, slicegracems="1000")
    start, got, deleted, written = r.initialOffset(), [], set(), 0
    admin = KafkaAdminClient(bootstrap_servers=broker)

    def batch():
        nonlocal start
        end = r.latestOffset(start, ReadAllAvailable())
        for p in r.partitions(start, end):
            got.extend(line for b in r.read(p) for row in b.to_pylist() for line in row["value"].split(b"\n"))
        start = end
        deleted.update(end.get("retired", {}))

    t_end = time.time() + 16
    while time.time() < t_end:
        for kind, w in writers:
            for _ in range(50):
                w.write({"kind": "probe", "seq": f"{kind}-{written}"})
            written += 1
        time.sleep(0.1)
        batch()
    for _, w in writers:
        assert w.close(30)
    slices_seen = {t for t in admin.list_topics() if parse_slice(base, t)}
    deadline = time.time() + 20
    while time.time() < deadline and len(got) < 50 * written:
        batch()
        time.sleep(0.2)
    for _ in range(3):  # retire and delete what is over by now
        time.sleep(1.5)
        batch()
    seqs = [json.loads(line)["seq"] for line in got if line]
    assert len(seqs) == 50 * written and len(set(seqs)) == written  # every record once (50 per seq)
    left = {t for t in admin.list_topics() if parse_slice(base, t)}
    deleted -= set(start.get("retired", {}))  # retired lately: maybe not deleted yet
    assert len(deleted) >= 2 and not (deleted & left), (deleted, left)
    described = {t: len(admin.describe_topics([t])[0]["partitions"]) for t in left}
    assert set(described.values()) == {3}, described  # slices have the base topic's partitions
    from streaming.consumers import _CONSUMERS  # this process ran the read tasks: it keeps the newest slice's only

    assert len({key[1] for key in _CONSUMERS if parse_slice(base, key[1])}) == 1
    print(f"\n{written * 50} records in {len(slices_seen | deleted)} slices, {len(deleted)} deleted once read; left: {sorted(left)}")
    admin.close()
    r.stop()


def _batch_times(r: KafkaStreamReader, arrivals, until_s: float, trigger_s: float = 1.5) -> list[float]:
    """When batches run: plannings every ``trigger_s`` on a simulated clock, ``arrivals(t0, t1)`` new messages
    between two, a batch whenever ``_hold`` lets one go (its messages are then read)."""
    t0 = r._busy_at
    times, waiting, t = [], 0, 0.0
    while t < until_s:
        waiting += arrivals(t, t + trigger_s)
        t += trigger_s
        if waiting and not r._hold(waiting, now=t0 + t):
            times.append(t)
            waiting = 0
    return times


def test_a_quiet_job_runs_a_batch_at_most_every_quiet_interval_and_at_once_when_a_run_begins():
    """Idle traffic (2 machine messages a second): a batch every ~4 s in the job's first minute, then every 10 s
    (quiet); 30 messages in one trigger (a run's first, each writer a message every 100 ms) start one at once, and
    batches come as often as before for the next minute."""
    r = KafkaStreamReader({"subscribe": "t", "minbatchmessages": "8", "maxbatchwaitms": "2000",
                           "quietbatchwaitms": "10000"})
    def arrivals(a, b):
        return round(2 * b) - round(2 * a) + (30 if a <= 200 < b else 0)

    times = _batch_times(r, arrivals, 320)
    first_minute = [t for t in times if t <= 60]
    quiet = [t for t in times if 75 <= t < 200]
    gaps = [b - a for a, b in zip(quiet, quiet[1:])]
    assert len(first_minute) >= 12 and max(b - a for a, b in zip(first_minute, first_minute[1:])) <= 4.5
    assert gaps and all(9.9 <= g <= 12 for g in gaps), gaps
    assert any(200 < t <= 201.5 for t in times), [t for t in times if t > 190]
    after = [t for t in times if 202 < t <= 260]
    assert max(b - a for a, b in zip(after, after[1:])) <= 4.5, after
    later = [t for t in times if t > 270]  # a minute after the run's last message: quiet again
    assert all(b - a >= 9.9 for a, b in zip(later, later[1:])), later


def test_without_a_quiet_interval_a_batch_waits_as_before():
    r = KafkaStreamReader({"subscribe": "t", "minbatchmessages": "8", "maxbatchwaitms": "2000"})
    times = _batch_times(r, lambda a, b: round(2 * b) - round(2 * a), 300)
    assert max(b - a for a, b in zip(times, times[1:])) <= 4.5


def test_a_late_planning_after_a_long_batch_does_not_end_the_quiet_but_a_run_does():
    """What came in a long wait (a batch that ran 6 s) is judged as a rate, not a count: 9 messages in 6 s stay
    quiet; 18 in one 1.5 s trigger start a batch at once."""
    r = KafkaStreamReader({"subscribe": "t", "minbatchmessages": "8", "maxbatchwaitms": "2000",
                           "quietbatchwaitms": "10000"})
    t = r._busy_at + 100  # a quiet job
    assert r._hold(3, now=t)
    assert r._hold(12, now=t + 6)
    assert not r._hold(30, now=t + 7.5)


def test_no_idle_wait_is_no_quiet_wait_either():
    """``--idle-batch-interval 0`` (a batch at every trigger) holds nothing, quiet or not."""
    r = KafkaStreamReader({"subscribe": "t", "minbatchmessages": "8", "maxbatchwaitms": "0", "quietbatchwaitms": "10000"})
    assert not r._hold(1, now=r._busy_at + 100)
