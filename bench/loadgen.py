"""Load-generator benchmark: its ceiling beside `hey` and a raw librdkafka loop, and its CPU per event when paced.

Usage:
    python -m bench.loadgen [--seconds 10] [--payload 2048] [--repeat 3]

HTTP: the sink is Debian's nginx answering ``return 202`` on 127.0.0.1 (fast enough not to be the
bottleneck). Kafka: an embedded Tansu broker, a 4-partition topic. For --seconds each:
  hey -c 50            closed loop, its best throughput
  loadgen http         open loop at a rate far above what it can send: what it achieves is its
                       ceiling (--workers 2), telemetry off and on (send/ack records into Tansu)
  raw produce loop     confluent-kafka's Producer.produce + poll in a tight Python loop, the same
                       payload, key and headers: the limit of a Python Kafka client here
  loadgen kafka        open loop far above its ceiling, telemetry on
  paced                loadgen at 1,000/s and 2,000/s with one worker and at 5,000/s with --workers auto, on
                       each target, telemetry on: CPU µs per event (every process of the generator) and send
                       delay p99; for HTTP beside hey paced at the same rate (-q 500 a worker), as a CPU ratio,
                       and beside the raw http loop: the floor of a Python loop paced in 2 ms turns here
  acks                 loadgen kafka at 5,000/s with --kafka-option acks=1 and acks=all (librdkafka's default):
                       latency p99 (to the broker's ack) as a ratio
Reported: events/s, ratio to the reference measured in the same repetition, CPU µs per event (the
load generator's from its schedule's start, as its report gives it; hey's and the raw loop's whole).
Medians of --repeat repetitions.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

NGINX_CONF = """
worker_processes 1;
daemon off;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 8192; }}
http {{
  access_log off;
  client_body_temp_path {dir}/body;
  client_body_buffer_size 64k;
  server {{
    listen 127.0.0.1:{port} reuseport backlog=4096;
    keepalive_requests 1000000;
    location / {{ return 202; }}
  }}
}}
"""


def children_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_hey(url: str, seconds: float, payload_file: str, rate: int = 0) -> tuple[float, float]:
    """hey's best throughput (-c 50), or hey paced at ``rate``: workers of 500/s each (-q 500), at least two."""
    cpu0 = children_cpu_s()
    workers = max(2, rate // 500)
    pace = ["-c", str(workers), "-q", str(rate // workers)] if rate else ["-c", "50"]
    out = subprocess.run(["hey", "-z", f"{seconds}s", *pace, "-m", "POST", "-D", payload_file,
                          "-T", "application/octet-stream", url], capture_output=True, text=True, check=True).stdout
    cpu = children_cpu_s() - cpu0
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    return rps, cpu * 1e6 / (rps * seconds)  # requests/s, CPU µs per request


def run_loadgen(url: str, seconds: float, payload: int, telemetry: str | None, workdir: str, rate: int = 200_000,
                workers: str = "2", inflight: int = 64, extra: tuple = ()) -> tuple[float, float, float, float]:
    """(events/s completed, CPU µs per event, send delay p99 ms, latency p99 ms: to the answer or the broker's ack)
    of one attack; ``extra``: more flags."""
    out = os.path.join(workdir, f"lg-{time.time_ns()}")
    args = [sys.executable, "-m", "loadgen", "attack", "--rate", str(rate), "--duration", f"{seconds}s", "--target", url,
            "--payload", str(payload), "--workers", workers, "--max-inflight", str(inflight), "--quiet", "--out", out,
            "--timeout", "10s", *extra]
    args += ["--telemetry-bootstrap", telemetry, "--telemetry-topic", f"bench-{time.time_ns()}"] if telemetry else ["--no-telemetry"]
    subprocess.run(args, cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True, text=True, check=True)
    with open(os.path.join(out, "report.json")) as f:
        report = json.load(f)
    rps = report["completed"] / report["duration_s"]["attack"]  # completions per second of attack
    # CPU of the parent and every worker from the schedule's start (its own accounting): start-up left out
    return (rps, report["cpu"]["us_per_event"], (report["send_delay_us"].get("p99") or 0) / 1000,
            (report["latency_us"].get("p99") or 0) / 1000)


def raw_produce(bootstrap: str, topic: str, seconds: float, payload: int) -> None:
    """The reference: confluent-kafka's produce in a tight loop (polling every 1,000), as fast as it goes."""
    from confluent_kafka import Producer

    from core.kafka_options import librdkafka

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 1, "acks": 1, "enable.idempotence": False,
                  **librdkafka({})})
    p.list_topics(topic, timeout=10)
    value = os.urandom(payload)
    tail = [("ce_specversion", b"1.0"), ("ce_source", b"flightwatch/loadgen"), ("ce_type", b"dev.flightwatch.load"),
            ("ce_fwrun", b"bench"), ("content-type", b"application/octet-stream")]  # the same headers as loadgen's
    acked = [0]

    def report(err, _msg) -> None:
        acked[0] += err is None

    t0, k = time.monotonic(), 0
    while time.monotonic() - t0 < seconds:
        for _ in range(1000):
            key = b"raw-%d" % k
            try:
                p.produce(topic, value, key, headers=[("ce_id", key), ("ce_time", b"2026-11-26T00:00:00.000000Z"),
                                                     *tail], on_delivery=report)
            except BufferError:
                p.poll(0.01)
            k += 1
        p.poll(0)
    p.flush(30)
    print(json.dumps({"acked": acked[0], "seconds": time.monotonic() - t0}))


def raw_http_paced(url: str, seconds: float, payload: int, rate: int) -> None:
    """The floor of any Python loop paced in 2 ms turns here: wake, send what is due on idle keep-alive connections,
    read finished answers without waiting (no framing, no accounts, no telemetry). Prints its CPU per event."""
    host, port = url.split("//")[1].rstrip("/").split(":")
    head = f"POST / HTTP/1.1\r\nHost: {host}:{port}\r\ncontent-length: {payload}\r\n\r\n".encode()
    body, idle, busy = os.urandom(payload), [], []
    for _ in range(max(rate // 100, 8)):
        s = socket.create_connection((host, int(port)))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.setblocking(False)
        idle.append(s)
    n, t0, cpu0 = 0, time.monotonic(), time.process_time()
    while (now := time.monotonic()) - t0 < seconds:
        still = []
        for s in busy:
            try:
                s.recv(65536)
                idle.append(s)
            except BlockingIOError:
                still.append(s)
        busy = still
        for _ in range(min(int((now - t0) * rate) - n, len(idle))):
            s = idle.pop()
            s.sendmsg([head, body])
            busy.append(s)
            n += 1
        time.sleep(0.002)
    print(json.dumps({"sent": n, "seconds": time.monotonic() - t0, "cpu_s": time.process_time() - cpu0}))


def run_raw_http(url: str, seconds: float, payload: int, rate: int) -> tuple[float, float, float, float]:
    out = subprocess.run([sys.executable, "-m", "bench.loadgen", "--raw-http", url, str(seconds), str(payload), str(rate)],
                         cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True, text=True, check=True).stdout
    r = json.loads(out.strip().splitlines()[-1])
    return r["sent"] / r["seconds"], r["cpu_s"] * 1e6 / r["sent"], 0.0, 0.0


def run_raw(bootstrap: str, topic: str, seconds: float, payload: int) -> tuple[float, float, float, float]:
    cpu0 = children_cpu_s()
    out = subprocess.run([sys.executable, "-m", "bench.loadgen", "--raw-produce", bootstrap, topic, str(seconds), str(payload)],
                         cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True, text=True, check=True).stdout
    cpu = children_cpu_s() - cpu0
    r = json.loads(out.strip().splitlines()[-1])
    return r["acked"] / r["seconds"], cpu * 1e6 / r["acked"], 0.0, 0.0


def ratio_column(name: str, cases: dict) -> int:
    """What a row's ratio compares: CPU per event for the paced rows (against hey's at the same rate), latency p99 for
    acks=all (against acks=1), else events/s."""
    ref = cases[name][0] or ""
    return 1 if ref.startswith("hey -q") else 3 if ref.startswith("loadgen kafka") else 0


def _parse(argv) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.loadgen", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--seconds", type=float, default=10, help="length of each attack (default %(default)s)")
    ap.add_argument("--payload", type=int, default=2048, help="event bytes (default %(default)s)")
    ap.add_argument("--repeat", type=int, default=3, help="repetitions; medians are reported (default %(default)s)")
    ap.add_argument("--only", help="only the rows whose name holds this text (e.g. '/s' for the paced rows)")
    return ap.parse_args(argv)


class Targets:
    """The attacked: nginx answering 204 (HTTP) and a Tansu broker (Kafka), in a folder of their own; ``close``
    stops both."""

    def __init__(self, payload: int) -> None:
        from core.kafka_options import create_topic
        from core.procs import free_port
        from stack.tansu import start_tansu

        self.workdir = tempfile.mkdtemp(prefix="flightwatch-bench-lg-")
        self.port = free_port()
        os.makedirs(os.path.join(self.workdir, "body"))
        conf = os.path.join(self.workdir, "nginx.conf")
        with open(conf, "w") as f:
            f.write(NGINX_CONF.format(dir=self.workdir, port=self.port))
        self.nginx = subprocess.Popen([shutil.which("nginx") or "/usr/sbin/nginx", "-c", conf, "-p", self.workdir],
                                      stderr=subprocess.DEVNULL, start_new_session=True)
        kport = free_port()
        self.broker = start_tansu(kport, cluster_id="bench-lg")
        self.bootstrap = f"127.0.0.1:{kport}"
        create_topic(self.bootstrap, "bench-sut", 4, {})
        self.kafka_url = f"kafka://{self.bootstrap}/bench-sut"
        self.url = f"http://127.0.0.1:{self.port}/"
        self.payload_file = os.path.join(self.workdir, "payload")
        with open(self.payload_file, "wb") as f:
            f.write(os.urandom(payload))

    def close(self) -> None:
        for proc in (self.nginx, self.broker):
            os.kill(proc.pid, signal.SIGTERM)
            proc.wait(10)


def _cases(a: argparse.Namespace, t: Targets) -> dict:
    """name -> (the reference row's name or None, a function measuring (events/s, cpu µs/event, send delay p99,
    latency p99))."""
    secs, p, url, kafka_url, bootstrap, workdir = a.seconds, a.payload, t.url, t.kafka_url, t.bootstrap, t.workdir
    cases = {
        "hey -c 50 (http)": (None, lambda: (*run_hey(url, secs, t.payload_file), 0.0, 0.0)),
        "loadgen http, telemetry off": ("hey -c 50 (http)", lambda: run_loadgen(url, secs, p, None, workdir)),
        "loadgen http, telemetry on": ("hey -c 50 (http)", lambda: run_loadgen(url, secs, p, bootstrap, workdir)),
        "raw produce loop (kafka)": (None, lambda: run_raw(bootstrap, "bench-sut", secs, p)),
        "loadgen kafka, telemetry on": ("raw produce loop (kafka)",
                                        lambda: run_loadgen(kafka_url, secs, p, bootstrap, workdir, inflight=20_000)),
    }
    for rate, workers in ((1000, "1"), (2000, "1"), (5000, "auto")):
        w = " 1 worker" if workers == "1" else ""
        ref = f"hey -q, {rate:,}/s (http)"
        cases[ref] = (None, lambda r=rate: (*run_hey(url, secs, t.payload_file, r), 0.0, 0.0))
        if workers == "1":
            cases[f"raw http loop, {rate:,}/s"] = (ref, lambda r=rate: run_raw_http(url, secs, p, r))
        cases[f"loadgen http {rate:,}/s{w}"] = (ref, lambda r=rate, n=workers: run_loadgen(url, secs, p, bootstrap, workdir, r, n, 1000))
        cases[f"loadgen kafka {rate:,}/s{w}"] = (None, lambda r=rate, n=workers: run_loadgen(kafka_url, secs, p, bootstrap, workdir,
                                                                                             r, n, 1000))
    for acks in ("1", "all"):  # librdkafka's default (all) against the leader's ack alone: the ratio is of latency p99
        cases[f"loadgen kafka 5,000/s acks={acks}"] = (
            "loadgen kafka 5,000/s acks=1" if acks == "all" else None,
            lambda a_=acks: run_loadgen(kafka_url, secs, p, bootstrap, workdir, 5000, "auto", 1000, ("--kafka-option", f"acks={a_}")))
    if a.only:
        cases = {k: v for k, v in cases.items() if a.only in k or any(a.only in name for name in (v[0] or "",))}
        cases = {k: v for k, v in cases.items() if v[0] is None or v[0] in cases}
    return cases


def _measure(cases: dict, repeat: int) -> tuple[dict[str, list], dict[str, list]]:
    """(every repetition's figures per row, its ratio to its reference's of the same repetition)."""
    rows: dict[str, list] = {name: [] for name in cases}
    ratios: dict[str, list] = {name: [] for name, (ref, _) in cases.items() if ref}
    for rep in range(repeat):
        for name, (ref, measure) in cases.items():
            rows[name].append(measure())
            if ref:
                col = ratio_column(name, cases)
                ratios[name].append(rows[name][-1][col] / rows[ref][-1][col])
        print(f"repetition {rep + 1}/{repeat} done", flush=True)
    return rows, ratios


def _table(a: argparse.Namespace, cases: dict, rows: dict[str, list], ratios: dict[str, list]) -> None:
    print(f"\n{'':<34} {'events/s':>9} {'ratio':>18} {'cpu µs/event':>13} {'send delay p99':>15} {'latency p99':>12}   "
          f"(medians of {a.repeat}, {a.seconds:g} s each, {a.payload} B events, 2 cores shared with the sink)")
    for name, vals in rows.items():
        rps, cpu, delay, latency = (statistics.median(v[i] for v in vals) for i in range(4))
        ref = cases[name][0]
        what = {0: "", 1: " cpu", 3: " p99"}[ratio_column(name, cases)] if ref else ""
        ratio = f"{statistics.median(ratios[name]):.2f}x {ref.split(' ')[0]}{what}" if ref else ""
        if ref and ref.startswith("loadgen kafka"):
            ratio = f"{statistics.median(ratios[name]):.2f}x acks=1{what}"
        print(f"{name:<34} {rps:>9,.0f} {ratio:>18} {cpu:>13.1f} {f'{delay:.1f} ms' if delay else '':>15} "
              f"{f'{latency:.1f} ms' if latency else '':>12}")
    print("goals: http with telemetry >= 1.0x hey; kafka with telemetry >= 0.7x raw; paced http at most 1.0x hey's CPU a"
          " request at every rate")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--raw-produce"]:  # the reference loop, in a process of its own
        raw_produce(argv[1], argv[2], float(argv[3]), int(argv[4]))
        return 0
    if argv[:1] == ["--raw-http"]:  # the paced floor, in a process of its own
        raw_http_paced(argv[1], float(argv[2]), int(argv[3]), int(argv[4]))
        return 0
    a = _parse(argv)
    for tool in ("hey", "nginx"):
        if not shutil.which(tool) and not os.path.exists(f"/usr/sbin/{tool}"):
            print(f"bench.loadgen: error: {tool} is not installed (apt-get install {tool})", file=sys.stderr)
            return 2
    from core.procs import wait_port

    targets = Targets(a.payload)
    cases = _cases(a, targets)
    try:
        assert wait_port(targets.port), "nginx did not start"
        rows, ratios = _measure(cases, a.repeat)
    finally:
        targets.close()
    _table(a, cases, rows, ratios)
    return 0


if __name__ == "__main__":
    sys.exit(main())
