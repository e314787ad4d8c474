"""The HTTP CloudEvents sink as a process (``python -m agents.receiver http``): its flags, and the sink
(``transports.http.receiver``) on its HTTP/1.1 server (``transports.http.server``), in the process every receiver runs
(the runner it is given, ``agents.runner``); with ``--workers N``, N such processes sharing the port.

    main(args, runner)   # 0 when stopped (SIGTERM, Ctrl-C); 2 on bad settings or a port it cannot listen on
"""
from __future__ import annotations

import argparse
import os
import signal
import socket
import sys

from core import logs, metrics, settings
from core.procs import HOST
from core.rundir import ROOT
from core.units import parse_duration_ns, parse_size, split_host_port
from transports.base import Runner
from transports.http import receiver as http_receiver
from transports.http import server as http_server


def add_flags(h: argparse.ArgumentParser) -> None:
    settings.add(h, "FLIGHTWATCH_RECEIVER_LISTEN", "--listen", default="127.0.0.1:18080", metavar="HOST:PORT",
                 help="where to listen")
    h.add_argument("--run", default=None, help="run ID for events that carry no ce-fwrun (default: count them as unattributed)")
    settings.add(h, "FLIGHTWATCH_RECEIVER_WORKERS", "--workers", type=int, default=1,
                 help="serving processes sharing the port (SO_REUSEPORT), each its own receiver in the telemetry "
                      "(<agent>-<i>): the Knative method's receivers")
    h.add_argument("--no-telemetry", action="store_true", help="record nothing (to measure the sink's own capacity)")
    h.add_argument("--spool-dir", default=os.path.join(ROOT, ".stack", "spool"),
                   help="where receive records wait for the shipper (one folder per agent; default %(default)s)")
    h.add_argument("--spool-budget", default="2GiB", metavar="SIZE",
                   help="disk the spool may take while the telemetry broker is away (default %(default)s); "
                        "receives over it are counted as lost, in /healthz and in the run's summary")
    limits = http_server.Limits()
    h.add_argument("--head-timeout", default=f"{limits.head_timeout_s:g}s", metavar="DURATION",
                   help="a request's head must be complete this long after its first byte, else 408 and close "
                        "(default %(default)s)")
    h.add_argument("--body-timeout", default=f"{limits.body_timeout_s:g}s", metavar="DURATION",
                   help="a body must be complete within this, or at %d KiB/s of its length if that allows longer, "
                        "else 408 and close (default %%(default)s)" % (limits.body_min_rate // 1024))
    h.add_argument("--max-connections", type=int, default=limits.max_connections, metavar="N",
                   help="open connections per serving process; more are answered 503 and closed, and counted "
                        "(default %(default)s)")


def _positive_s(text: str, flag: str) -> float:
    try:
        ns = parse_duration_ns(text)
    except ValueError as e:
        raise ValueError(f"{flag}: {e}") from None
    if ns <= 0:
        raise ValueError(f"{flag} must be more than 0")
    return ns / 1e9


def _metrics_dir(a) -> str:
    return os.path.join(a.spool_dir, f"{a.agent}.metrics")


def main(a, runner: Runner, log=None) -> int:
    try:
        host, port = split_host_port(a.listen, "--listen")
    except ValueError as e:
        print(f"receiver: error: {e}", file=sys.stderr)
        return 2
    if a.workers < 1:
        print("receiver: error: --workers must be at least 1", file=sys.stderr)
        return 2
    try:
        a.spool_budget_bytes = parse_size(a.spool_budget)
    except ValueError as e:
        print(f"receiver: error: --spool-budget: {e}", file=sys.stderr)
        return 2
    try:
        a.limits = http_server.Limits(head_timeout_s=_positive_s(a.head_timeout, "--head-timeout"),
                                        body_timeout_s=_positive_s(a.body_timeout, "--body-timeout"),
                                        max_connections=a.max_connections)
        if a.max_connections < 1:
            raise ValueError("--max-connections must be at least 1")
    except ValueError as e:
        print(f"receiver: error: {e}", file=sys.stderr)
        return 2
    metrics.use_shared_dir(_metrics_dir(a), clear=True)  # the workers' and shippers' counters meet there
    if a.workers > 1:
        return _serve_workers(a, runner, host, port)
    return serve_one(a, runner, host, port, a.agent, reuse_port=False, log=log)


def serve_one(a, runner: Runner, host: str, port: int, agent: str, reuse_port: bool, log=None) -> int:
    """One serving process: the sink as ``agent`` on ``host:port``."""
    logger = logs.setup(agent)
    log = log or logs.printer(logger)
    spool_dir = None if a.no_telemetry else os.path.join(a.spool_dir, agent)
    process = runner.Process(a, agent, spool_dir, a.spool_budget_bytes, os.path.join(a.spool_dir, f"{agent}.shipper.log"),
                             log, logs.printer(logger, logs.WARNING))
    receiver = http_receiver.HttpReceiver(process.spool, agent, a.run)
    receiver.shared = process.shared  # /metrics is the sink's own port: every worker's and shipper's counters

    async def body(stop) -> int:
        process.start(receiver)
        await http_server.serve(receiver, host, port, reuse_port=reuse_port, stop=stop, limits=a.limits,
                                ready=lambda: log(f"receiver {agent}: http://{host}:{port}/ -> " + (
                                    "(no telemetry)" if process.spool is None else
                                    f"spool {process.spool.dir} -> {a.telemetry_bootstrap}/{a.telemetry_topic}"),
                                    flush=True))
        return 0

    try:
        return process.run_async(body)
    except OSError as e:
        print(f"receiver: error: cannot listen on {host}:{port}: {e.strerror or e}", file=sys.stderr)
        return 2
    finally:
        process.close()


def _serve_workers(a, runner: Runner, host: str, port: int) -> int:
    """N serving processes on one port (SO_REUSEPORT); each writes telemetry as ``<agent>-<i>``."""
    import multiprocessing as mp

    probe = socket.socket()
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers bind: a restart's old connections
    try:                                                          # in TIME_WAIT do not hold the port
        probe.bind((host, port))
    except OSError as e:
        print(f"receiver: error: cannot listen on {host}:{port}: {e.strerror or e}", file=sys.stderr)
        return 2
    finally:
        probe.close()
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=serve_one, args=(a, runner, host, port, f"{a.agent}-{i}", True), daemon=False)
             for i in range(a.workers)]
    for p in procs:
        p.start()
    signal.signal(signal.SIGTERM, lambda *_: [os.kill(p.pid, signal.SIGTERM) for p in procs if p.is_alive()])
    for p in procs:
        p.join()
    return max((p.exitcode or 0) for p in procs)


def stack_flags(stack) -> list[str]:
    """The stack's CloudEvents sink (``http-receiver``) on its port."""
    return ["--listen", f"{HOST}:{stack.ports['http-receiver']}", "--spool-dir", os.path.join(stack.dir, "spool")]
