"""The Kafka receiver agent against the real broker: every delivery reported, a kill -9 loses and doubles nothing."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import defaultdict

import pytest
from kafka import KafkaProducer
from support import ROOT, create_topic, telemetry

pytestmark = pytest.mark.integration

N = 6000


def start_receiver(broker, sut_topic, tel_topic, state_dir):
    return subprocess.Popen([sys.executable, "-m", "agents.receiver", "kafka", "--bootstrap", broker, "--topic", sut_topic,
                             "--telemetry-bootstrap", broker, "--telemetry-topic", tel_topic, "--state-dir", str(state_dir)],
                            cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


@pytest.mark.faults
def test_restarted_receiver_loses_and_duplicates_nothing(broker, tmp_path):
    sut, tel = "sut-recv-test", "tel-recv-test"
    create_topic(broker, sut)
    create_topic(broker, tel)
    producer = KafkaProducer(bootstrap_servers=broker, linger_ms=5)

    def produce(lo, hi):
        for i in range(lo, hi):
            producer.send(sut, key=f"e-{i}".encode(), value=b"x" * 100,
                          headers=[("ce_id", f"e-{i}".encode()), ("fw_run", b"rcv")])
        producer.send(sut, key=b"no-run", value=b"x")  # no run header: counted, not reported
        producer.flush()

    produce(0, N // 2)
    proc = start_receiver(broker, sut, tel, tmp_path)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (tmp_path / "wal").exists():
        time.sleep(0.05)
    time.sleep(0.3)
    produce(N // 2, N)  # arrives while we kill it
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    proc = start_receiver(broker, sut, tel, tmp_path)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            recs = [r for r in telemetry(broker, tel, "rcv") if r["kind"] == "recv"]
            if len({r["event_id"] for r in recs}) >= N:
                break
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(30)
    by_id = defaultdict(set)
    for r in recs:
        by_id[r["event_id"]].add(r["at_ns"])
    assert set(by_id) == {f"e-{i}" for i in range(N)}  # nothing lost
    assert all(len(times) == 1 for times in by_id.values())  # any repeat is an identical re-send, not a duplicate
