"""Pipeline benchmark: synthetic load at rising rates into a real telemetry broker, the real job reading it.

Usage:
    python -m bench.pipeline [--rates 1000,5000,20000,50000,80000] [--seconds 20] [--join-partitions P]
    python -m bench.pipeline --cluster 2 --rates 5000,20000     # the join in the driver vs on the executors

Per rate (events/s; each event is a send and a receive record, so records/s = 2 x rate)
a fresh topic and a fresh job run; the load is produced in real time with wall-clock
timestamps for ``--seconds``. Reported per rate, medians over the steady part (the first
3 s and the last 2 s are left out):
  processed/s   records the job consumed per second of load (to the end of the drain), proc/off its share of
                the records offered
  batch s       micro-batch duration (interval between batch commits)
  fresh p50/max wall time from a window's end to its first figures in the sink
  done p50      wall time from a window's end to the last batch that added receives to it
  drv us/rec    CPU of the job's Python driver per record processed
  job cores     CPU used by the job / wall time, and apart: its Python driver, its JVM, its pyspark workers (on a
                cluster the executors are the workers' processes: see machine)
  gen cores     CPU used by this load generator: when it nears 1.0, the generator is the limit
  broker        CPU used by the telemetry broker (when the benchmark started it)
  machine       CPU busy on the whole machine, in cores (2.0 = both cores saturated)
The reference column is the throwaway prototype's micro-batch time from ARCHITECTURE.md
(stream-stream join + windowed aggregation, same machine size).
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

NS = 1_000_000_000
RECORDS_PER_MESSAGE = 200
TICK_S = 0.1
PROTOTYPE_BATCH_S = {1000: 1.0, 5000: 1.3, 10000: 2.0, 20000: 2.6, 30000: 5.1, 40000: 6.7}
"""Prototype's micro-batch duration at each events/s (join + windowed aggregation, 1 s trigger)."""

SEND = '{"v":1,"kind":"send","run_id":"%s","agent":"bench","at_ns":%d,"event_id":"b-%d","intended_at_ns":%d}'
RECV = '{"v":1,"kind":"recv","run_id":"%s","agent":"bench-rx","at_ns":%d,"event_id":"b-%d"}'


def group_cpu_by_role(pgid: int) -> dict[str, float]:
    """CPU seconds of a job's process group by role: ``driver`` (the group's leader, the job's Python), ``jvm``
    (Spark's), ``workers`` (pyspark's Python workers)."""
    out = {"driver": 0.0, "jvm": 0.0, "workers": 0.0}
    tick = os.sysconf("SC_CLK_TCK")
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
            cmd = open(f"/proc/{pid}/cmdline", "rb").read()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # field 5 (pgrp) is index 2 after the command name
            role = "driver" if int(pid) == pgid else "jvm" if b"java" in cmd.split(b"\0")[0] else "workers"
            out[role] += (int(fields[11]) + int(fields[12])) / tick
    return out


def machine_busy_s() -> float:
    """CPU seconds spent busy by the whole machine (all cores), from /proc/stat."""
    fields = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def pid_cpu_s(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def produce_load(producer, topic: str, run_id: str, rate: int, seconds: float) -> tuple[int, float]:
    """Open-loop: every tick, the sends due so far and their receives (~2 ms later). Returns (records, cpu s)."""
    from core.kafka_options import produce

    rng = np.random.default_rng(1)
    cpu0 = time.process_time()
    start = time.time_ns()
    seq = 0
    records = 0
    next_tick = time.monotonic()
    while True:
        now = time.time_ns()
        elapsed = now - start
        if elapsed >= seconds * NS:
            break
        due = int(elapsed * rate // NS)
        if due > seq:
            ids = np.arange(seq, due)
            sent = start + ids * NS // rate
            recv = sent + (rng.lognormal(np.log(2_000), 0.5, ids.size) * 1000).astype(np.int64)
            lines = [SEND % (run_id, s, i, s) for s, i in zip(sent.tolist(), ids.tolist())]
            lines += [RECV % (run_id, r, i) for r, i in zip(recv.tolist(), ids.tolist())]
            for k in range(0, len(lines), RECORDS_PER_MESSAGE):  # four agents' keys: both partitions busy
                produce(producer, topic, "\n".join(lines[k:k + RECORDS_PER_MESSAGE]).encode(),
                        b"bench-%d" % (k // RECORDS_PER_MESSAGE % 4))
            records += len(lines)
            seq = due
            producer.poll(0)
        next_tick += TICK_S
        time.sleep(max(0.0, next_tick - time.monotonic()))
    producer.flush(60)
    return records, time.process_time() - cpu0


def drained(counted, want: int, bound_s: float, every_s: float) -> int:
    """The time (ns) ``counted()`` reached ``want``, asked every ``every_s``, or ``bound_s`` passed: a drain."""
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline and counted() < want:
        time.sleep(every_s)
    return time.time_ns()


def bench_rate(bootstrap: str, rate: int, seconds: float, workdir: str, broker_pid: int | None = None,
               join_partitions: int = 1, master: str | None = None, join_on: str = "auto") -> dict:
    from core import contract
    from core.kafka_options import create_topic, telemetry_producer
    from core.procs import stop_process
    from core.rundir import RunPaths
    from runs import results
    from runs.reader import RunReader

    run_id, topic = f"bench-{rate}-{join_on}", f"bench-{rate}-{join_on}-{int(time.time())}"
    create_topic(bootstrap, topic, 2, {})
    out = os.path.join(workdir, run_id)
    job = subprocess.Popen(
        [sys.executable, "-m", "streaming", "run", "--run", run_id, "--bootstrap", bootstrap, "--topic", topic,
         "--out", out, "--trigger", "500ms", "--no-heartbeat", "--join-partitions", str(join_partitions),
         "--join-on", join_on, *(["--master", master] if master else [])],
        cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), stdout=open(os.path.join(workdir, f"{run_id}.log"), "w"),
        stderr=subprocess.STDOUT, start_new_session=True)
    producer = telemetry_producer(bootstrap, {}, **{"linger.ms": 5, "batch.size": 1 << 20})
    try:
        # warm-up: wait until the job has committed its first batch
        producer.produce(topic, contract.encode([contract.RunStart(run_id, "bench", time.time_ns())]), b"bench")
        producer.flush(30)
        deadline = time.monotonic() + 120
        batches = RunPaths(out).batches
        while not os.path.isdir(batches) or not os.listdir(batches):
            if time.monotonic() > deadline or job.poll() is not None:
                raise RuntimeError(f"job for {run_id} did not start; see {workdir}/{run_id}.log")
            time.sleep(0.2)
        cpu0, t0 = group_cpu_by_role(job.pid), time.time_ns()
        busy0, broker0 = machine_busy_s(), pid_cpu_s(broker_pid) if broker_pid else 0.0
        num_records, gen_cpu = produce_load(producer, topic, run_id, rate, seconds)
        t1 = time.time_ns()
        cpu1 = group_cpu_by_role(job.pid)
        busy1, broker1 = machine_busy_s(), pid_cpu_s(broker_pid) if broker_pid else 0.0
        # drain: wait until the job has read everything produced (or give up after 60 s)
        t_drained = drained(lambda: int(RunReader(out).batches()[["num_send", "num_recv"]].sum().sum()), num_records, 60, 0.5)
    finally:
        producer.flush(30)
        stop_process(job, signal.SIGINT, wait_s=30, group=True)
    batches = RunReader(out).batches()
    windows = results.load_windows(out)
    load = batches[(batches["written_at_ns"] >= t0) & (batches["written_at_ns"] <= t1)]
    w = windows[(windows["window_ns"] >= t0 + 3 * NS) & (windows["window_ns"] + NS <= t1 - 2 * NS)]
    fresh = (w["first_written_ns"] - (w["window_ns"] + NS)) / NS
    done = (w["last_written_ns"] - (w["window_ns"] + NS)) / NS
    processed = int(batches["num_send"].sum() + batches["num_recv"].sum())
    return {
        "rate": rate, "join_on": join_on,
        "driver_us_per_record": (cpu1["driver"] - cpu0["driver"]) / max(processed, 1) * 1e6,
        "records_per_sec": num_records / ((t1 - t0) / NS),
        "processed_per_sec": processed / ((t_drained - t0) / NS),
        "all_read": processed >= num_records,
        "drain_s": (t_drained - t1) / NS,
        "batch_s": float(np.median(np.diff(load["written_at_ns"].to_numpy()))) / NS if len(load) > 2 else float("nan"),
        "fresh_p50_s": float(fresh.median()), "fresh_max_s": float(fresh.max()),
        "done_p50_s": float(done.median()),
        "job_cores": (sum(cpu1.values()) - sum(cpu0.values())) / ((t1 - t0) / NS),
        **{f"{role}_cores": (cpu1[role] - cpu0[role]) / ((t1 - t0) / NS) for role in cpu0},
        "gen_cores": gen_cpu / ((t1 - t0) / NS),
        "broker_cores": (broker1 - broker0) / ((t1 - t0) / NS),
        "machine_cores": (busy1 - busy0) / ((t1 - t0) / NS),
        "received_exact": int(w["received"].sum()),
        "run_id": run_id, "events": num_records // 2,
        "p99_ms_median": float(w["latency_us_p99"].median()) / 1000 if len(w) else float("nan"),
    }


def print_table(rows: list[dict]) -> None:
    head = (f"{'events/s':>9} {'join on':>9} {'drv us/rec':>10} {'records/s':>10} {'processed/s':>12} {'proc/off':>8} {'batch s':>8} {'proto s':>8} {'ratio':>6} "
            f"{'fresh p50':>9} {'fresh max':>9} {'done p50':>9} {'drain s':>8} {'job cores':>9} {'driver':>6} {'jvm':>5} "
            f"{'workers':>7} {'gen cores':>9} "
            f"{'broker':>6} {'machine':>7}")
    print(head)
    print("-" * len(head))
    for r in rows:
        proto = PROTOTYPE_BATCH_S.get(r["rate"])
        ratio = f"{proto / r['batch_s']:.2f}x" if proto and r["batch_s"] == r["batch_s"] else "-"
        print(f"{r['rate']:>9,} {r['join_on']:>9} {r['driver_us_per_record']:>10.2f} {r['records_per_sec']:>10,.0f} "
              f"{r['processed_per_sec']:>12,.0f} {r['processed_per_sec'] / r['records_per_sec']:>8.2f} {r['batch_s']:>8.2f} "
              f"{proto if proto else '-':>8} {ratio:>6} {r['fresh_p50_s']:>9.2f} {r['fresh_max_s']:>9.2f} "
              f"{r['done_p50_s']:>9.2f} {r['drain_s']:>8.1f} {r['job_cores']:>9.2f} {r['driver_cores']:>6.2f} "
              f"{r['jvm_cores']:>5.2f} {r['workers_cores']:>7.2f} {r['gen_cores']:>9.2f} "
              f"{r['broker_cores']:>6.2f} {r['machine_cores']:>7.2f}"
              + ("" if r["all_read"] else "  (did not keep up)"))
    print("ratio = prototype batch time / ours (>1: faster). fresh = window end -> first figures in the sink.")


def print_driver_costs(rows: list[dict]) -> None:
    """The driver's CPU per record with the join in the driver (as before) and on the executors, per rate; and the
    executors' (the machine's CPU but the job's driver, the broker and this generator: an estimate, one machine)."""
    print(f"\n{'events/s':>9} {'driver us/record, join in driver':>33} {'on executors':>13} {'falls by':>9} "
          f"{'executors us/record':>20}")
    for rate in sorted({r["rate"] for r in rows}):
        by = {r["join_on"]: r for r in rows if r["rate"] == rate}
        if {"driver", "executors"} <= set(by):
            d, e = by["driver"]["driver_us_per_record"], by["executors"]
            rest = e["machine_cores"] - e["job_cores"] - e["broker_cores"] - e["gen_cores"]
            print(f"{rate:>9,} {d:>33.2f} {e['driver_us_per_record']:>13.2f} {d / e['driver_us_per_record']:>8.1f}x "
                  f"{rest / e['processed_per_sec'] * 1e6:>20.1f}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.pipeline", description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", default="1000,5000,20000,50000,80000", help="events/s, comma-separated (default %(default)s)")
    ap.add_argument("--join-partitions", type=int, help="the job's --join-partitions (default: the job's)")
    ap.add_argument("--cluster", type=int, default=0, metavar="WORKERS",
                    help="run the job on a Spark standalone cluster of this many workers (1 core each), each rate twice: "
                         "the join in the driver, then on the executors, and compare the driver's CPU per record")
    ap.add_argument("--seconds", type=float, default=20, help="seconds of load per rate (default %(default)s)")
    ap.add_argument("--bootstrap", help="use this broker instead of starting a Tansu broker on a free port")
    a = ap.parse_args(argv)
    try:
        rates = [int(r) for r in a.rates.split(",")]
        assert all(r > 0 for r in rates) and a.seconds >= 8 and (a.join_partitions or 1) >= 1 and a.cluster >= 0
    except (ValueError, AssertionError):
        print("bench.pipeline: error: --rates and --join-partitions take positive integers, --seconds at least 8",
              file=sys.stderr)
        return 2
    import tempfile

    from core.procs import free_port, stop_process
    from stack.tansu import start_tansu

    workdir = tempfile.mkdtemp(prefix="flightwatch-bench-")
    broker = None
    bootstrap = a.bootstrap
    if not bootstrap:
        port = free_port()
        broker = start_tansu(port, open(os.path.join(workdir, "tansu.log"), "w"), "bench")
        bootstrap = f"127.0.0.1:{port}"
    rows, cluster = [], None
    try:
        if a.cluster:
            from stack.spark import Cluster

            cluster = Cluster(workers=a.cluster, work_dir=os.path.join(workdir, "spark-work"),
                              log=open(os.path.join(workdir, "spark.log"), "wb"))
        for rate in rates:
            for join_on in (("driver", "executors") if cluster else ("auto",)):
                print(f"rate {rate:,} events/s for {a.seconds:.0f} s, join on {join_on} ...", flush=True)
                rows.append(bench_rate(bootstrap, rate, a.seconds, workdir, broker.pid if broker else None,
                                       a.join_partitions or (8 if cluster else 1), cluster.url if cluster else None, join_on))
                print_table(rows[-1:])
    finally:
        if cluster:
            cluster.stop()
        if broker:
            stop_process(broker)
    print()
    print_table(rows)
    if cluster:
        print_driver_costs(rows)
    print(f"logs and run folders: {workdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
