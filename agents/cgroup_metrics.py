"""Cgroup-metrics agent: hosts that are cgroups, every second, as node records (and their OOM kills).

A node exporter sees a machine; a host that is a cgroup of it (a container with a CPU quota and a memory limit, a
pod seen from its node as cAdvisor sees it, a stood-in host of ``make test-cluster``) can run out while the machine
has room. This agent reads each host's cgroup (v1: ``cpu``, ``cpuacct``, ``memory``; v2: the unified one) and writes,
per host and second, ``node`` records as the node-metrics agent does, so the run's rules judge the host as a node:

    cpu_cores             its CPU quota, in cores (none without a quota)
    cpu_util              the CPU time it used over the quota's, 0..1 (a little over when a quota under the
                          scheduler's 5 ms slice a period is overrun: as measured)
    observer_cpu          the same CPU time, in cores, for a host of flightwatch's own (``--flightwatch``): its
                          receiver or load generator running out of CPU is then flightwatch's limit, named with the
                          host (``runs.saturation``: observer-bound), never the SUT's
    mem_used_bytes        its memory usage                   mem_available_bytes   its limit less that

and each OOM kill in its memory cgroup as an ``oom`` event named ``<host>:<cgroup>`` (``agents.oom``).

    python -m agents.cgroup_metrics --host receiver=fw/receiver --host worker-1=fw/worker-1 --flightwatch receiver
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time

from agents.oom import CGROUP_ROOT
from core import contract, logs
from core.cli import OneLineParser, add_telemetry, add_wait, await_brokers
from core.units import parse_duration_ns

ROOT = CGROUP_ROOT


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


class HostCgroup:
    """One host's cgroup files (v1 controllers, else v2), read as numbers; None where a file is not there."""

    def __init__(self, name: str, cgroup: str, root: str = ROOT) -> None:
        self.name, self.cgroup = name, cgroup.strip("/")
        self.v1 = os.path.isdir(os.path.join(root, "memory"))
        at = (lambda c: os.path.join(root, c, self.cgroup)) if self.v1 else (lambda c: os.path.join(root, self.cgroup))
        self.cpu, self.cpuacct, self.memory = at("cpu"), at("cpuacct"), at("memory")

    def quota_cores(self) -> float | None:
        if self.v1:
            quota, period = _read(f"{self.cpu}/cpu.cfs_quota_us"), _read(f"{self.cpu}/cpu.cfs_period_us")
        else:
            quota, _, period = (_read(f"{self.cpu}/cpu.max") or "max 100000").partition(" ")
        if quota is None or period is None or quota.strip() in ("-1", "max"):
            return None
        return int(quota) / int(period)

    def cpu_ns(self) -> int | None:
        if self.v1:
            text = _read(f"{self.cpuacct}/cpuacct.usage")
            return None if text is None else int(text)
        for line in (_read(f"{self.cpu}/cpu.stat") or "").splitlines():
            if line.startswith("usage_usec "):
                return int(line.split()[1]) * 1000
        return None

    def memory_bytes(self) -> tuple[int | None, int | None]:
        """(usage, limit): the limit None when there is none."""
        usage = _read(f"{self.memory}/memory.usage_in_bytes" if self.v1 else f"{self.memory}/memory.current")
        limit = _read(f"{self.memory}/memory.limit_in_bytes" if self.v1 else f"{self.memory}/memory.max")
        lim = None if limit is None or limit.strip() == "max" or int(limit) >= 1 << 60 else int(limit)
        return (None if usage is None else int(usage)), lim


class Sampler:
    """Each host's records of one sampling (``sample(at_ns)``), CPU from the change since the sampling before."""

    def __init__(self, hosts: list[HostCgroup], own: set[str], agent: str) -> None:
        self.hosts, self.own, self.agent = hosts, own, agent
        self.before: dict[str, tuple[int, int]] = {}

    def sample(self, at_ns: int) -> list[contract.NodeSample]:
        out = []

        def rec(host: str, metric: str, value: float | None) -> None:
            out.append(contract.NodeSample(contract.ANY_RUN, self.agent, at_ns, node=host, metric=metric, value=value,
                                           missing=True if value is None else None))
        for h in self.hosts:
            cores, used_ns, now = h.quota_cores(), h.cpu_ns(), time.monotonic_ns()
            prev = self.before.get(h.name)
            if used_ns is not None:
                self.before[h.name] = (used_ns, now)
            if prev is not None and used_ns is not None and now > prev[1]:
                used = max(0, used_ns - prev[0]) / (now - prev[1])  # cores over the interval
                if cores:
                    rec(h.name, "cpu_cores", cores)
                    rec(h.name, "cpu_util", used / cores)
                if h.name in self.own:
                    rec(h.name, "observer_cpu", used)
            usage, limit = h.memory_bytes()
            if usage is not None and limit is not None:
                rec(h.name, "mem_used_bytes", usage)
                rec(h.name, "mem_available_bytes", max(0, limit - usage))
        return out


def _parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m agents.cgroup_metrics", description=__doc__.split("\n\n")[0],
                      formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--host", action="append", default=[], required=True, metavar="NAME=CGROUP",
                   help="a host and its cgroup, relative to the hierarchy's root (e.g. kubepods/pod123); repeatable")
    p.add_argument("--flightwatch", action="append", default=[], metavar="NAME",
                   help="a host whose processes are all flightwatch's (a receiver's, a load generator's): its CPU is "
                        "flightwatch's own (observer_cpu); repeatable")
    p.add_argument("--interval", default="1s", help="sampling interval (default %(default)s)")
    p.add_argument("--cgroup-root", default=ROOT, help="where the cgroup hierarchies are mounted (default %(default)s)")
    add_telemetry(p, "cgroup-metrics")
    add_wait(p, "the telemetry broker")
    return p


def _hosts(a) -> list[HostCgroup]:
    hosts = []
    for spec in a.host:
        name, sep, cgroup = spec.partition("=")
        if not sep or not name or not cgroup:
            raise ValueError(f"--host {spec!r}: expected NAME=CGROUP")
        h = HostCgroup(name, cgroup, a.cgroup_root)
        if h.cpu_ns() is None:
            raise ValueError(f"--host {spec!r}: no cgroup {h.cgroup} under {a.cgroup_root}")
        hosts.append(h)
    unknown = set(a.flightwatch) - {h.name for h in hosts}
    if unknown:
        raise ValueError(f"--flightwatch {sorted(unknown)[0]!r}: not a --host")
    return hosts


def main(argv=None) -> int:
    try:
        a = _parser().parse_args(argv)
        hosts, step_ns = _hosts(a), parse_duration_ns(a.interval)
        if step_ns < 10**8:
            raise ValueError(f"--interval {a.interval!r}: at least 100ms")
    except SystemExit as e:
        return 2 if e.code else 0
    except ValueError as e:
        print(f"cgroup_metrics: error: {e}", file=sys.stderr)
        return 2
    from agents.oom import CgroupWatcher, KernelLog
    from core.kafka_options import telemetry_producer
    from core.slices import TelemetryTopic
    from core.telemetry import TelemetryWriter

    if not await_brokers("cgroup_metrics", {"telemetry": a.telemetry_bootstrap}, a.wait):
        return 2
    topic = TelemetryTopic.for_broker(a.telemetry_topic, a.telemetry_bootstrap)
    writer = TelemetryWriter(telemetry_producer(a.telemetry_bootstrap, **topic.producer_settings()), topic, agent=a.agent)
    log = logs.setup(a.agent)
    kernel = KernelLog.open()
    watchers = [CgroupWatcher([h.memory], writer.write, h.name, a.agent, kernel=kernel).start() for h in hosts]
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    sampler = Sampler(hosts, set(a.flightwatch), a.agent)
    log.info(f"cgroup_metrics {a.agent}: hosts {', '.join(f'{h.name}={h.cgroup}' for h in hosts)} every {a.interval} -> "
             f"{a.telemetry_bootstrap}/{a.telemetry_topic}")
    next_at = (time.time_ns() // step_ns + 1) * step_ns
    try:
        while not stopping.wait(max(0.0, (next_at - time.time_ns()) / 1e9)):
            for r in sampler.sample(next_at):
                writer.write(r)
            next_at = max(next_at + step_ns, (time.time_ns() // step_ns) * step_ns)  # fell behind: the next slot
    except KeyboardInterrupt:
        pass
    for w in watchers:
        w.stop()
    writer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
