"""Apache Kafka on loopback, one KRaft node (broker and controller in one JVM): a SUT of the stack's
(``make up SUT=kafka``) and the tests'.

The broker is the reference implementation's own jars, ``kafka_2.13`` and ``kafka-tools`` 4.4.0 with their runtime
dependencies, from the Maven registry (``stack.maven``: every file's checksum checked against the registry's) into
``.stack/downloads/`` (git-ignored). A node is made once per folder (its ``server.properties`` and its storage
formatted with a new cluster ID) and runs ``kafka.Kafka`` on the machine's Java 17, in a session of its own; stop it
by signalling that session's group. Its client port is ``port``, its controller's ``port + 1``, both on 127.0.0.1.

    proc = start_kafka(port, folder)   # fetches, formats as needed; waits until it serves
    stop_kafka(proc.pid)

    python -m stack.kafka fetch        # the install step: fetch, nothing else
"""
from __future__ import annotations

import argparse
import base64
import os
import re
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass

from core.procs import HOST, start_server, stop_session
from core.rundir import ROOT
from stack import maven
from stack.peer import PREFIX, Peer, measure, pct

VERSION = "4.4.0"
"""The newest 4.x the registry serves here (``kafka_2.13``, ``kafka-tools``)."""
LOG4J = "2.25.5"
"""The log4j 2 the broker's jars name; its SLF4J binding, so the broker's warnings reach its log."""
START_S = 60.0
"""Seconds a start may take (about 3 here; a JVM on a busy machine, more)."""
HEAP = "512m"
ARTIFACTS = [("org.apache.kafka", "kafka_2.13", VERSION), ("org.apache.kafka", "kafka-tools", VERSION),
             ("org.apache.logging.log4j", "log4j-slf4j-impl", LOG4J)]
LOG_CONFIG = """status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = warn
rootLogger.appenderRef.out.ref = out
logger.started.name = kafka.server.KafkaRaftServer
logger.started.level = info
"""


def fetch(log=print) -> str:
    """The folder of the broker's jars (and ``kafka-tools``': ``kafka-producer-perf-test`` is
    ``org.apache.kafka.tools.ProducerPerformance``), fetched if it is not yet; ``RuntimeError`` saying what failed."""
    return maven.fetch(f"kafka-{VERSION}", ARTIFACTS, f"Apache Kafka {VERSION}", log=log)


@dataclass(frozen=True)
class Secure:
    """A broker as production runs one: SASL/SCRAM-SHA-512 over TLS on its port (the controller's stays plain, on
    loopback), its certificate ``chain`` (an unencrypted PKCS#8 key and the certificate in one PEM file) for
    ``host``, which it advertises, and ``users`` (name: password) added when its storage is formatted, the broker's
    own (``BROKER_USER``) among them."""
    chain: str
    ca: str
    users: dict
    host: str = "localhost"


BROKER_USER = "broker"


def _listeners(port: int, secure: Secure | None) -> str:
    if secure is None:
        return (f"listeners=PLAINTEXT://{HOST}:{port},CONTROLLER://{HOST}:{port + 1}\n"
                f"advertised.listeners=PLAINTEXT://{HOST}:{port}\ncontroller.listener.names=CONTROLLER\n"
                "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT\n")
    login = ("org.apache.kafka.common.security.scram.ScramLoginModule required "
             f'username="{BROKER_USER}" password="{secure.users[BROKER_USER]}";')
    return (f"listeners=SASL_SSL://{HOST}:{port},CONTROLLER://{HOST}:{port + 1}\n"
            f"advertised.listeners=SASL_SSL://{secure.host}:{port}\ncontroller.listener.names=CONTROLLER\n"
            "listener.security.protocol.map=SASL_SSL:SASL_SSL,CONTROLLER:PLAINTEXT\n"
            "inter.broker.listener.name=SASL_SSL\nsasl.enabled.mechanisms=SCRAM-SHA-512\n"
            "sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512\n"
            f"listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config={login}\n"
            f"ssl.keystore.type=PEM\nssl.keystore.location={secure.chain}\n"
            f"ssl.truststore.type=PEM\nssl.truststore.location={secure.ca}\n")


def server_properties(port: int, data: str, partitions: int = 1, secure: Secure | None = None) -> str:
    """One node, broker and controller, on ``HOST:port`` and ``HOST:port+1``; topics of one replica and
    ``partitions`` partitions, made when first named; the broker's defaults otherwise (flushed by the OS, as Kafka is
    run). ``secure``: SASL_SSL on ``port`` (``Secure``)."""
    return (f"process.roles=broker,controller\nnode.id=1\ncontroller.quorum.voters=1@{HOST}:{port + 1}\n"
            + _listeners(port, secure) +
            f"log.dirs={data}\nnum.partitions={partitions}\noffsets.topic.replication.factor=1\n"
            "transaction.state.log.replication.factor=1\ntransaction.state.log.min.isr=1\n"
            "share.coordinator.state.topic.replication.factor=1\nshare.coordinator.state.topic.min.isr=1\n"
            "group.initial.rebalance.delay.ms=0\n")


def _java(lib: str, folder: str, main: str, *args: str) -> list[str]:
    return ["java", f"-Xms{HEAP}", f"-Xmx{HEAP}", "-XX:+UseG1GC", "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={os.path.join(folder, 'log4j2.properties')}",
            "-cp", os.path.join(lib, "*"), main, *args]


def random_uuid() -> str:
    """A cluster ID as ``kafka-storage random-uuid`` makes one: 16 random bytes in URL-safe base64, never starting
    with ``-`` (which a command line would take for an option; Kafka's ``Uuid.randomUuid`` draws again too)."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not text.startswith("-"):
            return text


def create(lib: str, folder: str, port: int, partitions: int = 1, secure: Secure | None = None) -> str:
    """The node's ``server.properties`` in ``folder`` for ``port``, and its storage formatted if it is not yet
    (``data/`` is its whole state: remove it for an empty broker), with ``secure``'s users."""
    os.makedirs(folder, exist_ok=True)
    props, data = os.path.join(folder, "server.properties"), os.path.join(folder, "data")
    with open(props, "w") as f:
        f.write(server_properties(port, data, partitions, secure))
    with open(os.path.join(folder, "log4j2.properties"), "w") as f:
        f.write(LOG_CONFIG)
    if not os.path.exists(os.path.join(data, "meta.properties")):
        users = [arg for name, pw in (secure.users.items() if secure else ())
                 for arg in ("--add-scram", f"SCRAM-SHA-512=[name={name},password={pw}]")]
        done = subprocess.run(_java(lib, folder, "kafka.tools.StorageTool", "format", f"--cluster-id={random_uuid()}",
                                    "-c", props, *users),
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"formatting Kafka's storage failed: {(done.stdout + done.stderr).strip()[-300:]}")
    return props


def command(port: int, folder: str, partitions: int = 1, secure: Secure | None = None) -> list[str]:
    """The node's command line (fetched and its storage formatted, as needed)."""
    lib = fetch()
    return _java(lib, folder, "kafka.Kafka", create(lib, folder, port, partitions, secure))


def start_kafka(port: int, folder: str, log=subprocess.DEVNULL, secure: Secure | None = None) -> subprocess.Popen:
    """The broker on ``HOST:port``, its state in ``folder`` (``secure``: SASL_SSL, ``Secure``); RuntimeError if it
    cannot be had or does not serve within ``START_S``."""
    return start_server(command(port, folder, secure=secure), port, START_S, "kafka", log)


def stop_kafka(pid: int, kill: bool = False, wait_s: float = 30.0) -> None:
    """Stop the broker started as ``pid`` (SIGTERM: a controlled shutdown; ``kill``: SIGKILL, as a crash)."""
    stop_session(pid, kill, wait_s)


if __name__ == "__main__":
    sys.exit(maven.fetch_main("stack.kafka", fetch))


# --- its own load tools, as their users run them (``stack.peers``, ``bench.transports``) ---

LINE = re.compile(r"^(\d+) records sent, [\d.]+ records/sec .* max latency\.\s*$")
"""``kafka-producer-perf-test``'s line a second (not its summary): what it sent in it."""
UNBOUNDED_RATE = 200_000
"""Records a second ``producer`` sizes an unbounded run for: far above what one producer sends here."""


def producer_perf(lib: str, port: int, topic: str, rate: int, seconds: float, payload: int, acks: str,
                  records: int | None = None) -> list[str]:
    """``rate`` -1: unbounded, for ``records``."""
    return ["java", "-cp", os.path.join(lib, "*"), "org.apache.kafka.tools.ProducerPerformance", "--topic", topic,
            "--num-records", str(records or int(rate * seconds)), "--record-size", str(payload), "--throughput", str(rate),
            "--reporting-interval", "1000", "--command-property", f"bootstrap.servers={HOST}:{port}", f"acks={acks}",
            "linger.ms=5"]


def run_peer(lib: str, port: int, a: argparse.Namespace, log) -> dict:
    """ProducerPerformance at the rate, then EndToEndLatency for ``a.e2e_records`` messages, on topics of their own
    made with ``a.partitions`` partitions."""
    from confluent_kafka.admin import AdminClient, NewTopic

    from core.kafka_options import librdkafka

    stamp = time.strftime("%H%M%S")
    topics = {"perf": f"{PREFIX}.{stamp}", "e2e": f"{PREFIX}.e2e.{stamp}"}
    admin = AdminClient({"bootstrap.servers": f"{HOST}:{port}", **librdkafka({})})
    try:
        for f in admin.create_topics([NewTopic(t, a.partitions, 1) for t in topics.values()]).values():
            f.result(30)
    except Exception as e:  # a KafkaException, or the 30 s passed
        raise RuntimeError(f"could not make the tools' topics on {HOST}:{port}: {e}") from None
    m = measure(producer_perf(lib, port, topics["perf"], a.rate, a.seconds, a.payload, a.acks), LINE, a.seconds,
                log=log)
    out = {"throughput_per_s": m.get("events_per_s"), "cpu_us_per_message": m.get("us_per_event"),
           "cpu_of": "the producer (it has no consumer)", "error": m.get("error")}
    final = next((line for line in reversed(m["output"]) if "99.9th" in line), "")
    ack = re.search(r"([\d.]+) ms 50th, [\d.]+ ms 95th, ([\d.]+) ms 99th, ([\d.]+) ms 99.9th", final)
    if ack:
        out["ack_latency"] = pct(dict(zip(("50", "99", "99.9"), ack.groups())), "50", "99", "99.9", 1000.0)
    e2e = subprocess.run(["java", "-cp", os.path.join(lib, "*"), "org.apache.kafka.tools.EndToEndLatency",
                          f"{HOST}:{port}", topics["e2e"], str(a.e2e_records), a.acks, str(a.payload)],
                         capture_output=True, text=True, timeout=600, cwd=ROOT)
    pm = re.search(r"Percentiles: 50th = (\d+), 99th = (\d+), 99.9th = (\d+)", e2e.stdout)
    avg = re.search(r"Avg latency: ([\d.]+) ms", e2e.stdout)
    if pm is None:
        out["error"] = out["error"] or f"EndToEndLatency printed no percentiles: {(e2e.stdout + e2e.stderr)[-300:]}"
    else:
        out.update(pct(dict(zip(("50", "99", "99.9"), pm.groups())), "50", "99", "99.9", 1000.0))
        out["mean_us"] = float(avg.group(1)) * 1000 if avg else None
        out["e2e_records"] = a.e2e_records
        log(f"EndToEndLatency, {a.e2e_records:,} messages one at a time: {pm.group(0)} ms")
    return {**out, "resolution_us": 1000, "model": "closed: one message in flight (EndToEndLatency)",
            "latency_from": "EndToEndLatency: receive less send, one JVM's nanoTime, whole ms (truncated)"}


def producer(lib: str, port: int, topic: str, rate: int, seconds: float, payload: int) -> list[str]:
    """``kafka-producer-perf-test`` alone at ``rate`` (0: unbounded), acks=all: ``bench.transports``' peer."""
    return producer_perf(lib, port, topic, rate or -1, seconds, payload, "all", int((rate or UNBOUNDED_RATE) * seconds))


PEER = Peer("kafka-producer-perf-test + EndToEndLatency (Kafka 4.4.0)", "kafka", LINE, fetch, run_peer, producer,
            with_consumer=False, causes=(
                "EndToEndLatency is a closed model: one message in flight, so none waits behind another or for a "
                "batch (flightwatch's producer sends at the rate, batched by linger.ms=5)",
                "EndToEndLatency prints whole milliseconds, truncated: 0.5 ms low on average"))
"""Kafka's own tools (``stack.brokers.Broker.peer``)."""
