"""Where the load goes: an HTTP CloudEvents endpoint or a Kafka-protocol topic.

    http://127.0.0.1:8080/            CloudEvents over HTTP, binary mode (ce-* headers)
    http+structured://host:port/path  CloudEvents over HTTP, structured mode (JSON envelope)
    kafka://127.0.0.1:29092/topic     produce to a topic; the event ID is the record key
                                      and the ``ce_id`` header

``send()`` answers (status, error cause): status is the HTTP code (None for Kafka), and
the cause names a failure the way vegeta's error set does (timeout, connection refused,
http 503 is reported through the status).
"""
from __future__ import annotations

import asyncio
import base64
import json
import os
import time
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

from core.cloudevents import KAFKA_ID_HEADER, KAFKA_RUN_HEADER, RUN_ATTRIBUTE
from core.procs import tcp_unreachable
from loadgen.errors import error_cause

CE_SOURCE = "flightwatch/loadgen"
CE_TYPE = "dev.flightwatch.load"


@dataclass(frozen=True)
class TargetSpec:
    scheme: str          # http, http+structured, kafka
    host: str
    port: int
    path: str            # URL path, or topic for kafka
    userinfo: str | None = field(default=None, repr=False, compare=False)
    """``user:password`` of an http target: sent as basic auth, never printed or recorded."""

    @classmethod
    def parse(cls, text: str) -> TargetSpec:
        u = urlsplit(text)
        shown = _redacted(text, u)
        if u.scheme not in ("http", "http+structured", "kafka") or not u.hostname:
            raise ValueError(f"bad target {shown!r}: use http://HOST:PORT/PATH, http+structured://..., or kafka://HOST:PORT/TOPIC")
        try:
            port = u.port or (80 if u.scheme.startswith("http") else 9092)
        except ValueError:
            raise ValueError(f"bad target {shown!r}: bad port") from None
        path = u.path or "/"
        if u.scheme == "kafka":
            path = path.strip("/")
            if not path:
                raise ValueError(f"bad target {shown!r}: kafka://HOST:PORT/TOPIC needs a topic")
            if u.username is not None:
                raise ValueError(f"bad target {shown!r}: Kafka credentials go in FLIGHTWATCH_SUT_KAFKA_OPTIONS, not the URL")
        userinfo = None
        if u.username is not None:
            userinfo = f"{unquote(u.username)}:{unquote(u.password or '')}"
        return cls(u.scheme, u.hostname, port, path, userinfo)

    def __str__(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}/{self.path.lstrip('/')}"

    def reachable(self, timeout_s: float = 3.0) -> str | None:
        """None if a TCP connection opens, else why not."""
        return tcp_unreachable(self.host, self.port, timeout_s)


def _redacted(text: str, u) -> str:
    """The URL as it may be shown: any password replaced by ***."""
    try:
        return text.replace(f":{u.password}@", ":***@", 1) if u.password else text
    except ValueError:
        return text


RUN_EXTENSION = RUN_ATTRIBUTE
"""CloudEvents extension attribute (HTTP ``ce-fwrun``, Kafka header ``ce_fwrun``) carrying the run ID to receivers."""


class HttpTarget:
    """CloudEvents over HTTP/1.1 through ``loadgen.http`` (keep-alive, at most ``max_inflight`` connections).

    The send stamp is taken by the pool right before the request's bytes are written to its connection:
    a wait for a connection (one being opened, or all busy) comes before it, and shows as send delay."""

    polled = False

    def __init__(self, spec: TargetSpec, timeout_s: float, max_inflight: int, run_id: str = "",
                 payload_bytes: int = 2048) -> None:
        self.spec, self.timeout_s, self.max_inflight, self.run_id = spec, timeout_s, max_inflight, run_id
        self.payload = os.urandom(payload_bytes)
        self.structured = spec.scheme == "http+structured"
        self.pool = None
        common = f"POST {spec.path} HTTP/1.1\r\nHost: {spec.host}:{spec.port}\r\n"
        if spec.userinfo is not None:
            common += f"Authorization: Basic {base64.b64encode(spec.userinfo.encode()).decode()}\r\n"
        if self.structured:
            self._head = common + "content-type: application/cloudevents+json\r\ncontent-length: {n}\r\n\r\n"
        else:
            self._head = (common + f"ce-specversion: 1.0\r\nce-source: {CE_SOURCE}\r\nce-type: {CE_TYPE}\r\n"
                          f"ce-{RUN_EXTENSION}: {run_id}\r\ncontent-type: application/octet-stream\r\n"
                          "ce-id: {id}\r\ncontent-length: {n}\r\n\r\n")
            self._id_before, _, self._id_after = self._head.replace("{n}", str(len(self.payload))).partition("{id}")

    async def connect(self) -> None:
        pass  # connections open as the first sends need them

    def start(self, book) -> None:
        from loadgen.http import HttpPool

        def on_write(ctx) -> int:
            sent = time.time_ns()
            book.sent(ctx[0], ctx[1], sent)
            return sent

        def on_done(ctx, sent: int, status: int | None, error: str | None) -> None:
            book.done(ctx[0], sent, status, error)

        self.pool = HttpPool(self.spec.host, self.spec.port, self.max_inflight, self.timeout_s, on_write, on_done)
        self.pool.start()

    def send(self, event_id: str, intended_ns: int) -> None:
        if self.structured:
            body = json.dumps({"specversion": "1.0", "id": event_id, "source": CE_SOURCE, "type": CE_TYPE,
                               RUN_EXTENSION: self.run_id, "datacontenttype": "application/octet-stream",
                               "data_base64": base64.b64encode(self.payload).decode()}).encode()
            head = self._head.format(n=len(body)).encode()
        else:
            body = self.payload
            head = (self._id_before + event_id + self._id_after).encode()
        self.pool.submit(head, body, (event_id, intended_ns))

    async def close(self) -> None:
        if self.pool:
            await self.pool.close()


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


def producer_config(spec: TargetSpec, timeout_s: float, max_inflight: int, options: dict) -> dict:
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
    Records are still keyed by event ID; nothing downstream reads the partition."""

    polled = True

    def __init__(self, spec: TargetSpec, timeout_s: float, max_inflight: int, run_id: str = "",
                 payload_bytes: int = 2048, client_options: dict | None = None) -> None:
        self.spec, self.timeout_s, self.run_id = spec, timeout_s, run_id
        self.payload = os.urandom(payload_bytes)
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

    async def connect(self) -> None:
        """Create the producer and learn the topic's partitions (a broker that is away fails here, before the start)."""
        from confluent_kafka import KafkaException, Producer

        self.producer = Producer(self.config)
        loop = asyncio.get_running_loop()
        try:
            md = await loop.run_in_executor(None, lambda: self.producer.list_topics(self.spec.path, timeout=self.timeout_s))
        except KafkaException as e:
            raise ConnectionError(f"kafka {self.spec}: {e.args[0].str() if e.args else e}") from None
        topic = md.topics.get(self.spec.path)
        self.partitions = max(len(topic.partitions) if topic is not None and topic.partitions else 1, 1)

    def start(self, book) -> None:
        self.book = book

    def _rfc3339(self, ns: int) -> bytes:
        """``ns`` as CloudEvents' ``time`` (RFC 3339, UTC, to the µs); the date part is formatted once a second."""
        second, frac = divmod(ns, 1_000_000_000)
        if second != self._second:
            self._second, self._second_text = second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second)).encode()
        return b"%s.%06dZ" % (self._second_text, frac // 1000)

    def send(self, event_id: str, intended_ns: int) -> None:
        book, key = self.book, event_id.encode()
        sent = time.time_ns()
        book.sent(event_id, intended_ns, sent)
        try:
            self.producer.produce(self.spec.path, self.payload, key, self._partition,
                                  headers=[(KAFKA_ID_HEADER, key), ("ce_time", self._rfc3339(sent)), *self._headers_tail],
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


def make_target(spec: TargetSpec, timeout_s: float, max_inflight: int, run_id: str = "", payload_bytes: int = 2048,
                kafka_options: dict | None = None):
    """The target for ``spec``; ``kafka_options``: the Kafka target's producer settings (``--kafka-option`` over
    FLIGHTWATCH_SUT_KAFKA_OPTIONS)."""
    if spec.scheme == "kafka":
        return KafkaTarget(spec, timeout_s, max_inflight, run_id, payload_bytes, kafka_options)
    return HttpTarget(spec, timeout_s, max_inflight, run_id, payload_bytes)
