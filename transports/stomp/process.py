"""The STOMP receiver agent as a process (``python -m agents.receiver stomp``): its flags, and its subscription
(``transports.stomp.receiver``) served a second at a time, in the process every receiver runs (the runner it is
given, ``agents.runner``).

    main(args, runner)   # 0 when stopped (SIGTERM, Ctrl-C); 2 on bad settings, or a broker that refuses us at the start
"""
from __future__ import annotations

import argparse
import os
import sys

from core import metrics
from core.rundir import ROOT
from core.units import parse_size
from transports.base import Runner
from transports.stomp.receiver import WINDOW_BYTES, StompReceiver
from transports.stomp.target import StompTarget, options

DEFAULT_URL = f"stomp://127.0.0.1:{StompTarget.DEFAULT_PORT}/flightwatch.sut"
CONNECT_S = 15.0
"""How long the first connection may take before the agent gives up (exit 2)."""


def add_flags(q: argparse.ArgumentParser) -> None:
    q.add_argument("--url", default=DEFAULT_URL, metavar="URL",
                   help="the destination to subscribe to, as the load generator's target names it: stomp://USER@HOST:"
                        "PORT/DESTINATION (?type=multicast: a subscription of its own on an address; the password in "
                        "FLIGHTWATCH_TARGET_PASSWORD; default %(default)s, Artemis' STOMP port)")
    q.add_argument("--window", default=f"{WINDOW_BYTES >> 20}MiB", metavar="SIZE",
                   help="bytes the broker may send ahead unacknowledged (Artemis' consumer-window-size; default "
                        "%(default)s)")
    q.add_argument("--state-dir", default=os.path.join(ROOT, ".stack", "receiver-stomp"),
                   help="where the telemetry spool (<state-dir>/spool) and the shipper's log live (default %(default)s)")
    q.add_argument("--spool-budget", default="2GiB", metavar="SIZE",
                   help="disk the telemetry spool may hold while the telemetry broker is away (default %(default)s)")
    q.add_argument("--metrics-listen", type=metrics.listen_arg, default="none", metavar="HOST:PORT",
                   help="serve Prometheus metrics here (default: none)")


def main(a, runner: Runner) -> int:
    from transports.spec import TargetSpec

    try:
        spec = TargetSpec.parse(a.url)
        if spec.scheme != "stomp":
            raise ValueError(f"--url {a.url!r}: a stomp:// URL")
        destination, kind, _ = options(spec.path, spec.query)
        budget_bytes, window = parse_size(a.spool_budget), parse_size(a.window)
        if window < 1:
            raise ValueError("--window must be at least 1 byte")
    except ValueError as e:
        print(f"receiver: error: {e}", file=sys.stderr)
        return 2
    process = runner.Process.in_state_dir(a, budget_bytes)
    receiver = StompReceiver(spec.host, spec.port, spec.userinfo, destination, kind, process.spool, a.agent, window,
                             log=process.log, warn=process.warn)
    try:
        receiver.connect(CONNECT_S)
    except (OSError, ConnectionError) as e:
        print(f"receiver: error: stomp {spec}: {getattr(e, 'strerror', None) or e}", file=sys.stderr)
        process.close()
        return 2
    try:
        process.start(receiver, a.metrics_listen)
        process.log(f"receiver {a.agent}: {destination} ({kind}) at {spec.host}:{spec.port} (window {a.window}, acked "
                    f"once recorded) -> spool {process.spool.dir} -> {a.telemetry_bootstrap}/{a.telemetry_topic}",
                    flush=True)
        process.run_blocking(lambda: receiver.serve(1.0))
    finally:
        receiver.close()
        process.close()
    return 0
