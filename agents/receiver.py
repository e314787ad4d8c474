"""Receiver agents: record the receive time of every event the system under test delivers.

Usage:
    python -m agents.receiver http  [--listen 127.0.0.1:18080] [--run RUN] [--workers N]
    python -m agents.receiver kafka [--bootstrap 127.0.0.1:29092] [--topic flightwatch.sut] [--state-dir DIR]
    python -m agents.receiver amqp  [--url 'amqp://guest:guest@127.0.0.1:29672/%2F?queue=flightwatch.sut'] [--prefetch N]
    python -m agents.receiver amqp1 --url amqp1://USER:PASS@HOST:PORT/ADDRESS [--prefetch N]
    (all: [--telemetry-bootstrap 127.0.0.1:19092] [--telemetry-topic flightwatch.telemetry] [--agent NAME])

``http`` is a CloudEvents sink (``transports.http.receiver``): point a Knative trigger, a
broker's subscriber or the load generator at it. ``kafka`` consumes a topic of the SUT
(``transports.kafka.receiver``), ``amqp`` a RabbitMQ queue (``transports.amqp091.receiver``), ``amqp1`` an AMQP 1.0
address (``transports.amqp1.receiver``).
Each writes receive records into the telemetry topic and, every 5 s, a clock record: this
host's clock offset against the clock reference (``core.clock``) that the node-metrics
agent serves, so latencies measured across hosts are corrected (``streaming.clocks``). Each mode is one
line of ``RECEIVERS``: its flags and its process.
"""
from __future__ import annotations

import argparse
import os
import signal
import socket
import sys

from agents.amqp1_agent import main_amqp1
from agents.amqp_agent import main_amqp
from agents.kafka_agent import main_kafka
from agents.runner import Process
from core import logs, memory, metrics, settings
from core.cli import OneLineParser, add_clock_reference, add_telemetry, add_wait, bootstrap_arg
from core.procs import AMQP_RECEIVER_METRICS_PORT, HOST, KAFKA_RECEIVER_METRICS_PORT, sut_bootstrap
from core.rundir import ROOT
from core.units import parse_duration_ns, parse_part, parse_size, split_host_port
from transports.amqp091 import receiver as amqp_receiver
from transports.amqp1 import receiver as amqp1_receiver
from transports.http import receiver as http_receiver
from transports.http import server as http_server
from transports.kafka import receiver as kafka_receiver
from transports.kafka.receiver import FETCH_MAX_WAIT_MS


def _common(p: argparse.ArgumentParser, agent: str) -> None:
    add_telemetry(p, agent)
    add_clock_reference(p)


def _parser() -> argparse.ArgumentParser:
    ap = OneLineParser(prog="python -m agents.receiver", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    sub = ap.add_subparsers(dest="mode", required=True, metavar="{" + ",".join(RECEIVERS) + "}")
    for mode, (add_flags, _main, what, module) in RECEIVERS.items():
        add_flags(sub.add_parser(mode, help=what, description=module.__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter))
    return ap


def _add_http(h: argparse.ArgumentParser) -> None:
    settings.add(h, "FLIGHTWATCH_RECEIVER_LISTEN", "--listen", default="127.0.0.1:18080", metavar="HOST:PORT",
                 help="where to listen")
    h.add_argument("--run", default=None, help="run ID for events that carry no ce-fwrun (default: count them as unattributed)")
    settings.add(h, "FLIGHTWATCH_RECEIVER_WORKERS", "--workers", type=int, default=1,
                 help="serving processes sharing the port (SO_REUSEPORT), each its own receiver in the telemetry "
                      "(<agent>-<i>): the Knative method's receivers")
    h.add_argument("--no-telemetry", action="store_true", help="record nothing (to measure the sink's own capacity)")
    h.add_argument("--spool-dir", default=os.path.join(ROOT, ".stack", "spool"),
                   help="where receive records wait for the shipper (one folder per agent; default %(default)s)")
    h.add_argument("--spool-budget", default="2GiB", metavar="SIZE",
                   help="disk the spool may take while the telemetry broker is away (default %(default)s); "
                        "receives over it are counted as lost, in /healthz and in the run's summary")
    limits = http_server.Limits()
    h.add_argument("--head-timeout", default=f"{limits.head_timeout_s:g}s", metavar="DURATION",
                   help="a request's head must be complete this long after its first byte, else 408 and close "
                        "(default %(default)s)")
    h.add_argument("--body-timeout", default=f"{limits.body_timeout_s:g}s", metavar="DURATION",
                   help="a body must be complete within this, or at %d KiB/s of its length if that allows longer, "
                        "else 408 and close (default %%(default)s)" % (limits.body_min_rate // 1024))
    h.add_argument("--max-connections", type=int, default=limits.max_connections, metavar="N",
                   help="open connections per serving process; more are answered 503 and closed, and counted "
                        "(default %(default)s)")
    _common(h, "receiver-http")


def _share(text: str) -> tuple[int, int]:
    try:
        return parse_part(text, "--share")
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _add_kafka(k: argparse.ArgumentParser) -> None:
    settings.add(k, "FLIGHTWATCH_SUT_BOOTSTRAP", "--bootstrap", default=sut_bootstrap(), type=bootstrap_arg,
                 help="the system under test's Kafka bootstrap")
    k.add_argument("--topic", default="flightwatch.sut")
    k.add_argument("--state-dir", default=os.path.join(ROOT, ".stack", "receiver-kafka"),
                   help="where the write-ahead log, the telemetry spool (<state-dir>/spool) and the shipper's log live "
                        "(default %(default)s)")
    k.add_argument("--spool-budget", default="2GiB", metavar="SIZE",
                   help="disk the telemetry spool may hold while the telemetry broker is away; receives past it are "
                        "counted as lost, in /metrics and in the run's summary (default %(default)s)")
    k.add_argument("--from-end", action="store_true",
                   help="on a first start (no write-ahead log in --state-dir yet), take up each partition at its end: "
                        "what the topic held before is left alone (a topic of your own; the load generator starts a "
                        "receiver this way for a run)")
    k.add_argument("--share", type=_share, default=(0, 1), metavar="INDEX/COUNT",
                   help="consume only the partitions p with p mod COUNT == INDEX: one of COUNT receivers that split "
                        "the topic between them, no consumer group joined (the load generator's --receivers N; "
                        "default 0/1)")
    k.add_argument("--routes", action="store_true",
                   help="record each receive's partition as its route: the topic is the one the load generator sends "
                        "to (the receiver that follows the target, the stack's), so an event read from a partition it "
                        "was not sent to is misrouted. Leave it off for a topic your system copies events into")
    k.add_argument("--create-topic", type=int, default=2, metavar="PARTITIONS",
                   help="create the SUT topic with this many partitions if missing (default %(default)s)")
    k.add_argument("--fetch-wait-ms", type=int, default=FETCH_MAX_WAIT_MS, metavar="MS",
                   help="fetch.wait.max.ms: the longest a broker may hold a fetch; adds to flight time on a broker "
                        "that holds it under load (Tansu), and sets the idle fetch rate (default %(default)s)")
    settings.add(k, "FLIGHTWATCH_KAFKA_RECEIVER_METRICS_LISTEN", "--metrics-listen", type=metrics.listen_arg,
                 default=f"{HOST}:{KAFKA_RECEIVER_METRICS_PORT}", metavar="HOST:PORT",
                 help="serve Prometheus metrics here ('none': not at all)")
    add_wait(k, "the SUT and telemetry brokers")
    _common(k, "receiver-kafka")


def _add_amqp(q: argparse.ArgumentParser) -> None:
    from core.suts import default_target

    q.add_argument("--url", default=default_target("rabbitmq"), metavar="URL",
                   help="the queue to consume, as the load generator's target names it: amqp://USER:PASS@HOST:PORT/VHOST"
                        "?queue=NAME (or ?exchange=NAME&routing_key=KEY: a queue of its own bound to it; &durable=true, "
                        "&declare=false as for the target; default the stack's RabbitMQ queue)")
    q.add_argument("--prefetch", type=int, default=amqp_receiver.PREFETCH,
                   help="deliveries the broker may have unacked at the receiver (basic.qos; default %(default)s)")
    q.add_argument("--auto-ack", action="store_true",
                   help="the broker forgets a message once sent (no acks; a message not recorded is lost)")
    _add_amqp_common(q, "receiver-amqp")


def _add_amqp1(q: argparse.ArgumentParser) -> None:
    from core.suts import default_target

    q.add_argument("--url", default=default_target("rabbitmq-amqp1"), metavar="URL",
                   help="the address to consume, as the load generator's target names it: amqp1://USER:PASS@HOST:PORT/"
                        "ADDRESS (RabbitMQ 3.x: //queue/NAME; Artemis: the queue's name; ?durable=true as for the "
                        "target: a durable terminus, so RabbitMQ's plugin declares its queue durable; default the "
                        "stack's RabbitMQ queue over AMQP 1.0)")
    q.add_argument("--prefetch", type=int, default=amqp1_receiver.PREFETCH,
                   help="the link's credit: messages the broker may send ahead (default %(default)s)")
    _add_amqp_common(q, "receiver-amqp1")


def _add_amqp_common(q: argparse.ArgumentParser, agent: str) -> None:
    q.add_argument("--state-dir", default=os.path.join(ROOT, ".stack", agent),
                   help="where the telemetry spool (<state-dir>/spool) and the shipper's log live (default %(default)s)")
    q.add_argument("--spool-budget", default="2GiB", metavar="SIZE",
                   help="disk the telemetry spool may hold while the telemetry broker is away (default %(default)s)")
    settings.add(q, "FLIGHTWATCH_AMQP_RECEIVER_METRICS_LISTEN", "--metrics-listen", type=metrics.listen_arg,
                 default=f"{HOST}:{AMQP_RECEIVER_METRICS_PORT}", metavar="HOST:PORT",
                 help="serve Prometheus metrics here ('none': not at all)")
    _common(q, agent)


def _positive_s(text: str, flag: str) -> float:
    try:
        ns = parse_duration_ns(text)
    except ValueError as e:
        raise ValueError(f"{flag}: {e}") from None
    if ns <= 0:
        raise ValueError(f"{flag} must be more than 0")
    return ns / 1e9


def _metrics_dir(a) -> str:
    return os.path.join(a.spool_dir, f"{a.agent}.metrics")


def main_http(a, log=None) -> int:
    try:
        host, port = split_host_port(a.listen, "--listen")
    except ValueError as e:
        print(f"receiver: error: {e}", file=sys.stderr)
        return 2
    if a.workers < 1:
        print("receiver: error: --workers must be at least 1", file=sys.stderr)
        return 2
    try:
        a.spool_budget_bytes = parse_size(a.spool_budget)
    except ValueError as e:
        print(f"receiver: error: --spool-budget: {e}", file=sys.stderr)
        return 2
    try:
        a.limits = http_server.Limits(head_timeout_s=_positive_s(a.head_timeout, "--head-timeout"),
                                        body_timeout_s=_positive_s(a.body_timeout, "--body-timeout"),
                                        max_connections=a.max_connections)
        if a.max_connections < 1:
            raise ValueError("--max-connections must be at least 1")
    except ValueError as e:
        print(f"receiver: error: {e}", file=sys.stderr)
        return 2
    metrics.use_shared_dir(_metrics_dir(a), clear=True)  # the workers' and shippers' counters meet there
    if a.workers > 1:
        return _serve_workers(a, host, port)
    return _serve_one(a, host, port, a.agent, reuse_port=False, log=log)


def _serve_one(a, host: str, port: int, agent: str, reuse_port: bool, log=None) -> int:
    logger = logs.setup(agent)
    log = log or logs.printer(logger)
    spool_dir = None if a.no_telemetry else os.path.join(a.spool_dir, agent)
    process = Process(a, agent, spool_dir, a.spool_budget_bytes, os.path.join(a.spool_dir, f"{agent}.shipper.log"),
                      log, logs.printer(logger, logs.WARNING))
    receiver = http_receiver.HttpReceiver(process.spool, agent, a.run)
    receiver.shared = process.shared  # /metrics is the sink's own port: every worker's and shipper's counters

    async def body(stop) -> int:
        process.start(receiver)
        await http_server.serve(receiver, host, port, reuse_port=reuse_port, stop=stop, limits=a.limits,
                                ready=lambda: log(f"receiver {agent}: http://{host}:{port}/ -> " + (
                                    "(no telemetry)" if process.spool is None else
                                    f"spool {process.spool.dir} -> {a.telemetry_bootstrap}/{a.telemetry_topic}"),
                                    flush=True))
        return 0

    try:
        return process.run_async(body)
    except OSError as e:
        print(f"receiver: error: cannot listen on {host}:{port}: {e.strerror or e}", file=sys.stderr)
        return 2
    finally:
        process.close()


def _serve_workers(a, host: str, port: int) -> int:
    """N serving processes on one port (SO_REUSEPORT); each writes telemetry as ``<agent>-<i>``."""
    import multiprocessing as mp

    probe = socket.socket()
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers bind: a restart's old connections
    try:                                                          # in TIME_WAIT do not hold the port
        probe.bind((host, port))
    except OSError as e:
        print(f"receiver: error: cannot listen on {host}:{port}: {e.strerror or e}", file=sys.stderr)
        return 2
    finally:
        probe.close()
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_serve_one, args=(a, host, port, f"{a.agent}-{i}", True), daemon=False)
             for i in range(a.workers)]
    for p in procs:
        p.start()
    signal.signal(signal.SIGTERM, lambda *_: [os.kill(p.pid, signal.SIGTERM) for p in procs if p.is_alive()])
    for p in procs:
        p.join()
    return max((p.exitcode or 0) for p in procs)


def main(argv=None) -> int:
    try:
        a = _parser().parse_args(argv)
    except SystemExit as e:
        return 2 if e.code else 0
    settings.export(a)  # log level, slices, trimming: for this process' readers and its shippers
    from core.slices import setting_problem

    if problem := setting_problem(a.telemetry_bootstrap):
        print(f"receiver: error: {problem}", file=sys.stderr)
        return 2
    return RECEIVERS[a.mode][1](a)


RECEIVERS = {
    "http": (_add_http, main_http, "CloudEvents HTTP sink (binary, structured and batched modes)", http_receiver),
    "kafka": (_add_kafka, main_kafka, "consume the SUT topic (Kafka protocol)", kafka_receiver),
    "amqp": (_add_amqp, main_amqp, "consume a RabbitMQ queue (AMQP 0-9-1)", amqp_receiver),
    "amqp1": (_add_amqp1, main_amqp1, "consume an AMQP 1.0 address (Artemis, RabbitMQ's plugin)", amqp1_receiver),
}
"""Each receiver mode: its flags, its process' main, its help line, and the module whose docstring is its --help."""


if __name__ == "__main__":
    from core import memory

    memory.use_c_allocator("agents.receiver")  # a long-lived process: what it frees after a burst goes back
    sys.exit(main())
