"""The Kubernetes deployment, checked offline: every overlay renders (kustomize, through kubectl),
every built-in resource validates strictly against the Kubernetes schemas (kubernetes-validate),
every custom resource against deploy/schemas/custom-resources.yaml (hand-written from the
operators' API references: their CRDs are not available from any registry here; set
FLIGHTWATCH_CRD_DIR to a folder of the real CRD files to check against those too).

There is no Kubernetes cluster on these machines, so nothing here is applied; the dry run and
the "no cluster" error are what ``make deploy`` does without one.
"""
from __future__ import annotations

import copy
import os
import re
import subprocess
import sys

import pytest
from support import ROOT
from support.manifests import WITH_NODE_EXPORTER, by_kind

from stack import deploy

OVERLAYS = deploy.overlays()
WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet", "Job")
NODE_EXPORTER_NAMESPACE = "flightwatch-node-exporter"


def _name(d) -> str:
    return f"{d['kind']}/{d['metadata']['name']}"


def pod_specs(docs):
    for d in docs:
        if d["kind"] in WORKLOADS:
            yield d, d["spec"]["template"]["spec"]


def test_every_overlay_renders_and_validates(rendered):
    assert OVERLAYS == ["kind", "large", "small"]
    for overlay, docs in rendered.items():
        assert deploy.validate(docs, os.environ.get("FLIGHTWATCH_CRD_DIR")) == [], overlay
        kinds = sorted(d["kind"] for d in docs)
        assert {"Namespace", "ConfigMap", "PersistentVolumeClaim", "Kafka", "KafkaNodePool", "KafkaTopic", "SparkApplication",
                "StatefulSet", "Job", "ClusterRole", "Role", "PodMonitor"} <= set(kinds), overlay
        assert sorted(by_kind(docs, "Deployment")) == ["flightwatch-node-metrics", "flightwatch-prometheus",
                                                       "flightwatch-receiver", "flightwatch-ui"]
        assert sorted(by_kind(docs, "StatefulSet")) == ["flightwatch-kafka-receiver"]
        placed = {(_name(d), d["metadata"].get("namespace")) for d in docs if d["kind"] not in
                  ("Namespace", "ClusterRole", "ClusterRoleBinding")}
        # the cluster's node exporter by default; flightwatch's, when asked, alone in a namespace of its own
        theirs = overlay != WITH_NODE_EXPORTER
        assert ("DaemonSet" in kinds) is not theirs, overlay
        assert {n for n, ns in placed if ns != "flightwatch"} == (set() if theirs else {"DaemonSet/flightwatch-node-exporter"})
        assert {ns for _, ns in placed} == ({"flightwatch"} if theirs else {"flightwatch", NODE_EXPORTER_NAMESPACE})
        # Strimzi's current API (served from 0.49, the only one from 1.0)
        assert {d["apiVersion"] for d in docs if d["kind"].startswith("Kafka")} == {"kafka.strimzi.io/v1"}, overlay
    # the overlays differ where they should
    small, large = rendered["small"], rendered["large"]
    assert by_kind(small, "KafkaNodePool")["telemetry"]["spec"]["replicas"] == 1
    assert by_kind(large, "KafkaNodePool")["telemetry"]["spec"]["replicas"] == 3
    assert by_kind(large, "Kafka")["flightwatch-telemetry"]["spec"]["kafka"]["config"]["min.insync.replicas"] == 2
    assert by_kind(large, "Deployment")["flightwatch-receiver"]["spec"]["replicas"] == 4
    assert by_kind(large, "SparkApplication")["flightwatch-streaming"]["spec"]["executor"]["instances"] == 4


def test_validation_catches_mistakes(rendered):
    docs = rendered["small"]

    def broken(kind, name, edit):
        doc = copy.deepcopy(next(d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name))
        edit(doc)
        return deploy.validate([doc])

    assert broken("Deployment", "flightwatch-ui", lambda d: d["spec"]["template"]["spec"]["containers"][0].update(imagee="x"))
    assert broken("Job", "flightwatch-loadgen", lambda d: d["spec"].update(completions="two"))
    assert broken("KafkaTopic", "flightwatch.telemetry", lambda d: d["spec"].update(partition=4))
    assert broken("KafkaNodePool", "telemetry", lambda d: d["spec"].update(roles=["leader"]))
    assert broken("Kafka", "flightwatch-telemetry", lambda d: d["spec"]["kafka"]["listeners"][0].update(tls="no"))
    assert broken("SparkApplication", "flightwatch-streaming", lambda d: d["spec"].update(type="Go"))
    assert broken("SparkApplication", "flightwatch-streaming", lambda d: d["spec"]["driver"].update(memory="2 GB"))
    assert deploy.validate([{"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}])


def test_crd_dir_checks_against_the_operators_own_schemas(rendered, tmp_path):
    # a CRD of the shape operators ship (apiextensions.k8s.io/v1), stricter than ours: at most 2 partitions
    (tmp_path / "kafkatopic.yaml").write_text("""
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: kafkatopics.kafka.strimzi.io}
spec:
  group: kafka.strimzi.io
  names: {kind: KafkaTopic, plural: kafkatopics}
  scope: Namespaced
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          properties:
            spec:
              type: object
              properties:
                partitions: {type: integer, minimum: 1, maximum: 2}
""")
    topic = [d for d in rendered["small"] if d["kind"] == "KafkaTopic"]
    problems = deploy.validate(topic, str(tmp_path))
    assert len(problems) == 1 and "(CRD): spec.partitions: 4 is greater than the maximum of 2" in problems[0]
    others = [d for d in rendered["small"] if d["kind"] == "KafkaNodePool"]
    assert deploy.validate(others, str(tmp_path)) == ["KafkaNodePool/telemetry: no CRD for kafka.strimzi.io/v1/KafkaNodePool in "
                                                      + str(tmp_path)]


def test_security_defaults(rendered):
    for overlay, docs in rendered.items():
        for d, spec in pod_specs(docs):
            ctx = spec.get("securityContext", {})
            assert ctx.get("runAsNonRoot") is True and ctx.get("runAsUser", 0) > 0, d["metadata"]["name"]
            assert ctx.get("seccompProfile", {}).get("type") == "RuntimeDefault"
            for c in spec["containers"]:
                where = f"{overlay} {d['metadata']['name']}/{c['name']}"
                res = c.get("resources", {})
                assert {"cpu", "memory"} <= set(res.get("requests", {})) and {"cpu", "memory"} <= set(res.get("limits", {})), where
                sc = c.get("securityContext", {})
                assert sc.get("allowPrivilegeEscalation") is False and sc.get("capabilities", {}).get("drop") == ["ALL"], where
                assert sc.get("readOnlyRootFilesystem") is True, where
                if d["kind"] != "Job":
                    assert c.get("readinessProbe") or c.get("livenessProbe"), where
            # a service account token only where the API is used (Prometheus' discovery, the OOM watcher)
            if spec.get("serviceAccountName") is None:
                assert spec.get("automountServiceAccountToken") is False, d["metadata"]["name"]
        spark = by_kind(docs, "SparkApplication")["flightwatch-streaming"]["spec"]
        for role in ("driver", "executor"):
            assert spark[role]["securityContext"]["runAsNonRoot"] is True
            assert spark[role]["securityContext"]["allowPrivilegeEscalation"] is False
        # least privilege: the OOM watcher reads pods and nothing else; no role anywhere reads secrets
        watcher = by_kind(docs, "ClusterRole")["flightwatch-oom-watcher"]
        assert watcher["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
        for d in docs:
            if d["kind"] in ("Role", "ClusterRole"):
                assert all("secrets" not in r["resources"] and "*" not in r["resources"] and "*" not in r["verbs"]
                           for r in d["rules"]), d["metadata"]["name"]
        # flightwatch's host-network node exporter, when asked for, listens on the node's address, not on every
        # interface, and off the 9100 of the cluster's own; nothing of flightwatch's takes 9100
        if overlay == WITH_NODE_EXPORTER:
            ne = by_kind(docs, "DaemonSet")["flightwatch-node-exporter"]["spec"]["template"]["spec"]
            assert ne["hostNetwork"] is True and "--web.listen-address=$(NODE_IP):9110" in ne["containers"][0]["args"]
        assert not [p for _, spec in pod_specs(docs) for c in spec["containers"] for p in c.get("ports", [])
                    if 9100 in (p.get("containerPort"), p.get("hostPort"))], overlay


def test_loadgen_is_an_indexed_job_whose_shards_split_the_rate(rendered):
    for overlay, shards in (("small", 2), ("large", 8)):
        docs = rendered[overlay]
        job = by_kind(docs, "Job")["flightwatch-loadgen"]["spec"]
        c = job["template"]["spec"]["containers"][0]
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert job["completionMode"] == "Indexed" and job["completions"] == job["parallelism"] == shards
        assert int(env["FLIGHTWATCH_SHARDS"]) == shards and job["backoffLimitPerIndex"] == 0
        # every shard and the streaming job read the run ID from the same ConfigMap
        assert "$(FLIGHTWATCH_RUN)" in c["args"] and c["envFrom"] == [{"configMapRef": {"name": "flightwatch-run"}}]
        spark = by_kind(docs, "SparkApplication")["flightwatch-streaming"]["spec"]
        assert spark["driver"]["envFrom"] == [{"configMapRef": {"name": "flightwatch-run"}}]
        assert "FLIGHTWATCH_RUN" in by_kind(docs, "ConfigMap")["flightwatch-run"]["data"]
    # what an indexed Job's pod gets: its shard from JOB_COMPLETION_INDEX, the count from FLIGHTWATCH_SHARDS
    from loadgen.__main__ import build_parser, config

    os.environ.update(JOB_COMPLETION_INDEX="5", FLIGHTWATCH_SHARDS="8")
    try:
        a = build_parser().parse_args(["attack", "--rate", "800", "--run", "r", "--no-telemetry", "--out", "/tmp/x"])
        cfg = config(a)[0]
        assert (cfg.shard, cfg.shards, a.shard) == (5, 8, "5/8")
    finally:
        del os.environ["JOB_COMPLETION_INDEX"], os.environ["FLIGHTWATCH_SHARDS"]


def test_images_run_what_exists_here(rendered):
    import importlib.util

    docs = rendered["small"]
    for _d, spec in pod_specs(docs):
        for c in spec["containers"]:
            if "flightwatch" in c["image"]:
                assert c["image"] == "ghcr.io/flightwatch/flightwatch:0.1.0"
                module = c["args"][c["args"].index("-m") + 1]
                assert importlib.util.find_spec(module) is not None, module
    spark = by_kind(docs, "SparkApplication")["flightwatch-streaming"]["spec"]
    assert spark["image"] == "ghcr.io/flightwatch/flightwatch-spark:0.1.0"
    import pyspark

    assert spark["sparkVersion"] == pyspark.__version__
    main_file = spark["mainApplicationFile"].removeprefix("local:///opt/flightwatch/")
    assert os.path.isfile(os.path.join(ROOT, main_file))
    # the Dockerfile: both targets, non-root, everything it copies exists
    text = open(os.path.join(ROOT, "deploy", "Dockerfile")).read()
    stages = re.findall(r"^FROM \S+ AS (\S+)", text, re.M)
    assert stages == ["python", "flightwatch", "flightwatch-spark"]
    for stage in text.split("\nFROM ")[2:]:
        assert re.findall(r"^USER (\S+)", stage, re.M)[-1] == "10001:10001"
    for src in re.findall(r"^COPY (?!--)(.+) \S+$", text, re.M):
        for path in src.split():
            assert os.path.exists(os.path.join(ROOT, path)), path


@pytest.mark.integration
def test_spark_entrypoint_runs_the_job_as_the_driver_pod_would():
    """The image's entrypoint in driver mode: spark-submit (client mode) runs the SparkApplication's main file."""
    import pyspark

    env = dict(os.environ, SPARK_HOME=os.path.dirname(pyspark.__file__), SPARK_DRIVER_BIND_ADDRESS="127.0.0.1",
               SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable, PYTHONPATH=ROOT, FLIGHTWATCH_RUN="k8s-run-1")
    r = subprocess.run([os.path.join(ROOT, "deploy", "spark-entrypoint.sh"), "driver", "--master", "local[1]",
                        os.path.join(ROOT, "streaming", "__main__.py"), "summary", "--checkpoints", os.path.join(ROOT, "nowhere")],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    # the run ID came from the environment (as from the ConfigMap), the job's own one-line error came back
    out = r.stdout + r.stderr  # spark-submit passes the Python program's stderr to its stdout
    assert r.returncode == 2 and "flightwatch streaming: error: no run at" in out and "k8s-run-1" in out, out[-2000:]


def _deploy(*args, **env):
    return subprocess.run([sys.executable, "-m", "stack.deploy", *args], cwd=ROOT, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=ROOT, **env), timeout=120)


def test_deploy_dry_run_and_errors():
    r = _deploy("apply", "--overlay", "small", "--dry-run", "--storage-class", "nfs-client")
    assert r.returncode == 0, r.stderr
    plan = [line for line in r.stderr.splitlines() if line.startswith("would apply: ")]
    # with the Grafana dashboard's ConfigMap, the PodMonitors, the network policies and the disruption budgets; no node
    # exporter of ours, and no Kafka receiver (its StatefulSet, Service, PodMonitor and budget) for the default HTTP target
    assert len(plan) == r.stdout.count("\nkind: ") + r.stdout.startswith("kind: ") == 42
    assert not any("kafka-receiver" in line for line in plan) and "asking for 8.70 CPUs" in r.stderr
    assert not any("DaemonSet" in line for line in plan)
    r = _deploy("apply", "--overlay", "small", "--dry-run", "--storage-class", "nfs-client", "--node-exporter")
    assert r.returncode == 0 and "would apply: apps/v1 DaemonSet/flightwatch-node-exporter (namespace flightwatch-node-exporter)" \
        in r.stderr.splitlines(), r.stderr
    assert "would apply: sparkoperator.k8s.io/v1beta2 SparkApplication/flightwatch-streaming (namespace flightwatch)" in plan
    assert "storageClassName: nfs-client" in r.stdout
    r = _deploy("delete", "--overlay", "large", "--dry-run", FLIGHTWATCH_STORAGE_CLASS="efs-sc")
    assert r.returncode == 0 and "would delete: batch/v1 Job/flightwatch-loadgen" in r.stderr
    assert "would delete: apps/v1 StatefulSet/flightwatch-kafka-receiver (namespace flightwatch)" in r.stderr  # any target's
    r = _deploy("apply", "--overlay", "medium")
    assert r.returncode == 2 and r.stderr.strip() == "deploy: error: unknown overlay 'medium' (have: kind, large, small)"
    # the run folders' claim needs a ReadWriteMany class: without one, one line and nothing applied
    r = _deploy("apply", "--overlay", "small", "--dry-run", FLIGHTWATCH_STORAGE_CLASS="")
    assert r.returncode == 2 and r.stdout == "" and len(r.stderr.splitlines()) == 1, r.stderr
    assert r.stderr.startswith("deploy: error: the flightwatch-checkpoints claim needs a ReadWriteMany storage class")
    # no cluster here: a clear one-line error, nothing applied (kubectl's default server is loopback)
    r = _deploy("apply", "--overlay", "small", "--storage-class", "nfs", KUBECONFIG=os.path.join(ROOT, "no-such-kubeconfig"))
    assert r.returncode == 2 and r.stderr.startswith("deploy: error: no Kubernetes cluster reachable"), r.stderr


READY = {
    "api_versions": ["v1", "apps/v1", "kafka.strimzi.io/v1", "kafka.strimzi.io/v1beta2", "sparkoperator.k8s.io/v1beta2",
                     "monitoring.coreos.com/v1"],
    "deployments": [
        {"metadata": {"name": "strimzi-cluster-operator", "namespace": "strimzi"},
         "spec": {"template": {"spec": {"containers": [{"image": "quay.io/strimzi/operator:0.49.0",
                                                        "env": [{"name": "STRIMZI_NAMESPACE", "value": "flightwatch,kafka"}]}]}}}},
        {"metadata": {"name": "spark-operator-controller", "namespace": "spark-operator"},
         "spec": {"template": {"spec": {"containers": [{"image": "ghcr.io/kubeflow/spark-operator/controller:2.2.0",
                                                        "args": ["controller", "start", "--namespaces=flightwatch"]}]}}}}],
    "daemonsets": [  # kube-prometheus-stack's node exporter
        {"metadata": {"name": "kps-prometheus-node-exporter", "namespace": "monitoring"},
         "spec": {"template": {"metadata": {"labels": {"app.kubernetes.io/name": "prometheus-node-exporter"}}}}}],
    "webhooks": [{"webhooks": [{"name": "mutate--v1-pod.sparkoperator.k8s.io"}]}],
    "storage_classes": {"nfs-client": {"provisioner": "cluster.local/nfs-subdir-external-provisioner"},
                        "gp3": {"provisioner": "ebs.csi.aws.com"}},
}


def test_deploy_checks_the_cluster_first_and_says_every_problem_in_one_line(tmp_path):
    """The checks ``make deploy`` runs against a cluster before it applies anything. No Kubernetes API server runs
    here: a fake kubectl (``tests/support/fake_kubectl.py``) answers as a cluster would, from a JSON state."""
    import json

    from support import script

    state = tmp_path / "cluster.json"
    env = dict(FLIGHTWATCH_KUBECTL=script("fake_kubectl.py"), FAKE_KUBECTL_STATE=str(state), REAL_KUBECTL=deploy.kubectl())
    # a cluster fresh from the quick starts: Strimzi 0.48, the Spark operator watching "default" without its
    # webhook, the default class of EKS
    fresh = copy.deepcopy(READY)
    fresh["api_versions"].remove("kafka.strimzi.io/v1")
    fresh["deployments"][0]["spec"]["template"]["spec"]["containers"][0]["env"] = [
        {"name": "STRIMZI_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}]
    fresh["deployments"][1]["spec"]["template"]["spec"]["containers"][0]["args"][2] = "--namespaces=default"
    fresh["webhooks"] = []
    fresh["api_versions"].remove("monitoring.coreos.com/v1")  # no Prometheus Operator, no node exporter
    fresh["daemonsets"] = []
    state.write_text(json.dumps(fresh))
    r = _deploy("apply", "--overlay", "small", "--storage-class", "gp3", **env)
    lines = r.stderr.splitlines()
    assert r.returncode == 2 and not (tmp_path / "cluster.json.applied").exists(), r.stderr
    assert [line.split(":")[1].strip() for line in lines[:-1]] == ["not ready"] * 7 and len(lines) == 8, r.stderr
    assert lines[0].startswith("deploy: not ready: kafka.strimzi.io/v1 is not served by the cluster: install Strimzi 0.49")
    assert lines[1].startswith("deploy: not ready: monitoring.coreos.com/v1 is not served by the cluster: install the "
                               "Prometheus Operator (Helm chart kube-prometheus-stack)")
    assert "the Strimzi cluster operator does not watch the namespace flightwatch (it watches strimzi)" in lines[2]
    assert "the Spark operator's controller does not watch the namespace flightwatch (it watches default)" in lines[3]
    assert "the Spark operator's mutating webhook is not installed" in lines[4]
    assert "no node exporter runs in the cluster" in lines[5] and "(make deploy NODE_EXPORTER=1)" in lines[5]
    assert "storage class gp3 (ebs.csi.aws.com) gives ReadWriteOnce volumes only" in lines[6]
    assert lines[7] == "deploy: error: 7 problem(s) with the cluster; nothing applied"
    # a node exporter of ours beside the cluster's would count every node series twice: refused
    state.write_text(json.dumps(READY))
    r = _deploy("apply", "--overlay", "small", "--storage-class", "nfs-client", "--node-exporter", **env)
    assert r.returncode == 2 and "the cluster already runs a node exporter (monitoring/kps-prometheus-node-exporter)" \
        in r.stderr and not (tmp_path / "cluster.json.applied").exists(), r.stderr
    r = _deploy("apply", "--overlay", "small", "--storage-class", "nfs", **env)
    assert "storage class nfs does not exist" in r.stderr and r.returncode == 2
    # a ready cluster: applied, server-side, with the storage class in the claim
    state.write_text(json.dumps(READY))
    r = _deploy("apply", "--overlay", "small", "--storage-class", "nfs-client", **env)
    assert r.returncode == 0 and "not ready" not in r.stderr, r.stderr
    applied = (tmp_path / "cluster.json.applied").read_text()
    assert applied.startswith("apply --server-side --field-manager=flightwatch -f -") and "storageClassName: nfs-client" in applied


def test_the_grafana_dashboard_is_mounted_and_names_only_exported_metrics(rendered):
    """Every overlay carries the dashboard as a ConfigMap for Grafana's sidecar; the JSON parses, and every
    metric its PromQL names is one the job (``streaming.metrics``) or the HTTP receiver exports: the names are
    taken from their collectors, fed a snapshot, not from a list written again here."""
    import json
    import re

    from streaming.metrics import JobMetrics
    from transports.http.receiver import HttpReceiver

    for overlay, docs in rendered.items():
        cm = by_kind(docs, "ConfigMap")["flightwatch-grafana-dashboard"]
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1", overlay
        dash = json.loads(cm["data"]["flightwatch.json"])
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    exprs += [v["query"] for v in dash["templating"]["list"] if v["type"] == "query"]
    named = {m for e in exprs for m in re.findall(r"\b(flightwatch_[a-z0-9_]+)", e)}
    job = JobMetrics()
    job.publish({"run": "r", "events": {"sent": 1, "received": 1, "dropped": 0, "errors": 0}, "gap_windows": 0,
                 "in_flight": 0, "window_start_s": 1.0, "flight_time_us": {"0.99": 1.0, "max": 2.0},
                 "send_delay_us": {"0.99": 1.0, "max": 2.0},
                 "observer_cpu": 0.1, "state": "ok", "batches": 1, "finished": False})
    from types import SimpleNamespace

    receiver = HttpReceiver(SimpleNamespace(counters=lambda: {"spooled": 1, "lost": 0, "over_budget": False}), "a")
    receiver.bad["x"] = 1
    exported = {s.name for collector in (job, receiver) for f in collector.collect() for s in f.samples}
    assert named and named <= exported, named - exported
    assert len(dash["panels"]) >= 8


def test_pod_monitors_carry_kube_prometheus_stacks_release_label(rendered):
    """kube-prometheus-stack's Prometheus selects PodMonitors by ``release: <its release>``: the manifests carry its
    default name, and ``--prometheus-release`` gives another."""
    for overlay, docs in rendered.items():
        monitors = by_kind(docs, "PodMonitor")
        assert len(monitors) >= 4 and {m["metadata"]["labels"]["release"] for m in monitors.values()} == \
            {"kube-prometheus-stack"}, overlay
    docs = copy.deepcopy(rendered["small"])
    deploy.set_prometheus_release(docs, "kps")
    assert {m["metadata"]["labels"]["release"] for m in by_kind(docs, "PodMonitor").values()} == {"kps"}
    assert all(d["metadata"].get("labels", {}).get("release") != "kps" for d in docs if d["kind"] != "PodMonitor")


def test_disruption_budgets_hold_the_receivers_the_driver_and_the_shards(rendered):
    """A drain waits for them (maxUnavailable 0), and each budget selects the pods it is for."""
    for overlay, docs in rendered.items():
        budgets = by_kind(docs, "PodDisruptionBudget")
        assert set(budgets) == {"flightwatch-receiver", "flightwatch-kafka-receiver", "flightwatch-streaming-driver",
                                "flightwatch-loadgen"}
        pods = {"flightwatch-receiver": by_kind(docs, "Deployment")["flightwatch-receiver"]["spec"]["template"],
                "flightwatch-loadgen": by_kind(docs, "Job")["flightwatch-loadgen"]["spec"]["template"],
                "flightwatch-kafka-receiver": by_kind(docs, "StatefulSet")["flightwatch-kafka-receiver"]["spec"]["template"],
                "flightwatch-streaming-driver": by_kind(docs, "SparkApplication")["flightwatch-streaming"]["spec"]["driver"]}
        for name, b in budgets.items():
            assert b["spec"]["maxUnavailable"] == 0, (overlay, name)
            labels = pods[name].get("metadata", pods[name]).get("labels", {})
            assert b["spec"]["selector"]["matchLabels"].items() <= labels.items(), (overlay, name, labels)
        executor = by_kind(docs, "SparkApplication")["flightwatch-streaming"]["spec"]["executor"]["labels"]
        assert not budgets["flightwatch-streaming-driver"]["spec"]["selector"]["matchLabels"].items() <= executor.items()


def test_the_kafka_receiver_is_deployed_only_for_a_kafka_target(rendered):
    docs = copy.deepcopy(rendered["small"])
    assert by_kind(docs, "ConfigMap")["flightwatch-run"]["data"]["TARGET"].startswith("http://")
    kept = deploy.for_target(docs)
    gone = sorted(_name(d) for d in docs if d not in kept)
    assert gone == ["PodDisruptionBudget/flightwatch-kafka-receiver", "PodMonitor/flightwatch-kafka-receiver",
                    "Service/flightwatch-kafka-receiver", "StatefulSet/flightwatch-kafka-receiver"]
    assert deploy.validate(kept) == []
    by_kind(docs, "ConfigMap")["flightwatch-run"]["data"]["TARGET"] = "kafka://my-cluster-kafka-bootstrap.kafka:9092/t"
    assert deploy.for_target(docs) == docs


def test_the_kind_overlay_fits_a_4_cpu_runner(rendered):
    """The workflow's overlay asks for at most 2.5 CPUs, leaving 1.5 of the runner's 4 to the control plane (~1 CPU
    of requests on kind), the operators and kube-prometheus-stack. The sum is over every pod flightwatch makes or
    has made (the Spark operator's driver and executor, Strimzi's broker and entity operator)."""
    kind = deploy.cpu_requests(deploy.for_target(rendered["kind"]))
    assert sum(kind.values()) <= 2.5, kind
    assert {"SparkApplication/flightwatch-streaming", "KafkaNodePool/telemetry", "Job/flightwatch-loadgen",
            "Deployment/flightwatch-receiver", "Kafka/flightwatch-telemetry"} <= set(kind)
    assert sum(deploy.cpu_requests(deploy.for_target(rendered["small"])).values()) > 4  # why kind has an overlay


def test_the_kind_workflow_pins_versions_fails_fast_and_runs_for_every_image_change():
    import yaml

    text = open(os.path.join(ROOT, ".github", "workflows", "kind.yml")).read()
    wf = yaml.safe_load(text)
    steps = wf["jobs"]["kind"]["steps"]
    kind_action = next(s for s in steps if s.get("uses", "").startswith("helm/kind-action"))
    assert re.fullmatch(r"v\d+\.\d+\.\d+", kind_action["with"]["version"])
    assert re.fullmatch(r"kindest/node:v\d+\.\d+\.\d+", kind_action["with"]["node_image"])
    installs = re.findall(r"helm install [^\n]*(?:\\\n[^\n]*)*", text)
    assert len(installs) == 4 and all(re.search(r"--version \d+\.\d+\.\d+", i) for i in installs), installs
    assert "OVERLAY=kind" in text and "OVERLAY=small" not in text
    wait = next(s["run"] for s in steps if s.get("name", "").startswith("Watch the attack"))
    assert "Failed=True" in wait and "exit 1" in wait and "wait --for=condition=complete" not in wait
    # the workflow runs on a change to anything the images are built from
    paths = wf[True]["pull_request"]["paths"] if True in wf else wf["on"]["pull_request"]["paths"]
    copied = re.findall(r"^COPY (.+) \S+$", open(os.path.join(ROOT, "deploy", "Dockerfile")).read(), re.M)
    for src in " ".join(copied).split():
        assert any(p in (src, f"{src}/**") or (p.endswith("/**") and src.startswith(p[:-2])) for p in paths), src
