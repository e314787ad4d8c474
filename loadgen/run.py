"""One attack, around the workers (``loadgen.attack``): the run's markers in the telemetry topic (start, the
schedule's exact start, stop), the clock record, the live line each second, loadgen-bound seconds, thresholds, and
the reports."""
from __future__ import annotations

import atexit
import dataclasses
import functools
import json
import os
import sys
import time

from core import settings
from core.pacer import NS_PER_S
from core.thresholds import Sustained, run_value, second_value
from loadgen import report
from loadgen.stats import RunStats

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


def telemetry_marker(cfg, *records) -> None:
    if not cfg.telemetry_bootstrap:
        return
    from core import contract

    p, topic = _marker_producer(cfg.telemetry_bootstrap, cfg.telemetry_topic)
    p.produce(topic(), contract.encode(list(records)), b"loadgen")
    p.flush(30)


def _clock_every(cfg, stopping) -> None:
    """Again every ``core.clock.REPORT_EVERY_S`` while the attack runs: the job corrects stamps by the estimate in force."""
    from core.clock import REPORT_EVERY_S

    while not stopping.wait(REPORT_EVERY_S):
        _report_clock(cfg)


def _report_clock(cfg) -> None:
    """This host's clock offset against the clock reference (FLIGHTWATCH_CLOCK_REFERENCE), as a clock record."""
    from core import clock

    reference = settings.get("FLIGHTWATCH_CLOCK_REFERENCE", clock.DEFAULT_REFERENCE)
    if not cfg.telemetry_bootstrap or reference == "none":
        return
    rec = clock.estimate_record(reference, cfg.sender, samples=8)
    if rec is not None:  # the run's markers are the sender's, its sends and acks each worker's: one host, one clock
        workers = [dataclasses.replace(rec, agent=f"{cfg.sender}-{w}") for w in range(cfg.workers)]
        telemetry_marker(cfg, rec, *workers)


class Attack:
    """One attack, in the order it runs, as vegeta's ``Attacker`` and ``Metrics`` hold theirs:

        >>> Attack(cfg, fail_on, abort_on, out).run()      # the exit code: 0, 1, 3 or 130

    ``begin`` (reports open, the run's start marker, the metrics server, the clock record), ``on_start`` (the
    schedule's exact start), ``on_second`` (each second every worker is done with: the live line, loadgen-bound
    seconds, thresholds), ``stop`` (the stop marker), ``figures`` and ``write_reports`` (vegeta's report), ``verdict``
    (the thresholds' exit code). While it runs, its figures are served as Prometheus metrics on ``metrics_listen``
    (``loadgen.metrics``)."""

    def __init__(self, cfg, fail_on: list, abort_on: list, out: str, quiet: bool = False,
                 metrics_listen: str | None = None) -> None:
        import threading

        self.cfg, self.fail_on, self.out, self.quiet, self.metrics_listen = cfg, fail_on, out, quiet, metrics_listen
        self.sustained = {t: Sustained(t) for t in fail_on if t.for_s}
        self.aborts = {t: Sustained(t) for t in abort_on}
        self.abort_event, self.aborted, self.stopping = threading.Event(), [], threading.Event()
        self.bound_seconds: list[int] = []
        self.totals = {"sent": 0, "completed": 0}
        self.parent_cpu: list[float] = []
        self.hlog = self.stats = self.exposed = self.server = None
        self.run_config: dict = {}

    def run(self) -> int:
        from loadgen.attack import run_workers

        self.begin()
        try:
            start_ns, attack_end_ns, results = run_workers(self.cfg, lambda w, snap: self.stats.merge(snap),
                                                           on_start=self.on_start, stop_event=self.abort_event,
                                                           on_shipped=self.on_shipped)
        except KeyboardInterrupt:
            print("attack interrupted", file=sys.stderr)
            self.stop("aborted")
            return 130  # the shell's code for Ctrl-C
        except RuntimeError as e:
            print(f"loadgen: attack failed: {e}", file=sys.stderr)
            self.stop("failed")
            return 1
        finally:
            leftover = self.stats.close_all()  # none when every worker finished (each ships FINAL_S when done)
            self.hlog.close()
        for iv in leftover:
            self.on_second(iv)
        self.exposed.finished = 1
        end_ns = self.stop(f"aborted: {self.aborted[0][0].text}" if self.aborted else "completed")
        figs = self.figures(start_ns, attack_end_ns, end_ns, results)
        self.write_reports(figs, attack_end_ns - start_ns)
        return self.verdict(figs)

    def begin(self) -> None:
        from core import contract, memory, metrics, observer
        from loadgen.metrics import AttackMetrics

        cfg = self.cfg
        memory.trace_from_env("loadgen")
        observer.register("loadgen")  # it and its workers count as flightwatch's CPU (core.observer)
        os.makedirs(self.out, exist_ok=True)
        self.hlog = report.HlogWriter(os.path.join(self.out, "latency.hlog"))
        self.stats = RunStats(cfg.workers, on_close=self.hlog.write)
        print(f"flightwatch attack: run {cfg.run_id} -> {cfg.target} pace {cfg.schedule.describe()} "
              f"({cfg.schedule.total_hits:,} events, {cfg.workers} workers)", flush=True)
        self.run_config = run_config(cfg)
        telemetry_marker(cfg, contract.RunStart(cfg.run_id, cfg.sender, time.time_ns(), config=json.dumps(self.run_config)))
        self.exposed = AttackMetrics(cfg.run_id, cfg.sender)
        self.server = metrics.serve(self.exposed, self.metrics_listen, log=lambda m: print(m, flush=True))
        _report_clock(cfg)
        import threading

        self.clock_thread = threading.Thread(target=_clock_every, args=(cfg, self.stopping), name="clock", daemon=True)
        self.clock_thread.start()

    def on_start(self, start_ns: int) -> None:
        """The schedule's exact start, for the pace steps' boundaries."""
        from core import contract

        cfg = self.cfg
        self.parent_cpu.append(time.process_time())
        self.hlog.start(start_ns)
        whole = cfg.schedule.share(1.0 / cfg.shards) if cfg.shards > 1 else cfg.schedule  # the run's, all shards
        telemetry_marker(cfg, contract.RunStart(cfg.run_id, cfg.sender, start_ns, config=json.dumps(
            {**self.run_config, "schedule_start_ns": start_ns, "steps": whole.steps_from(start_ns)})))

    def on_shipped(self, worker: int, before_s: int) -> None:
        for iv in self.stats.shipped(worker, before_s):
            self.on_second(iv)

    def on_second(self, iv) -> None:
        """A second every worker is done with: the live line, loadgen-bound, thresholds."""
        from core import memory

        s2, duration_ns = iv.second, self.cfg.schedule.duration_ns
        if s2 % 30 == 29:  # the .hlog encoder's buffers come and go through glibc's heap: hand back what is free
            memory.trim()
        in_schedule = s2 * NS_PER_S < duration_ns
        scheduled = self.cfg.schedule.rate_at(s2 * NS_PER_S + NS_PER_S // 2)
        bound = in_schedule and s2 > 0 and iv.sent < LOADGEN_BOUND_RATIO * scheduled
        if bound:
            self.bound_seconds.append(s2)
        self.totals["sent"] += iv.sent
        self.totals["completed"] += iv.completed
        in_flight = self.totals["sent"] - self.totals["completed"]
        self.exposed.second(iv, scheduled if in_schedule else 0.0, in_flight, bound)
        if not self.quiet and s2 * NS_PER_S < duration_ns + 60 * NS_PER_S:
            print(live_line(s2, iv, scheduled if in_schedule else 0, in_flight), flush=True)
        if in_schedule:
            for t, w in self.sustained.items():
                w.feed(s2, second_value(t, iv))
            for t, w in self.aborts.items():
                if w.feed(s2, second_value(t, iv)) and not self.aborted:
                    self.aborted.append((t, s2))
                    self.abort_event.set()
                    print(f"ABORT: {t.text} at {s2} s: stopping the attack", file=sys.stderr, flush=True)

    def stop(self, reason: str) -> int:
        """The run's stop marker, the metrics server down: the stop's time."""
        from core import contract, metrics

        self.stopping.set()
        end_ns = time.time_ns()
        telemetry_marker(self.cfg, contract.RunStop(self.cfg.run_id, self.cfg.sender, end_ns, reason=reason))
        metrics.stop(self.server)
        return end_ns

    def figures(self, start_ns: int, attack_end_ns: int, end_ns: int, results: dict) -> dict:
        """vegeta's report of the run, and what it adds: unsent sends, telemetry, loadgen-bound seconds, CPU."""
        cfg = self.cfg
        figs = report.figures(self.stats, attack_end_ns - start_ns, end_ns - attack_end_ns, str(cfg.target),
                              cfg.schedule.total_hits / (cfg.schedule.duration_ns / NS_PER_S))
        figs["run_id"] = cfg.run_id
        # due but never sent: the generator was still behind when the schedule ended (like vegeta, it stops there)
        figs["scheduled"] = cfg.schedule.total_hits
        figs["unsent"] = 0 if self.aborted else max(cfg.schedule.total_hits - figs["requests"], 0)
        figs["start_ns"] = start_ns
        figs["telemetry"] = {w: r["telemetry"] for w, r in results.items()}
        figs["loadgen_bound_seconds"] = self.bound_seconds
        from transports.registry import TargetOptions, make_target

        shaped = make_target(cfg.target, TargetOptions(cfg.timeout_s, cfg.max_inflight, cfg.run_id, 0,
                                                       cfg.sut_kafka_options or {})).shaping()
        if shaped is not None:  # what shaped its latency, as it took effect
            attached = [r["attached_ns"] for r in results.values() if r.get("attached_ns")]
            if attached:  # when the last worker had attached all its links, before the schedule started
                shaped["attached_ns"] = max(attached)
            figs["client"] = shaped
        workers_cpu = sum(r.get("cpu_s", 0.0) for r in results.values())
        parent = time.process_time() - self.parent_cpu[0] if self.parent_cpu else 0.0
        figs["cpu"] = {"workers_s": workers_cpu, "parent_s": parent, "total_s": workers_cpu + parent,  # start-up excluded
                       "us_per_event": (workers_cpu + parent) * 1e6 / figs["requests"] if figs["requests"] else 0.0}
        return figs

    def write_reports(self, figs: dict, attack_ns: int) -> None:
        print()
        print(report.text(figs), end="")
        attack_s = attack_ns / NS_PER_S
        if (figs["rate_per_sec"] < LOADGEN_BOUND_RATIO * figs["requested_rate_per_sec"]
                or len(self.bound_seconds) > 0.2 * attack_s):
            print(f"loadgen saturated: achieved {figs['rate_per_sec']:,.0f}/s of {figs['requested_rate_per_sec']:,.0f}/s "
                  f"(behind schedule in {len(self.bound_seconds)} s); add --workers or a host")
        if figs["unsent"]:
            print(f"loadgen: {figs['unsent']:,} of {figs['scheduled']:,} scheduled sends were still due when the "
                  "schedule ended and were not sent (the generator was behind); add --workers or a host", file=sys.stderr)
        report.write_json(figs, os.path.join(self.out, "report.json"))
        with open(os.path.join(self.out, "report.txt"), "w") as f:
            f.write(report.text(figs))
        print(f"reports: {self.out}/report.txt, report.json, latency.hlog ({self.hlog.intervals} seconds)")

    def verdict(self, figs: dict) -> int:
        """The thresholds: 3 if an --abort-on stopped the run, 1 if a --fail-on was crossed, else 0."""
        failed = [t for t in self.fail_on if (self.sustained[t].crossed_at is not None if t.for_s else
                                              t.metric != "loss" and t.holds(run_value(t, figs)))]
        for t in failed:
            at = f" (from {self.sustained[t].crossed_at - t.for_s + 1} s)" if t.for_s else ""
            print(f"threshold crossed: {t.text}{at}", file=sys.stderr)
        if self.aborted:
            t, second = self.aborted[0]
            print(f"aborted by --abort-on {t.text!r} at {second} s", file=sys.stderr)
            return 3
        return 1 if failed else 0


def run_config(cfg) -> dict:
    """The run's configuration as its start marker carries it (``runs.runinfo.attack_config`` reads it back)."""
    config = {"target": str(cfg.target), "pace": cfg.schedule.describe(), "workers": cfg.workers,
              "payload_bytes": cfg.payload_bytes, "max_inflight": cfg.max_inflight}
    if cfg.scenario:
        config["scenario"] = cfg.scenario
    if cfg.label:
        config["label"] = cfg.label
    if cfg.warmup_s or cfg.cooldown_s:
        config.update(warmup_s=cfg.warmup_s, cooldown_s=cfg.cooldown_s)
    if cfg.shards > 1:  # the run's pace is the sum of the shards'; the job waits for every shard's stop
        config.update(pace=cfg.schedule.share(1.0 / cfg.shards).describe(), shard=cfg.shard, shards=cfg.shards,
                      shard_pace=cfg.schedule.describe())
    return config


def attack(cfg, fail_on: list, abort_on: list, out: str, quiet: bool = False, metrics_listen: str | None = None) -> int:
    """Run the attack (``Attack``); exit code 0, 1 (a --fail-on crossed, or the attack failed), 3 (stopped by
    --abort-on) or 130 (interrupted)."""
    return Attack(cfg, fail_on, abort_on, out, quiet, metrics_listen).run()
