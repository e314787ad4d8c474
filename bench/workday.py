"""A day of load testing, compressed: the embedded stack up once, then attacks back to back with idle stretches
between them, every flightwatch process's CPU and memory and every log file's size sampled throughout.

    python -m bench.workday [--minutes 45]          (make workday)
    python -m bench.workday --short                 (make workday SHORT=1: 12 minutes, 3 runs; CI runs it)

The stack must be down: it runs `python -m stack up` itself, as an operator starts the day (and lets it settle for a
minute), and `stack down` at the end. The full day is 8 attacks, each as `make attack` runs one (`--stream`: the run's streaming job live beside it;
a Kafka attack renews the embedded SUT broker first): HTTP at 2,000/s and 1,000/s, Kafka at 5,000/s and 2,000/s,
each twice, and a paced run (200, 350, 500/s) through a relay of capacity 400/s; between runs, idle stretches of at
least 3 minutes (more to fill --minutes), one of them with a streaming job left live (`make stream`) all through it.
The short day is HTTP at 2,000/s, Kafka at 5,000/s and HTTP at 2,000/s again, 30 s each, 3.5-minute idle stretches,
the live job in the first: it spans several deletions of telemetry slices (a writer that spins after one would show).

Every 10 s it samples each process of the stack and of the runs (psutil: CPU seconds, RSS), and the size of every
log file. The SUT's own processes (the SUT broker, the relay) are sampled but are not flightwatch's. It checks:
  idle      in every idle stretch, from its second minute on, flightwatch's processes together use <= 0.15 core
  verdict   every fixed-rate run is judged ok; the paced run's knee is within one step of the relay's capacity
  repeat    no repetition of a run is a regression of its first in flight-time p50, p90 or p99, as `runs compare`
            judges it (95% intervals from a block bootstrap over windows; within noise: ±5%, or ±1 ms, the machine's
            own jitter between repeats)
  memory    every long-lived flightwatch process's RSS in the last idle stretch is within ±10% of the first's
            (medians, each from its second minute on); the embedded telemetry broker is shown, not judged: it holds
            the time slices of telemetry the last run's job has not deleted yet (the next job deletes them), so its
            RSS follows the last run's size, and the embedded SUT broker is the SUT's
  logs      every log file grows by at most 1 MiB an hour at idle
and prints the figures, writes them to checkpoints/workday-<UTC time>.json, and exits 1 if a check failed.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

import psutil

from bench.soak import SliceWatch, name_of
from core.procs import free_port, stop_process
from core.rundir import CHECKPOINTS, ROOT, RunPaths
from runs.compare import RunSample, compare
from stack.__main__ import PORTS, STACK_DIR

SAMPLE_EVERY_S = 10
IDLE_CORES = 0.15
REPEAT_JUDGED = ("p50", "p90", "p99")
RSS_TOLERANCE = 0.10
LOG_BYTES_PER_HOUR = 1 << 20
SETTLE_S = 60
"""An idle stretch is judged from its second minute on (the last run's job closing, the JVM's exit)."""
STACK_SETTLE_S = 60
"""After `make up`, before the first attack: the dashboard's and Prometheus' start-up took CPU from the first run
(its HTTP p99 4.1 ms, against 1.0 ms when repeated)."""
RELAY_CAPACITY = 400
PACE = "200:15s,350:15s,500:15s"
PACE_RATES = (200, 350, 500)


@dataclass
class Step:
    """One step of the day: an attack (``rate`` or the paced run through the relay) or an idle stretch."""
    kind: str                      # "run" or "idle"
    name: str
    target: str = ""               # http, kafka, relay
    rate: int = 0
    seconds: float = 0.0
    live_stream: bool = False      # idle: a streaming job left live through it
    started_s: float = 0.0
    ended_s: float = 0.0
    run_id: str = ""
    result: dict = field(default_factory=dict)


def plan(short: bool, minutes: float) -> list[Step]:
    runs = ([("http", 2000), ("kafka", 5000), ("http", 2000)] if short else
            [("http", 2000), ("kafka", 5000), ("relay", 0), ("http", 1000), ("kafka", 2000),
             ("http", 2000), ("kafka", 5000), ("http", 1000), ("kafka", 2000)])
    seconds = 30.0 if short else 60.0
    run_s = len(runs) * (seconds + 50)  # the job's start (~15 s) and its close (the 30 s drop timeout)
    idle_s = max(210.0 if short else 180.0, (minutes * 60 - run_s) / (len(runs) - 1))
    steps: list[Step] = []
    for i, (target, rate) in enumerate(runs):
        if i:
            steps.append(Step("idle", f"idle-{i}", seconds=idle_s, live_stream=(i == 1 if short else i == 3)))
        steps.append(Step("run", f"{target}-{rate}" if rate else "relay-paced", target, rate,
                          45.0 if target == "relay" else seconds))
    return steps


class Sampler:
    """Every ``SAMPLE_EVERY_S``: CPU seconds and RSS of the stack's processes and of this process's children (and
    their descendants), and the size of every log file. ``sut`` names the PIDs that are the system under test's."""

    def __init__(self, stack_pids: dict[str, int]) -> None:
        self.stack_pids = stack_pids
        self.sut: set[int] = set()
        self.samples: list[dict] = []
        self.slices = SliceWatch(f"127.0.0.1:{PORTS['telemetry-broker']}")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="workday-sampler", daemon=True)

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def processes(self) -> dict[int, psutil.Process]:
        roots = [psutil.Process(pid) for pid in self.stack_pids.values() if psutil.pid_exists(pid)]
        roots += psutil.Process().children()
        out = {}
        for r in roots:
            try:
                for p in [r, *r.children(recursive=True)]:
                    out[p.pid] = p
            except psutil.Error:
                continue
        return out

    def sample(self) -> dict:
        now = time.monotonic()
        procs = {}
        for pid, p in self.processes().items():
            try:
                with p.oneshot():
                    t = p.cpu_times()
                    name = _name(pid, self.stack_pids)
                    procs[pid] = {"name": name, "cpu_s": t.user + t.system, "rss": p.memory_info().rss,
                                  "sut": pid in self.sut or name == "sut-broker"}
            except psutil.Error:
                continue
        logs = {}
        for path in log_files():
            try:
                logs[os.path.relpath(path, ROOT)] = os.path.getsize(path)
            except OSError:
                pass
        self.slices.sample(time.time())
        s = {"t": now, "procs": procs, "logs": logs, "slices_deleted": self.slices.deleted}
        self.samples.append(s)
        return s

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(SAMPLE_EVERY_S)


def log_files() -> list[str]:
    return sorted(set(glob.glob(os.path.join(STACK_DIR, "*.log")) + glob.glob(os.path.join(STACK_DIR, "*", "*.log"))
                      + glob.glob(os.path.join(STACK_DIR, "spool", "*.log"))
                      + glob.glob(RunPaths.of_run("workday-*", CHECKPOINTS).job_log)))


def _name(pid: int, stack_pids: dict[str, int]) -> str:
    """The stack's name for one of its processes, else the module or program it runs (``bench.soak.name_of``)."""
    return next((name for name, p in stack_pids.items() if p == pid), None) or name_of(pid)


def attack(step: Step, run_id: str, log) -> dict:
    """One attack as `make attack` runs it; its summary (or what went wrong)."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    relay = None
    args = [sys.executable, "-m", "loadgen", "attack", "--run", run_id, "--stream", "--quiet"]
    if step.target == "kafka":
        subprocess.run([sys.executable, "-m", "stack", "renew-sut"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                       check=True)
        args += ["--rate", str(step.rate), "--duration", f"{step.seconds:g}s"]
    elif step.target == "http":
        args += ["--target", f"http://127.0.0.1:{PORTS['http-receiver']}/", "--rate", str(step.rate),
                 "--duration", f"{step.seconds:g}s"]
    else:
        port = free_port()
        relay = subprocess.Popen([sys.executable, "-m", "bench.capacity_relay", str(port),
                                  f"http://127.0.0.1:{PORTS['http-receiver']}/", "--capacity", str(RELAY_CAPACITY)],
                                 cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        args += ["--target", f"http://127.0.0.1:{port}/", "--pace", PACE]
    try:
        if relay is not None:
            step.result["relay_pid"] = relay.pid
        out = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
        log(out.stdout.strip().splitlines()[-1] if out.stdout.strip() else f"exit {out.returncode}")
    finally:
        if relay is not None:
            stop_process(relay)
    path = RunPaths.of_run(run_id, CHECKPOINTS).summary_file
    if not os.path.exists(path):
        return {"error": f"no summary ({out.stderr.strip()[-300:]})"}
    with open(path) as f:
        return json.load(f)


def live_job(run_id: str):
    """`make stream`: a streaming job left running (nothing to read but the machine's own records)."""
    return subprocess.Popen([sys.executable, "-m", "streaming", "run", "--run", run_id, "--starting-offsets", "latest",
                             "--metrics-listen", "none"],
                            cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), stdout=subprocess.DEVNULL,
                            stderr=subprocess.STDOUT, start_new_session=True)


def between(samples: list[dict], t0: float, t1: float) -> list[dict]:
    return [s for s in samples if t0 <= s["t"] <= t1]


def idle_cores(samples: list[dict]) -> tuple[float, dict[str, float]]:
    """flightwatch's cores over the samples (first to last), in total and by process name (processes in both)."""
    if len(samples) < 2:
        return float("nan"), {}
    a, b = samples[0], samples[-1]
    secs = b["t"] - a["t"]
    by: dict[str, float] = {}
    for pid, p in b["procs"].items():
        if p["sut"] or pid not in a["procs"]:
            continue
        by[p["name"]] = by.get(p["name"], 0.0) + (p["cpu_s"] - a["procs"][pid]["cpu_s"]) / secs
    # processes that came or went in between (a job closing): what they used inside the span is counted as well
    for s0, s1 in zip(samples, samples[1:]):
        for pid, p in s1["procs"].items():
            if not p["sut"] and pid not in a["procs"] and pid in s0["procs"]:
                by[p["name"]] = by.get(p["name"], 0.0) + (p["cpu_s"] - s0["procs"][pid]["cpu_s"]) / secs
    return sum(by.values()), by


CHECKS = ("idle", "verdict", "repeat", "memory", "logs")
"""The checks of the module's docstring, in its order."""


def judge(steps: list[Step], samples: list[dict]) -> tuple[list[tuple[str, str]], dict]:
    """The checks of the module's docstring: (failures as (check, what), figures)."""
    bad: list[tuple[str, str]] = []
    fig: dict = {"idle": [], "runs": [], "memory": [], "logs": []}
    idles = [s for s in steps if s.kind == "idle"]
    for st in idles:
        total, by = idle_cores(between(samples, st.started_s + SETTLE_S, st.ended_s))
        top = sorted(by.items(), key=lambda kv: -kv[1])[:4]
        fig["idle"].append({"name": st.name, "live_stream": st.live_stream, "minutes": (st.ended_s - st.started_s) / 60,
                            "cores": total, "top": top})
        if not total <= IDLE_CORES:
            bad.append(("idle", f"{st.name}: flightwatch used {total:.3f} cores at idle (at most {IDLE_CORES})"))
    first: dict[str, dict] = {}
    for st in [s for s in steps if s.kind == "run"]:
        s = st.result
        v = s.get("verdict") or {}
        lat = s.get("latency_us") or {}
        row = {"name": st.name, "run": st.run_id, "sent": s.get("sent"), "received": s.get("received"),
               "dropped": s.get("dropped"), "p50_us": lat.get("p50"), "p99_us": lat.get("p99"),
               "state": v.get("state"), "message": v.get("message") or s.get("error"),
               "knee": (v.get("knee") or {}).get("rate")}
        fig["runs"].append(row)
        if "error" in s:
            bad.append(("verdict", f"{st.name}: {s['error']}"))
            continue
        if st.target == "relay":
            want = max(i for i, r in enumerate(PACE_RATES) if r <= RELAY_CAPACITY)
            got = PACE_RATES.index(row["knee"]) if row["knee"] in PACE_RATES else None
            if got is None or abs(got - want) > 1:
                bad.append(("verdict", f"{st.name}: knee {row['knee']} not within one step of {PACE_RATES[want]}/s"))
        elif row["state"] != "ok":
            bad.append(("verdict", f"{st.name} ({st.run_id}): verdict {row['message']!r}"))
        ref = first.setdefault(st.name, row)
        if ref is not row:
            try:
                rep = compare(RunSample.load(RunPaths.of_run(ref["run"]).root), RunSample.load(RunPaths.of_run(row["run"]).root))
            except ValueError as e:
                bad.append(("repeat", f"{st.name} ({st.run_id}): not compared with {ref['run']}: {e}"))
                continue
            row["compared"] = rep["headline"]
            worse = [r for r in rep["whole_run"] if r["metric"] in REPEAT_JUDGED and r["verdict"] == "regression"]
            if worse:
                bad.append(("repeat", f"{st.name} ({st.run_id}) against its first run {ref['run']}: {rep['headline']}"))
    if len(idles) >= 2:
        a = between(samples, idles[0].started_s + SETTLE_S, idles[0].ended_s)
        b = between(samples, idles[-1].started_s + SETTLE_S, idles[-1].ended_s)
        for pid in sorted(set(a[0]["procs"]) & set(b[-1]["procs"]) if a and b else ()):
            p = b[-1]["procs"][pid]
            if p["sut"]:
                continue
            r0 = statistics.median(s["procs"][pid]["rss"] for s in a if pid in s["procs"])
            r1 = statistics.median(s["procs"][pid]["rss"] for s in b if pid in s["procs"])
            judged = p["name"] != "telemetry-broker"  # holds the last run's slices until the next job deletes them
            fig["memory"].append({"name": p["name"], "pid": pid, "first_mib": r0 / 2**20, "last_mib": r1 / 2**20,
                                  "change": r1 / r0 - 1, "judged": judged})
            if judged and abs(r1 / r0 - 1) > RSS_TOLERANCE:
                bad.append(("memory", f"{p['name']} ({pid}): RSS {r0 / 2**20:.0f} -> {r1 / 2**20:.0f} MiB ({r1 / r0 - 1:+.0%})"))
    grown: dict[str, float] = {}
    idle_h = 0.0
    for st in idles:
        span = between(samples, st.started_s + SETTLE_S, st.ended_s)
        if len(span) < 2:
            continue
        idle_h += (span[-1]["t"] - span[0]["t"]) / 3600
        for path, size in span[-1]["logs"].items():
            grown[path] = grown.get(path, 0) + size - span[0]["logs"].get(path, size)
    for path, g in sorted(grown.items()):
        rate = g / idle_h if idle_h else 0.0
        fig["logs"].append({"path": path, "bytes_per_hour": rate})
        if rate > LOG_BYTES_PER_HOUR:
            bad.append(("logs", f"{path}: grows {rate / 2**20:.2f} MiB an hour at idle"))
    fig["slices_deleted"] = samples[-1]["slices_deleted"] if samples else 0
    return bad, fig


def report(fig: dict) -> None:
    print(f"\nidle stretches (from their second minute): flightwatch's cores, at most {IDLE_CORES}")
    for r in fig["idle"]:
        top = ", ".join(f"{n} {c:.3f}" for n, c in r["top"])
        print(f"  {r['name']:<8} {r['minutes']:4.1f} min{' (live job)' if r['live_stream'] else '':<11} "
              f"{r['cores']:.3f} cores   ({top})")
    print(f"\nruns{'':<22}{'sent':>9} {'received':>9} {'dropped':>8} {'p50':>8} {'p99':>8}  verdict")
    for r in fig["runs"]:
        ms = lambda us: f"{us / 1000:.1f}ms" if us else "-"  # noqa: E731
        print(f"  {r['name']:<12} {r['run']:<12} {r['sent'] or 0:>9,} {r['received'] or 0:>9,} {r['dropped'] or 0:>8,} "
              f"{ms(r['p50_us']):>8} {ms(r['p99_us']):>8}  {r['message']}")
        if r.get("compared"):
            print(f"  {'':<12} against its first run: {r['compared']}")
    print(f"\nmemory (RSS, first idle stretch -> last; ±{RSS_TOLERANCE:.0%})")
    for r in sorted(fig["memory"], key=lambda r: r["name"]):
        print(f"  {r['name']:<32} {r['first_mib']:8.1f} -> {r['last_mib']:8.1f} MiB  {r['change']:+6.1%}"
              + ("" if r["judged"] else "  (holds the last run's telemetry slices: not judged)"))
    print("\nlogs at idle (at most 1 MiB an hour)")
    for r in fig["logs"]:
        print(f"  {r['path']:<52} {r['bytes_per_hour'] / 1024:9.1f} KiB/h")
    print(f"\ntelemetry slices deleted during the day: {fig['slices_deleted']}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.workday", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--minutes", type=float, help="length of the day (default 45, at least 45; --short: 12)")
    ap.add_argument("--short", action="store_true", help="the 12-minute day of 3 runs (CI)")
    try:
        a = ap.parse_args(argv)
    except SystemExit as e:
        return 2 if e.code else 0
    if a.minutes is None:
        a.minutes = 12.0 if a.short else 45.0
    if a.minutes < (12 if a.short else 45):
        print(f"workday: error: --minutes {a.minutes:g}: a day is at least 45 minutes (--short: 12)", file=sys.stderr)
        return 2
    from stack.__main__ import recorded_pid

    if any(recorded_pid(n) for n in ("telemetry-broker", "http-receiver", "node-metrics")):
        print("workday: error: the embedded stack is up; the day starts it itself (make down first)", file=sys.stderr)
        return 2
    steps = plan(a.short, a.minutes)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    t0 = time.monotonic()

    def log(text: str) -> None:
        print(f"[{(time.monotonic() - t0) / 60:5.1f} min] {text}", flush=True)

    env = dict(os.environ, PYTHONPATH=ROOT)
    log(f"workday: stack up, {sum(s.kind == 'run' for s in steps)} runs, idle stretches of "
        f"{next(s.seconds for s in steps if s.kind == 'idle') / 60:.1f} min; sampling every {SAMPLE_EVERY_S} s")
    if subprocess.run([sys.executable, "-m", "stack", "up"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL).returncode:
        print("workday: error: the stack did not start (see .stack/*.log)", file=sys.stderr)
        return 1
    stack_pids = {n: pid for n in ("telemetry-broker", "sut-broker", "prometheus", "node-exporter", "http-receiver",
                                   "kafka-receiver", "node-metrics", "ui") if (pid := recorded_pid(n))}
    sampler = Sampler(stack_pids).start()
    log(f"the stack settles for {STACK_SETTLE_S} s (its dashboard and Prometheus start up) before the first run")
    time.sleep(STACK_SETTLE_S)
    try:
        for i, st in enumerate(steps):
            st.started_s = time.monotonic()
            if st.kind == "idle":
                log(f"{st.name}: {st.seconds / 60:.1f} min" + (" with a live streaming job" if st.live_stream else ""))
                job = live_job(f"workday-{stamp}-live") if st.live_stream else None
                time.sleep(st.seconds)
                if job is not None:
                    stop_process(job, signal.SIGINT, wait_s=60, group=True)
            else:
                st.run_id = f"workday-{stamp}-{i}"
                log(f"{st.name}: attack {st.run_id}")
                st.result = attack(st, st.run_id, log)
                if "relay_pid" in st.result:
                    sampler.sut.add(st.result["relay_pid"])
                v = st.result.get("verdict") or {}
                log(f"{st.name}: {v.get('message') or st.result.get('error')}")
            st.ended_s = time.monotonic()
            sampler.stack_pids.update({n: pid for n in ("sut-broker", "kafka-receiver") if (pid := recorded_pid(n))})
    finally:
        sampler.stop()
        subprocess.run([sys.executable, "-m", "stack", "down"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
    bad, fig = judge(steps, sampler.samples)
    report(fig)
    out = os.path.join(CHECKPOINTS, f"workday-{stamp}.json")
    with open(out, "w") as f:
        json.dump({"figures": fig, "failures": [{"check": c, "what": w} for c, w in bad],
                   "minutes": (time.monotonic() - t0) / 60}, f, indent=1, default=str)
    log(f"figures in {out}")
    failed = {c for c, _ in bad}
    if bad:
        print("WORKDAY FAILED: " + "; ".join(w for _, w in bad))
    else:
        print(f"workday passed: {len(fig['runs'])} runs, {len(fig['idle'])} idle stretches, "
              f"{(time.monotonic() - t0) / 60:.0f} minutes")
    print(f"workday: {len(CHECKS) - len(failed)} passed, {len(failed)} failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
