"""The receiver follows the target: a receiver agent consumes exactly where the load goes, for the run.

Without one, every event the system under test took is counted as dropped and the verdict blames a healthy broker
(5,000 of 5,000 "dropped" on a topic of the user's that nobody consumed). Before the attack:

    receiver = follow.start(cfg, no_receiver=False, log=print)   # None: the stack's is there, or none is needed
    ...attack, and the job closes the run...
    follow.stop(receiver)                                         # by its PID; its spool drains to the telemetry

- A receiver of the embedded stack (``make up``) already on the target's place is used: its command line, read from
  the PID it recorded, names the place it consumes.
- Otherwise one is started for the run (``python -m agents.receiver`` with the target's ``receiver_args``): for a
  Kafka topic, each partition taken up at its end when the run began, so what the topic held before is left alone;
  for AMQP 0-9-1 the queue (or a queue of its own bound to the exchange), for AMQP 1.0 a link on the address (each
  pair's). A login's password reaches it in its environment, never on its command line (``core.secrets``). Its
  state and log are the run folder's ``receiver/``; the attack starts once it serves its metrics (positioned).
- Consumers of the place that are not flightwatch's (an AMQP 0-9-1 queue's count) are named in a warning: each takes
  events that will count as dropped.
- ``--receiver none`` (the load generator's default; ``make attack`` passes ``auto``): receivers run elsewhere, the
  user's own (on their hosts, behind their system), a test's, or a deployment's (``deploy/``).

An HTTP target's receiver cannot be started here: the system under test delivers to flightwatch's HTTP receiver
(a Knative Trigger's subscriber), and the probe (``loadgen.probe``) tells whether it does.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

from core import secrets
from core.observer import STACK_DIR
from core.procs import HOST, child_pythonpath, free_port, pid_from_file
from core.rundir import CHECKPOINTS, ROOT, RunPaths
from core.units import parse_duration_ns
from transports.errors import UsageError
from transports.registry import RECEIVERS, TargetSpec, transport

STACK_RECEIVERS = ("kafka-receiver", "amqp-receiver", "amqp1-receiver")
"""The embedded stack's receivers of a broker (``stack.__main__``), each recorded in ``<stack>/<name>.pid``."""
READY_S = 60.0
"""How long a started receiver may take to serve its metrics (positioned on the topic) before the attack gives up."""
STOP_S = 60.0
"""How long a stopped receiver may take to drain its spool to the telemetry broker before it is killed."""
MAX_RECEIVERS = 32
AGENT = "receiver-{mode}-run"
"""The started receiver's name in its records: not the stack's own receiver's (``receiver-kafka``)."""


def add_flags(a) -> None:
    """The load generator's flags for the run's receiver and the probe."""
    a.add_argument("--receiver", choices=("auto", "none"), default="none",
                   help="auto: make sure a receiver consumes where a broker target's load goes (a Kafka topic, an AMQP "
                        "queue or address): the stack's when it is on that place, else one started for the run (a "
                        "topic from its end when the run begins) and "
                        "stopped after it (make attack's default). none (the default here): receivers run elsewhere "
                        "(the stack's, your hosts', a test's own, or behind an HTTP sink your system delivers to)")
    a.add_argument("--no-receiver", dest="receiver", action="store_const", const="none",
                   help="the same as --receiver none")
    a.add_argument("--receivers", type=_count, default=1, metavar="N",
                   help="with --receiver auto: N competing receivers started for the run (an AMQP queue's or "
                        "address' consumers; a Kafka topic's partitions split between them), when one would be the "
                        "limit (default %(default)s)")
    a.add_argument("--probe-timeout", default="0s", metavar="DURATION",
                   help="before the load, send a few probe events (a run of their own, never in this run's figures) "
                        "and wait this long for a receiver to record one; none did: one line and exit 2, nothing of "
                        "the load sent (make attack: 10s; default 0s: no probe)")


def _count(text: str) -> int:
    import argparse

    if not text.isdigit() or not 1 <= int(text) <= MAX_RECEIVERS:
        raise argparse.ArgumentTypeError(f"{text!r}: a number of receivers, 1 to {MAX_RECEIVERS}")
    return int(text)


def probe_seconds(a) -> float:
    """``--probe-timeout`` in seconds (0: no probe); ``UsageError`` on a bad one."""
    try:
        seconds = parse_duration_ns(a.probe_timeout) / 1e9
    except ValueError as e:
        raise UsageError(f"--probe-timeout: {e}") from None
    if seconds > 0 and a.no_telemetry:
        raise UsageError("--probe-timeout reads the receivers' records in the telemetry: not with --no-telemetry")
    return max(seconds, 0.0)


def probe(cfg, seconds: float, log=print) -> None:
    """The probe before the load (``loadgen.probe``), when asked for."""
    if seconds > 0:
        from loadgen.probe import probe_receivers

        probe_receivers(cfg, seconds, log=log)


class RunReceiver:
    """The receiver agents started for one run: their processes and their metrics ports."""

    def __init__(self, procs: list[subprocess.Popen], ports: list[int]) -> None:
        self.procs, self.ports = procs, ports

    def received(self) -> int | None:
        """The events they have recorded so far (their /metrics), or None if one does not answer."""
        total = 0
        for port in self.ports:
            try:
                text = urllib.request.urlopen(f"http://{HOST}:{port}/metrics", timeout=2).read().decode()
            except OSError:
                return None
            total += int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                             if line.startswith("flightwatch_") and "_receiver_events_total{" in line))
        return total


def _place(spec: TargetSpec) -> TargetSpec:
    """The target as a place to consume: its host by address (``localhost`` and ``127.0.0.1`` are one place)."""
    try:
        host = socket.gethostbyname(spec.host)
    except OSError:
        host = spec.host
    return TargetSpec(spec.scheme, host, spec.port, spec.path, None, spec.query)


def stack_receiver_on(target: TargetSpec, stack_dir: str | None = None) -> str | None:
    """The stack's receiver that consumes where ``target``'s load goes (its name), or None. Its place is read from its
    command line (by the PID it recorded), as its transport's ``receiver_place`` reads it."""
    import psutil

    want = _place(target)
    for name in STACK_RECEIVERS:
        pid = pid_from_file(os.path.join(stack_dir or STACK_DIR, f"{name}.pid"))
        if pid is None:
            continue
        try:
            argv = psutil.Process(pid).cmdline()
        except psutil.Error:
            continue
        at = next((i for i, a in enumerate(argv[:-1]) if a == "agents.receiver"), None)
        kind = RECEIVERS.get(argv[at + 1]) if at is not None else None
        url = kind.target.receiver_place(argv[at + 2:]) if kind is not None else None
        try:
            if url is not None and _place(TargetSpec.parse(url)) == want:
                return name
        except ValueError:
            continue
    return None


def start(cfg, no_receiver: bool, log=print, count: int = 1) -> RunReceiver | None:
    """``count`` receivers for the run where its load goes, started and positioned, unless the stack's is there, the
    user's are (``no_receiver``), or the target's transport has none to start; ``UsageError`` (one line) if one will
    not start."""
    kind = transport(cfg.target.scheme)
    args = kind.receiver_args(cfg.target)
    if no_receiver or args is None or not cfg.telemetry_bootstrap:
        return None
    if (name := stack_receiver_on(cfg.target)) is not None:
        log(f"receiver: the stack's {name} consumes {cfg.target}")
        _warn_others(cfg.target, 1, log)
        return None
    _warn_others(cfg.target, 0, log)
    try:
        shares = [kind.share_args(cfg.target, i, count) for i in range(count)]
    except ValueError as e:
        raise UsageError(f"--receivers {count}: {e}") from None
    paths = RunPaths.of_run(cfg.run_id, CHECKPOINTS)
    env = secrets.child_env(cfg.target.userinfo, dict(os.environ, PYTHONPATH=child_pythonpath(ROOT)))
    if cfg.sut_kafka_options:  # a Kafka target's login and TLS (--kafka-option), for the receiver's consumer too
        from core.kafka_options import SUT_ENV

        env[SUT_ENV] = ",".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}"
                                for k, v in cfg.sut_kafka_options.items() if k != "logger")
    r = RunReceiver([], [])
    for i in range(count):  # one after the other: each positioned before the next starts
        folder = paths.receiver if count == 1 else os.path.join(paths.receiver, str(i))
        os.makedirs(folder, exist_ok=True)
        port, log_path = free_port(), os.path.join(folder, "receiver.log")
        agent = AGENT.format(mode=args[0]) + ("" if count == 1 else f"-{i}")
        argv = [sys.executable, "-m", "agents.receiver", *args, *shares[i], "--state-dir", folder,
                "--telemetry-bootstrap", cfg.telemetry_bootstrap, "--telemetry-topic", cfg.telemetry_topic,
                "--agent", agent, "--metrics-listen", f"{HOST}:{port}"]
        with open(log_path, "ab") as out:
            r.procs.append(subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                            start_new_session=True, env=env))
        r.ports.append(port)
        deadline = time.monotonic() + READY_S
        while r.received() is None:
            if r.procs[-1].poll() is not None or time.monotonic() > deadline:
                stop(r)
                raise UsageError(f"the receiver for {cfg.target} did not start: {_last_line(log_path)} "
                                 f"(see {log_path})")
            time.sleep(0.2)
        log(f"receiver: started for the run on {cfg.target} (pid {r.procs[-1].pid}, {agent}, log {log_path}); "
            "stopped after it (--receiver none: yours record the receives)")
    return r


def _warn_others(target: TargetSpec, ours: int, log) -> None:
    """A warning when the target's place has consumers other than flightwatch's ``ours`` (its transport tells)."""
    n = transport(target.scheme).consumers(target)
    if n is not None and n > ours:
        others = n - ours
        log(f"receiver: warning: {target} has {others} consumer{'s' if others > 1 else ''} besides flightwatch's: "
            f"{'they take' if others > 1 else 'it takes'} events that flightwatch will count as dropped (stop "
            f"{'them' if others > 1 else 'it'}, or aim the load at a queue of its own)")


def _last_line(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            lines = [line.strip() for line in f if line.strip()]
    except OSError:
        return "no log"
    return lines[-1] if lines else "it wrote nothing"


def settle(r: RunReceiver | None, within_s: float, quiet_s: float = 2.0) -> None:
    """Without the run's job to wait for: until ``r`` has recorded nothing new for ``quiet_s`` (the SUT delivered
    what it will), or ``within_s`` (the send timeout) passed."""
    if r is None:
        return
    deadline = time.monotonic() + within_s
    last, since = r.received(), time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - since < quiet_s:
        time.sleep(0.25)
        if (now := r.received()) != last:
            last, since = now, time.monotonic()


def stop(r: RunReceiver | None, log=None) -> None:
    """Stop the receivers started for the run, by their PIDs: SIGTERM (each shipper drains its spool first), then
    SIGKILL of a session after ``STOP_S``."""
    running = [p for p in (r.procs if r is not None else ()) if p.poll() is None]
    if not running:
        return
    received = r.received()
    for p in running:
        p.send_signal(signal.SIGTERM)
    for p in running:
        try:
            p.wait(STOP_S)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    if log is not None:
        pids = ", ".join(str(p.pid) for p in running)
        log(f"receiver: stopped (pid{'s' if len(running) > 1 else ''} {pids})"
            + ("" if received is None else f", {received:,} events recorded"))
