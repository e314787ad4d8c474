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
from core.procs import port_open, stop_session, wait_port, write_pid_file
from core.rundir import ROOT
from core.suts import SUTS
from stack import debian
from stack.brokers import BROKERS
from stack.config import AGENTS, HOST, PORT_SETTINGS, STACK_SETTINGS, SUT_COMPONENTS, Stack
from stack.prometheus import PROMETHEUS_GO_MEMORY, prometheus_config
from stack.tansu import tansu_command
from transports.registry import ALL

POSITIONS = {f"{t.receiver}-receiver": t.positions for t in ALL if t.positions}
"""The stack's receivers whose state folder holds positions in their broker (``Transport.positions``)."""


def ui_command(port: int) -> list[str]:
    """The dashboard (Streamlit) on 127.0.0.1:port, reading ./checkpoints (FLIGHTWATCH_CHECKPOINTS)."""
    return [sys.executable, "-m", "streamlit", "run", os.path.join(ROOT, "ui", "app.py"), "--server.address", HOST,
            "--server.port", str(port), "--server.headless", "true", "--browser.gatherUsageStats", "false",
            "--client.toolbarMode", "viewer"]


NODE_COLLECTORS = ("--collector.disable-defaults", *(f"--collector.{c}" for c in ("cpu", "meminfo", "netdev", "loadavg",
                                                                                 "vmstat", "uname")))
"""Only what ``agents.node_metrics`` reads: scraped every second, the defaults cost 0.009 core for 505 series, these
0.0023 for 195 (the systemd one logged an error every scrape where there is no systemd, 0.8 MiB an hour)."""


def commands(stack: Stack) -> dict[str, list[str] | None]:
    prom = debian.ensure("prometheus")
    node = debian.ensure("prometheus-node-exporter")
    cfg = os.path.join(stack.dir, "prometheus.yml")
    telemetry = f"{HOST}:{stack.ports['telemetry-broker']}"
    clock = f"{HOST}:{stack.clock_port}"
    return {
        "telemetry-broker": tansu_command(stack.ports["telemetry-broker"]),
        "node-exporter": node and [node, f"--web.listen-address={HOST}:{stack.ports['node-exporter']}", *NODE_COLLECTORS],
        "prometheus": prom and [prom, f"--config.file={cfg}", f"--web.listen-address={HOST}:{stack.ports['prometheus']}",
                                f"--storage.tsdb.path={os.path.join(stack.dir, 'prometheus-data')}",
                                "--storage.tsdb.retention.time=1d"],
        "node-metrics": [sys.executable, "-m", "agents.node_metrics", "--prometheus", f"http://{HOST}:{stack.ports['prometheus']}",
                         "--telemetry-bootstrap", telemetry, "--clock-listen", clock,
                         "--metrics-listen", f"{HOST}:{stack.metrics_ports['node-metrics']}"],
        **{name: broker.command(stack, name) for name, broker in BROKERS.items()},
        # each transport's receiver the stack runs, its flags from its descriptor (``Transport.stack_flags``)
        **{f"{t.receiver}-receiver": [sys.executable, "-m", "agents.receiver", t.receiver, *t.stack_flags(stack),
                                      "--telemetry-bootstrap", telemetry, "--clock-reference", clock]
           for t in ALL if t.stack_flags is not None},
        "ui": ui_command(stack.ports["ui"]),
    }


def _alive(pid: int) -> bool:
    """Running (an exited process its parent has not reaped yet is not)."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def address(stack: Stack, name: str) -> str:
    """Where a component serves: amqp://, HOST:PORT for the Kafka protocol, http:// (``-`` for the agents)."""
    if name in AGENTS:
        return "-"
    port, broker = stack.ports[name], BROKERS.get(name)
    if broker is not None and broker.amqp:
        return f"amqp://{HOST}:{port}"
    return f"{HOST}:{port}" if name.endswith("broker") or broker is not None else f"http://{HOST}:{port}"


def up(stack: Stack, with_sut: bool = True) -> int:
    """Start what is not running: the telemetry plane, and (``with_sut``) the SUT's broker and receiver, the SUT
    recorded in the stack's folder for the commands after (``core.suts.recorded_sut``)."""
    os.makedirs(stack.dir, exist_ok=True)
    if with_sut:
        suts.record_sut(stack.dir, stack.sut)
    with open(os.path.join(stack.dir, "prometheus.yml"), "w") as f:
        f.write(prometheus_config(stack.ports["node-exporter"], {
            "flightwatch-receiver": stack.ports["http-receiver"], "flightwatch-job": stack.metrics_ports["job"],
            "flightwatch-kafka-receiver": stack.metrics_ports["kafka-receiver"], "flightwatch-node-metrics": stack.metrics_ports["node-metrics"],
            "flightwatch-amqp-receiver": stack.metrics_ports["amqp-receiver"],
            "flightwatch-loadgen": stack.metrics_ports["loadgen"]}))  # the load generator's is up while it attacks
    failed = False
    fresh_broker = False
    mine = {SUTS[stack.sut].broker, SUTS[stack.sut].receiver} if with_sut else set()
    for name, cmd in commands(stack).items():
        if name in SUT_COMPONENTS and name not in mine:
            continue
        if stack.recorded_pid(name):
            print(f"{name:18} {address(stack, name):28} running (pid {stack.recorded_pid(name)})")
            continue
        if cmd is None and name in BROKERS:  # the SUT's broker cannot be had: said in one line
            if BROKERS[name].unavailable:
                print(f"stack: error: {BROKERS[name].unavailable}", file=sys.stderr)
            return 2
        if cmd is None:
            print(f"{name:18} {'-':28} not installed (apt-get install {debian.PACKAGES.get(name.replace('node-exporter', 'prometheus-node-exporter'), name)})")
            continue
        if name not in AGENTS and port_open(stack.ports[name]):
            print(f"{name:18} {address(stack, name):28} port taken by another process: not started", file=sys.stderr)
            failed = True
            continue
        if name.endswith("broker") or name in BROKERS:
            fresh_broker = True
        elif fresh_broker:  # new in-memory brokers: a receiver's old positions in them mean nothing
            for stale in POSITIONS.get(name, ()):
                try:
                    os.remove(os.path.join(stack.dir, name, stale))
                except FileNotFoundError:
                    pass
        log = open(os.path.join(stack.dir, f"{name}.log"), "ab")
        env = dict(os.environ, CLUSTER_ID=f"flightwatch-{name}", PYTHONPATH=ROOT)
        if name == "prometheus":
            env = {**PROMETHEUS_GO_MEMORY, **env}
        elif (broker := BROKERS.get(name)) is not None and broker.environment is not None:
            env = broker.environment(stack, os.path.join(stack.dir, name))
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        write_pid_file(stack.pidfile(name), proc.pid)
        bound_s = BROKERS[name].start_s if name in BROKERS else 15.0
        ok = wait_port(stack.ports[name], bound_s) if name not in AGENTS else _stays_up(proc)
        print(f"{name:18} {address(stack, name):28} {'started' if ok else 'FAILED to start'} (pid {proc.pid}, log {stack.dir}/{name}.log)")
        failed |= not ok
    _write_env(stack)
    return 1 if failed else 0


def _stays_up(proc, seconds: float = 2.0) -> bool:
    try:
        proc.wait(seconds)
        return False
    except subprocess.TimeoutExpired:
        return True


def _write_env(stack: Stack) -> None:
    with open(os.path.join(stack.dir, "addresses.json"), "w") as f:
        json.dump({name: address(stack, name) for name in stack.ports}, f, indent=1)


def _stop(stack: Stack, name: str) -> None:
    pid = stack.recorded_pid(name)
    if pid is None and os.path.exists(stack.pidfile(name)):
        print(f"{name:18} not running (its PID file names no process of ours now: nothing signalled)")
    if pid and name in BROKERS and BROKERS[name].session:  # a script, its VM and helpers: the session it leads
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
        os.remove(stack.pidfile(name))
    except FileNotFoundError:
        pass


def down(stack: Stack) -> int:
    for name in reversed(stack.components()):
        _stop(stack, name)
    suts.record_sut(stack.dir, None)
    return 0


def renew_sut(stack: Stack) -> int:
    """Start the SUT broker empty, and its receiver on it afresh; `make attack` does it first.

    Its memory storage keeps every record and ignores retention, and its CPU grows with what it holds: at
    5,000/s with a consumer, 0.24 core in the first 10 s, 0.42 after 50 s; left running, it held 2.7 GB after
    three runs and each run began where the last had left it. Each attack now starts on the same empty broker,
    as a load test starts on a SUT in a known state. The receiver has recorded every receive by then."""
    sut = SUTS[stack.sut]
    for name in (sut.receiver, sut.broker):
        _stop(stack, name)
    for folder in BROKERS[sut.broker].renew_wipe:  # its queues or log on disk: a new broker starts without them
        shutil.rmtree(os.path.join(stack.dir, sut.broker, folder), ignore_errors=True)
    return up(stack)


def restart(stack: Stack, name: str) -> int:
    """Stop one component and start it again, with the settings of this call (and everything else ``up`` starts)."""
    if name not in stack.components():
        print(f"stack: error: no component {name!r} (one of {', '.join(stack.components())})", file=sys.stderr)
        return 2
    _stop(stack, name)
    return up(stack)


def status(stack: Stack) -> int:
    for name in stack.components():
        pid = stack.recorded_pid(name)
        print(f"{name:18} {address(stack, name):28} {'running (pid %d)' % pid if pid else 'stopped'}")
    return 0


def clean(stack: Stack) -> int:
    """Remove the run folders and the stack's state, unless something of the stack or a run still uses them."""
    from core import observer

    running = [f"{name} (pid {pid})" for name in stack.components() if (pid := stack.recorded_pid(name))]
    running += [f"{role} (pid {pid})" for pid, role in observer.roots(stack.dir).items() if role not in stack.components()]
    if running:
        print(f"stack: error: still running: {', '.join(running)}; `make down` (and stop the runs) first: removing "
              "their state would leave them orphaned", file=sys.stderr)
        return 2
    import glob

    from core.rundir import CHECKPOINTS

    for path in glob.glob(os.path.join(CHECKPOINTS, "*", "")) + [stack.dir]:
        shutil.rmtree(path, ignore_errors=True)
    print(f"removed the run folders ({CHECKPOINTS}) and the stack's state ({stack.dir})")
    return 0


def _parser():
    from stack import cli

    return cli.parser(__doc__, PORT_SETTINGS)


def main(argv=None) -> int:
    try:
        a = _parser().parse_args(argv)
    except SystemExit as e:
        return 2 if e.code else 0
    from stack.cli import problem

    if error := problem(a):
        print(f"stack: error: {error}", file=sys.stderr)
        return 2
    settings.export(a, STACK_SETTINGS)  # for this process and every component it starts: their defaults follow
    stack = Stack.configured(a.sut)  # no --sut nor FLIGHTWATCH_SUT: the one `up --sut` recorded, or tansu
    os.environ["FLIGHTWATCH_SUT"] = stack.sut
    if a.action == "restart":
        return restart(stack, a.component)
    if a.no_sut and a.action != "up":
        print("stack: error: --no-sut is for up (the telemetry plane without a SUT broker)", file=sys.stderr)
        return 2
    actions = {"up": lambda: up(stack, not a.no_sut), "down": lambda: down(stack), "status": lambda: status(stack),
               "renew-sut": lambda: renew_sut(stack), "clean": lambda: clean(stack)}
    return actions[a.action]()


if __name__ == "__main__":
    sys.exit(main())
