"""The verdict in proportion, on a real run: flightwatch's own pressure headlines a run ``observer-bound`` only when it
lasted, and a short spell of it is named in the message while the run keeps the state its other windows give.

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
RATE, SECONDS, LOAD_START_S = 300, 40, 10
HOG = "import os, sys\nos.setsid()\nwith open('/proc/self/autogroup', 'w') as f: f.write(sys.argv[1])\nwhile True: pass\n"
"""A core's worth of CPU in a session of its own, its group's nice from argv (19: it takes only what is idle)."""


def _hogs(stack_dir: str, seconds: float, nice: int) -> None:
    """Two hogs (the machine's two cores), counted as flightwatch's, for ``seconds``."""
    procs = [subprocess.Popen([sys.executable, "-c", HOG, str(nice)]) for _ in range(2)]
    try:
        for p in procs:
            observer.register("hog", p.pid, stack_dir=stack_dir)
        time.sleep(seconds)
    finally:
        for p in procs:
            p.kill()
            p.wait()
            os.remove(os.path.join(observer.registry_dir(stack_dir), f"hog-{p.pid}.pid"))


def _run_beside_hogs(tmp_path, prometheus, broker, name: str, hog_s: float, nice: int) -> dict:
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
    try:
        wait_for_first_batch(broker, topic, name, d / name / "batches")
        hogs = threading.Timer(LOAD_START_S, _hogs, (stack_dir, hog_s, nice))
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
    return json.load(open(d / name / "summary.json"))


def test_a_run_starved_by_flightwatch_for_20_s_is_headlined_observer_bound(tmp_path, prometheus, broker):
    summary = _run_beside_hogs(tmp_path, prometheus, broker, "starved", 20, 0)
    verdict = summary["verdict"]
    assert summary["sent"] == RATE * SECONDS, summary
    assert verdict["state"] == State.OBSERVER_BOUND, verdict["message"]
    assert verdict["message"].startswith("observer-bound: node cpu"), verdict["message"]
    assert "flightwatch itself, not the SUT, is the limit" in verdict["message"]


def test_a_short_spell_of_flightwatchs_own_pressure_is_named_and_not_headlined(tmp_path, prometheus, broker):
    # the hogs at the lowest priority take only what is idle: the node is full and flightwatch the most of it for
    # 3 s, and nothing measured changes
    summary = _run_beside_hogs(tmp_path, prometheus, broker, "spell", 3, 19)
    verdict = summary["verdict"]
    assert summary["sent"] == RATE * SECONDS and summary["received"] == summary["sent"], summary
    assert verdict["state"] == State.OK, verdict["message"]
    assert "flightwatch itself was the limit in" in verdict["message"], verdict["message"]
