"""The Kafka protocol (Apache Kafka, Tansu, Redpanda, Event Streams): librdkafka's producer (confluent-kafka).

    kafka://127.0.0.1:29092/topic     produce to a topic; the event ID is the record key and the ``ce_id`` header

Credentials and TLS are librdkafka properties (``--kafka-option``, FLIGHTWATCH_SUT_KAFKA_OPTIONS), never in the URL.
"""
from __future__ import annotations

import asyncio
import logging
import os
import time

from core import tls
from core.cloudevents import KAFKA_ID_HEADER, KAFKA_RUN_HEADER
from transports.base import Book, TargetOptions, flag, no_consumers, tcp_reachable
from transports.errors import error_cause
from transports.http.target import CE_SOURCE, CE_TYPE


def kafka_error_cause(err) -> str:
    """A librdkafka error as a short, stable cause (``timeout`` as for HTTP; else librdkafka's name, lower case)."""
    from confluent_kafka import KafkaError

    if err.code() in (KafkaError._MSG_TIMED_OUT, KafkaError._TIMED_OUT, KafkaError.REQUEST_TIMED_OUT):
        return "timeout"
    return err.name().lstrip("_").lower().replace("_", " ")


PRODUCER_DEFAULTS = {"acks": "all", "linger.ms": 5, "batch.size": 1_000_000, "compression.type": "none",
                     "enable.idempotence": False, "max.in.flight.requests.per.connection": 1_000_000,
                     "socket.nagle.disable": False}
"""librdkafka's own defaults (2.x) of the producer settings that shape latency, as the report names them. The Kafka
target keeps them (acks=all, as the Java client does too; linger 5 ms: at 5,000/s a request carries ~25 events)
unless ``--kafka-option`` or FLIGHTWATCH_SUT_KAFKA_OPTIONS says otherwise, with the differences below."""
OURS = {"socket.nagle.disable": True}
"""Where the target differs from librdkafka, and why: Nagle off, as the Java client has it (TCP_NODELAY), so that a
small batch is not held for the previous one's ACK."""


def producer_config(spec, timeout_s: float, max_inflight: int, options: dict) -> dict:
    """The Kafka target's producer configuration: librdkafka's defaults, ``OURS``, the send timeout (``--timeout``)
    and room for ``--max-inflight`` sends in its queue, then the user's options (librdkafka properties) on top."""
    from core.kafka_options import librdkafka

    return {"bootstrap.servers": f"{spec.host}:{spec.port}", **OURS,
            "queue.buffering.max.messages": max(100_000, 2 * max_inflight),
            "message.timeout.ms": max(int(timeout_s * 1000), 1), **librdkafka(options)}


def shaping(config: dict) -> dict:
    """The settings that shape latency, as they take effect (librdkafka's default where the config says nothing)."""
    aliases = {"linger.ms": "queue.buffering.max.ms", "compression.type": "compression.codec",
               "acks": "request.required.acks"}
    out = {}
    for key, default in PRODUCER_DEFAULTS.items():
        value = config.get(key, config.get(aliases.get(key, ""), default))
        out[key] = "all" if key == "acks" and str(value) in ("-1", "all") else value
    return out


RECORD_OVERHEAD = 512
"""Room for an event's key, CloudEvents headers and record framing beside its payload (~250 bytes measured)."""
STICKY_NS = 10_000_000
"""Sends go to one partition for this long, then to the next (librdkafka's ``sticky.partitioning.linger.ms``)."""


class KafkaTarget:
    """librdkafka's producer (confluent-kafka): ~8 µs of CPU a message from Python, with its I/O on its own threads.

    Each record is a CloudEvent in the Kafka binding's binary mode: ``ce_specversion``, ``ce_id`` (also the record
    key), ``ce_source``, ``ce_type``, ``ce_time`` (the send stamp, RFC 3339) and the run as the extension
    ``ce_fwrun``, with ``content-type``; the payload is the event's data. The send stamp
    is taken right before the message is handed to the client; ``poll`` serves delivery reports (acks).
    Sends go to one partition for ``STICKY_NS``, then to the next (sticky, as librdkafka does for keyless
    records): one batch at a time instead of one per partition, at 5,000/s a quarter of the client's CPU.
    Records are still keyed by event ID. Each send record names its partition (``contract.Send.route``): a receiver
    that reads the target's own topic (``--routes``, as the one that follows the target) counts an event read from
    another partition as misrouted."""

    SCHEMES = ("kafka",)
    RECEIVER = "kafka"
    TLS_PORT = None  # TLS and SASL are librdkafka settings (--kafka-option)
    SECURE = {}  # no TLS scheme of its own
    DEFAULT_PORT = 9092
    EXAMPLE = "kafka://HOST:PORT/TOPIC"
    TAKES_KAFKA_OPTIONS = True
    polled = True

    @staticmethod
    def receiver_args(spec) -> list[str]:
        """The receiver agent that consumes where this target's load goes: the topic, from its end when the run
        began, each partition assigned (no consumer group joined: nothing is left on the user's cluster), each
        receive's partition its route (a read from a partition the event was not sent to is misrouted)."""
        return ["kafka", "--bootstrap", f"{spec.host}:{spec.port}", "--topic", spec.path, "--from-end", "--routes"]

    reachable = staticmethod(tcp_reachable)
    consumers = staticmethod(no_consumers)  # consumers that assign partitions, as ours does, are no group's members

    @staticmethod
    def share_args(spec, i: int, count: int) -> list[str]:
        """Receiver ``i`` of ``count`` takes the partitions p with p mod count == i (no group: nothing on the
        user's cluster)."""
        return [] if count == 1 else ["--share", f"{i}/{count}"]

    @staticmethod
    def receiver_place(flags: list[str]) -> str | None:
        """Where a Kafka receiver started with ``flags`` consumes, as a target (its defaults where a flag is absent)."""
        from core.procs import sut_bootstrap
        from core.suts import SUT_QUEUE

        return f"kafka://{flag(flags, '--bootstrap', sut_bootstrap())}/{flag(flags, '--topic', SUT_QUEUE)}"

    def __init__(self, spec, opts: TargetOptions) -> None:
        self.spec, self.timeout_s, self.run_id = spec, opts.timeout_s, opts.run_id
        timeout_s, max_inflight, run_id, client_options = opts.timeout_s, opts.max_inflight, opts.run_id, opts.kafka_options
        self.payload = os.urandom(opts.payload_bytes)
        if client_options is None:
            from core.kafka_options import SUT_ENV
            from core.kafka_options import client_options as from_env

            client_options = from_env(env=SUT_ENV)
        self.config = producer_config(spec, timeout_s, max_inflight, client_options)
        self.producer = None
        self.book = None
        self.partitions, self._partition, self._switch_ns = 1, 0, 0
        self._headers_tail = [("ce_specversion", b"1.0"), ("ce_source", CE_SOURCE.encode()), ("ce_type", CE_TYPE.encode()),
                              (KAFKA_RUN_HEADER, run_id.encode()), ("content-type", b"application/octet-stream")]
        self._second, self._second_text = -1, b""

    @staticmethod
    def check(scheme: str, path: str, userinfo: str | None, query: str) -> str:
        topic = path.strip("/")
        if not topic:
            raise ValueError("kafka://HOST:PORT/TOPIC needs a topic")
        if userinfo is not None:
            raise ValueError("Kafka credentials go in FLIGHTWATCH_SUT_KAFKA_OPTIONS, not the URL")
        return topic

    def shaping(self) -> dict | None:
        """What shaped its latency, as it took effect (librdkafka's defaults where the config says nothing)."""
        return shaping(self.config)

    async def connect(self) -> None:
        """Create the producer and learn the topic's partitions (a broker that is away fails here, before the start)."""
        from confluent_kafka import KafkaException, Producer

        self.producer = Producer({**self.config, "error_cb": self._on_error})
        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + self.timeout_s
        quiet = logging.getLogger("librdkafka")
        self._loud_level = quiet.level
        quiet.setLevel(logging.CRITICAL + 1)  # a failure here is said in one line, below
        while True:  # a refused login or certificate reaches only error_cb, which poll serves: between short tries
            wait_s = min(1.0, max(deadline - time.monotonic(), 0.1))
            try:
                md = await loop.run_in_executor(None, self.producer.list_topics, self.spec.path, wait_s)
                break
            except KafkaException as e:
                self.producer.poll(0)
                if self.refused is not None:
                    raise ConnectionError(f"kafka {self.spec}: {self.refused}") from None
                if time.monotonic() >= deadline:
                    raise ConnectionError(f"kafka {self.spec}: {e.args[0].str() if e.args else e}: is it up, and "
                                          "a Kafka broker?") from None
        self._loud()
        topic = md.topics.get(self.spec.path)
        self.partitions = max(len(topic.partitions) if topic is not None and topic.partitions else 1, 1)
        self._check_size(await loop.run_in_executor(None, self._topic_limit) if topic is not None else None)

    refused: str | None = None
    """Why the broker refused us (a login, a certificate), from librdkafka's ``error_cb``: before the attack only."""
    _loud_level: int | None = None
    """librdkafka's log level before ``connect`` quieted it: restored once connected, or after a failed connect's
    ``close``. librdkafka's own lines of a failure are served by ``poll`` and ``flush``: restored at once, the
    close's flush gave its ``SSL handshake failed`` beside the one line of the failure (CI, 2026-11-30)."""

    def _loud(self) -> None:
        if self._loud_level is not None:
            logging.getLogger("librdkafka").setLevel(self._loud_level)
            self._loud_level = None

    def _on_error(self, err) -> None:
        from confluent_kafka import KafkaError

        if err.code() == KafkaError._AUTHENTICATION:
            self.refused = f"SASL authentication failed (user or password wrong): {err.str()}"
        elif err.code() == KafkaError._SSL:
            self.refused = tls.cause(err.str()) or f"TLS failed: {err.str()}"

    def _topic_limit(self) -> int | None:
        """The topic's ``max.message.bytes`` as its broker says it, or None if it will not say."""
        from confluent_kafka.admin import AdminClient, ConfigResource

        try:
            admin = AdminClient({k: v for k, v in self.config.items() if not k.startswith(("queue.", "message.",
                                                                                            "linger", "batch", "acks",
                                                                                            "enable.idem", "max.in",
                                                                                            "compression"))})
            res = ConfigResource("topic", self.spec.path)
            entries = admin.describe_configs([res], request_timeout=self.timeout_s)[res].result(self.timeout_s)
            return int(entries["max.message.bytes"].value)
        except Exception:  # noqa: BLE001 - an ACL or an old broker: the producer's own limit still holds
            return None

    def _check_size(self, topic_limit: int | None) -> None:
        """An event over the producer's ``message.max.bytes`` or the topic's ``max.message.bytes`` fails every send:
        ``ValueError`` before the attack, in one line."""
        size = len(self.payload) + RECORD_OVERHEAD
        limits = [("the producer's message.max.bytes", int(self.config.get("message.max.bytes", 1_000_000)))]
        if topic_limit is not None:
            limits.append((f"topic {self.spec.path}'s max.message.bytes", topic_limit))
        for what, limit in limits:
            if size > limit:
                raise ValueError(f"an event of {len(self.payload):,} bytes (and ~{RECORD_OVERHEAD} of key and headers)"
                                 f" is over {what} ({limit:,}): give a smaller --payload, or raise the limit")

    def start(self, book: Book) -> None:
        self.book = book

    def _date(self, second: int) -> bytes:
        """The date and time part of CloudEvents' ``time`` (RFC 3339, UTC) of ``second``, formatted once a second
        (``send`` adds the µs)."""
        self._second, self._second_text = second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second)).encode()
        return self._second_text

    def send(self, event_id: str, intended_ns: int) -> None:
        book, key = self.book, event_id.encode()
        sent = time.time_ns()
        book.sent(event_id, intended_ns, sent, self._partition)  # its partition: where a receiver must read it
        second, frac = divmod(sent, 1_000_000_000)
        stamp = (self._second_text if second == self._second else self._date(second)) + b".%06dZ" % (frac // 1000)
        try:
            self.producer.produce(self.spec.path, self.payload, key, self._partition,
                                  headers=[(KAFKA_ID_HEADER, key), ("ce_time", stamp), *self._headers_tail],
                                  on_delivery=lambda err, _msg: book.done(event_id, sent, None,
                                                                          None if err is None else kafka_error_cause(err)))
        except BufferError:
            book.done(event_id, sent, None, "client queue full")
        except Exception as e:  # noqa: BLE001 - KafkaException: refused by the client, counted as that send's error
            book.done(event_id, sent, None, kafka_error_cause(e.args[0]) if e.args and hasattr(e.args[0], "code")
                      else error_cause(e))

    def poll(self, timeout_s: float) -> int:
        """Serve delivery reports for up to ``timeout_s``; every ``STICKY_NS`` sends move to the next partition."""
        now = time.monotonic_ns()
        if now >= self._switch_ns:
            self._partition = (self._partition + 1) % self.partitions
            self._switch_ns = now + STICKY_NS
        return self.producer.poll(timeout_s)

    async def close(self) -> None:
        if self.producer is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.producer.flush, 5)
        self._loud()
