"""A Spark standalone cluster on this machine: one master and N workers, from the pyspark distribution.

Usage:
    python -m stack.spark up [--workers 2] [--port 7077]   # until Ctrl-C; prints the master URL

The streaming job then runs on it with ``--master spark://127.0.0.1:7077`` (or
``SPARK_MASTER=...``): the Kafka reader's partitions, decoding and filtering run on the
workers' executors; the driver keeps the per-run engine state, as on Kubernetes. The
master, the workers and their web UIs bind 127.0.0.1; the processes are started with
``spark-class`` (the same classes ``sbin/start-master.sh`` runs) in their own session and
stopped by their recorded PIDs.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request

from core.procs import child_pythonpath, free_ports, stop_process, wait_port
from stack.config import HOST


def spark_home() -> str:
    import pyspark

    return os.path.dirname(pyspark.__file__)


def daemon_java_options() -> str:
    """A master's or worker's JVM options (``SPARK_DAEMON_JAVA_OPTS``, unless the environment gives its own): they
    schedule and watch, so C1 only and the serial collector on their 512 MiB, and Spark's classes mapped from the class
    archive (``core.classarchive``) where one of this JVM and these jars exists. Measured (``python -m bench.jobstart``,
    2 cores, medians of 3): a master's JVM took 2.4 CPU-s until 3 s after its web UI answered, against 7.2 as Spark
    starts it, and answered after 2.0 s against 4.0."""
    from core import classarchive

    return " ".join(filter(None, ["-XX:TieredStopAtLevel=1 -XX:+UseSerialGC", classarchive.java_options()]))


def _env(extra: dict | None = None) -> dict:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return {**os.environ, "SPARK_HOME": spark_home(), "SPARK_LOCAL_IP": HOST, "SPARK_PUBLIC_DNS": HOST,
            "PYSPARK_PYTHON": sys.executable, "PYTHONPATH": child_pythonpath(root),
            "SPARK_DAEMON_JAVA_OPTS": os.environ.get("SPARK_DAEMON_JAVA_OPTS") or daemon_java_options(), **(extra or {})}


class Cluster:
    """A running master and its workers (``url`` for ``--master``); ``stop()`` ends them by PID."""

    def __init__(self, workers: int = 2, port: int | None = None, cores: int = 1, memory: str = "1g",
                 work_dir: str | None = None, log=subprocess.DEVNULL) -> None:
        ports = free_ports(2 + workers)  # one at a time, a worker's web UI once took the master's (CI)
        self.port = port or ports[0]
        self.ui_port = ports[1]
        self.url = f"spark://{HOST}:{self.port}"
        self.procs: list[subprocess.Popen] = []
        cls = os.path.join(spark_home(), "bin", "spark-class")
        # no REST submission server (it takes a fixed port, 6066); the daemons need little heap
        env = _env({"SPARK_DAEMON_MEMORY": "512m", "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false"})
        try:
            self.procs.append(subprocess.Popen(
                [cls, "org.apache.spark.deploy.master.Master", "--host", HOST, "--port", str(self.port),
                 "--webui-port", str(self.ui_port)], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
            if not wait_port(self.port, 60):
                raise RuntimeError(f"the Spark master did not listen on {HOST}:{self.port}")
            for i in range(workers):
                args = [cls, "org.apache.spark.deploy.worker.Worker", "--host", HOST, "--cores", str(cores),
                        "--memory", memory, "--webui-port", str(ports[2 + i])]
                if work_dir:
                    args += ["--work-dir", os.path.join(work_dir, f"worker-{i}")]
                self.procs.append(subprocess.Popen(args + [self.url], env=env, stdout=log, stderr=subprocess.STDOUT,
                                                   start_new_session=True))
            self.wait_workers(workers)
        except BaseException:
            self.stop()
            raise

    def state(self) -> dict:
        """The master's own account (its web UI's JSON): workers, cores, applications."""
        with urllib.request.urlopen(f"http://{HOST}:{self.ui_port}/json/", timeout=5) as r:
            return json.load(r)

    def wait_workers(self, n: int, seconds: float = 90) -> None:
        deadline = time.monotonic() + seconds
        alive = 0
        while time.monotonic() < deadline:
            try:
                alive = int(self.state().get("aliveworkers", 0))
            except OSError:
                alive = 0
            if alive >= n:
                return
            if any(p.poll() is not None for p in self.procs):
                raise RuntimeError("a Spark daemon exited while the cluster started")
            time.sleep(0.5)
        raise RuntimeError(f"{alive} of {n} Spark workers registered with the master in {seconds:.0f} s")

    def stop(self) -> None:
        for p in reversed(self.procs):
            stop_process(p, wait_s=15, group=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m stack.spark", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    sub = p.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start a master and workers on 127.0.0.1 until Ctrl-C")
    up.add_argument("--workers", type=int, default=2, help="worker processes (default %(default)s)")
    up.add_argument("--cores", type=int, default=1, help="cores per worker (default %(default)s)")
    up.add_argument("--memory", default="1g", help="memory per worker (default %(default)s)")
    up.add_argument("--port", type=int, default=7077, help="master port (default %(default)s)")
    a = p.parse_args(argv)
    if a.workers < 1 or a.cores < 1:
        p.error("--workers and --cores must be >= 1")
    print(f"starting a Spark master and {a.workers} workers ...", flush=True)
    try:
        cluster = Cluster(a.workers, a.port, a.cores, a.memory)
    except RuntimeError as e:
        print(f"stack.spark: error: {e}", file=sys.stderr)
        return 1
    print(f"master {cluster.url} (web UI http://{HOST}:{cluster.ui_port}/); run the job with "
          f"SPARK_MASTER={cluster.url}; Ctrl-C stops it", flush=True)
    try:
        while all(p.poll() is None for p in cluster.procs):
            time.sleep(1)
        print("a Spark daemon exited; stopping the cluster", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        cluster.stop()


if __name__ == "__main__":
    sys.exit(main())
