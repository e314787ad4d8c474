"""flightwatch load generator.

Usage:
    python -m loadgen attack --rate 5000 --duration 60s [--target URL] [...]
    python -m loadgen attack --pace 1000:60,1200:60 --target http://127.0.0.1:8080/

Open-loop: each send's intended time comes from the schedule, never from the previous
response. Prints one line per second while it runs, then a vegeta-style report; writes
report.json and latency.hlog (HdrHistogram interval log) into --out.

Exit codes: 0 ok; 1 a --fail-on threshold was crossed or the attack failed; 2 bad input
(flags, rate, pace, unreachable target); 3 stopped early by an --abort-on threshold; 130 interrupted (Ctrl-C).
Thresholds: 'METRIC OP VALUE[UNIT] [for DURATION]' (core/thresholds.py), e.g.
--fail-on 'p99>500ms for 10s' --fail-on 'loss>0.1%' --abort-on 'p99>2s for 5s'.
With --stream --baseline RUN, the run is compared with RUN once it closes (``python -m runs compare``), and
--fail-on-regression 'p99>+10%' exits 1 when the change's 95% interval lies wholly beyond the limit.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time

from core import metrics, settings
from core.cli import add_clock_reference, add_memory_trace, add_telemetry, add_wait, wait_for_servers
from core.kafka_options import client_options
from core.observer import STACK_DIR
from core.pacer import NS_PER_S, Schedule
from core.procs import HOST, LOADGEN_METRICS_PORT, servers_unreachable
from core.rundir import CHECKPOINTS, RunPaths
from core.slices import setting_problem
from core.suts import DEFAULT_SUT, SUTS, default_target, stack_sut
from core.thresholds import Threshold, run_value
from core.units import parse_duration_ns, parse_part
from loadgen import follow
from loadgen.run import attack
from loadgen.streamjob import start_job, wait_job
from transports.errors import UsageError
from transports.registry import PROBLEM, TargetSpec, transport

WORKER_RATE = 10_000
"""Events per second one worker process is given by --workers auto. One worker sends 5,000/s at ~50 µs of CPU an
event; two, each at 2,500/s, took ~70 µs an event (each has its own client threads and wake-ups)."""


def auto_workers(schedule: Schedule) -> int:
    peak = max(max(s.rate_per_sec, s.final_rate_per_sec) for s in schedule.steps)
    return max(1, min(os.cpu_count() or 1, -(-int(peak) // WORKER_RATE)))


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:
        raise UsageError(message)


def parse_duration_s(text: str) -> float:
    try:
        return parse_duration_ns(text) / NS_PER_S
    except ValueError as e:
        raise UsageError(str(e)) from None


def _default_shard(shards: int | None) -> str:
    """With ``--shards N`` and no ``--shard``: this pod's index in a Kubernetes indexed Job (JOB_COMPLETION_INDEX)."""
    return "0/1" if shards is None else f"{os.environ.get('JOB_COMPLETION_INDEX', '0')}/{shards}"


def parse_shard(text: str) -> tuple[int, int]:
    try:
        return parse_part(text, "--shard")
    except ValueError as e:
        raise UsageError(str(e)) from None


def _target_flags(a) -> None:
    """Where the load goes: the target, its password, or the stack's SUT."""
    settings.add(a, "FLIGHTWATCH_TARGET", "--target",
                 help="http://HOST:PORT/PATH (binary CloudEvents), http+structured://..., kafka://HOST:PORT/TOPIC, "
                      "amqp://USER:PASS@HOST:PORT/VHOST?queue=NAME (RabbitMQ), amqp1://USER:PASS@HOST:PORT/ADDRESS "
                      "(AMQP 1.0: Artemis, RabbitMQ's plugin; transports/amqp.py has both); over TLS https://, amqps:// and "
                      "amqp1s://, with ?cafile=CA.pem (core/tls.py); a USER without :PASS takes the password from "
                      "FLIGHTWATCH_TARGET_PASSWORD (itself, or @FILE) (default "
                      + ", ".join(f"{default_target(s)} with --sut {s}" for s in SUTS).replace("%", "%%") + ")")
    settings.add(a, "FLIGHTWATCH_TARGET_PASSWORD", "--target-password", metavar="PASSWORD|@FILE",
                 help="the password of a --target that names its user alone (amqps://fw@HOST/...): @FILE reads it "
                      "from a file; the run's receiver gets it in its environment; never printed or recorded")
    settings.add(a, "FLIGHTWATCH_SUT", "--sut", default=stack_sut(STACK_DIR), choices=tuple(SUTS),
                 help="without --target, aim at this SUT of the stack's default topic or queue (default: the one "
                      "`make up SUT=...` started, until `make down`; else %s)" % DEFAULT_SUT)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m loadgen", description=__doc__.split("\n\n")[0],
                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    a = sub.add_parser("attack", help="send events at a fixed or paced rate", description="send events at a fixed or paced rate")
    a.add_argument("--rate", help="events per second (constant), e.g. 5000")
    a.add_argument("--pace", help="steps RATE:SECONDS[,...] or a ramp FROM-TO:SECONDS, e.g. 1000:60,1200:60")
    a.add_argument("--duration", default="60s", help="run length with --rate, as vegeta and k6 write it: 60s, 1m30s, 2h "
                   "(default %(default)s)")
    a.add_argument("--warmup", default="0s", metavar="DURATION",
                   help="the schedule's first DURATION is sent and counted, but its windows are left out of the run's "
                        "latency figures and of `runs compare`, and greyed on the dashboard (as artemis perf's "
                        "--warmup; default %(default)s)")
    a.add_argument("--cooldown", default="0s", metavar="DURATION",
                   help="the same for the schedule's last DURATION (the Dispatch Router tests trim their last second; "
                        "default %(default)s)")
    _target_flags(a)
    a.add_argument("--payload", type=int, default=2048, help="event payload bytes (default %(default)s)")
    a.add_argument("--workers", default="auto",
                   help="worker processes splitting the rate; 'auto' (the default) is one per "
                        f"{WORKER_RATE:,}/s of the peak rate, at most one per core")
    a.add_argument("--max-inflight", type=int, default=1000, help="outstanding sends per worker (default %(default)s)")
    a.add_argument("--timeout", default="30s", help="per-send timeout (default %(default)s)")
    settings.add(a, "FLIGHTWATCH_RUN", "--run", help="run ID (default: attack-<UTC time>)")
    a.add_argument("--shard", metavar="INDEX/COUNT",
                   help="this process is shard INDEX (from 0) of COUNT load generators that split the rate and the "
                        "pace among them, each with its own sender ID; the run closes once every shard has stopped. "
                        "Needs --run (the same on every shard). Default 0/1, or JOB_COMPLETION_INDEX/SHARDS with --shards")
    settings.add(a, "FLIGHTWATCH_SHARDS", "--shards", type=int, metavar="COUNT",
                 help="in a Kubernetes indexed Job: this pod is shard JOB_COMPLETION_INDEX of COUNT")
    add_telemetry(a, None)  # the send and ack records' broker and topic
    add_clock_reference(a)
    add_memory_trace(a)
    a.add_argument("--no-telemetry", action="store_true", help="do not write send/ack records")
    a.add_argument("--kafka-option", action="append", default=[], metavar="KEY=VALUE",
                   help="a librdkafka producer property for the Kafka target, over FLIGHTWATCH_SUT_KAFKA_OPTIONS: "
                        "acks=all|1|0, linger.ms, batch.size, compression.type, enable.idempotence, security.protocol, "
                        "...; repeatable. Defaults are librdkafka's (acks=all, linger.ms=5), with Nagle off; the report "
                        "prints what took effect")
    a.add_argument("--out", help="report folder (default checkpoints/<run>/loadgen)")
    a.add_argument("--fail-on", action="append", default=[], metavar="THRESHOLD",
                   help="exit 1 when crossed: 'METRIC OP VALUE[UNIT] [for DURATION]' with METRIC p50|p90|p95|p99|max|"
                        "mean (ms), success (%%), errors, rate, loss (%%, needs --stream); e.g. 'p99>500ms for 10s', "
                        "'success<99%%', 'loss>0.1%%'; repeatable (see core/thresholds.py)")
    a.add_argument("--abort-on", action="append", default=[], metavar="THRESHOLD",
                   help="stop the attack at once when crossed, judged every second (exit 3); e.g. 'p99>2s for 5s', "
                        "'errors>100'; repeatable")
    a.add_argument("--quiet", action="store_true", help="no per-second lines")
    settings.add(a, "FLIGHTWATCH_LOADGEN_METRICS_LISTEN", "--metrics-listen", type=metrics.listen_arg,
                 default=f"{HOST}:{LOADGEN_METRICS_PORT}", metavar="HOST:PORT",
                 help="serve the attack's figures as Prometheus metrics here while it runs ('none': not at all)")
    add_wait(a, "the target and the telemetry broker")
    a.add_argument("--stream", action="store_true",
                   help="also start the streaming job for this run (log in checkpoints/<run>/job.log) and print its "
                        "summary once it has closed the run")
    follow.add_flags(a)
    a.add_argument("--drop-timeout", metavar="DURATION",
                   help="with --stream: the job's drop timeout, a send unanswered this long is a drop, and the run "
                        "closes this long after its last send (the job's default, 30s)")
    a.add_argument("--scenario", metavar="NAME",
                   help="the series this run belongs to: `python -m runs history NAME` shows the series' runs and "
                        "change points (default: the series of its target kind and schedule)")
    a.add_argument("--label", metavar="TEXT",
                   help="the build or version under test (a commit, a tag): `python -m runs history` names it at the "
                        "first run after each change")
    a.add_argument("--baseline", metavar="RUN",
                   help="with --stream: once the run has closed, compare it with this finished run of the same schedule "
                        "and target kind (`python -m runs compare RUN <this run>`), written to its compare.json")
    a.add_argument("--fail-on-regression", action="append", default=[], metavar="GATE",
                   help="with --baseline: exit 1 when a change's 95%% interval lies wholly beyond the limit, e.g. "
                        "'p99>+10%%', 'delivered<-5%%' (repeatable; `python -m runs compare --help`)")
    return p


def check_baseline(a: argparse.Namespace, cfg) -> None:
    """``--baseline``: a finished run of the same schedule and target kind, checked before the attack starts."""
    if a.fail_on_regression and not a.baseline:
        raise UsageError("--fail-on-regression needs --baseline RUN")
    if not a.baseline:
        return
    if not a.stream:
        raise UsageError("--baseline needs --stream (the comparison reads the run's results)")
    from runs.__main__ import run_folder
    from runs.compare import Gate, RunSample

    try:
        for g in a.fail_on_regression:
            Gate.parse(g)
        base = RunSample.load(run_folder(a.baseline, CHECKPOINTS))
    except ValueError as e:  # Incomparable is one
        raise UsageError(f"--baseline: {e}") from None
    kind, pace = cfg.target.scheme, (cfg.schedule.share(1.0 / cfg.shards) if cfg.shards > 1 else cfg.schedule).describe()
    if base.target_kind != kind or base.pace != pace:
        raise UsageError(f"--baseline {a.baseline} is another test: it attacked {base.target_kind}:// paced {base.pace}, "
                         f"this run attacks {kind}:// paced {pace}")


def sut_kafka_options(texts: list[str], target: TargetSpec) -> dict | None:
    """The Kafka target's producer settings: FLIGHTWATCH_SUT_KAFKA_OPTIONS, then each ``--kafka-option KEY=VALUE``
    (None for an HTTP target, which takes none)."""
    if not transport(target.scheme).TAKES_KAFKA_OPTIONS:
        if texts:
            raise UsageError(f"--kafka-option sets the Kafka target's producer: the target is {target.scheme}://")
        return None
    from core.kafka_options import SUT_ENV, librdkafka, option

    try:
        options = client_options(env=SUT_ENV)
    except (ValueError, OSError) as e:
        raise UsageError(f"{SUT_ENV}: {e}") from None
    try:
        for text in texts:
            if "=" not in text:
                raise ValueError(f"bad --kafka-option {text!r}: KEY=VALUE, e.g. acks=all")
            key, value = option(*text.split("=", 1))
            options[key] = value
        librdkafka(options)
    except (ValueError, OSError) as e:
        raise UsageError(f"--kafka-option: {e}") from None
    return options


def trim_of(a: argparse.Namespace, duration_ns: int) -> dict:
    """``--warmup`` and ``--cooldown`` in seconds; ``UsageError`` unless they leave some of the schedule measured."""
    try:
        warmup_s, cooldown_s = parse_duration_s(a.warmup), parse_duration_s(a.cooldown)
    except UsageError as e:
        raise UsageError(f"--warmup/--cooldown: {e}") from None
    if warmup_s < 0 or cooldown_s < 0:
        raise UsageError("--warmup and --cooldown must be >= 0")
    if (warmup_s + cooldown_s) * NS_PER_S >= duration_ns:
        raise UsageError(f"--warmup {a.warmup} and --cooldown {a.cooldown} leave nothing of the "
                         f"{duration_ns / NS_PER_S:g} s schedule to measure")
    return {"warmup_s": warmup_s, "cooldown_s": cooldown_s}


def config(a: argparse.Namespace):
    from loadgen.attack import AttackConfig

    # for this process' readers and its workers: the clock probe, the memory trace, log level, slices, trimming
    settings.export(a, (*settings.PROCESS_WIDE, "FLIGHTWATCH_CLOCK_REFERENCE", "FLIGHTWATCH_MEMORY_TRACE",
                        "FLIGHTWATCH_TARGET_PASSWORD"))  # the password: for the target's parse and the run's receiver
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
        target = TargetSpec.parse(a.target or default_target(a.sut))
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
    if a.telemetry_bootstrap and (problem := setting_problem(a.telemetry_bootstrap)):
        raise UsageError(problem)
    sut_options = sut_kafka_options(a.kafka_option, target)
    a.shard = _default_shard(a.shards) if a.shard is None else a.shard
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
    paths = RunPaths.of_run(run_id, CHECKPOINTS)
    if a.stream and os.path.exists(paths.run_file):
        # its job would resume the old run's checkpoint and archive and mix the two runs' records
        raise UsageError(f"run {run_id} already has results in {paths.root}: "
                         "give another --run (or remove that folder)")
    try:
        thresholds = [Threshold.parse(t, "--fail-on") for t in a.fail_on]
        aborts = [Threshold.parse(t, "--abort-on") for t in a.abort_on]
    except ValueError as e:
        raise UsageError(str(e)) from None
    if a.drop_timeout is not None:
        if not a.stream:
            raise UsageError("--drop-timeout is the streaming job's: it needs --stream")
        if parse_duration_s(a.drop_timeout) <= 0:
            raise UsageError("--drop-timeout must be > 0")
    if any(t.metric == "loss" for t in thresholds) and not a.stream:
        raise UsageError("--fail-on loss needs --stream (loss is measured by the streaming job)")
    cfg = AttackConfig(run_id=run_id, target=target, schedule=schedule, workers=a.workers,
                       max_inflight=a.max_inflight, payload_bytes=a.payload, timeout_s=parse_duration_s(a.timeout),
                       telemetry_bootstrap=None if a.no_telemetry else a.telemetry_bootstrap,
                       telemetry_topic=a.telemetry_topic, sender="loadgen" if shards == 1 else f"loadgen{shard}",
                       shard=shard, shards=shards, kafka_options=client_options(), sut_kafka_options=sut_options,
                       scenario=a.scenario, label=a.label)
    cfg = dataclasses.replace(cfg, **trim_of(a, schedule.duration_ns))
    check_baseline(a, cfg)
    out = a.out or paths.loadgen(shard, shards)
    return cfg, (thresholds, aborts), out


def probe(cfg) -> None:
    """Open and close one connection to the target before the attack: a refused login, a missing virtual host or
    queue, the wrong protocol on the port, an event over the target's size limit end here as one line
    (``UsageError``), not in a worker."""
    import asyncio

    from transports.registry import TargetOptions, make_target

    async def once() -> None:
        target = make_target(cfg.target, TargetOptions(min(cfg.timeout_s, 10.0), 1, cfg.run_id, cfg.payload_bytes,
                                                       cfg.sut_kafka_options))
        try:
            await target.connect()
        finally:
            await target.close()
    try:
        asyncio.run(once())
    except (ConnectionError, ValueError) as e:
        raise UsageError(str(e)) from None


def main(argv=None) -> int:
    try:
        if PROBLEM:  # a transport of the user's that could not be had
            raise UsageError(PROBLEM)
        a = build_parser().parse_args(argv)
        cfg, thresholds, out = config(a)
        probe_s = follow.probe_seconds(a)
        checks = {f"target {cfg.target}": cfg.target.reachable}
        hints = {}
        if cfg.telemetry_bootstrap:
            broker = f"telemetry broker {cfg.telemetry_bootstrap}"
            checks[broker] = lambda: servers_unreachable(cfg.telemetry_bootstrap)
            hints[broker] = " (start it with `make up`, or --no-telemetry)"
        try:
            problem = wait_for_servers(checks, a.wait, lambda line: print(f"loadgen: {line}", flush=True), hints)
        except ValueError as e:
            raise UsageError(str(e)) from None
        if problem:
            raise UsageError(problem)
        probe(cfg)
    except UsageError as e:
        print(f"loadgen: error: {e}", file=sys.stderr)
        return 2
    receiver = None
    try:
        if cfg.shard == 0:  # one receiver for the run, however many shards send; then the probe
            receiver = follow.start(cfg, a.receiver != "auto", lambda line: print(line, flush=True), a.receivers)
            follow.probe(cfg, probe_s, log=lambda line: print(line, flush=True))
        job = start_job(cfg, a.drop_timeout) if a.stream else None
    except BaseException as e:  # the run's receiver stops whatever ended the start: bad input, or a bug (it leaked)
        follow.stop(receiver)
        if not isinstance(e, UsageError):
            raise
        print(f"loadgen: error: {e}", file=sys.stderr)
        return 2
    try:
        return _attack_and_close(a, cfg, thresholds, out, job)
    finally:
        if job is None:
            follow.settle(receiver, cfg.timeout_s)
        follow.stop(receiver, log=lambda line: print(line, flush=True))


def _attack_and_close(a, cfg, thresholds, out: str, job) -> int:
    """The attack, then (with ``--stream``) the run's close by its job, its loss thresholds and its comparison."""
    fail_on, abort_on = thresholds
    code = attack(cfg, fail_on, abort_on, out, quiet=a.quiet, metrics_listen=a.metrics_listen)
    if job is not None:
        summary = wait_job(cfg, job, a.drop_timeout)
        loss = [t for t in fail_on if t.metric == "loss"]
        crossed = [t for t in loss if t.holds(run_value(t, {}, summary))]
        for t in crossed:
            print(f"threshold crossed: {t.text} (loss {run_value(t, {}, summary) if summary else 'unknown'})", file=sys.stderr)
        if crossed and code == 0:
            code = 1
        if a.baseline and summary is not None:
            from runs.__main__ import run_compare

            print()
            compared = run_compare(a.baseline, cfg.run_id, a.fail_on_regression)
            if compared == 1 and code == 0:
                code = 1
    return code


if __name__ == "__main__":
    from core import memory

    memory.use_c_allocator("loadgen", keep_pymalloc=True)  # one run's process: pymalloc, glibc tuned for Arrow
    sys.exit(main())
