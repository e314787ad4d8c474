"""Receiver agents: record the receive time of every event the system under test delivers.

Usage:
    python -m agents.receiver http  [--listen 127.0.0.1:18080] [--run RUN] [--workers N]
    python -m agents.receiver kafka [--bootstrap 127.0.0.1:29092] [--topic flightwatch.sut] [--state-dir DIR]
    python -m agents.receiver amqp  [--url 'amqp://guest:guest@127.0.0.1:29672/%2F?queue=flightwatch.sut'] [--prefetch N]
    python -m agents.receiver amqp1 --url amqp1://USER:PASS@HOST:PORT/ADDRESS [--prefetch N]
    python -m agents.receiver stomp --url stomp://USER@HOST:PORT/DESTINATION [--window SIZE]
    (all: [--telemetry-bootstrap 127.0.0.1:19092] [--telemetry-topic flightwatch.telemetry] [--agent NAME])

``http`` is a CloudEvents sink (``transports.http.receiver``): point a Knative trigger, a
broker's subscriber or the load generator at it. ``kafka`` consumes a topic of the SUT
(``transports.kafka.receiver``), ``amqp`` a RabbitMQ queue (``transports.amqp091.receiver``), ``amqp1`` an AMQP 1.0
address (``transports.amqp1.receiver``), ``stomp`` a STOMP destination (``transports.stomp.receiver``).
Each writes receive records into the telemetry topic and, every 5 s, a clock record: this
host's clock offset against the clock reference (``core.clock``) that the node-metrics
agent serves, so latencies measured across hosts are corrected (``streaming.clocks``). Each mode is a transport's
(``transports.registry.RECEIVERS``): its flags and its process, which runs in the one receiver process
(``agents.runner``) this command gives it.
"""
from __future__ import annotations

import argparse
import sys

from agents import runner
from core import settings
from core.cli import OneLineParser, add_clock_reference, add_telemetry
from transports.registry import PROBLEM, RECEIVERS


def _parser() -> argparse.ArgumentParser:
    ap = OneLineParser(prog="python -m agents.receiver", description=__doc__.split("\n\n")[0],
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    sub = ap.add_subparsers(dest="mode", required=True, metavar="{" + ",".join(RECEIVERS) + "}")
    for mode, t in RECEIVERS.items():
        p = sub.add_parser(mode, help=t.receiver_help, description=t.receiver_module.__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        t.add_receiver_flags(p)
        add_telemetry(p, f"receiver-{mode}")  # every mode's: the telemetry, and the clock reference
        add_clock_reference(p)
    return ap


def main(argv=None) -> int:
    if PROBLEM:  # a transport of the user's that could not be had
        print(f"receiver: error: {PROBLEM}", file=sys.stderr)
        return 2
    try:
        a = _parser().parse_args(argv)
    except SystemExit as e:
        return 2 if e.code else 0
    settings.export(a)  # log level, slices, trimming: for this process' readers and its shippers
    from core.slices import setting_problem

    if problem := setting_problem(a.telemetry_bootstrap):
        print(f"receiver: error: {problem}", file=sys.stderr)
        return 2
    return RECEIVERS[a.mode].receive(a, runner)


if __name__ == "__main__":
    from core import memory

    memory.use_c_allocator("agents.receiver")  # a long-lived process: what it frees after a burst goes back
    sys.exit(main())
