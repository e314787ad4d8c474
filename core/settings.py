"""Every FLIGHTWATCH_* environment setting, in one table: what it sets, its flag where it has one, its default.

    python -m core.settings            # the README's table of settings, as Markdown

``tests/core/test_settings.py`` fails when a name is read anywhere in the code (or the Makefile, or the
manifests) and is not here, when one here is read nowhere, and when the README's table is not this one.
"""
from __future__ import annotations

import sys
from typing import NamedTuple


class Setting(NamedTuple):
    flag: str       # the command-line flag it is the default of ("" if none)
    default: str
    what: str


SETTINGS: dict[str, Setting] = {
    # where things are
    "FLIGHTWATCH_BOOTSTRAP": Setting("--bootstrap, --telemetry-bootstrap", "127.0.0.1:<TELEMETRY_PORT>",
                                     "the telemetry Kafka cluster, for every component"),
    "FLIGHTWATCH_TOPIC": Setting("--topic, --telemetry-topic", "flightwatch.telemetry", "the telemetry topic"),
    "FLIGHTWATCH_TELEMETRY_SLICE": Setting("", "auto", "the telemetry topic's time slices (auto, off, or seconds)"),
    "FLIGHTWATCH_SLICE_GRACE": Setting("--slice-grace (job)", "90s", "how long the job keeps a passed slice before it "
                                       "deletes it"),
    "FLIGHTWATCH_KAFKA_OPTIONS": Setting("--kafka-option (job)", "", "librdkafka properties of every telemetry client "
                                         "(TLS, SASL; @FILE for secrets)"),
    "FLIGHTWATCH_SUT_BOOTSTRAP": Setting("--bootstrap (Kafka receiver)", "127.0.0.1:<SUT_PORT>",
                                         "the system under test's Kafka cluster"),
    "FLIGHTWATCH_SUT_KAFKA_OPTIONS": Setting("--kafka-option (load generator)", "",
                                             "librdkafka properties of the clients of the system under test"),
    "FLIGHTWATCH_TARGET": Setting("--target", "kafka://127.0.0.1:<SUT_PORT>/flightwatch.sut", "where the load goes"),
    "FLIGHTWATCH_PROMETHEUS": Setting("--prometheus", "http://127.0.0.1:19090", "the Prometheus node metrics come from"),
    "FLIGHTWATCH_CHECKPOINTS": Setting("--checkpoints", "./checkpoints", "where run folders live"),
    "FLIGHTWATCH_STACK_DIR": Setting("", "./.stack", "the embedded stack's PID files, logs and state"),
    "FLIGHTWATCH_CLOCK_REFERENCE": Setting("--clock-reference, --clock-listen", "127.0.0.1:<CLOCK_PORT>",
                                           "the clock reference the agents measure their offset against ('none': off)"),
    # the embedded stack's ports (every default follows them)
    "FLIGHTWATCH_TELEMETRY_PORT": Setting("", "19092", "the embedded telemetry broker"),
    "FLIGHTWATCH_SUT_PORT": Setting("", "29092", "the embedded SUT broker"),
    "FLIGHTWATCH_PROMETHEUS_PORT": Setting("", "19090", "the embedded Prometheus"),
    "FLIGHTWATCH_NODE_EXPORTER_PORT": Setting("", "19100", "the embedded node exporter"),
    "FLIGHTWATCH_RECEIVER_PORT": Setting("", "18080", "the embedded HTTP receiver"),
    "FLIGHTWATCH_UI_PORT": Setting("UI_PORT (make)", "18501", "the dashboard"),
    "FLIGHTWATCH_CLOCK_PORT": Setting("", "19123", "the clock reference (UDP)"),
    # /metrics of each process
    "FLIGHTWATCH_JOB_METRICS": Setting("--metrics-listen (job)", "127.0.0.1:19401", "the streaming job's /metrics"),
    "FLIGHTWATCH_KAFKA_RECEIVER_METRICS": Setting("--metrics-listen (Kafka receiver)", "127.0.0.1:19402",
                                                  "the Kafka receiver's /metrics"),
    "FLIGHTWATCH_NODE_METRICS_METRICS": Setting("--metrics-listen (node metrics)", "127.0.0.1:19403",
                                                "the node-metrics agent's /metrics"),
    "FLIGHTWATCH_LOADGEN_METRICS": Setting("--metrics-listen (load generator)", "127.0.0.1:19404",
                                           "the load generator's /metrics while it attacks"),
    # a run
    "FLIGHTWATCH_RUN": Setting("--run", "", "the run ID (the job and every shard of the load generator)"),
    "FLIGHTWATCH_SHARDS": Setting("--shard", "", "load-generator shards of a run (with JOB_COMPLETION_INDEX)"),
    "FLIGHTWATCH_AGENT": Setting("--agent", "the command's name", "an agent's name in its records (a pod's name)"),
    "FLIGHTWATCH_WAIT": Setting("--wait", "10m", "how long a starting process waits for its brokers and target"),
    "FLIGHTWATCH_AWAIT_TOPIC": Setting("", "", "1: the job waits for the telemetry topic instead of creating it"),
    "FLIGHTWATCH_RECEIVER_LISTEN": Setting("--listen (HTTP receiver)", "127.0.0.1:18080", "the HTTP receiver's address"),
    "FLIGHTWATCH_RATE_WINDOW": Setting("--rate-window", "auto", "the node metrics' irate window"),
    "FLIGHTWATCH_OOM_CGROUPS": Setting("--cgroup", "", "memory cgroups watched for OOM kills (comma-separated)"),
    "FLIGHTWATCH_OBSERVER_PROMQL": Setting("--observer-promql", "", "PromQL of flightwatch's own cores per node"),
    # the job's Spark
    "FLIGHTWATCH_DRIVER_MEMORY": Setting("", "2g", "the job's driver heap, for a Spark it starts itself"),
    "FLIGHTWATCH_EXECUTOR_MEMORY": Setting("", "1g", "the executors' heap, for a Spark it starts itself"),
    "FLIGHTWATCH_DRIVER_JAVA_OPTIONS": Setting("", "(heap pre-touched, C1 only)", "the driver JVM's options"),
    "FLIGHTWATCH_JOB_NICE": Setting("--nice", "5", "the job's CPU niceness (0-19)"),
    "FLIGHTWATCH_JOIN_ON": Setting("--join-on", "auto", "where the join runs (auto: the driver here, executors on a "
                                   "cluster)"),
    "FLIGHTWATCH_JOIN_PARTITIONS": Setting("--join-partitions", "(the shuffle partitions)", "the join's partitions"),
    # Kubernetes and images
    "FLIGHTWATCH_STORAGE_CLASS": Setting("--storage-class (STORAGE_CLASS)", "", "the run folders' ReadWriteMany class"),
    "FLIGHTWATCH_NODE_EXPORTER": Setting("--node-exporter (NODE_EXPORTER)", "", "1: deploy flightwatch's node exporter"),
    "FLIGHTWATCH_CRD_DIR": Setting("--crd-dir", "", "the operators' CRD files, to check the custom resources against"),
    "FLIGHTWATCH_KUBECTL": Setting("", "the venv's kubectl", "which kubectl deploys"),
    "FLIGHTWATCH_REGISTRY": Setting("--registry (REGISTRY)", "ghcr.io/flightwatch", "where `make image` names the images"),
    "FLIGHTWATCH_BUILDER": Setting("--builder", "docker, podman or buildah", "which container builder `make image` uses"),
    # diagnostics
    "FLIGHTWATCH_LOG_LEVEL": Setting("", "INFO", "the components' log level"),
    "FLIGHTWATCH_TRIM_EVERY_S": Setting("", "10", "how often (s) a long-lived process hands freed memory back"),
    "FLIGHTWATCH_MEMORY_TRACE": Setting("", "", "a folder: tracemalloc reports of the job's growth, for diagnosis"),
    "FLIGHTWATCH_NO_INSTALL": Setting("", "", "1: `make up` installs no Debian package"),
}


def markdown() -> str:
    """The README's table."""
    rows = ["| setting | flag | default | what |", "|---|---|---|---|"]
    rows += [f"| `{name}` | {s.flag and f'`{s.flag}`'} | {s.default and f'`{s.default}`'} | {s.what} |"
             for name, s in SETTINGS.items()]
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    sys.stdout.write(markdown())
