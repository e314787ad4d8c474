"""Job start benchmark: a live job's start with and without the JVM class archive (``core.classarchive``), and a
cluster daemon's with and without the options ``stack.spark`` gives them.

Usage:
    python -m bench.jobstart [--repeats 3]

A Tansu broker on loopback; a live job (``streaming run``, local[2], driver memory 1g as the tests run it) started
``--repeats`` times with the archive and as many without, one after the other, alternating. The load generator's
start marker and a heartbeat every 0.25 s give it records from its first batch. Per start: seconds to its first
batch's manifest and to its first batch with records (``warm``, what ``loadgen attack --stream`` waits for before the
load), and the CPU seconds its whole process tree used until then (JVM, Python driver, pyspark's daemons and workers,
the ones that ended included). Medians, and their ratio (with / without). Then a Spark master started ``--repeats``
times as Spark starts it and as many with ``stack.spark.daemon_java_options`` (C1 only, the serial collector, the
archive), alternating: seconds until its web UI answers, and its JVM's CPU seconds 3 s later.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import types

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from core import classarchive, contract, observer  # noqa: E402
from core.procs import free_port, stop_process  # noqa: E402
from core.rundir import RunPaths  # noqa: E402
from streaming.session import live_java_options  # noqa: E402

BASE = live_java_options("1g")
"""The live job's own JVM options at the tests' 1g."""


def one_start(run_id: str, bootstrap: str, folder: str, java_options: str) -> dict:
    from loadgen.run import telemetry_marker
    from loadgen.streamjob import warm

    cfg = types.SimpleNamespace(run_id=run_id, sender="lg", telemetry_bootstrap=bootstrap,
                                telemetry_topic="flightwatch.telemetry")
    paths = RunPaths.of_run(run_id, folder)
    os.makedirs(paths.root, exist_ok=True)
    t0 = time.monotonic()
    with open(os.path.join(folder, f"{run_id}.log"), "wb") as log:
        job = subprocess.Popen([sys.executable, "-m", "streaming", "run", "--run", run_id, "--bootstrap", bootstrap,
                                "--checkpoints", folder, "--starting-offsets", "latest", "--drop-timeout", "5s"],
                               cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                               env=dict(os.environ, PYTHONPATH=ROOT, FLIGHTWATCH_DRIVER_MEMORY="1g",
                                        FLIGHTWATCH_DRIVER_JAVA_OPTIONS=java_options))
    first = None
    try:
        while job.poll() is None and time.monotonic() - t0 < 180:
            telemetry_marker(cfg, contract.Heartbeat(run_id, "lg", time.time_ns()))
            if first is None and os.path.isdir(paths.batches) and os.listdir(paths.batches):
                first = time.monotonic() - t0
            if warm(paths.batches):
                return {"first_batch_s": first or time.monotonic() - t0, "warm_s": time.monotonic() - t0,
                        "cpu_s": observer.tree_cpu_s(job.pid, ended=True) or 0.0}
            time.sleep(0.25)
        raise RuntimeError(f"the job {run_id} did not process a record within 180 s; see {log.name}")
    finally:
        stop_process(job, group=True)


def daemon_start(java_options: str, settle_s: float = 3.0) -> dict:
    """A Spark master as ``stack.spark`` starts one, with ``java_options`` (``SPARK_DAEMON_JAVA_OPTS``): seconds until
    its web UI answers, and the CPU seconds of its JVM ``settle_s`` later (spark-class' launcher JVM, which ends before,
    not counted)."""
    import json
    import urllib.request

    from stack.spark import _env, spark_home

    port, ui = free_port(), free_port()
    env = _env({"SPARK_DAEMON_MEMORY": "512m", "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
                "SPARK_DAEMON_JAVA_OPTS": java_options})
    t0 = time.monotonic()
    p = subprocess.Popen([os.path.join(spark_home(), "bin", "spark-class"), "org.apache.spark.deploy.master.Master",
                          "--host", "127.0.0.1", "--port", str(port), "--webui-port", str(ui)], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        while True:
            if p.poll() is not None or time.monotonic() - t0 > 120:
                raise RuntimeError("the Spark master did not start within 120 s")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{ui}/json/", timeout=5) as r:
                    json.load(r)
                break
            except OSError:
                time.sleep(0.1)
        ready = time.monotonic() - t0
        time.sleep(settle_s)
        return {"ready_s": ready, "cpu_s": observer.tree_cpu_s(p.pid) or 0.0}
    finally:
        stop_process(p, group=True)


def daemons(repeats: int) -> None:
    """A cluster's daemon as Spark starts it, and with ``stack.spark.daemon_java_options`` (C1, the serial collector,
    the class archive): medians and their ratio."""
    from stack.spark import daemon_java_options

    kinds = {"ours": daemon_java_options(), "Spark's": ""}
    results: dict[str, list[dict]] = {k: [] for k in kinds}
    for k in range(repeats):
        for kind, options in kinds.items():
            r = daemon_start(options)
            results[kind].append(r)
            print(f"  master, {kind:<8} #{k + 1}: web UI after {r['ready_s']:4.1f} s, {r['cpu_s']:4.1f} CPU-s", flush=True)
    med = {kind: {m: statistics.median(r[m] for r in rs) for m in ("ready_s", "cpu_s")} for kind, rs in results.items()}
    print(f"\na Spark master's start, median of {repeats} ({daemon_java_options()})")
    print(f"{'':<22}{'ours':>10}{'Spark':>10}{'ratio':>8}")
    for m, label in (("ready_s", "web UI answers, s"), ("cpu_s", "CPU 3 s later, s")):
        w, wo = med["ours"][m], med["Spark's"][m]
        print(f"{label:<22}{w:>10.1f}{wo:>10.1f}{w / wo:>8.2f}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.jobstart", description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3, help="starts of each kind (default %(default)s)")
    a = p.parse_args(argv)
    if a.repeats < 1:
        p.error("--repeats must be at least 1")
    archive = classarchive.path()
    if archive is None or not os.path.isfile(archive):
        print(f"bench.jobstart: no class archive for this JVM and these jars ({archive}): run `make install`",
              file=sys.stderr)
        return 2
    from stack.tansu import start_tansu

    kinds = {"with the archive": f"{BASE} -XX:SharedArchiveFile={archive} -Xshare:auto",
             "without": f"{BASE} -Xshare:auto"}
    results: dict[str, list[dict]] = {k: [] for k in kinds}
    with tempfile.TemporaryDirectory(prefix="bench-jobstart-") as folder:
        port = free_port()
        with open(os.path.join(folder, "tansu.log"), "wb") as log:
            tansu = start_tansu(port, log, "bench-jobstart")
        try:
            for k in range(a.repeats):
                for n, (kind, options) in enumerate(kinds.items()):
                    r = one_start(f"start{k}{n}", f"127.0.0.1:{port}", folder, options)
                    results[kind].append(r)
                    print(f"  {kind:<17} #{k + 1}: first batch {r['first_batch_s']:5.1f} s, warm {r['warm_s']:5.1f} s, "
                          f"{r['cpu_s']:5.1f} CPU-s", flush=True)
        finally:
            stop_process(tansu)
    med = {kind: {m: statistics.median(r[m] for r in rs) for m in ("first_batch_s", "warm_s", "cpu_s")}
           for kind, rs in results.items()}
    print(f"\njob start on {os.cpu_count()} cores, median of {a.repeats} (archive {os.path.getsize(archive) / 2**20:.0f} MiB)")
    print(f"{'':<22}{'with the archive':>18}{'without':>10}{'ratio':>8}")
    for m, label in (("first_batch_s", "first batch, s"), ("warm_s", "warm, s"), ("cpu_s", "CPU until warm, s")):
        w, wo = med["with the archive"][m], med["without"][m]
        print(f"{label:<22}{w:>18.1f}{wo:>10.1f}{w / wo:>8.2f}")
    print()
    daemons(a.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
