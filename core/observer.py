"""Which processes on this node are flightwatch's (the *observer*), and how many cores they use.

flightwatch runs beside the system under test; its own CPU must be told apart from the SUT's.
The observer is every process tree rooted at:

- a PID file of the embedded stack (``<stack dir>/<component>.pid``), except the SUT broker;
- a PID file in the registry (``<stack dir>/observers/<role>-<pid>.pid``), where the streaming
  job and the load generator put their own PID while they run (``register``).

Children count with their root: the job's JVM and pyspark workers, the load generator's
workers, the receiver's shipper. ``CpuMeter`` turns two readings of their CPU times into cores;
a process first seen in a reading counts from its start if it began since the last reading.
On Kubernetes the node-metrics agent reads the same figure from Prometheus instead
(``--observer-promql``, the container CPU of the pods labelled as flightwatch's).
"""
from __future__ import annotations

import atexit
import glob
import os

import psutil

from core import procs, settings
from core.suts import SUTS

STACK_DIR = settings.get("FLIGHTWATCH_STACK_DIR") or os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".stack")
"""The embedded stack's folder (PID files, logs); the registry is its ``observers/`` subfolder."""
NOT_OBSERVER = frozenset(sut.broker for sut in SUTS.values())
"""Stack components that are the system under test, not flightwatch."""


def registry_dir(stack_dir: str | None = None) -> str:
    return os.path.join(stack_dir or STACK_DIR, "observers")


def register(role: str, pid: int | None = None, stack_dir: str | None = None) -> str | None:
    """Count this process (and its children) as flightwatch's while it lives; the file goes at exit.

    Nothing is written (None) where no embedded stack can read it: the default stack folder does not exist (no
    ``make up`` from this install: on Kubernetes, where cAdvisor measures the pods) or cannot be written (a
    read-only root, an install folder of another user). Accounting never stops the process it accounts for."""
    pid = pid or os.getpid()
    if stack_dir is None and settings.get("FLIGHTWATCH_STACK_DIR") is None and not os.path.isdir(STACK_DIR):
        return None
    path = os.path.join(registry_dir(stack_dir), f"{role}-{pid}.pid")
    try:
        os.makedirs(registry_dir(stack_dir), exist_ok=True)
        procs.write_pid_file(path, pid)
    except OSError:
        return None

    def _remove() -> None:
        if os.getpid() == pid:  # not from a forked child
            try:
                os.remove(path)
            except OSError:
                pass
    atexit.register(_remove)
    return path


def roots(stack_dir: str | None = None) -> dict[int, str]:
    """PID -> role of every live root: the stack's components (but the SUT) and the registry's entries."""
    stack_dir = stack_dir or STACK_DIR
    out: dict[int, str] = {}
    files = [(os.path.basename(p)[:-4], p) for p in glob.glob(os.path.join(stack_dir, "*.pid"))]
    for path in glob.glob(os.path.join(registry_dir(stack_dir), "*.pid")):
        files.append((os.path.basename(path)[:-4].rsplit("-", 1)[0], path))
    for role, path in files:
        if role in NOT_OBSERVER:
            continue
        pid = procs.pid_from_file(path)  # the very process recorded, not one that got its PID since
        if pid is not None:
            out[pid] = role
        elif os.path.dirname(path) == registry_dir(stack_dir) and os.path.exists(path):
            try:  # a registered process that died without its atexit (kill -9)
                os.remove(path)
            except OSError:
                pass
    return out


def with_children(root_pids: dict[int, str]) -> dict[int, str]:
    """The roots and all their descendants, each with its root's role. One pass over the process table for all the
    roots (``Process.children`` reads the whole table once a root: twelve reads a second was most of the node-metrics
    agent's CPU at idle, py-spy)."""
    kids: dict[int, list[int]] = {}
    for p in psutil.process_iter(["ppid"]):
        kids.setdefault(p.info["ppid"], []).append(p.pid)
    alive = {pid for pids in kids.values() for pid in pids}
    out: dict[int, str] = {pid: role for pid, role in root_pids.items() if pid in alive}
    for pid, role in list(out.items()):
        todo = list(kids.get(pid, ()))
        while todo:
            c = todo.pop()
            if c not in out:  # a root under another root keeps its own role, and so do its descendants
                out[c] = role
                todo.extend(kids.get(c, ()))
    return out


def tree_cpu_s(pid: int, ended: bool = False) -> float | None:
    """CPU seconds (user + system) of a process and of its descendants alive now (``ended``: and of those that ended
    and were waited for); None if it is gone."""
    try:
        root = psutil.Process(pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.Error:
        return None
    total = 0.0
    for p in tree:
        try:
            t = p.cpu_times()
            total += t.user + t.system + (t.children_user + t.children_system if ended else 0.0)
        except psutil.Error:  # a helper that just exited: its time is gone with it
            continue
    return total


def read_cpu(pids) -> dict[tuple[int, float], float]:
    """(pid, start time) -> CPU seconds used so far (user + system); gone processes are left out."""
    out = {}
    for pid in pids:
        try:
            p = psutil.Process(pid)
            with p.oneshot():
                t = p.cpu_times()
                out[(pid, p.create_time())] = t.user + t.system
        except psutil.Error:
            continue
    return out


def cores_used(before: dict, after: dict, before_at_s: float, after_at_s: float) -> float:
    """Cores used between two readings of ``read_cpu``.

    A process in both readings counts its difference. One first seen in ``after`` counts whole
    if it started after ``before_at_s``, else nothing (it was only now found, e.g. registered late).
    A process gone by ``after`` loses its last interval (its times went with it).
    """
    elapsed = after_at_s - before_at_s
    if elapsed <= 0:
        return 0.0
    used = 0.0
    for key, cpu_s in after.items():
        if key in before:
            used += max(cpu_s - before[key], 0.0)
        elif key[1] >= before_at_s:
            used += cpu_s
    return used / elapsed


class CpuMeter:
    """Cores used by the observer on this node since the previous ``sample``."""

    def __init__(self, stack_dir: str | None = None, find=None) -> None:
        self.find = find or (lambda: with_children(roots(stack_dir)))
        self._last: dict = {}
        self._last_at: float | None = None
        self.pids: dict[int, str] = {}

    def sample(self, at_s: float) -> float | None:
        """Cores since the last call (None on the first: nothing to compare with)."""
        self.pids = self.find()
        now = read_cpu(self.pids)
        used = None if self._last_at is None else cores_used(self._last, now, self._last_at, at_s)
        self._last, self._last_at = now, at_s
        return used
