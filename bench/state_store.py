"""The executors' join state in Spark's own state store, measured against flightwatch's commit protocol.

    python -m bench.state_store [--rate 20000] [--seconds 30] [--workers 2] [--join-partitions 8]

Both designs run the same join step (``streaming.join.step``: the same rules, the same partials) on a Spark
standalone cluster of ``--workers`` one-core workers, each reading its own copy of the same live load
(``bench.pipeline``'s open-loop generator: a send and a receive record per event, ``--rate`` events/s) from a
fresh topic of a Tansu broker:

  commit protocol  flightwatch's job, ``--join-on executors``: a task per join partition keeps its state in its
                   Python worker, parts and snapshots under the run folder (``streaming.executors``)
  state store      ``transformWithStateInPandas`` keyed by join partition: each partition's ``JoinState`` (the
                   IDs it knows, its orphans) is a value in RocksDB with changelog checkpointing, read and written
                   whole by every batch that touches the partition; Spark's own checkpoint recovers it

Reported per design, over the load (the first 3 s and the last 2 s of windows left out where windows are used):
processed/s and its share of the records offered, the micro-batch interval (median), the machine's busy cores
(the executors are the workers' processes), events received (exactly once each: the truth is every event sent)
and per-window p99 flight time. The state store's run is shortened to the join: it gets no driver verdicts (its
watermark and judged time are each partition's newest stamp less the watermark delay; no telemetry reset, no gap
rule), so it does less than the product's job, and is measured as a bound in its favour.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

NS = 1_000_000_000
PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


# --- the state-store design's query (run in its own process: ``python -m bench.state_store query``)
def _processor(cfg_json: str):
    """A ``StatefulProcessor`` keyed by join partition, its state one row: the partition's JoinState as Parquet."""
    import pandas as pd
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    from pyspark.sql.streaming import StatefulProcessor
    from pyspark.sql.types import BinaryType, LongType, StructField, StructType

    from streaming import executors, join, membership
    from streaming.decode import DECODED_SCHEMA
    from streaming.sinks import join_state
    from streaming.state import NO_TIME_NS, EngineConfig, JoinState

    cfg = EngineConfig(**json.loads(cfg_json))
    schema = StructType([StructField("known", BinaryType()), StructField("orphans", BinaryType()),
                         StructField("max_ns", LongType()), StructField("judged_ns", LongType())])

    def parquet(df: pd.DataFrame) -> bytes:
        sink = pa.BufferOutputStream()
        pq.write_table(pa.Table.from_pandas(df, preserve_index=False), sink)
        return sink.getvalue().to_pybytes()

    class JoinProcessor(StatefulProcessor):
        def init(self, handle) -> None:
            self.value = handle.getValueState("join", schema)

        def handleInputRows(self, key, rows, timerValues):
            jp = int(key[0])
            frame = pd.concat(list(rows), ignore_index=True)
            table = pa.Table.from_pandas(frame, schema=DECODED_SCHEMA.append(pa.field("join_partition", pa.int32())),
                                         preserve_index=False, safe=False)
            records = table.filter(membership.data(table, cfg.run_id)).select(DECODED_SCHEMA.names)
            state, max_ns, judged_ns = JoinState(), NO_TIME_NS, NO_TIME_NS
            if self.value.exists():
                known, orphans, max_ns, judged_ns = self.value.get()
                state = join_state(pa.BufferReader(known), pa.BufferReader(orphans))
            if records.num_rows:
                max_ns = max(max_ns, pc.max(records["at_ns"]).as_py())
            watermark = max(judged_ns, max_ns - cfg.watermark_delay_ns)
            v = join.Verdicts(NO_TIME_NS, judged_ns, watermark, watermark, NO_TIME_NS)
            settled, report = join.step(state, records, cfg, v)
            self.value.update((parquet(settled.state.known.reset_index()), parquet(settled.state.orphans),
                               max_ns, watermark))
            yield executors._output(jp, settled, report, None).combine_chunks().to_pandas()  # one chunk: Spark wants Arrays

        def close(self) -> None:
            pass

    return JoinProcessor()


def query_main(a) -> int:
    """Read the topic live, join in transformWithStateInPandas, and write each batch's partials' sums to a log."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema

    from streaming import executors
    from streaming.session import build_spark
    from streaming.sources import KafkaDataSource
    from streaming.state import EngineConfig

    spark = build_spark(a.master, a.run, "run")
    for key, value in (("spark.sql.streaming.stateStore.providerClass", PROVIDER),
                       ("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true"),
                       ("spark.sql.shuffle.partitions", str(a.join_partitions))):
        spark.conf.set(key, value)
    spark.dataSource.register(KafkaDataSource)
    raw = (spark.readStream.format("flightwatch_kafka").option("bootstrap", a.bootstrap).option("decode", "true")
           .option("run", a.run).option("subscribe", a.topic).option("startingOffsets", "earliest")
           .option("minBatchMessages", "1").option("maxBatchWaitMs", "500").load())
    data = (raw.filter(F.col("kind").isin("send", "ack", "recv"))
            .withColumn(executors.PARTITION, F.pmod(F.xxhash64("event_id"), F.lit(a.join_partitions)).cast("int")))
    cfg = EngineConfig(run_id=a.run, join_partitions=a.join_partitions)
    out = data.groupBy(executors.PARTITION).transformWithStateInPandas(
        _processor(json.dumps(cfg.settings())), from_arrow_schema(executors.OUTPUT_SCHEMA), "Append", "None")
    log = open(os.path.join(a.out, "batches.jsonl"), "a")

    def sink(batch_df, batch_id: int) -> None:
        t = batch_df.toArrow()
        parts = t.column("part").to_pylist() if t.num_rows else []
        counts = t.filter(np.array([p == "counts" for p in parts], bool)) if parts else t
        hists = t.filter(np.array([p == "hists" for p in parts], bool)) if parts else t
        log.write(json.dumps({
            "batch": batch_id, "written_at_ns": time.time_ns(),
            "counts": counts.select(["window_ns", "name", "value"]).to_pydict() if counts.num_rows else {},
            "hists": hists.select(["window_ns", "hist", "bucket", "count"]).to_pydict() if hists.num_rows else {},
        }) + "\n")
        log.flush()

    q = (out.writeStream.foreachBatch(sink).option("checkpointLocation", os.path.join(a.out, "checkpoint"))
         .trigger(processingTime="500 milliseconds").start())
    signal.signal(signal.SIGINT, lambda *_: q.stop())
    signal.signal(signal.SIGTERM, lambda *_: q.stop())
    q.awaitTermination()
    return 0


# --- the benchmark
def _windows(out: str):
    """(batches' written times, per window: received, p99 flight time µs) of the state-store run's log."""
    import pandas as pd

    from runs.table import percentile_figures

    written, counts, hists = [], [], []
    for line in open(os.path.join(out, "batches.jsonl")):
        try:
            b = json.loads(line)
        except ValueError:  # the line being written
            continue
        written.append(b["written_at_ns"])
        if b["counts"]:
            counts.append(pd.DataFrame(b["counts"]))
        if b["hists"]:
            hists.append(pd.DataFrame(b["hists"]))
    c = pd.concat(counts).groupby(["window_ns", "name"])["value"].sum().unstack(fill_value=0) if counts else pd.DataFrame()
    h = pd.concat(hists) if hists else pd.DataFrame(columns=["window_ns", "hist", "bucket", "count"])
    h = h[h["hist"] == "latency_us"].groupby(["window_ns", "bucket"], as_index=False)["count"].sum()
    p99 = {w: percentile_figures(g["bucket"].to_numpy(), g["count"].to_numpy())["p99"] for w, g in h.groupby("window_ns")}
    w = pd.DataFrame({"received": c["received"] if "received" in c else pd.Series(dtype=np.int64)})
    w["latency_us_p99"] = pd.Series(p99)
    return np.array(written), w.reset_index().rename(columns={"index": "window_ns"})


def bench_state_store(bootstrap: str, rate: int, seconds: float, workdir: str, master: str, partitions: int) -> dict:
    from bench.pipeline import drained, machine_busy_s, produce_load
    from core import contract
    from core.kafka_options import create_topic, telemetry_producer
    from core.procs import stop_process

    run_id, topic = f"bench-{rate}-state-store", f"bench-{rate}-state-store-{int(time.time())}"
    create_topic(bootstrap, topic, 2, {})
    out = os.path.join(workdir, run_id)
    os.makedirs(out, exist_ok=True)
    job = subprocess.Popen(
        [sys.executable, "-m", "bench.state_store", "query", "--master", master, "--bootstrap", bootstrap, "--topic", topic,
         "--run", run_id, "--out", out, "--join-partitions", str(partitions)],
        cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), stdout=open(os.path.join(workdir, f"{run_id}.log"), "w"),
        stderr=subprocess.STDOUT, start_new_session=True)
    producer = telemetry_producer(bootstrap, {}, **{"linger.ms": 5, "batch.size": 1 << 20})
    log = os.path.join(out, "batches.jsonl")
    try:
        producer.produce(topic, contract.encode([contract.RunStart(run_id, "bench", time.time_ns())]), b"bench")
        producer.flush(30)
        deadline = time.monotonic() + 180
        while not (os.path.exists(log) and os.path.getsize(log)):  # its first batch: the query is up
            if time.monotonic() > deadline or job.poll() is not None:
                raise RuntimeError(f"the state-store query did not start; see {workdir}/{run_id}.log")
            time.sleep(0.2)
        t0, busy0 = time.time_ns(), machine_busy_s()
        num_records, _ = produce_load(producer, topic, run_id, rate, seconds)
        t1, busy1 = time.time_ns(), machine_busy_s()
        t_drained = drained(lambda: int(_windows(out)[1]["received"].sum()), num_records // 2, 120, 1.0)
    finally:
        producer.flush(30)
        stop_process(job, signal.SIGINT, wait_s=60, group=True)
    written, w = _windows(out)
    load = written[(written >= t0) & (written <= t1)]
    inner = w[(w["window_ns"] >= t0 + 3 * NS) & (w["window_ns"] + NS <= t1 - 2 * NS)]
    received = int(w["received"].sum())
    return {"design": "state store", "rate": rate, "offered_per_sec": num_records / ((t1 - t0) / NS),
            "processed_per_sec": 2 * received / ((t_drained - t0) / NS), "received": received,
            "events": num_records // 2, "drain_s": (t_drained - t1) / NS,
            "batch_s": float(np.median(np.diff(load))) / NS if len(load) > 2 else float("nan"),
            "machine_cores": (busy1 - busy0) / ((t1 - t0) / NS),
            "p99_ms_median": float(inner["latency_us_p99"].median()) / 1000 if len(inner) else float("nan")}


def bench_commit_protocol(bootstrap: str, rate: int, seconds: float, workdir: str, master: str, partitions: int) -> dict:
    from bench.pipeline import bench_rate
    from core.rundir import RunPaths
    from runs import results

    row = bench_rate(bootstrap, rate, seconds, workdir, None, partitions, master, "executors")
    out = os.path.join(workdir, row["run_id"])
    received = int(results.load_windows(out)["received"].sum())
    batches = RunPaths(out).batches
    caches = [json.load(open(os.path.join(batches, f))).get("join_cache") or {}
              for f in os.listdir(batches) if f.endswith(".json")]
    tasks = sum(c.get("tasks", 0) for c in caches)
    return {"design": "commit protocol", "rate": rate, "offered_per_sec": row["records_per_sec"],
            "state_in_worker": sum(c.get("hits", 0) for c in caches) / tasks if tasks else float("nan"),
            "redone_batches": sum(c.get("redone_batches", 0) for c in caches),
            "processed_per_sec": row["processed_per_sec"], "received": received, "events": row.get("events"),
            "drain_s": row["drain_s"], "batch_s": row["batch_s"], "machine_cores": row["machine_cores"],
            "p99_ms_median": row.get("p99_ms_median", float("nan"))}


def median_row(rows: list[dict]) -> dict:
    """Each figure's median over the rows of one design; counts summed (received, events, redone batches)."""
    out = dict(rows[0])
    for k, v in rows[0].items():
        if k in ("received", "events", "redone_batches"):
            out[k] = sum(r[k] for r in rows)
        elif isinstance(v, float):
            out[k] = float(np.median([r[k] for r in rows]))
    return out


def print_rows(rows: list[dict]) -> None:
    print(f"\n{'design':16} {'events/s':>9} {'proc/off':>8} {'batch s':>8} {'drain s':>8} {'cores':>6} "
          f"{'received':>10} {'of events':>10} {'p99 ms':>7} {'state in worker':>16}")
    for r in rows:
        hits = r.get("state_in_worker")
        where = "(Spark places it)" if hits is None else f"{hits:.0%}, {r['redone_batches']} redone"
        print(f"{r['design']:16} {r['rate']:>9,} {r['processed_per_sec'] / r['offered_per_sec']:>8.2f} "
              f"{r['batch_s']:>8.2f} {r['drain_s']:>8.1f} {r['machine_cores']:>6.2f} {r['received'] or 0:>10,} "
              f"{r['events'] or 0:>10,} {r['p99_ms_median']:>7.2f} "
              f"{where:>16}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.state_store", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    sub = ap.add_subparsers(dest="cmd")
    q = sub.add_parser("query", help="(internal) the state-store design's streaming query")
    for flag in ("--master", "--bootstrap", "--topic", "--run", "--out"):
        q.add_argument(flag, required=True)
    q.add_argument("--join-partitions", type=int, default=8)
    ap.add_argument("--rate", type=int, default=20000, help="events/s (default %(default)s)")
    ap.add_argument("--seconds", type=float, default=30, help="seconds of load per design (default %(default)s)")
    ap.add_argument("--workers", type=int, default=2, help="one-core Spark workers (default %(default)s)")
    ap.add_argument("--join-partitions", type=int, default=8, help="join partitions (default %(default)s)")
    ap.add_argument("--designs", default="commit-protocol,state-store", help="which, in order (default %(default)s)")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each design, alternating; medians (default %(default)s)")
    a = ap.parse_args(argv)
    if a.cmd == "query":
        return query_main(a)
    if a.rate <= 0 or a.seconds < 8 or a.workers < 1 or a.join_partitions < 1 or a.repeat < 1:
        print("bench.state_store: error: --rate, --workers and --join-partitions take positive integers, --seconds "
              "at least 8", file=sys.stderr)
        return 2
    import tempfile

    from core.procs import free_port, stop_process
    from stack.spark import Cluster
    from stack.tansu import start_tansu

    workdir = tempfile.mkdtemp(prefix="flightwatch-state-store-")
    port = free_port()
    broker = start_tansu(port, open(os.path.join(workdir, "tansu.log"), "w"), "bench")
    bootstrap, rows = f"127.0.0.1:{port}", []
    cluster = Cluster(workers=a.workers, work_dir=os.path.join(workdir, "spark-work"),
                      log=open(os.path.join(workdir, "spark.log"), "wb"))
    try:
        for i in range(a.repeat):
            for design in a.designs.split(","):
                print(f"{design} ({i + 1}/{a.repeat}): {a.rate:,} events/s for {a.seconds:.0f} s on {a.workers} workers ...",
                      flush=True)
                run = bench_state_store if design == "state-store" else bench_commit_protocol
                os.makedirs(f"{workdir}/{i}", exist_ok=True)
                rows.append(run(bootstrap, a.rate, a.seconds, f"{workdir}/{i}", cluster.url, a.join_partitions))
                print_rows(rows[-1:])
    finally:
        cluster.stop()
        stop_process(broker)
    print_rows(rows)
    print(f"\nmedians of {a.repeat}:")
    print_rows([median_row([r for r in rows if r["design"] == d]) for d in dict.fromkeys(r["design"] for r in rows)])
    print(f"logs: {workdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
