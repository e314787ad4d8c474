"""The Kubernetes OOM watcher against a recorded pod-watch stream.

There is no Kubernetes API server on these machines, so this is the one fake in the suite:
``tests/support/data/pod-watch-oomkilled.jsonl`` is a pod watch stream written by hand in the shape
the API server sends (``GET /api/v1/pods?watch=true``: one ``{"type", "object"}`` JSON
line per event, Pod objects as ``kubectl get pod -o json`` shows them), replayed by a
loopback HTTP server. The real ``kubernetes`` client connects to it, parses the stream and
drives the watcher, as it would against a cluster.
"""
from __future__ import annotations

import os
import threading
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from support import HERE

from agents.oom import KubeWatcher
from core import contract

RECORDING = os.path.join(HERE, "data", "pod-watch-oomkilled.jsonl")


def ns(text: str) -> int:
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC).timestamp()) * 10**9


@pytest.fixture
def api_server():
    """A loopback server replaying the recording on the pod watch path; the paths it was asked for."""
    body = open(RECORDING, "rb").read()
    asked = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            asked.append(self.path)
            if not self.path.startswith("/api/v1/pods") or "watch=true" not in self.path:
                self.send_error(404, self.path)
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}", asked
    srv.shutdown()


def core_api(host: str):
    from kubernetes import client

    cfg = client.Configuration()
    cfg.host = host
    return client.CoreV1Api(client.ApiClient(cfg))


def test_oomkilled_container_and_restarts_reported_once(api_server):
    host, asked = api_server
    out = []
    watcher = KubeWatcher(core_api(host), out.append, agent="oom-k8s", since_ns=ns("2026-11-21T14:00:00Z"))
    assert watcher.run_once(timeout_s=5) == 7
    assert any("watch=true" in p for p in asked)
    ooms = [r for r in out if isinstance(r, contract.OomEvent)]
    restarts = [r for r in out if isinstance(r, contract.ContainerRestart)]
    # One OOM kill: the ingress container of the pod on worker-1, at its termination time; the
    # kill before the watcher's start (pod 9xk2p) is history, and the kill seen again in
    # lastState after the restart is the same kill.
    assert [(o.source, o.where, o.at_ns, o.count, o.run_id) for o in ooms] == [
        ("k8s", "sut/broker-ingress-7c9d5b8f4-tq7rm/ingress@worker-1", ns("2026-11-21T14:05:31Z"), 1, contract.ANY_RUN)]
    assert [(r.where, r.reason, r.count, r.at_ns) for r in restarts] == [
        ("sut/broker-ingress-7c9d5b8f4-tq7rm/ingress@worker-1", "OOMKilled", 1, ns("2026-11-21T14:05:31Z")),
        ("sut/broker-ingress-7c9d5b8f4-tq7rm/log-shipper@worker-1", "Error", 1, ns("2026-11-21T14:06:13Z"))]
    # A reconnect replays the same events: nothing is reported twice, and it resumes from the last version seen.
    assert watcher.run_once(timeout_s=5) == 7
    assert len(out) == 3
    assert "resourceVersion=812530" in asked[-1]


def test_records_pass_the_contract(api_server):
    host, _ = api_server
    out = []
    KubeWatcher(core_api(host), out.append, agent="oom-k8s", since_ns=0).run_once(timeout_s=5)
    # since 0: the older OOM kill of pod 9xk2p counts too
    assert sum(isinstance(r, contract.OomEvent) for r in out) == 2
    assert contract.decode(contract.encode(out)) == out
