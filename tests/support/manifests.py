"""The rendered Kubernetes manifests, read as a cluster would: the pods they make (the Spark operator's too) and
NetworkPolicy's rules for who may reach whom. Shared by the deployment tests (tests/stack)."""
from __future__ import annotations

WITH_NODE_EXPORTER = "small+node-exporter"
"""The small overlay with flightwatch's own node exporter (``make deploy NODE_EXPORTER=1``)."""


def by_kind(docs, kind):
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def pods(docs):
    """(name, namespace, labels, pod spec) of every pod the overlay makes, the Spark operator's driver and
    executors as the operator builds them (podSecurityContext and securityContext, the application's volumes)."""
    for d in docs:
        if d["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
            t = d["spec"]["template"]
            yield d["metadata"]["name"], d["metadata"]["namespace"], t["metadata"]["labels"], t["spec"]
        elif d["kind"] == "SparkApplication":
            for role in ("driver", "executor"):
                r = d["spec"][role]
                spec = {"securityContext": r.get("podSecurityContext", {}), "volumes": d["spec"].get("volumes", []),
                        "containers": [{"name": f"spark-kubernetes-{role}", "securityContext": r.get("securityContext", {})}]}
                yield f"{d['metadata']['name']}-{role}", d["metadata"]["namespace"], r["labels"], spec


def selects(selector: dict, labels: dict) -> bool:
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for e in selector.get("matchExpressions", []):
        has = e["key"] in labels
        if e["operator"] == "In" and not (has and labels[e["key"]] in e["values"]):
            return False
        if e["operator"] == "NotIn" and has and labels[e["key"]] in e["values"]:
            return False
        if e["operator"] == "Exists" and not has or e["operator"] == "DoesNotExist" and has:
            return False
    return True


def allowed(policies: list[dict], dst_labels: dict, port: int, protocol: str, src_labels: dict,
            src_namespace_labels: dict, same_namespace: bool) -> bool:
    """NetworkPolicy semantics (ingress): a pod selected by no policy takes everything; a selected one, only what
    some rule of some selecting policy lets in (peers: a pod selector alone means this namespace)."""
    selecting = [p for p in policies if selects(p["spec"]["podSelector"], dst_labels) and "Ingress" in p["spec"]["policyTypes"]]
    if not selecting:
        return True
    for p in selecting:
        for rule in p["spec"].get("ingress", []):
            ports = rule.get("ports")
            if ports and not any(x.get("port") == port and x.get("protocol", "TCP") == protocol for x in ports):
                continue
            peers = rule.get("from")
            if not peers:
                return True
            for peer in peers:
                ns_ok = (selects(peer["namespaceSelector"], src_namespace_labels) if "namespaceSelector" in peer
                         else same_namespace)
                pod_ok = selects(peer["podSelector"], src_labels) if "podSelector" in peer else True
                if ns_ok and pod_ok:
                    return True
    return False
