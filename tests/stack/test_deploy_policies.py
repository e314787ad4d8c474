"""Least privilege in the Kubernetes deployment, checked on the rendered overlays: every pod in ``flightwatch``
passes the "restricted" Pod Security Standard (checked here rule by rule, as the admission controller would),
the node exporter alone runs in a namespace of its own, network policies deny by default and let in only whom
they should (evaluated here for the paths that matter), agents are named after their pods, and the Spark driver's
Role holds only what Spark on Kubernetes needs.

No cluster runs here: these are the rules of the Pod Security Standards and of NetworkPolicy, applied to the
manifests ``make deploy`` would apply.
"""
from __future__ import annotations

import os

from support.manifests import allowed, by_kind, pods, selects

from stack import deploy

RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected",
                      "secret"}


def restricted_violations(spec: dict) -> list[str]:
    """What in a pod spec the "restricted" Pod Security Standard (Kubernetes 1.33) forbids."""
    out = [f"{k}" for k in ("hostNetwork", "hostPID", "hostIPC") if spec.get(k)]
    out += [f"volume {v['name']}" for v in spec.get("volumes", []) if not set(v) - {"name"} <= RESTRICTED_VOLUMES]
    pod = spec.get("securityContext", {})
    for c in spec.get("initContainers", []) + spec["containers"]:
        sc = c.get("securityContext", {})
        where = c["name"]
        if sc.get("privileged"):
            out.append(f"{where}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{where}: allowPrivilegeEscalation")
        caps = sc.get("capabilities", {})
        if "ALL" not in caps.get("drop", []) or set(caps.get("add", [])) - {"NET_BIND_SERVICE"}:
            out.append(f"{where}: capabilities")
        if not sc.get("runAsNonRoot", pod.get("runAsNonRoot")):
            out.append(f"{where}: runAsNonRoot")
        if sc.get("runAsUser", pod.get("runAsUser")) == 0:
            out.append(f"{where}: runAsUser 0")
        seccomp = (sc.get("seccompProfile") or pod.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"{where}: seccompProfile")
        if any(p.get("hostPort") for p in c.get("ports", [])):
            out.append(f"{where}: hostPort")
    return out


def test_every_pod_in_flightwatch_passes_restricted_and_only_the_node_exporter_needs_more(rendered):
    for overlay, docs in rendered.items():
        namespaces = {d["metadata"]["name"]: d["metadata"]["labels"] for d in docs if d["kind"] == "Namespace"}
        assert namespaces["flightwatch"]["pod-security.kubernetes.io/enforce"] == "restricted"
        if "flightwatch-node-exporter" in namespaces:
            assert namespaces["flightwatch-node-exporter"]["pod-security.kubernetes.io/enforce"] == "privileged"
        seen = set()
        for name, ns, _labels, spec in pods(docs):
            seen.add(name)
            problems = restricted_violations(spec)
            if ns == "flightwatch":
                assert problems == [], (overlay, name, problems)
            else:
                assert name == "flightwatch-node-exporter" and problems == ["hostNetwork", "volume proc", "volume sys",
                                                                             "volume root"], (name, problems)
                assert "hostPID" not in spec  # it reads the host's /proc through the mount
        assert {"flightwatch-streaming-driver", "flightwatch-streaming-executor", "flightwatch-receiver",
                "flightwatch-loadgen", "flightwatch-ui", "flightwatch-prometheus", "flightwatch-node-metrics"} <= seen
        # the checker itself catches what it is for
        assert restricted_violations({"hostPID": True, "containers": [{"name": "c"}]}) == [
            "hostPID", "c: allowPrivilegeEscalation", "c: capabilities", "c: runAsNonRoot", "c: seccompProfile"]
        # the Spark pods: seccomp and the claim's group for the job's user
        spark = by_kind(docs, "SparkApplication")["flightwatch-streaming"]["spec"]
        assert spark["driver"]["podSecurityContext"]["fsGroup"] == 10001


def test_network_policies_deny_by_default_and_let_in_only_whom_they_should(rendered):
    for overlay, docs in rendered.items():
        policies = list(by_kind(docs, "NetworkPolicy").values())
        deny = by_kind(docs, "NetworkPolicy")["flightwatch-default-deny"]["spec"]
        assert deny == {"podSelector": {}, "policyTypes": ["Ingress"]}, overlay
        labels = {name: lab for name, ns, lab, _ in pods(docs) if ns == "flightwatch"}
        for name, lab in labels.items():  # every component has a policy of its own besides the default
            assert any(selects(p["spec"]["podSelector"], lab) for p in policies if p["metadata"]["name"] != "flightwatch-default-deny"), name
        sut_ns = {"flightwatch.io/system-under-test": "true"}
        other_ns = {"kubernetes.io/metadata.name": "shop"}

        def reach(dst, port, src, protocol="TCP", ns=None, policies=policies, labels=labels):
            src_labels = labels.get(src, {"app": src})
            return allowed(policies, labels[dst], port, protocol, src_labels, ns or {}, same_namespace=ns is None)

        assert reach("flightwatch-receiver", 8080, "broker-ingress", ns=sut_ns)  # the system under test delivers
        assert reach("flightwatch-receiver", 8080, "flightwatch-loadgen") and reach("flightwatch-receiver", 8080, "flightwatch-prometheus")
        assert not reach("flightwatch-receiver", 8080, "broker-ingress", ns=other_ns)
        assert not reach("flightwatch-ui", 8501, "flightwatch-receiver") and not reach("flightwatch-ui", 8501, "x", ns=sut_ns)
        assert reach("flightwatch-ui", 8501, "ingress-nginx", ns={"flightwatch.io/ui-access": "true"})
        assert reach("flightwatch-prometheus", 9090, "flightwatch-node-metrics")
        assert not reach("flightwatch-prometheus", 9090, "broker-ingress", ns=sut_ns)
        assert reach("flightwatch-node-metrics", 19123, "flightwatch-receiver", "UDP")
        assert not reach("flightwatch-node-metrics", 19123, "broker-ingress", "UDP", ns=sut_ns)
        assert reach("flightwatch-streaming-driver", 7078, "flightwatch-streaming-executor")
        assert reach("flightwatch-streaming-driver", 19401, "flightwatch-prometheus")
        assert not reach("flightwatch-streaming-driver", 7078, "flightwatch-ui")
        # telemetry: Strimzi's policy for the listener lets in only the peers named there
        listener = by_kind(docs, "Kafka")["flightwatch-telemetry"]["spec"]["kafka"]["listeners"][0]
        writers = {n for n, lab in labels.items() if any(selects(p["podSelector"], lab) for p in listener["networkPolicyPeers"])}
        assert writers == {"flightwatch-receiver", "flightwatch-kafka-receiver", "flightwatch-node-metrics", "flightwatch-loadgen",
                           "flightwatch-streaming-driver", "flightwatch-streaming-executor"}, writers


def test_every_receiver_and_agent_is_named_after_its_pod(rendered, monkeypatch):
    for overlay, docs in rendered.items():
        for name in ("flightwatch-receiver", "flightwatch-node-metrics"):
            c = by_kind(docs, "Deployment")[name]["spec"]["template"]["spec"]["containers"][0]
            env = {e["name"]: e for e in c["env"]}
            assert env["FLIGHTWATCH_AGENT"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}, (overlay, name)
            assert "--agent" not in c["args"]
    # the agents take their name from it
    monkeypatch.setenv("FLIGHTWATCH_AGENT", "flightwatch-receiver-7d9c-x2x4q")
    from agents import node_metrics, receiver

    assert receiver._parser().parse_args(["http"]).agent == "flightwatch-receiver-7d9c-x2x4q"
    assert node_metrics._parser().parse_args([]).agent == "flightwatch-receiver-7d9c-x2x4q"


def test_the_driver_role_holds_only_what_spark_on_kubernetes_needs(rendered):
    for docs in rendered.values():
        role = by_kind(docs, "Role")["flightwatch-spark-driver"]
        assert role["rules"] == [
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "create", "delete", "deletecollection"]},
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "create", "delete", "deletecollection"]}]


def test_storage_identity_and_start_up_order(rendered):
    for overlay, docs in rendered.items():
        # the load generator writes its reports into the run's folder on the shared claim
        job = by_kind(docs, "Job")["flightwatch-loadgen"]["spec"]["template"]["spec"]
        mounts = {m["name"]: m["mountPath"] for m in job["containers"][0]["volumeMounts"]}
        checkpoints = by_kind(docs, "ConfigMap")["flightwatch-run"]["data"]["FLIGHTWATCH_CHECKPOINTS"]
        assert mounts["checkpoints"] == checkpoints and "--out" not in job["containers"][0]["args"], overlay
        assert {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "flightwatch-checkpoints"}} in job["volumes"]
        assert job["securityContext"]["fsGroup"] == 10001
        # the job waits for the Topic Operator's topic instead of creating it
        driver_env = {e["name"]: e.get("value") for e in by_kind(docs, "SparkApplication")["flightwatch-streaming"]["spec"]["driver"]["env"]}
        assert driver_env["FLIGHTWATCH_AWAIT_TOPIC"] == "1"
        # the claim asks for ReadWriteMany; its class is given at deploy time (deploy.set_storage_class)
        claim = by_kind(docs, "PersistentVolumeClaim")["flightwatch-checkpoints"]["spec"]
        assert claim["accessModes"] == ["ReadWriteMany"] and "storageClassName" not in claim
        deploy.set_storage_class(docs, "nfs-client")
        assert claim["storageClassName"] == "nfs-client"


def test_the_component_for_strimzi_041_to_048_renders_v1beta2_and_validates(tmp_path):
    overlay = tmp_path / "old-strimzi"
    overlay.mkdir()
    rel = os.path.relpath(os.path.join(deploy.DEPLOY), overlay)
    (overlay / "kustomization.yaml").write_text(
        f"apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [{rel}/overlays/small]\n"
        f"components: [{rel}/components/strimzi-v1beta2]\n")
    import subprocess

    import yaml

    r = subprocess.run([deploy.kubectl(), "kustomize", str(overlay)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    docs = [d for d in yaml.safe_load_all(r.stdout) if d]
    strimzi = [d for d in docs if d["apiVersion"].startswith("kafka.strimzi.io")]
    assert {d["apiVersion"] for d in strimzi} == {"kafka.strimzi.io/v1beta2"} and len(strimzi) == 3
    assert by_kind(docs, "Kafka")["flightwatch-telemetry"]["metadata"]["annotations"] == {
        "strimzi.io/node-pools": "enabled", "strimzi.io/kraft": "enabled"}
    assert deploy.validate(docs) == []


def test_the_guide_says_the_steps_in_the_order_they_must_be_done():
    """The namespace before the operators that must watch it, the storage class before the deploy, then watch and
    tear down; with the versions the manifests were written against."""
    import re

    from support import ROOT

    text = open(os.path.join(ROOT, "docs", "how-to", "kubernetes.md")).read()
    section = text.split("\n## ")[0]
    steps = re.findall(r"^\d+\. \*\*(.+?)\*\*", section, re.M)
    assert steps == ["The namespace.", "The operators, watching it.", "Storage.", "Images.", "The run.",
                     "Check, then deploy.", "Watch.", "Tear down."], steps
    assert "Strimzi 0.49-0.51" in section and "kubeflow/spark-operator 2.x" in section
    assert "watchNamespaces={flightwatch}" in section and "spark.jobNamespaces={flightwatch}" in section
    assert all("STORAGE_CLASS=" in line for line in re.findall(r"`make (?:un)?deploy [^`]*`", section))
