"""Writers of time-sliced telemetry topics (``core.slices``) on a real Tansu broker."""
from __future__ import annotations

import json
import os
import signal
import time

from kafka.admin import KafkaAdminClient
from support import create_topic, free_port

from core.kafka_options import telemetry_producer
from core.slices import TelemetryTopic, parse_slice
from core.telemetry import TelemetryWriter
from stack.tansu import start_tansu


def _records(bootstrap: str, topic: str) -> list[dict]:
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest", consumer_timeout_ms=2000)
    c.assign([TopicPartition(topic, p) for p in c.partitions_for_topic(topic) or ()])
    out = [json.loads(line) for m in c for line in m.value.splitlines()]
    c.close()
    return out


def test_a_writer_whose_broker_came_back_empty_creates_its_slice_again_and_writes_on(tmp_path):
    """The embedded telemetry broker killed (by its PID) and started again has none of the slices a long-lived writer
    created. A write that fails there makes the writer create the slice again (``TelemetryTopic.forget``), so its
    records land in the current slice, with the base topic's partitions, well before the slice's end (one hour away
    here) instead of waiting for the next slice, and nothing is lost."""
    port, base = free_port(), "tel-forget"
    bootstrap = f"127.0.0.1:{port}"
    broker = start_tansu(port, open(tmp_path / "tansu-1.log", "wb"), "flightwatch-forget")
    writer = None
    try:
        create_topic(bootstrap, base, partitions=3)
        topic = TelemetryTopic(base, 3600, bootstrap, {})
        producer = telemetry_producer(bootstrap, {}, **topic.producer_settings())
        writer = TelemetryWriter(producer, topic, agent="forget-0", records_per_message=50)
        for i in range(200):
            writer.write({"v": 1, "kind": "node", "run_id": "forget", "i": i})
        assert writer.flush(20) and writer.num_sent == 200
        first = topic()
        os.kill(broker.pid, signal.SIGKILL)
        broker.wait()
        broker = start_tansu(port, open(tmp_path / "tansu-2.log", "wb"), "flightwatch-forget")
        create_topic(bootstrap, base, partitions=3)
        t0 = time.monotonic()
        for i in range(200, 400):
            writer.write({"v": 1, "kind": "node", "run_id": "forget", "i": i})
        assert writer.flush(60), writer.counters()
        took = time.monotonic() - t0
        assert topic() == first  # still the same slice: it was created again, not replaced by the next one
        got = sorted(r["i"] for r in _records(bootstrap, first))
        admin = KafkaAdminClient(bootstrap_servers=bootstrap)
        (desc,) = admin.describe_topics([first])
        admin.close()
        print(f"\nlibrdkafka: 200 records after an empty restart written into {first} in {took:.1f} s "
              f"({writer.num_retried} retried)")
        assert got == list(range(200, 400))  # what the old broker held is gone; everything after it is there
        assert len(desc["partitions"]) == 3 and parse_slice(base, first)
        assert took < 30
    finally:
        if writer is not None:
            writer.close()
        broker.send_signal(signal.SIGKILL)
        broker.wait()
