"""Footprint benchmark: what flightwatch itself costs on this machine, per component, idle and under load.

Usage:
    python -m bench.footprint [--idle-seconds 60] [--rates 1000,5000,20000] [--step-seconds 20] [--repeats 3]

Uses the embedded stack (starts it if it is not running, and then stops it at the end). Cases:
  idle     the stack, a live streaming job and the dashboard (no browser open), no attack:
           --idle-seconds, cut in --repeats equal slices
  RATE/s   the load generator attacks the stack's HTTP receiver at each rate (one paced attack,
           a --step-seconds step per rate, into the same live job), --repeats times; each step is
           measured from 4 s after its start to 1 s before its end

Per component: CPU in cores (CPU seconds / wall seconds) and, under load, CPU µs per event
(events counted by the HTTP receiver), with RSS in MiB; medians over the repeats. Components:
the job's JVM, Python driver and pyspark workers; each agent (the HTTP receiver with its shipper,
the Kafka receiver, node metrics); both brokers; Prometheus and the node exporter; the UI; the load
generator. The SUT broker is shown apart (the system under test, not flightwatch; idle here, the
HTTP receiver being the target). Goals are printed beside the totals.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request

import psutil

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from core import observer  # noqa: E402
from core.procs import stop_process  # noqa: E402
from stack.config import Stack  # noqa: E402

STACK = Stack.configured()
"""The stack this benchmark drives, as the settings name it."""

TELEMETRY = ("telemetry-broker", "http-receiver", "job: JVM", "job: Python driver", "job: pyspark workers")
"""What carries telemetry (writers are the receiver and its shipper; the load generator's own records are
counted with it)."""
GOALS = {"idle": {"flightwatch": 0.15}, 5000: {"job": 0.35, "telemetry": 0.6}}
"""Issue 17's goals in cores: the whole observer at idle; at 5,000 events/s the job, and all telemetry."""


def component_of(pid: int, role: str, root_pid: int) -> str:
    """A readable component name for one process of a flightwatch tree."""
    if role == "streaming":
        if pid == root_pid:
            return "job: Python driver"
        try:
            exe = psutil.Process(pid).name()
        except psutil.Error:
            exe = ""
        return "job: JVM" if exe == "java" else "job: pyspark workers"
    if role == "loadgen":
        return "load generator"
    return role


def processes(extra_roots: dict[int, str]) -> dict[int, str]:
    """PID -> component of every flightwatch process, plus the SUT broker (component 'SUT: sut-broker')."""
    roots = {**observer.roots(), **extra_roots}
    out = {}
    for root, role in roots.items():
        for pid in observer.with_children({root: role}):
            out[pid] = component_of(pid, role, root)
    sut = STACK.recorded_pid("sut-broker")
    if sut:
        out[sut] = "SUT: sut-broker"
    return out


def received_count() -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{STACK.ports['http-receiver']}/healthz", timeout=5) as r:
        return int(json.load(r)["received"])


def measure(seconds: float, extra_roots: dict[int, str]) -> dict:
    """CPU (cores) and median RSS (MiB) per component over ``seconds``, and events received."""
    procs = processes(extra_roots)
    t0 = time.time()
    cpu0 = observer.read_cpu(procs)
    n0 = received_count()
    rss: dict[str, list[float]] = {}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(min(2.0, max(end - time.monotonic(), 0)))
        procs.update(processes(extra_roots))
        per: dict[str, float] = {}
        for pid, comp in procs.items():
            try:
                per[comp] = per.get(comp, 0) + psutil.Process(pid).memory_info().rss / 2**20
            except psutil.Error:
                pass
        for comp, mib in per.items():
            rss.setdefault(comp, []).append(mib)
    cpu1 = observer.read_cpu(procs)
    t1 = time.time()
    n1 = received_count()
    cores: dict[str, float] = {}
    for key, cpu_s in cpu1.items():
        comp = procs[key[0]]
        cores[comp] = cores.get(comp, 0.0) + observer.cores_used(cpu0, {key: cpu_s}, t0, t1)
    return {"cores": cores, "rss_mib": {c: statistics.median(v) for c, v in rss.items()}, "events": n1 - n0,
            "seconds": t1 - t0}


def start_job(run_id: str, job_args: list[str] = ()) -> subprocess.Popen:
    from core.rundir import RunPaths

    paths = RunPaths.of_run(run_id)
    os.makedirs(paths.root, exist_ok=True)
    job = subprocess.Popen([sys.executable, "-m", "streaming", "run", "--run", run_id, *job_args], cwd=ROOT,
                           stdout=open(paths.job_log, "ab"), stderr=subprocess.STDOUT,
                           env=dict(os.environ, PYTHONPATH=ROOT), start_new_session=True)
    deadline = time.monotonic() + 180
    batches = paths.batches
    while time.monotonic() < deadline and job.poll() is None:
        if os.path.isdir(batches) and os.listdir(batches):
            return job
        time.sleep(0.5)
    stop_process(job, group=True)
    raise RuntimeError(f"the streaming job did not start; see {paths.job_log}")


def totals(cores: dict[str, float]) -> dict[str, float]:
    fw = sum(v for c, v in cores.items() if not c.startswith("SUT"))
    job = sum(v for c, v in cores.items() if c.startswith("job:"))
    tel = sum(v for c, v in cores.items() if c in TELEMETRY)
    return {"flightwatch": fw, "job": job, "telemetry": tel}


def median_case(results: list[dict]) -> dict:
    comps = sorted({c for r in results for c in r["cores"]})
    out = {"cores": {c: statistics.median(r["cores"].get(c, 0.0) for r in results) for c in comps},
           "rss_mib": {c: statistics.median(r["rss_mib"].get(c, 0.0) for r in results) for c in comps},
           "events_per_s": statistics.median(r["events"] / r["seconds"] for r in results)}
    out["totals"] = {k: statistics.median(totals(r["cores"])[k] for r in results) for k in ("flightwatch", "job", "telemetry")}
    out["us_per_event"] = {c: (v / out["events_per_s"] * 1e6 if out["events_per_s"] else None) for c, v in out["cores"].items()}
    return out


def print_table(cases: dict) -> None:
    names = list(cases)
    comps = sorted({c for case in cases.values() for c in case["cores"]}, key=lambda c: (c.startswith("SUT"), c))
    head = f"{'component':24}" + "".join(f"{str(n) + ('/s' if n != 'idle' else ''):>26}" for n in names)
    print("\nflightwatch footprint: cores (CPU µs per event) · RSS MiB, medians of the repeats")
    print(head)
    print("-" * len(head))
    for c in comps:
        cells = []
        for n in names:
            case = cases[n]
            cores, us, mib = case["cores"].get(c, 0.0), case["us_per_event"].get(c), case["rss_mib"].get(c, 0.0)
            cell = f"{cores:.3f}" + (f" ({us:,.0f} µs)" if n != "idle" and us is not None else "") + f" · {mib:,.0f}"
            cells.append(f"{cell:>26}")
        print(f"{c:24}" + "".join(cells))
    print("-" * len(head))
    for key, label in (("flightwatch", "all flightwatch"), ("telemetry", "telemetry (writers..job)"), ("job", "streaming job")):
        cells = []
        for n in names:
            v = cases[n]["totals"][key]
            goal = GOALS.get(n, {}).get(key)
            mark = "" if goal is None else (f" ≤{goal:g} ok" if v <= goal else f" >{goal:g} GAP")
            us = v / cases[n]["events_per_s"] * 1e6 if n != "idle" and cases[n]["events_per_s"] else None
            cells.append(f"{f'{v:.3f}' + (f' ({us:,.0f} µs)' if us else '') + mark:>26}")
        print(f"{label:24}" + "".join(cells))
    print(f"{'events/s (receiver)':24}" + "".join(f"{cases[n]['events_per_s']:>26,.0f}" for n in names))
    print(f"{'machine busy (cores)':24}" + "".join(f"{cases[n].get('machine_cores', 0):>26.2f}" for n in names))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.footprint", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--idle-seconds", type=float, default=60)
    ap.add_argument("--rates", default="1000,5000,20000")
    ap.add_argument("--step-seconds", type=float, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", help="also write the figures here")
    ap.add_argument("--job-args", default="", help="extra flags for the streaming job, e.g. '--trigger 1s'")
    a = ap.parse_args(argv)
    try:
        rates = [int(r) for r in a.rates.split(",") if r]
    except ValueError:
        print(f"footprint: error: --rates {a.rates!r}: expected numbers like 1000,5000", file=sys.stderr)
        return 2
    if a.step_seconds < 8 or a.idle_seconds < 3 * a.repeats or a.repeats < 1:
        print("footprint: error: --step-seconds must be >= 8, --idle-seconds >= 3 x --repeats", file=sys.stderr)
        return 2
    started_stack = STACK.recorded_pid("http-receiver") is None
    if started_stack:
        print("footprint: starting the embedded stack (make up) ...", flush=True)
        if subprocess.run([sys.executable, "-m", "stack", "up"], cwd=ROOT, stdout=subprocess.DEVNULL).returncode:
            print("footprint: error: the stack did not start (make up says why)", file=sys.stderr)
            return 1
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    cases: dict = {}
    try:
        run_id = f"footprint-idle-{stamp}"
        job = start_job(run_id, a.job_args.split())
        try:
            time.sleep(5)  # start-up is over: the first batches are done
            slices = []
            for i in range(a.repeats):
                before = psutil.cpu_times()
                r = measure(a.idle_seconds / a.repeats, {job.pid: "streaming"})
                r["machine_cores"] = _busy_cores(before, psutil.cpu_times())
                slices.append(r)
                print(f"idle {i + 1}/{a.repeats}: flightwatch {totals(r['cores'])['flightwatch']:.3f} cores, "
                      f"job {totals(r['cores'])['job']:.3f}", flush=True)
            cases["idle"] = median_case(slices)
            cases["idle"]["machine_cores"] = statistics.median(s["machine_cores"] for s in slices)
        finally:
            stop_process(job, wait_s=20, group=True)
        per_rate: dict[int, list[dict]] = {r: [] for r in rates}
        for rep in range(a.repeats if rates else 0):
            run_id = f"footprint-{stamp}-{rep + 1}"
            job = start_job(run_id, a.job_args.split())
            pace = ",".join(f"{r}:{a.step_seconds:g}" for r in rates)
            lg = subprocess.Popen([sys.executable, "-m", "loadgen", "attack", "--pace", pace, "--target",
                                   f"http://127.0.0.1:{STACK.ports['http-receiver']}/", "--run", run_id, "--quiet"],
                                  cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), stdout=subprocess.DEVNULL,
                                  stderr=subprocess.STDOUT, start_new_session=True)
            try:
                t_start = _wait_first_receive()
                for i, rate in enumerate(rates):
                    _sleep_until(t_start + i * a.step_seconds + 4)
                    before = psutil.cpu_times()
                    r = measure(a.step_seconds - 5, {job.pid: "streaming", lg.pid: "loadgen"})
                    r["machine_cores"] = _busy_cores(before, psutil.cpu_times())
                    per_rate[rate].append(r)
                    t = totals(r["cores"])
                    print(f"repeat {rep + 1}, {rate:,}/s: {r['events'] / r['seconds']:,.0f} events/s, flightwatch "
                          f"{t['flightwatch']:.2f} cores, job {t['job']:.2f}, telemetry {t['telemetry']:.2f}", flush=True)
                lg.wait(60)
            finally:
                stop_process(lg, group=True)
                stop_process(job, wait_s=20, group=True)
        for rate, rs in per_rate.items():
            cases[rate] = median_case(rs)
            cases[rate]["machine_cores"] = statistics.median(s["machine_cores"] for s in rs)
    finally:
        if started_stack:
            subprocess.run([sys.executable, "-m", "stack", "down"], cwd=ROOT, stdout=subprocess.DEVNULL)
    print_table(cases)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({str(k): v for k, v in cases.items()}, f, indent=1)
    return 0


def _busy_cores(before, after) -> float:
    busy = lambda t: t.user + t.nice + t.system + t.irq + t.softirq + getattr(t, "steal", 0)  # noqa: E731
    total = lambda t: busy(t) + t.idle + getattr(t, "iowait", 0)  # noqa: E731
    span = total(after) - total(before)
    return (busy(after) - busy(before)) / span * psutil.cpu_count() if span > 0 else 0.0


def _wait_first_receive(timeout_s: float = 60) -> float:
    """Wall time of the attack's first receive (the pace steps count from there)."""
    n0 = received_count()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if received_count() > n0:
            return time.time()
        time.sleep(0.05)
    raise RuntimeError("the attack sent nothing within a minute")


def _sleep_until(t: float) -> None:
    time.sleep(max(0.0, t - time.time()))


if __name__ == "__main__":
    sys.exit(main())
