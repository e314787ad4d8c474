"""CloudEvents over HTTP/1.1 (the Knative broker's ingress, any CloudEvents sink).

    http://127.0.0.1:8080/            binary mode (ce-* headers)
    http+structured://host:port/path  structured mode (JSON envelope)
    http://user:password@host/path    with basic auth
    https://host:8443/?cafile=ca.pem  over TLS, the certificate and host name checked against the CA (core.tls)
"""
from __future__ import annotations

import base64
import json
import os
import time

from core import tls
from core.cloudevents import RUN_ATTRIBUTE
from transports.base import Book, TargetOptions, no_consumers, no_receiver_args, one_receiver, tcp_reachable
from transports.errors import error_cause

CE_SOURCE = "flightwatch/loadgen"
CE_TYPE = "dev.flightwatch.load"


RUN_EXTENSION = RUN_ATTRIBUTE
"""CloudEvents extension attribute (HTTP ``ce-fwrun``, Kafka header ``ce_fwrun``) carrying the run ID to receivers."""


class HttpTarget:
    """CloudEvents over HTTP/1.1 through ``transports.http.client`` (keep-alive, at most ``max_inflight`` connections).

    The send stamp is taken by the pool right before the request's bytes are written to its connection:
    a wait for a connection (one being opened, or all busy) comes before it, and shows as send delay."""

    SCHEMES = ("http", "http+structured", "https", "https+structured")
    RECEIVER = "http"
    TLS_PORT = 443
    SECURE = {"http": "https", "http+structured": "https+structured"}
    DEFAULT_PORT = 80
    EXAMPLE = "http://HOST:PORT/PATH (binary CloudEvents), http+structured://..., https://...?cafile=CA.pem"
    TAKES_KAFKA_OPTIONS = False
    polled = False

    # no receiver to start for a run: the system under test delivers to flightwatch's HTTP receiver
    receiver_args = staticmethod(no_receiver_args)
    reachable = staticmethod(tcp_reachable)
    consumers = staticmethod(no_consumers)
    share_args = staticmethod(one_receiver)  # none is started: the SUT delivers to flightwatch's

    @staticmethod
    def receiver_place(flags: list[str]) -> str | None:
        """None: an HTTP receiver listens; it does not consume a place a target names."""
        return None

    def __init__(self, spec, opts: TargetOptions) -> None:
        self.spec, self.timeout_s, self.max_inflight, self.run_id = spec, opts.timeout_s, opts.max_inflight, opts.run_id
        run_id = opts.run_id
        self.payload = os.urandom(opts.payload_bytes)
        self.structured = spec.scheme.endswith("+structured")
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

    @staticmethod
    def check(scheme: str, path: str, userinfo: str | None, query: str) -> str:
        return path or "/"

    async def connect(self) -> None:
        """Plain HTTP: nothing (connections open as the first sends need them). HTTPS: one TLS handshake first, so
        that an untrusted certificate or a host name it does not have ends the attack in one line before the load."""
        if self.spec.tls is None:
            return
        import asyncio

        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(
                self.spec.host, self.spec.port, ssl=self.spec.tls.context(), server_hostname=self.spec.host),
                self.timeout_s)
        except (TimeoutError, OSError) as e:
            raise ConnectionError(f"{self.spec}: {tls.cause(e) or error_cause(e)}") from None
        writer.close()

    def start(self, book: Book) -> None:
        from transports.http.client import HttpPool

        def on_write(ctx) -> int:
            sent = time.time_ns()
            book.sent(ctx[0], ctx[1], sent)
            return sent

        def on_done(ctx, sent: int, status: int | None, error: str | None) -> None:
            book.done(ctx[0], sent, status, error)

        self.pool = HttpPool(self.spec.host, self.spec.port, self.max_inflight, self.timeout_s, on_write, on_done,
                             ssl=self.spec.tls.context() if self.spec.tls else None)
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

    def poll(self, timeout_s: float) -> int:
        raise NotImplementedError("an HTTP target lives on the event loop")

    def shaping(self) -> dict | None:
        return None

    async def close(self) -> None:
        if self.pool:
            await self.pool.close()
