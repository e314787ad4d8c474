"""The flightwatch streaming job: telemetry topic ▸ decode/quarantine ▸ per-run join ▸ window partials.

Usage:
    python -m streaming run --run RUN_ID [--bootstrap 127.0.0.1:19092] [--topic flightwatch.telemetry]
    python -m streaming replay --run RUN_ID       # recompute a finished run from its archive
    python -m streaming summary --run RUN_ID      # print a run's figures

Stages, one Spark Structured Streaming query:
  source   Kafka through the Python Data Source ``flightwatch_kafka`` (or ``--source kafka``
           for Spark's built-in connector), or the run's archive for a replay;
  decode   ``mapInArrow``: NDJSON bodies to typed rows, malformed ones set aside with a reason;
  filter   the records this run's job reads (``streaming.membership``), where they are decoded;
  sink     ``foreachBatch``: the join and window arithmetic of ``streaming.engine`` applied per
           micro-batch, partials written per batch ID by ``streaming.sinks.RunStore``; on a cluster the
           join partitions run in executor tasks (``streaming.executors``).
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import sys
import threading
import time

from core import logs, memory, observer
from core.cli import wait_for_servers
from core.procs import lower_priority, servers_unreachable
from core.rundir import DriverLease, LeaseHeld, LeaseLost
from streaming import session
from streaming.cli import IDLE_BATCH_MESSAGES, UsageError, build_parser, config_from_args
from streaming.config import CLUSTER_JOIN_PARTITIONS, JobConfig, engine_problem, resume_problem


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
            # its log through Python's logging (librdkafka's ``logger``): librdkafka's own would print to stderr, even
            # at info level (a "purging unserved events" line at exit broke a usage error's one line)
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
                  .option("maxBatchWaitMs", str(cfg.idle_batch_ms)).option("quietBatchWaitMs", str(cfg.quiet_batch_ms))
                  .option("sliceGraceMs", str(cfg.slice_grace_ms)))
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


HEARTBEAT_S, CLOSING_HEARTBEAT_S = 1.0, 0.1
"""The job's heartbeat: every second, and every 0.1 s while the run it reads has stopped and waits out its drop
timeout. Then only machine records come (~2 a second), and each batch waited for more (``streaming.sources``' idle
batching: up to 2 s past the trigger), so the job saw its run's close up to ~4 s late; at 10 a second more than
``IDLE_BATCH_MESSAGES`` come in each trigger, and batches keep the trigger's pace to the close (a Kafka scenario's
run at 2,000/s with a 5 s drop timeout: closed 16 s after its last send, then 12 s; 5 s of it is the watermark's
delay, 5 s the timeout)."""


def _heartbeats(cfg: JobConfig, stop: threading.Event, closing: threading.Event) -> None:
    """Write the job's heartbeat every ``HEARTBEAT_S`` (``CLOSING_HEARTBEAT_S`` while ``closing`` is set): event time
    moves on when agents fall silent."""
    from core import contract
    from core.kafka_options import telemetry_producer
    from core.slices import TelemetryTopic

    topic = TelemetryTopic.for_broker(cfg.topic, cfg.bootstrap, cfg.kafka_options)
    producer = telemetry_producer(cfg.bootstrap, cfg.kafka_options, **topic.producer_settings())
    while not stop.wait(CLOSING_HEARTBEAT_S if closing.is_set() else HEARTBEAT_S):
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


def run_query(spark, cfg: JobConfig, log=print, lease=None, closing: threading.Event | None = None) -> bool:
    """Start the query, say a batch's line when its work changed (``Query.say``), stop when the run is finished. True if
    finished. ``lease``: the live run's ``core.rundir.DriverLease``, checked before each batch's writes; ``closing``:
    set while the run has stopped and waits to be closed (the heartbeats' pace)."""
    return Query(spark, cfg, log, lease, closing).run()


class Query:
    """The job's streaming query: ``run`` starts it (``sink`` per batch, or the executors' ``cluster_sink``),
    ``wait``s until the run is finished (or the query ends), and ``close``s what it served."""

    def __init__(self, spark, cfg: JobConfig, log=print, lease=None, closing: threading.Event | None = None) -> None:
        from streaming.archive import ReplayProgress, run_length_s

        self.spark, self.cfg, self.log, self.lease = spark, cfg, log, lease
        self.closing = closing
        self.finished = threading.Event()
        self.store = self._store()
        self.served = self._metrics()
        self.progress = ReplayProgress(cfg.archive_dir, run_length_s(cfg.source_dir), log) if cfg.command == "replay" else None
        self.say = logs.Progress(log)  # a batch's line: when its work changed, and every 10 minutes at idle
        self.last_batch_at = time.time()

    def _store(self):
        if self.cfg.joins_on_executors():
            from streaming.executors import ClusterRunStore as Store
        else:
            from streaming.sinks import RunStore as Store
        return Store(self.cfg.run_dir, self.cfg.engine, on_finished=self.finished.set, log=self.log, live_verdict=True,
                     archive=self.cfg.command != "replay", lease=self.lease, closing=self.closing)

    def _metrics(self):
        """The run's live figures served for Prometheus (``--metrics-listen``), or None."""
        if not self.cfg.metrics_listen:
            return None
        from streaming.metrics import JobMetrics

        served = JobMetrics()
        if not served.serve(self.cfg.metrics_listen, self.log):
            return None
        self.store.verdict.metrics = served
        return served

    def sink(self, batch_df, batch_id: int) -> None:
        """The ``foreachBatch`` function of a job whose joins run in the driver."""
        from streaming.archive import read_paths
        from streaming.decode import this_runs_rows

        table = batch_df.toArrow()
        if self.cfg.decodes_in_driver():
            table = this_runs_rows(table, self.cfg.engine.run_id)
        elif "path" in table.column_names:  # a local replay: the archived batches' files
            table = read_paths(table.column("path").to_pylist())
        if self.progress is not None:
            self.progress.add(table.num_rows)
        result = self.store.process_batch(table, batch_id)
        now = time.time()
        self.say(result.work(), _progress_line(dict(result.info, batch_id=batch_id, finished=result.finished,
                                                    processing_s=now - self.last_batch_at)))
        self.last_batch_at = now

    def run(self) -> bool:
        cfg = self.cfg
        sink = self.sink
        if cfg.joins_on_executors():
            from streaming.executors import cluster_sink

            sink = cluster_sink(self.spark, self.store, cfg, self.say)
        writer = (telemetry_stream(self.spark, cfg).writeStream.foreachBatch(sink)
                  .option("checkpointLocation", cfg.spark_checkpoint).queryName(f"flightwatch_{cfg.engine.run_id}"))
        writer = (writer.trigger(availableNow=True) if cfg.available_now
                  else writer.trigger(processingTime=f"{cfg.trigger_ms} milliseconds"))
        query = writer.start()
        if self.progress is not None:
            self.progress.begin()
        try:
            self.wait(query)
        finally:
            self.close()
        if query.exception():
            raise RuntimeError(str(query.exception()))
        if self.progress is not None:
            self.progress.finish()
        return self.finished.is_set()

    def wait(self, query) -> None:
        try:
            while query.isActive:
                query.awaitTermination(0.5)
                if self.finished.is_set():
                    query.stop()
        except KeyboardInterrupt:
            self.log("stopping (the run can be resumed with the same command)")
            query.stop()

    def close(self) -> None:
        if self.store.verdict is not None and not self.finished.is_set():
            self.store.verdict.close()
        if self.served is not None:
            self.served.close()


def folder_cause(text: str, lease: DriverLease | None) -> str | None:
    """The one line of a query's failure that says its run folder is gone or taken over, else None: the lease's own
    word (whatever failed first: Spark's checkpoint write in a folder whose volume went finds no permission), else a
    task's (``streaming.executors.RunFolderGone`` on every executor it tried)."""
    if lease is not None:
        try:
            lease.check()
        except LeaseLost as e:
            return str(e)
    m = re.search(r"(?:LeaseLost|RunFolderGone): (.+)", text)
    return m.group(1).strip() if m else None


def main(argv=None) -> int:
    try:
        a = build_parser().parse_args(argv)
        cfg = config_from_args(a)
        if cfg.command == "summary":
            from runs import results

            if not cfg.paths.is_run:
                raise UsageError(f"no run at {cfg.run_dir}")
            print(json.dumps(results.summarize(cfg.run_dir), indent=1, default=str))
            return 0
        if cfg.command == "replay":
            source_dir = cfg.run_dir
            if not os.path.isdir(cfg.paths.archive):
                raise UsageError(f"no archive at {source_dir}/archive: nothing to replay")
            cfg = cfg.for_replay()
            if problem := engine_problem(cfg.engine):
                raise UsageError(problem)
            shutil.rmtree(cfg.run_dir, ignore_errors=True)  # a replay starts from a fresh checkpoint
        else:
            if not 0 <= a.nice <= 19:
                raise UsageError(f"--nice {a.nice}: give 0 to 19")
            check_broker(cfg, a.wait, lambda line: print(f"flightwatch streaming: {line}", flush=True))
            if note := lower_priority(a.nice):
                print(f"flightwatch streaming: {note}", flush=True)
        cfg = dataclasses.replace(cfg, master=session.given_master() or cfg.master)
        from streaming.executors import check_layout

        if cfg.joins_on_executors() and a.join_partitions is None:  # a cluster's default
            cfg = dataclasses.replace(cfg, engine=dataclasses.replace(cfg.engine, join_partitions=CLUSTER_JOIN_PARTITIONS))
        lease = None
        if cfg.command == "run":  # one driver per run folder, before it writes there (a replay makes its folder afresh)
            try:
                lease = DriverLease.take(cfg.run_dir)
            except LeaseHeld as e:
                raise UsageError(str(e)) from None
        if problem := check_layout(cfg.paths, cfg.joins_on_executors(), cfg.engine.join_partitions):
            raise UsageError(problem)
        if cfg.command == "run" and (problem := resume_problem(cfg.paths, cfg.engine)):
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
    stop, closing = threading.Event(), threading.Event()
    if cfg.heartbeat and cfg.command == "run":
        threading.Thread(target=_heartbeats, args=(cfg, stop, closing), daemon=True).start()
    try:
        done = run_query(spark, cfg, log=logs.printer(logger), lease=lease, closing=closing)
    except Exception as e:  # a query's failure: StreamingQueryException while it runs, RuntimeError after it stopped
        if (cause := folder_cause(str(e), lease)) is None:
            raise
        logger.error("run %s stopped: %s", cfg.engine.run_id, cause)
        print(f"flightwatch streaming: error: {cause}", file=sys.stderr)
        return 1
    finally:
        stop.set()
        spark.stop()
    logger.info("run %s: %s; results in %s", cfg.engine.run_id, "finished" if done else "stopped", cfg.run_dir)
    return 0
