"""Helpers the tests share: the job's command line, topics, the telemetry a run wrote. The loopback servers the
tests start (sinks, a capacity relay, a fault proxy) are this package's modules; ``data/`` holds recordings."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

from core.procs import free_port, wait_port  # noqa: F401 - free_port: the tests' free ports

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HERE = os.path.dirname(os.path.abspath(__file__))



def free_port_block(count: int) -> int:
    """A loopback port with the ``count - 1`` ports above it free too (RabbitMQ's Erlang distribution and epmd on the
    two above its AMQP port, Apache Kafka's controller on the one above), chosen below the kernel's ephemeral range:
    no client's outgoing connection takes one of them between this choice and the broker's start. RabbitMQ once
    failed to start in CI when its distribution port, AMQP + 1 of a port from the ephemeral range, was taken."""
    import random
    import socket

    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        low = int(f.read().split()[0])
    for _ in range(500):
        port = random.randrange(10_000, low - count)
        try:
            for i in range(count):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port + i))
        except OSError:
            continue
        return port
    raise RuntimeError(f"no {count} free loopback ports in a row below {low}")

def script(name: str) -> str:
    """The path of one of this package's loopback servers, to run as ``python <path> ...``."""
    return os.path.join(HERE, name)


def job_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "streaming", *args]


def job_env() -> dict:
    return dict(os.environ, PYTHONPATH=ROOT, FLIGHTWATCH_DRIVER_MEMORY="1g")


def run_job(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(job_command(*args), cwd=ROOT, env=job_env(), capture_output=True, text=True, timeout=timeout)


def create_topic(bootstrap: str, topic: str, partitions: int = 2) -> None:
    from core.kafka_options import create_topic as create

    create(bootstrap, topic, partitions)
    time.sleep(0.2)


def telemetry(broker: str, topic: str, run_id: str) -> list[dict]:
    """Every record of one run in the telemetry topic and its time slices (as far as it was written when called: agents still
    writing do not keep the reader going). Read with kafka-python: a client independent of the product's librdkafka."""
    from kafka import KafkaConsumer, TopicPartition

    from core import contract
    from core.kafka_options import client_options
    from core.slices import is_ours

    c = KafkaConsumer(bootstrap_servers=broker, enable_auto_commit=False, allow_auto_create_topics=False, **client_options())
    c._cluster.config["allow_auto_create_topics"] = False  # kafka-python 3.0.12 does not hand it to its metadata
    tps = [TopicPartition(t, p) for t in sorted(c.topics()) if is_ours(topic, t) for p in sorted(c.partitions_for_topic(t))]
    c.assign(tps)
    c.seek_to_beginning()
    # up to the ends listed now (Tansu's ListOffsets may answer the start of a partition's last record batch, and a fetch
    # gives whole batches: reading past that listed end reads everything written before the call)
    ends = c.end_offsets(tps)
    out, idle, t_end = [], 0, time.monotonic() + 120
    while idle < 6 and time.monotonic() < t_end and any(c.position(tp) < ends[tp] for tp in tps):
        batch = c.poll(timeout_ms=500)
        idle = 0 if batch else idle + 1
        for records in batch.values():
            for r in records:
                out += [x.to_dict() for x in contract.decode(r.value) if x.run_id == run_id]
    c.close()
    return out


def answers(records: list[dict]) -> list[dict]:
    """The answers to a run's sends as ack records: its ack records, and the sends written with their answer
    (``core.contract.SEND_HOLD_NS``: ``acked_at_ns``, ``status``, ``error``)."""
    return [r for r in records if r["kind"] == "ack"] + [
        {**r, "kind": "ack", "at_ns": r["acked_at_ns"], "sent_at_ns": r["at_ns"]}
        for r in records if r["kind"] == "send" and r.get("acked_at_ns") is not None]


def start_receiver(broker, topic, spool, port, *extra):
    """The HTTP receiver on 127.0.0.1:port, its telemetry into ``topic``, once it listens."""
    proc = subprocess.Popen([sys.executable, "-m", "agents.receiver", "http", "--listen", f"127.0.0.1:{port}",
                             "--telemetry-bootstrap", broker, "--telemetry-topic", topic, "--spool-dir", str(spool),
                             "--clock-reference", "none", *extra],
                            cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    assert wait_port(port, 30), "receiver did not start"
    return proc


def health(port) -> dict:
    return json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5))


def wait_for_first_batch(broker, topic, run_id, batches, seconds=180):
    """Heartbeats for the run until the job has processed its first batch (Spark takes a while to start)."""
    from kafka import KafkaProducer

    from core import contract
    from core.kafka_options import client_options

    producer = KafkaProducer(bootstrap_servers=broker, **client_options())
    deadline = time.monotonic() + seconds
    while not (batches.is_dir() and any(batches.glob("batch-*.json"))):
        assert time.monotonic() < deadline, "the streaming job did not start"
        producer.send(topic, key=b"test", value=contract.encode([contract.Heartbeat(run_id, "test", time.time_ns())]))
        producer.flush()
        time.sleep(0.5)
    producer.close()


def wait_for_scrapes(url: str, job: str, scrapes: int, window: str, seconds: float, poll_s: float) -> None:
    """Until Prometheus at ``url`` has scraped ``job`` ``scrapes`` times within ``window`` (a rate needs two samples),
    or ``seconds`` have passed (the test's own assertions then say what is missing)."""
    q = urllib.request.quote(f'count_over_time(up{{job="{job}"}}[{window}])')
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            res = json.load(urllib.request.urlopen(f"{url}/api/v1/query?query={q}", timeout=2))["data"]["result"]
        except OSError:
            res = []
        if res and float(res[0]["value"][1]) >= scrapes:
            return
        time.sleep(poll_s)


def stop_receiver(proc) -> None:
    """SIGTERM, as a deployment stops it, and wait for its exit (it ships what it spooled first)."""
    os.kill(proc.pid, signal.SIGTERM)
    proc.wait(60)
