"""The brokers' own load tools, run as their users run them, for a figure to set beside flightwatch's: RabbitMQ
PerfTest, ``artemis perf client``, and Kafka's ``kafka-producer-perf-test`` with ``EndToEndLatency`` (kafka-tools).
``make scenario ... PEER=1`` runs one after each cell, on the same broker at the same rate; ``bench.transports``
runs their producers beside the load generator.

    python -m stack.peers --sut kafka --rate 2000 --seconds 20 --payload 1024 --acks all --partitions 3
    python -m stack.peers --sut artemis --rate 1000 --pairs 100 --payload 100 --json peer.json
    python -m stack.peers --sut rabbitmq --rate 1000 --bindings 100

What each tool measures, and how it is read here:
  kafka     kafka-producer-perf-test (org.apache.kafka.tools.ProducerPerformance) at the rate, acks and linger.ms=5
            as flightwatch's Kafka target: its throughput and its CPU per message (a producer only). It has no
            consumer: its latency is send to broker ack. The flight time is EndToEndLatency's: one message in
            flight at a time (a closed model: no queue ever forms), timed by one JVM's nanoTime and printed in whole
            milliseconds (truncated): its resolution is 1 ms.
  artemis   artemis perf client (Qpid JMS over AMQP, producers and consumers in one JVM) at the rate, on --pairs
            addresses (its --num-destinations), 100 sends pending at most, its own --warmup left out: throughput,
            the transfer time (receive less the send time the message carries, in µs of one clock: an open model
            like flightwatch's) p50/p99/p99.9, and the CPU per message of its one JVM (producer and consumer).
            Its producers share one connection and its consumers another (--shared-connections,
            --consumer-connections 1), as flightwatch's links do: a connection each ran out of 4 GiB at 1,000.
  rabbitmq  PerfTest (com.rabbitmq:perf-test 2.22.1) with --bindings queues on a topic exchange, each bound with
            its own key, a producer and a consumer per queue, publisher confirms (1,000 unconfirmed at most):
            throughput, the consumer latency (one JVM's nanoTime, µs) p50 and p99 (it prints no p99.9; its summary
            includes its first seconds), and the CPU per message of its one JVM (producers and consumers).

CPU per message, the same for every tool: each prints a line a second with what it sent in it; at each line the CPU
of the tool's processes (psutil) is read; the first three lines (start-up: the JVM's compilations, connections) and
the last are left out, and the CPU between the first and last kept line is divided by the messages they say were
sent. The broker's own CPU is not counted. Exit 0, 1 if the tool failed, 2 on bad input.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time

from core.suts import SUTS
from stack.peer import SKIP_LINES, Peer


def peer_of(sut: str) -> Peer:
    """The tool that runs against ``sut``: its broker's (``stack.brokers.Broker.peer``)."""
    from stack.brokers import BROKERS

    peer = BROKERS[SUTS[sut].broker].peer if SUTS[sut].peer else None
    if peer is None:
        raise ValueError(f"no broker's own tool runs against {sut} (there is one for {', '.join(peer_suts())})")
    return peer


def peer_suts() -> tuple[str, ...]:
    """The SUTs a broker's own tool runs against (``core.suts.Sut.peer``)."""
    return tuple(name for name, sut in SUTS.items() if sut.peer)


def default_port(sut: str) -> int:
    """The stack's port for the SUT ``sut`` (``core.suts.Sut.address``)."""
    return int(SUTS[sut].address().rpartition(":")[2])


def run(a: argparse.Namespace, log=print) -> dict:
    """The tool for ``a.sut`` at ``a.rate``: its figures (``error`` when it failed)."""
    peer = peer_of(a.sut)
    lib = peer.fetch()
    port = a.port or default_port(a.sut)
    started = time.time_ns()
    figures = peer.run(lib, port, a, log)
    return {"tool": peer.tool, "sut": a.sut, "rate": a.rate, "seconds": a.seconds, "payload": a.payload,
            "started_ns": started, "stopped_ns": time.time_ns(), "with_consumer": peer.with_consumer,
            "causes": list(peer.causes),
            "settings": {k: getattr(a, k) for k in ("acks", "partitions", "pairs", "bindings", "warmup", "e2e_records")},
            **figures}


def _ms(us) -> str:
    return "-" if us is None else f"{us / 1000:,.3f} ms"


def one_line(f: dict) -> str:
    if f.get("error"):
        return f"{f['tool']}: failed: {f['error']}"
    cpu = f.get("cpu_us_per_message")
    return (f"{f['tool']}: {f['throughput_per_s'] or 0:,.0f}/s; flight p50 {_ms(f.get('p50_us'))} p99 "
            f"{_ms(f.get('p99_us'))} p99.9 {_ms(f.get('p999_us'))} ({f['model']}); CPU "
            f"{'-' if cpu is None else f'{cpu:,.1f}'} µs/message ({f['cpu_of']})")


def build_parser() -> argparse.ArgumentParser:
    from core.cli import OneLineParser

    p = OneLineParser(prog="python -m stack.peers", description=__doc__.split("\n\n")[0],
                      formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--sut", required=True, choices=peer_suts(), help="the broker, and so the tool")
    p.add_argument("--rate", required=True, type=int, help="messages/s in all (> 0)")
    p.add_argument("--seconds", type=float, default=20, help="how long the tool sends (default %(default)s)")
    p.add_argument("--payload", type=int, default=1024, help="message body in bytes (default %(default)s)")
    p.add_argument("--acks", choices=("1", "all"), default="all", help="Kafka: the producer's acks (default all)")
    p.add_argument("--partitions", type=int, default=1, help="Kafka: partitions of the tools' topics (default 1)")
    p.add_argument("--pairs", type=int, default=1, help="Artemis: addresses, a producer and a consumer on each")
    p.add_argument("--bindings", type=int, default=1, help="RabbitMQ: queues on the topic exchange (default 1)")
    p.add_argument("--warmup", type=int, default=2, help="Artemis: seconds its figures leave out (default 2)")
    p.add_argument("--e2e-records", type=int, default=2000, help="Kafka: EndToEndLatency's messages (default 2000)")
    p.add_argument("--port", type=int, help="the broker's port (default: the stack's for the SUT)")
    p.add_argument("--json", metavar="PATH", help="write the figures here too")
    return p


def main(argv=None) -> int:
    p = build_parser()
    try:
        a = p.parse_args(argv)
    except SystemExit as e:
        return 2 if e.code else 0
    if a.rate <= 0 or a.seconds < SKIP_LINES + 5 or a.payload < 0 or min(a.partitions, a.pairs, a.bindings) < 1 \
            or a.e2e_records < 1 or not 0 <= a.warmup < a.seconds:
        print("python -m stack.peers: error: --rate > 0, --seconds >= 8, --partitions, --pairs, --bindings and "
              "--e2e-records >= 1, 0 <= --warmup < --seconds", file=sys.stderr)
        return 2
    if shutil.which("java") is None:
        print("python -m stack.peers: error: the peers' tools need Java 17", file=sys.stderr)
        return 2
    try:
        figures = run(a, log=lambda line: print(f"  {line}", flush=True))
    except (RuntimeError, OSError, subprocess.SubprocessError) as e:
        print(f"python -m stack.peers: error: {e}", file=sys.stderr)
        return 1
    if a.json:
        with open(a.json, "w") as f:
            json.dump(figures, f, indent=1)
    print(one_line(figures), flush=True)
    return 1 if figures.get("error") else 0


if __name__ == "__main__":
    sys.exit(main())
