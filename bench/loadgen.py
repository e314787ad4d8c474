"""Load-generator benchmark: max sustainable rate against nginx on loopback, beside `hey`.

Usage:
    python -m bench.loadgen [--seconds 10] [--payload 2048]

The sink is Debian's nginx answering ``return 202`` on 127.0.0.1 (fast enough not to be the
bottleneck). Each tool POSTs payload-sized bodies for --seconds:
  hey        -c 50, closed loop (its best throughput)
  loadgen    open loop at a rate far above what it can send: what it achieves is its ceiling
             (--workers 2), with telemetry off and on (send/ack records into a Tansu broker)
Reported: requests/s, ratio to hey, CPU seconds per 1,000 requests (the tool's processes).
Three repetitions each, medians.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import signal
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


def run_hey(url: str, seconds: float, payload_file: str) -> tuple[float, float]:
    cpu0 = children_cpu_s()
    out = subprocess.run(["hey", "-z", f"{seconds}s", "-c", "50", "-m", "POST", "-D", payload_file,
                          "-T", "application/octet-stream", url], capture_output=True, text=True, check=True).stdout
    cpu = children_cpu_s() - cpu0
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    return rps, cpu / (rps * seconds / 1000)


def run_loadgen(url: str, seconds: float, payload: int, telemetry: str | None, workdir: str) -> tuple[float, float]:
    out = os.path.join(workdir, f"lg-{time.time_ns()}")
    args = [sys.executable, "-m", "loadgen", "attack", "--rate", "200000", "--duration", f"{seconds}s", "--target", url,
            "--payload", str(payload), "--workers", "2", "--max-inflight", "64", "--quiet", "--out", out, "--timeout", "10s"]
    args += ["--telemetry-bootstrap", telemetry, "--telemetry-topic", f"bench-{time.time_ns()}"] if telemetry else ["--no-telemetry"]
    cpu0 = children_cpu_s()
    subprocess.run(args, cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True, text=True, check=True)
    cpu = children_cpu_s() - cpu0
    report = json.load(open(os.path.join(out, "report.json")))
    rps = report["completed"] / report["duration_s"]["attack"]  # completions per second of attack
    return rps, cpu / (report["completed"] / 1000)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.loadgen", description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--payload", type=int, default=2048)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args(argv)
    for tool in ("hey", "nginx"):
        if not shutil.which(tool) and not os.path.exists(f"/usr/sbin/{tool}"):
            print(f"bench.loadgen: error: {tool} is not installed (apt-get install {tool})", file=sys.stderr)
            return 2
    from stack.__main__ import free_port, start_tansu, wait_port

    workdir = tempfile.mkdtemp(prefix="flightwatch-bench-lg-")
    port = free_port()
    os.makedirs(os.path.join(workdir, "body"))
    conf = os.path.join(workdir, "nginx.conf")
    with open(conf, "w") as f:
        f.write(NGINX_CONF.format(dir=workdir, port=port))
    nginx = subprocess.Popen([shutil.which("nginx") or "/usr/sbin/nginx", "-c", conf, "-p", workdir],
                             stderr=subprocess.DEVNULL, start_new_session=True)
    kport = free_port()
    broker = start_tansu(kport, cluster_id="bench-lg")
    payload_file = os.path.join(workdir, "payload")
    with open(payload_file, "wb") as f:
        f.write(os.urandom(a.payload))
    url = f"http://127.0.0.1:{port}/"
    rows = {"hey -c 50": [], "loadgen, telemetry off": [], "loadgen, telemetry on": []}
    try:
        assert wait_port(port), "nginx did not start"
        for rep in range(a.repeat):
            rows["hey -c 50"].append(run_hey(url, a.seconds, payload_file))
            rows["loadgen, telemetry off"].append(run_loadgen(url, a.seconds, a.payload, None, workdir))
            rows["loadgen, telemetry on"].append(run_loadgen(url, a.seconds, a.payload, f"127.0.0.1:{kport}", workdir))
            print(f"repetition {rep + 1}/{a.repeat} done", flush=True)
    finally:
        for p in (nginx, broker):
            os.kill(p.pid, signal.SIGTERM)
            p.wait(10)
    hey_rps = statistics.median(r for r, _ in rows["hey -c 50"])
    print(f"\n{'tool':<24} {'requests/s':>11} {'vs hey':>7} {'cpu s / 1k req':>15}   (medians of {a.repeat}, "
          f"{a.seconds:g} s each, {a.payload} B POSTs to nginx on loopback, 2 cores shared with the sink)")
    for name, vals in rows.items():
        rps = statistics.median(r for r, _ in vals)
        cpu = statistics.median(c for _, c in vals)
        print(f"{name:<24} {rps:>11,.0f} {rps / hey_rps:>6.2f}x {cpu:>15.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
