"""``core.procs.lower_priority``: a process that lowers its priority yields the CPU to a process of another session,
as the streaming job must yield to the SUT and the receivers. Real processes on one core, measured with psutil."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
from support import ROOT

from core.procs import stop_process

_HOG = """
import os, sys
os.sched_setaffinity(0, {int(sys.argv[1])})
if int(sys.argv[2]):
    from core.procs import lower_priority
    lower_priority(int(sys.argv[2]))
print("ready", flush=True)
x = 0
while True:
    x += 1
"""


def test_a_process_at_nice_10_in_its_own_session_yields_the_cpu_to_one_in_another():
    """Two CPU hogs on the same core, each in a session of its own (as the stack starts the job and the brokers): the
    one that called ``lower_priority(10)`` gets at most 25% of the core (by nice weights, 110 / (1024 + 110) = 9.7%).
    With ``os.nice(10)`` alone it got half: autogroup scheduling weighs a nice only within the session."""
    core = sorted(os.sched_getaffinity(0))[0]
    env = dict(os.environ, PYTHONPATH=ROOT)
    hogs = {nice: subprocess.Popen([sys.executable, "-c", _HOG, str(core), str(nice)], env=env, stdout=subprocess.PIPE,
                                   text=True, start_new_session=True) for nice in (0, 10)}
    try:
        for p in hogs.values():
            assert p.stdout.readline().strip() == "ready"
        ps = {n: psutil.Process(p.pid) for n, p in hogs.items()}
        cpu0 = {n: sum(p.cpu_times()[:2]) for n, p in ps.items()}
        time.sleep(3)
        used = {n: sum(p.cpu_times()[:2]) - cpu0[n] for n, p in ps.items()}
    finally:
        for p in hogs.values():
            stop_process(p, wait_s=5)
    share = used[10] / (used[0] + used[10])
    print(f"\non one core for 3 s: nice 0 used {used[0]:.2f} s, nice 10 {used[10]:.2f} s ({share:.0%})")
    assert used[0] + used[10] > 1.0  # they did compete for the core
    assert share <= 0.25
