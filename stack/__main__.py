"""The embedded stack on loopback: telemetry broker, SUT broker, Prometheus, node exporter.

Usage:
    python -m stack up       # start what is not running; print every address
    python -m stack down     # stop exactly what `up` started (by recorded PID, start time and name)
    python -m stack status
    python -m stack clean    # remove the run folders and .stack/, refused while anything of them still runs
    python -m stack renew-sut  # restart the SUT broker empty, with its receiver (before each attack on it)
    python -m stack restart http-receiver   # one component again, with the settings given now
    python -m stack up --sut rabbitmq   # RabbitMQ as the SUT (FLIGHTWATCH_SUT; core.suts lists them)

Two separate brokers: the telemetry plane (Tansu, Kafka protocol, in memory) never shares a broker with the system
under test, by default a second Tansu (``--sut rabbitmq``: Debian's RabbitMQ, ``stack.rabbitmq``). Agents: the SUT's
receiver consumes the SUT topic or queue (``flightwatch.sut``, the default target of `make attack`); the HTTP receiver
is a CloudEvents sink (``make attack TARGET=http://127.0.0.1:18080/``); the node-metrics agent samples Prometheus every
second and watches for OOM kills. All write into the telemetry topic. PIDs, logs and the Prometheus config live in
``.stack/`` (``--stack-dir``, FLIGHTWATCH_STACK_DIR). Ports come from flags (``--telemetry-port`` ...) or the
environment: FLIGHTWATCH_TELEMETRY_PORT (19092), FLIGHTWATCH_SUT_PORT (29092), FLIGHTWATCH_PROMETHEUS_PORT (19090),
FLIGHTWATCH_NODE_EXPORTER_PORT (19100), FLIGHTWATCH_RECEIVER_PORT (18080, the HTTP CloudEvents receiver),
FLIGHTWATCH_CLOCK_PORT (19123, UDP clock reference served by the node-metrics agent), FLIGHTWATCH_UI_PORT (18501, the
dashboard). To use a real Kafka cluster instead, skip `up` and give the job ``--bootstrap``.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

from core import settings, suts
from core.procs import (
    AMQP_RECEIVER_METRICS_PORT,
    JOB_METRICS_PORT,
    KAFKA_RECEIVER_METRICS_PORT,
    LOADGEN_METRICS_PORT,
    NODE_METRICS_PORT,
    pid_from_file,
    port_open,
    stop_session,
    wait_port,
    write_pid_file,
)
from core.rundir import ROOT
from core.suts import DEFAULT_SUT, SUTS, default_target, pairs_target, receiver_bootstrap, routing_target
from stack import artemis, debian, kafka, rabbitmq
from stack.prometheus import PROMETHEUS_GO_MEMORY, prometheus_config
from stack.tansu import tansu_command

HOST = "127.0.0.1"
PORT_SETTINGS = {"telemetry-broker": ("FLIGHTWATCH_TELEMETRY_PORT", 19092), "sut-broker": ("FLIGHTWATCH_SUT_PORT", 29092),
                 "rabbitmq": ("FLIGHTWATCH_RABBITMQ_PORT", 29672), "artemis": ("FLIGHTWATCH_ARTEMIS_PORT", 29616),
                 "kafka": ("FLIGHTWATCH_KAFKA_PORT", 29192),
                 "prometheus": ("FLIGHTWATCH_PROMETHEUS_PORT", 19090),
                 "node-exporter": ("FLIGHTWATCH_NODE_EXPORTER_PORT", 19100),
                 "http-receiver": ("FLIGHTWATCH_RECEIVER_PORT", 18080), "ui": ("FLIGHTWATCH_UI_PORT", 18501),
                 "clock": ("FLIGHTWATCH_CLOCK_PORT", 19123)}
"""Each component's port: its setting (``--telemetry-port`` ..., or the variable) and default."""
STACK_SETTINGS = ("FLIGHTWATCH_STACK_DIR", "FLIGHTWATCH_NO_INSTALL", "FLIGHTWATCH_SUT", "FLIGHTWATCH_SUT_PARTITIONS",
                  "FLIGHTWATCH_SUT_PAIRS", "FLIGHTWATCH_SUT_BINDINGS",
                  *(name for name, _ in PORT_SETTINGS.values()))


def _listen_port(env: str, default: int) -> int:
    port = (settings.get(env) or "").rpartition(":")[2]
    return int(port) if port.isdigit() else default


def _configured() -> tuple[str, dict, dict]:
    """The stack's folder, its ports, and the /metrics ports of the processes without a port of their own (each where
    its own setting, the documented HOST:PORT one, puts it), from the settings."""
    ports = {name: int(settings.get(env) or default) for name, (env, default) in PORT_SETTINGS.items()}
    metrics_ports = {
        "kafka-receiver": _listen_port("FLIGHTWATCH_KAFKA_RECEIVER_METRICS_LISTEN", KAFKA_RECEIVER_METRICS_PORT),
        "amqp-receiver": _listen_port("FLIGHTWATCH_AMQP_RECEIVER_METRICS_LISTEN", AMQP_RECEIVER_METRICS_PORT),
        "amqp1-receiver": _listen_port("FLIGHTWATCH_AMQP_RECEIVER_METRICS_LISTEN", AMQP_RECEIVER_METRICS_PORT),
        "node-metrics": _listen_port("FLIGHTWATCH_NODE_METRICS_METRICS_LISTEN", NODE_METRICS_PORT),
        # started by `make attack`, not by the stack
        "job": _listen_port("FLIGHTWATCH_JOB_METRICS_LISTEN", JOB_METRICS_PORT),
        "loadgen": _listen_port("FLIGHTWATCH_LOADGEN_METRICS_LISTEN", LOADGEN_METRICS_PORT),
    }
    return settings.get("FLIGHTWATCH_STACK_DIR") or os.path.join(ROOT, ".stack"), ports, metrics_ports


STACK_DIR, PORTS, METRICS_PORTS = _configured()  # METRICS_PORTS: where the processes without a port of their own
CLOCK_PORT = PORTS.pop("clock")                  # serve /metrics, for Prometheus' targets
AGENTS = ("kafka-receiver", "amqp-receiver", "amqp1-receiver", "node-metrics")
"""Components without a port of their own (started after the brokers)."""
SUT_COMPONENTS = {name for sut in SUTS.values() for name in (sut.broker, sut.receiver)}
"""Components that run only when their SUT is the stack's (``--sut``)."""


def ui_command(port: int) -> list[str]:
    """The dashboard (Streamlit) on 127.0.0.1:port, reading ./checkpoints (FLIGHTWATCH_CHECKPOINTS)."""
    return [sys.executable, "-m", "streamlit", "run", os.path.join(ROOT, "ui", "app.py"), "--server.address", HOST,
            "--server.port", str(port), "--server.headless", "true", "--browser.gatherUsageStats", "false",
            "--client.toolbarMode", "viewer"]


def sut_partitions() -> int:
    return int(settings.get("FLIGHTWATCH_SUT_PARTITIONS") or 2)


def _maven_broker_command(name: str) -> list[str] | None:
    """Artemis' or Apache Kafka's command when it is the SUT (fetched from the Maven registry, its instance made or
    its storage formatted, as needed); None, said in one line, if it cannot be had."""
    if SUTS[SUT].broker != name:
        return None
    folder = os.path.join(STACK_DIR, name)
    try:
        if name == "kafka":
            return kafka.command(PORTS["kafka"], folder, sut_partitions())
        return artemis.command(artemis.prepare(PORTS["artemis"], folder))
    except RuntimeError as e:
        print(f"stack: error: {e}", file=sys.stderr)
        return None


NODE_COLLECTORS = ("--collector.disable-defaults", *(f"--collector.{c}" for c in ("cpu", "meminfo", "netdev", "loadavg",
                                                                                 "vmstat", "uname")))
"""Only what ``agents.node_metrics`` reads: scraped every second, the defaults cost 0.009 core for 505 series, these
0.0023 for 195 (the systemd one logged an error every scrape where there is no systemd, 0.8 MiB an hour)."""


def commands() -> dict[str, list[str] | None]:
    prom = debian.ensure("prometheus")
    node = debian.ensure("prometheus-node-exporter")
    cfg = os.path.join(STACK_DIR, "prometheus.yml")
    telemetry = f"{HOST}:{PORTS['telemetry-broker']}"
    clock = f"{HOST}:{CLOCK_PORT}"
    return {
        "telemetry-broker": tansu_command(PORTS["telemetry-broker"]),
        "sut-broker": tansu_command(PORTS["sut-broker"]),
        "node-exporter": node and [node, f"--web.listen-address={HOST}:{PORTS['node-exporter']}", *NODE_COLLECTORS],
        "prometheus": prom and [prom, f"--config.file={cfg}", f"--web.listen-address={HOST}:{PORTS['prometheus']}",
                                f"--storage.tsdb.path={os.path.join(STACK_DIR, 'prometheus-data')}",
                                "--storage.tsdb.retention.time=1d"],
        "node-metrics": [sys.executable, "-m", "agents.node_metrics", "--prometheus", f"http://{HOST}:{PORTS['prometheus']}",
                         "--telemetry-bootstrap", telemetry, "--clock-listen", clock,
                         "--metrics-listen", f"{HOST}:{METRICS_PORTS['node-metrics']}"],
        "rabbitmq": rabbitmq.command() if SUTS[SUT].broker == "rabbitmq" and debian.ensure_rabbitmq() else None,
        "amqp-receiver": [sys.executable, "-m", "agents.receiver", "amqp", "--url",
                          routing_target(bindings) if (bindings := int(settings.get("FLIGHTWATCH_SUT_BINDINGS") or 0))
                          else default_target("rabbitmq"),
                          "--telemetry-bootstrap", telemetry, "--clock-reference", clock,
                          "--state-dir", os.path.join(STACK_DIR, "amqp-receiver"),
                          "--metrics-listen", f"{HOST}:{METRICS_PORTS['amqp-receiver']}"],
        "artemis": _maven_broker_command("artemis"),
        "kafka": _maven_broker_command("kafka"),
        "amqp1-receiver": [sys.executable, "-m", "agents.receiver", "amqp1", "--url",
                           pairs_target(default_target(SUT if SUTS[SUT].receiver == "amqp1-receiver" else "rabbitmq-amqp1"),
                                        int(settings.get("FLIGHTWATCH_SUT_PAIRS") or 1)),
                           "--telemetry-bootstrap", telemetry, "--clock-reference", clock,
                           "--state-dir", os.path.join(STACK_DIR, "amqp1-receiver"),
                           "--metrics-listen", f"{HOST}:{METRICS_PORTS['amqp1-receiver']}"],
        "kafka-receiver": [sys.executable, "-m", "agents.receiver", "kafka", "--routes", "--create-topic", str(sut_partitions()),
                           "--bootstrap", receiver_bootstrap(SUT), "--telemetry-bootstrap", telemetry,
                           "--clock-reference", clock, "--state-dir", os.path.join(STACK_DIR, "kafka-receiver"),
                           "--metrics-listen", f"{HOST}:{METRICS_PORTS['kafka-receiver']}"],
        "http-receiver": [sys.executable, "-m", "agents.receiver", "http", "--listen", f"{HOST}:{PORTS['http-receiver']}",
                          "--telemetry-bootstrap", telemetry, "--clock-reference", clock,
                          "--spool-dir", os.path.join(STACK_DIR, "spool")],
        "ui": ui_command(PORTS["ui"]),
    }


def _pidfile(name: str) -> str:
    return os.path.join(STACK_DIR, f"{name}.pid")


def _alive(pid: int) -> bool:
    """Running (an exited process its parent has not reaped yet is not)."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def recorded_pid(name: str) -> int | None:
    """The component's PID if the very process `up` started still runs (its PID, start time and name, as
    recorded); a PID file that names another process now (after a reboot) gives None: nothing is signalled."""
    return pid_from_file(_pidfile(name))


def address(name: str) -> str:
    if name in AGENTS:
        return "-"
    port = PORTS[name]
    if name in ("rabbitmq", "artemis"):
        return f"amqp://{HOST}:{port}"
    return f"{HOST}:{port}" if name.endswith("broker") or name == "kafka" else f"http://{HOST}:{port}"


def up(with_sut: bool = True) -> int:
    """Start what is not running: the telemetry plane, and (``with_sut``) the SUT's broker and receiver, the SUT
    recorded in the stack's folder for the commands after (``core.suts.recorded_sut``)."""
    os.makedirs(STACK_DIR, exist_ok=True)
    if with_sut:
        suts.record_sut(STACK_DIR, SUT)
    with open(os.path.join(STACK_DIR, "prometheus.yml"), "w") as f:
        f.write(prometheus_config(PORTS["node-exporter"], {
            "flightwatch-receiver": PORTS["http-receiver"], "flightwatch-job": METRICS_PORTS["job"],
            "flightwatch-kafka-receiver": METRICS_PORTS["kafka-receiver"], "flightwatch-node-metrics": METRICS_PORTS["node-metrics"],
            "flightwatch-amqp-receiver": METRICS_PORTS["amqp-receiver"],
            "flightwatch-loadgen": METRICS_PORTS["loadgen"]}))  # the load generator's is up while it attacks
    failed = False
    fresh_broker = False
    mine = {SUTS[SUT].broker, SUTS[SUT].receiver} if with_sut else set()
    for name, cmd in commands().items():
        if name in SUT_COMPONENTS and name not in mine:
            continue
        if recorded_pid(name):
            print(f"{name:18} {address(name):28} running (pid {recorded_pid(name)})")
            continue
        if cmd is None and name == "rabbitmq":
            print(f"stack: error: {rabbitmq.INSTALL_HINT}", file=sys.stderr)
            return 2
        if cmd is None and name in ("artemis", "kafka"):  # why was said in one line
            return 2
        if cmd is None:
            print(f"{name:18} {'-':28} not installed (apt-get install {debian.PACKAGES.get(name.replace('node-exporter', 'prometheus-node-exporter'), name)})")
            continue
        if name not in AGENTS and port_open(PORTS[name]):
            print(f"{name:18} {address(name):28} port taken by another process: not started", file=sys.stderr)
            failed = True
            continue
        if name.endswith("broker") or name == "kafka":
            fresh_broker = True
        elif name == "kafka-receiver" and fresh_broker:  # new in-memory brokers: old positions mean nothing (its
            for stale in ("wal", "wal.tmp"):             # spool stays: what it holds is still to be shipped)
                try:
                    os.remove(os.path.join(STACK_DIR, "kafka-receiver", stale))
                except FileNotFoundError:
                    pass
        log = open(os.path.join(STACK_DIR, f"{name}.log"), "ab")
        env = dict(os.environ, CLUSTER_ID=f"flightwatch-{name}", PYTHONPATH=ROOT)
        if name == "prometheus":
            env = {**PROMETHEUS_GO_MEMORY, **env}
        elif name == "rabbitmq":
            env = rabbitmq.environment(PORTS[name], os.path.join(STACK_DIR, "rabbitmq"))
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        write_pid_file(_pidfile(name), proc.pid)
        bound_s = {"rabbitmq": rabbitmq.START_S, "artemis": artemis.START_S, "kafka": kafka.START_S}.get(name, 15.0)
        ok = wait_port(PORTS[name], bound_s) if name not in AGENTS else _stays_up(proc)
        print(f"{name:18} {address(name):28} {'started' if ok else 'FAILED to start'} (pid {proc.pid}, log {STACK_DIR}/{name}.log)")
        failed |= not ok
    _write_env()
    return 1 if failed else 0


def _stays_up(proc, seconds: float = 2.0) -> bool:
    try:
        proc.wait(seconds)
        return False
    except subprocess.TimeoutExpired:
        return True


def _write_env() -> None:
    with open(os.path.join(STACK_DIR, "addresses.json"), "w") as f:
        json.dump({name: address(name) for name in PORTS}, f, indent=1)


def all_components() -> tuple[str, ...]:
    return tuple(PORTS) + AGENTS


def _stop(name: str) -> None:
    pid = recorded_pid(name)
    if pid is None and os.path.exists(_pidfile(name)):
        print(f"{name:18} not running (its PID file names no process of ours now: nothing signalled)")
    if pid and name in ("rabbitmq", "artemis", "kafka"):  # a script, its VM and helpers: the session it leads
        stop_session(pid)
        print(f"{name:18} stopped (pid {pid})")
    elif pid:
        os.kill(pid, signal.SIGTERM)
        for _ in range(50):
            if not _alive(pid):
                break
            time.sleep(0.1)
        else:
            os.kill(pid, signal.SIGKILL)
        print(f"{name:18} stopped (pid {pid})")
    try:
        os.remove(_pidfile(name))
    except FileNotFoundError:
        pass


def down() -> int:
    for name in reversed(all_components()):
        _stop(name)
    suts.record_sut(STACK_DIR, None)
    return 0


def renew_sut() -> int:
    """Start the SUT broker empty, and its receiver on it afresh; `make attack` does it first.

    Its memory storage keeps every record and ignores retention, and its CPU grows with what it holds: at
    5,000/s with a consumer, 0.24 core in the first 10 s, 0.42 after 50 s; left running, it held 2.7 GB after
    three runs and each run began where the last had left it. Each attack now starts on the same empty broker,
    as a load test starts on a SUT in a known state. The receiver has recorded every receive by then."""
    sut = SUTS[SUT]
    for name in (sut.receiver, sut.broker):
        _stop(name)
    if sut.broker == "rabbitmq":  # its queues and messages live on disk: a new broker starts without them
        shutil.rmtree(os.path.join(STACK_DIR, "rabbitmq", "mnesia"), ignore_errors=True)
    if sut.broker == "artemis":
        shutil.rmtree(os.path.join(STACK_DIR, "artemis", "instance", "data"), ignore_errors=True)
    if sut.broker == "kafka":  # formatted afresh on start
        shutil.rmtree(os.path.join(STACK_DIR, "kafka", "data"), ignore_errors=True)
    return up()


def restart(name: str) -> int:
    """Stop one component and start it again, with the settings of this call (and everything else ``up`` starts)."""
    if name not in all_components():
        print(f"stack: error: no component {name!r} (one of {', '.join(all_components())})", file=sys.stderr)
        return 2
    _stop(name)
    return up()


def status() -> int:
    for name in all_components():
        pid = recorded_pid(name)
        print(f"{name:18} {address(name):28} {'running (pid %d)' % pid if pid else 'stopped'}")
    return 0


def clean() -> int:
    """Remove the run folders and the stack's state, unless something of the stack or a run still uses them."""
    from core import observer

    running = [f"{name} (pid {pid})" for name in all_components() if (pid := recorded_pid(name))]
    running += [f"{role} (pid {pid})" for pid, role in observer.roots(STACK_DIR).items() if role not in all_components()]
    if running:
        print(f"stack: error: still running: {', '.join(running)}; `make down` (and stop the runs) first: removing "
              "their state would leave them orphaned", file=sys.stderr)
        return 2
    import glob

    from core.rundir import CHECKPOINTS

    for path in glob.glob(os.path.join(CHECKPOINTS, "*", "")) + [STACK_DIR]:
        shutil.rmtree(path, ignore_errors=True)
    print(f"removed the run folders ({CHECKPOINTS}) and the stack's state ({STACK_DIR})")
    return 0


def _parser():
    from stack import cli

    return cli.parser(__doc__, PORT_SETTINGS)


SUT = settings.get("FLIGHTWATCH_SUT") or DEFAULT_SUT


def main(argv=None) -> int:
    global STACK_DIR, CLOCK_PORT, SUT
    try:
        a = _parser().parse_args(argv)
    except SystemExit as e:
        return 2 if e.code else 0
    from stack.cli import problem

    if error := problem(a):
        print(f"stack: error: {error}", file=sys.stderr)
        return 2
    settings.export(a, STACK_SETTINGS)  # for this process and every component it starts: their defaults follow
    STACK_DIR, ports, metrics_ports = _configured()
    SUT = a.sut or suts.stack_sut(STACK_DIR)  # no --sut nor FLIGHTWATCH_SUT: the one `up --sut` recorded, or tansu
    os.environ["FLIGHTWATCH_SUT"] = SUT
    CLOCK_PORT = ports.pop("clock")
    PORTS.update(ports)
    METRICS_PORTS.update(metrics_ports)
    if a.action == "restart":
        return restart(a.component)
    if a.no_sut and a.action != "up":
        print("stack: error: --no-sut is for up (the telemetry plane without a SUT broker)", file=sys.stderr)
        return 2
    actions = {"up": lambda: up(not a.no_sut), "down": down, "status": status, "renew-sut": renew_sut, "clean": clean}
    return actions[a.action]()


if __name__ == "__main__":
    sys.exit(main())
