"""The AMQP 1.0 receiver agent as a process (``python -m agents.receiver amqp1``): its flags, and its consumer
(``transports.amqp1.receiver``) served a second at a time, in the process every receiver runs (the runner it is given,
``agents.runner``).

    main(args, runner)   # 0 when stopped (SIGTERM, Ctrl-C); 2 on bad settings, or a broker that refuses us at the start
"""
from __future__ import annotations

import argparse
import os
import sys

from core.procs import HOST
from core.units import parse_size
from transports import amqp
from transports.amqp1.receiver import PREFETCH, Amqp1Receiver
from transports.base import Runner


def add_flags(q: argparse.ArgumentParser) -> None:
    from core.suts import default_target

    q.add_argument("--url", default=default_target("rabbitmq-amqp1"), metavar="URL",
                   help="the address to consume, as the load generator's target names it: amqp1://USER:PASS@HOST:PORT/"
                        "ADDRESS (RabbitMQ 3.x: //queue/NAME; Artemis: the queue's name; ?durable=true as for the "
                        "target: a durable terminus, so RabbitMQ's plugin declares its queue durable; default the "
                        "stack's RabbitMQ queue over AMQP 1.0)")
    q.add_argument("--prefetch", type=int, default=PREFETCH,
                   help="the link's credit: messages the broker may send ahead (default %(default)s)")
    amqp.add_amqp_flags(q, "receiver-amqp1")


def main(a, runner: Runner) -> int:
    try:
        address, host, port, userinfo = amqp.Amqp1Address.from_url(a.url)
        budget_bytes = parse_size(a.spool_budget)
        if a.prefetch < 1:
            raise ValueError("--prefetch must be at least 1")
    except ValueError as e:
        print(f"receiver: error: {e}", file=sys.stderr)
        return 2
    process = runner.Process.in_state_dir(a, budget_bytes)
    log, warn, spool_dir = process.log, process.warn, process.spool.dir
    receiver = Amqp1Receiver(host, port, userinfo, address, process.spool, a.agent, a.prefetch, log=log, warn=warn)
    try:
        receiver.connect(amqp.CONNECT_S + address.pairs / 100)  # 1,000 links: 10 s more
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


def stack_flags(stack) -> list[str]:
    """The stack's receiver of an AMQP 1.0 address (``amqp1-receiver``): its SUT's queue (Artemis', or RabbitMQ's
    over its plugin), on ``--pairs N`` addresses."""
    from core import settings
    from core.suts import SUTS, default_target, pairs_target

    sut = stack.sut if SUTS[stack.sut].receiver == "amqp1-receiver" else "rabbitmq-amqp1"
    return ["--url", pairs_target(default_target(sut), int(settings.get("FLIGHTWATCH_SUT_PAIRS") or 1)),
            "--state-dir", os.path.join(stack.dir, "amqp1-receiver"),
            "--metrics-listen", f"{HOST}:{stack.metrics_ports['amqp1-receiver']}"]
