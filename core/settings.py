"""Every FLIGHTWATCH_* setting, in one table: what it sets, its flag, its default. The one reader of them.

    python -m core.settings            # the documentation's table of settings, as Markdown

Every setting is a flag, and its variable's name is the flag's: ``FLIGHTWATCH_`` + an optional scope (the component
or system it belongs to: ``JOB_``, ``SUT_``, ...) + the long flag upper-cased (``--slice-grace``:
``FLIGHTWATCH_SLICE_GRACE``; ``--metrics-listen`` of the job: ``FLIGHTWATCH_JOB_METRICS_LISTEN``; a repeatable
flag's variable is its plural, comma-separated). A component's parser adds each flag with ``add`` (its default: the
variable, else the built-in one), and ``export`` hands what the flags said to the process' own readers and its
children, so code below the parser reads a setting with ``get`` and nothing else reads the environment for one.

``tests/core/test_settings.py`` fails when a name is read anywhere in the code (or the Makefile, or the
manifests) and is not here, when one here is read nowhere, when a name is not its flag's, when a module other than
this one reads a FLIGHTWATCH_ variable from the environment, and when the documentation's table is not this one.
"""
from __future__ import annotations

import os
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
    "FLIGHTWATCH_TELEMETRY_SLICE": Setting("--telemetry-slice", "auto", "the telemetry topic's time slices (auto, off, or seconds)"),
    "FLIGHTWATCH_SLICE_GRACE": Setting("--slice-grace (job)", "90s", "how long the job keeps a passed slice before it "
                                       "deletes it"),
    "FLIGHTWATCH_KAFKA_OPTIONS": Setting("--kafka-option (job)", "", "librdkafka properties of every telemetry client "
                                         "(TLS, SASL; @FILE for secrets)"),
    "FLIGHTWATCH_SUT_BOOTSTRAP": Setting("--bootstrap (Kafka receiver)", "127.0.0.1:<SUT_PORT>",
                                         "the system under test's Kafka cluster"),
    "FLIGHTWATCH_SUT_KAFKA_OPTIONS": Setting("--kafka-option (load generator)", "",
                                             "librdkafka properties of the clients of the system under test"),
    "FLIGHTWATCH_TARGET": Setting("--target", "the SUT's default (core.suts)", "where the load goes"),
    "FLIGHTWATCH_TARGET_PASSWORD": Setting("--target-password (load generator)", "", "the password of a target URL "
                                           "that names its user alone: itself, or @FILE (core.secrets); never printed"),
    "FLIGHTWATCH_SUT": Setting("--sut (stack, load generator)", "tansu", "which broker the stack runs as the system under "
                               "test (tansu, rabbitmq, rabbitmq-amqp1, artemis, kafka), and so the load generator's default target"),
    "FLIGHTWATCH_PROMETHEUS": Setting("--prometheus", "http://127.0.0.1:19090", "the Prometheus node metrics come from"),
    "FLIGHTWATCH_CHECKPOINTS": Setting("--checkpoints", "./checkpoints", "where run folders live"),
    "FLIGHTWATCH_STACK_DIR": Setting("--stack-dir (stack)", "./.stack", "the embedded stack's PID files, logs and state"),
    "FLIGHTWATCH_CLOCK_REFERENCE": Setting("--clock-reference, --clock-listen", "127.0.0.1:<CLOCK_PORT>",
                                           "the clock reference the agents measure their offset against ('none': off)"),
    # the embedded stack's ports (every default follows them)
    "FLIGHTWATCH_TELEMETRY_PORT": Setting("--telemetry-port (stack)", "19092", "the embedded telemetry broker"),
    "FLIGHTWATCH_SUT_PORT": Setting("--sut-port (stack)", "29092", "the embedded SUT broker"),
    "FLIGHTWATCH_ARTEMIS_PORT": Setting("--artemis-port (stack)", "29616", "the stack's ActiveMQ Artemis (every "
                                        "protocol, AMQP 1.0 among them, on one port)"),
    "FLIGHTWATCH_KAFKA_PORT": Setting("--kafka-port (stack)", "29192", "the stack's Apache Kafka (its KRaft "
                                      "controller on the next port)"),
    "FLIGHTWATCH_SUT_PARTITIONS": Setting("--partitions (stack)", "2", "partitions of the SUT topic the stack's Kafka "
                                          "receiver makes, and of every topic its Apache Kafka makes (on a renewed SUT)"),
    "FLIGHTWATCH_SUT_PAIRS": Setting("--pairs (stack)", "1", "sender-receiver pairs the stack's AMQP 1.0 receiver "
                                     "consumes, each on its own address (the SUT queue's name .0 ... .N-1)"),
    "FLIGHTWATCH_SUT_BINDINGS": Setting("--bindings (stack)", "0", "queues, each bound with its own key, the stack's "
                                        "AMQP 0-9-1 receiver declares on a topic exchange and consumes (0: the SUT queue)"),
    "FLIGHTWATCH_RABBITMQ_PORT": Setting("--rabbitmq-port (stack)", "29672", "the stack's RabbitMQ (AMQP; Erlang "
                                         "distribution and epmd on the next two ports)"),
    "FLIGHTWATCH_PROMETHEUS_PORT": Setting("--prometheus-port (stack)", "19090", "the embedded Prometheus"),
    "FLIGHTWATCH_NODE_EXPORTER_PORT": Setting("--node-exporter-port (stack)", "19100", "the embedded node exporter"),
    "FLIGHTWATCH_RECEIVER_PORT": Setting("--receiver-port (stack)", "18080", "the embedded HTTP receiver"),
    "FLIGHTWATCH_UI_PORT": Setting("--ui-port (stack)", "18501", "the dashboard"),
    "FLIGHTWATCH_CLOCK_PORT": Setting("--clock-port (stack)", "19123", "the clock reference (UDP)"),
    # /metrics of each process
    "FLIGHTWATCH_JOB_METRICS_LISTEN": Setting("--metrics-listen (job)", "127.0.0.1:19401", "the streaming job's /metrics"),
    "FLIGHTWATCH_KAFKA_RECEIVER_METRICS_LISTEN": Setting("--metrics-listen (Kafka receiver)", "127.0.0.1:19402",
                                                  "the Kafka receiver's /metrics"),
    "FLIGHTWATCH_AMQP_RECEIVER_METRICS_LISTEN": Setting("--metrics-listen (AMQP receiver)", "127.0.0.1:19405",
                                                 "the AMQP receiver's /metrics"),
    "FLIGHTWATCH_NODE_METRICS_METRICS_LISTEN": Setting("--metrics-listen (node metrics)", "127.0.0.1:19403",
                                                "the node-metrics agent's /metrics"),
    "FLIGHTWATCH_LOADGEN_METRICS_LISTEN": Setting("--metrics-listen (load generator)", "127.0.0.1:19404",
                                           "the load generator's /metrics while it attacks"),
    # a run
    "FLIGHTWATCH_RUN": Setting("--run", "", "the run ID (the job and every shard of the load generator)"),
    "FLIGHTWATCH_SHARDS": Setting("--shards (load generator)", "1", "load-generator shards of a run (with JOB_COMPLETION_INDEX)"),
    "FLIGHTWATCH_AGENT": Setting("--agent", "the command's name", "an agent's name in its records (a pod's name)"),
    "FLIGHTWATCH_WAIT": Setting("--wait", "10m", "how long a starting process waits for its brokers and target"),
    "FLIGHTWATCH_AWAIT_TOPIC": Setting("--await-topic (job)", "", "1: the job waits for the telemetry topic instead of creating it"),
    "FLIGHTWATCH_RECEIVER_LISTEN": Setting("--listen (HTTP receiver)", "127.0.0.1:18080", "the HTTP receiver's address"),
    "FLIGHTWATCH_RECEIVER_WORKERS": Setting("--workers (HTTP receiver)", "1", "the HTTP receiver's processes on its port "
                                            "(SO_REUSEPORT), each a receiver of its own in the telemetry"),
    "FLIGHTWATCH_RATE_WINDOW": Setting("--rate-window", "auto", "the node metrics' irate window"),
    "FLIGHTWATCH_OOM_CGROUPS": Setting("--oom-cgroup (node metrics)", "", "memory cgroups watched for OOM kills (comma-separated)"),
    "FLIGHTWATCH_OBSERVER_PROMQL": Setting("--observer-promql", "", "PromQL of flightwatch's own cores per node"),
    # the job's Spark
    "FLIGHTWATCH_DRIVER_MEMORY": Setting("--driver-memory (job)", "2g", "the job's driver heap, for a Spark it starts itself"),
    "FLIGHTWATCH_EXECUTOR_MEMORY": Setting("--executor-memory (job)", "1g", "the executors' heap, for a Spark it starts itself"),
    "FLIGHTWATCH_DRIVER_JAVA_OPTIONS": Setting("--driver-java-options (job)", "(heap pre-touched, C1 only)", "the driver JVM's options"),
    "FLIGHTWATCH_JOB_NICE": Setting("--nice", "10", "the job's CPU niceness (0-19)"),
    "FLIGHTWATCH_JOIN_ON": Setting("--join-on", "auto", "where the join runs (auto: the driver here, executors on a "
                                   "cluster)"),
    "FLIGHTWATCH_JOIN_PARTITIONS": Setting("--join-partitions", "(the shuffle partitions)", "the join's partitions"),
    "FLIGHTWATCH_JOIN_CACHE": Setting("--join-cache", "256MiB", "what a Python worker keeps of join states, at most"),
    # Kubernetes and images
    "FLIGHTWATCH_STORAGE_CLASS": Setting("--storage-class (STORAGE_CLASS)", "", "the run folders' ReadWriteMany class"),
    "FLIGHTWATCH_NODE_EXPORTER": Setting("--node-exporter (NODE_EXPORTER)", "", "1: deploy flightwatch's node exporter"),
    "FLIGHTWATCH_PROMETHEUS_RELEASE": Setting("--prometheus-release (PROMETHEUS_RELEASE)", "",
                                              "kube-prometheus-stack's Helm release name: its PodMonitor label"),
    "FLIGHTWATCH_CRD_DIR": Setting("--crd-dir", "", "the operators' CRD files, to check the custom resources against"),
    "FLIGHTWATCH_KUBECTL": Setting("--kubectl (deploy)", "the venv's kubectl", "which kubectl deploys"),
    "FLIGHTWATCH_REGISTRY": Setting("--registry (REGISTRY)", "ghcr.io/flightwatch", "where `make image` names the images"),
    "FLIGHTWATCH_BUILDER": Setting("--builder", "docker, podman or buildah", "which container builder `make image` uses"),
    # diagnostics
    "FLIGHTWATCH_LOG_LEVEL": Setting("--log-level", "INFO", "the components' log level"),
    "FLIGHTWATCH_TRIM_EVERY_S": Setting("--trim-every-s", "10", "how often (s) a long-lived process hands freed memory back"),
    "FLIGHTWATCH_MEMORY_TRACE": Setting("--memory-trace (job, load generator)", "", "a folder: tracemalloc reports of the job's growth, for diagnosis"),
    "FLIGHTWATCH_NO_INSTALL": Setting("--no-install (stack)", "", "1: `make up` installs no Debian package"),
}


RENAMED = {
    "FLIGHTWATCH_JOB_METRICS": "FLIGHTWATCH_JOB_METRICS_LISTEN",
    "FLIGHTWATCH_KAFKA_RECEIVER_METRICS": "FLIGHTWATCH_KAFKA_RECEIVER_METRICS_LISTEN",
    "FLIGHTWATCH_NODE_METRICS_METRICS": "FLIGHTWATCH_NODE_METRICS_METRICS_LISTEN",
    "FLIGHTWATCH_LOADGEN_METRICS": "FLIGHTWATCH_LOADGEN_METRICS_LISTEN",
}
"""Earlier names, still read (with a line on stderr naming the new one) where the new one is not set."""
SCOPES = ("", "JOB_", "SUT_", "RECEIVER_", "KAFKA_RECEIVER_", "AMQP_RECEIVER_", "NODE_METRICS_", "LOADGEN_")
"""What may stand between ``FLIGHTWATCH_`` and a flag's name in its variable's (a component's, or the SUT's)."""
PROCESS_WIDE = ("FLIGHTWATCH_LOG_LEVEL", "FLIGHTWATCH_TELEMETRY_SLICE", "FLIGHTWATCH_TRIM_EVERY_S")
"""Settings of every long-lived component (receivers, node metrics, load generator, job): ``add_process_wide``."""
_warned: set[str] = set()
_defaults: dict[str, object] = {}
"""Each flag's built-in default, as argparse gives it (``add``): ``export`` hands on only what was asked for."""


def get(name: str, default: str | None = None) -> str | None:
    """Setting ``name``'s value: the environment's (or its earlier name's), else ``default``."""
    if name not in SETTINGS:
        raise KeyError(f"{name} is not a flightwatch setting (core.settings.SETTINGS)")
    if name in os.environ:
        return os.environ[name]
    old = next((o for o, n in RENAMED.items() if n == name and o in os.environ), None)
    if old is None:
        return default
    if old not in _warned:
        _warned.add(old)
        print(f"flightwatch: {old} is now {name} (the old name is still read)", file=sys.stderr)
    return os.environ[old]


def flags_of(name: str) -> list[str]:
    """The long flags setting ``name`` is the default of (the table's ``flag``, without the component in brackets)."""
    return [f.split(" (")[0].strip() for f in SETTINGS[name].flag.split(", ") if f.strip().startswith("--")]


def regular(name: str) -> bool:
    """Whether ``name`` is ``FLIGHTWATCH_`` + a scope + one of its flags upper-cased (plural for a repeatable one)."""
    stems = [f[2:].upper().replace("-", "_") for f in flags_of(name)]
    return any(name in (f"FLIGHTWATCH_{scope}{stem}", f"FLIGHTWATCH_{scope}{stem}S") for scope in SCOPES for stem in stems)


def add(parser, name: str, *flags: str, default=None, **kw):
    """Add the flag(s) whose default is setting ``name`` (the environment's value, else ``default``); its help ends
    with the variable's name and the default. ``store_true``: the variable is 1 or true; ``append``: a list,
    comma-separated in the variable."""
    value = get(name)
    action = kw.get("action")
    if action == "store_true":
        value = default if value is None else value.strip().lower() in ("1", "true", "yes")
    elif action == "append":
        value = list(default or []) if value is None else [v.strip() for v in value.split(",") if v.strip()]
    elif value is None:
        value = default
    _defaults[name] = kw["type"](default) if isinstance(default, str) and "type" in kw else default
    shown = "" if action in ("store_true", "append") or default in (None, "") else "; default %(default)s"
    kw["help"] = f"{kw.get('help', '').rstrip()} (env {name}{shown})".lstrip()
    return parser.add_argument(*flags, default=value, **kw)


def add_process_wide(parser) -> None:
    """The settings every long-lived component takes: log level, telemetry slices, memory trimming."""
    g = parser.add_argument_group("every component")
    add(g, "FLIGHTWATCH_LOG_LEVEL", "--log-level", default="INFO", type=str.upper,
        choices=("DEBUG", "INFO", "WARNING", "ERROR"), help="the log level")
    add(g, "FLIGHTWATCH_TELEMETRY_SLICE", "--telemetry-slice", default="auto", metavar="auto|off|DURATION",
        help="the telemetry topic's time slices (auto: 60 s slices on the embedded broker, one topic elsewhere)")
    add(g, "FLIGHTWATCH_TRIM_EVERY_S", "--trim-every-s", default="10", type=float, metavar="SECONDS",
        help="how often a long-lived process collects and hands freed memory back")


def export(args, names=PROCESS_WIDE) -> None:
    """Hand what the flags of settings ``names`` say to this process' readers (``get``) and its children: each
    given by its flag or its variable (a built-in default stays the readers' own)."""
    for name in names:
        dest = flags_of(name)[0][2:].replace("-", "_")
        value = getattr(args, dest, None)
        if name not in os.environ and value == _defaults.get(name):
            continue
        if value is not None and value is not False:
            os.environ[name] = "1" if value is True else ",".join(value) if isinstance(value, list) else str(value)


def markdown() -> str:
    """The documentation's table (docs/reference/settings.md, generated)."""
    rows = ["| setting | flag | default | what |", "|---|---|---|---|"]
    rows += [f"| `{name}` | {s.flag and f'`{s.flag}`'} | {s.default and f'`{s.default}`'} | {s.what} |"
             for name, s in SETTINGS.items()]
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    sys.stdout.write(markdown())
