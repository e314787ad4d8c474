"""The AMQP 1.0 receiver agent as a process (``python -m agents.receiver amqp1``): its consumer
(``agents.amqp1_receiver``), spool and shipper, /metrics (``agents.amqp_agent.AmqpExposed``), and the duties every
receiver has, between turns of its connection.

    main_amqp1(args)   # 0 when stopped (SIGTERM, Ctrl-C); 2 on bad settings, or a broker that refuses us at the start
"""
from __future__ import annotations

import os
import signal
import sys
import time

from agents.amqp1_receiver import Amqp1Receiver
from agents.amqp_agent import CONNECT_S, ship_and_serve
from core import amqp, clock, contract, logs, memory, metrics
from core.units import parse_size


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
    from agents.shipper import stop_shipper
    from agents.spool import SpoolWriter

    metrics.use_shared_dir(os.path.join(a.state_dir, f"{a.agent}.metrics"), clear=True)
    spool_dir = os.path.join(a.state_dir, "spool")
    spool = SpoolWriter(spool_dir, budget_bytes=budget_bytes, agent=a.agent)
    receiver = Amqp1Receiver(host, port, userinfo, address, spool, a.agent, a.prefetch, log=log, warn=warn)
    try:
        receiver.connect(CONNECT_S + address.pairs / 100)  # 1,000 links: 10 s more
    except ConnectionError as e:
        print(f"receiver: error: amqp1 {host}:{port} {address.address}: {e}", file=sys.stderr)
        receiver.close()
        spool.close()
        return 2
    shipper, exposed, server = ship_and_serve(a, spool_dir, receiver, log)
    where = address.address if address.pairs == 1 else (
        f"{address.pairs:,} pairs' addresses {address.address}.0 ... .{address.pairs - 1}, every link attached")
    log(f"receiver {a.agent}: {where} at {host}:{port} (prefetch {a.prefetch}, accepted once "
        f"recorded) -> spool {spool_dir} -> {a.telemetry_bootstrap}/{a.telemetry_topic}", flush=True)
    if address.pairs > 1:
        amqp.write_attached(a.state_dir, address, receiver.link.attached_ns)
    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    say = logs.Progress(lambda line: log(line, flush=True))
    last_clock = last_progress = last_trim = 0.0
    try:
        while not stopping:
            receiver.serve(1.0)
            spool.report_lost()
            exposed.shared.sync(exposed.own())
            now = time.monotonic()
            if now - last_clock >= clock.REPORT_EVERY_S:
                clock.report(lambda rec: spool.append(contract.encode([rec]).decode().rstrip("\n")), a.agent,
                             a.clock_reference, warn)
                last_clock = now
            if now - last_progress >= 10:  # every 10 s while it receives, every 10 minutes at idle
                c = receiver.counters()
                say((c["received"], c["unattributed"], c["malformed"], c["connection_losses"], c["telemetry"]["lost"]),
                    f"receiver {a.agent}: {c['received']:,} received, {c['unattributed']:,} without run/event ID, "
                    f"{c['malformed']:,} malformed, "
                    f"{c['connection_losses']} connections lost; telemetry spooled {c['telemetry']['spooled']:,} "
                    f"lost {c['telemetry']['lost']:,}")
                last_progress = now
            if now - last_trim >= memory.trim_interval_s():
                memory.trim(collect=True)
                last_trim = now
    except KeyboardInterrupt:
        pass
    finally:
        metrics.stop(server)
        exposed.shared.close()
        receiver.close()
        spool.report_lost()
        spool.close()
        stop_shipper(shipper)  # it drains the spool, then exits
    return 0
