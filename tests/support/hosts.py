"""Hosts on this machine for a multi-host test, each as a pod of a cluster is: its own network namespace with its
own address on a bridge the test makes, its own hostname, its own mount view (a private /tmp and home, the checkout
and the interpreter read-only, one folder shared by all: the run folders' volume) and an unprivileged uid.

    with Hosts(["master", "worker-0"], shared=tmp_path / "shared", private=tmp_path / "hosts") as hosts:
        p = hosts["master"].popen([...])      # runs in master's namespaces, as uid 10001
        hosts["master"].ip                    # its address; the others reach it there

A host may have limits, as a node or a pod has: ``Hosts(..., limits={"worker-1": (1.0, 3 << 30)})`` makes it a cgroup
(v1 ``cpu``, ``cpuacct``, ``memory``) with that CPU quota and memory limit, every process it starts in it, and
``set_limits`` changes them mid-run. A process may run skewed (``skewed``: its wall clock off the machine's), or as a
node-level agent on a host's network in the machine's mount view (``popen_node_agent``).

Needs root (``ip netns``, veth pairs, ``unshare``; CI runs as root here). Traffic goes only between the addresses
given here: the bridge has none in this machine's namespace, and no route leads out. Leaving the ``with`` stops every
process started through it (by its recorded PID, its process group) and removes every namespace and link it made,
also when the test failed.
"""
from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import secrets
import shlex
import subprocess
import sys
import time

from agents.oom import CGROUP_ROOT
from core.procs import stop_process

UID = 10001
"""The images' user (``deploy/Dockerfile``: ``USER 10001``)."""
READ_ONLY_UNDER_ROOT = ("/root/.pyenv", "/root/.calfkit")
"""What the processes need of root's home (the interpreter the venv points at, the Tansu binary): kept, read-only,
in a home that is otherwise empty (root's is 0700: an unprivileged uid could not reach them)."""


def venv_outside(checkout: str) -> str | None:
    """The checkout's venv where ``.venv`` links to a folder outside it (make's VENV_CACHE: under root's home, which
    the hosts cover), else None."""
    venv = os.path.realpath(os.path.join(checkout, ".venv"))
    inside = venv.startswith(os.path.realpath(checkout) + os.sep)
    return None if inside or not os.path.isdir(venv) else venv


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def usable() -> str | None:
    """Why hosts cannot be made here (None if they can)."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, veth pairs, mounts)"
    for tool in ("ip", "unshare", "setpriv"):
        if subprocess.run(["sh", "-c", f"command -v {tool}"], capture_output=True).returncode:
            return f"{tool} is not installed"
    probe = subprocess.run(["unshare", "--net", "--mount", "--uts", "true"], capture_output=True, text=True)
    if probe.returncode:  # a container without the capabilities for namespaces
        return f"cannot make namespaces here: {probe.stderr.strip()}"
    return None


SKEWCLOCK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "skewclock")


def skewed(argv: list[str], seconds: float) -> list[str]:
    """``argv`` (a Python program) with its wall clock ``seconds`` off the machine's, and its children's
    (``support/skewclock/sitecustomize.py``, which says why not libfaketime)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(SKEWCLOCK)))  # the checkout, bound at its path on every host
    return ["env", f"SKEWCLOCK_S={seconds:+.6f}", f"PYTHONPATH={SKEWCLOCK}:{root}", *argv]


CGROUPS, CONTROLLERS, CFS_PERIOD_US = CGROUP_ROOT, ("cpu", "cpuacct", "memory"), 100_000
"""A host with limits is a cgroup of each (v1, as this machine has): a CFS quota, its CPU time, a memory limit."""


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _free_subnet() -> ipaddress.IPv4Network:
    """A /24 in 10.200.0.0/13 that no address or route of this machine touches."""
    used = _ip("-o", "-4", "addr").stdout + _ip("-4", "route").stdout
    nets = [ipaddress.ip_network(w, strict=False) for w in used.split() if "/" in w and w[0].isdigit()]
    for _ in range(100):
        net = ipaddress.ip_network(f"10.{200 + secrets.randbelow(8)}.{secrets.randbelow(256)}.0/24")
        if not any(net.overlaps(n) for n in nets):
            return net
    raise RuntimeError("no free 10.200.0.0/13 subnet for the hosts")


class Host:
    """One host: ``ip``, ``name`` and ``popen`` (a command in its namespaces, as ``UID``)."""

    def __init__(self, hosts: Hosts, name: str, ns: str, ip: str, private: str) -> None:
        self.hosts, self.name, self.ns, self.ip, self.private = hosts, name, ns, ip, private

    @property
    def cgroup(self) -> str | None:
        """Its cgroup (relative to each hierarchy's root) when it has limits (``Hosts(limits=...)``), else None."""
        return f"flightwatch-hosts-{self.hosts.tag}/{self.name}" if self.name in self.hosts.limits else None

    def set_limits(self, cores: float | None = None, memory: int | None = None) -> None:
        """Its CPU quota (cores) and memory limit (bytes), as a host of that size has: each left as it is when None."""
        if cores is not None:
            _write(f"{CGROUPS}/cpu/{self.cgroup}/cpu.cfs_quota_us", str(int(cores * CFS_PERIOD_US)))
        if memory is not None:
            _write(f"{CGROUPS}/memory/{self.cgroup}/memory.limit_in_bytes", str(memory))

    def _setup(self) -> str:
        """The shell run as root in the host's new mount and UTS namespaces before it becomes ``UID``."""
        q = shlex.quote
        kept = [q(d) for d in (*READ_ONLY_UNDER_ROOT, venv_outside(self.hosts.checkout)) if d and os.path.isdir(d)]
        keep = "; ".join(f"mkdir -p /mnt{d} && mount --bind {d} /mnt{d}" for d in kept)
        back = "; ".join(f"mkdir -p {d} && mount --bind /mnt{d} {d} && mount -o remount,bind,ro {d}" for d in kept)
        shared, root = q(self.hosts.shared), q(self.hosts.checkout)
        return "; ".join([
            "set -e",
            "mount -t tmpfs -o mode=0755 tmpfs /mnt",  # a staging area, private to this mount namespace
            # the image's user (useradd flightwatch, uid 10001): Hadoop's login in Spark's JVMs looks its name up
            f"mount --bind {q(self.hosts.etc)}/passwd /etc/passwd && mount --bind {q(self.hosts.etc)}/group /etc/group",
            keep or "true",
            # staged before /tmp and /root are covered: the checkout, the shared folder or the host's own may be under either
            "mkdir -p /mnt/shared /mnt/private /mnt/checkout",
            f"mount --bind {shared} /mnt/shared && mount --bind {q(self.private)} /mnt/private && mount --bind {root} /mnt/checkout",
            "mount --bind /mnt/private /tmp",                       # the host's own /tmp
            "mount -t tmpfs -o mode=0755 tmpfs /root",              # an empty home for root's
            back or "true",
            f"mkdir -p {root} && mount --bind /mnt/checkout {root} && mount -o remount,bind,ro {root}",  # the checkout (and its venv) read-only
            f"mkdir -p {shared} && mount --bind /mnt/shared {shared}",  # the one folder every host shares
            f"cd {root}",
            f"hostname {q(self.name)}",
            f"mkdir -p /tmp/home && chown {UID}:{UID} /tmp/home",
            f'exec setpriv --reuid={UID} --regid={UID} --clear-groups --inh-caps=-all env HOME=/tmp/home "$@"',
        ])

    def popen(self, argv: list[str], env: dict | None = None, log=subprocess.DEVNULL) -> subprocess.Popen:
        """``argv`` in this host's namespaces, as ``UID``, in the checkout; stopped when the hosts are removed."""
        cmd = ["ip", "netns", "exec", self.ns, "unshare", "--mount", "--uts", "--propagation", "private", "--",
               "sh", "-c", self._setup(), "sh", *argv]
        if self.cgroup:  # into its cgroup first (outside: ``ip netns exec`` mounts a /sys without the cgroups)
            join = "; ".join(f"echo $$ > {CGROUPS}/{c}/{self.cgroup}/cgroup.procs" for c in CONTROLLERS)
            cmd = ["sh", "-c", f'set -e; {join}; exec "$@"', "sh", *cmd]
        p = subprocess.Popen(cmd, cwd=self.hosts.checkout, env=env, stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True)
        self.hosts.procs.append(p)
        return p

    def popen_node_agent(self, argv: list[str], env: dict | None = None, log=subprocess.DEVNULL) -> subprocess.Popen:
        """``argv`` as a node-level agent runs (cAdvisor, a DaemonSet with the node's ``/sys/fs/cgroup``): on this
        host's network, in the machine's mount view (``ip netns exec`` would mount a ``/sys`` without the cgroups), as
        root; stopped when the hosts are removed."""
        p = subprocess.Popen(["nsenter", f"--net=/var/run/netns/{self.ns}", *argv], cwd=self.hosts.checkout, env=env,
                             stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.hosts.procs.append(p)
        return p

    def take_shared_away(self, pid: int) -> None:
        """The shared volume taken away from this host (lazily unmounted in the mount view of ``pid``, one of its
        processes), as a node loses its claim: its processes see the empty mount point, owned by root, after."""
        subprocess.run(["nsenter", "-t", str(pid), "-m", "umount", "-l", self.hosts.shared], check=True)

    @contextlib.contextmanager
    def route_cut(self, ip: str):
        """This host's path to ``ip`` cut while inside (a blackhole route in its network namespace: its packets to
        ``ip`` go nowhere, as on a link that is down; this kernel has no ``tc netem``), then given back."""
        subprocess.run(["ip", "netns", "exec", self.ns, "ip", "route", "add", "blackhole", f"{ip}/32"], check=True)
        try:
            yield
        finally:
            subprocess.run(["ip", "netns", "exec", self.ns, "ip", "route", "del", "blackhole", f"{ip}/32"], check=True)

    def reachable(self, ip: str, port: int, seconds: float = 60) -> bool:
        """Whether ``ip:port`` accepts a connection from this host, within ``seconds``."""
        probe = (f"import socket,time\nt=time.monotonic()+{seconds}\nwhile time.monotonic()<t:\n try:\n"
                 f"  socket.create_connection(({ip!r},{port}),1).close();raise SystemExit(0)\n"
                 " except OSError: time.sleep(0.2)\nraise SystemExit(1)")
        return subprocess.run(["ip", "netns", "exec", self.ns, sys.executable, "-c", probe]).returncode == 0


class Hosts:
    """The hosts of one test (see the module's docstring); a context manager that removes them."""

    def __init__(self, names: list[str], shared, private, checkout: str,
                 limits: dict[str, tuple[float | None, int | None]] | None = None) -> None:
        self.names, self.shared, self.checkout = names, str(shared), checkout
        self.limits = limits or {}  # host -> (cores, memory bytes): its own cgroup (v1 cpu, cpuacct and memory)
        self.private_root = str(private)
        self.etc = os.path.join(self.private_root, "etc")  # /etc/passwd and /etc/group with the image's user
        self.tag = secrets.token_hex(2)
        self.bridge = f"fwb{self.tag}"
        self.procs: list[subprocess.Popen] = []
        self.made_ns: list[str] = []
        self.hosts: dict[str, Host] = {}

    def __enter__(self) -> Hosts:
        try:
            self._make()
        except BaseException:
            self.remove()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.remove()

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    def _make(self) -> None:
        net = _free_subnet()
        os.makedirs(self.etc, exist_ok=True)
        for name, line in (("passwd", f"flightwatch:x:{UID}:{UID}::/tmp:/usr/sbin/nologin\n"),
                           ("group", f"flightwatch:x:{UID}:\n")):
            with open(f"/etc/{name}") as src, open(os.path.join(self.etc, name), "w") as dst:
                dst.write(src.read() + line)
        os.makedirs(self.shared, exist_ok=True)
        os.chown(self.shared, UID, UID)
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("link", "set", self.bridge, "up")
        for i, name in enumerate(self.names):
            ns, outer, inner = f"fw{self.tag}-{name}", f"fv{self.tag}{i}a", f"fv{self.tag}{i}b"
            _ip("netns", "add", ns)
            self.made_ns.append(ns)
            _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
            _ip("link", "set", outer, "master", self.bridge)
            _ip("link", "set", outer, "up")
            _ip("link", "set", inner, "netns", ns)
            ip = str(net[i + 2])
            _ip("-n", ns, "addr", "add", f"{ip}/24", "dev", inner)
            _ip("-n", ns, "link", "set", inner, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            private = os.path.join(self.private_root, name)
            os.makedirs(private, exist_ok=True)
            os.chmod(private, 0o1777)
            self.hosts[name] = Host(self, name, ns, ip, private)
            if name in self.limits:
                for c in CONTROLLERS:
                    os.makedirs(f"{CGROUPS}/{c}/{self.hosts[name].cgroup}", exist_ok=True)
                self.hosts[name].set_limits(*self.limits[name])

    def remove(self) -> None:
        """Stop every process started here, then remove the namespaces and the bridge (their veths go with them)."""
        for p in reversed(self.procs):
            if p.poll() is None:
                stop_process(p, wait_s=20, group=True)
        for ns in self.made_ns:
            for _ in range(20):  # a namespace goes once the last process in it has ended
                if _ip("netns", "del", ns, check=False).returncode == 0:
                    break
                time.sleep(0.25)
        _ip("link", "del", self.bridge, check=False)
        self.made_ns = []
        for c in CONTROLLERS:  # the hosts' cgroups, once their processes have ended (any left go to the parent)
            parent = f"{CGROUPS}/{c}/flightwatch-hosts-{self.tag}"
            for name in self.limits:
                with contextlib.suppress(OSError):
                    with open(f"{parent}/{name}/cgroup.procs") as f:
                        left = f.read().split()
                    for pid in left:
                        _write(f"{CGROUPS}/{c}/cgroup.procs", pid)
                    os.rmdir(f"{parent}/{name}")
            with contextlib.suppress(OSError):
                os.rmdir(parent)


def wait_for(what: str, ok, seconds: float, logs) -> None:
    """Until ``ok()``; past ``seconds``, an AssertionError with the tails of ``logs``."""
    deadline = time.monotonic() + seconds
    while not ok():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not within {seconds:.0f} s\n" + tails(logs))
        time.sleep(1)


def tails(logs) -> str:
    return "\n".join(f"--- {p}\n{open(p, errors='replace').read()[-2500:]}" for p in logs if os.path.exists(p))


def spark_master_state(asker: Host, master: str, ui_port: int) -> dict:
    """A Spark standalone master's own account (its web UI's JSON), asked from ``asker``'s namespace ({} until it
    answers)."""
    get = f"import urllib.request; print(urllib.request.urlopen('http://{master}:{ui_port}/json/', timeout=3).read().decode())"
    r = subprocess.run(["ip", "netns", "exec", asker.ns, sys.executable, "-c", get], capture_output=True, text=True)
    try:
        return json.loads(r.stdout)
    except ValueError:
        return {}
