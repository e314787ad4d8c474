"""The AMQP receiver agent as a process (``python -m agents.receiver amqp``): its consumer (``agents.amqp_receiver``),
spool and shipper, /metrics, and the duties every receiver has (clock records, progress lines, lost-line reports).

    main_amqp(args)   # 0 when stopped (SIGTERM, Ctrl-C); 2 on bad settings, or a broker that refuses us at the start
"""
from __future__ import annotations

import asyncio
import os
import signal
import sys

from agents.amqp_receiver import AmqpReceiver
from agents.duties import clock_every
from agents.source import Source
from core import amqp, logs, memory, metrics
from core.units import parse_size

CONNECT_S = 15.0
"""How long the first connection may take before the agent gives up (exit 2)."""


class AmqpExposed:
    """An AMQP receiver's counters (0-9-1's or 1.0's) as Prometheus metrics, read at scrape time, with its shipper's
    (``shared``)."""

    def __init__(self, receiver: Source) -> None:
        self.receiver = receiver
        self.shared = None

    def collect(self):
        return self.own() if self.shared is None else self.shared.collect(self.own())

    def own(self):
        c, agent = self.receiver.counters(), self.receiver.agent
        for name, key, text in (("events", "received", "deliveries recorded (attributed to a run)"),
                                ("unattributed", "unattributed", "deliveries without a run or event ID, not recorded"),
                                ("redelivered", "redelivered", "deliveries the broker marked as redelivered"),
                                ("malformed", "malformed", "deliveries that were no AMQP 1.0 message, accepted and "
                                 "not recorded"),
                                ("connection_losses", "connection_losses", "connections to the broker lost")):
            if key not in c:  # malformed: AMQP 1.0's receiver reads the message itself
                continue
            yield metrics.family("counter", f"flightwatch_amqp_receiver_{name}", text, ["agent"], [((agent,), c[key])])
        yield metrics.family("gauge", "flightwatch_amqp_receiver_connected", "1 while consuming", ["agent"],
                             [((agent,), c["connected"])])
        t = c.get("telemetry", {})
        yield metrics.family("counter", "flightwatch_amqp_receiver_telemetry_records", "receive records spooled, and "
                             "lost past the spool's budget", ["agent", "state"],
                             [((agent, s), t.get(s, 0)) for s in ("spooled", "lost")])


def ship_and_serve(a, spool_dir: str, receiver: Source, log):
    """What both AMQP receivers run once connected: the shipper (the spool into the telemetry topic, in a process of
    its own) and /metrics with the shipper's counters; (shipper, exposed, server)."""
    from agents.shipper import start_shipper

    shipper = start_shipper(spool_dir, a.telemetry_bootstrap, a.telemetry_topic, a.agent,
                            log_path=os.path.join(a.state_dir, "shipper.log"))
    exposed = AmqpExposed(receiver)
    exposed.shared = metrics.Shared()
    return shipper, exposed, metrics.serve(exposed, a.metrics_listen, log=log)


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
    from agents.shipper import stop_shipper
    from agents.spool import SpoolWriter

    metrics.use_shared_dir(os.path.join(a.state_dir, f"{a.agent}.metrics"), clear=True)
    spool_dir = os.path.join(a.state_dir, "spool")
    spool = SpoolWriter(spool_dir, budget_bytes=budget_bytes, agent=a.agent)
    receiver = AmqpReceiver(params, address, spool, a.agent, a.prefetch, a.auto_ack, log=log, warn=warn)
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    shipper = None

    async def run() -> int:
        nonlocal shipper
        try:
            await asyncio.wait_for(receiver.connect(), CONNECT_S + address.bindings / 50)  # 1,000 bindings: 20 s more
        except (TimeoutError, ConnectionError) as e:
            print(f"receiver: error: amqp {where}{u.path}: " + (str(e) if isinstance(e, ConnectionError) else
                  f"no AMQP 0-9-1 handshake within {CONNECT_S:g} s: is {where} an AMQP broker?"), file=sys.stderr)
            return 2
        shipper, exposed, server = ship_and_serve(a, spool_dir, receiver, log)
        log(f"receiver {a.agent}: {address.where()} at {where}{' over TLS' if address.tls else ''} (prefetch {a.prefetch}, "
            f"{'auto-ack' if a.auto_ack else 'manual acks'}) -> spool {spool_dir} -> {a.telemetry_bootstrap}/"
            f"{a.telemetry_topic}", flush=True)
        if address.bindings:  # a scenario starts no sender before every queue is bound and consumed
            amqp.write_attached(a.state_dir, address, receiver.consumed_ns)
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        duties = [asyncio.ensure_future(d) for d in (_every_second(spool, exposed), memory.trim_every(),
                                                     clock_every(spool, a.agent, a.clock_reference, warn),
                                                     _progress(receiver, log))]
        try:
            await receiver.run(stop)
        finally:
            for d in duties:
                d.cancel()
            metrics.stop(server)
            exposed.shared.close()
        return 0

    try:
        code = asyncio.run(run())
    finally:
        spool.report_lost()
        spool.close()
        if shipper is not None:
            stop_shipper(shipper)  # it drains the spool, then exits
    return code


async def _every_second(spool, exposed: AmqpExposed) -> None:
    while True:
        await asyncio.sleep(1.0)
        spool.report_lost()
        exposed.shared.sync(exposed.own())


async def _progress(receiver: Source, log) -> None:
    say = logs.Progress(lambda line: log(line, flush=True))  # every 10 s while it receives, every 10 minutes at idle
    while True:
        await asyncio.sleep(10)
        c = receiver.counters()
        t = c.get("telemetry", {})
        say((c["received"], c["unattributed"], c["redelivered"], c["connection_losses"], t.get("lost", 0)),
            f"receiver {receiver.agent}: {c['received']:,} received, {c['unattributed']:,} without run/event ID, "
            f"{c['redelivered']:,} redelivered, {c['connection_losses']} connections lost; telemetry spooled "
            f"{t.get('spooled', 0):,} lost {t.get('lost', 0):,}")
