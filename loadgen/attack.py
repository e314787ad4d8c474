"""The attack loop: worker processes split one open-loop schedule; the parent merges and reports.

Worker w of W takes sends k = w, w+W, w+2W, ... Each send's intended time is
``start + schedule.intended_ns(k)``; when a worker is behind (or at MAX_INFLIGHT) it fires
as soon as it can and the lateness is recorded as send delay. Nothing is sent after the
schedule's end: a generator that could not keep up reports the shortfall (achieved vs
requested rate, seconds behind schedule) instead of running on.
Per send the sender agent writes a send record and, on completion, an ack record into the
telemetry topic (batched, bounded, off the hot path: ``agents.telemetry``).
"""
from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import queue as queue_mod
import time
from dataclasses import dataclass, field

from agents import contract, memory
from loadgen.pacer import Schedule
from loadgen.stats import FINAL_S, NS_PER_S, Interval
from loadgen.targets import TargetSpec, make_target

FIRE_AHEAD_NS = 200_000
"""Sends due within this much of now are fired in the same loop turn (timer granularity)."""


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
    kafka_options: dict = field(default_factory=dict)


def event_id(sender: str, k: int) -> str:
    return f"{sender}-{k}"


async def _attack(cfg: AttackConfig, worker: int, start_at, out: mp.Queue, stop) -> dict:
    target = make_target(cfg.target, cfg.timeout_s, cfg.max_inflight, cfg.run_id)
    await target.start()
    writer = None
    if cfg.telemetry_bootstrap:
        from kafka import KafkaProducer

        from agents.telemetry import TelemetryWriter

        producer = KafkaProducer(bootstrap_servers=cfg.telemetry_bootstrap.split(","), linger_ms=20,
                                 batch_size=1 << 20, max_request_size=8 << 20, **cfg.kafka_options)
        writer = TelemetryWriter(producer, cfg.telemetry_topic, agent=f"{cfg.sender}-{worker}")
    payload = os.urandom(cfg.payload_bytes)
    out.put(("ready", worker, None))
    while start_at.value == 0:  # the parent sets the common start once every worker is ready
        if stop.is_set():
            return {"attack_end_ns": time.time_ns(), "telemetry": {}}
        await asyncio.sleep(0.01)
    start_ns = start_at.value
    trimmer = asyncio.create_task(memory.trim_every())  # a stall's high-water mark does not stay for the run
    slots = asyncio.Semaphore(cfg.max_inflight)
    intervals: dict[int, Interval] = {}
    pending: set[asyncio.Task] = set()
    agent = f"{cfg.sender}-{worker}"
    lines = contract.FastLines(cfg.run_id, agent)

    def interval(t_ns: int) -> Interval:
        s = max((t_ns - start_ns) // NS_PER_S, 0)
        iv = intervals.get(s)
        if iv is None:
            iv = intervals[s] = Interval(s)
        return iv

    def ship(before_s: int) -> None:
        for s in sorted(k for k in intervals if k < before_s):
            out.put(("interval", worker, intervals.pop(s).snapshot()))
        out.put(("shipped", worker, before_s))  # nothing before before_s will come from this worker

    async def one(k: int, intended: int) -> None:
        eid = event_id(cfg.sender, k)
        sent = time.time_ns()
        interval(sent).add_send(sent - intended, cfg.payload_bytes)
        if writer:
            writer.write(lines.send(sent, eid, intended, cfg.payload_bytes, worker))
        try:
            status, error = await target.send(eid, payload)
        finally:
            slots.release()
        acked = time.time_ns()
        ok = error is None and (status is None or 200 <= status < 300)
        interval(acked).add_completion(acked - sent, status, error, ok)
        if writer:
            writer.write(lines.ack(acked, eid, sent, status, error))

    k = worker
    last_ship = 0
    end_ns = start_ns + cfg.schedule.duration_ns
    while not stop.is_set():
        offset = cfg.schedule.intended_ns(k)
        if offset is None or time.time_ns() >= end_ns:  # like vegeta: nothing is sent after the schedule ends
            break
        intended = start_ns + offset
        now = time.time_ns()
        if intended - now > FIRE_AHEAD_NS:
            await asyncio.sleep((intended - now - FIRE_AHEAD_NS // 2) / NS_PER_S)
        await slots.acquire()  # at MAX_INFLIGHT this waits: the wait shows as send delay
        task = asyncio.create_task(one(k, intended))
        pending.add(task)
        task.add_done_callback(pending.discard)
        k += cfg.workers
        now_s = (time.time_ns() - start_ns) // NS_PER_S
        if now_s > last_ship:
            ship(now_s)
            last_ship = now_s
    attack_end = time.time_ns()
    while pending:  # wait for what is in flight (each send is bounded by the timeout)
        await asyncio.sleep(0.05)
        now_s = (time.time_ns() - start_ns) // NS_PER_S
        if now_s > last_ship:
            ship(now_s)
            last_ship = now_s
    ship(FINAL_S)
    trimmer.cancel()
    await target.close()
    counters = {}
    if writer:
        writer.close()
        counters = writer.counters()
        writer.producer.close()
    return {"attack_end_ns": attack_end, "telemetry": counters}


def worker_main(cfg: AttackConfig, worker: int, start_at, out: mp.Queue, stop) -> None:
    try:
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
