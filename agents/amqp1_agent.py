"""The AMQP 1.0 receiver agent as a process (``python -m agents.receiver amqp1``): its consumer
(``transports.amqp1.receiver``) served a second at a time, in the process every receiver runs (``agents.runner``).

    main_amqp1(args)   # 0 when stopped (SIGTERM, Ctrl-C); 2 on bad settings, or a broker that refuses us at the start
"""
from __future__ import annotations

import sys

from agents.amqp_agent import CONNECT_S
from agents.runner import Process, state_paths
from core import logs
from core.units import parse_size
from transports import amqp
from transports.amqp1.receiver import Amqp1Receiver


def main_amqp1(a) -> int:
    try:
        address, host, port, userinfo = amqp.Amqp1Address.from_url(a.url)
        budget_bytes = parse_size(a.spool_budget)
        if a.prefetch < 1:
            raise ValueError("--prefetch must be at least 1")
    except ValueError as e:
        print(f"receiver: error: {e}", file=sys.stderr)
        return 2
    logger = logs.setup(a.agent)
    log, warn = logs.printer(logger), logs.printer(logger, logs.WARNING)
    spool_dir, shipper_log, metrics_dir = state_paths(a.state_dir, a.agent)
    process = Process(a, a.agent, spool_dir, budget_bytes, shipper_log, log, warn, metrics_dir=metrics_dir)
    receiver = Amqp1Receiver(host, port, userinfo, address, process.spool, a.agent, a.prefetch, log=log, warn=warn)
    try:
        receiver.connect(CONNECT_S + address.pairs / 100)  # 1,000 links: 10 s more
    except ConnectionError as e:
        print(f"receiver: error: amqp1 {host}:{port} {address.address}: {e}", file=sys.stderr)
        receiver.close()
        process.close()
        return 2
    try:
        process.start(receiver, a.metrics_listen)
        where = address.address if address.pairs == 1 else (
            f"{address.pairs:,} pairs' addresses {address.address}.0 ... .{address.pairs - 1}, every link attached")
        log(f"receiver {a.agent}: {where} at {host}:{port} (prefetch {a.prefetch}, accepted once "
            f"recorded) -> spool {spool_dir} -> {a.telemetry_bootstrap}/{a.telemetry_topic}", flush=True)
        if address.pairs > 1:
            amqp.write_attached(a.state_dir, address, receiver.link.attached_ns)
        process.run_blocking(lambda: receiver.serve(1.0))
    finally:
        receiver.close()
        process.close()
    return 0
