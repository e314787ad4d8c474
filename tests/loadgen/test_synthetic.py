"""The synthetic run's writer (``loadgen.synthetic.produce``): what the end-to-end tests hand the job is exactly the
run whose truth they check, or the write fails loudly."""
from __future__ import annotations

import pytest
from support import create_topic

from core.kafka_options import produce as produce_one
from core.kafka_options import telemetry_producer
from loadgen.synthetic import SyntheticSpec, WrittenTwice, count_messages, generate, messages, produce

pytestmark = pytest.mark.integration


def test_a_run_is_written_once_and_a_topic_holding_more_is_refused(broker):
    """Written to a fresh topic, the run's messages are all there once; written where some of them already are (a
    request the broker wrote twice looks the same), the writer raises ``WrittenTwice`` naming both counts."""
    run = generate(SyntheticSpec(run_id="written", duration_s=5, rate_per_sec=200, pause=None, oom_at_s=()))
    create_topic(broker, "synthetic-once")
    n = produce(run, broker, "synthetic-once")
    assert n == len(messages(run)) and count_messages(broker, "synthetic-once") == n
    create_topic(broker, "synthetic-twice")
    p = telemetry_producer(broker)
    for key, value, _ in messages(run)[:3]:  # three of its messages there already
        produce_one(p, "synthetic-twice", value, key)
    assert p.flush(30) == 0
    with pytest.raises(WrittenTwice, match=f"holds {n + 3:,} messages for the {n:,} written"):
        produce(run, broker, "synthetic-twice")
