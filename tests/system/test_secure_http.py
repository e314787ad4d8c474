"""A user's own HTTPS CloudEvents sink that delivers to flightwatch's HTTP receiver (``make test-brokers``), as a
broker's ingress does for a subscriber: Debian's nginx terminating TLS with a certificate for ``localhost`` of a CA
made by ``openssl`` here, and passing each event on (kept-alive connections) to an HTTP receiver agent started as the
user would start it (flightwatch cannot: the sink decides where events go), the receiver's answer its own.
``flightwatch run examples/http.toml`` exactly as written, its URL and CA from the environment as the file says; the
probe before the load tells a sink that delivers elsewhere from one that delivers here. (A Python relay, aiohttp,
was the sink at first: beside another broker test in CI it forwarded some 870 events/s of the 2,000, and the run was
rightly saturated.)

Ground truth is read back independently from the telemetry topic with kafka-python.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
from support import ROOT, create_topic, start_receiver, stop_receiver, telemetry, wait_port
from support.brokers import EXACT_DROP_TIMEOUT, assert_exact, example_form, ground_truth, run_example
from support.certs import make_certs

from core.procs import free_port, stop_process

pytestmark = [pytest.mark.integration, pytest.mark.brokers]


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certs(str(tmp_path_factory.mktemp("https-sink") / "certs"))


NGINX = """
worker_processes 1;
worker_rlimit_nofile 8192;
daemon off;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {dir}/body;
  client_body_buffer_size 64k;
  proxy_temp_path {dir}/proxy;
  upstream receiver {{ server {deliver_to}; keepalive 32; }}
  server {{
    listen 127.0.0.1:{port} ssl;
    ssl_certificate {cert};
    ssl_certificate_key {key};
    location / {{ proxy_pass http://receiver; proxy_http_version 1.1; proxy_set_header Connection ""; proxy_buffering off; }}
  }}
}}
"""


def _sink(certs, port: int, deliver_to: str, folder) -> subprocess.Popen:
    """The user's HTTPS sink on ``port`` (nginx), delivering to ``deliver_to`` (host:port), once it listens. Each event
    in flight holds two of its connections (the load generator's and the one to the receiver), and the generator opens
    up to 1,000 when the machine is slow: at nginx's default 1,024 worker connections a CI run beside another broker
    test had 416 of 17,340 sends reset or cut by the sink itself, so it gets 4,096."""
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    if not os.path.exists(nginx):
        pytest.fail("Debian's nginx is needed (apt-get install nginx; .ci/run installs it)")
    os.makedirs(folder / "body", exist_ok=True)
    conf = folder / "nginx.conf"
    conf.write_text(NGINX.format(dir=folder, port=port, deliver_to=deliver_to, cert=certs.cert, key=certs.key))
    p = subprocess.Popen([nginx, "-c", str(conf), "-p", str(folder)], cwd=ROOT, stdout=subprocess.DEVNULL,
                         stderr=open(folder / "nginx.out", "w"), start_new_session=True)
    assert wait_port(port, 30), (folder / "error.log").read_text() if (folder / "error.log").exists() else "no nginx"
    return p


def _run(tmp_path, broker: str, run_id: str, sink_port: int, ca: str, *more: str) -> tuple[int, str]:
    """``flightwatch run examples/http.toml`` at the sink on ``sink_port``: (its exit code, its output)."""
    p = run_example(tmp_path, broker, "http", run_id, dict(SINK_URL=f"https://localhost:{sink_port}/", CA_FILE=ca,
                                                          DROP_TIMEOUT=EXACT_DROP_TIMEOUT, **example_form(1000)[0]), *more)
    out = p.communicate(timeout=300)[0]
    return p.returncode, out


def test_the_http_example_through_a_sink_that_delivers_to_the_receiver_is_exact(broker, certs, tmp_path):
    """1,000/s (``RATE``) for 10 s (``DURATION``), or as the file says (2,000/s for 30 s) with ``EXAMPLES=full``. On the
    2-core machine shared with another broker test, 2,000/s through nginx's TLS to the receiver saturated once in CI
    (the sink's answer p99 1.6 s, 5,909 of 20,000 sends unsent, every one sent received): the product's verdict was
    right, the run no test of exactness. Over HTTPS with the CA the file names: the sink's answer
    (the receiver's, passed back) is the ack latency, the receiver's stamp the flight time; the job's figures exact against the raw telemetry (``assert_exact``,
    with a 5 s drop timeout: counting is deterministic), every receive the user's receiver's, ``ok``, the file's
    thresholds held (exit 0)."""
    rx_port, sink_port = free_port(), free_port()
    create_topic(broker, "tel-https")  # the receiver's telemetry: the run's own topic (``run_example``'s)
    receiver = start_receiver(broker, "tel-https", tmp_path / "spool", rx_port)
    sink = _sink(certs, sink_port, f"127.0.0.1:{rx_port}", tmp_path)
    try:
        code, out = _run(tmp_path, broker, "https", sink_port, certs.ca)
    finally:
        stop_process(sink)
        stop_receiver(receiver)
    log = tmp_path / "error.log"  # nginx's own complaints (its limits) beside the run's, should the run fail
    assert code == 0, out[-3000:] + ("\nnginx: " + log.read_text()[-1500:] if log.exists() else "")
    assert "probe: recorded by receiver-http" in out, out[-3000:]
    root = tmp_path / "checkpoints" / "https"
    s, report = json.load(open(root / "summary.json")), json.load(open(root / "loadgen" / "report.json"))
    records = telemetry(broker, "tel-https", "https")
    _, planned, form = example_form(1000)
    assert_exact(f"examples/http.toml through an HTTPS sink, {form}", s, ground_truth(records), report, planned)
    assert {r["agent"] for r in records if r["kind"] == "recv"} == {"receiver-http"}
    assert s["verdict"]["state"] == "ok", s["verdict"]["message"]
    assert report["success_ratio"] == 1.0 and sum(report["status_codes"].values()) == s["sent"], report["status_codes"]
    assert 0 < report["latency_us"]["p50"]  # the sink's answer: the load generator's own figure, apart from flight


def test_a_sink_that_delivers_elsewhere_is_one_line_and_exit_2_before_the_load(broker, certs, tmp_path):
    """The sink delivers where no receiver of flightwatch's is (its answers are 502s): the probe goes unrecorded, and
    the run ends before its load, in one line naming the target and what to do, exit 2."""
    sink_port = free_port()
    sink = _sink(certs, sink_port, f"127.0.0.1:{free_port()}", tmp_path)
    try:
        code, out = _run(tmp_path, broker, "https-nowhere", sink_port, certs.ca, "--probe-timeout", "5s")
    finally:
        stop_process(sink)
    lines = [line for line in out.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, out[-2000:]
    assert f"error: no receiver recorded the probe sent to https://localhost:{sink_port}/?cafile=" in lines[0]
    assert "must deliver to a receiver of flightwatch's" in lines[0]
    assert not (tmp_path / "checkpoints" / "https-nowhere" / "loadgen" / "report.json").exists()
