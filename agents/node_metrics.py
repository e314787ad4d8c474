"""Node-metrics agent: what the machines under the test are doing, every second, into the telemetry topic.

Every ``--interval`` (1 s) it asks Prometheus (prometheus-api-client; one PromQL query for
all metrics, evaluated at the agent's own timestamp) for each node that a node exporter
reports, and writes one ``node`` record per node and metric:

    cpu_util              busy share of all CPUs, 0..1 (irate over the last two scrapes)

Rates (``irate``) look back over a window that holds at least two scrapes of the Prometheus asked: three
scrape intervals of the node exporters' job, at least 5 s (``--rate-window auto``, read from Prometheus'
targets; 5 s with flightwatch's own 1 s scrapes, 45 s against a Prometheus that scrapes every 15 s).
    mem_used_bytes        MemTotal − MemAvailable
    mem_available_bytes   MemAvailable
    net_rx_drops_per_s    receive drops, all interfaces      net_tx_drops_per_s   transmit drops
    net_rx_errors_per_s   receive errors                     net_tx_errors_per_s  transmit errors
    load1                 1-minute load average
    oom_kills_total       node_vmstat_oom_kill
    cpu_cores             number of CPUs
    observer_cpu          cores used by flightwatch itself on the node (``core.observer``): the
                          stack's processes, the streaming job's and the load generator's trees,
                          read with psutil; with ``--observer-promql`` a PromQL query per ``node``
                          instead (on Kubernetes: the container CPU of flightwatch's pods)

A failed or slow query (longer than the interval), a node whose scrape is down, or a
metric a node does not report gives a sample marked ``missing``: a visible hole, never a
silent gap. An increase of ``oom_kills_total`` is also an OOM event (source ``vmstat``,
stamped with the scrape that first showed it).

The agent also runs the OOM watchers of ``agents.oom`` (``--cgroup``/``--pid`` for memory
cgroups, ``--kubernetes`` for pods) and serves the clock reference (``core.clock``) the
other agents measure their clock offset against.
"""
from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import threading
import time

from agents.promql import (
    MIN_WINDOW_S,
    node_scrape_intervals,
    prometheus_client,
    prometheus_query,
    promql_observer,
    rate_window_s,
)
from core import clock, contract, logs, settings
from core import metrics as metrics_module
from core.cli import OneLineParser, add_telemetry, add_wait, await_brokers
from core.kafka_options import telemetry_producer
from core.procs import HOST, NODE_METRICS_PORT

WINDOW = "$window"
"""Where a query's rate window goes (``combined_query``)."""
METRICS = {
    "cpu_util": '1 - avg by (instance) (irate(node_cpu_seconds_total{mode="idle"}[$window]))',
    "mem_used_bytes": "node_memory_MemTotal_bytes - node_memory_MemAvailable_bytes",
    "mem_available_bytes": "node_memory_MemAvailable_bytes",
    "net_rx_drops_per_s": "sum by (instance) (irate(node_network_receive_drop_total[$window]))",
    "net_tx_drops_per_s": "sum by (instance) (irate(node_network_transmit_drop_total[$window]))",
    "net_rx_errors_per_s": "sum by (instance) (irate(node_network_receive_errs_total[$window]))",
    "net_tx_errors_per_s": "sum by (instance) (irate(node_network_transmit_errs_total[$window]))",
    "load1": "node_load1",
    "oom_kills_total": "node_vmstat_oom_kill",
    "cpu_cores": 'count by (instance) (node_cpu_seconds_total{mode="idle"})',
}
"""Metric name -> PromQL giving one value per ``instance`` (a node exporter)."""
_EXTRA = {
    "_oom_scraped_at": "timestamp(node_vmstat_oom_kill)",
    "_up": "up",
    "_uname": "node_uname_info",
}
LABEL = "fw_metric"
OBSERVER_METRIC = "observer_cpu"


def combined_query(window_s: int = MIN_WINDOW_S) -> str:
    """One PromQL expression for every metric: each series labelled with its metric name; rates over ``window_s``."""
    parts = [f'label_replace({q.replace(WINDOW, f"{window_s}s")}, "{LABEL}", "{name}", "", "")'
             for name, q in {**METRICS, **_EXTRA}.items()]
    return " or ".join(parts)


class NodeMetrics:
    """Turns one query answer into node samples and vmstat OOM events (pure apart from ``query``)."""

    def __init__(self, query, emit, agent: str, observer=None, kernel=None, local_nodes: tuple = (),
                 window_s: int = MIN_WINDOW_S) -> None:
        """``observer(at_ns)``: (node, cores used by flightwatch or None) pairs, each an ``observer_cpu`` sample.
        ``kernel`` (``agents.oom.KernelLog``): names the victims of vmstat OOM kills on ``local_nodes`` (this host).
        ``window_s``: the rates' window (``rate_window_s``), which may change between cycles."""
        self.query, self.emit, self.agent, self.observer = query, emit, agent, observer
        self.window_s = window_s
        self.kernel, self.local_nodes = kernel, set(local_nodes)
        self.nodes: dict[str, str] = {}       # instance -> node name
        self.oom_counts: dict[str, float] = {}
        self.num_cycles = 0
        self.num_missing_cycles = 0

    def _node(self, instance: str) -> str:
        return self.nodes.get(instance, instance)

    def _missing(self, at_ns: int, instances, metrics=METRICS) -> None:
        for inst in instances:
            for m in metrics:
                self.emit(contract.NodeSample(contract.ANY_RUN, self.agent, at_ns, node=self._node(inst), metric=m,
                                              missing=True))

    def cycle(self, at_ns: int, timeout_s: float) -> int:
        """Query at ``at_ns``; emit a sample (or a hole) per node and metric. Returns samples with values."""
        self.num_cycles += 1
        if self.observer is not None:
            try:
                observed = self.observer(at_ns)
            except Exception:  # noqa: BLE001 - a failed reading is a hole, not a dead agent
                observed = [(node, None) for node in sorted(set(self.nodes.values()))]
            for node, cores in observed:
                self.emit(contract.NodeSample(contract.ANY_RUN, self.agent, at_ns, node=node, metric=OBSERVER_METRIC,
                                              value=cores, missing=True if cores is None else None))
        try:
            result = self.query(combined_query(self.window_s), at_ns / 1e9, timeout_s)
        except Exception:  # noqa: BLE001 - Prometheus down, slow or failing: a hole for every known node
            self.num_missing_cycles += 1
            self._missing(at_ns, self.nodes or ["prometheus"])
            return 0
        by_inst: dict[str, dict[str, float]] = {}
        for series in result:
            labels = series["metric"]
            inst = labels.get("instance", "?")
            name = labels.get(LABEL)
            if name == "_uname":
                self.nodes[inst] = labels.get("nodename", inst)
            by_inst.setdefault(inst, {})[name] = float(series["value"][1])
        n = 0
        for inst, values in by_inst.items():
            if "_uname" not in values and inst not in self.nodes:
                continue  # not a node exporter
            if values.get("_up", 1.0) == 0.0:
                self._missing(at_ns, [inst])
                continue
            node = self._node(inst)
            for m in METRICS:
                v = values.get(m)
                if v is None or v != v:  # absent or NaN
                    self.emit(contract.NodeSample(contract.ANY_RUN, self.agent, at_ns, node=node, metric=m, missing=True))
                    continue
                self.emit(contract.NodeSample(contract.ANY_RUN, self.agent, at_ns, node=node, metric=m, value=v))
                n += 1
            self._check_oom(inst, node, values, at_ns)
        missing_nodes = set(self.nodes) - set(by_inst)
        if missing_nodes:
            self._missing(at_ns, missing_nodes)
        return n

    def _check_oom(self, inst: str, node: str, values: dict, at_ns: int) -> None:
        count = values.get("oom_kills_total")
        if count is None:
            return
        before = self.oom_counts.get(inst)
        self.oom_counts[inst] = count
        if before is not None and count > before:
            scraped = values.get("_oom_scraped_at")
            at = int(scraped * 1e9) if scraped else at_ns
            victim = (self.kernel.victims("vmstat", int(count - before))
                      if self.kernel is not None and node in self.local_nodes else None)
            self.emit(contract.OomEvent(contract.ANY_RUN, self.agent, at, source="vmstat", where=node,
                                        count=int(count - before), victim=victim))


def local_observer(node: str, stack_dir: str | None = None):
    """``observer`` for ``NodeMetrics``: this node's flightwatch processes, measured with psutil (nothing on the
    first call: a rate needs two readings)."""
    from core.observer import CpuMeter

    meter = CpuMeter(stack_dir)

    def observe(at_ns: int) -> list[tuple[str, float | None]]:
        cores = meter.sample(at_ns / 1e9)
        return [] if cores is None else [(node, cores)]
    return observe


def _parser() -> argparse.ArgumentParser:
    ap = OneLineParser(prog="python -m agents.node_metrics", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    settings.add(ap, "FLIGHTWATCH_PROMETHEUS", "--prometheus", default="http://127.0.0.1:19090", help="Prometheus base URL")
    ap.add_argument("--interval", default="1s", help="sampling interval (default %(default)s)")
    settings.add(ap, "FLIGHTWATCH_RATE_WINDOW", "--rate-window", default="auto", metavar="DURATION|auto",
                 help="the window of the rates' irate: auto is three scrape intervals of the node exporters' job, as "
                      "Prometheus' targets say, at least 5s")
    add_telemetry(ap, "node-metrics")
    ap.add_argument("--node", default=socket.gethostname(), help="this host's name in cgroup OOM events (default %(default)s)")
    settings.add(ap, "FLIGHTWATCH_OOM_CGROUPS", "--oom-cgroup", "--cgroup", action="append", metavar="DIR", dest="cgroup",
                 help="watch this memory cgroup directory and all below it for OOM kills (repeatable; comma-separated "
                      "in the variable)")
    ap.add_argument("--pid", action="append", type=int, default=[], help="watch the memory cgroup of this process (repeatable)")
    ap.add_argument("--kubernetes", action="store_true", help="watch pods for OOMKilled containers and restarts "
                    "(in-cluster config, else ~/.kube/config)")
    ap.add_argument("--namespace", default=None, help="with --kubernetes: one namespace (default: all)")
    settings.add(ap, "FLIGHTWATCH_OBSERVER_PROMQL", "--observer-promql", metavar="QUERY",
                 help="PromQL giving the cores flightwatch uses per node (label 'node'), e.g. its pods' container "
                      "CPU on Kubernetes (default: this node's flightwatch processes, found from the stack's PID files "
                      "and the observer registry)")
    settings.add(ap, "FLIGHTWATCH_NODE_METRICS_METRICS_LISTEN", "--metrics-listen", type=metrics_module.listen_arg,
                 default=f"{HOST}:{NODE_METRICS_PORT}", metavar="HOST:PORT",
                 help="serve this agent's own Prometheus metrics here ('none': not at all)")
    add_wait(ap, "the telemetry broker")
    settings.add(ap, "FLIGHTWATCH_CLOCK_REFERENCE", "--clock-listen", default=clock.DEFAULT_REFERENCE, metavar="HOST:PORT",
                 help="serve the clock reference here (UDP; 'none' to not serve)")
    return ap


def _settings(argv) -> tuple[argparse.Namespace, float, int | None, list[str]]:
    """The flags, the sampling interval (s), the fixed rate window (s; None: auto) and the cgroups to watch;
    ValueError with what is wrong."""
    from agents.oom import cgroup_of_pid
    from core.units import parse_duration_ns

    a = _parser().parse_args(argv)
    settings.export(a)  # log level, slices, trimming: for this process' readers
    interval_s = parse_duration_ns(a.interval) / 1e9
    if interval_s < 0.1:
        raise ValueError(f"--interval {a.interval!r} is too short (at least 100ms)")
    fixed_window = None if a.rate_window == "auto" else parse_duration_ns(a.rate_window) // 10**9
    if fixed_window is not None and fixed_window < 1:
        raise ValueError(f"--rate-window {a.rate_window!r}: at least 1s, or auto")
    roots = list(a.cgroup)
    for pid in a.pid:
        try:
            roots.append(cgroup_of_pid(pid))
        except OSError:
            raise ValueError(f"--pid {pid}: no such process") from None
    for r in roots:
        if not os.path.isdir(r):
            raise ValueError(f"--cgroup {r!r}: not a directory")
    return a, interval_s, fixed_window, roots


def _oom_watchers(a, roots: list[str], write, kernel) -> list:
    """The cgroup and Kubernetes OOM watchers the flags ask for, started (each has ``stop``)."""
    from agents.oom import CgroupWatcher, KubeWatcher

    watchers = [CgroupWatcher(roots, write, a.node, a.agent, kernel=kernel).start()] if roots else []
    if a.kubernetes:
        from kubernetes import client, config

        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
        kube = KubeWatcher(client.CoreV1Api(), write, a.agent, a.namespace)
        threading.Thread(target=kube.run, name="kube-watch", daemon=True).start()
        watchers.append(kube)
    return watchers


class _Sampling:
    """The agent's loop: a cycle of queries every interval on the second's grid, the rate window following the
    node exporters' scrape interval (``--rate-window auto``: read again every 5 minutes), a progress line every 30 s."""

    def __init__(self, metrics: NodeMetrics, prom, interval_s: float, fixed_window: int | None, logger, agent: str):
        self.metrics, self.prom, self.interval_s, self.logger, self.agent = metrics, prom, interval_s, logger, agent
        self.window_known_at = None if fixed_window is None else float("inf")

    def follow_scrape_interval(self) -> None:
        try:
            intervals = node_scrape_intervals(self.prom)
        except Exception:  # noqa: BLE001 - Prometheus away: asked again next cycle, the default window meanwhile
            return
        if intervals:  # none yet (no node exporter scraped): the default window, asked again in 5 minutes
            window = rate_window_s(intervals)
            if window != self.metrics.window_s or self.window_known_at is None:
                self.logger.info(f"node_metrics {self.agent}: node exporters scraped every {max(intervals):g}s: "
                                 f"rates over {window}s")
            self.metrics.window_s = window
        self.window_known_at = time.monotonic()

    def run(self, stopping: threading.Event) -> None:
        m, step_ns = self.metrics, int(self.interval_s * 1e9)
        next_at = (time.time_ns() // 10**9 + 1) * 10**9
        last_log, say = time.monotonic(), logs.Progress(self.logger.info)
        while not stopping.is_set():
            stopping.wait(max(0.0, (next_at - time.time_ns()) / 1e9))
            if stopping.is_set():
                break
            if self.window_known_at is None or time.monotonic() - self.window_known_at > 300:
                self.follow_scrape_interval()
            m.cycle(next_at, timeout_s=self.interval_s * 0.9)
            next_at += step_ns
            if next_at < time.time_ns():  # fell behind (a slow query): skip to the next slot, the hole is recorded
                next_at = (time.time_ns() // step_ns + 1) * step_ns
            if time.monotonic() - last_log >= 30:  # every 30 s while cycles fail or nodes come and go, 10 min at idle
                nodes = sorted(set(m.nodes.values()))
                say((m.num_missing_cycles, *nodes), f"node_metrics {self.agent}: {m.num_cycles:,} cycles "
                                                    f"({m.num_missing_cycles:,} failed), nodes {nodes}")
                last_log = time.monotonic()


def main(argv=None) -> int:
    try:
        a, interval_s, fixed_window, roots = _settings(argv)
    except SystemExit as e:
        return 2 if e.code else 0
    except ValueError as e:
        print(f"node_metrics: error: {e}", file=sys.stderr)
        return 2
    from confluent_kafka import KafkaException

    from agents.oom import KernelLog
    from core.slices import TelemetryTopic
    from core.telemetry import TelemetryWriter

    if not await_brokers("node_metrics", {"telemetry": a.telemetry_bootstrap}, a.wait):  # Prometheus is not waited
        return 2  # for: while it is away each sample is a visible hole
    try:
        topic = TelemetryTopic.for_broker(a.telemetry_topic, a.telemetry_bootstrap)
        producer = telemetry_producer(a.telemetry_bootstrap, **topic.producer_settings())
    except (KafkaException, ValueError) as e:
        print(f"node_metrics: error: telemetry producer for {a.telemetry_bootstrap}: {e}", file=sys.stderr)
        return 2
    writer = TelemetryWriter(producer, topic, agent=a.agent)
    logger = logs.setup(a.agent)
    ref = None
    if a.clock_listen != "none":
        try:
            ref = clock.ClockReference(*clock.split_address(a.clock_listen)).start()
        except (OSError, ValueError) as e:
            logger.warning("node_metrics: clock reference not served on %s: %s", a.clock_listen, e)
    kernel = KernelLog.open()  # names what the kernel killed, where its log is readable (root on the node)
    watchers = _oom_watchers(a, roots, writer.write, kernel)
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    prom = prometheus_client(a.prometheus)
    query = prometheus_query(a.prometheus, prom)
    observe = promql_observer(query, a.observer_promql) if a.observer_promql else local_observer(a.node)
    metrics = NodeMetrics(query, writer.write, a.agent, observe, kernel=kernel,
                          local_nodes=(a.node, socket.gethostname()), window_s=fixed_window or MIN_WINDOW_S)
    logger.info(f"node_metrics {a.agent}: {a.prometheus} every {interval_s:g}s -> {a.telemetry_bootstrap}/{a.telemetry_topic}"
                + (f"; clock reference udp://{ref.address}" if ref else "")
                + (f"; cgroups {', '.join(roots)}" if roots else "") + ("; kubernetes pods" if a.kubernetes else "")
                + ("" if kernel else "; OOM victims unnamed (/dev/kmsg not readable)"))
    server = metrics_module.serve(_Exposed(metrics, writer, a.agent), a.metrics_listen, log=logs.printer(logger))
    try:
        _Sampling(metrics, prom, interval_s, fixed_window, logger, a.agent).run(stopping)
    except KeyboardInterrupt:
        pass
    for w in watchers:
        w.stop()
    if ref:
        ref.close()
    metrics_module.stop(server)
    writer.close()
    return 0


class _Exposed:
    """This agent's own counters as Prometheus metrics, read at scrape time."""

    def __init__(self, node_metrics: NodeMetrics, writer, agent: str) -> None:
        self.node_metrics, self.writer, self.agent = node_metrics, writer, agent

    def collect(self):
        m = self.node_metrics
        yield metrics_module.family("counter", "flightwatch_node_metrics_cycles",
                                    "sampling cycles (a query of Prometheus each), by outcome", ["agent", "outcome"],
                                    [((self.agent, "ok"), m.num_cycles - m.num_missing_cycles),
                                     ((self.agent, "failed"), m.num_missing_cycles)])
        yield from metrics_module.telemetry_families(self.agent, self.writer.counters())


if __name__ == "__main__":
    sys.exit(main())
