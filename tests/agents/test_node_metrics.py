"""The node-metrics agent and OOM detection with the real parts: Prometheus, node exporter, a
memory-limited cgroup the kernel really OOM-kills in, the broker and the streaming job."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

import numpy as np
import pytest
from support import ROOT, create_topic, free_port, run_job, telemetry

from agents.node_metrics import METRICS, OBSERVER_METRIC, NodeMetrics
from agents.promql import prometheus_query
from core import contract, observer
from loadgen.synthetic import NS, SyntheticSpec, generate, produce
from runs import results
from stack.__main__ import NODE_COLLECTORS

pytestmark = pytest.mark.integration


def start_agent(prometheus, broker, topic, *extra, env=None):
    proc = subprocess.Popen([sys.executable, "-m", "agents.node_metrics", "--prometheus", prometheus,
                             "--telemetry-bootstrap", broker, "--telemetry-topic", topic, "--clock-listen", "none", *extra],
                            cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT, **(env or {})), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    line = proc.stdout.readline()
    assert " INFO node-metrics: node_metrics" in line, line + proc.stdout.read()  # its first log line
    return proc


def stop(proc):
    os.kill(proc.pid, signal.SIGTERM)
    proc.wait(30)


@pytest.mark.serial  # a CPU burner shows only on a machine not already busy
def test_samples_every_second_and_a_cpu_burner_shows_within_3_s(prometheus, broker):
    topic = "tel-node-metrics"
    create_topic(broker, topic)
    agent = start_agent(prometheus, broker, topic)
    burners = []
    try:
        time.sleep(5)
        burn_ns = time.time_ns()
        burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
        time.sleep(6)
    finally:
        for b in burners:
            b.kill()
            b.wait()
        time.sleep(1.5)
        stop(agent)
    samples = [r for r in telemetry(broker, topic, contract.ANY_RUN) if r["kind"] == "node"]
    cpu = sorted((r["at_ns"], r.get("value"), r.get("missing")) for r in samples if r["metric"] == "cpu_util")
    at = np.array([c[0] for c in cpu])
    steps = np.diff(at)
    assert len(cpu) >= 11 and (steps == NS).all(), steps  # one sample every second, on the second, no hole
    assert {r["metric"] for r in samples} == set(METRICS) | {OBSERVER_METRIC}
    assert {r["value"] for r in samples if r["metric"] == "cpu_cores"} == {float(os.cpu_count())}
    assert not [c for c in cpu[2:] if c[2]], "holes while Prometheus was up"  # (the first ones may lack two scrapes)
    before = [v for t, v, _ in cpu if t < burn_ns and v is not None]
    baseline = float(np.median(before))
    risen = [(t - burn_ns) / NS for t, v, _ in cpu if burn_ns <= t <= burn_ns + 3 * NS and v is not None and v >= baseline + 0.3]
    assert risen, f"no rise within 3 s: baseline {baseline:.2f}, samples {[(round((t - burn_ns) / NS, 1), v) for t, v, _ in cpu]}"
    mem = [r["value"] for r in samples if r["metric"] == "mem_available_bytes" and r.get("value")]
    assert mem and 0 < min(mem) <= max(mem) < 1 << 50


BURN_HALF = """
import time
while True:  # busy 20 ms, asleep 20 ms: about half a core
    t = time.process_time() + 0.02
    while time.process_time() < t:
        pass
    time.sleep(0.02)
"""


@pytest.mark.serial  # a CPU burner shows only on a machine not already busy
def test_a_process_registered_as_flightwatch_shows_in_observer_cpu(prometheus, broker, tmp_path):
    """A process in the observer registry that burns about half a core: ``observer_cpu`` matches its own CPU
    (read from /proc over the same seconds) within 0.1 core, and falls to ~0 once it is gone."""
    import psutil

    topic = "tel-observer"
    create_topic(broker, topic)
    stack_dir = tmp_path / "stack"
    burner = subprocess.Popen([sys.executable, "-c", BURN_HALF])
    observer.register("burner", burner.pid, stack_dir=str(stack_dir))
    agent = start_agent(prometheus, broker, topic, env={"FLIGHTWATCH_STACK_DIR": str(stack_dir)})
    try:
        time.sleep(3)
        t0, cpu0 = time.time_ns(), sum(psutil.Process(burner.pid).cpu_times()[:2])
        time.sleep(8)
        t1, cpu1 = time.time_ns(), sum(psutil.Process(burner.pid).cpu_times()[:2])
    finally:
        burner.kill()
        burner.wait()
    time.sleep(3.5)
    stop(agent)
    truth = (cpu1 - cpu0) / ((t1 - t0) / NS)
    samples = sorted((r["at_ns"], r.get("value")) for r in telemetry(broker, topic, contract.ANY_RUN)
                     if r["kind"] == "node" and r["metric"] == OBSERVER_METRIC)
    during = [v for t, v in samples if t0 + NS <= t <= t1]
    after = [v for t, v in samples if t > t1 + 2 * NS]
    assert len(during) >= 6 and after, samples
    assert abs(float(np.median(during)) - truth) <= 0.1, (truth, during)
    assert 0.3 <= truth <= 0.7  # the burner did burn about half a core (else the test proves little)
    assert max(after) <= 0.05, after  # gone: no longer counted (and its registry entry removed)
    assert not list((stack_dir / "observers").glob("*.pid"))


def test_prometheus_down_is_a_visible_hole_every_second():
    out = []
    m = NodeMetrics(prometheus_query(f"http://127.0.0.1:{free_port()}"), out.append, "nm")
    for k in range(3):
        m.cycle((1_800_000_000 + k) * NS, timeout_s=0.5)
    assert len(out) == 3 * len(METRICS) and all(r.missing and r.value is None for r in out)
    assert sorted({r.at_ns for r in out}) == [(1_800_000_000 + k) * NS for k in range(3)]
    assert m.num_missing_cycles == 3


def own_memory_cgroup() -> str:
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            if "memory" in controllers.split(","):
                return f"/sys/fs/cgroup/memory{path}"
    pytest.fail("no cgroup v1 memory controller (see ARCHITECTURE.md)")


def test_real_oom_kill_reaches_the_topic_and_the_jobs_output(prometheus, broker, tmp_path):
    """A leaking process in a 64 MiB child cgroup is killed by the kernel; the cgroup watcher and
    node_vmstat_oom_kill both report it, at the right time and place, through the job's output."""
    topic, run_id = "tel-oom", "oom-e2e"
    create_topic(broker, topic)
    cg = os.path.join(own_memory_cgroup(), f"flightwatch-test-{uuid.uuid4().hex[:8]}")
    os.mkdir(cg)
    try:
        with open(os.path.join(cg, "memory.limit_in_bytes"), "w") as f:
            f.write(str(64 << 20))
        # The run's own telemetry: 12 s at 100 events/s starting now (its span takes the machine's records).
        start_ns = time.time_ns()
        run = generate(SyntheticSpec(run_id=run_id, start_ns=start_ns, duration_s=12, rate_per_sec=100, pause=None,
                                     oom_at_s=(), num_malformed=0, late_count=0))
        produce(run, broker, topic)
        agent = start_agent(prometheus, broker, topic, "--cgroup", cg, "--node", "test-node")
        try:
            time.sleep(3)
            leak_ns = time.time_ns()
            leaker = subprocess.Popen([sys.executable, "-c", "x = []\nwhile True: x.append(bytearray(8 << 20))"],
                                      preexec_fn=lambda: open(os.path.join(cg, "cgroup.procs"), "w").write(str(os.getpid())))
            try:
                name = open(f"/proc/{leaker.pid}/comm").read().strip()
            except OSError:  # killed already
                name = os.path.basename(sys.executable)[:15]
            assert leaker.wait(30) == -signal.SIGKILL
            killed_ns = time.time_ns()
            time.sleep(3)  # two scrapes and a query for vmstat
        finally:
            stop(agent)
        with open(os.path.join(cg, "memory.oom_control")) as f:
            assert "oom_kill 1" in f.read()
    finally:
        os.rmdir(cg)
    ooms = [r for r in telemetry(broker, topic, contract.ANY_RUN) if r["kind"] == "oom"]
    by_source = {o["source"]: o for o in ooms}
    assert set(by_source) == {"cgroup", "vmstat"}, ooms
    assert by_source["cgroup"]["where"] == f"test-node:{cg}" and by_source["cgroup"]["count"] == 1
    for o in ooms:
        assert leak_ns - 2 * NS <= o["at_ns"] <= killed_ns + 2 * NS, (o, leak_ns, killed_ns)
    # ... and out of the streaming job, in the run's windows and summary.
    out = tmp_path / "run"
    job = run_job("run", "--run", run_id, "--bootstrap", broker, "--topic", topic, "--out", str(out), "--no-heartbeat",
                  "--available-now")
    assert job.returncode == 0, job.stderr[-3000:]
    summary = results.summarize(str(out))
    got = {o["source"]: o for o in summary["oom_events"]}
    assert {s: (got[s]["at_ns"], got[s]["where"]) for s in got} == {s: (o["at_ns"], o["where"]) for s, o in by_source.items()}
    assert summary["oom_kills"] == 1 and summary["oom_kills_by_source"] == {"cgroup": 1, "vmstat": 1}
    # the victim, as the kernel named it (/dev/kmsg, readable by root, as the cgroup above needs), in both events
    from agents.oom import KernelLog

    assert KernelLog.open() is not None, "/dev/kmsg is not readable here: the victims cannot be named"
    assert {s: got[s]["victim"] for s in got} == {"cgroup": f"pid {leaker.pid} ({name})", "vmstat": f"pid {leaker.pid} ({name})"}, got
    w = results.load_windows(str(out))
    assert int(w["oom_kills"].sum()) in (1, 2)  # one kill: one per window, two if the detectors straddle a window edge
    assert w.loc[w["window_ns"] == by_source["cgroup"]["at_ns"] // NS * NS, "oom_kills"].item() == 1
    assert any(c.startswith("node:") and c.endswith(":cpu_util") for c in w.columns)


def test_observer_cpu_from_promql_per_node_as_on_kubernetes():
    """``--observer-promql``: each series' ``node`` label gives one ``observer_cpu`` sample (a recorded answer: no
    cluster here); a failed query is a hole for every known node, not a dead agent."""
    from agents.promql import promql_observer

    def query(promql, at_s, timeout_s):
        if promql != "OBS":
            return []
        if at_s > 6:
            raise OSError("prometheus away")
        return [{"metric": {"node": "n1"}, "value": [at_s, "0.4"]}, {"metric": {"instance": "10.0.0.2:9100"}, "value": [at_s, "1.25"]}]

    out = []
    m = NodeMetrics(query, out.append, "a", promql_observer(query, "OBS"))
    m.nodes = {"x:9100": "n1"}
    m.cycle(5 * NS, 0.5)
    assert {(r.node, r.value, r.missing) for r in out if r.metric == OBSERVER_METRIC} == {("n1", 0.4, None), ("10.0.0.2:9100", 1.25, None)}
    out.clear()
    m.cycle(7 * NS, 0.5)
    assert [(r.node, r.missing) for r in out if r.metric == OBSERVER_METRIC] == [("n1", True)]


def test_rates_against_a_prometheus_that_scrapes_every_15_s(tmp_path):
    """An ordinary Prometheus scrapes every 15-30 s: a fixed 5 s irate window then holds one sample at most, and CPU
    and network are always missing. The agent reads the node exporters' scrape interval from Prometheus' targets and
    looks back three intervals (45 s). A real Prometheus and node exporter, scraping every 15 s."""
    import shutil

    from support import wait_for_scrapes

    from agents.promql import node_scrape_intervals, prometheus_client, rate_window_s
    from core.procs import stop_process, wait_port

    node_port, prom_port = free_port(), free_port()
    (tmp_path / "prometheus.yml").write_text("global:\n  scrape_interval: 15s\nscrape_configs:\n  - job_name: nodes\n"
                                             f"    static_configs:\n      - targets: ['127.0.0.1:{node_port}']\n")
    node = subprocess.Popen([shutil.which("prometheus-node-exporter"), f"--web.listen-address=127.0.0.1:{node_port}",
                             *NODE_COLLECTORS], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    prom = subprocess.Popen([shutil.which("prometheus"), f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--web.listen-address=127.0.0.1:{prom_port}", f"--storage.tsdb.path={tmp_path / 'data'}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{prom_port}"
    try:
        assert wait_port(node_port) and wait_port(prom_port, 30)
        wait_for_scrapes(url, "nodes", 2, "1m", seconds=60, poll_s=1)  # two scrapes: a rate has its two samples
        prom_client = prometheus_client(url)
        intervals = node_scrape_intervals(prom_client)
        assert intervals == [15.0]
        window = rate_window_s(intervals)
        assert window == 45
        got = {}
        for w in (5, window):
            samples = []
            NodeMetrics(prometheus_query(url, prom_client), samples.append, "nm", window_s=w).cycle(time.time_ns(), 5)
            got[w] = {s.metric: s for s in samples if isinstance(s, contract.NodeSample)}
        assert got[5]["cpu_util"].missing and got[5]["net_rx_drops_per_s"].missing  # what a fixed 5 s window gave
        assert not got[45]["cpu_util"].missing and 0 <= got[45]["cpu_util"].value <= 1
        assert not got[45]["net_rx_drops_per_s"].missing and got[45]["mem_used_bytes"].value > 0
    finally:
        stop_process(prom)
        stop_process(node)
