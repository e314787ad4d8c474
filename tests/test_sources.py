"""The Kafka Python Data Source against the real broker: exact ends, deterministic re-reads, admission control."""
import pytest
from conftest import create_topic
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from streaming.sources import KafkaStreamReader, close_worker_consumers

pytestmark = pytest.mark.integration

NUM_MESSAGES = 1012


@pytest.fixture(scope="module")
def topic(broker):
    name = "sources-test"
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


def test_end_offsets_are_exact_where_list_offsets_under_reports(broker, topic):
    r = reader(broker, topic)
    ends = r.latestOffset(r.initialOffset(), ReadAllAvailable())
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
    assert sum(end.values()) - sum(start.values()) == 100
    assert r.latestOffset(end, ReadAllAvailable()) == {"0": 506, "1": 506}
    r.stop()


def test_available_now_stops_at_the_end_seen_at_start(broker, topic):
    r = reader(broker, topic)
    r.prepareForTriggerAvailableNow()
    producer = KafkaProducer(bootstrap_servers=broker)
    producer.send(topic, value=b"later", partition=0)
    producer.flush()
    producer.close()
    assert r.latestOffset(r.initialOffset(), ReadAllAvailable()) == {"0": 506, "1": 506}
    r.stop()
