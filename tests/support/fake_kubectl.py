#!/usr/bin/env python3
"""A stand-in for kubectl talking to a cluster, for ``stack.deploy``'s checks: no Kubernetes API server runs on
these machines, so what a cluster would answer is read from the JSON file ``$FAKE_KUBECTL_STATE``:

    {"api_versions": [...], "deployments": [...], "daemonsets": [...], "webhooks": [...], "storage_classes": {"name": {...}}}

``version``, ``api-versions`` and ``get deployments|daemonsets|mutatingwebhookconfigurations|storageclass NAME -o json`` answer
from it; ``apply``/``delete`` write their command line and stdin to ``$FAKE_KUBECTL_STATE.applied``; ``kustomize``
runs the real kubectl (``$REAL_KUBECTL``), which needs no cluster.
"""
import json
import os
import sys

args = [a for a in sys.argv[1:] if not a.startswith("--request-timeout")]
if args[:1] == ["kustomize"]:
    os.execv(os.environ["REAL_KUBECTL"], [os.environ["REAL_KUBECTL"], *args])
with open(os.environ["FAKE_KUBECTL_STATE"]) as f:
    state = json.load(f)
if args[:1] == ["version"]:
    print(json.dumps({"serverVersion": {"gitVersion": "v1.33.0"}}))
elif args[:1] == ["api-versions"]:
    print("\n".join(state["api_versions"]))
elif args[:2] == ["get", "deployments"]:
    print(json.dumps({"items": state["deployments"]}))
elif args[:2] == ["get", "daemonsets"]:
    print(json.dumps({"items": state.get("daemonsets", [])}))
elif args[:2] == ["get", "mutatingwebhookconfigurations"]:
    print(json.dumps({"items": state["webhooks"]}))
elif args[:2] == ["get", "storageclass"]:
    sc = state["storage_classes"].get(args[2])
    if sc is None:
        print(f'Error from server (NotFound): storageclasses.storage.k8s.io "{args[2]}" not found', file=sys.stderr)
        sys.exit(1)
    print(json.dumps(sc))
elif args[:1] in (["apply"], ["delete"]):
    with open(os.environ["FAKE_KUBECTL_STATE"] + ".applied", "w") as f:
        f.write(" ".join(args) + "\n" + sys.stdin.read())
else:
    print(f"fake kubectl: not answered: {args}", file=sys.stderr)
    sys.exit(1)
