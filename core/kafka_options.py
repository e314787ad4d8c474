"""Kafka client settings (TLS, SASL, ...) for every flightwatch client, from one place.

    FLIGHTWATCH_KAFKA_OPTIONS="security_protocol=SASL_SSL,sasl_mechanism=SCRAM-SHA-512,sasl_plain_username=fw,
                               sasl_plain_password_file=/run/secrets/kafka,ssl_cafile=/etc/ca.pem"

applies to every client of the telemetry cluster: the load generator's telemetry, the receivers'
shippers and consumers, the node-metrics agent, the streaming job (driver and executors), and
FLIGHTWATCH_SUT_KAFKA_OPTIONS to the load generator's and the Kafka receiver's clients of the
system under test. Keys are kafka-python's (``security_protocol``, ``ssl_cafile``,
``sasl_mechanism``, ...); ``true``/``false`` and integers are converted. A ``*_file`` key reads
its value from that file (``sasl_plain_password_file``), as does a value ``@PATH`` (also with the job's
``--kafka-option sasl_plain_password=@/run/secrets/kafka``), so a secret need not sit in the environment or on a
command line. Secrets are never printed: ``redacted`` shows them as ***.

The SUT-side clients are librdkafka's (confluent-kafka): ``librdkafka`` turns the same options into
its configuration, so one setting reaches both kinds of client; a key it cannot carry is refused by
name rather than dropped.
"""
from __future__ import annotations

import os

TELEMETRY_ENV = "FLIGHTWATCH_KAFKA_OPTIONS"
SUT_ENV = "FLIGHTWATCH_SUT_KAFKA_OPTIONS"
SECRET_KEYS = ("sasl_plain_password", "ssl_password", "sasl_oauth_token", "sasl_aws_secret_access_key")


def typed_value(text: str):
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    try:
        return int(text)
    except ValueError:
        return text.strip()


def parse(text: str | None) -> dict:
    """``key=value,key=value`` (commas or semicolons) to kafka-python keyword arguments; ValueError if malformed."""
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
    if not key.isidentifier():
        raise ValueError(f"bad Kafka option key {key!r}")
    if key.endswith("_file") and key[:-5] in SECRET_KEYS:
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
    return {**parse(os.environ.get(env)), **(extra or {})}


def telemetry_producer(bootstrap: str, options: dict | None = None, **settings):
    """kafka-python's producer for the telemetry topic (messages of hundreds of records): ``settings`` (linger,
    sizes) under the client options (``FLIGHTWATCH_KAFKA_OPTIONS`` unless ``options`` are given: SASL, TLS).

    Not idempotent (as ``core.telemetry.rdkafka_producer``): the job recognises a re-sent record, and an idempotent
    producer whose broker came back empty fails for good (kafka-python: "fatal error" on InitProducerId, every
    later batch aborted; a node-metrics agent wrote nothing more after its telemetry broker restarted)."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap.split(","),
                             **{"enable_idempotence": False, **settings, **(client_options() if options is None else options)})
    if settings.get("allow_auto_create_topics") is False:
        no_topic_creation(producer._metadata)
    return producer


def no_topic_creation(cluster) -> None:
    """kafka-python 3.0.12 does not hand ``allow_auto_create_topics`` to its metadata (``kafka.net.manager`` builds
    ``ClusterMetadata`` without it): its Metadata requests let the broker create every topic the client knows, which
    brought back each time slice the job deleted (``core.slices``). Set it on the client's ``ClusterMetadata``."""
    cluster.config["allow_auto_create_topics"] = False


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
"""kafka-python's option -> librdkafka's property, for the options a SUT-side client can be given."""


def librdkafka(options: dict) -> dict:
    """kafka-python options (as ``parse`` gives them) as a librdkafka configuration; ValueError on a key it lacks."""
    out: dict = {}
    for key, value in options.items():
        if key == "ssl_check_hostname":  # librdkafka checks the name when this is "https"
            out["ssl.endpoint.identification.algorithm"] = "https" if value else "none"
        elif key == "sasl_oauth_token":
            out["sasl.oauthbearer.config"] = f"principal=flightwatch token={value}"
        elif key in LIBRDKAFKA_KEYS:
            out[LIBRDKAFKA_KEYS[key]] = value if not isinstance(value, bool) else str(value).lower()
        else:
            raise ValueError(f"Kafka option {key!r} is not carried to the librdkafka clients of the system under test "
                             f"(they take: {', '.join(sorted([*LIBRDKAFKA_KEYS, 'ssl_check_hostname', 'sasl_oauth_token']))})")
    return out


def redacted(options: dict) -> dict:
    return {k: ("***" if k in SECRET_KEYS else v) for k, v in options.items()}
