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
import socket
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

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
    def parse(cls, text: str) -> "TargetSpec":
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


def tcp_unreachable(host: str, port: int, timeout_s: float = 3.0) -> str | None:
    """None if a TCP connection to host:port opens, else why not."""
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
        return None
    except OSError as e:
        return e.strerror or str(e)


def error_cause(exc: BaseException) -> str:
    """A short, stable name for a failed send (what vegeta's report lists as errors)."""
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
        return "timeout"
    if isinstance(exc, ConnectionRefusedError) or "Connect call failed" in str(exc) or "refused" in str(exc).lower():
        return "connection refused"
    if isinstance(exc, ConnectionResetError) or "reset" in str(exc).lower():
        return "connection reset"
    name = type(exc).__name__
    return {"ServerDisconnectedError": "server disconnected", "ClientOSError": "connection error",
            "ClientConnectorError": "connection refused", "KafkaTimeoutError": "timeout"}.get(name, name)


RUN_EXTENSION = "fwrun"
"""CloudEvents extension attribute (HTTP ``ce-fwrun``, Kafka header ``fw_run``) carrying the run ID to receivers."""


class HttpTarget:
    """CloudEvents over HTTP/1.1 through ``loadgen.http`` (keep-alive, at most ``max_inflight`` connections)."""

    def __init__(self, spec: TargetSpec, timeout_s: float, max_inflight: int, run_id: str = "") -> None:
        self.spec, self.timeout_s, self.max_inflight, self.run_id = spec, timeout_s, max_inflight, run_id
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

    async def start(self) -> None:
        from loadgen.http import HttpPool

        self.pool = HttpPool(self.spec.host, self.spec.port, self.max_inflight, self.timeout_s)
        self.pool.start()

    async def send(self, event_id: str, payload: bytes) -> tuple[int | None, str | None]:
        if self.structured:
            body = json.dumps({"specversion": "1.0", "id": event_id, "source": CE_SOURCE, "type": CE_TYPE,
                               RUN_EXTENSION: self.run_id, "datacontenttype": "application/octet-stream",
                               "data_base64": base64.b64encode(payload).decode()}).encode()
            head = self._head.format(n=len(body)).encode()
        else:
            body = payload
            head = self._head.format(id=event_id, n=len(body)).encode()
        return await self.pool.request(head, body)

    async def close(self) -> None:
        if self.pool:
            await self.pool.close()


class KafkaTarget:
    """kafka-python producer; its futures are bridged into the event loop."""

    def __init__(self, spec: TargetSpec, timeout_s: float, max_inflight: int, run_id: str = "",
                 client_options: dict | None = None) -> None:
        self.spec, self.timeout_s, self.run_id = spec, timeout_s, run_id
        if client_options is None:
            from agents.kafka_options import SUT_ENV
            from agents.kafka_options import client_options as from_env

            client_options = from_env(env=SUT_ENV)
        self.client_options = client_options
        self.producer = None
        self.loop = None

    async def start(self) -> None:
        from collections import deque

        from kafka import KafkaProducer

        self.loop = asyncio.get_running_loop()
        self.producer = await self.loop.run_in_executor(None, lambda: KafkaProducer(
            bootstrap_servers=f"{self.spec.host}:{self.spec.port}", linger_ms=5, acks=1, batch_size=1 << 20,
            request_timeout_ms=int(self.timeout_s * 1000), delivery_timeout_ms=int(self.timeout_s * 1000) + 5,
            **self.client_options))
        # Acks arrive on the producer's thread; they are handed over through a deque that the
        # loop drains every millisecond (one wake-up per record would cost more than the send).
        self._acks: deque = deque()
        self._drainer = asyncio.create_task(self._drain())

    async def _drain(self) -> None:
        while True:
            await asyncio.sleep(0.001)
            while self._acks:
                fut, result = self._acks.popleft()
                if not fut.done():
                    fut.set_result(result)

    async def send(self, event_id: str, payload: bytes) -> tuple[int | None, str | None]:
        done = self.loop.create_future()
        acks = self._acks
        try:
            f = self.producer.send(self.spec.path, key=event_id.encode(), value=payload,
                                   headers=[("ce_id", event_id.encode()), ("ce_type", CE_TYPE.encode()),
                                            ("fw_run", self.run_id.encode())])
        except Exception as e:  # noqa: BLE001
            return None, error_cause(e)
        f.add_callback(lambda _: acks.append((done, (None, None))))
        f.add_errback(lambda exc: acks.append((done, (None, error_cause(exc)))))
        return await done  # the producer's delivery timeout bounds the wait

    async def close(self) -> None:
        if self.producer:
            await self.loop.run_in_executor(None, lambda: self.producer.close(timeout=5))
            self._drainer.cancel()


def make_target(spec: TargetSpec, timeout_s: float, max_inflight: int, run_id: str = ""):
    cls = KafkaTarget if spec.scheme == "kafka" else HttpTarget
    return cls(spec, timeout_s, max_inflight, run_id)
