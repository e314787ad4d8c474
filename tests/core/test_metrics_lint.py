"""Every /metrics flightwatch serves, through Prometheus' own linter (``promtool check metrics``, from Debian's
prometheus package): the job's, the receivers' (with their shippers'), the node-metrics agent's and the load
generator's, each rendered as its server renders it (prometheus-client's registry) from real collectors with figures
in them. Names end in their base unit (seconds, bytes) or ``_total``; counters only count."""
from __future__ import annotations

import shutil
import subprocess
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry, generate_latest


def rendered(collector) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return generate_latest(registry).decode()


def attack_metrics(run: str):
    """A load generator's metrics after one second: a send and its answer."""
    from loadgen.metrics import AttackMetrics
    from loadgen.stats import Interval

    attack = AttackMetrics(run, "loadgen")
    iv = Interval(0)
    iv.add_send(1000, 2048)
    iv.add_completion(500_000, 202, None, True)
    attack.second(Interval.from_snapshot(iv.snapshot()), 1.0, 0, False)  # merged from the workers, as in a run
    return attack


class Families:
    """A receiver's families as a collector, as ``agents.runner`` serves them."""

    def __init__(self, collect) -> None:
        self.collect = collect


def collectors(tmp_dir: str = "/tmp", run: str = "r"):
    from agents.node_metrics import NodeMetrics, _Exposed
    from agents.spool import Shipper
    from streaming.metrics import JobMetrics
    from transports.amqp import amqp_families
    from transports.http.receiver import HttpReceiver
    from transports.kafka.receiver import KafkaReceiver
    from transports.stomp.receiver import StompReceiver

    job = JobMetrics()
    job.publish({"run": run, "events": {"sent": 10, "received": 9, "dropped": 1, "errors": 0}, "gap_windows": 0,
                 "in_flight": 0, "window_start_s": 1.0, "flight_time_us": {"0.5": 900.0, "0.99": 1500.0, "max": 2100.0},
                 "send_delay_us": {"0.5": 10.0, "max": 40.0}, "observer_cpu": 0.1, "state": "ok", "batches": 3,
                 "finished": False})
    spool = SimpleNamespace(counters=lambda: {"spooled": 5, "lost": 0, "over_budget": False})
    http = HttpReceiver(spool, "receiver-http")
    http.bad["missing id"], http.malformed["no_host"] = 1, 2
    kafka = Families(lambda: KafkaReceiver.collect(SimpleNamespace(
        agent="receiver-kafka", num_received=3, num_unattributed=0, num_errors=0, num_skipped=0, num_resets=0,
        spool=spool)))
    amqp = Families(lambda: amqp_families(SimpleNamespace(agent="receiver-amqp", counters=lambda: {
        "received": 3, "unattributed": 0, "redelivered": 1, "connection_losses": 1, "connected": 1,
        "telemetry": {"spooled": 3, "lost": 0}})))
    stomp = StompReceiver("127.0.0.1", 61613, None, "q", "anycast", spool, "receiver-stomp")
    stomp.num_received, stomp.num_unattributed = 5, 1
    writer = SimpleNamespace(counters=lambda: {"written": 4, "lost": 0, "sent": 4, "failed": 0, "retried": 0, "held": 1,
                                               "buffered": 0})
    node = _Exposed(NodeMetrics(None, None, "node-metrics"), writer, "node-metrics")
    attack = attack_metrics(run)
    shipper = Shipper.__new__(Shipper)  # its counters alone: no spool folder, no producer
    shipper.key, shipper.num_shipped, shipper.num_failures, shipper.dir = b"receiver-http", 5, 0, tmp_dir
    shipper.num_held = 2
    return {"job": job, "http receiver": http, "kafka receiver": kafka, "amqp receiver": amqp, "stomp receiver": stomp,
            "node metrics": node,
            "load generator": attack,
            "shipper": shipper}


@pytest.mark.skipif(not shutil.which("promtool"), reason="promtool comes with Debian's prometheus package (.ci/run)")
@pytest.mark.parametrize("name", list(collectors()))
def test_promtool_finds_nothing_to_say(name, tmp_path):
    text = rendered(collectors(str(tmp_path))[name])
    assert "flightwatch_" in text
    lint = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
    assert lint.returncode == 0 and not lint.stdout.strip() and not lint.stderr.strip(), lint.stdout + lint.stderr


def test_times_are_seconds_and_the_largest_is_a_gauge_of_its_own():
    text = rendered(collectors()["job"])
    assert "# TYPE flightwatch_run_flight_time_seconds summary" in text
    assert 'flightwatch_run_flight_time_seconds{quantile="0.99"} 0.0015' in text
    assert 'flightwatch_run_flight_time_max_seconds 0.0021' in text
    assert 'quantile="1"' not in text and "_us" not in text
    assert 'flightwatch_run_dropped 1.0' in text and 'kind="dropped"' not in text  # may fall: not a counter
    loadgen = rendered(collectors()["load generator"])
    assert "_us" not in loadgen
    assert "# TYPE flightwatch_loadgen_request_latency_seconds summary" in loadgen
    assert 'flightwatch_loadgen_request_latency_seconds{quantile="0.99",sender="loadgen"} 0.0005' in loadgen
    assert 'flightwatch_loadgen_send_delay_seconds{quantile="0.5",sender="loadgen"} 1e-06' in loadgen


def _label_sets(text: str) -> set[str]:
    return {line.rsplit(" ", 1)[0] for line in text.splitlines() if line and not line.startswith("#")}


def test_a_runs_id_is_a_label_of_its_info_metric_alone():
    """Two runs served on one address keep the same series but one (the info metric): a Prometheus that scrapes run
    after run reuses them instead of growing its head block by every run's series (~40 a run before)."""
    for name, info in (("job", "flightwatch_run_info"), ("load generator", "flightwatch_loadgen_info")):
        a = _label_sets(rendered(collectors(run="run-a")[name]))
        b = _label_sets(rendered(collectors(run="run-b")[name]))
        assert len(a) > 10 and a - b == {s for s in a if s.startswith(info + "{")} and len(a - b) == 1, a ^ b
        assert len(b - a) == 1 and next(iter(b - a)).startswith(info + "{") and 'run="run-b"' in next(iter(b - a))
        assert [s for s in a if 'run="' in s] == list(a - b)  # the run's ID: in the info metric, and nowhere else
