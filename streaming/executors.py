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

State: a task keeps its partition's state in its Python worker (reused from task to task; a worker keeps only the
partitions of one run) and snapshots it under the run folder every ``SNAPSHOT_EVERY_BATCHES`` batches
(``state/joins/p-<jp>/snap-N``). A task that finds
no state of the batch before (another worker, an executor lost, a restarted job) takes the partition's latest
snapshot before the batch and redoes the batches after it from the archive, with each batch's verdicts kept in
``batches/batch-N.json``: a batch redone gives the same output, so a kill -9 anywhere counts nothing twice. The run
folder must be on storage that the driver and the executors share (a ReadWriteMany claim on Kubernetes).

Shared storage, several attempts: two attempts of one task (speculation, a zombie task, a stage retry) may run at
once, in containers whose process IDs repeat. So every temporary name is unique (``uuid4``), a snapshot is written
once (an attempt that finds the batch's snapshot there already drops its own: a batch redone gives the same state),
and every partition's part of every batch is written, empty or not, also in a replay: a part that is missing when a
task rebuilds its state is an error that names it (storage not shared, or a file not yet visible: Spark retries the
task), never an empty batch that would make false drops.

Archive: a batch is a folder ``archive/batch-N.parquet/`` holding the driver's records (``run.parquet``) and each
partition's (``p-<jp>.parquet``); Arrow reads it as one table, as it reads a local run's single file.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import socket
import time
import uuid

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from core.rundir import RunPaths, ids_in, write_json
from streaming import clocks, engine, join, membership
from streaming.config import JOIN_CACHE_BYTES
from streaming.decode import DECODED_SCHEMA, conform
from streaming.sinks import RunStore, join_state, write_table
from streaming.state import EngineConfig, JoinState

SUMMARY_SCHEMA = DECODED_SCHEMA.append(pa.field(join.NUM_RECORDS, pa.int64()))
PARTITION = "join_partition"
OUTPUT_SCHEMA = pa.schema([
    pa.field(PARTITION, pa.int32()), pa.field("part", pa.string()),
    pa.field("window_ns", pa.int64()), pa.field("name", pa.string()), pa.field("value", pa.int64()),  # counts
    pa.field("hist", pa.string()), pa.field("bucket", pa.int32()), pa.field("count", pa.int64()),     # hists
    pa.field("kind", pa.string()), pa.field("at_ns", pa.int64()), pa.field("latency_us", pa.float64()),
    pa.field("event_id", pa.string()),                          # exemplars (``count`` too); ``at_ns``: stamps
    pa.field("meta", pa.string()),                              # JSON: IDs known, waiting, the task's folder
])
"""What a partition's task returns, long: a row per count (``part="counts"``), histogram bucket (``hists``), exemplar
(``exemplars``), new send or receive stamp (``send``, ``recv``), and one ``meta``; the driver splits it by ``part``
with Arrow filters, whatever the number of partitions."""
SNAPSHOT_EVERY_BATCHES = 10
KEEP_SNAPSHOTS = 2

_STATES: dict[tuple[str, int], tuple[int, JoinState, int]] = {}
"""In each Python worker: per (run folder, partition), the batch its state is after, the state and its bytes (``keep``),
the one used longest ago first."""


# --- on the executors
def summarize_batches(run_id: str):
    """``mapInArrow``: each read task's records as ``join.summarize`` gives them to the driver."""
    def summarize(batches):
        for rb in batches:
            summary, _ = join.summarize(pa.Table.from_batches([rb]), run_id)
            yield from summary.select(SUMMARY_SCHEMA.names).cast(SUMMARY_SCHEMA).to_batches()
    return summarize


def partition_task(paths: RunPaths, cfg: EngineConfig, batch_id: int, verdicts: join.Verdicts,
                   cache_bytes: int = JOIN_CACHE_BYTES):
    """``applyInArrow`` keyed by join partition: the partition's step of batch ``batch_id``, its worker keeping at most
    ``cache_bytes`` of states (``keep``)."""
    def run(key, table):  # no annotations: pyspark infers the UDF type from them, and fails on strings
        jp = int(key[0].as_py())
        check_run_folder(paths)
        # the run's sends, acks and receives (the ticks, and the driver's records shuffled with them, are not)
        records = table.filter(membership.data(table, cfg.run_id)).select(DECODED_SCHEMA.names).cast(DECODED_SCHEMA)
        records = clocks.correct(records, verdicts.clocks, cfg.clock_correction)  # archived as corrected
        state, redone = _state_before(paths, cfg, jp, batch_id)
        _write_part(paths, batch_id, jp, records)  # every batch, empty or not, a replay's too: what a rebuild reads
        settled, report = join.step(state, records, cfg, verdicts)
        cache = keep(paths.root, jp, batch_id, settled.state, cache_bytes)
        if batch_id % SNAPSHOT_EVERY_BATCHES == 0:
            _save_snapshot(paths, jp, batch_id, settled.state)
        return _output(jp, settled, report, redone, cache)
    return run


class RunFolderGone(FileNotFoundError):
    """The run folder is not on this task's host: its volume was taken away, or was never mounted there."""


def check_run_folder(paths: RunPaths) -> None:
    """Before a task reads or writes the run folder: ``RunFolderGone`` (one line: the host and the folder) unless the
    folder the driver made is there. Without it, state would read as empty and a part would go to the host's own
    disk; with it, the task fails and Spark runs it on another executor (``streaming.session``: a cluster excludes
    an executor whose tasks fail)."""
    if not paths.is_run:
        raise RunFolderGone(f"run folder {paths.root} is not on host {socket.gethostname()} (no run.json there): the volume "
                            "the driver and the executors share was taken away from this host, or never mounted on it")


def keep(root: str, jp: int, batch_id: int, state: JoinState, bound: int = JOIN_CACHE_BYTES) -> dict:
    """Keep a partition's state in this worker, within ``bound`` bytes: a worker reused by another run's job drops the
    states of the run before; a state two batches old or more cannot serve a task again (a task takes the state of the
    batch just before its own), and goes; then the states used longest ago, while over the bound (the one kept now
    stays, whatever its size). What it holds after, and how many it dropped."""
    dropped = 0
    for key in [k for k, (b, _, _) in _STATES.items() if k[0] != root or b < batch_id - 1]:
        del _STATES[key]
        dropped += 1
    _STATES.pop((root, jp), None)
    _STATES[(root, jp)] = (batch_id, state, state.nbytes())  # the newest last: the order is the order of use
    held = sum(n for _, _, n in _STATES.values())
    for key in list(_STATES)[:-1]:
        if held <= bound:
            break
        held -= _STATES.pop(key)[2]
        dropped += 1
    return {"held_bytes": held, "evicted": dropped}


def _state_before(paths: RunPaths, cfg: EngineConfig, jp: int, batch_id: int) -> tuple[JoinState, int | None]:
    """The partition's state after ``batch_id - 1`` and how many batches were redone to get it: this worker's (None:
    nothing loaded), or a snapshot and the archived batches after it."""
    cached = _STATES.get((paths.root, jp))
    if cached is not None and cached[0] == batch_id - 1:
        return cached[1], None
    snaps = [s for s in ids_in(paths.joins(jp), "snap-*") if s < batch_id]
    state = _load_snapshot(paths, jp, snaps[-1]) if snaps else JoinState()
    start = snaps[-1] + 1 if snaps else 0
    for b in range(start, batch_id):
        with open(paths.manifest(b)) as f:
            manifest = json.load(f)
        v = join.Verdicts(**manifest["verdicts"])
        part = os.path.join(paths.archived(b), f"p-{jp}.parquet")
        if os.path.exists(part):
            records = conform(pq.read_table(part))
        elif manifest.get("archive_parts"):  # written for every partition: missing is not empty
            raise FileNotFoundError(f"join partition {jp} cannot be rebuilt: batch {b}'s part {part} is missing (is the "
                                    "run folder on storage every executor shares, and is the file visible yet?)")
        else:  # a run from before every part was written: a partition without records had none
            records = DECODED_SCHEMA.empty_table()
        settled, _ = join.step(state, records, cfg, v)
        state = settled.state
    return state, batch_id - start


def _save_snapshot(paths: RunPaths, jp: int, batch_id: int, state: JoinState) -> None:
    joins = paths.joins(jp)
    d = os.path.join(joins, f"snap-{batch_id:08d}")
    tmp = unique_tmp(d)
    os.makedirs(tmp)
    write_table(state.known.reset_index(), os.path.join(tmp, "known.parquet"))
    write_table(state.orphans, os.path.join(tmp, "orphans.parquet"))
    try:
        os.rename(tmp, d)  # never over a snapshot another attempt wrote: a reader may be reading it
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not os.path.isdir(d):
            raise
        return  # the batch's snapshot is there (another attempt of this task): the same state
    for old in ids_in(joins, "snap-*")[:-KEEP_SNAPSHOTS]:
        shutil.rmtree(os.path.join(joins, f"snap-{old:08d}"), ignore_errors=True)


def _load_snapshot(paths: RunPaths, jp: int, batch_id: int) -> JoinState:
    d = os.path.join(paths.joins(jp), f"snap-{batch_id:08d}")
    return join_state(os.path.join(d, "known.parquet"), os.path.join(d, "orphans.parquet"))


def _write_part(paths: RunPaths, batch_id: int, name, table: pa.Table) -> None:
    """One part of an archived batch's folder, through a hidden temporary file (Arrow skips those)."""
    d = paths.archived(batch_id)
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, f"{name}.parquet" if isinstance(name, str) else f"p-{name}.parquet")
    tmp = unique_tmp(os.path.join(d, f".{os.path.basename(path)}"))
    write_table(table, tmp, compression="zstd")
    os.replace(tmp, path)


def unique_tmp(path: str) -> str:
    """A temporary name beside ``path`` that no other attempt, container or host picks (a PID repeats across them)."""
    return f"{path}.tmp-{uuid.uuid4().hex}"


def executor_name() -> str:
    """Where a task ran: its host (a pod's name on Kubernetes) and its executor's folder."""
    return f"{socket.gethostname()}:{os.getcwd()}"


def _rows(jp: int, part: str, columns: dict, n: int) -> pa.Table:
    cols = {f.name: pa.nulls(n, f.type) for f in OUTPUT_SCHEMA}
    cols[PARTITION], cols["part"] = pa.array(np.full(n, jp, np.int32)), pa.array([part] * n, pa.string())
    for name, values in columns.items():
        cols[name] = pa.array(values, OUTPUT_SCHEMA.field(name).type, from_pandas=True)
    return pa.table(cols, schema=OUTPUT_SCHEMA)


def _output(jp: int, settled: join.Settled, report: join.Report, redone: int | None, cache: dict | None = None) -> pa.Table:
    import pandas as pd

    c, h = settled.counts, settled.hists
    ex = (pd.concat(settled.exemplars, ignore_index=True) if settled.exemplars else pd.DataFrame()).reindex(
        columns=["kind", "at_ns", "value", "count", "event_id"])
    meta = {"sizes": settled.sizes, "waiting": list(report.waiting), "executor": executor_name(), "redone": redone,
            "cache": cache or {}}
    parts = [
        _rows(jp, "counts", {"window_ns": c.get("window_ns", []), "name": c.get("name", []), "value": c.get("value", [])}, len(c)),
        _rows(jp, "hists", {k: h.get(k, []) for k in ("window_ns", "hist", "bucket", "count")}, len(h)),
        _rows(jp, "exemplars", {"kind": ex["kind"], "at_ns": ex["at_ns"], "latency_us": ex["value"], "count": ex["count"],
                                "event_id": ex["event_id"]}, len(ex)),
        _rows(jp, "send", {"at_ns": report.new_sends_ns}, len(report.new_sends_ns)),
        _rows(jp, "recv", {"at_ns": report.fresh_recv_ns}, len(report.fresh_recv_ns)),
        _rows(jp, "meta", {"meta": [json.dumps(meta)]}, 1),
    ]
    return pa.concat_tables(parts)


# --- on the driver
def outputs(table: pa.Table) -> tuple[list[join.Settled], list[join.Report], dict, dict]:
    """The partitions' outputs (``partition_task``) as one merged ``Settled`` and ``Report``, where their tasks ran
    (executor folder -> tasks), and the workers' caches: how many tasks found their state there (``hits``) or not
    (``misses``: a snapshot loaded and ``redone_batches``), states dropped (``evicted``), the most a worker held."""
    part = table["part"]

    def of(name: str, cols: list[str]):
        return table.filter(pc.equal(part, name)).select(cols)
    counts = of("counts", ["window_ns", "name", "value"]).to_pandas()
    hists = of("hists", ["window_ns", "hist", "bucket", "count"]).to_pandas()
    ex = of("exemplars", ["kind", "at_ns", "latency_us", "count", "event_id"]).to_pandas().rename(columns={"latency_us": "value"})
    metas = [json.loads(m) for m in of("meta", ["meta"])["meta"].to_pylist()]
    sizes = {k: sum(m["sizes"][k] for m in metas) for k in ("num_known", "num_pending", "num_orphans")}
    waiting = engine.summed_waiting([tuple(m["waiting"]) for m in metas])
    ran: dict[str, int] = {}
    for m in metas:
        ran[m["executor"]] = ran.get(m["executor"], 0) + 1
    redone = [m.get("redone") for m in metas]  # None: the state of the batch before was in the task's worker
    hits = sum(r is None for r in redone)
    cache = {"tasks": len(metas), "hits": hits, "misses": len(metas) - hits, "redone_batches": sum(r or 0 for r in redone),
             "evicted": sum(m.get("cache", {}).get("evicted", 0) for m in metas),
             "held_bytes_max": max((m.get("cache", {}).get("held_bytes", 0) for m in metas), default=0)}
    settled = join.Settled(None, counts, hists, [ex] if len(ex) else [], sizes)
    report = join.Report(waiting, of("send", ["at_ns"])["at_ns"].to_numpy(), of("recv", ["at_ns"])["at_ns"].to_numpy())
    return [settled], [report], ran, cache


def cluster_sink(spark, store, cfg, say):
    """The ``foreachBatch`` function of a job whose joins run on the executors (``store``: ``ClusterRunStore``); its
    line per batch goes to ``say(work, line)`` (``core.logs.Progress``)."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema

    num_partitions = cfg.engine.join_partitions
    summary_type, output_type = from_arrow_schema(SUMMARY_SCHEMA), from_arrow_schema(OUTPUT_SCHEMA)
    ticks = spark.range(num_partitions).select(F.col("id").cast("int").alias(PARTITION))  # every partition, every batch

    def sink(batch_df, batch_id: int) -> None:
        t0 = time.time()
        batch_df = batch_df.persist()  # read and decoded once for the summary and the join
        summary = batch_df.mapInArrow(summarize_batches(cfg.engine.run_id), summary_type).toArrow().cast(SUMMARY_SCHEMA)
        t1 = time.time()
        plan = store.plan_batch(summary, batch_id)
        t2 = time.time()
        data = batch_df.withColumn(PARTITION, F.pmod(F.xxhash64("event_id"), F.lit(num_partitions)).cast("int"))
        task = partition_task(store.paths, cfg.engine, batch_id, plan.verdicts, cfg.join_cache_bytes)
        # a task per partition (range: no two partitions share a task, as a hash of 0..P-1 could make them)
        out = (data.unionByName(ticks, allowMissingColumns=True).repartitionByRange(num_partitions, PARTITION)
               .groupBy(PARTITION).applyInArrow(task, output_type).toArrow())
        t3 = time.time()
        batch_df.unpersist()
        result = store.finish_batch(plan, out, batch_id, t0, stages_s={"summary": round(t1 - t0, 3), "plan": round(t2 - t1, 3),
                                                                      "join": round(t3 - t2, 3)})
        say(result.work(), f"batch {batch_id}: {result.info['num_records']:,} records ({result.info['num_quarantined']} quarantined), "
            f"sent {result.info['num_send']:,} recv {result.info['num_recv']:,}, pending {result.info['num_pending']:,}, "
            f"{num_partitions} join partitions on {len(result.info['join_tasks'])} executor(s) "
            f"({result.info['join_cache']['hits']} with their state in the worker), {time.time() - t0:.2f}s "
            f"(summary {t1 - t0:.2f}, join {t3 - t2:.2f})"
            + (" FINISHED" if result.finished else ""))
    return sink


def check_layout(paths: RunPaths, on_executors: bool, num_partitions: int) -> str | None:
    """A run's join state lives where it started (in the driver's snapshots, or on the executors split in P
    partitions): a run resumed the other way, or on the executors with another P, is refused (one line)."""
    path = paths.joins_file
    where = "executors" if on_executors else "driver"
    if os.path.exists(path):
        with open(path) as f:
            had = json.load(f)
        if had["on"] != where:
            return f"this run's joins ran in the {had['on']}: resume it with --join-on {had['on']}"
        if on_executors and had["join_partitions"] != num_partitions:
            return (f"this run's joins ran in {had['join_partitions']} partitions on the executors: resume it with "
                    f"--join-partitions {had['join_partitions']}")
        return None
    if on_executors and ids_in(paths.state, "snap-*"):  # a run from before this file: the driver's
        return "this run's joins ran in the driver: resume it with --join-on driver"
    write_json(path, {"on": where, "join_partitions": num_partitions})
    return None


class ClusterRunStore(RunStore):
    """A ``RunStore`` whose joins run on the executors: the driver plans a batch, archives its own records, and
    merges the partitions' outputs (``plan_batch``, ``finish_batch``). Its own state is run-level only (no join:
    the watermark, the run's span, the gap rule's recent stamps), small, so it is snapshotted after every batch and
    a restart takes the snapshot of the batch before."""

    snapshot_every = 1

    def plan_batch(self, summary: pa.Table, batch_id: int) -> engine.Plan:
        return _plan_batch(self, summary, batch_id)

    def finish_batch(self, plan: engine.Plan, out: pa.Table, batch_id: int, t0: float, **info) -> engine.BatchResult:
        return _finish_batch(self, plan, out, batch_id, t0, **info)

    def _recover(self, batch_id: int) -> None:
        _recover_driver(self, batch_id)


def _plan_batch(store, summary: pa.Table, batch_id: int) -> engine.Plan:
    store.fence()
    if store.state is None or store.next_batch != batch_id:
        if not store.archive and batch_id > 0:
            raise RuntimeError(f"batch {batch_id} cannot be resumed without an archive: start the replay again")
        store._recover(batch_id)
    # the archive is written on executors in a replay too (the tasks rebuild their state from it)
    shutil.rmtree(store.paths.archived(batch_id), ignore_errors=True)  # a batch redone: afresh
    summary = engine.corrected(store.state, summary, store.cfg)  # the run's markers; its data in the join tasks
    own = summary.filter(summary[join.NUM_RECORDS].is_null()).select(DECODED_SCHEMA.names).cast(DECODED_SCHEMA)
    _write_part(store.paths, batch_id, "run", own)
    return engine.plan(store.state, summary, store.cfg)


def _finish_batch(store, plan: engine.Plan, out: pa.Table, batch_id: int, t0: float, **info):
    settled, reports, ran, cache = outputs(out)
    state, result = engine.finish(plan, settled, reports)
    state.joins = []  # on the executors
    store.state = state
    result.info["join_tasks"], result.info["join_cache"] = ran, cache
    return store.conclude(result, batch_id, t0, verdicts=dataclasses.asdict(plan.verdicts),
                          archive_parts=store.cfg.join_partitions, **info)


def _recover_driver(store, batch_id: int) -> None:
    """The driver's state after ``batch_id - 1``: the snapshot of that batch (one is written after every batch)."""
    snaps = [s for s in ids_in(store.paths.state, "snap-*") if s < batch_id]
    if batch_id and (not snaps or snaps[-1] != batch_id - 1):
        raise RuntimeError(f"no snapshot of the driver's state after batch {batch_id - 1} in {store.paths.state}")
    store.state = store._load_snapshot(snaps[-1]) if snaps else engine.EngineState()
    store.state.joins = []
    if batch_id:
        store.log(f"recovered the driver's state at batch {batch_id} from its snapshot")
    if store.verdict is not None:
        store.verdict.restart_at(batch_id)
