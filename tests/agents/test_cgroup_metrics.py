"""The cgroup-metrics agent (``agents.cgroup_metrics``): a host that is a cgroup, read as a node. Its files as the
kernel writes them (v1 and v2), and a real cgroup v1 with a CPU quota and a busy process in it (root)."""
import os
import subprocess
import sys
import time
import uuid

import pytest

from agents import cgroup_metrics as cm


def files(root, **content):
    for path, text in content.items():
        p = root / path.replace("__", "/")
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def test_v1_and_v2_files_read_as_quota_cpu_time_and_memory(tmp_path):
    files(tmp_path / "v1", **{"cpu__h__cpu.cfs_quota_us": "25000\n", "cpu__h__cpu.cfs_period_us": "100000\n",
                              "cpuacct__h__cpuacct.usage": "5000000\n", "memory__h__memory.usage_in_bytes": "300\n",
                              "memory__h__memory.limit_in_bytes": "1000\n"})
    h = cm.HostCgroup("a", "/h", str(tmp_path / "v1"))
    assert (h.quota_cores(), h.cpu_ns(), h.memory_bytes()) == (0.25, 5_000_000, (300, 1000))
    files(tmp_path / "v2", **{"h__cpu.max": "max 100000\n", "h__cpu.stat": "usage_usec 7\nuser_usec 5\n",
                              "h__memory.current": "300\n", "h__memory.max": "max\n"})
    h = cm.HostCgroup("b", "h", str(tmp_path / "v2"))
    assert (h.quota_cores(), h.cpu_ns(), h.memory_bytes()) == (None, 7000, (300, None))


def test_a_bad_host_is_a_one_line_error_and_exit_2(capsys):
    assert cm.main(["--host", "receiver"]) == 2
    assert capsys.readouterr().err.strip() == "cgroup_metrics: error: --host 'receiver': expected NAME=CGROUP"
    assert cm.main(["--host", "r=no/such/cgroup"]) == 2
    assert "no cgroup no/such/cgroup under /sys/fs/cgroup" in capsys.readouterr().err


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.isdir("/sys/fs/cgroup/cpuacct"), reason="needs root and cgroup v1")
def test_a_busy_process_held_to_a_fifth_of_a_core_reads_as_that_host_at_full_cpu():
    name = f"flightwatch-test-{uuid.uuid4().hex[:8]}"
    made = []
    for c in ("cpu", "cpuacct", "memory"):
        os.mkdir(f"/sys/fs/cgroup/{c}/{name}")
        made.append(f"/sys/fs/cgroup/{c}/{name}")
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        with open(f"/sys/fs/cgroup/cpu/{name}/cpu.cfs_quota_us", "w") as f:
            f.write("20000")
        with open(f"/sys/fs/cgroup/memory/{name}/memory.limit_in_bytes", "w") as f:
            f.write(str(256 << 20))
        for d in made:
            with open(f"{d}/cgroup.procs", "w") as f:
                f.write(str(busy.pid))
        s = cm.Sampler([cm.HostCgroup("receiver", name)], {"receiver"}, "cgroup-metrics")
        assert s.sample(time.time_ns()) and time.sleep(2) is None  # the first: memory only (no interval yet)
        got = {r.metric: r.value for r in s.sample(time.time_ns())}
        assert got["cpu_cores"] == pytest.approx(0.2) and 0.9 <= got["cpu_util"] <= 1.15, got  # CFS periods straddle the interval
        assert got["observer_cpu"] == pytest.approx(0.2 * got["cpu_util"])
        assert got["mem_used_bytes"] + got["mem_available_bytes"] == 256 << 20
    finally:
        busy.kill()
        busy.wait()
        for d in made:
            for _ in range(50):
                try:
                    os.rmdir(d)
                    break
                except OSError:
                    time.sleep(0.1)
