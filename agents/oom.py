"""OOM detection, three ways, one record type (``contract.OomEvent``).

- **vmstat**: an increase of ``node_vmstat_oom_kill`` seen through Prometheus (in
  ``agents.node_metrics``, which queries it every second);
- **cgroup**: ``CgroupWatcher`` polls the OOM-kill counter of named memory cgroups and of
  every cgroup below them (v1 ``memory.oom_control``, v2 ``memory.events``), every 100 ms;
- **k8s**: ``KubeWatcher`` watches pods through the ``kubernetes`` client and reports each
  container terminated with reason ``OOMKilled`` (an ``OomEvent``) and each restart (a
  ``ContainerRestart``), once each.

The victims (PID and name) come from the kernel's own lines (``KernelLog``: ``/dev/kmsg``, where readable):
``oom-kill:...,task_memcg=/a/b,task=python,pid=123`` and ``Killed process 123 (python)``.

Records about the machines carry the run ID ``*`` (``contract.ANY_RUN``): every run's job
takes those within its time span.
"""
from __future__ import annotations

import errno
import os
import re
import threading
import time
from collections import deque
from datetime import datetime

from core import contract

CGROUP_ROOT = "/sys/fs/cgroup"
V1_MEMORY = os.path.join(CGROUP_ROOT, "memory")


def cgroup_of_pid(pid: int) -> str:
    """The memory cgroup directory of a process (v1 memory controller, else the v2 unified path)."""
    unified = None
    with open(f"/proc/{pid}/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            if "memory" in controllers.split(","):
                return os.path.join(V1_MEMORY, path.lstrip("/"))
            if controllers == "":
                unified = os.path.join(CGROUP_ROOT, "unified" if os.path.isdir(V1_MEMORY) else "", path.lstrip("/"))
    if unified is None:
        raise ValueError(f"no memory cgroup for pid {pid}")
    return os.path.normpath(unified)


def oom_kill_count(cgroup_dir: str) -> int | None:
    """The cgroup's OOM-kill counter, or None when it has none (gone, or not a memory cgroup)."""
    for name in ("memory.events", "memory.oom_control"):  # v2, v1
        try:
            with open(os.path.join(cgroup_dir, name)) as f:
                for line in f:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except OSError:
            continue
    return None


_OOM_KILL = re.compile(r"oom-kill:.*?(?:oom_memcg=(?P<oom>[^,]*),)?task_memcg=(?P<memcg>[^,]*),task=(?P<task>[^,]*),pid=(?P<pid>\d+)")
_KILLED = re.compile(r"Killed process (?P<pid>\d+) \((?P<task>[^)]*)\)")


class KernelLog:
    """The kernel's OOM-kill lines, read from ``/dev/kmsg`` from the moment it is opened (non-blocking).

    Hand-written: no library reads kmsg records; each ``read`` returns one record, ``pri,seq,usec,flags;text``.
    ``victims(n, ...)`` hands out each kill once per detector, newest first, so the vmstat and cgroup
    detectors can both name the same kill."""

    def __init__(self, path: str = "/dev/kmsg", keep: int = 256) -> None:
        self.fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        os.lseek(self.fd, 0, os.SEEK_END)
        self.kills: deque = deque(maxlen=keep)   # dicts: at_ns, pid, task, memcg (paths as the kernel gives them)
        self._claimed: dict[str, set] = {}
        self._lock = threading.Lock()

    @classmethod
    def open(cls, path: str = "/dev/kmsg") -> KernelLog | None:
        """None where the log cannot be read (not root, a container without it): victims are then unnamed."""
        try:
            return cls(path)
        except OSError:
            return None

    def poll(self) -> None:
        """Read what the kernel wrote since the last call."""
        with self._lock:
            while True:
                try:
                    rec = os.read(self.fd, 8192)
                except BlockingIOError:
                    return
                except OSError as e:
                    if e.errno == errno.EPIPE:  # records overwritten before we read them: go on with the next
                        continue
                    return
                if not rec:
                    return
                header, _, text = rec.decode("utf-8", "replace").partition(";")
                m = _OOM_KILL.search(text) or _KILLED.search(text)
                if m is None:
                    continue
                try:
                    usec = int(header.split(",")[2])
                except (IndexError, ValueError):
                    usec = time.monotonic_ns() // 1000
                at_ns = time.time_ns() - (time.monotonic_ns() - usec * 1000)
                pid, task = int(m["pid"]), m["task"]
                known = next((k for k in self.kills if k["pid"] == pid), None)
                if known is None:
                    self.kills.append({"at_ns": at_ns, "pid": pid, "task": task,
                                       "memcg": m.groupdict().get("memcg"), "oom_memcg": m.groupdict().get("oom")})
                elif m.groupdict().get("memcg"):
                    known.update(memcg=m["memcg"], oom_memcg=m["oom"])

    def victims(self, detector: str, n: int, cgroup: str | None = None, wait_s: float = 0.0) -> str | None:
        """``pid 123 (python)``, comma-joined, for the ``n`` newest kills not yet given to ``detector`` (in
        ``cgroup`` and below, when given). ``wait_s``: a counter can move a moment before the kernel's line."""
        deadline = time.monotonic() + wait_s
        while True:
            self.poll()
            with self._lock:
                claimed = self._claimed.setdefault(detector, set())
                found = [k for k in reversed(self.kills) if k["pid"] not in claimed
                         and (cgroup is None or _under(cgroup, k.get("memcg")) or _under(cgroup, k.get("oom_memcg")))][:max(n, 1)]
                if len(found) >= n or time.monotonic() >= deadline:
                    claimed.update(k["pid"] for k in found)
                    return ", ".join(f"pid {k['pid']} ({k['task']})" for k in reversed(found)) or None
            time.sleep(0.02)


def _under(cgroup_dir: str, memcg: str | None) -> bool:
    """Whether the kernel's memcg path (``/a/b``, relative to the controller's root) is ``cgroup_dir`` or below it."""
    if not memcg:
        return False
    rel = "/" + os.path.relpath(cgroup_dir, V1_MEMORY if cgroup_dir.startswith(V1_MEMORY + "/") else CGROUP_ROOT).lstrip("./")
    return memcg == rel or memcg.startswith(rel.rstrip("/") + "/")


class CgroupWatcher:
    """Polls OOM-kill counters of cgroup trees; ``emit(OomEvent)`` for each increase.

    Counters seen for the first time are a baseline, except in cgroups that appear while
    watching (a new cgroup starts at 0, so a kill in it right away is still reported).
    """

    def __init__(self, roots: list[str], emit, node: str, agent: str, interval_s: float = 0.1,
                 kernel: KernelLog | None = None) -> None:
        self.roots, self.emit, self.node, self.agent, self.interval_s = list(roots), emit, node, agent, interval_s
        self.kernel = kernel
        self.counts: dict[str, int] = {}
        self._primed = False
        self._stop = threading.Event()
        self.thread: threading.Thread | None = None

    def _cgroups(self) -> list[str]:
        out = []
        for root in self.roots:
            for dirpath, _dirnames, filenames in os.walk(root):
                if "memory.events" in filenames or "memory.oom_control" in filenames:
                    out.append(dirpath)
        return out

    def poll(self) -> int:
        """One pass over every watched cgroup; the number of OOM kills found."""
        found = 0
        now = time.time_ns()
        present = set()
        for cg in self._cgroups():
            n = oom_kill_count(cg)
            if n is None:
                continue
            present.add(cg)
            before = self.counts.get(cg, None if not self._primed else 0)
            self.counts[cg] = n
            if before is not None and n > before:
                found += n - before
                victim = self.kernel.victims("cgroup", n - before, cgroup=cg, wait_s=0.5) if self.kernel else None
                self.emit(contract.OomEvent(contract.ANY_RUN, self.agent, now, source="cgroup",
                                            where=f"{self.node}:{cg}", count=n - before, victim=victim))
        for gone in set(self.counts) - present:
            del self.counts[gone]
        self._primed = True
        return found

    def start(self) -> CgroupWatcher:
        self.poll()
        self.thread = threading.Thread(target=self._run, name="cgroup-oom-watcher", daemon=True)
        self.thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.poll()

    def stop(self) -> None:
        self._stop.set()
        if self.thread:
            self.thread.join(2)


def _ns(ts) -> int | None:
    if ts is None:
        return None
    if isinstance(ts, str):
        ts = datetime.fromisoformat(ts.replace("Z", "+00:00"))
    return int(ts.timestamp() * 1e9)


class KubeWatcher:
    """Watches pods (one namespace or all) and reports OOMKilled terminations and container restarts.

    ``since_ns``: terminations that finished before it are history, not news (the first
    listing of a watch shows every pod's last state). Each termination is reported once,
    keyed by pod UID, container and finish time, across reconnects.
    """

    def __init__(self, api, emit, agent: str, namespace: str | None = None, since_ns: int | None = None,
                 log=print) -> None:
        self.api, self.emit, self.agent, self.namespace, self.log = api, emit, agent, namespace, log
        self.since_ns = time.time_ns() - 60 * 10**9 if since_ns is None else since_ns
        self.seen: set[tuple] = set()
        self.restarts: dict[tuple, int] = {}
        self.resource_version: str | None = None
        self._stop = threading.Event()

    def handle(self, event: dict) -> None:
        """One watch event (``{"type": ..., "object": V1Pod}``)."""
        pod = event["object"]
        if event["type"] == "DELETED" or pod.status is None:
            return
        meta = pod.metadata
        self.resource_version = meta.resource_version or self.resource_version
        node = pod.spec.node_name if pod.spec else None
        for cs in (pod.status.container_statuses or []) + (pod.status.init_container_statuses or []):
            where = f"{meta.namespace}/{meta.name}/{cs.name}" + (f"@{node}" if node else "")
            key = (meta.uid, cs.name)
            for state in (cs.state, cs.last_state):
                term = state.terminated if state else None
                if term is None:
                    continue
                finished = _ns(term.finished_at) or time.time_ns()
                if finished < self.since_ns or (key, finished) in self.seen:
                    continue
                self.seen.add((key, finished))
                if term.reason == "OOMKilled":
                    self.emit(contract.OomEvent(contract.ANY_RUN, self.agent, finished, source="k8s", where=where, count=1))
            before = self.restarts.get(key)
            count = cs.restart_count or 0
            self.restarts[key] = max(count, before or 0)  # restart counts only grow: an older state seen again is not news
            if before is not None and count > before:
                term = cs.last_state.terminated if cs.last_state else None
                at = (_ns(term.finished_at) if term else None) or time.time_ns()
                self.emit(contract.ContainerRestart(contract.ANY_RUN, self.agent, at, where=where,
                                                    reason=term.reason if term else None, count=cs.restart_count))

    def run_once(self, timeout_s: int = 300) -> int:
        """One watch request until the server ends it; the number of events handled."""
        from kubernetes import watch

        list_fn = (self.api.list_namespaced_pod if self.namespace else self.api.list_pod_for_all_namespaces)
        kwargs = {"namespace": self.namespace} if self.namespace else {}
        if self.resource_version:
            kwargs["resource_version"] = self.resource_version
        n = 0
        w = watch.Watch()
        for event in w.stream(list_fn, timeout_seconds=timeout_s, **kwargs):
            self.handle(event)
            n += 1
            if self._stop.is_set():
                w.stop()
        return n

    def run(self) -> None:
        """Watch until ``stop()``, reconnecting (with backoff) when the API server ends or fails the watch."""
        backoff = 1.0
        while not self._stop.is_set():
            try:
                self.run_once()
                backoff = 1.0
            except Exception as e:  # noqa: BLE001 - API server away, 410 Gone, ...: start over
                self.resource_version = None if "410" in str(e) else self.resource_version
                self.log(f"kubernetes watch: {e}; retrying in {backoff:.0f} s", flush=True)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)

    def stop(self) -> None:
        self._stop.set()
