"""One attack, around the workers (``loadgen.attack``): the run's markers in the telemetry topic (start, the
schedule's exact start, stop), the clock record, the live line each second, loadgen-bound seconds, thresholds, and
the reports."""
from __future__ import annotations

import atexit
import functools
import json
import os
import sys
import time

from core.pacer import NS_PER_S
from loadgen import report
from loadgen.stats import RunStats
from loadgen.thresholds import Sustained, run_value, second_value

LOADGEN_BOUND_RATIO = 0.95
"""A second in which fewer than this share of the scheduled sends went out marks the generator as the limit."""


def live_line(second: int, iv, scheduled: float, in_flight: int) -> str:
    p50, p99 = iv.latency_percentiles((50, 99))
    (d99,) = iv.delay_percentiles((99,))
    errors = sum(iv.errors.values())
    bound = iv.sent < LOADGEN_BOUND_RATIO * scheduled and second > 0
    return (f"{second:>4}s  sent {iv.sent:>7,}/s  completed {iv.completed:>7,}/s  errors {errors:>5,}  in flight {in_flight:>6,}  "
            f"send-delay p99 {report._ms(d99):>9}  latency p50 {report._ms(p50):>9} p99 {report._ms(p99):>9}"
            + (f"  LOADGEN SATURATED ({iv.sent:,} of {scheduled:,.0f})" if bound else ""))


@functools.cache
def _marker_producer(bootstrap: str, topic: str):
    """One producer for the run's markers (start, stop, heartbeats while the job starts), and the topic they go to."""
    from core.kafka_options import telemetry_producer
    from core.slices import TelemetryTopic

    to = TelemetryTopic.for_broker(topic, bootstrap)
    producer = telemetry_producer(bootstrap, **to.producer_settings())
    atexit.register(producer.flush, 10)
    return producer, to


def telemetry_marker(cfg, record) -> None:
    if not cfg.telemetry_bootstrap:
        return
    from core import contract

    p, topic = _marker_producer(cfg.telemetry_bootstrap, cfg.telemetry_topic)
    p.produce(topic(), contract.encode([record]), b"loadgen")
    p.flush(30)


def _report_clock(cfg) -> None:
    """This host's clock offset against the clock reference (FLIGHTWATCH_CLOCK_REFERENCE), as a clock record."""
    from core import clock

    reference = os.environ.get("FLIGHTWATCH_CLOCK_REFERENCE", clock.DEFAULT_REFERENCE)
    if not cfg.telemetry_bootstrap or reference == "none":
        return
    rec = clock.estimate_record(reference, cfg.sender, samples=8)
    if rec is not None:
        telemetry_marker(cfg, rec)


def attack(cfg, fail_on: list, abort_on: list, out: str, quiet: bool = False, metrics_listen: str | None = None) -> int:
    """Run the attack; exit code 0, 1 (a --fail-on crossed, or the attack failed) or 3 (stopped by --abort-on).
    While it runs, its figures are served as Prometheus metrics on ``metrics_listen`` (``loadgen.metrics``)."""
    import threading

    from core import contract, memory, metrics, observer
    from loadgen.attack import run_workers
    from loadgen.metrics import AttackMetrics

    memory.trace_from_env("loadgen")
    observer.register("loadgen")  # it and its workers count as flightwatch's CPU (core.observer)
    os.makedirs(out, exist_ok=True)
    hlog = report.HlogWriter(os.path.join(out, "latency.hlog"))
    stats = RunStats(cfg.workers, on_close=hlog.write)
    print(f"flightwatch attack: run {cfg.run_id} -> {cfg.target} pace {cfg.schedule.describe()} "
          f"({cfg.schedule.total_hits:,} events, {cfg.workers} workers)", flush=True)
    run_config = {"target": str(cfg.target), "pace": cfg.schedule.describe(), "workers": cfg.workers,
                  "payload_bytes": cfg.payload_bytes, "max_inflight": cfg.max_inflight}
    if cfg.scenario:
        run_config["scenario"] = cfg.scenario
    if cfg.shards > 1:  # the run's pace is the sum of the shards'; the job waits for every shard's stop
        run_config.update(pace=cfg.schedule.share(1.0 / cfg.shards).describe(), shard=cfg.shard, shards=cfg.shards,
                          shard_pace=cfg.schedule.describe())
    telemetry_marker(cfg, contract.RunStart(cfg.run_id, cfg.sender, time.time_ns(), config=json.dumps(run_config)))
    exposed = AttackMetrics(cfg.run_id, cfg.sender)
    server = metrics.serve(exposed, metrics_listen, log=lambda m: print(m, flush=True))

    parent_cpu = []

    def on_start(start_ns: int) -> None:  # the schedule's exact start, for the pace steps' boundaries
        parent_cpu.append(time.process_time())
        hlog.start(start_ns)
        whole = cfg.schedule.share(1.0 / cfg.shards) if cfg.shards > 1 else cfg.schedule  # the run's, all shards
        telemetry_marker(cfg, contract.RunStart(cfg.run_id, cfg.sender, start_ns, config=json.dumps(
            {**run_config, "schedule_start_ns": start_ns, "steps": whole.steps_from(start_ns)})))
    _report_clock(cfg)
    bound_seconds = []
    totals = {"sent": 0, "completed": 0}
    sustained = {t: Sustained(t) for t in fail_on if t.for_s}
    aborts = {t: Sustained(t) for t in abort_on}
    abort_event, aborted = threading.Event(), []

    def on_interval(worker: int, snap: dict) -> None:
        stats.merge(snap)

    def on_shipped(worker: int, before_s: int) -> None:
        for iv in stats.shipped(worker, before_s):
            on_second(iv)

    def on_second(iv) -> None:  # a second every worker is done with: live line, loadgen-bound, thresholds
        s2 = iv.second
        if s2 % 30 == 29:  # the .hlog encoder's buffers come and go through glibc's heap: hand back what is free
            memory.trim()
        scheduled = cfg.schedule.rate_at(s2 * NS_PER_S + NS_PER_S // 2)
        bound = s2 * NS_PER_S < cfg.schedule.duration_ns and s2 > 0 and iv.sent < LOADGEN_BOUND_RATIO * scheduled
        if bound:
            bound_seconds.append(s2)
        totals["sent"] += iv.sent
        totals["completed"] += iv.completed
        exposed.second(iv, scheduled if s2 * NS_PER_S < cfg.schedule.duration_ns else 0.0,
                       totals["sent"] - totals["completed"], bound)
        if not quiet and s2 * NS_PER_S < cfg.schedule.duration_ns + 60 * NS_PER_S:
            print(live_line(s2, iv, scheduled if s2 * NS_PER_S < cfg.schedule.duration_ns else 0,
                            totals["sent"] - totals["completed"]), flush=True)
        if s2 * NS_PER_S < cfg.schedule.duration_ns:
            for t, w in sustained.items():
                w.feed(s2, second_value(t, iv))
            for t, w in aborts.items():
                if w.feed(s2, second_value(t, iv)) and not aborted:
                    aborted.append((t, s2))
                    abort_event.set()
                    print(f"ABORT: {t.text} at {s2} s: stopping the attack", file=sys.stderr, flush=True)

    status = "completed"
    try:
        start_ns, attack_end_ns, results = run_workers(cfg, on_interval, on_start=on_start, stop_event=abort_event,
                                                       on_shipped=on_shipped)
    except KeyboardInterrupt:
        status = "aborted"
        print("attack interrupted", file=sys.stderr)
        telemetry_marker(cfg, contract.RunStop(cfg.run_id, cfg.sender, time.time_ns(), reason=status))
        metrics.stop(server)
        return 130  # the shell's code for Ctrl-C
    except RuntimeError as e:
        print(f"loadgen: attack failed: {e}", file=sys.stderr)
        telemetry_marker(cfg, contract.RunStop(cfg.run_id, cfg.sender, time.time_ns(), reason="failed"))
        metrics.stop(server)
        return 1
    finally:
        leftover = stats.close_all()  # none when every worker finished (each ships FINAL_S when done)
        hlog.close()
    for iv in leftover:
        on_second(iv)
    exposed.finished = 1
    metrics.stop(server)
    end_ns = time.time_ns()
    if aborted:
        status = f"aborted: {aborted[0][0].text}"
    telemetry_marker(cfg, contract.RunStop(cfg.run_id, cfg.sender, end_ns, reason=status))
    figs = report.figures(stats, attack_end_ns - start_ns, end_ns - attack_end_ns, str(cfg.target),
                          cfg.schedule.total_hits / (cfg.schedule.duration_ns / NS_PER_S))
    figs["run_id"] = cfg.run_id
    # due but never sent: the generator was still behind when the schedule ended (like vegeta, it stops there)
    figs["scheduled"] = cfg.schedule.total_hits
    figs["unsent"] = 0 if aborted else max(cfg.schedule.total_hits - figs["requests"], 0)
    figs["start_ns"] = start_ns
    figs["telemetry"] = {w: r["telemetry"] for w, r in results.items()}
    figs["loadgen_bound_seconds"] = bound_seconds
    if cfg.target.scheme == "kafka":  # what shaped its latency, as it took effect
        from loadgen.targets import producer_config, shaping

        figs["kafka_producer"] = shaping(producer_config(cfg.target, cfg.timeout_s, cfg.max_inflight,
                                                         cfg.sut_kafka_options or {}))
    workers_cpu = sum(r.get("cpu_s", 0.0) for r in results.values())
    parent = time.process_time() - parent_cpu[0] if parent_cpu else 0.0
    figs["cpu"] = {"workers_s": workers_cpu, "parent_s": parent, "total_s": workers_cpu + parent,  # start-up excluded
                   "us_per_event": (workers_cpu + parent) * 1e6 / figs["requests"] if figs["requests"] else 0.0}
    print()
    print(report.text(figs), end="")
    attack_s = (attack_end_ns - start_ns) / NS_PER_S
    if figs["rate_per_sec"] < LOADGEN_BOUND_RATIO * figs["requested_rate_per_sec"] or len(bound_seconds) > 0.2 * attack_s:
        print(f"loadgen saturated: achieved {figs['rate_per_sec']:,.0f}/s of {figs['requested_rate_per_sec']:,.0f}/s "
              f"(behind schedule in {len(bound_seconds)} s); add --workers or a host")
    if figs["unsent"]:
        print(f"loadgen: {figs['unsent']:,} of {figs['scheduled']:,} scheduled sends were still due when the schedule "
              "ended and were not sent (the generator was behind); add --workers or a host", file=sys.stderr)
    report.write_json(figs, os.path.join(out, "report.json"))
    with open(os.path.join(out, "report.txt"), "w") as f:
        f.write(report.text(figs))
    print(f"reports: {out}/report.txt, report.json, latency.hlog ({hlog.intervals} seconds)")
    failed = [t for t in fail_on if (sustained[t].crossed_at is not None if t.for_s else
                                     t.metric != "loss" and t.holds(run_value(t, figs)))]
    for t in failed:
        at = f" (from {sustained[t].crossed_at - t.for_s + 1} s)" if t.for_s else ""
        print(f"threshold crossed: {t.text}{at}", file=sys.stderr)
    if aborted:
        t, second = aborted[0]
        print(f"aborted by --abort-on {t.text!r} at {second} s", file=sys.stderr)
        return 3
    return 1 if failed else 0
