"""What a cluster needs of the manifests that one machine never asks, checked on the rendered overlays (issue 36):
executors that mount the run folders' claim, pods with a read-only root that have a volume for every path they
write, the cluster's node exporter by default and ours off its port, the figures reaching the cluster's Prometheus
(PodMonitors, a NetworkPolicy for the monitoring namespace), flightwatch's own CPU from cAdvisor, a Kafka receiver,
grace periods longer than a receiver's drain, and driver memory where a cluster takes it.

No cluster runs here (no Kubernetes API server on these machines): each test reads the manifests as the kubelet,
the Spark operator, the Prometheus Operator and Prometheus' relabelling would.
"""
from __future__ import annotations

import re

import yaml
from support.manifests import WITH_NODE_EXPORTER, allowed, by_kind, pods

from agents.spool import DRAIN_WAIT_S

FLIGHTWATCH_IMAGE = re.compile(r"(^|/)flightwatch(-spark)?(:|$)")


def _spark(docs) -> dict:
    return by_kind(docs, "SparkApplication")["flightwatch-streaming"]["spec"]


def _checkpoints(docs) -> str:
    return by_kind(docs, "ConfigMap")["flightwatch-run"]["data"]["FLIGHTWATCH_CHECKPOINTS"]


def _workloads(docs):
    """(kind/name, pod template) of every workload with a pod template."""
    for d in docs:
        if d["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
            yield f"{d['kind']}/{d['metadata']['name']}", d["spec"]["template"]


def test_executors_mount_the_run_folders_claim_where_the_driver_does(rendered):
    """The join on executors (the cluster default) writes its parts and snapshots into the run folder and reads the
    driver's batch files there: every Spark pod mounts the claim at FLIGHTWATCH_CHECKPOINTS, writable."""
    for overlay, docs in rendered.items():
        spark = _spark(docs)
        claim = {v["name"] for v in spark["volumes"] if v.get("persistentVolumeClaim", {}).get("claimName") == "flightwatch-checkpoints"}
        for role in ("driver", "executor"):
            mounts = {m["mountPath"]: m for m in spark[role]["volumeMounts"] if m["name"] in claim}
            assert _checkpoints(docs) in mounts and not mounts[_checkpoints(docs)].get("readOnly"), (overlay, role)
            assert {"configMapRef": {"name": "flightwatch-run"}} in spark[role]["envFrom"], (overlay, role)


def test_every_path_a_read_only_pod_writes_is_on_a_writable_volume(rendered):
    """A container with a read-only root writes only to volumes: HOME and /tmp, its --state-dir and --spool-dir, and
    the run folders (FLIGHTWATCH_CHECKPOINTS) when it writes reports there. No flightwatch container is told to
    write under its install folder (the code's own defaults there are covered by the read-only checkout test in
    tests/loadgen/test_attack.py)."""
    for overlay, docs in rendered.items():
        for name, template in _workloads(docs):
            spec = template["spec"]
            for c in spec["containers"]:
                if not c.get("securityContext", {}).get("readOnlyRootFilesystem"):
                    continue
                writable = [m["mountPath"] for m in c.get("volumeMounts", []) if not m.get("readOnly")]
                env = {e["name"]: e.get("value") for e in c.get("env", [])}
                args = c.get("args", [])
                wanted = [p for flag, p in zip(args, args[1:]) if flag in ("--state-dir", "--spool-dir", "--out")]
                if FLIGHTWATCH_IMAGE.search(c["image"]):
                    wanted += ["/tmp", env.get("HOME", "/")]
                    assert "FLIGHTWATCH_STACK_DIR" not in env, (overlay, name)
                if "loadgen" in args:  # its reports go to <FLIGHTWATCH_CHECKPOINTS>/<run>/loadgen<shard>
                    wanted.append(_checkpoints(docs))
                for path in wanted:
                    assert any(path == m or path.startswith(m.rstrip("/") + "/") for m in writable), \
                        (overlay, name, c["name"], path, writable)
                    assert not path.startswith("/opt/flightwatch"), (overlay, name, path)


def test_the_clusters_node_exporter_by_default_and_ours_off_its_port(rendered):
    """Prometheus keeps node exporter pods of any namespace by their name label (kube-prometheus-stack's
    prometheus-node-exporter, OpenShift's node-exporter, ours) on the port they name, so it needs no port of its
    own; ours comes only when asked for, on 9110, and its port is one that job keeps."""
    for overlay, docs in rendered.items():
        config = yaml.safe_load(by_kind(docs, "ConfigMap")["flightwatch-prometheus"]["data"]["prometheus.yml"])
        job = next(j for j in config["scrape_configs"] if j["job_name"] == "node")
        assert job["kubernetes_sd_configs"] == [{"role": "pod"}], overlay  # every namespace: the cluster's exporter
        keep = {tuple(r["source_labels"]): re.compile(f"^(?:{r['regex']})$") for r in job["relabel_configs"]
                if r.get("action") == "keep"}
        name_ok = keep[("__meta_kubernetes_pod_label_app_kubernetes_io_name",)]
        port_ok = keep[("__meta_kubernetes_pod_container_port_name",)]
        assert name_ok.match("prometheus-node-exporter") and port_ok.match("http-metrics")  # kube-prometheus-stack's
        assert not name_ok.match("flightwatch-receiver")
        address = next(r for r in job["relabel_configs"] if r.get("target_label") == "__address__")
        assert address["source_labels"] == ["__meta_kubernetes_pod_ip", "__meta_kubernetes_pod_container_port_number"]
        assert "9100" not in yaml.safe_dump(job)
        ours = by_kind(docs, "DaemonSet").get("flightwatch-node-exporter")
        assert (ours is not None) == (overlay == WITH_NODE_EXPORTER), overlay
        if ours is not None:
            labels, c = ours["spec"]["template"]["metadata"]["labels"], ours["spec"]["template"]["spec"]["containers"][0]
            assert name_ok.match(labels["app.kubernetes.io/name"])
            assert [(p["name"], p["containerPort"]) for p in c["ports"]] == [("metrics", 9110)] and port_ok.match("metrics")
        # Prometheus may discover them: pods and nodes in every namespace, read-only
        role = by_kind(docs, "ClusterRole")["flightwatch-prometheus"]
        assert role["rules"] == [{"apiGroups": [""], "resources": ["pods", "nodes"], "verbs": ["get", "list", "watch"]},
                                 {"apiGroups": [""], "resources": ["nodes/metrics"], "verbs": ["get"]}]


def _metrics_ports(docs):
    """(pod name, pod labels, port name, port number) of every flightwatch /metrics port."""
    for name, ns, labels, _spec in pods(docs):
        if ns != "flightwatch":
            continue
        if name.startswith("flightwatch-streaming-"):
            ports = _spark(docs)[name.rsplit("-", 1)[1]].get("ports", [])
        else:
            ports = next(t for n, t in _workloads(docs) if n.endswith("/" + name))["spec"]["containers"][0].get("ports", [])
        for p in ports:
            if p["name"] == "metrics" or name == "flightwatch-receiver" and p["name"] == "http":
                yield name, labels, p["name"], p["containerPort"]


def test_every_metrics_port_has_a_pod_monitor_and_the_monitoring_namespace_may_scrape_it(rendered):
    """What reaches the cluster's Prometheus and Grafana: a PodMonitor (Prometheus Operator) selects every
    /metrics port flightwatch serves, and the NetworkPolicies let the monitoring namespace in on exactly those."""
    for overlay, docs in rendered.items():
        monitors = by_kind(docs, "PodMonitor").values()
        policies = list(by_kind(docs, "NetworkPolicy").values())
        served = list(_metrics_ports(docs))
        assert {n for n, *_ in served} == {"flightwatch-streaming-driver", "flightwatch-receiver", "flightwatch-kafka-receiver",
                                           "flightwatch-node-metrics", "flightwatch-loadgen"}, overlay
        monitoring = {"kubernetes.io/metadata.name": "monitoring"}
        for name, labels, port_name, number in served:
            assert any(all(labels.get(k) == v for k, v in m["spec"]["selector"]["matchLabels"].items())
                       and any(e["port"] == port_name and e["path"] == "/metrics" for e in m["spec"]["podMetricsEndpoints"])
                       for m in monitors), (overlay, name, port_name)
            assert allowed(policies, labels, number, "TCP", {"app.kubernetes.io/name": "prometheus"}, monitoring, False), \
                (overlay, name, number)
            assert not allowed(policies, labels, number, "TCP", {}, {"kubernetes.io/metadata.name": "shop"}, False)
        ui = next(lab for n, _, lab, _ in pods(docs) if n == "flightwatch-ui")
        assert not allowed(policies, ui, 8501, "TCP", {}, monitoring, False)  # the dashboard is not a metrics port


def test_observer_cpu_comes_from_cadvisor_and_every_pod_says_it_is_flightwatchs(rendered):
    """flightwatch's own CPU per node: Prometheus scrapes the kubelets' cAdvisor (flightwatch's namespaces only) and
    the node-metrics agent sums it by node. Every pod template carries app.kubernetes.io/part-of: flightwatch."""
    for overlay, docs in rendered.items():
        for name, template in _workloads(docs):
            assert template["metadata"]["labels"].get("app.kubernetes.io/part-of") == "flightwatch", (overlay, name)
        for role in ("driver", "executor"):
            assert _spark(docs)[role]["labels"]["app.kubernetes.io/part-of"] == "flightwatch", (overlay, role)
        config = yaml.safe_load(by_kind(docs, "ConfigMap")["flightwatch-prometheus"]["data"]["prometheus.yml"])
        cadvisor = next(j for j in config["scrape_configs"] if j["job_name"] == "cadvisor")
        assert cadvisor["metrics_path"] == "/metrics/cadvisor" and cadvisor["scheme"] == "https"
        assert cadvisor["kubernetes_sd_configs"] == [{"role": "node"}]
        keep = cadvisor["metric_relabel_configs"][0]
        kept = re.compile(f"^(?:{keep['regex']})$")
        assert kept.match("container_cpu_usage_seconds_total;flightwatch") and not kept.match("container_cpu_usage_seconds_total;shop")
        agent = by_kind(docs, "Deployment")["flightwatch-node-metrics"]["spec"]["template"]["spec"]["containers"][0]
        promql = {e["name"]: e.get("value") for e in agent["env"]}["FLIGHTWATCH_OBSERVER_PROMQL"]
        assert promql.startswith("sum by (node) (rate(container_cpu_usage_seconds_total{job=\"cadvisor\"")
        assert "kube_pod_labels" not in promql  # kube-state-metrics shows pod labels only where its allowlist says


def test_a_kafka_receiver_keeps_its_name_and_state_across_restarts(rendered):
    """A Kafka system under test is measured by the Kafka receiver: a StatefulSet of one, whose agent (and consumer
    group) is the pod's stable name, with its write-ahead log and spool on a claim of its own."""
    for docs in rendered.values():
        sts = by_kind(docs, "StatefulSet")["flightwatch-kafka-receiver"]["spec"]
        assert sts["replicas"] == 1 and sts["serviceName"] in by_kind(docs, "Service")
        c = sts["template"]["spec"]["containers"][0]
        args = c["args"]
        assert args[:4] == ["python", "-m", "agents.receiver", "kafka"]
        assert args[args.index("--bootstrap") + 1] == "$(SUT_BOOTSTRAP)" and args[args.index("--topic") + 1] == "$(SUT_TOPIC)"
        assert {"SUT_BOOTSTRAP", "SUT_TOPIC"} <= set(by_kind(docs, "ConfigMap")["flightwatch-run"]["data"])
        env = {e["name"]: e for e in c["env"]}
        assert env["FLIGHTWATCH_AGENT"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
        state = args[args.index("--state-dir") + 1]
        assert {"name": "state", "mountPath": state} in c["volumeMounts"]
        assert [t["metadata"]["name"] for t in sts["volumeClaimTemplates"]] == ["state"]


def test_receivers_get_a_grace_period_longer_than_their_drain(rendered):
    """A receiver that is stopped waits up to DRAIN_WAIT_S for its shipper to drain the spool; the kubelet must not
    kill the pod before (its spool is on an emptyDir that goes with the pod)."""
    for overlay, docs in rendered.items():
        for name, template in _workloads(docs):
            if any("agents.receiver" in c.get("args", []) for c in template["spec"]["containers"]):
                assert template["spec"].get("terminationGracePeriodSeconds", 30) > DRAIN_WAIT_S, (overlay, name)


def test_driver_memory_is_set_where_a_cluster_takes_it(rendered):
    """On a cluster the driver's JVM is started by the operator: its heap is the SparkApplication's driver.memory
    (FLIGHTWATCH_DRIVER_MEMORY is for a Spark the job starts itself, and would be ignored), with an overhead for the
    job's Python process in the pod's limit; patches of the overlays leave the driver's environment alone."""
    for overlay, docs in rendered.items():
        spark = _spark(docs)
        assert "FLIGHTWATCH_DRIVER_MEMORY" not in yaml.safe_dump(spark), overlay
        assert spark["driver"]["memoryOverhead"] == "1g"
        env = {e["name"]: e.get("value") for e in spark["driver"]["env"]}
        assert env["FLIGHTWATCH_AWAIT_TOPIC"] == "1", overlay
    assert _spark(rendered["small"])["driver"]["memory"] == "2g" and _spark(rendered["large"])["driver"]["memory"] == "6g"


EXECUTOR_PYTHON_PEAK_MIB = 440
"""Measured: a one-core executor's Python workers at their peak, at 5,000 events/s with 8 join partitions on a Spark
standalone cluster of two one-core workers (2026-11-27; their JVMs 500-730 MiB resident of a 1 GiB heap)."""
JVM_NON_HEAP_MIB = 256
"""The executor JVM's own beyond its heap (metaspace, threads, Netty's direct buffers), in the pod's limit too."""


def test_executor_memory_overhead_holds_the_measured_python_workers(rendered):
    """On Kubernetes an executor pod's limit is its heap plus ``memoryOverhead``; its Python workers (one per core)
    live in the overhead. Spark's default (384 MiB) is less than one worker's measured peak."""
    def mib(text: str) -> int:
        return int(text[:-1]) * 1024 if text.endswith("g") else int(text[:-1])
    for overlay, docs in rendered.items():
        ex = _spark(docs)["executor"]
        assert mib(ex["memoryOverhead"]) >= EXECUTOR_PYTHON_PEAK_MIB * ex["cores"] + JVM_NON_HEAP_MIB, (overlay, ex)
