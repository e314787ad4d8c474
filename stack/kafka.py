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

import base64
import os
import subprocess
import sys
import uuid
from dataclasses import dataclass

from core.procs import HOST, start_server, stop_session
from stack import maven

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
