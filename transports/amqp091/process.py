"""The AMQP 0-9-1 receiver agent as a process (``python -m agents.receiver amqp``): its flags, and its consumer
(``transports.amqp091.receiver``) on an asyncio loop, in the process every receiver runs (the runner it is given,
``agents.runner``).

    main(args, runner)   # 0 when stopped (SIGTERM, Ctrl-C); 2 on bad settings, or a broker that refuses us at the start
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys

from core import settings
from core.procs import HOST
from core.units import parse_size
from transports import amqp
from transports.amqp091.receiver import PREFETCH, AmqpReceiver
from transports.base import Runner


def add_flags(q: argparse.ArgumentParser) -> None:
    from core.suts import default_target

    q.add_argument("--url", default=default_target("rabbitmq"), metavar="URL",
                   help="the queue to consume, as the load generator's target names it: amqp://USER:PASS@HOST:PORT/VHOST"
                        "?queue=NAME (or ?exchange=NAME&routing_key=KEY: a queue of its own bound to it; &durable=true, "
                        "&declare=false as for the target; default the stack's RabbitMQ queue)")
    q.add_argument("--prefetch", type=int, default=PREFETCH,
                   help="deliveries the broker may have unacked at the receiver (basic.qos; default %(default)s)")
    q.add_argument("--auto-ack", action="store_true",
                   help="the broker forgets a message once sent (no acks; a message not recorded is lost)")
    amqp.add_amqp_flags(q, "receiver-amqp")


def main(a, runner: Runner) -> int:
    try:
        address, params = amqp.AmqpAddress.from_url(a.url)
        budget_bytes = parse_size(a.spool_budget)
        if a.prefetch < 1:
            raise ValueError("--prefetch must be at least 1")
    except ValueError as e:
        print(f"receiver: error: {e}", file=sys.stderr)
        return 2
    from urllib.parse import urlsplit

    u = urlsplit(a.url)
    where = f"{u.hostname}:{u.port or amqp.default_port(u.scheme)}"
    process = runner.Process.in_state_dir(a, budget_bytes)
    log, warn, spool_dir = process.log, process.warn, process.spool.dir
    receiver = AmqpReceiver(params, address, process.spool, a.agent, a.prefetch, a.auto_ack, log=log, warn=warn)

    async def body(stop: asyncio.Event) -> int:
        try:
            await asyncio.wait_for(receiver.connect(), amqp.CONNECT_S + address.bindings / 50)  # 1,000 bindings: 20 s more
        except (TimeoutError, ConnectionError) as e:
            print(f"receiver: error: amqp {where}{u.path}: " + (str(e) if isinstance(e, ConnectionError) else
                  f"no AMQP 0-9-1 handshake within {amqp.CONNECT_S:g} s: is {where} an AMQP broker?"), file=sys.stderr)
            return 2
        process.start(receiver, a.metrics_listen)
        log(f"receiver {a.agent}: {address.where()} at {where}{' over TLS' if address.tls else ''} (prefetch "
            f"{a.prefetch}, {'auto-ack' if a.auto_ack else 'manual acks'}) -> spool {spool_dir} -> "
            f"{a.telemetry_bootstrap}/{a.telemetry_topic}", flush=True)
        if address.bindings:  # a scenario starts no sender before every queue is bound and consumed
            amqp.write_attached(a.state_dir, address, receiver.consumed_ns)
        await receiver.run(stop)
        return 0

    try:
        return process.run_async(body)
    finally:
        process.close()


def stack_flags(stack) -> list[str]:
    """The stack's receiver of RabbitMQ's queue (``amqp-receiver``): the SUT queue, or with ``--bindings N`` the topic
    exchange's N queues."""
    from core.suts import default_target, routing_target

    bindings = int(settings.get("FLIGHTWATCH_SUT_BINDINGS") or 0)
    return ["--url", routing_target(bindings) if bindings else default_target("rabbitmq"),
            "--state-dir", os.path.join(stack.dir, "amqp-receiver"),
            "--metrics-listen", f"{HOST}:{stack.metrics_ports['amqp-receiver']}"]
