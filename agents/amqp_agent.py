"""The AMQP 0-9-1 receiver agent as a process (``python -m agents.receiver amqp``): its consumer
(``transports.amqp091.receiver``) on an asyncio loop, in the process every receiver runs (``agents.runner``).

    main_amqp(args)   # 0 when stopped (SIGTERM, Ctrl-C); 2 on bad settings, or a broker that refuses us at the start
"""
from __future__ import annotations

import asyncio
import sys

from agents.runner import Process, state_paths
from core import logs
from core.units import parse_size
from transports import amqp
from transports.amqp091.receiver import AmqpReceiver

CONNECT_S = 15.0
"""How long the first connection may take before the agent gives up (exit 2)."""


def main_amqp(a) -> int:
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
    logger = logs.setup(a.agent)
    log, warn = logs.printer(logger), logs.printer(logger, logs.WARNING)
    spool_dir, shipper_log, metrics_dir = state_paths(a.state_dir, a.agent)
    process = Process(a, a.agent, spool_dir, budget_bytes, shipper_log, log, warn, metrics_dir=metrics_dir)
    receiver = AmqpReceiver(params, address, process.spool, a.agent, a.prefetch, a.auto_ack, log=log, warn=warn)

    async def body(stop: asyncio.Event) -> int:
        try:
            await asyncio.wait_for(receiver.connect(), CONNECT_S + address.bindings / 50)  # 1,000 bindings: 20 s more
        except (TimeoutError, ConnectionError) as e:
            print(f"receiver: error: amqp {where}{u.path}: " + (str(e) if isinstance(e, ConnectionError) else
                  f"no AMQP 0-9-1 handshake within {CONNECT_S:g} s: is {where} an AMQP broker?"), file=sys.stderr)
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
