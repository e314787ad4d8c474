"""Prometheus exposition for flightwatch's long-running processes, by prometheus-client.

A process keeps its own plain counters (an attribute increment per event) and hands ``serve`` a collector that
turns them into metric families when scraped: nothing is done per event for Prometheus. Where several processes
stand for one target (the HTTP receiver's ``--workers``, each with its shipper), each one copies its counters once
a second into prometheus-client's multi-process files, and a scrape of any of them shows them all, each process's
series under its own ``agent`` label (``Shared``, over prometheus-client's ``MultiProcessCollector``).
"""
from __future__ import annotations

import os

NONE = "none"
"""A ``--metrics-listen`` of this serves nothing."""


def listen_arg(text: str) -> str | None:
    """argparse type of ``--metrics-listen``: HOST:PORT, or ``none``."""
    from core.units import split_host_port

    if text.strip().lower() == NONE:
        return None
    split_host_port(text, "--metrics-listen")  # ValueError: argparse's one-line error
    return text


def family(kind: str, name: str, text: str, label_names: list[str], samples) -> object:
    """One metric family: ``kind`` "counter" or "gauge"; ``samples`` [(label values, number), ...]."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    f = (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(name, text, labels=label_names)
    for values, number in samples:
        f.add_metric(list(values), float(number))
    return f


def quantiles(name: str, text: str, label_names: list[str], samples) -> object:
    """A ``summary`` of quantiles alone: ``samples`` [(label values, quantile label, seconds), ...]. Figures of a
    window or a second, not cumulative, so no ``_count``/``_sum``; a ``quantile`` label on a gauge is what promtool
    refuses."""
    from prometheus_client.core import Metric

    m = Metric(name, text, "summary")
    for values, q, number in samples:
        m.add_sample(name, {**dict(zip(label_names, values)), "quantile": q}, float(number))
    return m


def serve(collector, listen: str | None, log=print):
    """Serve ``/metrics`` from ``collector`` (an object with ``collect()``) on ``listen`` in a thread. The server,
    or None if ``listen`` is None or cannot be bound (logged: metrics are never worth a failed run)."""
    if listen is None:
        return None
    from prometheus_client import CollectorRegistry, start_http_server

    from core.units import split_host_port

    host, port = split_host_port(listen, "--metrics-listen")
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    try:
        server, _ = start_http_server(port, addr=host, registry=registry)
    except OSError as e:
        log(f"metrics: not served on {listen}: {e.strerror or e}")
        return None
    log(f"metrics: http://{listen}/metrics")
    return server


def stop(server) -> None:
    if server is not None:
        server.shutdown()
        server.server_close()


MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def use_shared_dir(directory: str, clear: bool = False) -> None:
    """Make this process (and its children) keep shared metrics in ``directory``: call before prometheus-client is
    first imported. ``clear``: the target's first process removes an earlier start's files."""
    import sys

    if "prometheus_client.values" in sys.modules and os.environ.get(MULTIPROC_ENV) != directory:
        raise RuntimeError("prometheus-client was imported before its multi-process directory was set")
    os.makedirs(directory, exist_ok=True)
    if clear:
        for name in os.listdir(directory):
            if name.endswith(".db"):
                os.unlink(os.path.join(directory, name))
    os.environ[MULTIPROC_ENV] = directory


class Shared:
    """One of several processes that make one scrape target (the HTTP receiver's workers and their shippers).
    ``sync(families)``, about once a second, copies this process's metric families into prometheus-client's
    multi-process files; ``collect(families)`` gives them merged with every other process's files, so any process
    answers a scrape with the whole target. Each process's series carry its own ``agent`` label."""

    def __init__(self) -> None:
        self.directory = os.environ[MULTIPROC_ENV]
        self.pid = os.getpid()
        self.metrics: dict[str, object] = {}
        self.last: dict[tuple, float] = {}

    def _metric(self, fam, labelnames: list[str]):
        from prometheus_client import Counter, Gauge

        m = self.metrics.get(fam.name)
        if m is None:
            m = (Counter(fam.name, fam.documentation, labelnames, registry=None) if fam.type == "counter" else
                 Gauge(fam.name, fam.documentation, labelnames, registry=None, multiprocess_mode="livemax"))
            self.metrics[fam.name] = m
        return m

    def sync(self, families) -> None:
        for fam in families:
            for sample in fam.samples:
                if fam.type == "counter" and not sample.name.endswith("_total"):
                    continue  # a counter's _created
                names = list(sample.labels)
                child = self._metric(fam, names).labels(**sample.labels) if names else self._metric(fam, names)
                if fam.type == "counter":
                    key = (fam.name, tuple(sample.labels.items()))
                    delta = sample.value - self.last.get(key, 0.0)
                    if delta > 0:
                        child.inc(delta)
                        self.last[key] = sample.value
                else:
                    child.set(sample.value)

    def collect(self, own):
        """``own`` families (this process's, read now) with every other process's from the shared files."""
        import glob

        from prometheus_client.multiprocess import MultiProcessCollector

        own = list(own)
        files = [f for f in glob.glob(os.path.join(self.directory, "*.db"))
                 if not f.endswith(f"_{self.pid}.db")]
        others = {m.name: m for m in MultiProcessCollector.merge(files, accumulate=True)}
        for fam in own:
            other = others.pop(fam.name, None)
            if other is not None:
                fam.samples.extend(s for s in other.samples if fam.type != "counter" or s.name.endswith("_total"))
            yield fam
        yield from others.values()

    def close(self) -> None:
        """At a clean exit: this process's gauges go (its counters stay counted)."""
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(self.pid, self.directory)


def telemetry_families(agent: str, counters: dict):
    """A telemetry writer's counters (``core.telemetry.TelemetryWriter.counters``): records by state, and buffered."""
    states = [s for s in ("written", "sent", "retried", "failed", "lost", "held") if s in counters]
    yield family("counter", "flightwatch_telemetry_records",
                 "telemetry records of this agent: written (handed to the writer), sent (acknowledged by the "
                 "broker), retried, failed, lost, held (acknowledged a second or more after they were sent)",
                 ["agent", "state"], [((agent, s), counters[s]) for s in states])
    yield family("gauge", "flightwatch_telemetry_buffered", "telemetry records waiting to be sent", ["agent"],
                 [((agent,), counters.get("buffered", 0))])
