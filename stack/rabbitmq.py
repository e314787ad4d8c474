"""A RabbitMQ broker (Debian's rabbitmq-server 3.10) on loopback, with its AMQP 1.0 plugin: a SUT of the stack's
(``make up SUT=rabbitmq``) and the tests'.

It runs in the foreground as root without systemd, in a session of its own, with everything under one folder: its
Erlang cookie (``HOME``), Mnesia, logs, config and plugins file. Its own epmd runs in that session on a port of its
own, bound to loopback, so nothing of it listens on every interface and nothing outlives it; stop it by signalling the
session's group (``stop_rabbitmq``), which the server's script turns into a clean stop.

    proc = start_rabbitmq(amqp_port, folder)   # waits until AMQP is served
    stop_rabbitmq(proc.pid)
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess

from core.procs import HOST, start_server, stop_session
from stack.peer import PREFIX, SKIP_LINES, Peer, measure, pct

SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"
"""The server's own script: the one in /usr/sbin switches to the rabbitmq user and its home."""
CTL = "/usr/lib/rabbitmq/bin/rabbitmqctl"
EPMD = "epmd"
START_S = 60.0
"""Seconds a start may take (about 10 here, more on a busy machine)."""
INSTALL_HINT = ("RabbitMQ is not installed: apt-get install rabbitmq-server (with a policy-rc.d that exits 101, so "
                "that the package does not start its own service)")


def installed() -> bool:
    return os.access(SERVER, os.X_OK) and shutil.which(EPMD) is not None


def ports(amqp_port: int) -> dict[str, int]:
    """The broker's three ports from its AMQP port: Erlang distribution and epmd on the two above it."""
    return {"amqp": amqp_port, "dist": amqp_port + 1, "epmd": amqp_port + 2}


def environment(amqp_port: int, folder: str, tls: tuple[str, str, str] | None = None) -> dict[str, str]:
    """The server's settings as RabbitMQ's ``RABBITMQ_*`` and Erlang's variables, and its files written in ``folder``.
    ``tls`` (CA, certificate, key: PEM files): AMQP 0-9-1 and 1.0 over TLS alone on ``amqp_port``, no plain listener,
    and no login as guest by default (a production broker's shape)."""
    os.makedirs(os.path.join(folder, "home"), exist_ok=True)
    plugins = os.path.join(folder, "enabled_plugins")
    with open(plugins, "w") as f:
        f.write("[rabbitmq_amqp1_0].\n")  # AMQP 1.0 on the same port (the rabbitmq-amqp1 SUT)
    conf = os.path.join(folder, "rabbitmq.conf")
    with open(conf, "w") as f:
        if tls is None:
            f.write(f"listeners.tcp.1 = {HOST}:{amqp_port}\n")
        else:
            ca, cert, key = tls
            f.write(f"listeners.tcp = none\nlisteners.ssl.default = {HOST}:{amqp_port}\n"
                    f"ssl_options.cacertfile = {ca}\nssl_options.certfile = {cert}\nssl_options.keyfile = {key}\n"
                    "ssl_options.verify = verify_none\nssl_options.fail_if_no_peer_cert = false\n"
                    "amqp1_0.default_user = none\n")  # else AMQP 1.0 without a login is taken as guest
        f.write("loopback_users = none\n"            # it listens on loopback only anyway
                "log.console = true\nlog.console.level = warning\nlog.file = false\n")
    return variables(amqp_port, folder)


def variables(amqp_port: int, folder: str) -> dict[str, str]:
    """The environment of the server started on ``amqp_port`` with ``folder`` (its files are ``environment``'s)."""
    p = ports(amqp_port)
    return dict(os.environ, HOME=os.path.join(folder, "home"), RABBITMQ_NODENAME="fw@localhost",
                RABBITMQ_NODE_IP_ADDRESS=HOST,
                RABBITMQ_NODE_PORT=str(amqp_port), RABBITMQ_DIST_PORT=str(p["dist"]), ERL_EPMD_PORT=str(p["epmd"]),
                ERL_EPMD_ADDRESS=HOST, RABBITMQ_MNESIA_BASE=os.path.join(folder, "mnesia"),
                RABBITMQ_LOG_BASE=os.path.join(folder, "log"),
                RABBITMQ_ENABLED_PLUGINS_FILE=os.path.join(folder, "enabled_plugins"),
                RABBITMQ_CONFIG_FILE=os.path.join(folder, "rabbitmq.conf"),
                RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}")


def command() -> list[str]:
    """epmd on the broker's own port in the foreground (so the broker starts none as a daemon), then the server, under
    one shell that stays (the PID recorded names it for as long as the broker runs) and takes epmd down with it."""
    return ["sh", "-c", f'{EPMD} -port "$ERL_EPMD_PORT" -address {HOST} & e=$!; {SERVER}; s=$?; kill $e; exit $s']


def start_rabbitmq(amqp_port: int, folder: str, log=subprocess.DEVNULL,
                   tls: tuple[str, str, str] | None = None) -> subprocess.Popen:
    """The broker on ``HOST:amqp_port`` in its own session, its state in ``folder`` (``tls``: see ``environment``);
    RuntimeError if it is not installed or does not serve AMQP within ``START_S``."""
    if not installed():
        raise RuntimeError(INSTALL_HINT)
    return start_server(command(), amqp_port, START_S, "rabbitmq", log, env=environment(amqp_port, folder, tls))


def ctl(amqp_port: int, folder: str, *args: str, within_s: float = 60.0) -> str:
    """``rabbitmqctl ARGS`` against the broker started on ``amqp_port`` with ``folder`` (its cookie and node name),
    once it has finished starting (``await_startup`` fails at once until the node is known to epmd: tried again);
    its output, or RuntimeError with it."""
    import time

    env = variables(amqp_port, folder)  # the node, its cookie and epmd
    deadline = time.monotonic() + within_s
    while True:
        done = subprocess.run([CTL, "await_startup"], env=env, capture_output=True, text=True, timeout=within_s)
        if done.returncode == 0:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"rabbitmqctl await_startup: {(done.stdout + done.stderr).strip()[-300:]}")
        time.sleep(0.5)
    done = subprocess.run([CTL, *args], env=env, capture_output=True, text=True, timeout=within_s)
    if done.returncode != 0:
        raise RuntimeError(f"rabbitmqctl {' '.join(args[:2])}: {(done.stdout + done.stderr).strip()[-300:]}")
    return done.stdout


def stop_rabbitmq(pid: int, kill: bool = False, wait_s: float = 30.0) -> None:
    """Stop the broker started as ``pid`` (its session's group: the script, the Erlang VM, its epmd); ``kill``:
    at once, as a crash would (kill -9)."""
    stop_session(pid, kill, wait_s)


# --- its own load tool, as its users run it (``stack.peers``, ``bench.transports``) ---

LINE = re.compile(r"time [\d.]+ s, sent: (\d+) msg/s")
"""PerfTest's line a second: what it sent in it."""
PERFTEST = [("com.rabbitmq", "perf-test", "2.22.1")]
"""2.22.1: the newest the registry serves here (2.23.0 and 2.24.0 are refused)."""
CONFIRMS = 1000
"""PerfTest's unconfirmed messages at most (``-c``): the AMQP 0-9-1 target's own window."""


def fetch_perftest() -> str:
    """PerfTest's jars, fetched from the Maven registry if they are not yet; ``RuntimeError`` saying what failed."""
    from stack import maven

    return maven.fetch("perf-test-2.22.1", PERFTEST, "RabbitMQ PerfTest 2.22.1")


def perftest(lib: str, port: int, rate: int, seconds: float, payload: int, bindings: int) -> list[str]:
    return ["java", "-cp", os.path.join(lib, "*"), "com.rabbitmq.perf.PerfTest", "-h",
            f"amqp://guest:guest@{HOST}:{port}/%2F", "-x", str(bindings), "-y", str(bindings), "-e", f"{PREFIX}.topic",
            "-t", "topic", "--queue-pattern", f"{PREFIX}.q%d", "--queue-pattern-from", "1", "--queue-pattern-to",
            str(bindings), "-r", f"{rate / bindings:g}", "-s", str(payload), "-c", str(CONFIRMS), "-z",
            f"{seconds:.0f}", "--id", "flightwatch-peer"]


def run_peer(lib: str, port: int, a: argparse.Namespace, log) -> dict:
    m = measure(perftest(lib, port, a.rate, a.seconds, a.payload, a.bindings), LINE, a.seconds, log=log)
    text = "\n".join(m["output"])
    seconds = [re.search(r"received: (\d+) msg/s.* consumer latency: \d+/\d+/\d+/\d+/(\d+) µs", line)
               for line in m["output"] if " s, sent: " in line]
    seconds = [x.groups() for x in seconds if x]
    kept = seconds[SKIP_LINES:-1]
    lat = re.search(r"consumer latency min/median/75th/95th/99th (\d+)/(\d+)/(\d+)/(\d+)/(\d+) µs", text)
    values = dict(zip(("min", "50", "75", "95", "99"), lat.groups())) if lat else {}
    return {"throughput_per_s": statistics.median(int(r) for r, _ in kept) if len(kept) > 2 else None,
            "cpu_us_per_message": m.get("us_per_event"), "cpu_of": "producers and consumers (one JVM)",
            **pct(values, "50", "99", None, 1.0), "per_second_p99_us": [int(p) for _, p in seconds],
            "error": m.get("error") or (None if lat else "PerfTest printed no consumer latency"), "resolution_us": 1,
            "model": f"open: {a.rate:,}/s over {a.bindings:,} queue(s) of a topic exchange, {CONFIRMS} unconfirmed at most",
            "latency_from": "consumer latency: receive less the send nanoTime in the body (µs); no p99.9 printed; "
                            "its summary includes its first seconds"}


def producer(lib: str, port: int, queue: str, rate: int, seconds: float, payload: int) -> list[str]:
    """PerfTest's producer alone on ``queue`` at ``rate`` (0: unbounded), confirms on: ``bench.transports``' peer."""
    return ["java", "-cp", os.path.join(lib, "*"), "com.rabbitmq.perf.PerfTest", "-h",
            f"amqp://guest:guest@{HOST}:{port}/%2F", "-x", "1", "-y", "0", "-u", queue, "-p", "-s", str(payload), "-c",
            str(CONFIRMS), "-z", f"{seconds:.0f}", *(["-r", str(rate)] if rate else [])]


def purge(port: int, queue: str) -> None:
    """The queue emptied (declared first, transient), so that no run pays for the one before."""
    import pika

    conn = pika.BlockingConnection(pika.URLParameters(f"amqp://guest:guest@{HOST}:{port}/%2F"))
    ch = conn.channel()
    ch.queue_declare(queue)
    ch.queue_purge(queue)
    conn.close()


PEER = Peer("RabbitMQ PerfTest 2.22.1", "amqp", LINE, fetch_perftest, run_peer, producer, with_consumer=True,
            causes=("PerfTest's summary includes its first seconds (start-up) and prints no p99.9",))
"""RabbitMQ's own load tool (``stack.brokers.Broker.peer``)."""
