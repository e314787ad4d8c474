"""The verdict in proportion, on a real run: flightwatch's own pressure that lasted headlines the run ``observer-bound``
(a short spell that changed nothing is named, not headlined: ``tests/streaming/test_saturation.py``, on windows as
given, since on this machine any spell that fills both cores changes the measure: two hogs at SCHED_IDLE and their
group's nice 19 for 4 s took the load generator's send delay p99 from 2.0 to 10.5 ms, and that run was rightly
headlined).

Real parts: a Tansu telemetry broker, a real Prometheus and node exporter (1 s scrapes), the node-metrics agent, the
HTTP receiver agent, the streaming job live and the load generator. The pressure is two CPU hogs, one a core,
registered in the observer registry (``core.observer``) as flightwatch's own processes are: the node's CPU and
``observer_cpu`` are measured, not given."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest
from support import ROOT, create_topic, job_command, job_env, start_receiver, stop_receiver, wait_for_first_batch

from core import observer
from core.output import State
from core.procs import free_port, stop_process

pytestmark = [pytest.mark.integration, pytest.mark.serial]  # the hogs need the machine to themselves
RATE, SECONDS, LOAD_START_S = 300, 26, 4
HOG = "import sys\nsys.stdin.readline()\nwhile True:\n    pass\n"
"""A core's worth of CPU from a line on its standard input on (started before, so that its start costs nothing then)."""


def _hogs(procs: list[subprocess.Popen], stack_dir: str, seconds: float) -> None:
    """The hogs, counted as flightwatch's, for ``seconds``."""
    try:
        for p in procs:
            observer.register("hog", p.pid, stack_dir=stack_dir)
            p.stdin.write(b"go\n")
            p.stdin.flush()
        time.sleep(seconds)
    finally:
        for p in procs:
            p.kill()
            p.wait()
            os.remove(os.path.join(observer.registry_dir(stack_dir), f"hog-{p.pid}.pid"))


def _run_beside_hogs(tmp_path, prometheus, broker, name: str, hog_s: float) -> dict:
    """One run of RATE/s for SECONDS into the HTTP receiver, the job live, with the hogs from LOAD_START_S into the
    load for ``hog_s``: the run's summary."""
    d, topic, stack_dir = tmp_path / name, f"tel-{name}", str(tmp_path / name / "stack")
    os.makedirs(stack_dir)
    create_topic(broker, topic)
    env = dict(os.environ, PYTHONPATH=ROOT, FLIGHTWATCH_STACK_DIR=stack_dir, FLIGHTWATCH_CLOCK_REFERENCE="none")
    agent = subprocess.Popen([sys.executable, "-m", "agents.node_metrics", "--prometheus", prometheus,
                              "--telemetry-bootstrap", broker, "--telemetry-topic", topic, "--metrics-listen", "none",
                              "--clock-listen", "none", "--wait", "10s"],
                             cwd=ROOT, env=env, stdout=open(d / "node-metrics.log", "w"), stderr=subprocess.STDOUT,
                             start_new_session=True)
    port = free_port()
    receiver = start_receiver(broker, topic, d / "spool", port)
    job = subprocess.Popen(job_command("run", "--run", name, "--bootstrap", broker, "--topic", topic, "--checkpoints",
                                       str(d), "--drop-timeout", "5s"),
                           cwd=ROOT, env=dict(job_env(), FLIGHTWATCH_STACK_DIR=stack_dir), stdout=open(d / "job.log", "w"),
                           stderr=subprocess.STDOUT, start_new_session=True)
    hog_procs = [subprocess.Popen([sys.executable, "-c", HOG], stdin=subprocess.PIPE) for _ in range(2)]  # a core each
    try:
        wait_for_first_batch(broker, topic, name, d / name / "batches")
        hogs = threading.Timer(LOAD_START_S, _hogs, (hog_procs, stack_dir, hog_s))
        lg = subprocess.Popen([sys.executable, "-m", "loadgen", "attack", "--quiet", "--target", f"http://127.0.0.1:{port}/",
                               "--run", name, "--workers", "1", "--out", str(d / "lg"), "--telemetry-bootstrap", broker,
                               "--telemetry-topic", topic, "--rate", str(RATE), "--duration", f"{SECONDS}s"],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        hogs.start()
        out = lg.communicate(timeout=240)[0]
        hogs.join()
        assert lg.returncode in (0, 1), out[-3000:]
        assert job.wait(300) == 0, (d / "job.log").read_text()[-3000:]
    finally:
        for p in (job, agent):
            if p.poll() is None:
                stop_process(p, wait_s=30, group=True)
        stop_receiver(receiver)
        for p in hog_procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return json.load(open(d / name / "summary.json"))


def test_a_run_starved_by_flightwatch_for_20_s_is_headlined_observer_bound(tmp_path, prometheus, broker):
    summary = _run_beside_hogs(tmp_path, prometheus, broker, "starved", 20)
    verdict = summary["verdict"]
    # the generator may fall short of its schedule beside the hogs (its sends then unsent), never miscount
    assert summary["sent"] >= 0.99 * RATE * SECONDS and summary["received"] + summary["dropped"] == summary["sent"], summary
    assert verdict["state"] == State.OBSERVER_BOUND, verdict["message"]
    assert verdict["message"].startswith("observer-bound: node cpu"), verdict["message"]
    assert "windows in a row" in verdict["message"] and verdict["observer_bound_windows"] >= 15, verdict["message"]
    assert "flightwatch itself, not the SUT, is the limit" in verdict["message"]
