"""Writing telemetry without stalling the measured work: a bounded, batching, background writer.

    writer = TelemetryWriter(producer, topic, agent="sender-0")
    writer.write(contract.Send(...))      # never blocks; counted as lost if the buffer is full
    ...
    writer.close()                        # flushes what is buffered

Records are batched as NDJSON, up to ``records_per_message`` a message or every
``linger_s``, keyed by the agent's name (one agent's records stay in order on one
partition). When the broker is slow or down the buffer grows up to ``max_buffered``
records; past that, new records are counted in ``num_lost`` and never block the caller.
A message the broker refuses is put back at the head of the buffer and sent again
(``num_retried``): delivery is at-least-once, and the streaming job recognises an identical
re-sent send or receive record, so nothing is lost and nothing counted twice.
"""
from __future__ import annotations

import threading
import time
from collections import deque

from core import contract
from core.held import HELD_S

MAX_BUFFERED_RECORDS = 2_000_000
"""Records held in memory while the telemetry broker is slow or away (about 300 MB at most)."""


class MessageTooLarge(Exception):
    """The broker refused a message for its size: sending it again cannot help."""


class TelemetryWriter:
    def __init__(self, producer, topic, agent: str, records_per_message: int = 200,
                 linger_s: float = 0.1, max_buffered: int = MAX_BUFFERED_RECORDS) -> None:
        """``producer``: librdkafka's (``core.kafka_options.telemetry_producer``); ``topic``: a topic's name, or a
        ``core.slices.TelemetryTopic`` (asked for the topic of each message)."""
        self.producer = producer
        self.topic = str(topic)
        self._topic_now = topic if callable(topic) else (lambda: self.topic)
        self._forget = getattr(topic, "forget", None)  # a slice a write failed on is made sure of again
        self.key = agent.encode()
        self.records_per_message = records_per_message
        self.linger_s = linger_s
        self.max_buffered = max_buffered
        self._buf: deque = deque()
        self._cond = threading.Condition()
        self._closed = False
        self.num_written = 0   # accepted by write()
        self.num_lost = 0      # refused: buffer full
        self.num_sent = 0      # acknowledged by the broker
        self.num_failed = 0    # records the broker refused for good (too large)
        self.num_retried = 0   # records put back after a failed send
        self.num_held = 0      # records acknowledged HELD_S or more after they were produced (core.held)
        self._hold: tuple[int, int, int] | None = None  # (first produced, longest wait in ns, records) of a hold
        self._connected = False  # a first message acknowledged: a wait before it is the connection's set-up
        self._in_flight = 0
        self._thread = threading.Thread(target=self._run, name=f"telemetry-{agent}", daemon=True)
        self._thread.start()

    def write(self, record: contract.Record | dict) -> bool:
        """Queue one record; False (and counted in num_lost) when the buffer is full."""
        with self._cond:
            if len(self._buf) >= self.max_buffered:
                self.num_lost += 1
                return False
            self._buf.append(record)
            self.num_written += 1
            if len(self._buf) >= self.records_per_message:
                self._cond.notify()
        return True

    def write_many(self, records: list) -> int:
        """Queue a list of records under one lock; those past a full buffer are counted in num_lost."""
        with self._cond:
            room = max(self.max_buffered - len(self._buf), 0)
            taken = records if len(records) <= room else records[:room]
            self._buf.extend(taken)
            self.num_written += len(taken)
            self.num_lost += len(records) - len(taken)
            if len(self._buf) >= self.records_per_message:
                self._cond.notify()
        return len(taken)

    def _take(self) -> list:
        with self._cond:
            n = min(len(self._buf), self.records_per_message)
            chunk = [self._buf.popleft() for _ in range(n)]
            self._in_flight += n
            return chunk

    def _on_sent(self, n: int):
        def ok(_):
            with self._cond:
                self.num_sent += n
                self._in_flight -= n
                self._cond.notify_all()
        return ok

    def _on_failed(self, chunk: list, topic: str = ""):
        def err(exc):
            if self._forget is not None and topic:
                self._forget(topic)
            with self._cond:
                self._in_flight -= len(chunk)
                if isinstance(exc, MessageTooLarge):
                    self.num_failed += len(chunk)
                else:  # back to the head of the buffer, in order
                    self._buf.extendleft(reversed(chunk))
                    self.num_retried += len(chunk)
                self._cond.notify_all()
        return err

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._closed and len(self._buf) < self.records_per_message:
                    self._cond.wait(self.linger_s)
                if self._closed and not self._buf:
                    return
            while True:
                chunk = self._take()
                if not chunk:
                    break
                topic = ""
                try:
                    topic = self._topic_now()
                    self.producer.produce(topic, contract.encode(chunk), self.key,
                                          on_delivery=self._on_delivery(chunk, topic, time.time_ns()))
                except Exception as exc:  # noqa: BLE001 - e.g. librdkafka's queue full: keep the records, try again
                    self._on_failed(chunk, topic)(exc)
                    time.sleep(0.1)
                    continue
            self.producer.poll(0)  # delivery reports (and librdkafka's log lines) are served here and by flush

    def _on_delivery(self, chunk: list, topic: str, produced_ns: int):
        def report(err, _msg) -> None:
            if err is None:
                self._on_sent(len(chunk))(None)
                self._note_wait(len(chunk), produced_ns)
                return
            from confluent_kafka import KafkaError

            self._on_failed(chunk, topic)(MessageTooLarge(err.str()) if err.code() == KafkaError.MSG_SIZE_TOO_LARGE
                                          else RuntimeError(err.str()))
        return report

    def _note_wait(self, n: int, produced_ns: int) -> None:
        """A message acknowledged ``core.held.HELD_S`` or more after it was produced joins the hold (not the first
        message: it waited for the connection); the first one quick again after a hold ends it, and the hold is said
        (``report_hold``)."""
        waited = time.time_ns() - produced_ns
        with self._cond:  # delivery reports are served by the writer's thread and by a flush from another
            if waited < HELD_S * 1e9 or not self._connected:
                self._connected = True
                self.report_hold()
                return
            h = self._hold
            self._hold = (min(h[0], produced_ns), max(h[1], waited), h[2] + n) if h else (produced_ns, waited, n)

    def report_hold(self) -> None:
        """A hold that ended (``_note_wait``): a ``TelemetryHeld`` record written like any other (the agent's
        name, when it began, how long the longest message waited, how many records waited)."""
        if (h := self._hold) is None:
            return
        self._hold = None
        self.num_held += h[2]
        self.write(contract.TelemetryHeld(contract.ANY_RUN, self.key.decode(), h[0], count=h[2], value=round(h[1] / 1e9, 3)))

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until every record written so far is acknowledged or failed."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            self._cond.notify()
        while time.monotonic() < deadline:
            with self._cond:
                if not self._buf and self._in_flight == 0:
                    return True
            self.producer.flush(timeout=max(0.0, deadline - time.monotonic()))
            time.sleep(0.01)
        return False

    def close(self, timeout_s: float = 30.0) -> bool:
        done = self.flush(timeout_s)
        if self._hold is not None:  # the last messages were held: said before the writer goes
            self.report_hold()
            done = self.flush(timeout_s) and done
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout_s)
        return done

    def counters(self) -> dict:
        with self._cond:
            return {"written": self.num_written, "sent": self.num_sent, "lost": self.num_lost,
                    "failed": self.num_failed, "retried": self.num_retried, "held": self.num_held,
                    "buffered": len(self._buf)}
