"""The shipper process of a disk spool (``agents.spool``: what it guarantees): started by its receiver, it tails the
spool into the telemetry topic, drains it when asked to stop or when its receiver is gone, and exits.

    python -m agents.shipper ship --spool-dir DIR --agent NAME [--bootstrap 127.0.0.1:19092]
"""
from __future__ import annotations

import argparse
import fcntl
import os
import signal
import sys

from agents import spool
from core import settings
from core.cli import OneLineParser, bootstrap_arg
from core.procs import lower_priority, telemetry_bootstrap


def stop_shipper(shipper) -> None:
    """Ask a shipper to stop (it drains the spool first, then exits) and wait up to ``DRAIN_WAIT_S`` for it."""
    shipper.terminate()
    try:
        shipper.wait(spool.DRAIN_WAIT_S)
    except Exception:  # noqa: BLE001 - still draining: it carries on alone and exits when done
        pass


def start_shipper(spool_dir: str, bootstrap: str, topic: str, agent: str, log_path: str | None = None):
    """Start the shipper process for a spool; it follows this process and drains the spool when it ends."""
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    log = open(log_path, "ab") if log_path else subprocess.DEVNULL
    return subprocess.Popen([sys.executable, "-m", "agents.shipper", "ship", "--spool-dir", spool_dir, "--bootstrap", bootstrap,
                             "--topic", topic, "--agent", agent, "--parent", str(os.getpid())],
                            env=dict(os.environ, PYTHONPATH=root), stdout=log, stderr=subprocess.STDOUT)


def main(argv=None) -> int:
    ap = OneLineParser(prog="python -m agents.shipper", description=spool.__doc__.split("\n\n")[0],
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=spool.__doc__.split("\n\n", 1)[1])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("ship", help="ship a spool into the telemetry topic")
    s.add_argument("--spool-dir", required=True)
    s.add_argument("--agent", required=True, help="message key (the agent whose records these are)")
    settings.add(s, "FLIGHTWATCH_BOOTSTRAP", "--bootstrap", default=telemetry_bootstrap(), type=bootstrap_arg,
                 help="telemetry Kafka bootstrap")
    settings.add(s, "FLIGHTWATCH_TOPIC", "--topic", default="flightwatch.telemetry", help="the telemetry topic")
    s.add_argument("--parent", type=int, default=0, help="drain and exit once this process is gone")
    try:
        a = ap.parse_args(argv)
    except SystemExit as e:
        return 2 if e.code else 0
    from core.slices import setting_problem

    if problem := setting_problem(a.bootstrap):
        print(f"shipper: error: {problem}", file=sys.stderr)
        return 2
    os.makedirs(a.spool_dir, exist_ok=True)
    lower_priority(spool.SHIPPER_NICE)  # in its receiver's session: it yields to its receiver, whose group keeps its weight
    lock = open(os.path.join(a.spool_dir, "shipper.lock"), "w")
    fcntl.flock(lock, fcntl.LOCK_EX)  # one shipper per spool: a new one waits for a draining old one
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))

    def should_stop() -> bool:
        return bool(stopping) or bool(a.parent and os.getppid() != a.parent)

    from core import logs
    from core.kafka_options import telemetry_producer
    from core.slices import TelemetryTopic

    logger = logs.setup(f"shipper-{a.agent}")
    topic = TelemetryTopic.for_broker(a.topic, a.bootstrap)
    # a broker away at the start is no error: librdkafka connects when it can, the spool holds the lines meanwhile
    # every message is delivered or failed within a send's wait (30 s): a send tried again never finds the last
    # attempt's copies still queued in the client
    producer = telemetry_producer(a.bootstrap, **{"linger.ms": 5, "batch.size": 1 << 20, "message.max.bytes": 16 << 20,
                                                  "message.timeout.ms": 25_000, **topic.producer_settings()})
    shipper = spool.Shipper(a.spool_dir, producer, topic, a.agent, log=logs.printer(logger, logs.WARNING))
    from core import metrics

    if metrics.MULTIPROC_ENV in os.environ:  # started by a receiver: its /metrics shows ours
        shipper.shared = metrics.Shared()

    shipper.run(should_stop)
    if shipper.shared is not None:
        shipper.shared.close()
    producer.flush(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
