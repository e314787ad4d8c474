"""Kafka client settings (TLS, SASL, ...) for every flightwatch client, from one place.

    FLIGHTWATCH_KAFKA_OPTIONS="security.protocol=SASL_SSL,sasl.mechanism=SCRAM-SHA-512,sasl.username=fw,
                               sasl.password=@/run/secrets/kafka,ssl.ca.location=/etc/ca.pem"

applies to every client of the telemetry cluster: the load generator's telemetry, the receivers'
shippers and consumers, the node-metrics agent, the streaming job (driver and executors), and
FLIGHTWATCH_SUT_KAFKA_OPTIONS to the load generator's and the Kafka receiver's clients of the
system under test. Every client is librdkafka's (confluent-kafka), so keys are librdkafka properties
(``security.protocol``, ``ssl.ca.location``, ``sasl.mechanism``, ...); the kafka-python names of earlier
releases (``security_protocol``, ``ssl_cafile``, ``sasl_plain_password_file``) are still taken and mapped.
``true``/``false`` and integers are converted. A value ``@PATH`` is read from that file (also with the job's
``--kafka-option sasl.password=@/run/secrets/kafka``), as is a secret's ``*_file`` key, so a secret need not sit
in the environment or on a command line. Secrets are never printed: ``redacted`` shows them as ***.
"""
from __future__ import annotations

import re

from core import settings

TELEMETRY_ENV = "FLIGHTWATCH_KAFKA_OPTIONS"
SUT_ENV = "FLIGHTWATCH_SUT_KAFKA_OPTIONS"
SECRET_KEYS = ("sasl_plain_password", "ssl_password", "sasl_oauth_token", "sasl_aws_secret_access_key",
               "sasl.password", "ssl.key.password", "ssl.keystore.password", "sasl.oauthbearer.client.secret",
               "sasl.oauthbearer.config")
_PROPERTY = re.compile(r"[a-z][a-z0-9_]*(\.[a-z0-9_]+)+")
"""A librdkafka property name (dotted); an undotted identifier is a kafka-python name (``LIBRDKAFKA_KEYS``)."""


def typed_value(text: str):
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    try:
        return int(text)
    except ValueError:
        return text.strip()


def parse(text: str | None) -> dict:
    """``key=value,key=value`` (commas or semicolons) to a dict of options; ValueError if malformed."""
    out: dict = {}
    for part in (text or "").replace(";", ",").split(","):
        if not part.strip():
            continue
        if "=" not in part:
            raise ValueError(f"bad Kafka option {part.strip()!r}: expected KEY=VALUE")
        key, value = option(*part.split("=", 1))
        out[key] = value
    return out


def option(key: str, value: str) -> tuple[str, object]:
    """One ``KEY=VALUE`` setting, as the environment and ``--kafka-option`` give it: a secret's ``*_file`` key, or
    a value ``@PATH``, is read from that file (a secret need not sit on a command line); others are typed."""
    key, value = key.strip(), value.strip()
    if not (key.isidentifier() or _PROPERTY.fullmatch(key)):
        raise ValueError(f"bad Kafka option key {key!r}: a librdkafka property, e.g. security.protocol")
    for suffix in ("_file", ".file"):
        if key.endswith(suffix) and key[:-5] in SECRET_KEYS:
            key, value = key[:-5], "@" + value
    if value.startswith("@"):
        try:
            with open(value[1:]) as f:
                return key, f.read().strip()
        except OSError as e:
            raise ValueError(f"Kafka option {key}: cannot read {value[1:]}: {e.strerror or e}") from None
    return key, typed_value(value)


def client_options(extra: dict | None = None, env: str = TELEMETRY_ENV) -> dict:
    """The options from the environment, with ``extra`` (e.g. a command line's) on top."""
    return {**parse(settings.get(env)), **(extra or {})}


TELEMETRY_COMPRESSION = "lz4"
"""Telemetry's NDJSON shrinks about twentyfold in lz4 (2,000 lines of a 5,000/s run: 272 KB to 14 KB), so the
embedded telemetry broker (Tansu, in memory) holds and copies a twentieth of the bytes. At 5,000 events/s on the
2-core machine (``make attack RATE=5000``, seconds 25-80) it took the broker from 0.044-0.048 to 0.029-0.032 core;
the producers and the job's reader cost no more, within the runs' noise. Every reader decompresses it: librdkafka,
and Spark's own connector (lz4-java ships with Spark)."""


def telemetry_producer(bootstrap: str, options: dict | None = None, **settings):
    """librdkafka's producer (confluent-kafka) for the telemetry topic: ``settings`` (librdkafka properties: linger,
    sizes, a slice's ``TelemetryTopic.producer_settings``) under the client options (``FLIGHTWATCH_KAFKA_OPTIONS``
    unless ``options`` are given: SASL, TLS). Its log lines go through the repeat filter (``librdkafka`` gives it its
    ``logger``).

    Not idempotent: the job recognises a re-sent record, and an idempotent producer whose broker came back empty
    fails for good (the broker has forgotten its producer ID). lz4 (``TELEMETRY_COMPRESSION``)."""
    from confluent_kafka import Producer

    return Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "message.max.bytes": 8 << 20,
                     "enable.idempotence": False, "compression.type": TELEMETRY_COMPRESSION,
                     **settings, **librdkafka(client_options() if options is None else options)})


def produce(producer, topic: str, value: bytes, key: bytes | None = None, **kwargs) -> None:
    """``producer.produce``, waiting (serving delivery reports) while librdkafka's queue is full instead of failing."""
    while True:
        try:
            producer.produce(topic, value, key, **kwargs)
            return
        except BufferError:
            producer.poll(0.1)


def create_topic(bootstrap: str, topic: str, partitions: int, options: dict | None = None, timeout_s: float = 10) -> bool:
    """Create ``topic`` (replication 1) unless it exists: True if it was created. KafkaException if the broker refuses."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap, **librdkafka(client_options() if options is None else options)})
    try:
        admin.create_topics([NewTopic(topic, partitions, 1)], request_timeout=timeout_s)[topic].result(timeout_s)
    except KafkaException as e:
        if e.args[0].name() != "TOPIC_ALREADY_EXISTS":
            raise
        return False
    return True


LIBRDKAFKA_KEYS = {
    "security_protocol": "security.protocol", "sasl_mechanism": "sasl.mechanism",
    "sasl_plain_username": "sasl.username", "sasl_plain_password": "sasl.password",
    "ssl_cafile": "ssl.ca.location", "ssl_certfile": "ssl.certificate.location", "ssl_keyfile": "ssl.key.location",
    "ssl_password": "ssl.key.password", "ssl_crlfile": "ssl.crl.location", "ssl_ciphers": "ssl.cipher.suites",
    "client_id": "client.id", "request_timeout_ms": "request.timeout.ms",
    "connections_max_idle_ms": "connections.max.idle.ms", "reconnect_backoff_ms": "reconnect.backoff.ms",
    "reconnect_backoff_max_ms": "reconnect.backoff.max.ms", "metadata_max_age_ms": "metadata.max.age.ms",
    "retry_backoff_ms": "retry.backoff.ms", "sasl_kerberos_service_name": "sasl.kerberos.service.name",
    "api_version_auto_timeout_ms": "api.version.request.timeout.ms",
}
LIBRDKAFKA_KEYS.update({"compression_type": "compression.type", "linger_ms": "linger.ms", "batch_size": "batch.size",
                        "enable_idempotence": "enable.idempotence",
                        "max_in_flight_requests_per_connection": "max.in.flight.requests.per.connection"})
"""kafka-python's option name (earlier releases took these) -> librdkafka's property."""
UNDOTTED = frozenset({"acks", "retries", "debug", "partitioner"})
"""librdkafka properties without a dot (kafka-python's ``acks`` and ``retries`` mean the same)."""


def librdkafka(options: dict) -> dict:
    """Options (as ``parse`` gives them) as a librdkafka configuration: properties pass through, kafka-python names
    are mapped; ValueError on a kafka-python name with no librdkafka property. With the ``logger`` of every
    flightwatch client (``core.logs.librdkafka_logger``): librdkafka's own lines through the repeat filter."""
    from core import logs

    out: dict = {"logger": logs.librdkafka_logger()}
    for key, value in options.items():
        if _PROPERTY.fullmatch(key) or key in UNDOTTED:
            out[key] = str(value).lower() if isinstance(value, bool) else value
        elif key == "ssl_check_hostname":  # librdkafka checks the name when this is "https"
            out["ssl.endpoint.identification.algorithm"] = "https" if value else "none"
        elif key == "sasl_oauth_token":
            out["sasl.oauthbearer.config"] = f"principal=flightwatch token={value}"
        elif key in LIBRDKAFKA_KEYS:
            out[LIBRDKAFKA_KEYS[key]] = value if not isinstance(value, bool) else str(value).lower()
        else:
            raise ValueError(f"Kafka option {key!r} is not a librdkafka property (e.g. security.protocol, "
                             "ssl.ca.location, sasl.username); of the kafka-python names these are taken: "
                             f"{', '.join(sorted([*LIBRDKAFKA_KEYS, 'ssl_check_hostname', 'sasl_oauth_token']))}")
    return out


def redacted(options: dict) -> dict:
    return {k: ("***" if k in SECRET_KEYS else v) for k, v in options.items()}
