"""Each transport's load generator beside the broker's own tool, on the same broker in the same run: events/s, and
CPU µs per event at 1,000/s, 5,000/s and unbounded (the ceiling).

Usage:
    python -m bench.transports [--seconds 14] [--rates 1000,5000,0] [--only amqp,amqp1,kafka] [--repeat 1]

The brokers are started here on loopback ports of their own, as the tests start them: RabbitMQ (Debian's), ActiveMQ
Artemis 2.40 and Apache Kafka 4.4 (the Maven registry's). Against each, for --seconds at each rate (0: unbounded):
  flightwatch   python -m loadgen attack --no-telemetry --max-inflight 1000, --workers 1 and --workers 2
                (AMQP 0-9-1 with confirms, AMQP 1.0 unsettled, Kafka acks=all linger 5 ms)
  PerfTest      RabbitMQ's own (com.rabbitmq:perf-test 2.22.1): one producer, confirms, 1,000 unconfirmed at most
  artemis perf  Artemis' own ``artemis perf producer --protocol AMQP`` (Qpid JMS): 100 pending at most
  kafka-producer-perf-test
                Kafka's own (org.apache.kafka.tools.ProducerPerformance): acks=all, linger.ms=5
All with 2,048-byte events and no consumer.

How it is measured, the same for every tool: each prints a line a second with what it sent in it. At each line the
CPU of the tool's processes (psutil: the JVM; the generator's parent and workers) is read. The first three lines
are left out (start-up: the JVM's compilations, imports, connections), and so is the last; CPU per event is the CPU
between the first and the last line kept over the events those lines say were sent. Unbounded, events/s is the
median of the kept lines: the ceiling. The broker's own CPU is not counted on either side. Medians of --repeat.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from stack.peers import MAX_PENDING as ARTEMIS_PENDING  # noqa: E402
from stack.peers import SKIP_LINES, measure, producer_perf  # noqa: E402

PAYLOAD = 2048
INFLIGHT = 1000
UNBOUNDED = 200_000
"""The load generator's rate when unbounded: far above what it can send."""
QUEUE = "bench.transports"


class Brokers:
    """RabbitMQ, Artemis and Apache Kafka on free loopback ports, their state in a folder of their own; ``close``
    stops each by the PID it was started as."""

    def __init__(self, only: set[str], folder: str) -> None:
        from core.procs import free_port
        from stack import artemis, kafka, rabbitmq

        self.folder, self.ports, self.stops = folder, {}, []
        starts = {"amqp": (rabbitmq.start_rabbitmq, rabbitmq.stop_rabbitmq),
                  "amqp1": (artemis.start_artemis, artemis.stop_artemis),
                  "kafka": (kafka.start_kafka, kafka.stop_kafka)}
        for name in ("amqp", "amqp1", "kafka"):
            if name not in only:
                continue
            start, stop = starts[name]
            port = free_port()
            if name == "amqp1":
                self.drop_when_full(artemis.prepare(port, os.path.join(folder, name)))
            log = open(os.path.join(folder, f"{name}.log"), "ab")
            proc = start(port, os.path.join(folder, name), log)
            self.ports[name] = port
            self.stops.append((stop, proc.pid))
        self.artemis_home = artemis.fetch() if "amqp1" in only else None

    @staticmethod
    def drop_when_full(instance: str) -> None:
        """Artemis drops what an address holds past 64 MiB instead of paging it: with no consumer the runs' messages
        piled up, and ``artemis perf producer`` stopped for good a few seconds into the third run (no error, no
        log line); what the broker keeps is not what is measured here."""
        path = os.path.join(instance, "etc", "broker.xml")
        with open(path) as f:
            xml = f.read()
        head, sep, rest = xml.partition('<address-setting match="#">')
        block, end, tail = rest.partition("</address-setting>")
        block = (block.replace("<address-full-policy>PAGE</address-full-policy>",
                               "<address-full-policy>DROP</address-full-policy>")
                 .replace("<max-size-bytes>-1</max-size-bytes>", "<max-size-bytes>64MB</max-size-bytes>"))
        with open(path, "w") as f:
            f.write(head + sep + block + end + tail)

    def purge(self, transport: str) -> None:
        """The queue of the runs emptied (RabbitMQ's declared first, transient): no run pays for the one before;
        Kafka's topic is a log, kept."""
        if transport == "amqp":
            import pika

            conn = pika.BlockingConnection(pika.URLParameters(f"amqp://guest:guest@127.0.0.1:{self.ports['amqp']}/%2F"))
            ch = conn.channel()
            ch.queue_declare(QUEUE)
            ch.queue_purge(QUEUE)
            conn.close()
        elif transport == "amqp1":
            subprocess.run([os.path.join(self.artemis_home, "bin", "artemis"), "queue", "purge", "--name", QUEUE,
                            "--url", f"tcp://127.0.0.1:{self.ports['amqp1']}", "--user", "artemis", "--password",
                            "artemis", "--silent"], capture_output=True, timeout=120)  # none yet: nothing to do

    def close(self) -> None:
        for stop, pid in reversed(self.stops):
            stop(pid)


def ours(transport: str, port: int, rate: int, workers: int, seconds: float, out: str) -> list[str]:
    target = {"amqp": f"amqp://guest:guest@127.0.0.1:{port}/%2F?queue={QUEUE}",
              "amqp1": f"amqp1://artemis:artemis@127.0.0.1:{port}/{QUEUE}",
              "kafka": f"kafka://127.0.0.1:{port}/{QUEUE}"}[transport]
    return [sys.executable, "-m", "loadgen", "attack", "--target", target, "--rate", str(rate or UNBOUNDED),
            "--duration", f"{seconds:g}s", "--workers", str(workers), "--max-inflight", str(INFLIGHT), "--payload",
            str(PAYLOAD), "--no-telemetry", "--metrics-listen", "none", "--timeout", "10s", "--wait", "0s",
            "--out", out]


def peer(transport: str, port: int, rate: int, seconds: float, libs: dict) -> tuple[str, list[str]]:
    """The broker's own tool at ``rate`` (0: unbounded): (its name in LINES, its command)."""
    if transport == "amqp":
        return "perftest", ["java", "-cp", os.path.join(libs["perftest"], "*"), "com.rabbitmq.perf.PerfTest",
                            "-h", f"amqp://guest:guest@127.0.0.1:{port}/%2F", "-x", "1", "-y", "0", "-u", QUEUE, "-p",
                            "-s", str(PAYLOAD), "-c", str(INFLIGHT), "-z", f"{seconds:.0f}",
                            *(["-r", str(rate)] if rate else [])]
    if transport == "amqp1":
        return "artemis", [os.path.join(libs["artemis"], "bin", "artemis"), "perf", "producer", "--url",
                           f"amqp://127.0.0.1:{port}", "--protocol", "AMQP", "--user", "artemis", "--password",
                           "artemis", "--message-size", str(PAYLOAD), "--max-pending", str(ARTEMIS_PENDING), "--duration",
                           f"{seconds:.0f}", *(["--rate", str(rate)] if rate else []), f"queue://{QUEUE}"]
    return "kafka", producer_perf(libs["kafka"], port, QUEUE, rate or -1, seconds, PAYLOAD, "all",
                                  int((rate or UNBOUNDED) * seconds))


PEER_NAMES = {"amqp": "RabbitMQ PerfTest", "amqp1": "artemis perf producer", "kafka": "kafka-producer-perf-test"}
BROKER_NAMES = {"amqp": "RabbitMQ 3.10, AMQP 0-9-1", "amqp1": "Artemis 2.40, AMQP 1.0", "kafka": "Apache Kafka 4.4"}


def _parse(argv) -> argparse.Namespace:
    from core.cli import OneLineParser

    p = OneLineParser(prog="python -m bench.transports", description=__doc__.split("\n\n")[0],
                      formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--seconds", type=float, default=14, help="each measurement (default %(default)s)")
    p.add_argument("--rates", default="1000,5000,0", help="events/s, 0 for unbounded (default %(default)s)")
    p.add_argument("--only", default="amqp,amqp1,kafka", help="transports (default %(default)s)")
    p.add_argument("--repeat", type=int, default=1, help="repetitions; medians are printed (default %(default)s)")
    a = p.parse_args(argv)
    try:
        a.rates = [int(r) for r in a.rates.split(",")]
    except ValueError:
        p.error(f"--rates {a.rates!r}: events/s separated by commas, 0 for unbounded")
    a.only = {t for t in a.only.split(",") if t}
    if bad := a.only - set(PEER_NAMES):
        p.error(f"--only: unknown transport {', '.join(sorted(bad))}: amqp, amqp1, kafka")
    if a.seconds < SKIP_LINES + 5 or a.repeat < 1 or any(r < 0 for r in a.rates):
        p.error(f"--seconds at least {SKIP_LINES + 5}, --repeat at least 1, rates >= 0")
    return a


def _libs(only: set[str]) -> dict:
    from stack.peers import fetch

    tools = {"amqp": ("perftest", "rabbitmq"), "amqp1": ("artemis", "artemis"), "kafka": ("kafka", "kafka")}
    return {key: fetch(sut) for t, (key, sut) in tools.items() if t in only}


def _row(figures: list[dict], notes: list[str]) -> tuple[str, float | None]:
    """The median figures of a cell, or a short word (its error said in full in ``notes``, under the table)."""
    ok = [f for f in figures if "error" not in f]
    if not ok:
        notes.append(figures[0]["error"])
        return f"{'stalled' if figures[0]['error'].startswith('sent nothing') else 'failed'} [{len(notes)}]", None
    eps = statistics.median(f["events_per_s"] for f in ok)
    us = statistics.median(f["us_per_event"] for f in ok)
    return f"{eps:>9,.0f} {us:>8.1f}", us


def main(argv=None) -> int:
    a = _parse(sys.argv[1:] if argv is None else argv)
    if "amqp" in a.only:
        from stack.rabbitmq import INSTALL_HINT, installed

        if not installed():
            print(f"bench.transports: error: {INSTALL_HINT}", file=sys.stderr)
            return 2
    if shutil.which("java") is None:
        print("bench.transports: error: the brokers and their tools need Java 17", file=sys.stderr)
        return 2
    try:
        libs = _libs(a.only)
    except RuntimeError as e:
        print(f"bench.transports: error: {e}", file=sys.stderr)
        return 2
    folder = tempfile.mkdtemp(prefix="bench-transports-")
    notes: list[str] = []
    brokers = Brokers(a.only, folder)
    print("the broker's own tool: " + "; ".join(f"{BROKER_NAMES[t]}: {PEER_NAMES[t]}" for t in PEER_NAMES if t in a.only))
    print(f"{'broker':<26} {'rate':>9} | {'flightwatch, 1 worker':>18} | {'2 workers':>18} | {'its own tool':>18}"
          f" | {'CPU ratio':>10}")
    print(f"{'':<26} {'':>9} | {'events/s':>9} {'µs/event':>8} | {'events/s':>9} {'µs/event':>8} | "
          f"{'events/s':>9} {'µs/event':>8} | {'1 w / tool':>10}")
    try:
        for transport in ("amqp", "amqp1", "kafka"):
            if transport not in a.only:
                continue
            port = brokers.ports[transport]
            for rate in a.rates:
                figures: dict[str, list] = {"w1": [], "w2": [], "peer": []}
                for _ in range(a.repeat):
                    for key, workers in (("w1", 1), ("w2", 2)):
                        brokers.purge(transport)
                        out = os.path.join(folder, f"lg-{time.time_ns()}")
                        figures[key].append(measure(ours(transport, port, rate, workers, a.seconds, out),
                                                    "flightwatch", a.seconds, dict(os.environ, PYTHONPATH=ROOT)))
                    brokers.purge(transport)
                    kind, cmd = peer(transport, port, rate, a.seconds, libs)
                    figures["peer"].append(measure(cmd, kind, a.seconds))
                (w1, us1), (w2, _), (tool, us_tool) = (_row(figures[k], notes) for k in ("w1", "w2", "peer"))
                ratio = f"{us1 / us_tool:.2f}x" if us1 and us_tool else "-"
                print(f"{BROKER_NAMES[transport]:<26} {f'{rate:,}/s' if rate else 'unbounded':>9} | {w1:>18} | "
                      f"{w2:>18} | {tool:>18} | {ratio:>10}", flush=True)
    finally:
        brokers.close()
        shutil.rmtree(folder, ignore_errors=True)
    print(f"(medians of {a.repeat}; {a.seconds:g} s each, the first {SKIP_LINES} seconds and the last left out; "
          f"{PAYLOAD}-byte events; 2 cores shared with the broker)")
    for i, note in enumerate(notes, 1):
        print(f"[{i}] {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
