"""``python -m stack``'s flags (``stack.__main__``): the actions, every port, the SUT and its shape."""
from __future__ import annotations

import argparse

from core import settings
from core.cli import OneLineParser
from core.suts import SUTS
from transports.amqp import MAX_PAIRS


def parser(doc: str, port_settings: dict) -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m stack", description=doc.split("\n\n")[0],
                      formatter_class=argparse.RawDescriptionHelpFormatter, epilog=doc.split("\n\n", 1)[1])
    p.add_argument("action", choices=("up", "down", "status", "renew-sut", "restart", "clean"))
    p.add_argument("component", nargs="?",
                   help="restart: the component to stop and start again with the settings given now (`status` lists "
                        "them), e.g. FLIGHTWATCH_RECEIVER_WORKERS=5 python -m stack restart http-receiver")
    settings.add(p, "FLIGHTWATCH_STACK_DIR", "--stack-dir", metavar="DIR",
                 help="the stack's PID files, logs and state (default .stack/ in the checkout)")
    what = {"clock": "the clock reference (UDP)", "ui": "the dashboard"}
    for name, (env, default) in port_settings.items():
        mode, receiver = name.removesuffix("-receiver"), name.endswith("-receiver")
        settings.add(p, env, f"--{env[12:-5].lower().replace('_', '-')}-port", type=int, default=default, metavar="PORT",
                     help=what.get(name, f"the {mode.upper()} receiver" if receiver else f"the {name.replace('-', ' ')}")
                     + " (every command's default follows it)")
    settings.add(p, "FLIGHTWATCH_SUT", "--sut", choices=tuple(SUTS),
                 help="the system under test the stack runs (default: the one `up --sut` recorded, until `down`; "
                      "else tansu): " + "; ".join(f"{k}: {v.what}" for k, v in SUTS.items()))
    p.add_argument("--no-sut", action="store_true",
                   help="up: the telemetry plane alone (the telemetry broker, Prometheus, the HTTP receiver, node "
                        "metrics), no SUT broker nor its receiver: `make attack TARGET=...` at a broker of yours; what "
                        "runs already is left running")
    settings.add(p, "FLIGHTWATCH_SUT_PARTITIONS", "--partitions", type=int, default=2, metavar="N",
                 help="partitions of the SUT topic, which the Kafka receiver makes (Tansu, Apache Kafka), and of every "
                      "topic Apache Kafka makes when first named; takes effect on a SUT started here, as renew-sut "
                      "starts one")
    settings.add(p, "FLIGHTWATCH_SUT_PAIRS", "--pairs", type=int, default=1, metavar="N",
                 help="the AMQP 1.0 receiver consumes N pairs' addresses, the SUT queue's name .0 ... .N-1, each its "
                      "own link (`loadgen attack --target ...?pairs=N` sends to them); takes effect on a receiver "
                      "started here, as renew-sut starts one")
    settings.add(p, "FLIGHTWATCH_SUT_BINDINGS", "--bindings", type=int, default=0, metavar="N",
                 help="the AMQP 0-9-1 receiver declares RabbitMQ's topic exchange flightwatch.topic with N queues, each "
                      "bound with its own key, and consumes them all (`loadgen attack --target amqp://...?exchange="
                      "flightwatch.topic&bindings=N` publishes to them); 0: the SUT queue; on a receiver started here")
    settings.add(p, "FLIGHTWATCH_NO_INSTALL", "--no-install", action="store_true",
                 help="install no Debian package for a missing Prometheus or node exporter (1 in the variable)")
    return p


def problem(a: argparse.Namespace) -> str | None:
    """What is wrong with the flags that argparse cannot say, in one line; None when nothing is."""
    if (a.action == "restart") != (a.component is not None):
        return "give a component with restart, and with restart only (`python -m stack status` lists them)"
    if a.partitions < 1 or not 1 <= a.pairs <= MAX_PAIRS or not 0 <= a.bindings <= MAX_PAIRS:
        return f"--partitions must be at least 1, --pairs 1 to {MAX_PAIRS:,}, --bindings 0 to {MAX_PAIRS:,}"
    return None
