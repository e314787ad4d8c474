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
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from core.observer import tree_cpu_s
from core.procs import HOST
from core.rundir import ROOT

PERFTEST = [("com.rabbitmq", "perf-test", "2.22.1")]
"""2.22.1: the newest the registry serves here (2.23.0 and 2.24.0 are refused)."""
SKIP_LINES = 3
MAX_PENDING = 100
"""``artemis perf --max-pending``: with 1,000, ``artemis perf producer`` stopped sending 2 s into every run at
5,000/s (the broker answered no more); 100 is the most that ran through."""
CONFIRMS = 1000
"""PerfTest's unconfirmed messages at most (``-c``): the AMQP 0-9-1 target's own window."""
PREFIX = "flightwatch.peer"
"""The topics, addresses and queues the peers use: never the SUT's own."""

LINES = {  # a tool's line a second -> what it sent in that second
    "flightwatch": re.compile(r"^\s*\d+s\s+sent\s+([\d,]+)/s"),
    "perftest": re.compile(r"time [\d.]+ s, sent: (\d+) msg/s"),
    "artemis": re.compile(r"^--- sent:\s+(\d+) msg/sec"),
    "kafka": re.compile(r"^(\d+) records sent, [\d.]+ records/sec .* max latency\.\s*$"),  # not the summary
}
TOOLS = {"kafka": "kafka-producer-perf-test + EndToEndLatency (Kafka 4.4.0)",
         "artemis": "artemis perf client (Artemis 2.40.0, AMQP)", "rabbitmq": "RabbitMQ PerfTest 2.22.1"}


def measure(cmd: list[str], kind: str, seconds: float, env: dict | None = None, log=None) -> dict:
    """Run ``cmd`` (stopped after ``seconds`` + 60 at most, by its PID); read its per-second lines as they come, the
    CPU of its processes at each: {events_per_s, us_per_event, lines, output} over the lines kept, or {error,
    output}. ``log(line)`` sees every line as it comes."""
    from core.procs import stop_session

    pattern = LINES[kind]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                            env=env or os.environ, start_new_session=True)
    samples: list[tuple[float, int]] = []  # (CPU s at the line, events sent in its second)
    output: list[str] = []

    def read() -> None:
        for line in proc.stdout:
            m = pattern.search(line)
            if m:
                samples.append((tree_cpu_s(proc.pid) or 0.0, int(m.group(1).replace(",", ""))))
            if len(output) < 20_000:
                output.append(line.rstrip("\n"))
            if log is not None:
                log(line.rstrip())
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        proc.wait(seconds + 60)
    except subprocess.TimeoutExpired:
        pass
    finally:
        stop_session(proc.pid, wait_s=5)
        reader.join(5)
    kept = samples[SKIP_LINES:-1]
    if len(kept) < 3:
        return {"error": f"{len(samples)} lines a second: " + "\n".join(output[-5:]).strip()[-300:], "output": output}
    events = sum(n for _, n in kept[1:])
    if not events:
        return {"error": f"sent nothing in the seconds measured, after {[n for _, n in samples[:SKIP_LINES + 1]]} in "
                         f"its first: {' '.join(cmd[:4])} ...", "output": output}
    cpu = kept[-1][0] - kept[0][0]
    return {"events_per_s": statistics.median(n for _, n in kept[1:]), "us_per_event": cpu * 1e6 / events,
            "lines": len(kept), "output": output}


def fetch(sut: str) -> str:
    """The folder of the tool's jars (Artemis: its home), fetched into ``.stack/downloads`` if it is not yet;
    ``RuntimeError`` saying what failed."""
    from stack import artemis, kafka, maven

    if sut == "rabbitmq":
        return maven.fetch("perf-test-2.22.1", PERFTEST, "RabbitMQ PerfTest 2.22.1")
    return artemis.fetch() if sut == "artemis" else kafka.fetch()


def default_port(sut: str) -> int:
    """The stack's port for the SUT ``sut`` (``core.suts.Sut.address``)."""
    from core.suts import SUTS

    return int(SUTS[sut].address().rpartition(":")[2])


def producer_perf(lib: str, port: int, topic: str, rate: int, seconds: float, payload: int, acks: str,
                  records: int | None = None) -> list[str]:
    """``rate`` -1: unbounded, for ``records``."""
    return ["java", "-cp", os.path.join(lib, "*"), "org.apache.kafka.tools.ProducerPerformance", "--topic", topic,
            "--num-records", str(records or int(rate * seconds)), "--record-size", str(payload), "--throughput", str(rate),
            "--reporting-interval", "1000", "--command-property", f"bootstrap.servers={HOST}:{port}", f"acks={acks}",
            "linger.ms=5"]


def artemis_client(home: str, port: int, rate: int, seconds: float, payload: int, pairs: int, warmup: int,
                   report: str) -> list[str]:
    return [os.path.join(home, "bin", "artemis"), "perf", "client", "--url", f"amqp://{HOST}:{port}", "--protocol",
            "AMQP", "--user", "artemis", "--password", "artemis", "--message-size", str(payload), "--rate", str(rate),
            "--duration", f"{seconds:.0f}", "--warmup", str(warmup), "--max-pending", str(MAX_PENDING), "--json",
            report, *(["--num-destinations", str(pairs), "--shared-connections", "--consumer-connections", "1"]
                      if pairs > 1 else []), f"queue://{PREFIX}"]


def perftest(lib: str, port: int, rate: int, seconds: float, payload: int, bindings: int) -> list[str]:
    return ["java", "-cp", os.path.join(lib, "*"), "com.rabbitmq.perf.PerfTest", "-h",
            f"amqp://guest:guest@{HOST}:{port}/%2F", "-x", str(bindings), "-y", str(bindings), "-e", f"{PREFIX}.topic",
            "-t", "topic", "--queue-pattern", f"{PREFIX}.q%d", "--queue-pattern-from", "1", "--queue-pattern-to",
            str(bindings), "-r", f"{rate / bindings:g}", "-s", str(payload), "-c", str(CONFIRMS), "-z",
            f"{seconds:.0f}", "--id", "flightwatch-peer"]


def _pct(values: dict, p50, p99, p999, scale: float) -> dict:
    get = lambda k: None if k is None or values.get(k) is None else float(values[k]) * scale
    return {"p50_us": get(p50), "p99_us": get(p99), "p999_us": get(p999)}


def run_kafka(lib: str, port: int, a: argparse.Namespace, log) -> dict:
    """ProducerPerformance at the rate, then EndToEndLatency for ``a.e2e_records`` messages, on topics of their own
    made with ``a.partitions`` partitions."""
    from confluent_kafka.admin import AdminClient, NewTopic

    from core.kafka_options import librdkafka

    stamp = time.strftime("%H%M%S")
    topics = {"perf": f"{PREFIX}.{stamp}", "e2e": f"{PREFIX}.e2e.{stamp}"}
    admin = AdminClient({"bootstrap.servers": f"{HOST}:{port}", **librdkafka({})})
    try:
        for f in admin.create_topics([NewTopic(t, a.partitions, 1) for t in topics.values()]).values():
            f.result(30)
    except Exception as e:  # a KafkaException, or the 30 s passed
        raise RuntimeError(f"could not make the tools' topics on {HOST}:{port}: {e}") from None
    m = measure(producer_perf(lib, port, topics["perf"], a.rate, a.seconds, a.payload, a.acks), "kafka", a.seconds,
                log=log)
    out = {"throughput_per_s": m.get("events_per_s"), "cpu_us_per_message": m.get("us_per_event"),
           "cpu_of": "the producer (it has no consumer)", "error": m.get("error")}
    final = next((line for line in reversed(m["output"]) if "99.9th" in line), "")
    ack = re.search(r"([\d.]+) ms 50th, [\d.]+ ms 95th, ([\d.]+) ms 99th, ([\d.]+) ms 99.9th", final)
    if ack:
        out["ack_latency"] = _pct(dict(zip(("50", "99", "99.9"), ack.groups())), "50", "99", "99.9", 1000.0)
    e2e = subprocess.run(["java", "-cp", os.path.join(lib, "*"), "org.apache.kafka.tools.EndToEndLatency",
                          f"{HOST}:{port}", topics["e2e"], str(a.e2e_records), a.acks, str(a.payload)],
                         capture_output=True, text=True, timeout=600, cwd=ROOT)
    pm = re.search(r"Percentiles: 50th = (\d+), 99th = (\d+), 99.9th = (\d+)", e2e.stdout)
    avg = re.search(r"Avg latency: ([\d.]+) ms", e2e.stdout)
    if pm is None:
        out["error"] = out["error"] or f"EndToEndLatency printed no percentiles: {(e2e.stdout + e2e.stderr)[-300:]}"
    else:
        out.update(_pct(dict(zip(("50", "99", "99.9"), pm.groups())), "50", "99", "99.9", 1000.0))
        out["mean_us"] = float(avg.group(1)) * 1000 if avg else None
        out["e2e_records"] = a.e2e_records
        log(f"EndToEndLatency, {a.e2e_records:,} messages one at a time: {pm.group(0)} ms")
    return {**out, "resolution_us": 1000, "model": "closed: one message in flight (EndToEndLatency)",
            "latency_from": "EndToEndLatency: receive less send, one JVM's nanoTime, whole ms (truncated)"}


def heap_mb(pairs: int) -> int:
    """``artemis perf client``'s heap: its default 1 GiB and 3 MiB more for each address (each producer and consumer
    keeps latency histograms of its own: at 100 addresses 512 MiB ran out), 4 GiB at most."""
    return min(4096, 1024 + 3 * pairs)


def run_artemis(home: str, port: int, a: argparse.Namespace, log) -> dict:
    with tempfile.TemporaryDirectory(prefix="peer-artemis-") as tmp:
        report = os.path.join(tmp, "report.json")
        m = measure(artemis_client(home, port, a.rate, a.seconds, a.payload, a.pairs, a.warmup, report), "artemis",
                    a.seconds, env=dict(os.environ, JAVA_ARGS=f"-Xms512m -Xmx{heap_mb(a.pairs)}m"), log=log)
        try:
            with open(report) as f:
                samples = json.load(f)
        except (OSError, ValueError):
            samples = []
    summary = next((s for s in samples if s.get("sampleType") == "summary"), {})
    kept = [s for s in samples if s.get("sampleType") == "interval" and not s.get("warmup")]
    received = [s["received"] for s in kept]
    transfer = summary.get("totalTransferTime") or {}
    return {"throughput_per_s": statistics.median(received[1:-1]) if len(received) > 2 else None,
            "cpu_us_per_message": m.get("us_per_event"), "cpu_of": "producers and consumers (one JVM)",
            "sent": summary.get("totalSent"), "received": summary.get("totalReceived"),
            **_pct(transfer, "50", "99", "99.9", 1.0), "mean_us": float(transfer["mean"]) if transfer else None,
            "per_second_p99_us": [(s.get("transferTime") or {}).get("99") for s in kept],
            "error": m.get("error") or (None if transfer else "artemis perf client wrote no summary"),
            "resolution_us": 1, "model": f"open: {a.rate:,}/s over {a.pairs:,} address(es), {MAX_PENDING} pending at most",
            "latency_from": "transfer time: receive less the send time the message carries (µs, one clock)"}


def run_perftest(lib: str, port: int, a: argparse.Namespace, log) -> dict:
    m = measure(perftest(lib, port, a.rate, a.seconds, a.payload, a.bindings), "perftest", a.seconds, log=log)
    text = "\n".join(m["output"])
    seconds = [re.search(r"received: (\d+) msg/s.* consumer latency: \d+/\d+/\d+/\d+/(\d+) µs", line)
               for line in m["output"] if " s, sent: " in line]
    seconds = [x.groups() for x in seconds if x]
    kept = seconds[SKIP_LINES:-1]
    lat = re.search(r"consumer latency min/median/75th/95th/99th (\d+)/(\d+)/(\d+)/(\d+)/(\d+) µs", text)
    values = dict(zip(("min", "50", "75", "95", "99"), lat.groups())) if lat else {}
    return {"throughput_per_s": statistics.median(int(r) for r, _ in kept) if len(kept) > 2 else None,
            "cpu_us_per_message": m.get("us_per_event"), "cpu_of": "producers and consumers (one JVM)",
            **_pct(values, "50", "99", None, 1.0), "per_second_p99_us": [int(p) for _, p in seconds],
            "error": m.get("error") or (None if lat else "PerfTest printed no consumer latency"), "resolution_us": 1,
            "model": f"open: {a.rate:,}/s over {a.bindings:,} queue(s) of a topic exchange, {CONFIRMS} unconfirmed at most",
            "latency_from": "consumer latency: receive less the send nanoTime in the body (µs); no p99.9 printed; "
                            "its summary includes its first seconds"}


def run(a: argparse.Namespace, log=print) -> dict:
    """The tool for ``a.sut`` at ``a.rate``: its figures (``error`` when it failed)."""
    lib = fetch(a.sut)
    port = a.port or default_port(a.sut)
    started = time.time_ns()
    runner = {"kafka": run_kafka, "artemis": run_artemis, "rabbitmq": run_perftest}[a.sut]
    figures = runner(lib, port, a, log)
    return {"tool": TOOLS[a.sut], "sut": a.sut, "rate": a.rate, "seconds": a.seconds, "payload": a.payload,
            "started_ns": started, "stopped_ns": time.time_ns(),
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
    p.add_argument("--sut", required=True, choices=tuple(TOOLS), help="the broker, and so the tool")
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
