"""flightwatch load generator.

Usage:
    python -m loadgen attack --rate 5000 --duration 60s [--target URL] [...]
    python -m loadgen attack --pace 1000:60,1200:60 --target http://127.0.0.1:8080/

Open-loop: each send's intended time comes from the schedule, never from the previous
response. Prints one line per second while it runs, then a vegeta-style report; writes
report.json and latency.hlog (HdrHistogram interval log) into --out.

Exit codes: 0 ok; 1 a --fail-on threshold was crossed or the attack failed; 2 bad input
(flags, rate, pace, unreachable target); 3 stopped early by an --abort-on threshold.
Thresholds: 'METRIC OP VALUE[UNIT] [for DURATION]' (loadgen/thresholds.py), e.g.
--fail-on 'p99>500ms for 10s' --fail-on 'loss>0.1%' --abort-on 'p99>2s for 5s'.
"""
from __future__ import annotations

import argparse
import atexit
import functools
import json
import os
import sys
import time

from agents.units import one_line, parse_duration_ns
from agents.kafka_options import client_options
from loadgen import report
from loadgen.pacer import NS_PER_S, Schedule
from loadgen.stats import RunStats
from loadgen.targets import TargetSpec, tcp_unreachable
from loadgen.thresholds import Sustained, Threshold, run_value, second_value

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHECKPOINTS = os.environ.get("FLIGHTWATCH_CHECKPOINTS", os.path.join(ROOT, "checkpoints"))
"""Where run folders live (the streaming job's and the dashboard's default too)."""
DEFAULT_TARGET = "kafka://127.0.0.1:29092/flightwatch.sut"
LOADGEN_BOUND_RATIO = 0.95
"""A second in which fewer than this share of the scheduled sends went out marks the generator as the limit."""


WORKER_RATE = 10_000
"""Events per second one worker process is given by --workers auto. One worker sends 5,000/s at ~50 µs of CPU an
event; two, each at 2,500/s, took ~70 µs an event (each has its own client threads and wake-ups)."""


def auto_workers(schedule: Schedule) -> int:
    peak = max(max(s.rate_per_sec, s.final_rate_per_sec) for s in schedule.steps)
    return max(1, min(os.cpu_count() or 1, -(-int(peak) // WORKER_RATE)))


class UsageError(Exception):
    """Bad input: printed as one line (user text in it is escaped), exit code 2."""

    def __init__(self, message: str) -> None:
        super().__init__(one_line(message))


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:
        raise UsageError(message)


def parse_duration_s(text: str) -> float:
    try:
        return parse_duration_ns(text) / NS_PER_S
    except ValueError as e:
        raise UsageError(str(e)) from None


def _default_shard() -> str:
    count = os.environ.get("FLIGHTWATCH_SHARDS")
    return f"{os.environ.get('JOB_COMPLETION_INDEX', '0')}/{count}" if count else "0/1"


def parse_shard(text: str) -> tuple[int, int]:
    index, _, count = str(text).partition("/")
    try:
        i, n = int(index), int(count)
    except ValueError:
        raise UsageError(f"bad --shard {text!r}: use INDEX/COUNT, e.g. 0/2") from None
    if not (n >= 1 and 0 <= i < n):
        raise UsageError(f"bad --shard {text!r}: INDEX must be 0..COUNT-1 and COUNT >= 1")
    return i, n


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m loadgen", description=__doc__.split("\n\n")[0],
                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    a = sub.add_parser("attack", help="send events at a fixed or paced rate", description="send events at a fixed or paced rate")
    a.add_argument("--rate", help="events per second (constant), e.g. 5000")
    a.add_argument("--pace", help="steps RATE:SECONDS[,...] or a ramp FROM-TO:SECONDS, e.g. 1000:60,1200:60")
    a.add_argument("--duration", default="60s", help="run length with --rate (default %(default)s)")
    a.add_argument("--target", default=os.environ.get("FLIGHTWATCH_TARGET", DEFAULT_TARGET),
                   help="http://HOST:PORT/PATH (binary CloudEvents), http+structured://..., kafka://HOST:PORT/TOPIC "
                        "(default %(default)s, the embedded SUT broker)")
    a.add_argument("--payload", type=int, default=2048, help="event payload bytes (default %(default)s)")
    a.add_argument("--workers", default="auto",
                   help="worker processes splitting the rate; 'auto' (the default) is one per "
                        f"{WORKER_RATE:,}/s of the peak rate, at most one per core")
    a.add_argument("--max-inflight", type=int, default=1000, help="outstanding sends per worker (default %(default)s)")
    a.add_argument("--timeout", default="30s", help="per-send timeout (default %(default)s)")
    a.add_argument("--run", help="run ID (default: attack-<UTC time>)")
    a.add_argument("--shard", default=_default_shard(), metavar="INDEX/COUNT",
                   help="this process is shard INDEX (from 0) of COUNT load generators that split the rate and the "
                        "pace among them, each with its own sender ID; the run closes once every shard has stopped. "
                        "Needs --run (the same on every shard). Default 0/1, or JOB_COMPLETION_INDEX/FLIGHTWATCH_SHARDS "
                        "in a Kubernetes indexed Job")
    a.add_argument("--telemetry-bootstrap", default=os.environ.get("FLIGHTWATCH_BOOTSTRAP", "127.0.0.1:19092"),
                   help="telemetry broker for send/ack records (default %(default)s)")
    a.add_argument("--telemetry-topic", default=os.environ.get("FLIGHTWATCH_TOPIC", "flightwatch.telemetry"))
    a.add_argument("--no-telemetry", action="store_true", help="do not write send/ack records")
    a.add_argument("--out", help="report folder (default checkpoints/<run>/loadgen)")
    a.add_argument("--fail-on", action="append", default=[], metavar="THRESHOLD",
                   help="exit 1 when crossed: 'METRIC OP VALUE[UNIT] [for DURATION]' with METRIC p50|p90|p95|p99|max|"
                        "mean (ms), success (%%), errors, rate, loss (%%, needs --stream); e.g. 'p99>500ms for 10s', "
                        "'success<99%%', 'loss>0.1%%'; repeatable (see loadgen/thresholds.py)")
    a.add_argument("--abort-on", action="append", default=[], metavar="THRESHOLD",
                   help="stop the attack at once when crossed, judged every second (exit 3); e.g. 'p99>2s for 5s', "
                        "'errors>100'; repeatable")
    a.add_argument("--quiet", action="store_true", help="no per-second lines")
    a.add_argument("--stream", action="store_true",
                   help="also start the streaming job for this run (log in checkpoints/<run>/job.log) and print its "
                        "summary once it has closed the run")
    return p


def config(a: argparse.Namespace):
    from loadgen.attack import AttackConfig

    if (a.rate is None) == (a.pace is None):
        raise UsageError("give exactly one of --rate or --pace")
    duration_s = parse_duration_s(a.duration)
    if duration_s <= 0:
        raise UsageError("--duration must be > 0")
    try:
        if a.rate is not None:
            rate = float(a.rate)
            schedule = Schedule.constant(rate, int(duration_s * NS_PER_S))
        else:
            schedule = Schedule.parse(a.pace)
        target = TargetSpec.parse(a.target)
    except ValueError as e:
        msg = str(e)
        if a.rate is not None and "could not convert" in msg:
            msg = f"bad rate {a.rate!r}: a number of events per second, e.g. 5000"
        raise UsageError(msg) from None
    if a.workers == "auto":
        a.workers = auto_workers(schedule)
    else:
        try:
            a.workers = int(a.workers)
        except ValueError:
            raise UsageError(f"bad --workers {a.workers!r}: a number, or auto") from None
    if a.payload < 0 or a.workers < 1 or a.max_inflight < 1:
        raise UsageError("--payload must be >= 0, --workers and --max-inflight >= 1")
    try:
        client_options()
    except (ValueError, OSError) as e:
        raise UsageError(f"FLIGHTWATCH_KAFKA_OPTIONS: {e}") from None
    if target.scheme == "kafka":
        from agents.kafka_options import SUT_ENV, librdkafka

        try:
            librdkafka(client_options(env=SUT_ENV))
        except (ValueError, OSError) as e:
            raise UsageError(f"{SUT_ENV}: {e}") from None
    shard, shards = parse_shard(a.shard)
    if shards > 1 and not a.run:
        raise UsageError("--shard needs --run: every shard of a run must write the same run ID")
    if shards > 1 and a.stream and shard != 0:
        raise UsageError("--stream starts the run's streaming job: give it to shard 0 only")
    try:
        schedule = schedule.share(shards)
    except ValueError as e:
        raise UsageError(f"--shard {a.shard}: {e}") from None
    run_id = a.run or time.strftime("attack-%Y%m%d-%H%M%S", time.gmtime())
    if a.stream and os.path.exists(os.path.join(CHECKPOINTS, run_id, "run.json")):
        # its job would resume the old run's checkpoint and archive and mix the two runs' records
        raise UsageError(f"run {run_id} already has results in {os.path.join(CHECKPOINTS, run_id)}: "
                         "give another --run (or remove that folder)")
    try:
        thresholds = [Threshold.parse(t, "--fail-on") for t in a.fail_on]
        aborts = [Threshold.parse(t, "--abort-on") for t in a.abort_on]
    except ValueError as e:
        raise UsageError(str(e)) from None
    if any(t.metric == "loss" for t in thresholds) and not a.stream:
        raise UsageError("--fail-on loss needs --stream (loss is measured by the streaming job)")
    cfg = AttackConfig(run_id=run_id, target=target, schedule=schedule, workers=a.workers,
                       max_inflight=a.max_inflight, payload_bytes=a.payload, timeout_s=parse_duration_s(a.timeout),
                       telemetry_bootstrap=None if a.no_telemetry else a.telemetry_bootstrap,
                       telemetry_topic=a.telemetry_topic, sender="loadgen" if shards == 1 else f"loadgen{shard}",
                       shard=shard, shards=shards, kafka_options=client_options())
    out = a.out or os.path.join(CHECKPOINTS, run_id, "loadgen" if shards == 1 else f"loadgen{shard}")
    return cfg, (thresholds, aborts), out


def live_line(second: int, iv, scheduled: float, in_flight: int) -> str:
    p50, p99 = iv.latency_percentiles((50, 99))
    (d99,) = iv.delay_percentiles((99,))
    errors = sum(iv.errors.values())
    bound = iv.sent < LOADGEN_BOUND_RATIO * scheduled and second > 0
    return (f"{second:>4}s  sent {iv.sent:>7,}/s  completed {iv.completed:>7,}/s  errors {errors:>5,}  in flight {in_flight:>6,}  "
            f"send-delay p99 {report._ms(d99):>9}  latency p50 {report._ms(p50):>9} p99 {report._ms(p99):>9}"
            + (f"  LOADGEN SATURATED ({iv.sent:,} of {scheduled:,.0f})" if bound else ""))


def main(argv=None) -> int:
    try:
        a = build_parser().parse_args(argv)
        cfg, thresholds, out = config(a)
        why = cfg.target.reachable()
        if why:
            raise UsageError(f"target {cfg.target} unreachable: {why}")
        if cfg.telemetry_bootstrap:
            host, _, port = cfg.telemetry_bootstrap.split(",")[0].rpartition(":")
            if tcp_unreachable(host, int(port)):
                raise UsageError(f"telemetry broker {cfg.telemetry_bootstrap} unreachable (start it with `make up`, or --no-telemetry)")
    except UsageError as e:
        print(f"loadgen: error: {e}", file=sys.stderr)
        return 2
    try:
        job = start_job(cfg) if a.stream else None
    except UsageError as e:
        print(f"loadgen: error: {e}", file=sys.stderr)
        return 2
    fail_on, abort_on = thresholds
    code = attack(cfg, fail_on, abort_on, out, quiet=a.quiet)
    if job is not None:
        summary = wait_job(cfg, job)
        loss = [t for t in fail_on if t.metric == "loss"]
        crossed = [t for t in loss if t.holds(run_value(t, {}, summary))]
        for t in crossed:
            print(f"threshold crossed: {t.text} (loss {run_value(t, {}, summary) if summary else 'unknown'})", file=sys.stderr)
        if crossed and code == 0:
            code = 1
    return code


def start_job(cfg):
    """The streaming job for this run, in the background (it stops by itself once the run is closed)."""
    import subprocess

    run_dir = os.path.join(CHECKPOINTS, cfg.run_id)
    os.makedirs(run_dir, exist_ok=True)
    log = open(os.path.join(run_dir, "job.log"), "ab")
    # from the topic's end: the run has not started, and the embedded telemetry broker keeps every earlier run
    # (after five runs at 5,000/s, reading them back held the first batch for 37 s); a restarted job resumes
    # from its checkpoint, not from here
    job = subprocess.Popen([sys.executable, "-m", "streaming", "run", "--run", cfg.run_id, "--bootstrap",
                            cfg.telemetry_bootstrap, "--topic", cfg.telemetry_topic, "--starting-offsets", "latest"],
                           cwd=ROOT, stdout=log,
                           stderr=subprocess.STDOUT, env=dict(os.environ, PYTHONPATH=ROOT), start_new_session=True)
    print(f"streaming job: pid {job.pid}, results in {run_dir} (log job.log); waiting for it to start ...", flush=True)
    # Spark's start-up takes a core for ~10 s: attack once the job has processed its first batch.
    from agents import contract

    deadline = time.monotonic() + 120
    batches = os.path.join(run_dir, "batches")
    while time.monotonic() < deadline and job.poll() is None:
        _telemetry_marker(cfg, contract.Heartbeat(cfg.run_id, cfg.sender, time.time_ns()))
        if os.path.isdir(batches) and os.listdir(batches):
            break
        time.sleep(1.0)
    if job.poll() is not None:
        raise UsageError(f"the streaming job exited (code {job.returncode}); see {run_dir}/job.log")
    ui_port = int(os.environ.get("FLIGHTWATCH_UI_PORT", "18501"))
    if tcp_unreachable("127.0.0.1", ui_port, 0.5) is None:
        print(f"dashboard: http://127.0.0.1:{ui_port}/ (opens on this run while it is live)", flush=True)
    else:
        print("dashboard: not running (make ui)", flush=True)
    return job


def wait_job(cfg, job, timeout_s: float = 120) -> dict | None:
    import subprocess

    from streaming import results

    print("waiting for the streaming job to close the run (drop timeout 30 s) ...", flush=True)
    try:
        job.wait(timeout_s)
    except subprocess.TimeoutExpired:
        print(f"streaming job still running (pid {job.pid}); see `make summary RUN={cfg.run_id}` later")
        return None
    run_dir = os.path.join(CHECKPOINTS, cfg.run_id)
    summary_file = os.path.join(run_dir, "summary.json")
    if os.path.exists(summary_file):  # written by the job when it closed the run
        with open(summary_file) as f:
            s = json.load(f)
    else:
        s = results.summarize(run_dir)
    if s.get("state") == "waiting for data":
        print("streaming job: no windows written; see its job.log")
        return None
    lat = s["latency_us"]
    print(f"flight time (sender -> receiver): sent {s['sent']:,} received {s['received']:,} dropped {s['dropped']:,} "
          f"duplicates {s['duplicates']:,} late {s['late']:,} errors {s['errors']:,}; latency p50 {report._ms(lat['p50'])} "
          f"p90 {report._ms(lat['p90'])} p99 {report._ms(lat['p99'])} max {report._ms(lat['max'])}; gaps {len(s['gaps'])}")
    v = s.get("verdict") or {}
    if v.get("message"):
        knee = v.get("knee")
        print(f"verdict: {v['message']}" + (f"; knee {knee['rate']:,.0f}/s" if knee else ""))
    return s


@functools.lru_cache(maxsize=None)
def _marker_producer(bootstrap: str):
    """One producer for the run's markers (start, stop, heartbeats while the job starts)."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap.split(","), **client_options())
    atexit.register(producer.close)
    return producer


def _telemetry_marker(cfg, record) -> None:
    if not cfg.telemetry_bootstrap:
        return
    from agents import contract

    p = _marker_producer(cfg.telemetry_bootstrap)
    p.send(cfg.telemetry_topic, key=b"loadgen", value=contract.encode([record]))
    p.flush()


def _report_clock(cfg) -> None:
    """This host's clock offset against the clock reference (FLIGHTWATCH_CLOCK_REFERENCE), as a clock record."""
    from agents import clock

    reference = os.environ.get("FLIGHTWATCH_CLOCK_REFERENCE", clock.DEFAULT_REFERENCE)
    if not cfg.telemetry_bootstrap or reference == "none":
        return
    rec = clock.estimate_record(reference, cfg.sender, samples=8)
    if rec is not None:
        _telemetry_marker(cfg, rec)


def attack(cfg, fail_on: list, abort_on: list, out: str, quiet: bool = False) -> int:
    """Run the attack; exit code 0, 1 (a --fail-on crossed, or the attack failed) or 3 (stopped by --abort-on)."""
    import threading

    from agents import contract, memory, observer
    from loadgen.attack import run_workers

    memory.trace_from_env("loadgen")
    observer.register("loadgen")  # it and its workers count as flightwatch's CPU (agents.observer)
    os.makedirs(out, exist_ok=True)
    hlog = report.HlogWriter(os.path.join(out, "latency.hlog"))
    stats = RunStats(cfg.workers, on_close=hlog.write)
    print(f"flightwatch attack: run {cfg.run_id} -> {cfg.target} pace {cfg.schedule.describe()} "
          f"({cfg.schedule.total_hits:,} events, {cfg.workers} workers)", flush=True)
    run_config = {"target": str(cfg.target), "pace": cfg.schedule.describe(), "workers": cfg.workers,
                  "payload_bytes": cfg.payload_bytes, "max_inflight": cfg.max_inflight}
    if cfg.shards > 1:  # the run's pace is the sum of the shards'; the job waits for every shard's stop
        run_config.update(pace=cfg.schedule.share(1.0 / cfg.shards).describe(), shard=cfg.shard, shards=cfg.shards,
                          shard_pace=cfg.schedule.describe())
    _telemetry_marker(cfg, contract.RunStart(cfg.run_id, cfg.sender, time.time_ns(), config=json.dumps(run_config)))

    parent_cpu = []

    def on_start(start_ns: int) -> None:  # the schedule's exact start, for the pace steps' boundaries
        parent_cpu.append(time.process_time())
        hlog.start(start_ns)
        _telemetry_marker(cfg, contract.RunStart(cfg.run_id, cfg.sender, start_ns, config=json.dumps(
            {**run_config, "schedule_start_ns": start_ns})))
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
        if s2 * NS_PER_S < cfg.schedule.duration_ns and s2 > 0 and iv.sent < LOADGEN_BOUND_RATIO * scheduled:
            bound_seconds.append(s2)
        totals["sent"] += iv.sent
        totals["completed"] += iv.completed
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
        _telemetry_marker(cfg, contract.RunStop(cfg.run_id, cfg.sender, time.time_ns(), reason=status))
        return 1
    except RuntimeError as e:
        print(f"loadgen: attack failed: {e}", file=sys.stderr)
        _telemetry_marker(cfg, contract.RunStop(cfg.run_id, cfg.sender, time.time_ns(), reason="failed"))
        return 1
    finally:
        leftover = stats.close_all()  # none when every worker finished (each ships FINAL_S when done)
        hlog.close()
    for iv in leftover:
        on_second(iv)
    end_ns = time.time_ns()
    if aborted:
        status = f"aborted: {aborted[0][0].text}"
    _telemetry_marker(cfg, contract.RunStop(cfg.run_id, cfg.sender, end_ns, reason=status))
    figs = report.figures(stats, attack_end_ns - start_ns, end_ns - attack_end_ns, str(cfg.target),
                          cfg.schedule.total_hits / (cfg.schedule.duration_ns / NS_PER_S))
    figs["run_id"] = cfg.run_id
    # due but never sent: the generator was still behind when the schedule ended (like vegeta, it stops there)
    figs["scheduled"] = cfg.schedule.total_hits
    figs["unsent"] = 0 if aborted else max(cfg.schedule.total_hits - figs["requests"], 0)
    figs["start_ns"] = start_ns
    figs["telemetry"] = {w: r["telemetry"] for w, r in results.items()}
    figs["loadgen_bound_seconds"] = bound_seconds
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


if __name__ == "__main__":
    from agents import memory

    memory.use_c_allocator("loadgen")  # a long-lived process: what it frees after a burst goes back
    sys.exit(main())
