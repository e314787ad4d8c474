"""Build the job's JVM class archive (``core.classarchive``): one job run over a small synthetic run, its JVM writing
the classes it loaded when it exits.

    python -m stack.classarchive            # once per venv and JDK (make install); a no-op when it exists
    python -m stack.classarchive --force    # again

The job runs as a live job does (``streaming run``, on a Tansu broker of its own on loopback), over a second of
sends, answers, receives, a node sample and heartbeats, with ``--available-now``: so the archive holds the classes of
reading, joining, windowing and writing, not only of starting. About a minute on 2 cores; a missing java is one line, not a
failure (Spark then cannot run either, and says so).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

from core import classarchive, contract
from core.procs import free_port, stop_process, stop_session
from core.rundir import ROOT

RUN_ID = "classarchive"


def records(now_ns: int, events: int = 200) -> list[contract.Record]:
    """A second of a run at ``events``/s: every send answered, all received but one, then silence past its drop timeout."""
    out: list[contract.Record] = [contract.RunStart(RUN_ID, "lg", now_ns, config='{"rate": 200}')]
    for i in range(events):
        t = now_ns + i * 1_000_000_000 // events
        out.append(contract.Send(RUN_ID, "lg", t, event_id=f"e{i}", intended_at_ns=t, bytes_out=100,
                                 acked_at_ns=t + 500_000, status=200))
        if i:
            out.append(contract.Receive(RUN_ID, "rx", t + 2_000_000, event_id=f"e{i}", bytes_in=100, dest="t", route=0))
    out.append(contract.NodeSample(RUN_ID, "node", now_ns, node="n", metric="cpu", value=0.5))
    out.append(contract.RunStop(RUN_ID, "lg", now_ns + 1_000_000_000, reason="completed"))
    out += [contract.Heartbeat(RUN_ID, agent, now_ns + s * 1_000_000_000) for s in range(1, 9) for agent in ("lg", "rx")]
    return out


def _building(name: str) -> bool:
    """Whether ``name`` is the part-written archive of a build still running (``<archive>.<pid>.part``)."""
    import psutil

    pid = name.rsplit(".", 2)[-2] if name.endswith(".part") else ""
    return pid.isdigit() and int(pid) != os.getpid() and psutil.pid_exists(int(pid))


def build(force: bool = False, log=print) -> str | None:
    """The archive's path, built when missing (or ``force``); None where there is no java or no Spark."""
    target = classarchive.path()
    if target is None:
        log("classarchive: no java or no Spark jars: the job's classes are not archived (it starts slower)")
        return None
    if os.path.isfile(target) and not force:
        return target
    from core.kafka_options import telemetry_producer
    from core.slices import TelemetryTopic
    from stack.tansu import start_tansu

    os.makedirs(classarchive.FOLDER, exist_ok=True)
    t0 = time.monotonic()
    log(f"classarchive: building the job's JVM class archive {target} (a job over a synthetic second, about a minute) ...")
    partial = f"{target}.{os.getpid()}.part"  # beside it: renamed in one step
    with tempfile.TemporaryDirectory(prefix="classarchive-") as tmp:
        port = free_port()
        with open(os.path.join(tmp, "tansu.log"), "wb") as tansu_log:
            tansu = start_tansu(port, tansu_log, "classarchive")
        try:
            bootstrap = f"127.0.0.1:{port}"
            topic = TelemetryTopic.for_broker("flightwatch.telemetry", bootstrap)
            producer = telemetry_producer(bootstrap, **topic.producer_settings())
            producer.produce(topic(), contract.encode(records(time.time_ns() - 30_000_000_000)), b"lg")
            if producer.flush(30):
                raise RuntimeError(f"the telemetry did not reach the Tansu broker on {bootstrap}")
            env = dict(os.environ, PYTHONPATH=ROOT, FLIGHTWATCH_DRIVER_MEMORY="1g",
                       FLIGHTWATCH_DRIVER_JAVA_OPTIONS=f"-XX:TieredStopAtLevel=1 -XX:ArchiveClassesAtExit={partial} "
                                                       "-Xlog:cds=off -Xlog:cds+dynamic=off")
            with open(os.path.join(tmp, "job.log"), "wb") as job_log:
                job = subprocess.Popen(
                    [sys.executable, "-m", "streaming", "run", "--run", RUN_ID, "--bootstrap", bootstrap,
                     "--checkpoints", os.path.join(tmp, "runs"), "--available-now", "--starting-offsets", "earliest",
                     "--drop-timeout", "2s"], cwd=ROOT, env=env, stdout=job_log, stderr=subprocess.STDOUT,
                    start_new_session=True)
                try:
                    job.wait(600)
                finally:
                    # its JVM writes the archive as it exits, after the job's Python (EOF on its stdin): it is done
                    # when the job's session has no process left
                    stop_session(job.pid, wait_s=120)
            if job.returncode != 0 or not os.path.isfile(partial):
                with open(os.path.join(tmp, "job.log"), errors="replace") as f:
                    tail = "".join(f.readlines()[-20:])
                raise RuntimeError(f"the job exited {job.returncode}"
                                   f"{'' if os.path.isfile(partial) else ', writing no archive'}:\n{tail}")
            os.replace(partial, target)  # whole or not at all: a JVM starting meanwhile maps no half-written file
        finally:
            stop_process(tansu)
            if os.path.exists(partial):
                os.remove(partial)
    for name in os.listdir(classarchive.FOLDER):  # another JDK's, other jars': no JVM maps them again
        if os.path.join(classarchive.FOLDER, name) != target and not _building(name):
            os.remove(os.path.join(classarchive.FOLDER, name))
    log(f"classarchive: {os.path.getsize(target) / 2**20:.0f} MiB in {time.monotonic() - t0:.0f} s")
    return target


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m stack.classarchive", description=__doc__.split("\n\n")[0])
    p.add_argument("--force", action="store_true", help="build it again even if it exists")
    a = p.parse_args(argv)
    try:
        build(a.force)
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        print(f"classarchive: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
