"""HTTP receiver benchmark: events/s at saturation with telemetry off and on, driven by `wrk`.

Usage:
    python -m bench.receiver [--seconds 8] [--repeats 5] [--payload 1024]

`wrk -t1 -c50` POSTs binary-mode CloudEvents (a Lua script gives each request its own
``ce-id``) at the receiver as fast as it answers, for --seconds. Cases, interleaved, --repeats
times each, medians reported:

  nginx             Debian nginx ``return 202`` on the same port layout: what wrk itself reaches
                    here (the driver's ceiling, not a receiver)
  receiver, off     ``agents.receiver http --no-telemetry``: the sink's own capacity
  receiver, on      with telemetry: each receive spooled before its 202, shipped into a Tansu broker

On two or more CPUs the receiver is pinned to CPU 0 and everything else (wrk, the shipper,
the broker) to CPU 1, so the receiver has one core in every case and the figures compare
its own cost. CPU per event is measured from /proc for the receiver, the shipper and the
broker. After each telemetry-on run the benchmark checks that every receive was shipped.
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
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.loadgen import NGINX_CONF  # noqa: E402
from core.procs import free_port, stop_process, wait_port  # noqa: E402
from stack.tansu import start_tansu  # noqa: E402

LUA = """
counter = 0
body = string.rep("x", %d)
request = function()
  counter = counter + 1
  return wrk.format("POST", "/", {["ce-id"] = "b-" .. counter, ["ce-fwrun"] = "bench", ["ce-specversion"] = "1.0",
                                  ["ce-type"] = "dev.flightwatch.bench", ["ce-source"] = "wrk",
                                  ["content-type"] = "application/octet-stream"}, body)
end
"""
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    try:
        f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(f[11]) + int(f[12])) / TICKS


def pin(pid: int, cpu: int | None) -> None:
    if cpu is not None:
        for task in os.listdir(f"/proc/{pid}/task"):
            os.sched_setaffinity(int(task), {cpu})


def run_wrk(port: int, seconds: float, lua: str, cpu: int | None) -> float:
    cmd = ["wrk", "-t1", "-c50", f"-d{seconds:g}s", "-s", lua, f"http://127.0.0.1:{port}/"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True,
                         preexec_fn=(lambda: os.sched_setaffinity(0, {cpu})) if cpu is not None else None).stdout
    if "Non-2xx" in out:
        raise RuntimeError("the sink answered errors:\n" + out)
    return float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))


def bench_receiver(port: int, seconds: float, lua: str, telemetry: str | None, workdir: str, cpus) -> dict:
    spool = os.path.join(workdir, f"spool-{time.time_ns()}")
    args = [sys.executable, "-m", "agents.receiver", "http", "--listen", f"127.0.0.1:{port}", "--clock-reference", "none"]
    args += ["--telemetry-bootstrap", telemetry, "--telemetry-topic", "bench-receiver", "--spool-dir", spool] if telemetry \
        else ["--no-telemetry"]
    proc = subprocess.Popen(args, cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        if not wait_port(port, 30):
            raise RuntimeError("receiver did not start")
        time.sleep(1.0)  # the shipper's imports
        pin(proc.pid, cpus[0])
        shippers = [int(p) for p in open(f"/proc/{proc.pid}/task/{proc.pid}/children").read().split()]
        for s in shippers:
            pin(s, cpus[1])
        r0, s0 = cpu_s(proc.pid), sum(cpu_s(s) for s in shippers)
        rps = run_wrk(port, seconds, lua, cpus[1])
        r1, s1 = cpu_s(proc.pid), sum(cpu_s(s) for s in shippers)
        health = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5))
        events = health["received"]
        shipped_s = None
        if telemetry:  # every receive shipped?
            t0 = time.monotonic()
            agent = os.path.join(spool, "receiver-http")
            while time.monotonic() - t0 < 60:
                pos = json.load(open(os.path.join(agent, "shipped")))
                seg = os.path.join(agent, f"{pos['segment']:012d}.ndjson")
                with open(seg, "rb") as f:
                    f.seek(pos["offset"])
                    if not f.read(1).strip(b"\0"):
                        break
                time.sleep(0.05)
            else:
                raise RuntimeError("the shipper did not catch up within 60 s")
            shipped_s = time.monotonic() - t0
            s1 = sum(cpu_s(s) for s in shippers)
    finally:
        stop_process(proc, wait_s=60, group=True)
        shutil.rmtree(spool, ignore_errors=True)
    return {"rps": rps, "events": events, "recv_us": (r1 - r0) / events * 1e6, "ship_us": (s1 - s0) / events * 1e6,
            "catch_up_s": shipped_s}


def bench_nginx(port: int, seconds: float, lua: str, workdir: str, cpus) -> dict:
    d = tempfile.mkdtemp(dir=workdir)
    os.makedirs(os.path.join(d, "body"))
    conf = os.path.join(d, "nginx.conf")
    open(conf, "w").write(NGINX_CONF.format(dir=d, port=port))
    proc = subprocess.Popen(["nginx", "-c", conf, "-p", d], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        if not wait_port(port, 10):
            raise RuntimeError("nginx did not start")
        for pid in [proc.pid] + [int(p) for p in open(f"/proc/{proc.pid}/task/{proc.pid}/children").read().split()]:
            pin(pid, cpus[0])
        return {"rps": run_wrk(port, seconds, lua, cpus[1])}
    finally:
        stop_process(proc, wait_s=60, group=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.receiver", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--seconds", type=float, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--payload", type=int, default=1024)
    a = ap.parse_args(argv)
    if not shutil.which("wrk"):
        print("bench.receiver: error: needs wrk (apt-get install wrk)", file=sys.stderr)
        return 2
    cpus = (0, 1) if len(os.sched_getaffinity(0)) >= 2 else (None, None)
    work = tempfile.mkdtemp(prefix="flightwatch-bench-receiver-")
    lua = os.path.join(work, "ce.lua")
    open(lua, "w").write(LUA % a.payload)
    broker_port = free_port()
    broker = start_tansu(broker_port, cluster_id="bench-receiver")
    pin(broker.pid, cpus[1])
    runs = {"nginx": [], "off": [], "on": []}
    try:
        for k in range(a.repeats):
            if shutil.which("nginx"):
                runs["nginx"].append(bench_nginx(free_port(), a.seconds, lua, work, cpus))
            runs["off"].append(bench_receiver(free_port(), a.seconds, lua, None, work, cpus))
            b0 = cpu_s(broker.pid)
            on = bench_receiver(free_port(), a.seconds, lua, f"127.0.0.1:{broker_port}", work, cpus)
            on["broker_us"] = (cpu_s(broker.pid) - b0) / on["events"] * 1e6
            runs["on"].append(on)
            print(f"  repeat {k + 1}/{a.repeats}: " + ", ".join(f"{name} {r[-1]['rps']:,.0f}/s" for name, r in runs.items() if r),
                  flush=True)
    finally:
        stop_process(broker)
        shutil.rmtree(work, ignore_errors=True)

    def med(name, key):
        vals = [r[key] for r in runs[name] if r.get(key) is not None]
        return statistics.median(vals) if vals else None

    off, on = med("off", "rps"), med("on", "rps")
    print(f"\nHTTP receiver, wrk -t1 -c50, {a.payload} B binary-mode CloudEvents, {a.seconds:g} s x {a.repeats}, medians"
          + (" (receiver pinned to CPU 0; wrk, shipper, broker to CPU 1)" if cpus[0] is not None else ""))
    print("| sink | events/s | vs telemetry off | receiver CPU µs/event | shipper µs/event | broker µs/event |")
    print("|---|---|---|---|---|---|")
    if runs["nginx"]:
        print(f"| nginx `return 202` (wrk's ceiling) | {med('nginx', 'rps'):,.0f} | | | | |")
    print(f"| receiver, telemetry off | {off:,.0f} | 1.00 | {med('off', 'recv_us'):.1f} | | |")
    print(f"| receiver, telemetry on | {on:,.0f} | {on / off:.2f} | {med('on', 'recv_us'):.1f} | {med('on', 'ship_us'):.1f} | "
          f"{med('on', 'broker_us'):.1f} |")
    cost = 1 - on / off
    print(f"\ntelemetry cost: {cost:.1%} of the receiver's capacity (goal <= 10%: {'met' if cost <= 0.10 else 'NOT met'}); "
          f"with telemetry {on:,.0f} events/s (goal >= 10,000: {'met' if on >= 10_000 else 'NOT met'}); "
          f"shipper caught up {med('on', 'catch_up_s'):.2f} s after the load stopped (median)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
