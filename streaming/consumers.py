"""The read tasks' Kafka clients (``streaming.sources``): librdkafka consumers kept by each Python worker between
tasks, and the mapping of the source's ``kafka.<setting>`` options to client settings."""
from __future__ import annotations

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
              "auto.offset.reset": "earliest",  # a read from 0 of a log that starts later begins at its start
              "fetch.wait.max.ms": WORKER_FETCH_WAIT_MS, "queued.max.messages.kbytes": WORKER_QUEUE_KBYTES,
              "fetch.max.bytes": 64 << 20, "max.partition.fetch.bytes": 16 << 20, "receive.message.max.bytes": 80 << 20,
              **librdkafka(cfg)}
    try:  # a broker that is away is retried by librdkafka (the read waits up to its deadline); only bad settings fail here
        reading = _Reading(Consumer(config), topic, partition)
    except KafkaException as e:
        raise RuntimeError(f"cannot read {topic}[{partition}]: Kafka settings refused: {e}") from None
    _CONSUMERS[key] = reading
    _drop_older_slices(topic)
    return reading


def _drop_older_slices(topic: str) -> None:
    """A worker reading a time slice no longer needs its consumers of that topic's slices two or more before."""
    from core.slices import split_slice

    this = split_slice(topic)
    if this is None:
        return
    for key in list(_CONSUMERS):
        other = split_slice(key[1])
        if other is not None and other[0] == this[0] and other[1] <= this[1] - 2 * this[2]:
            _drop_worker_consumer(*key)


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
