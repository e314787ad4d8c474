"""The attack loop: worker processes split one open-loop schedule; the parent merges and reports.

Worker w of W takes sends k = w, w+W, w+2W, ... Each send's intended time is
``start + schedule.intended_ns(k)``; when a worker is behind (or at MAX_INFLIGHT) it fires
as soon as it can and the lateness is recorded as send delay. A worker runs in turns, at most
one every ``TURN_NS``: each sends what fell due, no task or timer per event. Nothing is sent
after the schedule's end: a generator that could not keep up reports the shortfall (achieved vs
requested rate, seconds behind schedule) instead of running on.
The send stamp is taken by the target right before the event's bytes leave (``Book.sent``).
Per send the sender agent writes one line into the telemetry topic (batched, bounded, off the hot path:
``core.telemetry``): the send with its answer when the answer comes within ``contract.SEND_HOLD_NS``, else the send
then and its ack record when it is answered.
"""
from __future__ import annotations

import asyncio
import multiprocessing as mp
import queue as queue_mod
import time
from collections import deque
from dataclasses import dataclass, field

from core import contract, memory
from core.pacer import Schedule
from loadgen.stats import FINAL_S, NS_PER_S, Interval
from transports.registry import TargetOptions, TargetSpec, make_target

FIRE_AHEAD_NS = 200_000
"""Sends due within this much of now are fired in the same loop turn (timer granularity)."""
TURN_NS = 2_000_000
"""A worker's loop wakes at most this often: sends closer together go out together, up to 2 ms late (shown as send
delay). A wake-up per send cost more than the send: 200 µs of CPU an event at 2,500/s a worker into librdkafka;
with 1 ms turns 55 µs, with 2 ms turns 52 µs an event at 5,000/s (one worker, telemetry on)."""


@dataclass(frozen=True)
class AttackConfig:
    run_id: str
    target: TargetSpec
    schedule: Schedule
    workers: int = 2
    max_inflight: int = 1000        # per worker
    payload_bytes: int = 2048
    timeout_s: float = 30.0
    sender: str = "loadgen"
    shard: int = 0                  # this process's shard of ``shards`` that split the run's rate
    shards: int = 1
    telemetry_bootstrap: str | None = None
    telemetry_topic: str = "flightwatch.telemetry"
    kafka_options: dict = field(default_factory=dict)        # the telemetry clients' (FLIGHTWATCH_KAFKA_OPTIONS)
    sut_kafka_options: dict | None = None                    # the Kafka target's producer (--kafka-option, env)
    scenario: str | None = None     # the series the run belongs to (``runs history``)
    label: str | None = None        # the build or version under test, named at each change in ``runs history``
    warmup_s: float = 0.0           # the schedule's first seconds, left out of the latency figures (``runs.runinfo``)
    cooldown_s: float = 0.0         # and its last


def event_id(sender: str, k: int) -> str:
    return f"{sender}-{k}"


class Due:
    """The sends of one worker (k = first, first + stride, ...) as they fall due: pure schedule arithmetic."""

    def __init__(self, schedule: Schedule, start_ns: int, first: int, stride: int) -> None:
        self.start_ns, self.end_ns = start_ns, start_ns + schedule.duration_ns
        self._offsets = schedule.offsets(first, stride)
        self._advance()

    def _advance(self) -> None:
        nxt = next(self._offsets, None)
        if nxt is None:
            self.next_ns = None  # this worker has sent its share
        else:
            self.k, self.next_ns = nxt[0], self.start_ns + nxt[1]

    def take(self, now: int, limit: int) -> list[tuple[int, int]]:
        """(k, intended ns) of the sends due by now (within FIRE_AHEAD_NS), at most ``limit``; nothing after the end."""
        out = []
        if now >= self.end_ns + TURN_NS:  # like vegeta: nothing is sent after the schedule ends (and its last turn)
            self.next_ns = None
        horizon = now + FIRE_AHEAD_NS
        while self.next_ns is not None and self.next_ns <= horizon and len(out) < limit:
            out.append((self.k, self.next_ns))
            self._advance()
        return out

    def wait_s(self, now: int) -> float:
        """Seconds to wait before the next turn: until the next send is due, at least a turn (TURN_NS)."""
        if self.next_ns is None:
            return 0.0
        return max(self.next_ns - now - FIRE_AHEAD_NS // 2, TURN_NS) / NS_PER_S


class Book:
    """One worker's accounts: per-second intervals shipped to the parent, send and ack lines to the telemetry writer.

    The target calls ``sent`` at the send stamp (right before the event's bytes leave) and ``done`` when it is
    answered; the driver calls ``tick`` every loop turn, which hands the lines over in one piece. A send waits in
    ``held`` for its answer up to ``contract.SEND_HOLD_NS``, to be written with it as one line (at 5,000/s on the
    2-core machine the ack lines were 0.03 core of the generator and 0.04 of the job); a send still unanswered
    then is written alone at that turn, and its answer as an ack line."""

    def __init__(self, cfg: AttackConfig, worker: int, start_ns: int, out: mp.Queue, writer) -> None:
        self.cfg, self.worker, self.start_ns, self.out, self.writer = cfg, worker, start_ns, out, writer
        self.lines = contract.FastLines(cfg.run_id, f"{cfg.sender}-{worker}")
        self.intervals: dict[int, Interval] = {}
        self.buf: list[str] = []
        self.inflight = 0
        self.last_ship = 0
        self._iv, self._iv_start, self._iv_end = None, 0, 0  # the interval of the current second, and its bounds
        self._slot = None                 # a future the driver waits on while at max_inflight
        self._bytes = cfg.payload_bytes
        self._send_line = self.lines.send if writer is not None else None
        self.held: dict[str, tuple] = {}   # event ID -> (intended, sent, route) of the sends not yet written
        self._holding: deque[tuple[int, str]] = deque()  # (sent, event ID) in send order: when each hold ends

    def interval(self, t_ns: int) -> Interval:
        if self._iv is not None and self._iv_start <= t_ns < self._iv_end:
            return self._iv
        s = max((t_ns - self.start_ns) // NS_PER_S, 0)
        iv = self.intervals.get(s)
        if iv is None:
            iv = self.intervals[s] = Interval(s)
        if t_ns >= self.start_ns:
            self._iv, self._iv_start, self._iv_end = iv, self.start_ns + s * NS_PER_S, self.start_ns + (s + 1) * NS_PER_S
        return iv

    # sent and done run once an event each: the current second's interval is tested inline, and an answer without
    # status or error (a Kafka ack, a confirm) is counted without Interval.add_completion's branches; at a Kafka
    # ceiling of ~80,000/s each µs here is 8% of a core
    def sent(self, eid: str, intended: int, at: int, route: int | None = None) -> None:
        """``route``: where the target sent it among the places it picks from (``contract.Send.route``): a pair, a
        binding, a Kafka partition."""
        iv = self._iv if self._iv_start <= at < self._iv_end else self.interval(at)
        iv.add_send(at - intended, self._bytes)
        if self._send_line is not None:
            self.held[eid] = (intended, at, route)
            self._holding.append((at, eid))

    def done(self, eid: str, sent: int, status: int | None, error: str | None) -> None:
        acked = time.time_ns()
        if self._holding and self._holding[0][0] <= acked - contract.SEND_HOLD_NS:
            self.release(acked - contract.SEND_HOLD_NS)  # no line after this one is a send stamped before then
        self.inflight -= 1
        iv = self._iv if self._iv_start <= acked < self._iv_end else self.interval(acked)
        if status is None and error is None:
            iv.add_ok(acked - sent)
        else:
            iv.add_completion(acked - sent, status, error, not contract.is_failure(status, error))
        if self._send_line is not None:
            held = self.held.pop(eid, None)
            if held is None:
                self.buf.append(self.lines.ack(acked, eid, sent, status, error))
            else:
                self.buf.append(self.lines.send_acked(sent, eid, held[0], self._bytes, self.worker, acked, status, error,
                                                      held[2]))
        if self._slot is not None and not self._slot.done():
            self._slot.set_result(None)

    def slot(self) -> asyncio.Future:
        """Resolved at the next completion (the driver waits on it at max_inflight: the wait is send delay)."""
        self._slot = asyncio.get_running_loop().create_future()
        return self._slot

    def release(self, until_ns: int) -> None:
        """Write the sends stamped up to ``until_ns`` that wait for their answer still, alone."""
        holding, held, line = self._holding, self.held, self._send_line
        while holding and holding[0][0] <= until_ns:
            eid = holding.popleft()[1]
            h = held.pop(eid, None)
            if h is not None:
                self.buf.append(line(h[1], eid, h[0], self._bytes, self.worker, h[2]))

    def tick(self, now: int, final: bool = False) -> None:
        if self._holding:
            self.release(now if final else now - contract.SEND_HOLD_NS)
        if self.buf:
            self.writer.write_many(self.buf)
            self.buf = []
        now_s = (now - self.start_ns) // NS_PER_S
        if now_s > self.last_ship:
            self.ship(now_s)

    def ship(self, before_s: int) -> None:
        for s in sorted(k for k in self.intervals if k < before_s):
            iv = self.intervals.pop(s)
            if iv is self._iv:
                self._iv, self._iv_start, self._iv_end = None, 0, 0
            self.out.put(("interval", self.worker, iv.snapshot()))
        self.out.put(("shipped", self.worker, before_s))  # nothing before before_s will come from this worker
        self.last_ship = before_s


LINES_PER_MESSAGE = 1000
"""Send lines (and the ack lines of answers that came late) a telemetry message carries (``TelemetryWriter`` waits at most its linger, 100 ms, for them):
at 5,000 events/s ten messages a second instead of fifty, so fewer wake-ups of the writer's thread, produce calls,
broker requests and messages for the job. The telemetry broker at 5,000/s, lz4: 0.029-0.032 core with 200 lines a
message (two runs), 0.019-0.023 with 1,000 (five)."""
STOP_CHECK_NS = 50_000_000
"""How often a driver looks at the parent's stop event (a lock and a semaphore: not every turn)."""


def _turns(cfg: AttackConfig, target, book: Book, due: Due, stop):
    """One loop turn of a worker, as a function: send what is due (up to max_inflight), hand the lines over;
    False once the worker's sends are over or the parent said stop. The drivers below only differ in how
    they wait between turns."""
    cap, next_stop_check = cfg.max_inflight, [0]

    def turn() -> bool:
        now = time.time_ns()
        if now >= next_stop_check[0]:
            if stop.is_set():
                return False
            next_stop_check[0] = now + STOP_CHECK_NS
        if book.inflight < cap:
            for k, intended in due.take(now, cap - book.inflight):
                book.inflight += 1
                target.send(event_id(cfg.sender, k), intended)
            if due.next_ns is None:
                return False
        book.tick(now)
        return True
    return turn


async def _drive_async(cfg: AttackConfig, target, book: Book, due: Due, stop) -> int:
    """The loop for targets that live on the event loop (HTTP); returns when the attack's sends ended."""
    turn = _turns(cfg, target, book, due, stop)
    while turn():
        if book.inflight >= cfg.max_inflight:
            await book.slot()  # at MAX_INFLIGHT: the wait shows as send delay
        else:
            await asyncio.sleep(due.wait_s(time.time_ns()))
    return time.time_ns()


def _drive_polled(cfg: AttackConfig, target, book: Book, due: Due, stop) -> int:
    """The loop for a target with its own I/O threads (librdkafka): ``target.poll(timeout)`` serves its completions."""
    turn = _turns(cfg, target, book, due, stop)
    while turn():
        target.poll(0.01 if book.inflight >= cfg.max_inflight else due.wait_s(time.time_ns()))
    return time.time_ns()


async def _attack(cfg: AttackConfig, worker: int, start_at, out: mp.Queue, stop) -> dict:
    target = make_target(cfg.target, TargetOptions(cfg.timeout_s, cfg.max_inflight, cfg.run_id, cfg.payload_bytes,
                                                   cfg.sut_kafka_options))
    writer = None
    if cfg.telemetry_bootstrap:
        from core.kafka_options import telemetry_producer
        from core.slices import TelemetryTopic
        from core.telemetry import TelemetryWriter

        topic = TelemetryTopic.for_broker(cfg.telemetry_topic, cfg.telemetry_bootstrap, cfg.kafka_options)
        producer = telemetry_producer(cfg.telemetry_bootstrap, cfg.kafka_options, **topic.producer_settings())
        writer = TelemetryWriter(producer, topic, agent=f"{cfg.sender}-{worker}", records_per_message=LINES_PER_MESSAGE)
    await target.connect()
    attached_ns = getattr(target, "attached_ns", None)  # every link attached (AMQP 1.0 pairs), before the start
    out.put(("ready", worker, None))
    while start_at.value == 0:  # the parent sets the common start once every worker is ready
        if stop.is_set():
            return {"attack_end_ns": time.time_ns(), "telemetry": {}}
        await asyncio.sleep(0.01)
    start_ns = start_at.value
    cpu0 = time.process_time()  # this worker's CPU from here on, every thread (its client's I/O threads too)
    trimmer = asyncio.create_task(memory.trim_every())  # a stall's high-water mark does not stay for the run
    book = Book(cfg, worker, start_ns, out, writer)
    target.start(book)
    due = Due(cfg.schedule, start_ns, worker, cfg.workers)
    if target.polled:
        attack_end = await asyncio.get_running_loop().run_in_executor(None, _drive_polled, cfg, target, book, due, stop)
    else:
        attack_end = await _drive_async(cfg, target, book, due, stop)
    while book.inflight:  # wait for what is in flight (each send is bounded by the timeout)
        if target.polled:
            await asyncio.get_running_loop().run_in_executor(None, target.poll, 0.05)
        else:
            await asyncio.sleep(0.05)
        book.tick(time.time_ns())
    book.tick(time.time_ns(), final=True)
    book.ship(FINAL_S)
    trimmer.cancel()
    await target.close()
    counters = {}
    if writer:
        writer.close()
        counters = writer.counters()
    return {"attack_end_ns": attack_end, "telemetry": counters, "cpu_s": time.process_time() - cpu0,
            "attached_ns": attached_ns}


def worker_main(cfg: AttackConfig, worker: int, start_at, out: mp.Queue, stop) -> None:
    try:
        try:
            import uvloop
            uvloop.install()
        except ImportError:
            pass
        result = asyncio.run(_attack(cfg, worker, start_at, out, stop))
        out.put(("done", worker, result))
    except Exception as e:  # noqa: BLE001 - reported to the parent, which fails the run
        out.put(("failed", worker, f"{type(e).__name__}: {e}"))


def run_workers(cfg: AttackConfig, on_interval, start_delay_s: float = 0.2, stop_event=None, on_start=None,
                on_shipped=None):
    """Start the workers, feed every interval snapshot to ``on_interval`` as it arrives.

    ``on_shipped(worker, before_s)`` follows a worker's snapshots: it has shipped every second
    before before_s (``stats.FINAL_S`` once it is done).

    ``on_start(start_ns)`` is called once all workers are ready, with the schedule's start time.

    Returns (start_ns, attack_end_ns, per-worker results). Raises RuntimeError if a worker failed.
    """
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    stop = ctx.Event()
    start_at = ctx.Value("q", 0)
    procs = [ctx.Process(target=worker_main, args=(cfg, w, start_at, out, stop), daemon=True) for w in range(cfg.workers)]
    ready = 0
    for p in procs:
        p.start()
    results, failures = {}, []
    try:
        while len(results) + len(failures) < cfg.workers:
            if stop_event is not None and stop_event.is_set():
                stop.set()
            try:
                kind, worker, payload = out.get(timeout=0.2)
            except queue_mod.Empty:
                if not any(p.is_alive() for p in procs) and out.empty():
                    failures.append("worker exited without a report")
                    break
                continue
            if kind == "ready":
                ready += 1
                if ready == cfg.workers:
                    start_at.value = time.time_ns() + int(start_delay_s * NS_PER_S)
                    if on_start is not None:
                        on_start(start_at.value)
            elif kind == "interval":
                on_interval(worker, payload)
            elif kind == "shipped":
                if on_shipped is not None:
                    on_shipped(worker, payload)
            elif kind == "done":
                results[worker] = payload
            else:
                failures.append(payload)
    except KeyboardInterrupt:
        stop.set()
        raise
    finally:
        for p in procs:
            p.join(timeout=10)
    if failures:
        raise RuntimeError("; ".join(failures))
    return start_at.value, max(r["attack_end_ns"] for r in results.values()), results
