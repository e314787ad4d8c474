"""The join on a cluster's executors: each join partition's step runs in an executor task, its state kept there.

When Spark has a cluster (a master that is not ``local``), a micro-batch takes three steps (``cluster_sink``):

1. every read task summarizes its records (``join.summarize``: the records the driver needs, and per kind and
   agent the first and last stamp of this run's sends, acks and receives) and the driver collects the summaries;
2. the driver decides the batch's run-level verdicts (``engine.plan``: watermark, agents' progress, a reset's
   hole) and archives the records it holds;
3. this run's sends, acks and receives are grouped by their ID's join partition (``xxhash64(event_id) mod P``)
   and each group runs ``join.step`` in an executor task, which archives its records and returns only partials
   (counts and histogram buckets per window, exemplars) and its new send and receive stamps for the gap rule;
   the driver merges them (``engine.finish``).

State: a task keeps its partition's state in its Python worker (reused from task to task) and snapshots it
under the run folder every ``SNAPSHOT_EVERY_BATCHES`` batches (``state/joins/p-<jp>/snap-N``). A task that finds
no state of the batch before (another worker, an executor lost, a restarted job) takes the partition's latest
snapshot before the batch and redoes the batches after it from the archive, with each batch's verdicts kept in
``batches/batch-N.json``: a batch redone gives the same output, so a kill -9 anywhere counts nothing twice. The run
folder must be on storage that the driver and the executors share (a ReadWriteMany claim on Kubernetes).

Archive: a batch is a folder ``archive/batch-N.parquet/`` holding the driver's records (``run.parquet``) and each
partition's (``p-<jp>.parquet``); Arrow reads it as one table, as it reads a local run's single file.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import time

import pyarrow as pa
import pyarrow.parquet as pq

from core.rundir import batch_file, ids_in, write_json
from streaming import engine, join
from streaming.decode import DECODED_SCHEMA
from streaming.sinks import RunStore, join_state, write_parquet
from streaming.state import EngineConfig, JoinState

SUMMARY_SCHEMA = DECODED_SCHEMA.append(pa.field(join.NUM_RECORDS, pa.int64()))
PARTITION = "join_partition"
OUTPUT_SCHEMA = pa.schema([pa.field(PARTITION, pa.int32()), pa.field("part", pa.string()), pa.field("data", pa.binary())])
"""What a partition's task returns: one row per part (``counts``, ``hists``, ``exemplars``, ``stamps``, ``meta``),
each an Arrow IPC stream (``meta``: JSON)."""
SNAPSHOT_EVERY_BATCHES = 10
KEEP_SNAPSHOTS = 2

_STATES: dict[tuple[str, int], tuple[int, JoinState]] = {}
"""In each Python worker: per (run folder, partition), the batch its state is after and the state."""


# --- on the executors
def summarize_batches(run_id: str):
    """``mapInArrow``: each read task's records as ``join.summarize`` gives them to the driver."""
    def summarize(batches):
        for rb in batches:
            summary, _ = join.summarize(pa.Table.from_batches([rb]), run_id)
            yield from summary.select(SUMMARY_SCHEMA.names).cast(SUMMARY_SCHEMA).to_batches()
    return summarize


def partition_task(root: str, cfg: EngineConfig, batch_id: int, verdicts: join.Verdicts, archive: bool):
    """``applyInArrow`` keyed by join partition: the partition's step of batch ``batch_id``."""
    def run(key, table):  # no annotations: pyspark infers the UDF type from them, and fails on strings
        jp = int(key[0].as_py())
        records = table.filter(table["kind"].is_valid()).select(DECODED_SCHEMA.names).cast(DECODED_SCHEMA)  # no ticks
        state = _state_before(root, cfg, jp, batch_id)
        if archive and records.num_rows:
            _write_part(root, batch_id, jp, records)
        settled, report = join.step(state, records, cfg, verdicts)
        _STATES[(root, jp)] = (batch_id, settled.state)
        if batch_id % SNAPSHOT_EVERY_BATCHES == 0:
            _save_snapshot(root, jp, batch_id, settled.state)
        return _output(jp, settled, report)
    return run


def _state_before(root: str, cfg: EngineConfig, jp: int, batch_id: int) -> JoinState:
    """The partition's state after ``batch_id - 1``: this worker's, or a snapshot and the archived batches after it."""
    cached = _STATES.get((root, jp))
    if cached is not None and cached[0] == batch_id - 1:
        return cached[1]
    snaps = [s for s in ids_in(_joins_dir(root, jp), "snap-*") if s < batch_id]
    state = _load_snapshot(root, jp, snaps[-1]) if snaps else JoinState()
    for b in range(snaps[-1] + 1 if snaps else 0, batch_id):
        with open(batch_file(os.path.join(root, "batches"), b, "json")) as f:
            v = join.Verdicts(**json.load(f)["verdicts"])
        part = os.path.join(batch_file(os.path.join(root, "archive"), b), f"p-{jp}.parquet")
        records = pq.read_table(part).cast(DECODED_SCHEMA) if os.path.exists(part) else DECODED_SCHEMA.empty_table()
        settled, _ = join.step(state, records, cfg, v)
        state = settled.state
    return state


def _joins_dir(root: str, jp: int) -> str:
    return os.path.join(root, "state", "joins", f"p-{jp}")


def _save_snapshot(root: str, jp: int, batch_id: int, state: JoinState) -> None:
    d = os.path.join(_joins_dir(root, jp), f"snap-{batch_id:08d}")
    tmp = f"{d}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    pq.write_table(pa.Table.from_pandas(state.known.reset_index(), preserve_index=False), os.path.join(tmp, "known.parquet"))
    pq.write_table(pa.Table.from_pandas(state.orphans, preserve_index=False), os.path.join(tmp, "orphans.parquet"))
    shutil.rmtree(d, ignore_errors=True)
    os.replace(tmp, d)
    for old in ids_in(_joins_dir(root, jp), "snap-*")[:-KEEP_SNAPSHOTS]:
        shutil.rmtree(os.path.join(_joins_dir(root, jp), f"snap-{old:08d}"), ignore_errors=True)


def _load_snapshot(root: str, jp: int, batch_id: int) -> JoinState:
    d = os.path.join(_joins_dir(root, jp), f"snap-{batch_id:08d}")
    return join_state(os.path.join(d, "known.parquet"), os.path.join(d, "orphans.parquet"))


def _write_part(root: str, batch_id: int, name, table: pa.Table) -> None:
    """One part of an archived batch's folder, through a hidden temporary file (Arrow skips those)."""
    d = batch_file(os.path.join(root, "archive"), batch_id)
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, f"{name}.parquet" if isinstance(name, str) else f"p-{name}.parquet")
    tmp = os.path.join(d, f".{os.path.basename(path)}.tmp-{os.getpid()}")
    pq.write_table(table, tmp, compression="zstd")
    os.replace(tmp, path)


def _ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()


def _table(data: bytes) -> pa.Table:
    return pa.ipc.open_stream(data).read_all()


def _output(jp: int, settled: join.Settled, report: join.Report) -> pa.Table:
    import pandas as pd

    ex = pd.concat(settled.exemplars, ignore_index=True) if settled.exemplars else pd.DataFrame()
    stamps = pa.table({"send": pa.array(report.new_sends_ns, pa.int64())})
    recvs = pa.table({"recv": pa.array(report.fresh_recv_ns, pa.int64())})
    meta = {"sizes": settled.sizes, "waiting": list(report.waiting), "cwd": os.getcwd(), "pid": os.getpid()}
    parts = {"counts": _ipc(pa.Table.from_pandas(settled.counts, preserve_index=False)),
             "hists": _ipc(pa.Table.from_pandas(settled.hists, preserve_index=False)),
             "exemplars": _ipc(pa.Table.from_pandas(ex, preserve_index=False)),
             "sends": _ipc(stamps), "recvs": _ipc(recvs), "meta": json.dumps(meta).encode()}
    return pa.table({PARTITION: pa.array([jp] * len(parts), pa.int32()), "part": list(parts),
                     "data": pa.array(list(parts.values()), pa.binary())}, schema=OUTPUT_SCHEMA)


# --- on the driver
def outputs(table: pa.Table) -> tuple[list[join.Settled], list[join.Report], dict]:
    """The partitions' outputs (``partition_task``), and where their tasks ran (executor folder -> tasks)."""
    import numpy as np

    settled, reports, ran = [], [], {}
    rows = table.to_pylist()
    for jp in sorted({r[PARTITION] for r in rows}):
        got = {r["part"]: r["data"] for r in rows if r[PARTITION] == jp}
        meta = json.loads(got["meta"])
        ex = _table(got["exemplars"]).to_pandas()
        settled.append(join.Settled(None, _table(got["counts"]).to_pandas(), _table(got["hists"]).to_pandas(),
                                    [ex] if len(ex) else [], meta["sizes"]))
        reports.append(join.Report(tuple(meta["waiting"]), _table(got["sends"])["send"].to_numpy().astype(np.int64),
                                   _table(got["recvs"])["recv"].to_numpy().astype(np.int64)))
        ran[meta["cwd"]] = ran.get(meta["cwd"], 0) + 1
    return settled, reports, ran


def cluster_sink(spark, store, cfg, log):
    """The ``foreachBatch`` function of a job whose joins run on the executors (``store``: ``ClusterRunStore``)."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema

    num_partitions = cfg.engine.join_partitions
    summary_type, output_type = from_arrow_schema(SUMMARY_SCHEMA), from_arrow_schema(OUTPUT_SCHEMA)
    ticks = spark.range(num_partitions).select(F.col("id").cast("int").alias(PARTITION))  # every partition, every batch
    mine = ((F.col("run_id") == F.lit(cfg.engine.run_id)) & F.col("quarantine_reason").isNull()
            & F.col("kind").isin(*join.DATA_KINDS))

    def sink(batch_df, batch_id: int) -> None:
        t0 = time.time()
        summary = batch_df.mapInArrow(summarize_batches(cfg.engine.run_id), summary_type).toArrow().cast(SUMMARY_SCHEMA)
        plan = store.plan_batch(summary, batch_id)
        data = batch_df.where(mine).withColumn(PARTITION, F.pmod(F.xxhash64("event_id"), F.lit(num_partitions)).cast("int"))
        task = partition_task(store.paths.root, cfg.engine, batch_id, plan.verdicts, store.archive)
        # a task per partition (range: no two partitions share a task, as a hash of 0..P-1 could make them)
        out = (data.unionByName(ticks, allowMissingColumns=True).repartitionByRange(num_partitions, PARTITION)
               .groupBy(PARTITION).applyInArrow(task, output_type).toArrow())
        result = store.finish_batch(plan, out, batch_id, t0)
        log(f"batch {batch_id}: {result.info['num_records']:,} records ({result.info['num_quarantined']} quarantined), "
            f"sent {result.info['num_send']:,} recv {result.info['num_recv']:,}, pending {result.info['num_pending']:,}, "
            f"{num_partitions} join partitions on {len(result.info['join_tasks'])} executor(s), {time.time() - t0:.2f}s"
            + (" FINISHED" if result.finished else ""))
    return sink


def check_partitions(root: str, num_partitions: int) -> str | None:
    """A run's executor state is split in the partitions it started with: another number is refused (one line)."""
    path = os.path.join(root, "state", "joins", "partitions.json")
    if os.path.exists(path):
        with open(path) as f:
            had = json.load(f)["join_partitions"]
        if had != num_partitions:
            return f"this run's joins ran in {had} partitions on the executors: resume it with --join-partitions {had}"
        return None
    write_json(path, {"join_partitions": num_partitions})
    return None


class ClusterRunStore(RunStore):
    """A ``RunStore`` whose joins run on the executors: the driver plans a batch, archives its own records, and
    merges the partitions' outputs (``plan_batch``, ``finish_batch``). Its own state (run-level, no join) comes back
    after a restart from its snapshot and the inputs it kept of each batch since (``state/driver/``)."""

    def plan_batch(self, summary: pa.Table, batch_id: int) -> engine.Plan:
        return _plan_batch(self, summary, batch_id)

    def finish_batch(self, plan: engine.Plan, out: pa.Table, batch_id: int, t0: float) -> engine.BatchResult:
        return _finish_batch(self, plan, out, batch_id, t0)

    def _recover(self, batch_id: int) -> None:
        _recover_driver(self, batch_id)


def _driver_file(store, batch_id: int, name: str) -> str:
    return os.path.join(store.paths.state, "driver", f"batch-{batch_id:08d}.{name}.parquet")


def _plan_batch(store, summary: pa.Table, batch_id: int) -> engine.Plan:
    if store.state is None or store.next_batch != batch_id:
        if not store.archive and batch_id > 0:
            raise RuntimeError(f"batch {batch_id} cannot be resumed without an archive: start the replay again")
        store._recover(batch_id)
    if store.archive:
        shutil.rmtree(batch_file(store.paths.archive, batch_id), ignore_errors=True)  # a batch redone: afresh
        own = summary.filter(summary[join.NUM_RECORDS].is_null()).select(DECODED_SCHEMA.names).cast(DECODED_SCHEMA)
        _write_part(store.paths.root, batch_id, "run", own)
    write_parquet(_driver_file(store, batch_id, "summary"), summary)
    return engine.plan(store.state, summary, store.cfg)


def _finish_batch(store, plan: engine.Plan, out: pa.Table, batch_id: int, t0: float):
    settled, reports, ran = outputs(out)
    write_parquet(_driver_file(store, batch_id, "stamps"), _stamps(reports))
    state, result = engine.finish(plan, settled, reports)
    state.joins = []  # on the executors
    store.state = state
    result.info["join_tasks"] = ran
    result = store.conclude(result, batch_id, t0, verdicts=dataclasses.asdict(plan.verdicts))
    kept = ids_in(store.paths.state, "snap-*")
    for old in (ids_in(os.path.join(store.paths.state, "driver"), "batch-*.stamps.parquet") if kept else []):
        if old <= kept[0]:  # before the oldest snapshot kept: never read again
            for name in ("summary", "stamps"):
                with contextlib.suppress(OSError):
                    os.remove(_driver_file(store, old, name))
    return result


def _stamps(reports: list[join.Report]) -> pa.Table:
    """The partitions' new send and receive stamps and waiting sends: what the driver's state needs of them."""
    import numpy as np

    sends = np.concatenate([np.zeros(0, np.int64)] + [r.new_sends_ns for r in reports])
    recvs = np.concatenate([np.zeros(0, np.int64)] + [r.fresh_recv_ns for r in reports])
    waiting = [list(r.waiting) for r in reports]
    return pa.table({"kind": ["send"] * len(sends) + ["recv"] * len(recvs) + ["waiting"] * len(waiting),
                     "at_ns": pa.array(np.r_[sends, recvs, [w[1] for w in waiting]], pa.int64()),
                     "count": pa.array([0] * (len(sends) + len(recvs)) + [w[0] for w in waiting], pa.int64()),
                     "first_sent_ns": pa.array([0] * (len(sends) + len(recvs)) + [w[2] for w in waiting], pa.int64())})


def _reports(stamps: pa.Table) -> list[join.Report]:
    kind = stamps["kind"].to_numpy(zero_copy_only=False)
    at = stamps["at_ns"].to_numpy()
    w = stamps.filter(pa.array(kind == "waiting")).to_pylist()
    waiting = (sum(r["count"] for r in w), min((r["at_ns"] for r in w if r["count"]), default=engine.NO_TIME_NS),
               min((r["first_sent_ns"] for r in w if r["first_sent_ns"] != engine.NO_TIME_NS), default=engine.NO_TIME_NS))
    return [join.Report(waiting, at[kind == "send"], at[kind == "recv"])]


def _recover_driver(store, batch_id: int) -> None:
    """The driver's state after ``batch_id - 1``: its latest snapshot before it, then the kept inputs after it."""
    import pandas as pd

    snaps = [s for s in ids_in(store.paths.state, "snap-*") if s < batch_id]
    state = store._load_snapshot(snaps[-1]) if snaps else engine.EngineState()
    first = snaps[-1] + 1 if snaps else 0
    for b in range(first, batch_id):
        plan = engine.plan(state, pq.read_table(_driver_file(store, b, "summary")), store.cfg)
        empty = join.Settled(None, pd.DataFrame(), pd.DataFrame(), [], {"num_known": 0, "num_pending": 0, "num_orphans": 0})
        state, _ = engine.finish(plan, [empty], _reports(pq.read_table(_driver_file(store, b, "stamps"))))
        state.joins = []
    if batch_id:
        store.log(f"recovered the driver's state at batch {batch_id}: snapshot {snaps[-1] if snaps else '-'} + "
                  f"{batch_id - first} batches' inputs")
    store.state = state
    if store.verdict is not None:
        store.verdict.restart_at(batch_id)
