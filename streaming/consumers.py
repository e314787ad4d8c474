"""The read tasks' Kafka clients (``streaming.sources``): librdkafka consumers kept by each Python worker between
tasks, and the mapping of the source's ``kafka.<setting>`` options to client settings."""
from __future__ import annotations

_CLIENT_PREFIX = "kafka."


def kafka_client_config(options: dict) -> dict:
    """Client options from source options: ``kafka.<setting>`` passes through (SASL/TLS ...), as Spark's own Kafka
    source takes them (``kafka.security.protocol``); ``core.kafka_options.librdkafka`` makes them a configuration."""
    from core.kafka_options import typed_value

    cfg = {}
    for key, value in options.items():
        if key.startswith(_CLIENT_PREFIX) and key != "kafka.bootstrap.servers":
            cfg[key[len(_CLIENT_PREFIX):]] = typed_value(value) if isinstance(value, str) else value
    servers = options.get("kafka.bootstrap.servers") or options.get("bootstrap.servers") or options["bootstrap"]
    cfg["bootstrap_servers"] = servers.split(",")
    return cfg


def client_config(options: dict) -> dict:
    """The librdkafka configuration of a client of the source's broker: its bootstrap and ``kafka.<setting>`` options."""
    from core.kafka_options import librdkafka

    cfg = kafka_client_config(options)
    return {"bootstrap.servers": ",".join(cfg.pop("bootstrap_servers")), **librdkafka(cfg)}


WORKER_FETCH_WAIT_MS = 50
"""librdkafka's fetch.wait.max.ms for read tasks: a fetch past the data the planner saw waits at most this."""
WORKER_QUEUE_KBYTES = 32768
"""What a read task's consumer may fetch ahead within its range (telemetry at 5,000 events/s: ~1.5 MB/s)."""

_CONSUMERS: dict = {}
"""A worker's consumers, one per (client settings, topic, partition), kept between read tasks. Of a topic's time
slices (``core.slices``) a worker keeps only the newest slice's: librdkafka 2.16 crashed the process when a topic it
had read was deleted, or recreated with other partitions, while it still held it (a worker reading a slice again
after the job deleted it and a late writer brought it back); a slice is deleted at least ``--slice-grace`` after a
newer one began, by which time its consumers are closed. A topic read under a new ID gets a new consumer."""


class _Reading:
    """A worker's librdkafka consumer of one partition, kept between read tasks, assigned only while one reads.

    librdkafka instead of kafka-python: at 5,000 events/s the two read workers took ~0.5 core each, half of it
    in kafka-python's network thread and fetch parsing; librdkafka's threads take ~0.02. Left assigned between
    tasks it would fetch ahead, but every fetch on the embedded Tansu scans what the broker holds: the telemetry
    broker went from 0.09 to 0.31 core. A task's first fetch asks for data that is there, so it is answered at once."""

    def __init__(self, consumer, topic: str, partition: int, topic_id: str | None) -> None:
        self.consumer, self.topic, self.partition, self.topic_id = consumer, topic, partition, topic_id
        self.suspect = True
        """Whether what it reads may come from another log under the same name (a telemetry broker that restarted
        empty, the topic created again): true when new and after any client error, until ``topic_state`` says the
        topic is still the one planned. Asked once per consumer and per error, never per record."""

    def on_error(self, _err) -> None:  # librdkafka's error_cb (a connection lost, all brokers down), served by consume
        self.suspect = True

    def assign(self, offset: int) -> None:
        from confluent_kafka import TopicPartition

        self.consumer.assign([TopicPartition(self.topic, self.partition, offset)])

    def unassign(self) -> None:
        self.consumer.unassign()


def _consumer_key(options: dict, topic: str, partition: int) -> tuple:
    return tuple(sorted((k, str(v)) for k, v in options.items())), topic, partition


def _worker_consumer(options: dict, topic: str, partition: int, topic_id: str | None = None) -> _Reading:
    """This worker's consumer for ``partition`` of ``topic`` (named in the error if Kafka refuses the settings)."""
    from confluent_kafka import Consumer, KafkaException

    key = _consumer_key(options, topic, partition)
    reading = _CONSUMERS.get(key)
    if reading is not None and topic_id is not None and reading.topic_id not in (None, topic_id):
        _drop_worker_consumer(*key)  # the topic was recreated: a consumer that knew the old one is not reused
        reading = None
    if reading is not None:
        return reading
    _drop_older_slices(key)
    config = {"group.id": "flightwatch-spark-source",
              "enable.auto.commit": False, "enable.auto.offset.store": False, "enable.partition.eof": False,
              "auto.offset.reset": "earliest",  # a read from 0 of a log that starts later begins at its start
              "fetch.wait.max.ms": WORKER_FETCH_WAIT_MS, "queued.max.messages.kbytes": WORKER_QUEUE_KBYTES,
              "allow.auto.create.topics": False,  # asking about a deleted slice must not create it again
              "fetch.max.bytes": 64 << 20, "max.partition.fetch.bytes": 16 << 20, "receive.message.max.bytes": 80 << 20,
              **client_config(options)}
    reading = _Reading(None, topic, partition, topic_id)
    config["error_cb"] = reading.on_error
    try:  # a broker that is away is retried by librdkafka (the read waits up to its deadline); only bad settings fail here
        reading.consumer = Consumer(config)
    except KafkaException as e:
        raise RuntimeError(f"cannot read {topic}[{partition}]: Kafka settings refused: {e}") from None
    _CONSUMERS[key] = reading
    return reading


def _newer_slice_held(key: tuple) -> bool:
    """Whether this worker holds a consumer of a newer slice of the same topic than ``key``'s."""
    from core.slices import split_slice

    this = split_slice(key[1])
    return this is not None and any(
        (other := split_slice(k[1])) is not None and k[0] == key[0] and other[0] == this[0] and other[1] > this[1]
        for k in _CONSUMERS)


def _drop_older_slices(key: tuple) -> None:
    """Close this worker's consumers of slices older than ``key``'s topic (they still exist: see ``_CONSUMERS``)."""
    from core.slices import split_slice

    this = split_slice(key[1])
    if this is None:
        return
    for k in list(_CONSUMERS):
        other = split_slice(k[1])
        if other is not None and k[0] == key[0] and other[0] == this[0] and other[1] < this[1]:
            _drop_worker_consumer(*k)


def release_worker_consumer(options: dict, topic: str, partition: int) -> None:
    """After a read: keep the consumer for the next task, unless it is of a slice older than one this worker holds."""
    key = _consumer_key(options, topic, partition)
    if _newer_slice_held(key):
        _drop_worker_consumer(*key)


def _drop_worker_consumer(options: dict | tuple, topic: str, partition: int) -> None:
    key = (options if isinstance(options, tuple) else _consumer_key(options, topic, partition)[0]), topic, partition
    reading = _CONSUMERS.pop(key, None)
    if reading is not None:
        try:
            reading.consumer.close()
        except Exception:  # noqa: BLE001 - closing a broken client
            pass


STALL_CHECK_S = 3.0
"""A read task that got nothing for this long asks the broker whether its topic is still the one planned."""
CONFIRM_WAIT_S = 0.5
"""How often a read task asks again whether its topic is the one planned while the broker does not answer."""

_ADMINS: dict = {}


def topic_state(options: dict, topic: str, topic_id: str | None) -> tuple[str, str]:
    """Whether ``topic`` on the broker is the one a read was planned on (``topic_id``): ``("same", "")`` (also with
    no ID to compare, or a broker that tells none), ``("lost", why)`` (deleted, or recreated under another ID: a
    telemetry broker that restarted empty), or ``("unknown", why)`` (the broker does not answer)."""
    if topic_id is None:
        return "same", ""
    from confluent_kafka import KafkaError, KafkaException, TopicCollection
    from confluent_kafka.admin import AdminClient

    from core.slices import NO_TOPIC_CREATION

    key = _consumer_key(options, "", 0)[0]
    if key not in _ADMINS:
        _ADMINS[key] = AdminClient({**NO_TOPIC_CREATION, **client_config(options)})
    try:
        d = _ADMINS[key].describe_topics(TopicCollection([topic]), request_timeout=3)[topic].result(5)
    except KafkaException as e:
        if e.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
            return "lost", "deleted"
        return "unknown", e.args[0].str()
    except Exception as e:  # noqa: BLE001 - no answer
        return "unknown", str(e)
    now = topic_id_text(d.topic_id)
    if now is None or now == topic_id:  # the same (or a broker that does not tell topic IDs)
        return "same", ""
    return "lost", f"recreated (ID {topic_id} -> {now})"


def topic_id_text(uid) -> str | None:
    """A topic ID as librdkafka gives it (``confluent_kafka.Uuid``) in UUID form; None for none (all zero)."""
    import uuid

    if uid is None:
        return None
    hi, lo = uid.get_most_significant_bits(), uid.get_least_significant_bits()
    out = uuid.UUID(int=((hi & (2**64 - 1)) << 64) | (lo & (2**64 - 1)))
    return None if out.int == 0 else str(out)


def close_worker_consumers() -> None:
    """Close every consumer this process keeps for read tasks (a test that read in-process, before its broker goes)."""
    for key in list(_CONSUMERS):
        _drop_worker_consumer(*key)
    _ADMINS.clear()
