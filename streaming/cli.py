"""The flightwatch streaming job: telemetry topic ▸ decode/quarantine ▸ per-run join ▸ window partials.

Its command line: every flag, the environment variables they default to, and what they become (``JobConfig``);
``streaming.job`` runs it. Bad flags and settings are one line on stderr and exit code 2 (``UsageError``).
"""
from __future__ import annotations

import argparse
import os

from core import metrics, settings
from core.cli import add_memory_trace, add_wait, bootstrap_arg
from core.kafka_options import client_options
from core.procs import HOST, JOB_METRICS_PORT, telemetry_bootstrap
from core.rundir import ROOT as PROJECT_ROOT
from core.slices import setting_problem
from core.units import one_line, parse_duration_ns, parse_size
from runs.saturation import (
    OBSERVER_DISTURBED_FACTOR,
    OBSERVER_LASTED_SHARE,
    OBSERVER_LASTED_WINDOWS,
    OBSERVER_MAJORITY,
)
from streaming import engine
from streaming.config import CLUSTER_JOIN_PARTITIONS, JOIN_CACHE, RECOMPUTABLE, JobConfig, engine_problem

USAGE = f"""Usage:
    python -m streaming run --run RUN_ID [--bootstrap 127.0.0.1:19092] [--topic flightwatch.telemetry]
    python -m streaming replay --run RUN_ID       # recompute a finished run from its archive
    python -m streaming summary --run RUN_ID      # print a run's figures

The verdict headlines a run observer-bound (flightwatch's own CPU, not the SUT, was the limit) only when that pressure
lasted: in at least {OBSERVER_LASTED_SHARE:.0%} of the judged windows, or {OBSERVER_LASTED_WINDOWS} in a row; or when it changed what was measured: in
one of those windows the send delay's or flight time's p99 over {OBSERVER_DISTURBED_FACTOR:g}x the median of the other windows within
{OBSERVER_LASTED_WINDOWS} of it. Fewer such windows
(the job's start-up) are named in the message, and the run keeps the state its other windows give; with more than
{OBSERVER_MAJORITY:.0%} of them, the run is observer-bound even where the windows left look saturated."""

DEFAULT_METRICS_LISTEN = f"{HOST}:{JOB_METRICS_PORT}"
DEFAULT_TRIGGER = "1500ms"
"""The micro-batch interval. The JVM's and the driver's work per batch is nearly fixed (Spark plans and runs each
batch's jobs; the driver writes a batch's files and its live verdict), so fewer batches cost less: at 5,000 events/s
on the 2-core machine (`make attack RATE=5000`, 40 steady seconds), the driver 0.29 core and the JVM with its Python
workers 0.24 at 750 ms, 0.20 and 0.16 at 1.5 s. The live verdict waits for its window's last batch:
`python -m bench.verdict --repeat 3` saw it 2.34 s (median; max 2.40) after the first saturated window ended, against
2.16 s at 750 ms; the goal is 3 s. Spark starts batches at multiples of the interval since the epoch, so a 1 s
trigger fired exactly as a window ended, before its last records arrived (2.37 s)."""
IDLE_BATCH_MESSAGES = 8
"""Fewer new telemetry messages than this wait for more (up to --idle-batch-interval): at idle a node sample and
a heartbeat come each second, under load each writer sends a message every 100 ms at least."""


class UsageError(Exception):
    """Bad flags or an unusable environment: one line on stderr (user text in it is escaped), exit code 2."""

    def __init__(self, message: str) -> None:
        super().__init__(one_line(message))


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (argparse prints usage too)
        raise UsageError(message)


def _add_process(s: argparse.ArgumentParser) -> None:
    """The job process' own: its Spark's memory and JVM, a memory trace, and every component's settings."""
    g = s.add_argument_group("the job's process")
    settings.add(g, "FLIGHTWATCH_DRIVER_MEMORY", "--driver-memory", metavar="SIZE",
                 help="the driver's heap, for a Spark the job starts itself (default 2g; a cluster's driver is sized "
                      "where it is started: spark-submit, the Spark operator)")
    settings.add(g, "FLIGHTWATCH_EXECUTOR_MEMORY", "--executor-memory", metavar="SIZE",
                 help="the executors' heap, for a Spark the job starts itself (default 1g)")
    settings.add(g, "FLIGHTWATCH_DRIVER_JAVA_OPTIONS", "--driver-java-options", metavar="OPTIONS",
                 help="the driver JVM's options (default: its heap pre-touched, C1 only)")
    add_memory_trace(g)
    settings.add_process_wide(s)


def _join_flags(s) -> None:
    """Where the join runs, split how, and what a worker keeps of it (``run`` and ``replay``)."""
    settings.add(s, "FLIGHTWATCH_JOIN_ON", "--join-on", choices=("auto", "driver", "executors"), default="auto",
                 help="where the join partitions run: auto puts them on a cluster's executors and in the driver in "
                      "local mode")
    settings.add(s, "FLIGHTWATCH_JOIN_PARTITIONS", "--join-partitions", type=int, metavar="P",
                 help="split the join by event ID hash into P partitions, each joined with its own state: in the "
                      "driver in local mode, in executor tasks on a cluster (the results do not depend on P; default "
                      f"1 in local mode, {CLUSTER_JOIN_PARTITIONS} on a cluster)")
    settings.add(s, "FLIGHTWATCH_JOIN_CACHE", "--join-cache", default=JOIN_CACHE, metavar="SIZE",
                 help="on a cluster, what each Python worker keeps in memory of the join partitions' states it "
                      "served, at most (e.g. 512MiB); beyond, the states used longest ago go, and a later task of "
                      "theirs loads a snapshot instead (each batch's hits, misses and evictions are in its record)")


def _clock_flag(s) -> None:
    s.add_argument("--no-clock-correction", action="store_true",
                   help="keep every agent's stamps raw: not corrected by its measured clock offset against the clock "
                        "reference (by default a stamp is, when the offset is beyond its estimate's error: "
                        "streaming.clocks); a replay with it takes the run's corrections off, into <run>/replay-rawclocks")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m streaming", description=__doc__.split("\n\n")[0], epilog=USAGE,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name, help_ in (("run", "process a run live from the telemetry topic"),
                        ("replay", "recompute a finished run from its archive into <run>/replay"),
                        ("summary", "print a run's summary as JSON")):
        s = sub.add_parser(name, help=help_, description=help_)
        settings.add(s, "FLIGHTWATCH_RUN", "--run", required=settings.get("FLIGHTWATCH_RUN") is None,
                     help="run ID (records of other runs are ignored)")
        settings.add(s, "FLIGHTWATCH_CHECKPOINTS", "--checkpoints", default=os.path.join(PROJECT_ROOT, "checkpoints"),
                     help="root of per-run folders")
        s.add_argument("--out", help="this run's folder (default: <checkpoints>/<run>)")
        if name == "summary":
            continue
        s.add_argument("--trigger", default=DEFAULT_TRIGGER, help="micro-batch interval (default %(default)s)")
        s.add_argument("--idle-batch-interval", default="2s",
                       help="with fewer than %d new messages (machine records only: no attack), run a batch at most "
                            "this often (default %%(default)s; 0 runs one at every trigger)" % IDLE_BATCH_MESSAGES)
        s.add_argument("--quiet-batch-interval", default="10s",
                       help="after a minute with machine records only, run a batch at most this often; a run's "
                            "first messages start one at once (default %(default)s; 0: as --idle-batch-interval)")
        s.add_argument("--available-now", action="store_true",
                       help="process what is in the topic now, then stop (tests, catch-up)")
        s.add_argument("--master", default=os.environ.get("SPARK_MASTER", "local[2]"),
                       help="Spark master when Spark was given none (a master given by spark-submit, the Spark operator "
                            "or spark-defaults.conf wins, with that cluster's settings; env SPARK_MASTER; default "
                            "%(default)s)")
        _join_flags(s)
        _clock_flag(s)
        own = name == "replay"  # a replay recomputes with the run's own settings but those given here
        for flag, default, what in (("--window", "1s", "window length"),
                                    ("--drop-timeout", "30s", "a send unanswered this long is a drop"),
                                    ("--watermark-delay", "5s", "wait for late records this long")):
            shown = "the run's own; another writes into <run>/replay-<settings>" if own else default
            s.add_argument(flag, default=None if own else default, help=f"{what} (default {shown})")
        if own:
            continue
        settings.add(s, "FLIGHTWATCH_BOOTSTRAP", "--bootstrap", default=telemetry_bootstrap(), type=bootstrap_arg,
                     help="telemetry Kafka bootstrap servers")
        settings.add(s, "FLIGHTWATCH_TOPIC", "--topic", default="flightwatch.telemetry",
                     help="telemetry topic; the job also reads its time slices, <topic>.slice-<start>-<length>, which "
                          "writers to the embedded broker use (--telemetry-slice), and deletes each once read")
        settings.add(s, "FLIGHTWATCH_SLICE_GRACE", "--slice-grace", default="90s",
                     help="delete a time slice of the topic this long after its end, once read and archived; keep it "
                          "above the writers' 20 s delivery timeout and Spark's 60 s idle Python worker timeout (a worker "
                          "holding a consumer of a deleted topic can crash: streaming.consumers)")
        s.add_argument("--source", choices=("flightwatch_kafka", "kafka"), default="flightwatch_kafka",
                       help="Kafka reader: the Python Data Source, or Spark's connector where its jar is present")
        s.add_argument("--starting-offsets", choices=("earliest", "latest"), default="earliest",
                       help="where a new job starts in the topic: all it holds, or its end (`loadgen --stream` starts "
                            "its job before the run, at the end); a restarted job resumes from its checkpoint "
                            "(default %(default)s)")
        s.add_argument("--max-offsets-per-trigger", type=int, help="cap on Kafka messages per micro-batch")
        s.add_argument("--kafka-option", action="append", default=[], metavar="KEY=VALUE",
                       help="extra Kafka client setting, a librdkafka property (e.g. security.protocol=SASL_SSL), over "
                            "FLIGHTWATCH_KAFKA_OPTIONS; repeatable")
        # a telemetry broker back after 10 s at 2,000/s: flight-time max -6% to -1% of an undisturbed run's (3 runs); with
        # os.nice alone, confined to the job's session by autogroup scheduling, up to +60% (core.procs.lower_priority)
        settings.add(s, "FLIGHTWATCH_JOB_NICE", "--nice", type=int, default="10", metavar="N",
                     help="lower the job's CPU priority by N (Spark's JVM too; and its session's scheduling group when it "
                          "leads its session): a burst of catching up never takes CPU from the load generator, the "
                          "receivers or the SUT on a shared node (0 to keep it)")
        _add_process(s)
        s.add_argument("--silence-timeout", default="60s",
                       help="close a run as aborted when its load generator has written nothing for this long, "
                            "e.g. after a kill -9 (default %(default)s)")
        s.add_argument("--no-heartbeat", action="store_true",
                       help="do not write the job's own heartbeats (they close the last windows of a live run)")
        s.add_argument("--partitions", type=int, default=2, help="partitions when creating the topic (default %(default)s)")
        settings.add(s, "FLIGHTWATCH_AWAIT_TOPIC", "--await-topic", action="store_true",
                     help="wait for the topic instead of creating it (on Kubernetes the Topic Operator creates it from "
                          "its KafkaTopic, with its replication; 1 in the variable)")
        add_wait(s, "the telemetry broker (and with --await-topic the topic)")
        settings.add(s, "FLIGHTWATCH_JOB_METRICS_LISTEN", "--metrics-listen", default=DEFAULT_METRICS_LISTEN,
                     metavar="HOST:PORT", help="serve the run's live figures for Prometheus at http://HOST:PORT/metrics "
                                               "('none' to not serve)")
    return p


JOB_PROCESS = (*settings.PROCESS_WIDE, "FLIGHTWATCH_DRIVER_MEMORY", "FLIGHTWATCH_EXECUTOR_MEMORY",
               "FLIGHTWATCH_DRIVER_JAVA_OPTIONS", "FLIGHTWATCH_MEMORY_TRACE")
"""The job's settings read below its parser (``streaming.session``, ``core.memory``, ``core.logs``)."""


def config_from_args(a: argparse.Namespace) -> JobConfig:
    settings.export(a, JOB_PROCESS)  # the flags given, for the Spark session, the logs and the memory trace
    out = a.out or os.path.join(a.checkpoints, a.run)
    from core.kafka_options import librdkafka, option

    kafka_options = {}
    for kv in getattr(a, "kafka_option", []):
        if "=" not in kv:
            raise UsageError(f"--kafka-option {kv!r}: expected KEY=VALUE")
        try:
            key, value = option(*kv.split("=", 1))
        except ValueError as e:
            raise UsageError(f"--kafka-option: {e}") from None
        kafka_options[key] = value
    try:
        kafka_options = client_options(kafka_options)
        librdkafka(kafka_options)  # one line now for a key no client takes, not a stack trace from a read task
    except (ValueError, OSError) as e:
        raise UsageError(f"FLIGHTWATCH_KAFKA_OPTIONS: {e}") from None
    try:
        given = {key: parse_duration_ns(text) for key in RECOMPUTABLE if (text := getattr(a, key[:-3], None))}  # a.window, ...
        eng = engine.EngineConfig(run_id=a.run, silence_timeout_ns=parse_duration_ns(getattr(a, "silence_timeout", "60s")),
                                  join_partitions=1 if getattr(a, "join_partitions", None) is None else a.join_partitions,
                                  clock_correction=not getattr(a, "no_clock_correction", False), **given)
        trigger_ns = parse_duration_ns(getattr(a, "trigger", DEFAULT_TRIGGER))
        idle_batch_ns = parse_duration_ns(getattr(a, "idle_batch_interval", "2s"))
        quiet_batch_ns = parse_duration_ns(getattr(a, "quiet_batch_interval", "10s"))
        slice_grace_ns = parse_duration_ns(getattr(a, "slice_grace", "90s"))
        join_cache_bytes = parse_size(getattr(a, "join_cache", JOIN_CACHE))
    except ValueError as e:
        raise UsageError(str(e)) from None
    if a.command == "run" and (problem := engine_problem(eng) or setting_problem(a.bootstrap)):
        raise UsageError(problem)
    if getattr(a, "join_on", "auto") not in ("auto", "driver", "executors"):
        raise UsageError(f"--join-on (or FLIGHTWATCH_JOIN_ON) {a.join_on!r}: expected auto, driver or executors")
    if getattr(a, "max_offsets_per_trigger", None) is not None and a.max_offsets_per_trigger <= 0:
        raise UsageError("--max-offsets-per-trigger must be a positive number")
    return JobConfig(
        command=a.command, run_dir=out, engine=eng, trigger_ms=trigger_ns // 1_000_000,
        idle_batch_ms=idle_batch_ns // 1_000_000, quiet_batch_ms=quiet_batch_ns // 1_000_000,
        slice_grace_ms=slice_grace_ns // 1_000_000,
        available_now=getattr(a, "available_now", False), master=getattr(a, "master", "local[2]"),
        bootstrap=getattr(a, "bootstrap", None), topic=getattr(a, "topic", None),
        source=getattr(a, "source", "flightwatch_kafka"), starting_offsets=getattr(a, "starting_offsets", "earliest"),
        max_offsets_per_trigger=getattr(a, "max_offsets_per_trigger", None), kafka_options=kafka_options,
        heartbeat=not getattr(a, "no_heartbeat", True), partitions=getattr(a, "partitions", 2),
        await_topic=getattr(a, "await_topic", False), join_on=getattr(a, "join_on", "auto"), join_cache_bytes=join_cache_bytes,
        metrics_listen=_metrics_listen(getattr(a, "metrics_listen", "none")), recompute=given if a.command == "replay" else {},
    )


def _metrics_listen(text: str | None) -> str | None:
    try:
        return metrics.listen_arg(text or "none")
    except ValueError as e:
        raise UsageError(str(e)) from None


