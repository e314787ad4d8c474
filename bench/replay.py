"""Replay benchmark: `python -m streaming replay` on archives of 1, 5 and 15 minutes at 5,000 events/s.

Usage:
    python -m bench.replay [--minutes 1,5,15] [--rate 5000] [--repeat 1]

Each archive is synthetic and written as the live job writes one (``<run>/archive/batch-N.parquet``, a file of
decoded telemetry per 750 ms micro-batch, the records in the order they reached the topic, ~100 ms after their
event time): a send and an ack per event from the load generator, a receive from the receiver (0.1% never
received, flight times lognormal around 20 ms), a node sample a second, the run's start and stop, then heartbeats
until its last drop is decided. That is 3 records an event, as `make attack` writes them (a real 60 s run at
5,000/s archived 901,214).

Reported per archive: records, the wall time of the whole command (Spark's start-up included), the replay's own
time and rate from the query's start (what `make replay` prints), the rate once the first micro-batch has run
(Spark started, the engine at work: the issue's measure), the speed-up over the run's length, peak RSS and CPU.
Goal: >= 300,000 records/s once Spark has started, on the 15-minute archive.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

NS = 1_000_000_000
BATCH_NS = 750_000_000   # the live job's trigger: one archived batch each
ARRIVAL_NS = 100_000_000  # records reach the topic this long after their event time (the writers' linger)
START_NS = 1_800_000_000 * NS


def _table(schema: pa.Schema, n: int, **columns) -> pa.Table:
    """n rows of ``schema``: the given columns, every other one null."""
    return pa.table([pa.array(columns[f.name], f.type) if f.name in columns else pa.nulls(n, f.type) for f in schema],
                    schema=schema)


def write_archive(run_dir: str, run_id: str, minutes: float, rate: int, seed: int = 1) -> int:
    """A finished run's folder with a synthetic archive (see the module's docstring); returns its records."""
    from core import contract
    from core.rundir import RunPaths, batch_file, write_json
    from streaming.decode import DECODED_SCHEMA, decode_messages
    from streaming.engine import EngineConfig

    rng = np.random.default_rng(seed)
    n = int(minutes * 60 * rate)
    k = np.arange(n, dtype=np.int64)
    intended = START_NS + k * NS // rate
    sent = intended + rng.exponential(30_000, n).astype(np.int64)
    acked = sent + rng.exponential(1_000_000, n).astype(np.int64) + 200_000
    recv = sent + (rng.lognormal(np.log(20_000), 0.5, n) * 1000).astype(np.int64)
    got = rng.random(n) >= 0.001
    ids = pc.binary_join_element_wise("loadgen-0-", pa.array(k).cast(pa.string()), "")
    common = dict(v=np.ones(n, np.int64), run_id=pa.repeat(run_id, n), src_partition=np.zeros(n, np.int32))
    sends = _table(DECODED_SCHEMA, n, **common, kind=pa.repeat("send", n), agent=pa.repeat("loadgen-0", n), at_ns=sent,
                   event_id=ids, intended_at_ns=intended, bytes_out=np.full(n, 2048), worker=np.zeros(n, np.int64))
    acks = _table(DECODED_SCHEMA, n, **common, kind=pa.repeat("ack", n), agent=pa.repeat("loadgen-0", n), at_ns=acked,
                  event_id=ids, sent_at_ns=sent, status=np.full(n, 202))
    m = int(got.sum())
    recvs = _table(DECODED_SCHEMA, m, v=np.ones(m, np.int64), run_id=pa.repeat(run_id, m),
                   src_partition=np.zeros(m, np.int32), kind=pa.repeat("recv", m), agent=pa.repeat("receiver-0", m),
                   at_ns=recv[got], event_id=ids.filter(pa.array(got)), bytes_in=np.full(m, 2048))
    end_ns = START_NS + n * NS // rate
    machine = [contract.RunStart(run_id, "loadgen", START_NS - NS, config=json.dumps({"rate": rate})),
               contract.RunStop(run_id, "loadgen", end_ns, reason="completed")]
    machine += [contract.NodeSample(run_id, "node-metrics", START_NS + s * NS, node="node-a", metric="cpu_utilization",
                                    value=0.5) for s in range(int(minutes * 60))]
    machine += [contract.Heartbeat(run_id, a, end_ns + s * NS) for s in range(1, 41) for a in ("loadgen-0", "receiver-0")]
    other = decode_messages([contract.encode([r]) for r in machine], [0] * len(machine), [0] * len(machine)).cast(DECODED_SCHEMA)
    records = pa.concat_tables([sends, acks, recvs, other])
    arrival = pc.add(records.column("at_ns"), ARRIVAL_NS).to_numpy()
    order = np.argsort(arrival, kind="stable")
    records, arrival = records.take(pa.array(order)), arrival[order]
    records = records.set_column(records.schema.get_field_index("src_offset"), "src_offset",
                                 pa.array(np.arange(len(order), dtype=np.int64) // 200))  # 200 records a message
    paths = RunPaths(run_dir)
    os.makedirs(paths.archive)
    edges = np.searchsorted(arrival, np.arange(arrival[0] - arrival[0] % BATCH_NS, arrival[-1] + BATCH_NS, BATCH_NS))
    batch = 0
    for lo, hi in zip(edges[:-1], edges[1:]):
        if hi > lo:
            pq.write_table(records.slice(lo, hi - lo), batch_file(paths.archive, batch))
            batch += 1
    cfg = EngineConfig(run_id)
    write_json(paths.run_file, cfg.settings())
    write_json(paths.summary_file, {"run_id": run_id, "started_at_ns": START_NS - NS, "stopped_at_ns": end_ns})
    return records.num_rows


REPLAYED = re.compile(r"replayed ([\d,]+) records in ([\d.]+) s \(([\d,]+) records/s\)")
BATCH = re.compile(r"batch (\d+): ([\d,]+) records .* ([\d.]+)s(?: FINISHED)?$")


def replay(checkpoints: str, run_id: str) -> dict:
    """One `python -m streaming replay`, timed from outside (CPU and memory of its process tree, sampled every
    0.2 s: the JVM and Python workers too) and read from its own lines."""
    import psutil

    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "streaming", "replay", "--run", run_id, "--checkpoints", checkpoints],
                            cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    root, cpu, peak = psutil.Process(proc.pid), {}, 0
    while proc.poll() is None:
        rss = 0
        try:
            for p in [root, *root.children(recursive=True)]:
                with p.oneshot():
                    t = p.cpu_times()
                    cpu[p.pid] = t.user + t.system
                    rss += p.memory_info().rss
        except psutil.Error:
            pass
        peak = max(peak, rss)
        time.sleep(0.2)
    out, err = proc.communicate()
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"replay of {run_id} failed: {err[-2000:]}")
    m = REPLAYED.search(out)
    batches = [(int(b.group(2).replace(",", "")), float(b.group(3))) for b in map(BATCH.search, out.splitlines()) if b]
    rest = batches[1:]
    return {"records": int(m.group(1).replace(",", "")), "wall_s": wall, "replay_s": float(m.group(2)),
            "rate": float(m.group(3).replace(",", "")), "batches": len(batches), "first_batch_s": batches[0][1],
            "steady_rate": sum(n for n, _ in rest) / sum(s for _, s in rest) if rest else None,
            "cpu_s": sum(cpu.values()), "peak_mib": peak / (1 << 20)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.replay", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--minutes", default="1,5,15", help="archive lengths, comma-separated (default %(default)s)")
    ap.add_argument("--rate", type=int, default=5000, help="events/s of the archived runs (default %(default)s)")
    ap.add_argument("--repeat", type=int, default=1, help="replays of each archive; medians (default %(default)s)")
    a = ap.parse_args(argv)
    try:
        lengths = [float(x) for x in a.minutes.split(",")]
    except ValueError:
        ap.error(f"--minutes {a.minutes!r}: expected numbers, e.g. 1,5,15")
    if a.rate <= 0 or a.repeat <= 0 or any(x <= 0 for x in lengths):
        ap.error("--rate, --repeat and --minutes must be positive")
    work = tempfile.mkdtemp(prefix="flightwatch-bench-replay-")
    rows = []
    try:
        for minutes in lengths:
            run_id = f"bench-{minutes:g}m"
            t0 = time.monotonic()
            n = write_archive(os.path.join(work, run_id), run_id, minutes, a.rate)
            print(f"{run_id}: archive of {n:,} records written in {time.monotonic() - t0:.1f} s", flush=True)
            runs = []
            for rep in range(a.repeat):
                shutil.rmtree(os.path.join(work, run_id, "replay"), ignore_errors=True)
                runs.append(replay(work, run_id))
                r = runs[-1]
                print(f"{run_id} replay {rep + 1}/{a.repeat}: {r['records']:,} records, {r['wall_s']:.1f} s wall, "
                      f"{r['rate']:,.0f} records/s from the query's start, "
                      f"{r['steady_rate'] or 0:,.0f} after its first batch", flush=True)
            assert all(r["records"] == n for r in runs), "a replay did not read the whole archive"
            rows.append((minutes, n, {k: statistics.median(r[k] or 0 for r in runs) for k in runs[0]}))
            shutil.rmtree(os.path.join(work, run_id))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\n{'archive':<9} {'records':>11} {'wall s':>7} {'replay s':>9} {'records/s':>10} {'after 1st':>10} "
          f"{'1st batch s':>11} {'batches':>7} {'x real':>7} {'cpu s':>6} {'peak MiB':>8}   (medians of {a.repeat}, {a.rate:,} events/s)")
    for minutes, n, r in rows:
        steady = f"{r['steady_rate']:,.0f}" if r["steady_rate"] else "-"  # one batch: no rate after the first
        print(f"{minutes:>5g} min {n:>11,} {r['wall_s']:>7.1f} {r['replay_s']:>9.1f} {r['rate']:>10,.0f} "
              f"{steady:>10} {r['first_batch_s']:>11.1f} {r['batches']:>7.0f} "
              f"{minutes * 60 / r['replay_s']:>6.1f}x {r['cpu_s']:>6.0f} {r['peak_mib']:>8,.0f}")
    print("goal: >= 300,000 records/s once Spark has started (after 1st), on the 15-minute archive")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
