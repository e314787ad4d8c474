"""Hosts with limits: the seven stood-in hosts of ``test_multihost``, the receiver's and the workers' each a cgroup (v1
``cpu``, ``cpuacct``, ``memory``) with a memory limit (and a CPU quota: the receiver, worker-1), as a node or a pod
has; the cgroup-metrics agent reads them from outside, on the broker's host's network (as cAdvisor reads a node's
pods), into the telemetry.

One run at 2,000 events/s for 50 s: the receiver's host held to 0.05 core from 8 to 28 s in; from 30 s, the memory
limit of the worker that served most join tasks brought down to its usage until the kernel OOM-kills a process of its
executor's (then given back; an executor that serves nothing does not grow, and CI once saw worker-1 serve nothing:
``test_multihost.busiest_worker``). The verdict names both hosts: the receiver's as flightwatch's own limit
(observer-bound, ``on receiver``), the OOM kill on that worker; the run recovers, exact and equal to its local
replay.

``make test-cluster`` (root).
"""
from __future__ import annotations

import json
import sys
import time

import pytest
from support import ROOT
from support.hosts import Hosts, tails, usable
from test_multihost import HOSTS, TOPIC, Cluster, busiest_worker, check_exact_and_replayed, env, last_batch

from agents.oom import oom_kill_count

LIMITS = {"receiver": (1.0, 1 << 30), "worker-0": (None, 3 << 30), "worker-1": (1.0, 3 << 30)}
"""Cores and memory of the hosts that have limits."""


def oom_kill_on(host, c: Cluster, seconds: float = 60) -> int:
    """The kernel's OOM killer at work in ``host``'s memory cgroup: its limit brought down near its usage, each second
    nearer while none is killed, until one is (its counter); then its limit given back."""
    cg = f"/sys/fs/cgroup/memory/{host.cgroup}"
    start = time.monotonic()
    before, deadline, margin = oom_kill_count(cg), start + seconds, 16 << 20
    try:
        while oom_kill_count(cg) == before:
            assert time.monotonic() < deadline, f"no OOM kill in {host.name} within {seconds:.0f} s\n" + tails(c.logs)
            with open(f"{cg}/memory.usage_in_bytes") as f:
                usage = int(f.read())
            try:
                host.set_limits(memory=usage + margin)
            except OSError:  # below what it can reclaim: as near as it goes
                pass
            margin = max(margin // 2, 1 << 20)
            for _ in range(10):
                if oom_kill_count(cg) != before:
                    break
                time.sleep(0.1)
    finally:
        host.set_limits(memory=LIMITS[host.name][1])
    print(f"\nOOM squeeze of {host.name}: a kill after {time.monotonic() - start:.1f} s")
    return oom_kill_count(cg) - before


@pytest.mark.cluster
@pytest.mark.integration
def test_a_hosts_starved_receiver_is_named_as_flightwatchs_limit_and_an_oom_killed_executor_by_its_host(tmp_path):
    if (why := usable()) is not None:
        pytest.skip(why)
    # the squeeze begins 30 s in and needs the executor to allocate: the load runs on through it (CI once found no
    # kill within 12 s of a squeeze that began 10 s before a 40 s run's end)
    run_id, rate, seconds = "host-limits", 2000, 50
    with Hosts(HOSTS, shared=tmp_path / "shared", private=tmp_path / "hosts", checkout=ROOT, limits=LIMITS) as h:
        c = Cluster(h, tmp_path)
        h["broker"].popen_node_agent([sys.executable, "-m", "agents.cgroup_metrics", "--telemetry-bootstrap", c.broker,
                           "--telemetry-topic", TOPIC, *(f"--host={n}={h[n].cgroup}" for n in LIMITS),
                           "--flightwatch", "receiver"], env(), c.log("broker", "cgroup_metrics.log"))
        job = c.job(run_id, drop_timeout="30s")  # flights of up to 20 s while the receiver starves: none late
        lg = c.attack(run_id, rate, seconds)
        batches = c.shared / run_id / "batches"
        before_attack = last_batch(batches)
        time.sleep(8)
        h["receiver"].set_limits(cores=0.05)  # a CFS slice is 5 ms: a smaller quota overruns
        time.sleep(20)  # half the run: headlined however its windows fall (a fifth of them suffices: runs.saturation)
        h["receiver"].set_limits(cores=LIMITS["receiver"][0])
        time.sleep(2)
        assert lg.poll() is None, tails(c.logs)
        squeezed, _ = busiest_worker(batches, before_attack, c.logs)
        killed = oom_kill_on(h[squeezed], c, seconds=18)
        c.finish(job, lg, seconds)
    report = json.loads((tmp_path / "hosts" / "loadgen" / "lg" / "report.json").read_text())
    s = check_exact_and_replayed(c.shared, run_id, report, rate, seconds)
    v = s["verdict"]
    ooms = [o for o in s["oom_events"] if o["source"] == "cgroup"]
    print(f"\nhost limits: {killed} OOM kill(s) on {squeezed} {ooms}; verdict: {v['message']}; sent {s['sent']:,}, "
          f"received {s['received']:,}, p99 {s['latency_us']['p99'] / 1000:.1f} ms")
    assert killed >= 1 and ooms and all(o["where"].startswith(f"{squeezed}:") for o in ooms), s["oom_events"]
    assert s["oom_kills"] >= 1 and "OOM kills: " in v["message"] and f" on {squeezed} from " in v["message"], v["message"]
    assert v["state"] == "observer-bound" and "busy cores on receiver" in v["message"], v["message"]
