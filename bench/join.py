"""Join benchmark: what a join partition does per core, what the driver does per micro-batch, and the cluster that
projects for a target rate.

Usage:
    python -m bench.join [--rate 20000] [--seconds 20] [--partitions 1,2,8] [--target 1000000]

A synthetic run (a send and a receive per event, 1% never received, duplicates, errors, a 2 s pause) is cut into
micro-batches of 750 ms (the job's trigger) and processed by ``streaming.engine`` with P join partitions, in this
one process. Every step is timed in CPU seconds, medians of 3:
  decode        NDJSON messages to decoded rows (a read task's work: on the executors in a cluster)
  split         the batch's records: the driver's summary, and this run's sends, acks and receives by their
                IDs' hash partition (``join.summarize``, ``join.split``: in a cluster's read tasks)
  join          the partitions' two steps (``join.take``, ``join.settle``): what executor tasks do
  gaps          the run-level gap rule over every send and receive stamp (``run_rules.declare_gaps``)
  driver        the rest of the run-level rules and the merge of P partitions' window partials
From these, the projection for ``--target`` events/s at 3 records an event (as ``make attack`` writes: a send, an
ack, a receive), with the assumptions printed beside it.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

from bench.pipeline import ROOT  # noqa: F401 - puts the project on sys.path

RECORDS_PER_EVENT = 3
"""What the live job reads per event of `make attack`: the load generator's send and ack, the receiver's receive."""
TRIGGER_S = 0.75
UTILISATION = 0.6
"""Executor cores are planned at this share busy: reads, shuffles, GC and bursts take the rest."""
TASKS_PER_CORE = 2
"""Join partitions per executor core (Spark's rule of thumb: 2-3 tasks a core keep every core busy)."""
EXECUTOR_US_MEASURED = 42.0
"""Executor CPU per record of the whole path (Kafka read and decode in Python, the summary, the shuffle, the join
tasks), `bench.pipeline --cluster 2` at 20,000 events/s: an upper bound, two executors sharing 2 cores with
everything else."""
STATE_S = 60
"""How long an event ID stays in its partition's state: the drop timeout (30 s) and the retention (30 s)."""


def measure(rate: int, seconds: int, partitions: int, repeat: int = 3) -> dict:
    from loadgen.synthetic import SyntheticSpec, generate, messages
    from streaming import engine, join, run_rules
    from streaming.decode import decode_messages

    run = generate(SyntheticSpec(run_id="b", duration_s=seconds, rate_per_sec=rate, pause=(seconds / 2, 2.0),
                                 oom_at_s=(), drop_timeout_s=30))
    msgs = messages(run, 200)
    chunks = np.array_split(np.arange(len(msgs)), max(1, int(seconds / TRIGGER_S)))
    rounds = []
    for _ in range(repeat):
        t0 = time.process_time()
        tables = [decode_messages([msgs[i][1] for i in ch], [0] * len(ch), list(ch)) for ch in chunks]
        decode_s = time.process_time() - t0
        spent = {"summarize": 0.0, "split": 0.0, "take": 0.0, "settle": 0.0, "gaps": 0.0}
        originals = {"summarize": join.summarize, "split": join.split, "take": join.take, "settle": join.settle,
                     "gaps": run_rules.declare_gaps}

        def timed(name, originals=originals, spent=spent):
            def run_timed(*a, **k):
                t = time.process_time()
                try:
                    return originals[name](*a, **k)
                finally:
                    spent[name] += time.process_time() - t
            return run_timed
        join.summarize, join.split, join.take, join.settle, run_rules.declare_gaps = (
            timed(n) for n in ("summarize", "split", "take", "settle", "gaps"))
        try:
            state, cfg = engine.EngineState(), engine.EngineConfig(run_id="b", join_partitions=partitions)
            t0 = time.process_time()
            for t in tables:
                state, _ = engine.process(state, t, cfg)
            total_s = time.process_time() - t0
        finally:
            join.summarize, join.split, join.take, join.settle, run_rules.declare_gaps = (
                originals[n] for n in ("summarize", "split", "take", "settle", "gaps"))
        known = state.known
        rounds.append({"decode": decode_s, "total": total_s, **spent,
                       "bytes_per_id": known.memory_usage(deep=True).sum() / max(len(known), 1)})
    med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    n = sum(t.num_rows for t in tables)
    join_s = med["take"] + med["settle"]
    split_s = med["summarize"] + med["split"]
    driver_s = med["total"] - join_s - split_s - med["gaps"]
    return {"partitions": partitions, "records": n, "batches": len(tables), "records_per_event": n / len(run.event_id),
            "decode_us": med["decode"] / n * 1e6, "split_us": split_s / n * 1e6, "join_us": join_s / n * 1e6,
            "join_per_core": n / join_s, "gaps_us": med["gaps"] / n * 1e6, "driver_us": driver_s / n * 1e6,
            "driver_ms_per_batch": driver_s / len(tables) * 1e3, "total_us": med["total"] / n * 1e6,
            "bytes_per_id": med["bytes_per_id"]}


def print_rows(rows: list[dict], rate: int) -> None:
    print(f"\nin-process, {rate:,} events/s synthetic, 750 ms batches, CPU per record (us), medians of 3")
    head = (f"{'P':>3} {'records':>9} {'decode':>7} {'split':>6} {'join':>6} {'join rec/s/core':>16} {'gaps':>6} "
            f"{'driver':>7} {'driver ms/batch':>16} {'total':>6} {'B/ID':>6}")
    print(head + "\n" + "-" * len(head))
    for r in rows:
        print(f"{r['partitions']:>3} {r['records']:>9,} {r['decode_us']:>7.2f} {r['split_us']:>6.2f} {r['join_us']:>6.2f} "
              f"{r['join_per_core']:>16,.0f} {r['gaps_us']:>6.2f} {r['driver_us']:>7.2f} {r['driver_ms_per_batch']:>16.1f} "
              f"{r['total_us']:>6.2f} {r['bytes_per_id']:>6.0f}")


def projection(r: dict, target: int, executor_us: float | None = None) -> list[tuple[str, str]]:
    """The cluster for ``target`` events/s from one measured row (its P's per-partition costs), or from a measured
    executor CPU per record of the whole path (``executor_us``: Spark's reads, shuffle and workers too)."""
    records_s = target * RECORDS_PER_EVENT
    engine_us = r["decode_us"] + r["split_us"] + r["join_us"]  # per record, on the executors in a cluster
    executor_us = executor_us or engine_us
    cores = np.ceil(records_s * executor_us / 1e6 / UTILISATION)
    partitions = int(np.ceil(cores)) * TASKS_PER_CORE
    state_ids = target * STATE_S / partitions
    gaps_cores = records_s * r["gaps_us"] / 1e6
    driver_cores = records_s * r["driver_us"] / 1e6  # an upper bound: much of it is per batch, not per record
    return [
        ("records/s", f"{records_s:,} ({RECORDS_PER_EVENT} an event)"),
        ("executor CPU per record", f"{executor_us:.2f} us" + (" (Spark's whole path, as measured)" if executor_us != engine_us else
                                    f" (decode {r['decode_us']:.2f} + split {r['split_us']:.2f} + join {r['join_us']:.2f}, "
                                    f"measured at P = {r['partitions']}: the engine's own, Spark's reads and shuffle not in it)")),
        ("executor cores", f"{cores:,.0f} (at {UTILISATION:.0%} busy): {int(np.ceil(cores / 4)):,} executors of 4 cores"),
        ("join partitions", f"{partitions:,} ({TASKS_PER_CORE} a core): {records_s * TRIGGER_S / partitions:,.0f} records "
                            f"a partition a batch, against {r['records'] / r['batches'] / r['partitions']:,.0f} measured"),
        ("state per partition", f"{state_ids:,.0f} IDs x {r['bytes_per_id']:.0f} B = {state_ids * r['bytes_per_id'] / 2**20:,.0f} MiB "
                                f"({STATE_S} s of IDs: drop timeout + retention)"),
        ("driver: run-level rules", f"{r['driver_ms_per_batch']:.1f} ms a batch here ({r['driver_us']:.2f} us a record): at "
                                    f"most {driver_cores:.2f} cores if it all grew with the records"),
        ("driver: gap stamps", f"{gaps_cores:.2f} cores at {r['gaps_us']:.2f} us a record: the gap rule reads every "
                               "send and receive stamp (to move to the partitions next)"),
    ]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.join", description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=int, default=20000, help="events/s of the synthetic run (default %(default)s)")
    ap.add_argument("--seconds", type=int, default=20, help="its length (default %(default)s)")
    ap.add_argument("--partitions", default="1,2,8", help="join partitions to measure, comma-separated (default %(default)s)")
    ap.add_argument("--target", type=int, default=1_000_000, help="events/s to project a cluster for (default %(default)s)")
    ap.add_argument("--executor-us", type=float, default=EXECUTOR_US_MEASURED,
                    help="executor CPU per record of Spark's whole path, for a second projection (default %(default)s: "
                         "`bench.pipeline --cluster 2` at 20,000/s on this 2-core machine)")
    a = ap.parse_args(argv)
    try:
        ps = [int(p) for p in a.partitions.split(",")]
        if a.rate <= 0 or a.seconds < 5 or a.target <= 0 or min(ps) < 1:
            raise ValueError
    except ValueError:
        print("bench.join: error: --rate, --target and --partitions take positive integers, --seconds at least 5",
              file=sys.stderr)
        return 2
    rows = []
    for p in ps:
        print(f"P = {p} ...", flush=True)
        rows.append(measure(a.rate, a.seconds, p))
    print_rows(rows, a.rate)
    best = min(rows, key=lambda r: r["join_us"] + r["split_us"])
    for title, us in (("the engine's own cost", None), ("Spark's whole path as measured here", a.executor_us)):
        print(f"\nprojection for {a.target:,} events/s, {title} (from the P = {best['partitions']} row):")
        for what, figure in projection(best, a.target, us):
            print(f"  {what:<28} {figure}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
