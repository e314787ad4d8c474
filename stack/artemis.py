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

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile

from core.procs import HOST, start_server, stop_session
from core.rundir import ROOT
from stack import maven

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
