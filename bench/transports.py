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
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from core.suts import SUTS  # noqa: E402
from stack.peer import GENERATOR_LINE, SKIP_LINES, measure  # noqa: E402

PAYLOAD = 2048
INFLIGHT = 1000
UNBOUNDED = 200_000
"""The load generator's rate when unbounded: far above what it can send."""
QUEUE = "bench.transports"


def compared() -> dict[str, str]:
    """The SUTs whose broker's own tool speaks their transport, by that transport (``core.suts.Sut.peer``)."""
    from stack.peers import peer_of, peer_suts

    return {SUTS[sut].scheme: sut for sut in peer_suts() if peer_of(sut).speaks == SUTS[sut].scheme}


class Brokers:
    """The compared SUTs' brokers on free loopback ports, their state in a folder of their own (each as
    ``stack.brokers.Broker.start_alone`` starts it); ``close`` stops each by the PID it was started as."""

    def __init__(self, suts: list[str], folder: str) -> None:
        from core.procs import free_port
        from stack.brokers import BROKERS

        self.folder, self.ports, self.stops, self.brokers = folder, {}, [], {}
        try:
            for sut in suts:
                broker = BROKERS[SUTS[sut].broker]
                port = free_port()
                log = open(os.path.join(folder, f"{sut}.log"), "ab")
                proc = broker.start_alone(port, os.path.join(folder, sut), log)  # RuntimeError: not to be had here
                self.ports[sut], self.brokers[sut] = port, broker
                self.stops.append((broker.stop_alone, proc.pid))
        except BaseException:
            self.close()  # what had started
            raise

    def purge(self, sut: str) -> None:
        """The queue of the runs emptied, so that no run pays for the one before (a Kafka topic is a log, kept)."""
        if self.brokers[sut].purge is not None:
            self.brokers[sut].purge(self.ports[sut], QUEUE)

    def close(self) -> None:
        for stop, pid in reversed(self.stops):
            stop(pid)


def ours(sut: str, port: int, rate: int, workers: int, seconds: float, out: str) -> list[str]:
    target = SUTS[sut].target.format(address=f"127.0.0.1:{port}", queue=QUEUE)
    return [sys.executable, "-m", "loadgen", "attack", "--target", target, "--rate", str(rate or UNBOUNDED),
            "--duration", f"{seconds:g}s", "--workers", str(workers), "--max-inflight", str(INFLIGHT), "--payload",
            str(PAYLOAD), "--no-telemetry", "--metrics-listen", "none", "--timeout", "10s", "--wait", "0s",
            "--out", out]


def peer(sut: str, port: int, rate: int, seconds: float, libs: dict) -> tuple[str, list[str]]:
    """The broker's own tool's producer at ``rate`` (0: unbounded): (its line a second, its command)."""
    from stack.peers import peer_of

    tool = peer_of(sut)
    return tool.line, tool.producer(libs[sut], port, QUEUE, rate, seconds, PAYLOAD)


def _parse(argv) -> argparse.Namespace:
    from core.cli import OneLineParser

    p = OneLineParser(prog="python -m bench.transports", description=__doc__.split("\n\n")[0],
                      formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--seconds", type=float, default=14, help="each measurement (default %(default)s)")
    p.add_argument("--rates", default="1000,5000,0", help="events/s, 0 for unbounded (default %(default)s)")
    p.add_argument("--only", default=",".join(compared()), help="transports (default %(default)s)")
    p.add_argument("--repeat", type=int, default=1, help="repetitions; medians are printed (default %(default)s)")
    a = p.parse_args(argv)
    try:
        a.rates = [int(r) for r in a.rates.split(",")]
    except ValueError:
        p.error(f"--rates {a.rates!r}: events/s separated by commas, 0 for unbounded")
    a.only = {t for t in a.only.split(",") if t}
    if bad := a.only - set(compared()):
        p.error(f"--only: unknown transport {', '.join(sorted(bad))}: {', '.join(compared())}")
    if a.seconds < SKIP_LINES + 5 or a.repeat < 1 or any(r < 0 for r in a.rates):
        p.error(f"--seconds at least {SKIP_LINES + 5}, --repeat at least 1, rates >= 0")
    a.suts = [sut for transport, sut in compared().items() if transport in a.only]
    return a


def _libs(suts: list[str]) -> dict:
    from stack.peers import peer_of

    return {sut: peer_of(sut).fetch() for sut in suts}


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
    from stack.peers import peer_of

    if shutil.which("java") is None:
        print("bench.transports: error: the brokers and their tools need Java 17", file=sys.stderr)
        return 2
    try:
        libs = _libs(a.suts)
    except RuntimeError as e:
        print(f"bench.transports: error: {e}", file=sys.stderr)
        return 2
    folder = tempfile.mkdtemp(prefix="bench-transports-")
    notes: list[str] = []
    try:
        brokers = Brokers(a.suts, folder)
    except RuntimeError as e:
        print(f"bench.transports: error: {e}", file=sys.stderr)
        return 2
    print("the broker's own tool: " + "; ".join(f"{SUTS[sut].what}: {peer_of(sut).tool}" for sut in a.suts))
    print(f"{'broker':<26} {'rate':>9} | {'flightwatch, 1 worker':>18} | {'2 workers':>18} | {'its own tool':>18}"
          f" | {'CPU ratio':>10}")
    print(f"{'':<26} {'':>9} | {'events/s':>9} {'µs/event':>8} | {'events/s':>9} {'µs/event':>8} | "
          f"{'events/s':>9} {'µs/event':>8} | {'1 w / tool':>10}")
    try:
        for sut in a.suts:
            port = brokers.ports[sut]
            for rate in a.rates:
                figures: dict[str, list] = {"w1": [], "w2": [], "peer": []}
                for _ in range(a.repeat):
                    for key, workers in (("w1", 1), ("w2", 2)):
                        brokers.purge(sut)
                        out = os.path.join(folder, f"lg-{time.time_ns()}")
                        figures[key].append(measure(ours(sut, port, rate, workers, a.seconds, out),
                                                    GENERATOR_LINE, a.seconds, dict(os.environ, PYTHONPATH=ROOT)))
                    brokers.purge(sut)
                    kind, cmd = peer(sut, port, rate, a.seconds, libs)
                    figures["peer"].append(measure(cmd, kind, a.seconds))
                (w1, us1), (w2, _), (tool, us_tool) = (_row(figures[k], notes) for k in ("w1", "w2", "peer"))
                ratio = f"{us1 / us_tool:.2f}x" if us1 and us_tool else "-"
                print(f"{f'{sut} ({SUTS[sut].scheme})':<26} {f'{rate:,}/s' if rate else 'unbounded':>9} | {w1:>18} | "
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
