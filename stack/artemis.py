"""Apache ActiveMQ Artemis on loopback: a SUT of the stack's (``make up SUT=artemis``) and the tests'.

The broker is Artemis 2.40.0's bin tarball from the Maven registry (``mvn dependency:get``, kept in Maven's own
cache, its SHA-1 checked against the registry's), unpacked under ``.stack/`` (git-ignored), on the machine's Java 17.
A broker instance is made once per folder (``artemis create``: one acceptor, every protocol, AMQP 1.0 among them, on
127.0.0.1, no web console, login required, the queue ``flightwatch.sut`` anycast) and runs in the foreground in a
session of its own; stop it by signalling that session's group.

    proc = start_artemis(port, folder)   # fetches, unpacks, creates as needed; waits until it serves
    stop_artemis(proc.pid)

    python -m stack.artemis fetch        # the install step: fetch and unpack, nothing else
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile

from core.procs import HOST, start_server, stop_session
from core.rundir import ROOT
from stack import maven
from stack.peer import PREFIX, Peer, measure, pct

VERSION = "2.40.0"
ARTIFACT = f"org.apache.activemq:apache-artemis:{VERSION}:tar.gz:bin"
"""2.40.0: the newest whose bin tarball the registry serves here (2.56.0's is not)."""
USER = PASSWORD = "artemis"
QUEUE = "flightwatch.sut"
START_S = 90.0
CACHE = os.path.join(ROOT, ".stack", "downloads")


def _m2_tarball() -> str:
    repo = os.path.join(os.path.expanduser("~"), ".m2", "repository", "org", "apache", "activemq", "apache-artemis",
                        VERSION)
    return os.path.join(repo, f"apache-artemis-{VERSION}-bin.tar.gz")


def fetch(cache: str = CACHE, log=print) -> str:
    """Artemis' home folder, fetched and unpacked if it is not yet; ``RuntimeError`` saying what failed."""
    home = os.path.join(cache, f"apache-artemis-{VERSION}")
    if os.access(os.path.join(home, "bin", "artemis"), os.X_OK):
        return home
    tarball = _m2_tarball()
    if not os.path.exists(tarball):
        if shutil.which("mvn") is None:
            raise RuntimeError("Artemis needs Maven to fetch it (apt-get install maven), or its tarball in ~/.m2")
        log(f"fetching ActiveMQ Artemis {VERSION} from the Maven registry ...")
        done = subprocess.run(["mvn", "-q", "-B", "dependency:get", f"-Dartifact={ARTIFACT}", "-Dtransitive=false"],
                              capture_output=True, text=True)
        if done.returncode != 0 or not os.path.exists(tarball):
            raise RuntimeError(f"mvn dependency:get {ARTIFACT} failed: {(done.stdout + done.stderr).strip()[-300:]}")
    _check_sha1(tarball)
    os.makedirs(cache, exist_ok=True)
    with tarfile.open(tarball) as tar:
        tar.extractall(cache, filter="tar")
    return home


def _check_sha1(path: str) -> None:
    """The tarball's SHA-1 against the one the registry served beside it (``.sha1``); ``RuntimeError`` if not."""
    want_file = path + ".sha1"
    if not os.path.exists(want_file):
        raise RuntimeError(f"{path}: no .sha1 beside it to check it against (fetch it again: rm it and run again)")
    want = open(want_file).read().split()[0].strip().lower()
    h = hashlib.sha1()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    if h.hexdigest() != want:
        raise RuntimeError(f"{path}: SHA-1 {h.hexdigest()} is not the registry's {want}: remove it and fetch again")


def create(home: str, instance: str, port: int, login: tuple[str, str] = (USER, PASSWORD),
           tls: str | None = None) -> None:
    """A broker instance in ``instance`` listening on ``HOST:port`` (made once; an existing one is kept), its one
    user ``login``; ``tls``: the acceptor speaks TLS alone, with SASL PLAIN, its key and certificate the PEM file
    ``tls`` names (an unencrypted PKCS#8 key, then the chain)."""
    if os.path.exists(os.path.join(instance, "bin", "artemis")):
        return
    done = subprocess.run([os.path.join(home, "bin", "artemis"), "create", instance, "--user", login[0], "--password",
                           login[1], "--require-login", "--silent", "--host", HOST, "--default-port", str(port),
                           "--no-web", "--no-amqp-acceptor", "--no-mqtt-acceptor", "--no-stomp-acceptor",
                           "--no-hornetq-acceptor", "--queues", f"{QUEUE}:anycast", "--java-memory", "512M", "--nio",
                           "--force"], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"artemis create failed: {(done.stdout + done.stderr).strip()[-300:]}")
    if tls is not None:
        _tls_acceptor(os.path.join(instance, "etc", "broker.xml"), port, tls)


def _tls_acceptor(broker_xml: str, port: int, chain: str) -> None:
    """The instance's acceptor on ``port`` turned to TLS (the PEM key store ``chain``) with SASL PLAIN."""
    with open(broker_xml) as f:
        text = f.read()
    head = f"tcp://{HOST}:{port}?"
    at = text.find(head)
    if at < 0:
        raise RuntimeError(f"artemis create: no acceptor on {HOST}:{port} in {broker_xml}")
    end = text.index("</acceptor>", at)
    text = (text[:end] + f";sslEnabled=true;keyStoreType=PEM;keyStorePath={chain};saslMechanisms=PLAIN"
            + text[end:])
    with open(broker_xml, "w") as f:
        f.write(text)


def command(instance: str) -> list[str]:
    """``artemis run`` under a shell that stays: the script becomes ``java`` (exec), and the PID recorded must keep
    naming the process it started."""
    return ["sh", "-c", '"$0" run; exit $?', os.path.join(instance, "bin", "artemis")]


def prepare(port: int, folder: str, login: tuple[str, str] = (USER, PASSWORD), tls: str | None = None) -> str:
    """Fetch, unpack and create as needed: the instance's folder."""
    instance = os.path.join(folder, "instance")
    create(fetch(), instance, port, login, tls)
    return instance


def start_artemis(port: int, folder: str, log=subprocess.DEVNULL, login: tuple[str, str] = (USER, PASSWORD),
                  tls: str | None = None) -> subprocess.Popen:
    """The broker on ``HOST:port``, its instance in ``folder`` (``login``, ``tls``: see ``create``); RuntimeError if
    it cannot be had or does not serve within ``START_S``."""
    return start_server(command(prepare(port, folder, login, tls)), port, START_S, "artemis", log)


def stop_artemis(pid: int, kill: bool = False, wait_s: float = 30.0) -> None:
    """Stop the broker started as ``pid`` (the JVM the script became, and anything of its session)."""
    stop_session(pid, kill, wait_s)


if __name__ == "__main__":
    sys.exit(maven.fetch_main("stack.artemis", fetch))


# --- its own load tool, as its users run it (``stack.peers``, ``bench.transports``) ---

LINE = re.compile(r"^--- sent:\s+(\d+) msg/sec")
"""``artemis perf``'s line a second: what it sent in it."""
MAX_PENDING = 100
"""``artemis perf --max-pending``: with 1,000, ``artemis perf producer`` stopped sending 2 s into every run at
5,000/s (the broker answered no more); 100 is the most that ran through."""


def artemis_client(home: str, port: int, rate: int, seconds: float, payload: int, pairs: int, warmup: int,
                   report: str) -> list[str]:
    return [os.path.join(home, "bin", "artemis"), "perf", "client", "--url", f"amqp://{HOST}:{port}", "--protocol",
            "AMQP", "--user", USER, "--password", PASSWORD, "--message-size", str(payload), "--rate", str(rate),
            "--duration", f"{seconds:.0f}", "--warmup", str(warmup), "--max-pending", str(MAX_PENDING), "--json",
            report, *(["--num-destinations", str(pairs), "--shared-connections", "--consumer-connections", "1"]
                      if pairs > 1 else []), f"queue://{PREFIX}"]


def heap_mb(pairs: int) -> int:
    """``artemis perf client``'s heap: its default 1 GiB and 3 MiB more for each address (each producer and consumer
    keeps latency histograms of its own: at 100 addresses 512 MiB ran out), 4 GiB at most."""
    return min(4096, 1024 + 3 * pairs)


def run_peer(home: str, port: int, a: argparse.Namespace, log) -> dict:
    with tempfile.TemporaryDirectory(prefix="peer-artemis-") as tmp:
        report = os.path.join(tmp, "report.json")
        m = measure(artemis_client(home, port, a.rate, a.seconds, a.payload, a.pairs, a.warmup, report), LINE,
                    a.seconds, env=dict(os.environ, JAVA_ARGS=f"-Xms512m -Xmx{heap_mb(a.pairs)}m"), log=log)
        try:
            with open(report) as f:
                samples = json.load(f)
        except (OSError, ValueError):
            samples = []
    summary = next((s for s in samples if s.get("sampleType") == "summary"), {})
    kept = [s for s in samples if s.get("sampleType") == "interval" and not s.get("warmup")]
    received = [s["received"] for s in kept]
    transfer = summary.get("totalTransferTime") or {}
    return {"throughput_per_s": statistics.median(received[1:-1]) if len(received) > 2 else None,
            "cpu_us_per_message": m.get("us_per_event"), "cpu_of": "producers and consumers (one JVM)",
            "sent": summary.get("totalSent"), "received": summary.get("totalReceived"),
            **pct(transfer, "50", "99", "99.9", 1.0), "mean_us": float(transfer["mean"]) if transfer else None,
            "per_second_p99_us": [(s.get("transferTime") or {}).get("99") for s in kept],
            "error": m.get("error") or (None if transfer else "artemis perf client wrote no summary"),
            "resolution_us": 1, "model": f"open: {a.rate:,}/s over {a.pairs:,} address(es), {MAX_PENDING} pending at most",
            "latency_from": "transfer time: receive less the send time the message carries (µs, one clock)"}


def producer(home: str, port: int, queue: str, rate: int, seconds: float, payload: int) -> list[str]:
    """``artemis perf producer`` alone at ``rate`` (0: unbounded): ``bench.transports``' peer."""
    return [os.path.join(home, "bin", "artemis"), "perf", "producer", "--url", f"amqp://{HOST}:{port}", "--protocol",
            "AMQP", "--user", USER, "--password", PASSWORD, "--message-size", str(payload), "--max-pending",
            str(MAX_PENDING), "--duration", f"{seconds:.0f}", *(["--rate", str(rate)] if rate else []), f"queue://{queue}"]


def start_dropping(port: int, folder: str, log=subprocess.DEVNULL) -> subprocess.Popen:
    """The broker alone on ``HOST:port`` (``bench.transports``): an address drops what it holds past 64 MiB
    (``drop_when_full``)."""
    drop_when_full(prepare(port, folder))
    return start_artemis(port, folder, log)


def drop_when_full(instance: str) -> None:
    """Artemis drops what an address holds past 64 MiB instead of paging it: with no consumer the runs' messages
    piled up, and ``artemis perf producer`` stopped for good a few seconds into the third run (no error, no
    log line); what the broker keeps is not what is measured here."""
    path = os.path.join(instance, "etc", "broker.xml")
    with open(path) as f:
        xml = f.read()
    head, sep, rest = xml.partition('<address-setting match="#">')
    block, end, tail = rest.partition("</address-setting>")
    block = (block.replace("<address-full-policy>PAGE</address-full-policy>",
                           "<address-full-policy>DROP</address-full-policy>")
             .replace("<max-size-bytes>-1</max-size-bytes>", "<max-size-bytes>64MB</max-size-bytes>"))
    with open(path, "w") as f:
        f.write(head + sep + block + end + tail)


def purge(port: int, queue: str) -> None:
    """The queue emptied, so that no run pays for the one before (none yet: nothing to do)."""
    subprocess.run([os.path.join(fetch(), "bin", "artemis"), "queue", "purge", "--name", queue, "--url",
                    f"tcp://{HOST}:{port}", "--user", USER, "--password", PASSWORD, "--silent"], capture_output=True,
                   timeout=120)


PEER = Peer("artemis perf client (Artemis 2.40.0, AMQP)", "amqp1", LINE, fetch, run_peer, producer,
            with_consumer=True)
"""Artemis' own load tool (``stack.brokers.Broker.peer``)."""
