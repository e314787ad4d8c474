"""Shared fixtures: a real Tansu broker on a free loopback port, stopped by its recorded PID."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


from core.procs import free_port, stop_process  # noqa: E402
from stack.tansu import start_tansu  # noqa: E402


@pytest.fixture(scope="session")
def broker(tmp_path_factory):
    """A real Kafka-protocol broker (Tansu, in-memory) for the whole session: its bootstrap address."""
    port = free_port()
    proc = start_tansu(port, open(tmp_path_factory.mktemp("broker") / "tansu.log", "wb"), "flightwatch-test")
    try:
        yield f"127.0.0.1:{port}"
    finally:
        stop_process(proc)


def job_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "streaming", *args]


def job_env() -> dict:
    return dict(os.environ, PYTHONPATH=ROOT, FLIGHTWATCH_DRIVER_MEMORY="1g")


def run_job(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(job_command(*args), cwd=ROOT, env=job_env(), capture_output=True, text=True, timeout=timeout)


def create_topic(bootstrap: str, topic: str, partitions: int = 2) -> None:
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic(topic, partitions, 1)])
    admin.close()
    time.sleep(0.2)


@pytest.fixture(scope="session")
def prometheus(tmp_path_factory):
    """A real Prometheus (1 s scrapes) and node exporter on free loopback ports: Prometheus' base URL.

    Both come from Debian's packages (`.ci/run` installs them); the URL is answered once the
    node exporter has been scraped twice (rates need two samples).
    """
    import json
    import shutil
    import urllib.request

    from core.procs import wait_port
    from stack.__main__ import prometheus_config

    node_bin, prom_bin = shutil.which("prometheus-node-exporter"), shutil.which("prometheus")
    if not node_bin or not prom_bin:
        pytest.fail("prometheus and prometheus-node-exporter are needed (apt-get install prometheus prometheus-node-exporter)")
    d = tmp_path_factory.mktemp("prometheus")
    node_port, prom_port = free_port(), free_port()
    (d / "prometheus.yml").write_text(prometheus_config(node_port))
    log = open(d / "log", "wb")
    node = subprocess.Popen([node_bin, f"--web.listen-address=127.0.0.1:{node_port}"], stdout=log, stderr=subprocess.STDOUT)
    prom = subprocess.Popen([prom_bin, f"--config.file={d / 'prometheus.yml'}", f"--web.listen-address=127.0.0.1:{prom_port}",
                             f"--storage.tsdb.path={d / 'data'}"], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{prom_port}"
    try:
        assert wait_port(node_port) and wait_port(prom_port, 30), (d / "log").read_text()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            q = urllib.request.quote('count_over_time(up{job="node"}[10s])')
            try:
                res = json.load(urllib.request.urlopen(f"{url}/api/v1/query?query={q}", timeout=2))["data"]["result"]
            except OSError:
                res = []
            if res and float(res[0]["value"][1]) >= 3:
                break
            time.sleep(0.5)
        yield url
    finally:
        stop_process(prom)
        stop_process(node)


def telemetry(broker: str, topic: str, run_id: str) -> list[dict]:
    """Every record of one run in the telemetry topic (as far as it was written when called: agents still
    writing do not keep the reader going)."""
    from kafka import KafkaConsumer, TopicPartition

    from core import contract
    from core.kafka_options import client_options

    c = KafkaConsumer(bootstrap_servers=broker, enable_auto_commit=False, **client_options())
    tps = [TopicPartition(topic, p) for p in sorted(c.partitions_for_topic(topic))]
    c.assign(tps)
    c.seek_to_beginning()
    out, idle, t_end = [], 0, time.monotonic() + 120
    while idle < 6 and time.monotonic() < t_end:
        batch = c.poll(timeout_ms=500)
        idle = 0 if batch else idle + 1
        for records in batch.values():
            for r in records:
                out += [x.to_dict() for x in contract.decode(r.value) if x.run_id == run_id]
    c.close()
    return out
