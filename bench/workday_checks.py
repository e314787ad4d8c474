"""The checks of a day of testing (``bench.workday``) over its steps and samples, and their table.

A sample (every ``bench.workday.SAMPLE_EVERY_S``) is ``{"t": s, "procs": {pid: {"name", "cpu_s", "rss", "sut"}},
"logs": {path: bytes}, "slices_deleted": n}``; a step has ``kind`` ("run" or "idle"), ``name``, ``started_s``,
``ended_s`` and, for a run, ``target``, ``run_id`` and ``result`` (the run's summary).
"""
from __future__ import annotations

import statistics

from core.output import State
from core.rundir import RunPaths
from runs.compare import RunSample, compare

IDLE_CORES = 0.15
REPEAT_JUDGED = ("p50", "p90", "p99")
REPEAT_FLOOR_US = 1_000
"""A repetition's flight times are within noise within ±1 ms as well as ±5% (``runs compare --floor 1ms``): the
machine's own jitter between repeats at HTTP's sub-millisecond times. Without it (``runs compare``'s default since its
floor became relative only), CI failed a short day on a repeat of HTTP at 2,000/s whose p90 went from ~0.5 ms by +112%
(+44%…+218%), with the load generator's own send delay p99 +106% in the same run: the machine, not a path that grew
slower over the day (2026-12-01). A process that degrades at 2,000/s adds far more than a millisecond."""
RSS_TOLERANCE = 0.10
LOG_BYTES_PER_HOUR = 1 << 20
SETTLE_S = 60
"""An idle stretch is judged from its second minute on (the last run's job closing, the JVM's exit)."""
RELAY_CAPACITY = 400
PACE_RATES = (200, 350, 500)


def between(samples: list[dict], t0: float, t1: float) -> list[dict]:
    return [s for s in samples if t0 <= s["t"] <= t1]


def judged_from(st) -> float:
    """Where an idle stretch's judged span begins: where the day found it calm, or its second minute."""
    return st.judged_s or st.started_s + SETTLE_S


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
"""The checks of ``bench.workday``'s docstring, in its order."""


def judge(steps, samples: list[dict]) -> tuple[list[tuple[str, str]], dict]:
    """The checks of ``bench.workday``'s docstring over its steps (``bench.workday.Step``) and samples:
    (failures as (check, what), figures)."""
    bad: list[tuple[str, str]] = []
    fig: dict = {"idle": [], "runs": [], "memory": [], "logs": []}
    idles = [s for s in steps if s.kind == "idle"]
    _idle(idles, samples, bad, fig)
    _runs([s for s in steps if s.kind == "run"], bad, fig)
    if len(idles) >= 2:
        _memory(between(samples, judged_from(idles[0]), idles[0].ended_s),
                between(samples, judged_from(idles[-1]), idles[-1].ended_s), bad, fig)
    _logs(idles, samples, bad, fig)
    fig["slices_deleted"] = samples[-1]["slices_deleted"] if samples else 0
    return bad, fig


def _idle(idles, samples: list[dict], bad: list, fig: dict) -> None:
    for st in idles:
        total, by = idle_cores(between(samples, judged_from(st), st.ended_s))
        by_cores = sorted(by.items(), key=lambda kv: -kv[1])  # every process, for the figures' file
        fig["idle"].append({"name": st.name, "live_stream": st.live_stream, "minutes": (st.ended_s - st.started_s) / 60,
                            "cores": total, "top": by_cores})
        if not total <= IDLE_CORES:
            bad.append(("idle", f"{st.name}: flightwatch used {total:.3f} cores at idle (at most {IDLE_CORES})"))


def _runs(runs, bad: list, fig: dict) -> None:
    """Each run's verdict; a repetition against its first run (``runs compare``)."""
    first: dict[str, dict] = {}
    for st in runs:
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
        elif row["state"] != State.OK:
            bad.append(("verdict", f"{st.name} ({st.run_id}): verdict {row['message']!r}"))
        ref = first.setdefault(st.name, row)
        if ref is not row:
            _repeat(st, ref, row, bad)


def _repeat(st, ref: dict, row: dict, bad: list, checkpoints: str | None = None) -> None:
    try:
        rep = compare(RunSample.load(RunPaths.of_run(ref["run"], checkpoints).root),
                      RunSample.load(RunPaths.of_run(row["run"], checkpoints).root), floor_us=REPEAT_FLOOR_US)
    except ValueError as e:
        bad.append(("repeat", f"{st.name} ({st.run_id}): not compared with {ref['run']}: {e}"))
        return
    row["compared"] = rep["headline"]
    worse = [r for r in rep["whole_run"] if r["metric"] in REPEAT_JUDGED and r["verdict"] == "regression"]
    if worse:
        bad.append(("repeat", f"{st.name} ({st.run_id}) against its first run {ref['run']}: {rep['headline']}"))


def _memory(a: list[dict], b: list[dict], bad: list, fig: dict) -> None:
    """Each long-lived process's RSS, the first idle stretch's median against the last's."""
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


def _logs(idles, samples: list[dict], bad: list, fig: dict) -> None:
    """Each log file's growth an hour, over the idle stretches (from their second minute, or from when calm)."""
    grown: dict[str, float] = {}
    idle_h = 0.0
    for st in idles:
        span = between(samples, judged_from(st), st.ended_s)
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


def report(fig: dict) -> None:
    print(f"\nidle stretches (from their second minute, or from when calm): flightwatch's cores, at most {IDLE_CORES}")
    for r in fig["idle"]:
        top = ", ".join(f"{n} {c:.3f}" for n, c in r["top"][:8])
        print(f"  {r['name']:<8} {r['minutes']:4.1f} min{' (live job)' if r['live_stream'] else '':<11} "
              f"{r['cores']:.3f} cores   ({top}{', ...' if len(r['top']) > 8 else ''})")
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
