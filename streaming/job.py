"""The flightwatch streaming job: telemetry topic ▸ decode/quarantine ▸ per-run join ▸ window partials.

Usage:
    python -m streaming run --run RUN_ID [--bootstrap 127.0.0.1:19092] [--topic flightwatch.telemetry]
    python -m streaming replay --run RUN_ID       # recompute a finished run from its archive
    python -m streaming summary --run RUN_ID      # print a run's figures

Stages, one Spark Structured Streaming query:
  source   Kafka through the Python Data Source ``flightwatch_kafka`` (or ``--source kafka``
           for Spark's built-in connector), or the run's archive for a replay;
  decode   ``mapInArrow``: NDJSON bodies to typed rows, malformed ones set aside with a reason;
  filter   this run's records (and unattributable malformed ones);
  sink     ``foreachBatch``: the join and window arithmetic of ``streaming.engine`` applied per
           micro-batch, partials written per batch ID by ``streaming.sinks.RunStore``; on a cluster the
           join partitions run in executor tasks (``streaming.executors``).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import threading
import time

from core import memory, metrics, observer
from core.cli import add_wait, bootstrap_arg, wait_for_servers
from core.kafka_options import client_options
from core.procs import HOST, JOB_METRICS_PORT, servers_unreachable, telemetry_bootstrap
from core.rundir import ROOT as PROJECT_ROOT
from core.rundir import RunPaths
from core.slices import setting_problem
from core.units import one_line, parse_duration_ns
from streaming import engine, session
from streaming.config import CLUSTER_JOIN_PARTITIONS, RECOMPUTABLE, JobConfig, engine_problem, int_env

DEFAULT_METRICS_LISTEN = f"{HOST}:{JOB_METRICS_PORT}"
DEFAULT_TRIGGER = "750ms"
"""The micro-batch interval. The JVM's work per batch is nearly fixed: 0.40 core at two batches a second (at 1,000
and at 5,000 events/s), 0.24 at one. Spark starts batches at multiples of the interval since the epoch, so a 1 s
trigger fires exactly as a window ends, before its last records arrive, and the live verdict waited a whole extra
batch (2.37 s after the first saturated window, against 1.92 s at 500 ms and 2.16 s at 750 ms)."""
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


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m streaming", description=__doc__.split("\n\n")[0],
                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name, help_ in (("run", "process a run live from the telemetry topic"),
                        ("replay", "recompute a finished run from its archive into <run>/replay"),
                        ("summary", "print a run's summary as JSON")):
        s = sub.add_parser(name, help=help_, description=help_)
        s.add_argument("--run", required="FLIGHTWATCH_RUN" not in os.environ, default=os.environ.get("FLIGHTWATCH_RUN"),
                       help="run ID (records of other runs are ignored; default $FLIGHTWATCH_RUN)")
        s.add_argument("--checkpoints", default=os.environ.get("FLIGHTWATCH_CHECKPOINTS", os.path.join(PROJECT_ROOT, "checkpoints")),
                       help="root of per-run folders (default: %(default)s)")
        s.add_argument("--out", help="this run's folder (default: <checkpoints>/<run>)")
        if name == "summary":
            continue
        s.add_argument("--trigger", default=DEFAULT_TRIGGER, help="micro-batch interval (default %(default)s)")
        s.add_argument("--idle-batch-interval", default="2s",
                       help="with fewer than %d new messages (machine records only: no attack), run a batch at most "
                            "this often (default %%(default)s; 0 runs one at every trigger)" % IDLE_BATCH_MESSAGES)
        s.add_argument("--available-now", action="store_true",
                       help="process what is in the topic now, then stop (tests, catch-up)")
        s.add_argument("--master", default=os.environ.get("SPARK_MASTER", "local[2]"),
                       help="Spark master when Spark was given none (a master given by spark-submit, the Spark operator "
                            "or spark-defaults.conf wins, with that cluster's settings; env SPARK_MASTER; default "
                            "%(default)s)")
        s.add_argument("--join-on", choices=("auto", "driver", "executors"), default=os.environ.get("FLIGHTWATCH_JOIN_ON", "auto"),
                       help="where the join partitions run: auto puts them on a cluster's executors and in the driver in "
                       "local mode (env FLIGHTWATCH_JOIN_ON; default %(default)s)")
        s.add_argument("--join-partitions", type=int, default=int_env("FLIGHTWATCH_JOIN_PARTITIONS"), metavar="P",
                       help="split the join by event ID hash into P partitions, each joined with its own state: in the "
                       "driver in local mode, in executor tasks on a cluster (the results do not depend on P; env "
                       f"FLIGHTWATCH_JOIN_PARTITIONS; default 1 in local mode, {CLUSTER_JOIN_PARTITIONS} on a cluster)")
        own = name == "replay"  # a replay recomputes with the run's own settings but those given here
        for flag, default, what in (("--window", "1s", "window length"),
                                    ("--drop-timeout", "30s", "a send unanswered this long is a drop"),
                                    ("--watermark-delay", "5s", "wait for late records this long")):
            shown = "the run's own; another writes into <run>/replay-<settings>" if own else default
            s.add_argument(flag, default=None if own else default, help=f"{what} (default {shown})")
        if own:
            continue
        s.add_argument("--bootstrap", default=telemetry_bootstrap(), type=bootstrap_arg,
                       help="telemetry Kafka bootstrap servers (default %(default)s)")
        s.add_argument("--topic", default=os.environ.get("FLIGHTWATCH_TOPIC", "flightwatch.telemetry"),
                       help="telemetry topic; the job also reads its time slices, <topic>.slice-<start>-<length>, which "
                       "writers to the embedded broker use (FLIGHTWATCH_TELEMETRY_SLICE), and deletes each once read "
                       "(default %(default)s)")
        s.add_argument("--slice-grace", default=os.environ.get("FLIGHTWATCH_SLICE_GRACE", "90s"),
                       help="delete a time slice of the topic this long after its end, once read and archived; keep it "
                       "above the writers' 20 s delivery timeout and Spark's 60 s idle Python worker timeout (a worker "
                       "holding a consumer of a deleted topic can crash: streaming.consumers) (env "
                       "FLIGHTWATCH_SLICE_GRACE; default %(default)s)")
        s.add_argument("--source", choices=("flightwatch_kafka", "kafka"), default="flightwatch_kafka",
                       help="Kafka reader: the Python Data Source, or Spark's connector where its jar is present")
        s.add_argument("--starting-offsets", choices=("earliest", "latest"), default="earliest",
                       help="where a new job starts in the topic: all it holds, or its end (`loadgen --stream` starts "
                            "its job before the run, at the end); a restarted job resumes from its checkpoint "
                            "(default %(default)s)")
        s.add_argument("--max-offsets-per-trigger", type=int, help="cap on Kafka messages per micro-batch")
        s.add_argument("--kafka-option", action="append", default=[], metavar="KEY=VALUE",
                       help="extra Kafka client setting, a librdkafka property (e.g. security.protocol=SASL_SSL); "
                            "repeatable")
        s.add_argument("--nice", type=int, default=os.environ.get("FLIGHTWATCH_JOB_NICE", "5"), metavar="N",
                       help="lower the job's CPU priority by N (Spark's JVM too): a burst of catching up never takes CPU "
                            "from the load generator, the receivers or the SUT on a shared node (env "
                            "FLIGHTWATCH_JOB_NICE; 0 to keep it; default %(default)s)")
        s.add_argument("--silence-timeout", default="60s",
                       help="close a run as aborted when its load generator has written nothing for this long, "
                            "e.g. after a kill -9 (default %(default)s)")
        s.add_argument("--no-heartbeat", action="store_true",
                       help="do not write the job's own heartbeats (they close the last windows of a live run)")
        s.add_argument("--partitions", type=int, default=2, help="partitions when creating the topic (default %(default)s)")
        s.add_argument("--await-topic", action="store_true", default=os.environ.get("FLIGHTWATCH_AWAIT_TOPIC") == "1",
                       help="wait for the topic instead of creating it (on Kubernetes the Topic Operator creates it "
                            "from its KafkaTopic, with its replication; env FLIGHTWATCH_AWAIT_TOPIC=1)")
        add_wait(s, "the telemetry broker (and with --await-topic the topic)")
        s.add_argument("--metrics-listen", default=os.environ.get("FLIGHTWATCH_JOB_METRICS", DEFAULT_METRICS_LISTEN),
                       metavar="HOST:PORT", help="serve the run's live figures for Prometheus at http://HOST:PORT/metrics "
                       "(env FLIGHTWATCH_JOB_METRICS; 'none' to not serve; default %(default)s)")
    return p


def config_from_args(a: argparse.Namespace) -> JobConfig:
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
                                  join_partitions=1 if getattr(a, "join_partitions", None) is None else a.join_partitions, **given)
        trigger_ns = parse_duration_ns(getattr(a, "trigger", DEFAULT_TRIGGER))
        idle_batch_ns = parse_duration_ns(getattr(a, "idle_batch_interval", "2s"))
        slice_grace_ns = parse_duration_ns(getattr(a, "slice_grace", "90s"))
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
        idle_batch_ms=idle_batch_ns // 1_000_000, slice_grace_ms=slice_grace_ns // 1_000_000,
        available_now=getattr(a, "available_now", False), master=getattr(a, "master", "local[2]"),
        bootstrap=getattr(a, "bootstrap", None), topic=getattr(a, "topic", None),
        source=getattr(a, "source", "flightwatch_kafka"), starting_offsets=getattr(a, "starting_offsets", "earliest"),
        max_offsets_per_trigger=getattr(a, "max_offsets_per_trigger", None), kafka_options=kafka_options,
        heartbeat=not getattr(a, "no_heartbeat", True), partitions=getattr(a, "partitions", 2),
        await_topic=getattr(a, "await_topic", False), join_on=getattr(a, "join_on", "auto"),
        metrics_listen=_metrics_listen(getattr(a, "metrics_listen", "none")), recompute=given if a.command == "replay" else {},
    )


def _metrics_listen(text: str | None) -> str | None:
    try:
        return metrics.listen_arg(text or "none")
    except ValueError as e:
        raise UsageError(str(e)) from None


def check_broker(cfg: JobConfig, wait: str, log) -> None:
    """Wait for the telemetry broker (``--wait``), then create the topic if missing, or with ``--await-topic`` wait for
    it (on Kubernetes the Topic Operator creates it from its KafkaTopic); still missing at the bound: one line."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    from core.kafka_options import librdkafka

    admin = None

    def topic_missing() -> str | None:
        nonlocal admin
        try:
            admin = admin or AdminClient({"bootstrap.servers": cfg.bootstrap, **librdkafka(cfg.kafka_options)})
            return None if cfg.topic in admin.list_topics(timeout=10).topics else "not created yet"
        except KafkaException as e:
            return e.args[0].str() if e.args else str(e)

    broker = f"the telemetry broker {cfg.bootstrap}"
    checks = {broker: lambda: servers_unreachable(cfg.bootstrap)}
    if cfg.await_topic:
        checks[f"topic {cfg.topic}"] = lambda: servers_unreachable(cfg.bootstrap) or topic_missing()
    try:
        problem = wait_for_servers(checks, wait, log, {broker: " (start it with `make up`)"})
        if problem:
            raise UsageError(problem)
        if not cfg.await_topic and (why := topic_missing()):
            if admin is None:
                raise UsageError(f"telemetry topic {cfg.topic} on {cfg.bootstrap}: {why}")
            try:
                admin.create_topics([NewTopic(cfg.topic, cfg.partitions, 1)])[cfg.topic].result(10)
            except KafkaException as e:
                if e.args[0].name() != "TOPIC_ALREADY_EXISTS":
                    raise
    except ValueError as e:
        raise UsageError(str(e)) from None
    except KafkaException as e:
        raise UsageError(f"telemetry topic {cfg.topic} on {cfg.bootstrap}: {e.args[0].str() if e.args else e}") from None


def telemetry_stream(spark, cfg: JobConfig):
    """Source ▸ decode ▸ the rows this run's job reads (``streaming.membership``, applied where the rows are
    decoded), as a streaming DataFrame of DECODED_SCHEMA."""
    from pyspark.sql.pandas.types import from_arrow_schema

    from streaming.archive import REPLAY_ROWS_PER_BATCH, ArchiveDataSource
    from streaming.decode import DECODED_SCHEMA, run_record_batches
    from streaming.sources import KafkaDataSource

    if cfg.command == "replay":
        spark.dataSource.register(ArchiveDataSource)
        return (spark.readStream.format("flightwatch_archive").option("path", cfg.archive_dir)
                .option("rowsPerBatch", str(REPLAY_ROWS_PER_BATCH))  # streaming.archive's
                .option("pathsOnly", str(cfg.master.startswith("local") and not cfg.joins_on_executors()).lower()).load())
    reader = spark.readStream.format(cfg.source)
    if cfg.source == "kafka":  # Spark's connector (needs spark-sql-kafka on the classpath)
        reader = reader.option("kafka.bootstrap.servers", cfg.bootstrap)
    else:
        spark.dataSource.register(KafkaDataSource)
        reader = (reader.option("bootstrap", cfg.bootstrap).option("decode", str(not cfg.decodes_in_driver()).lower())
                  .option("run", cfg.engine.run_id)
                  .option("minBatchMessages", str(IDLE_BATCH_MESSAGES))
                  .option("maxBatchWaitMs", str(cfg.idle_batch_ms)).option("sliceGraceMs", str(cfg.slice_grace_ms)))
    reader = reader.option("subscribe", cfg.topic).option("startingOffsets", cfg.starting_offsets)
    if cfg.max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(cfg.max_offsets_per_trigger))
    for k, v in cfg.kafka_options.items():
        reader = reader.option(f"kafka.{k}", v)
    raw = reader.load()
    if cfg.decodes_in_driver():
        return raw
    if cfg.source == "flightwatch_kafka":
        return raw
    return raw.mapInArrow(run_record_batches(cfg.engine.run_id), from_arrow_schema(DECODED_SCHEMA))


def _heartbeats(cfg: JobConfig, stop: threading.Event) -> None:
    """Write the job's heartbeat every second: event time moves on when agents fall silent."""
    from core import contract
    from core.kafka_options import telemetry_producer
    from core.slices import TelemetryTopic

    topic = TelemetryTopic.for_broker(cfg.topic, cfg.bootstrap, cfg.kafka_options)
    producer = telemetry_producer(cfg.bootstrap, cfg.kafka_options, **topic.producer_settings())
    while not stop.wait(1.0):
        try:
            producer.produce(topic(), contract.encode([contract.Heartbeat(cfg.engine.run_id, "job", time.time_ns())]), b"job")
        except BufferError:  # the broker away for long: this heartbeat is skipped, the next one goes
            pass
        producer.poll(0)
    producer.flush(5)


def _progress_line(info: dict) -> str:
    wm = info["watermark_ns"]
    wm_s = time.strftime("%H:%M:%S", time.gmtime(wm / 1e9)) if wm > 0 else "-"
    return (f"batch {info['batch_id']}: {info['num_records']:,} records ({info['num_quarantined']} quarantined), "
            f"sent {info['num_send']:,} recv {info['num_recv']:,}, pending {info['num_pending']:,}, "
            f"watermark {wm_s}, {info['processing_s']:.2f}s" + (" FINISHED" if info.get("finished") else ""))


def run_query(spark, cfg: JobConfig, log=print) -> bool:
    """Start the query, print a line per batch, stop when the run is finished. True if finished."""
    from streaming.sinks import RunStore

    finished = threading.Event()
    if cfg.joins_on_executors():
        from streaming.executors import ClusterRunStore as RunStore  # noqa: F811 - the joins on the executors
    store = RunStore(cfg.run_dir, cfg.engine, on_finished=finished.set, log=log, live_verdict=True,
                     archive=cfg.command != "replay")
    served = None
    if cfg.metrics_listen:
        from streaming.metrics import JobMetrics

        served = JobMetrics()
        if served.serve(cfg.metrics_listen, log):
            store.verdict.metrics = served
        else:
            served = None

    in_driver = cfg.decodes_in_driver()
    from streaming.archive import ReplayProgress, read_paths, run_length_s
    from streaming.decode import this_runs_rows

    progress = ReplayProgress(cfg.archive_dir, run_length_s(cfg.source_dir), log) if cfg.command == "replay" else None

    def sink(batch_df, batch_id: int) -> None:
        table = batch_df.toArrow()
        if in_driver:
            table = this_runs_rows(table, cfg.engine.run_id)
        elif "path" in table.column_names:  # a local replay: the archived batches' files
            table = read_paths(table.column("path").to_pylist())
        if progress is not None:
            progress.add(table.num_rows)
        result = store.process_batch(table, batch_id)
        log(_progress_line(dict(result.info, batch_id=batch_id, finished=result.finished,
                                processing_s=time.time() - t_batch[0])))
        t_batch[0] = time.time()

    t_batch = [time.time()]
    if cfg.joins_on_executors():
        from streaming.executors import cluster_sink

        sink = cluster_sink(spark, store, cfg, log)  # noqa: F811
    writer = (telemetry_stream(spark, cfg).writeStream.foreachBatch(sink)
              .option("checkpointLocation", cfg.spark_checkpoint).queryName(f"flightwatch_{cfg.engine.run_id}"))
    writer = writer.trigger(availableNow=True) if cfg.available_now else writer.trigger(processingTime=f"{cfg.trigger_ms} milliseconds")
    query = writer.start()
    if progress is not None:
        progress.begin()
    try:
        while query.isActive:
            query.awaitTermination(0.5)
            if finished.is_set():
                query.stop()
    except KeyboardInterrupt:
        log("stopping (the run can be resumed with the same command)")
        query.stop()
    finally:
        if store.verdict is not None and not finished.is_set():
            store.verdict.close()
        if served is not None:
            served.close()
    if query.exception():
        raise RuntimeError(str(query.exception()))
    if progress is not None:
        progress.finish()
    return finished.is_set()



def main(argv=None) -> int:
    try:
        a = build_parser().parse_args(argv)
        cfg = config_from_args(a)
        if cfg.command == "summary":
            from runs import results

            if not os.path.exists(RunPaths(cfg.run_dir).run_file):
                raise UsageError(f"no run at {cfg.run_dir}")
            print(json.dumps(results.summarize(cfg.run_dir), indent=1, default=str))
            return 0
        if cfg.command == "replay":
            source_dir = cfg.run_dir
            if not os.path.isdir(RunPaths(source_dir).archive):
                raise UsageError(f"no archive at {source_dir}/archive: nothing to replay")
            cfg = cfg.for_replay()
            if problem := engine_problem(cfg.engine):
                raise UsageError(problem)
            shutil.rmtree(cfg.run_dir, ignore_errors=True)  # a replay starts from a fresh checkpoint
        else:
            if not 0 <= a.nice <= 19:
                raise UsageError(f"--nice {a.nice}: give 0 to 19")
            check_broker(cfg, a.wait, lambda line: print(f"flightwatch streaming: {line}", flush=True))
            os.nice(a.nice)
        cfg = dataclasses.replace(cfg, master=session.given_master() or cfg.master)
        from streaming.executors import check_layout

        if cfg.joins_on_executors() and a.join_partitions is None:  # a cluster's default
            cfg = dataclasses.replace(cfg, engine=dataclasses.replace(cfg.engine, join_partitions=CLUSTER_JOIN_PARTITIONS))
        if problem := check_layout(cfg.run_dir, cfg.joins_on_executors(), cfg.engine.join_partitions):
            raise UsageError(problem)
    except UsageError as e:
        print(f"flightwatch streaming: error: {e}", file=sys.stderr)
        return 2
    from core import logs

    logger = logs.setup(f"streaming-{cfg.command}")
    logger.info("flightwatch streaming: run %s -> %s", cfg.engine.run_id, cfg.run_dir)
    from streaming.sinks import use_system_allocator

    use_system_allocator()  # this process lives as long as the run: freed memory goes back (release_memory)
    memory.trace_from_env("streaming-" + cfg.command)
    observer.register("streaming")  # its CPU (JVM, Python workers) is flightwatch's, not the SUT's
    spark = session.build_spark(cfg.master, cfg.engine.run_id, cfg.command)
    conf = spark.sparkContext.getConf()
    logger.info("Spark master %s (%s), shuffle partitions %s, executor memory %s", conf.get("spark.master"),
                "the cluster's, with its settings" if session.given_master() else "this machine's",
                conf.get("spark.sql.shuffle.partitions", "200"), conf.get("spark.executor.memory", "1g"))
    stop = threading.Event()
    if cfg.heartbeat and cfg.command == "run":
        threading.Thread(target=_heartbeats, args=(cfg, stop), daemon=True).start()
    try:
        done = run_query(spark, cfg, log=logs.printer(logger))
    finally:
        stop.set()
        spark.stop()
    logger.info("run %s: %s; results in %s", cfg.engine.run_id, "finished" if done else "stopped", cfg.run_dir)
    return 0
