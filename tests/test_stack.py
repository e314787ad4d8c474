"""`make up` / `make down`: the embedded stack on loopback, idempotent, stopped by recorded PID."""
import json
import os
import subprocess
import sys
import time
import urllib.request

import pytest
from conftest import ROOT, free_port

pytestmark = pytest.mark.integration


def stack(cmd, env):
    return subprocess.run([sys.executable, "-m", "stack", cmd], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_up_is_idempotent_and_down_stops_what_up_started(tmp_path):
    ports = {k: free_port() for k in ("TELEMETRY", "SUT", "PROMETHEUS", "NODE_EXPORTER", "RECEIVER", "UI")}
    env = dict(os.environ, FLIGHTWATCH_STACK_DIR=str(tmp_path), PYTHONPATH=ROOT,
               FLIGHTWATCH_CLOCK_PORT=str(free_port()), **{f"FLIGHTWATCH_{k}_PORT": str(v) for k, v in ports.items()})
    first = stack("up", env)
    try:
        assert first.returncode == 0, first.stdout + first.stderr
        for _name, key in (("telemetry-broker", "TELEMETRY"), ("sut-broker", "SUT"), ("prometheus", "PROMETHEUS"),
                          ("node-exporter", "NODE_EXPORTER"), ("http-receiver", "RECEIVER"), ("ui", "UI")):
            assert f"127.0.0.1:{ports[key]}" in first.stdout and "started" in first.stdout, first.stdout
        pids = {p.stem: int(p.read_text()) for p in tmp_path.glob("*.pid")}
        assert len(pids) == 8
        assert json.loads((tmp_path / "addresses.json").read_text())["telemetry-broker"] == f"127.0.0.1:{ports['TELEMETRY']}"
        again = stack("up", env)
        assert again.returncode == 0 and again.stdout.count("running") == 8
        assert {p.stem: int(p.read_text()) for p in tmp_path.glob("*.pid")} == pids
        # Prometheus scrapes the node exporter on loopback (1 s interval)
        url = f"http://127.0.0.1:{ports['PROMETHEUS']}/api/v1/query?query=node_vmstat_oom_kill"
        deadline = time.monotonic() + 30
        while True:
            result = json.loads(urllib.request.urlopen(url, timeout=5).read())["data"]["result"]
            if result or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert result and float(result[0]["value"][1]) >= 0
        # every server the stack started, and every process they started, listens on loopback only (TCP and UDP)
        from sockets import descendants, is_loopback, listening

        bound = listening(descendants(pids.values()))
        assert len(bound["tcp"]) >= 6 and bound["udp"], bound  # six servers, and the clock reference (UDP)
        assert [a for a in bound["tcp"] + bound["udp"] if not is_loopback(a)] == [], bound
        # the HTTP receiver takes a CloudEvent
        req = urllib.request.Request(f"http://127.0.0.1:{ports['RECEIVER']}/", data=b"x", method="POST",
                                     headers={"ce-id": "stack-1", "ce-fwrun": "stack"})
        assert urllib.request.urlopen(req, timeout=5).status == 202
        # renew-sut (before each `make attack` on the embedded SUT): the SUT broker restarts empty, with the Kafka
        # receiver on it afresh; nothing else is touched
        from kafka import KafkaProducer

        producer = KafkaProducer(bootstrap_servers=f"127.0.0.1:{ports['SUT']}")
        producer.send("flightwatch.sut", b"held").get(timeout=30)
        producer.close()
        renewed = stack("renew-sut", env)
        assert renewed.returncode == 0, renewed.stdout + renewed.stderr
        after = {p.stem: int(p.read_text()) for p in tmp_path.glob("*.pid")}
        assert {k for k in pids if after[k] != pids[k]} == {"sut-broker", "kafka-receiver"}, (pids, after)
        from confluent_kafka import Consumer, TopicPartition

        c = Consumer({"bootstrap.servers": f"127.0.0.1:{ports['SUT']}", "group.id": "renew-check"})
        assert all(c.get_watermark_offsets(TopicPartition("flightwatch.sut", p), timeout=10)[1] == 0 for p in (0, 1))
        c.close()
        pids = after
    finally:
        down = stack("down", env)
    assert down.returncode == 0 and down.stdout.count("stopped") == 8
    for pid in pids.values():
        assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"
