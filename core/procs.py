"""Process and port helpers: every server here listens on loopback, every process is stopped by its PID."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time

from core import settings

HOST = "127.0.0.1"
JOB_METRICS_PORT = 19401
KAFKA_RECEIVER_METRICS_PORT = 19402
NODE_METRICS_PORT = 19403
LOADGEN_METRICS_PORT = 19404
AMQP_RECEIVER_METRICS_PORT = 19405
"""Where each long-running process serves ``/metrics`` by default (the HTTP receiver serves it on its own port)."""


def telemetry_bootstrap() -> str:
    """The telemetry broker by default: FLIGHTWATCH_BOOTSTRAP, else the embedded one's port (FLIGHTWATCH_TELEMETRY_PORT,
    19092) on loopback: moving the stack's broker moves every command's default with it."""
    return settings.get("FLIGHTWATCH_BOOTSTRAP") or f"{HOST}:{settings.get('FLIGHTWATCH_TELEMETRY_PORT', '19092')}"


def sut_bootstrap() -> str:
    """The system under test's broker by default: FLIGHTWATCH_SUT_BOOTSTRAP, else the embedded SUT broker's port
    (FLIGHTWATCH_SUT_PORT, 29092) on loopback."""
    return settings.get("FLIGHTWATCH_SUT_BOOTSTRAP") or f"{HOST}:{settings.get('FLIGHTWATCH_SUT_PORT', '29092')}"
"""Where a streaming job serves its live figures for Prometheus by default (``streaming.metrics``)."""


def write_pid_file(path: str, pid: int) -> None:
    """Record a process as ``PID START-TIME NAME``: enough to tell it, later, from another process that got its PID
    (after a reboot, or once PIDs wrap)."""
    import psutil

    p = psutil.Process(pid)
    with open(path, "w") as f:
        f.write(f"{pid} {p.create_time():.3f} {p.name()}\n")


def pid_from_file(path: str) -> int | None:
    """The PID a file of ``write_pid_file`` records, if that very process still runs: same PID, same start time,
    same name; else None (no file, or the PID is another process now: never to be signalled)."""
    import psutil

    try:
        pid_text, started, name = open(path).read().split(maxsplit=2)
        p = psutil.Process(int(pid_text))
        # the kernel's name is 15 characters; psutil completes a longer one from the command line once it can read it
        if abs(p.create_time() - float(started)) < 0.01 and p.name()[:15] == name.strip()[:15]:
            return p.pid
    except (OSError, ValueError, psutil.Error):
        pass
    return None


def port_open(port: int, host: str = HOST) -> bool:
    try:
        socket.create_connection((host, port), timeout=0.5).close()
        return True
    except OSError:
        return False


def wait_port(port: int, seconds: float = 15.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if port_open(port):
            return True
        time.sleep(0.1)
    return False


def stop_process(proc, sig: int = signal.SIGTERM, wait_s: float = 10.0, group: bool = False) -> None:
    """Stop a process we started, by its PID: ``sig``, then SIGKILL (its whole group if ``group``) after ``wait_s``."""
    if proc.poll() is not None:
        return
    os.kill(proc.pid, sig)
    try:
        proc.wait(wait_s)
    except subprocess.TimeoutExpired:
        (os.killpg if group else os.kill)(proc.pid, signal.SIGKILL)
        proc.wait()


def lower_priority(nice: int) -> str | None:
    """Lower this process's CPU priority by ``nice`` (0-19), so that what it does yields the CPU to the SUT and the
    receivers; a line saying where it does not, else None.

    With autogroup scheduling on (``/proc/sys/kernel/sched_autogroup_enabled``, the default of most distributions and
    of these VMs), a nice value weighs only against the other processes of the same session: each session is one
    group, and groups share the CPU by their own nice (``/proc/self/autogroup``). Measured here, three hogs at nice 10 in
    sessions of their own delayed a nice-0 process's wake-ups as much as three at nice 0 (p99.9 3.8 ms either way).
    So a process that leads its own session (the stack, the load generator and the tests start the job so) lowers
    its group's nice too."""
    level = os.nice(nice)
    if os.getsid(0) != os.getpid():
        return (None if not nice or not _autogroup_on() else
                f"nice {level} weighs only within this process's session (autogroup scheduling): start it in its "
                "own session (setsid) for it to yield to processes outside it")
    try:
        with open("/proc/self/autogroup", "w") as f:
            f.write(str(level))
    except OSError:  # a kernel without autogroups: the process's nice is all there is
        pass
    return None


def _autogroup_on() -> bool:
    try:
        with open("/proc/sys/kernel/sched_autogroup_enabled") as f:
            return f.read().strip() == "1"
    except OSError:
        return False


def free_port() -> int:
    """A loopback port nothing listens on right now."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def free_ports(n: int) -> list[int]:
    """``n`` loopback ports nothing listens on right now, all different: held open together while the kernel picks
    them (``free_port`` called ``n`` times may give one twice)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind((HOST, 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


WAIT_ENV = "FLIGHTWATCH_WAIT"
DEFAULT_WAIT = "10m"
"""How long a process waits for the servers it needs (its target, its broker) before it gives up: on a cluster that
is still starting (Strimzi takes minutes) a load generator that gave up at once would burn its Job's retries."""


def tcp_unreachable(host: str, port: int, timeout_s: float = 3.0) -> str | None:
    """None if a TCP connection to host:port opens, else why not."""
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
        return None
    except OSError as e:
        return e.strerror or str(e)


def servers_unreachable(servers: str, timeout_s: float = 3.0) -> str | None:
    """None if one of ``HOST:PORT[,HOST:PORT...]`` (Kafka bootstrap servers) takes a TCP connection, else why not."""
    why = "no server given"
    for server in servers.split(","):
        host, _, port = server.strip().rpartition(":")
        try:
            why = tcp_unreachable(host or HOST, int(port), timeout_s)
        except ValueError:
            why = f"{server.strip()!r} is not HOST:PORT"
        if why is None:
            return None
    return why


def wait_for(checks: dict, bound_s: float, log=print, first_s: float = 0.5, most_s: float = 10.0) -> tuple[str, str] | None:
    """Wait until every check passes: ``checks`` maps what is waited for ("target http://...") to a function giving
    None once it is reachable, else why not. Tries again with backoff (``first_s`` doubling to ``most_s``) and logs
    each wait in one line; gives up after ``bound_s``. Returns None, or (what, why) of the first still failing."""
    deadline = time.monotonic() + bound_s
    delay = first_s
    while True:
        failing = [(what, why) for what, check in checks.items() if (why := check())]
        if not failing:
            return None
        left = deadline - time.monotonic()
        if left <= 0:
            return failing[0]
        pause = min(delay, left)
        log(f"waiting for {', '.join(f'{what} ({why})' for what, why in failing)}; next try in {pause:.1f} s, "
            f"giving up in {left:.0f} s")
        time.sleep(pause)
        delay = min(delay * 2, most_s)


def start_server(cmd: list[str], port: int, start_s: float, what: str, log=subprocess.DEVNULL,
                 env: dict | None = None) -> subprocess.Popen:
    """A server (a broker: a script, its VM, its helpers) in a session of its own, once it listens on ``port``;
    ``RuntimeError`` (the session killed) if it does not within ``start_s``. Stop it with ``stop_session``."""
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    if not wait_port(port, start_s):
        stop_session(proc.pid, kill=True)
        raise RuntimeError(f"{what} did not listen on port {port} within {start_s:.0f} s")
    return proc


def stop_session(pid: int, kill: bool = False, wait_s: float = 30.0) -> None:
    """Stop every process of the session that ``pid`` leads (a broker started with ``start_new_session``: its
    script, its VM, its helpers): SIGTERM (``kill``: SIGKILL at once, as a crash), then SIGKILL after ``wait_s``."""
    try:
        os.killpg(pid, signal.SIGKILL if kill else signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if _group_gone(pid):
            return
        time.sleep(0.1)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _group_gone(pgid: int) -> bool:
    """Whether every process left in the group is a zombie (exited, not yet reaped)."""
    import psutil

    for p in psutil.process_iter(["status"]):
        try:
            if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                return False
        except (ProcessLookupError, PermissionError):
            continue
    return True


def child_pythonpath(root: str) -> str:
    """A child's PYTHONPATH: the project (``root``) first, then this process' own, so that what the user made
    importable (a transport of their own: ``transports.registry.more``) is in the child too."""
    return os.pathsep.join(dict.fromkeys(filter(None, [root, *os.environ.get("PYTHONPATH", "").split(os.pathsep)])))
