"""Shared fixtures: a real Tansu broker on a free loopback port, stopped by its recorded PID."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


from stack.__main__ import free_port, start_tansu  # noqa: E402


@pytest.fixture(scope="session")
def broker(tmp_path_factory):
    """A real Kafka-protocol broker (Tansu, in-memory) for the whole session: its bootstrap address."""
    port = free_port()
    proc = start_tansu(port, open(tmp_path_factory.mktemp("broker") / "tansu.log", "wb"), "flightwatch-test")
    try:
        yield f"127.0.0.1:{port}"
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)


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
