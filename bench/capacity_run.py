"""A run against a system under test of known capacity, with every real part: the HTTP receiver agent behind a
CloudEvents relay that forwards at most ``--capacity`` events/s (``bench.capacity_relay``), the streaming job live on
the given broker, the load generator pacing through the steps. What the saturation tests and ``bench.verdict`` run.

    summary = capacity_run(broker, folder, "run-id", "100:5,200:5,300:5", ["--capacity", "250"])

The summary is the run's ``summary.json``, with ``seen_live`` (the verdict as a live reader first saw it, with the
wall-clock time it did) and ``job_log``. RuntimeError if a part fails.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from core.kafka_options import create_topic, telemetry_producer
from core.procs import free_port, stop_process, wait_port
from core.rundir import ROOT, RunPaths


def wait_for_first_batch(broker: str, topic: str, run_id: str, batches: Path, seconds: float = 180) -> None:
    """Heartbeats for the run until the job has processed its first batch (Spark takes a while to start)."""
    from core import contract

    producer = telemetry_producer(broker)
    deadline = time.monotonic() + seconds
    while not (batches.is_dir() and any(batches.glob("batch-*.json"))):
        if time.monotonic() > deadline:
            raise RuntimeError("the streaming job did not start")
        producer.produce(topic, contract.encode([contract.Heartbeat(run_id, "bench", time.time_ns())]), b"bench")
        producer.flush(5)
        time.sleep(0.5)


def capacity_run(broker: str, tmp_path: Path, run_id: str, pace: str, relay_args, attack_args=(), prometheus=None,
                 drop_timeout: str = "10s") -> dict:
    """Receiver <- relay <- load generator, the streaming job live; the run's summary. ``drop_timeout``: the job's, at
    least the relay's longest backlog at the run's end (a capacity under the rate builds one).

    With ``prometheus``: the node-metrics agent too, which counts the receiver, the job and the load
    generator as flightwatch's (a registry of this test's own), the relay as the system under test."""
    topic = f"tel-{run_id}"
    create_topic(broker, topic, 2)
    time.sleep(0.2)  # the broker's metadata has the topic before anyone writes to it
    recv_port, relay_port = free_port(), free_port()
    stack_dir = str(tmp_path / "stack")
    env = dict(os.environ, PYTHONPATH=ROOT, FLIGHTWATCH_CLOCK_REFERENCE="none", FLIGHTWATCH_STACK_DIR=stack_dir)
    procs = []
    try:
        procs.append(subprocess.Popen([sys.executable, "-m", "agents.receiver", "http", "--listen", f"127.0.0.1:{recv_port}",
                                       "--telemetry-bootstrap", broker, "--telemetry-topic", topic,
                                       "--spool-dir", str(tmp_path / "spool")],
                                      cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True))
        if prometheus:
            from core import observer

            observer.register("http-receiver", procs[-1].pid, stack_dir=stack_dir)
            procs.append(subprocess.Popen([sys.executable, "-m", "agents.node_metrics", "--prometheus", prometheus,
                                           "--telemetry-bootstrap", broker, "--telemetry-topic", topic, "--clock-listen", "none"],
                                          cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                          start_new_session=True))
        procs.append(subprocess.Popen([sys.executable, "-m", "bench.capacity_relay", str(relay_port),
                                       f"http://127.0.0.1:{recv_port}/", *relay_args],
                                      cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True))
        job_log = open(tmp_path / "job.log", "w")  # beside the run folder: the job makes that one
        job = subprocess.Popen([sys.executable, "-m", "streaming", "run", "--run", run_id, "--bootstrap", broker, "--topic",
                                topic, "--checkpoints", str(tmp_path), "--drop-timeout", drop_timeout],
                               cwd=ROOT, env=dict(env, FLIGHTWATCH_DRIVER_MEMORY="1g"), stdout=job_log, stderr=subprocess.STDOUT,
                               start_new_session=True)
        procs.append(job)
        if not (wait_port(recv_port, 30) and wait_port(relay_port, 30)):
            raise RuntimeError("the receiver or the relay did not start")
        run = RunPaths(str(tmp_path / run_id))
        wait_for_first_batch(broker, topic, run_id, Path(run.batches))
        seen, done = {}, threading.Event()

        def watch() -> None:  # what every live reader sees: the verdict the job publishes after each batch
            from runs.reader import RunReader

            while not done.is_set():
                v = RunReader(str(tmp_path / run_id)).verdict() or {}
                if v.get("saturated_at") and "saturated" not in seen:
                    seen["saturated"] = dict(v, seen_ns=time.time_ns())
                done.wait(0.05)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        lg = subprocess.run([sys.executable, "-m", "loadgen", "attack", "--quiet", "--pace", pace, "--target",
                             f"http://127.0.0.1:{relay_port}/", "--run", run_id, "--out", str(tmp_path / "lg"),
                             "--telemetry-bootstrap", broker, "--telemetry-topic", topic, "--workers", "1", *attack_args],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
        if lg.returncode != 0:
            raise RuntimeError(f"the load generator failed: {lg.stderr[-2000:]}")
        if job.wait(120) != 0:
            raise RuntimeError(f"the streaming job failed: {(tmp_path / 'job.log').read_text()[-2000:]}")
        done.set()
        watcher.join(10)
        summary = json.load(open(run.summary_file))
        summary["seen_live"] = seen
        summary["job_log"] = (tmp_path / "job.log").read_text()
        return summary
    finally:
        for p in procs:
            if p.poll() is None:
                stop_process(p, wait_s=30, group=True)
