"""Soak: a long attack at a steady rate through the whole stack, watching every process's memory.

    python -m bench.soak [--rate 2000] [--minutes 15 | --duration 15m] [--warmup 3m]        (make soak)

Needs the embedded stack (`make up`): the load generator attacks its HTTP receiver agent with
telemetry on, and starts the streaming job for the run (``--stream``). Every 2 s it samples the
anonymous resident memory (heap and stacks, not mapped files) of every process: the stack's
(brokers, Prometheus, node exporter, receivers and their shippers, node-metrics agent, UI) and
the run's (load generator and its workers, the streaming job's Python driver, its JVM and Python
workers). The live job's JVM commits and touches its whole heap at start (``-Xms`` = ``-Xmx``,
``-XX:+AlwaysPreTouch``): its heap and the rest are shown and judged apart, or the flat GiB of
heap would hide the rest's growth. It also reads the job's engine state size (event IDs it still
remembers) from its batch records.

Memory is judged over the attack itself, from the end of the warm-up (counted from the attack's
first send) to its last send: the median of the first minute against the median of the last
minute (one sample is one micro-batch's worth of noise; a leak moves the median). The close
after the attack (the job reads the whole run once to write its final tables) is shown apart, as
``max at close``. Every sample is kept in ``<run>/soak-memory.json``.

At the end it prints, per process, memory after warm-up and at the end, and the change (the
embedded SUT broker is shown but not judged: it keeps every message in memory, as a real Kafka
keeps it on disk). The embedded telemetry broker keeps only the time slices of telemetry the job
has not yet deleted (``core.slices``): it is judged from the first slice deleted (its RSS then
saws by a slice's worth) to the end, the same way, and its range over that span is shown; the
engine state then and at the end; and the run's totals. It exits 1 if a process grew by more than
10% after warm-up, the state grew, or the run is incomplete (a send neither received, dropped nor
errored, a duplicate, telemetry lost). Drops and errors are the system under test's: reported, not
failures of the soak.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import time

from core.procs import pid_from_file, stop_process
from core.rundir import ROOT, RunPaths, batch_file, ids_in
from core.units import parse_duration_ns
from stack.config import Stack
from transports.registry import SINKS

STACK = Stack.configured()
"""The stack this benchmark drives, as the settings name it."""

GROWTH_LIMIT = 0.10
CLOSE_WAIT_S = 900
"""How long after the load generator the soak waits for the job to close the run (9M events took ~4 min)."""
SAMPLE_EVERY_S = 2
"""Often enough that a minute's median rests on 30 samples (the job's driver swings by a quarter from one batch to the next)."""


def rss_kib(pid: int, field: str = "VmRSS") -> int | None:
    """Resident memory of a process (None once it is gone). ``RssAnon``: its own heap and stacks only,
    without mapped files (a receiver's spool segment is mapped: its pages come and go as segments rotate)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))
    except (OSError, StopIteration):
        return None


JAVA_HEAP_MIN_KIB = 256 << 10


def java_heap_kib(pid: int) -> int | None:
    """Resident pages of a JVM's pre-touched heap: its largest anonymous mapping, if one holds 256 MiB or more
    (``-Xms`` = ``-Xmx`` with ``-XX:+AlwaysPreTouch`` makes the heap one mapping, resident from the start)."""
    best, size = None, 0
    try:
        with open(f"/proc/{pid}/smaps") as f:
            for line in f:
                if "-" in line.split(" ", 1)[0] and not line[0].isupper():
                    fields = line.split()
                    lo, hi = (int(x, 16) for x in fields[0].split("-"))
                    size = (hi - lo) >> 10 if len(fields) == 5 else 0  # anonymous: no path
                elif line.startswith("Anonymous:") and size >= JAVA_HEAP_MIN_KIB:
                    kib = int(line.split()[1])
                    if kib >= JAVA_HEAP_MIN_KIB and (best is None or kib > best):
                        best = kib
    except OSError:
        return None
    return best


def name_of(pid: int) -> str:
    try:
        cmd = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
    except OSError:
        return "?"
    words = [w.decode(errors="replace") for w in cmd if w]
    for i, w in enumerate(words):
        if w == "-m" and i + 1 < len(words):
            return " ".join(words[i + 1:i + 3])
    if words and words[0].endswith("java"):
        return "spark driver (JVM)"
    return os.path.basename(words[0]) if words else "?"


class SliceWatch:
    """The telemetry topic's time slices on the embedded broker: how many are held, how many were deleted, and
    when the first one was (from then on the broker's memory is bounded)."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap, self.seen, self.live, self.deleted = bootstrap, set(), 0, 0
        self.first_deleted_at: float | None = None
        self._admin = None

    def sample(self, wall: float) -> None:
        from confluent_kafka.admin import AdminClient

        from core.kafka_options import librdkafka
        from core.slices import NO_TOPIC_CREATION, split_slice

        try:
            self._admin = self._admin or AdminClient({"bootstrap.servers": self.bootstrap, **NO_TOPIC_CREATION,
                                                      **librdkafka({})})
            now = {t for t in self._admin.list_topics(timeout=5).topics if split_slice(t)}
        except Exception:  # noqa: BLE001 - away for a moment: next sample
            return
        gone = self.seen - now
        if gone and self.first_deleted_at is None:
            self.first_deleted_at = wall
        self.deleted += len(gone)
        self.seen, self.live = now, len(now)


def descendants(pids) -> set[int]:
    """The processes and every process below them (psutil)."""
    import psutil

    out = set()
    for pid in pids:
        try:
            p = psutil.Process(pid)
            out |= {pid, *(c.pid for c in p.children(recursive=True))}
        except psutil.Error:
            continue
    return out


def parse(argv) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--rate", type=float, default=2000, help="events/s (default %(default)s)")
    length = ap.add_mutually_exclusive_group()
    length.add_argument("--minutes", type=float, help="length of the attack in minutes (default 15)")
    length.add_argument("--duration", help="length of the attack, e.g. 15m, 1h (default 15m)")
    ap.add_argument("--warmup", default="3m", help="memory is compared from this point on (default %(default)s)")
    a = ap.parse_args(argv)
    if a.minutes is not None and a.minutes <= 0 or a.rate <= 0:
        ap.error("--minutes and --rate must be > 0")
    a.duration = f"{a.minutes * 60:g}s" if a.minutes is not None else (a.duration or "15m")
    try:
        a.warmup_s = parse_duration_ns(a.warmup) / 1e9
        parse_duration_ns(a.duration)
    except ValueError as e:
        ap.error(str(e))
    return a


def stack_pids() -> dict[str, int]:
    """The embedded stack's processes, by the name of their PID file."""
    pids = {}
    for f in glob.glob(os.path.join(STACK.dir, "*.pid")):
        if (pid := pid_from_file(f)) is not None:
            pids[os.path.basename(f)[:-4]] = pid
    return pids


def _medians(during: list[tuple[float, int]]) -> tuple[float, float]:
    """The median of the first minute and of the last."""
    return (statistics.median(r for t, r in during if t < during[0][0] + 60),
            statistics.median(r for t, r in during if t > during[-1][0] - 60))


class Soak:
    """One soak: ``attack`` (sampling memory while the load generator runs), then the three judgements, each
    adding what failed to ``bad``: ``memory``, ``engine_state``, ``completeness``."""

    def __init__(self, a: argparse.Namespace, stack: dict[str, int]) -> None:
        self.a, self.stack = a, stack
        self.run_id = time.strftime("soak-%Y%m%d-%H%M%S", time.gmtime())
        self.run_dir = os.path.join(ROOT, "checkpoints", self.run_id)
        self.samples: dict[tuple[int, str], list[tuple[float, int]]] = {}  # (pid, part) -> (wall-clock s, KiB)
        self.names: dict[tuple[int, str], str] = {}
        self.slices = SliceWatch(f"127.0.0.1:{STACK.ports['telemetry-broker']}")
        self.bad: list[str] = []

    def attack(self) -> str:
        """Run the load generator, sampling every process's memory until it ends; its output."""
        a = self.a
        lg = subprocess.Popen([sys.executable, "-m", "loadgen", "attack", "--rate", f"{a.rate:g}", "--duration", a.duration,
                               "--target", SINKS[0].stack_target(), "--run", self.run_id, "--stream",
                               "--quiet"], cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, start_new_session=True)
        print(f"soak {self.run_id}: {a.rate:,.0f}/s for {a.duration} (memory compared after {a.warmup}); sampling every "
              f"{SAMPLE_EVERY_S} s", flush=True)
        t0, shown = time.monotonic(), -1
        try:
            while lg.poll() is None:
                t, wall = time.monotonic() - t0, time.time()
                self.sample(list(self.stack.values()) + [lg.pid], wall)
                if int(t) // 60 != shown:
                    shown = int(t) // 60
                    self.progress(t, wall)
                time.sleep(SAMPLE_EVERY_S)
            return lg.stdout.read()
        finally:
            if lg.poll() is None:
                stop_process(lg, wait_s=30, group=True)

    def sample(self, roots: list[int], wall: float) -> None:
        for pid in descendants(roots):
            r = rss_kib(pid, "RssAnon")
            if not r:
                continue
            name = name_of(pid)  # read again: the Spark JVM starts as the bash script that execs java
            if name == "?":  # gone meanwhile
                continue
            heap = java_heap_kib(pid) if name.endswith("(JVM)") else None
            # a pre-touched heap apart from the rest: a flat GiB would hide the rest's growth
            parts = [("heap", heap, " heap"), ("", r - heap, " without heap")] if heap else [("", r, "")]
            for part, kib, label in parts:
                self.samples.setdefault((pid, part), []).append((wall, kib))
                self.names[pid, part] = name + label
        self.slices.sample(wall)

    def progress(self, t: float, wall: float) -> None:
        total = sum(s[-1][1] for s in self.samples.values() if s[-1][0] == wall) / 1024
        broker = self.samples.get((self.stack.get("telemetry-broker"), ""), [(0, 0)])[-1][1] / 1024
        print(f"  {t / 60:5.1f} min: {len(self.samples)} processes, {total:,.0f} MiB resident; telemetry broker "
              f"{broker:,.0f} MiB, {self.slices.live} slices held, {self.slices.deleted} deleted", flush=True)

    def memory(self, attack_start: float, attack_end: float) -> None:
        """Per process, the first minute after warm-up against the last minute of the attack."""
        warmup_s, slices = self.a.warmup_s, self.slices
        with open(os.path.join(self.run_dir, "soak-memory.json"), "w") as f:
            json.dump({"attack_start_s": attack_start, "attack_end_s": attack_end, "warmup_s": warmup_s,
                       "processes": [{"pid": key[0], "name": self.names[key], "samples": s} for key, s in self.samples.items()]}, f)
        judged_from = attack_start + warmup_s
        rotated = slices.first_deleted_at
        print(f"telemetry slices: {slices.deleted} deleted once read, {slices.live} held at the end; first deleted "
              + (f"{(rotated - attack_start) / 60:.1f} min into the attack" if rotated else "never (one topic: not sliced)"))
        print(f"memory judged from {warmup_s / 60:g} min into the attack to its end ({(attack_end - judged_from) / 60:.1f} min): "
              f"median of the first minute vs the last")
        print(f"{'process (anonymous RSS)':42} {'pid':>7} {'MiB at warm-up':>15} {'MiB at end':>11} {'max':>7} {'change':>8} {'max at close':>13}")
        for key, s in sorted(self.samples.items(), key=lambda kv: self.names[kv[0]]):
            self._process(key, s, judged_from, attack_end, rotated)

    def _process(self, key: tuple[int, str], s: list[tuple[float, int]], judged_from: float, attack_end: float,
                 rotated: float | None) -> None:
        pid, name = key[0], self.names[key]
        during = [(t, r) for t, r in s if judged_from <= t <= attack_end]
        if len(during) < 12 or during[-1][0] < attack_end - 2 * SAMPLE_EVERY_S:
            return  # short-lived (a worker that ended, a probe)
        first, last = _medians(during)
        close = max((r for t, r in s if t > attack_end), default=None)
        change = (last - first) / first
        telemetry_broker = pid == self.stack.get("telemetry-broker") and rotated is not None
        if telemetry_broker:  # judged from its first rotation (the slices it holds are bounded from then on)
            during = [(t, r) for t, r in s if rotated <= t <= attack_end]
            if len(during) < 12:
                self.bad.append("telemetry broker: too short after the first slice rotation to judge")
                return
            first, last = _medians(during)
            lo, hi = min(r for _, r in during), max(r for _, r in during)
            print(f"telemetry broker after the first rotation: {first / 1024:.1f} MiB (first minute's median) -> "
                  f"{last / 1024:.1f} MiB (last minute's), range {lo / 1024:.1f}-{hi / 1024:.1f} MiB")
        stores = name.startswith("tansu") and not telemetry_broker  # the SUT broker keeps every message
        print(f"{name[:42]:42} {pid:>7} {first / 1024:>15.1f} {last / 1024:>11.1f} {max(r for _, r in during) / 1024:>7.1f} "
              f"{change:>+8.1%} {(f'{close / 1024:.1f}' if close else '-'):>13}"
              + ("  (in-memory broker: holds the data, not judged)" if stores else ""))
        if abs(change) > GROWTH_LIMIT and not stores:
            self.bad.append(f"{name} ({pid}) {change:+.1%}")

    def engine_state(self) -> None:
        """The event IDs the job remembers, after warm-up: bounded by the retention."""
        paths = RunPaths(self.run_dir)
        infos = [json.load(open(batch_file(paths.batches, b, "json"))) for b in ids_in(paths.batches, "batch-*.json")]
        written = [i for i in infos if i.get("written_at_ns")]
        t_start = written[0]["written_at_ns"] if written else 0
        at_warm = [i for i in written if i["written_at_ns"] - t_start >= self.a.warmup_s * 1e9]
        steady = [i for i in at_warm if i.get("num_pending", 0) > 0]
        if steady:
            k0, k1 = steady[0]["num_known"], max(i["num_known"] for i in steady)
            print(f"engine state (event IDs remembered): {k0:,} after warm-up, at most {k1:,} after it "
                  f"(bounded by the retention: rate x (drop timeout + retention))")
            if k1 > 1.1 * k0 + self.a.rate * 5:
                self.bad.append(f"engine state grew from {k0:,} to {k1:,}")

    def completeness(self, report: dict) -> None:
        """Every send received, dropped or errored, once; the job's count of sends the load generator's."""
        summary_file = RunPaths(self.run_dir).summary_file
        deadline = time.monotonic() + CLOSE_WAIT_S  # a long run's close outlasts the load generator's wait for it
        while not os.path.exists(summary_file) and time.monotonic() < deadline:
            time.sleep(2)
        if not os.path.exists(summary_file):
            self.bad.append("no summary: the job did not close the run")
            return
        s = json.load(open(summary_file))
        print(f"run: sent {s['sent']:,} received {s['received']:,} dropped {s['dropped']:,} duplicates {s['duplicates']:,} "
              f"quarantined {s['quarantined']:,} telemetry lost {s.get('telemetry_lost')}; p99 {s['latency_us']['p99'] / 1000:.1f} ms")
        accounted = s["received"] + s["dropped"] + s["errors"]
        print(f"accounted for: {accounted:,} of {s['sent']:,} sent (received + dropped + errors); the load generator "
              f"made {report['requests']:,} requests")
        if accounted != s["sent"] or s["sent"] != report["requests"] or s["duplicates"] or s.get("telemetry_lost"):
            self.bad.append("run incomplete: an event not accounted for, counted twice, or telemetry lost")


def main(argv=None) -> int:
    a = parse(argv)
    stack = stack_pids()
    if f"{SINKS[0].receiver}-receiver" not in stack:
        print("soak: error: the embedded stack is not running (make up)", file=sys.stderr)
        return 2
    soak = Soak(a, stack)
    print(soak.attack()[-1500:])
    try:
        report = json.load(open(RunPaths(soak.run_dir).loadgen_report()))
        attack_start, attack_end = report["start_ns"] / 1e9, report["start_ns"] / 1e9 + report["duration_s"]["attack"]
    except (OSError, ValueError, KeyError) as e:
        print(f"SOAK FAILED: no load generator report ({e})")
        return 1
    soak.memory(attack_start, attack_end)
    soak.engine_state()
    soak.completeness(report)
    if soak.bad:
        print("SOAK FAILED: " + "; ".join(soak.bad))
        return 1
    print(f"soak passed: every long-lived process within ±{GROWTH_LIMIT:.0%} after warm-up, state bounded, run complete")
    return 0


if __name__ == "__main__":
    sys.exit(main())
