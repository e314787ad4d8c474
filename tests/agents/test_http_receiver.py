"""The HTTP receiver agent with its spool and shipper, against the real broker and the real load generator."""
from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections import defaultdict

import pytest
from support import ROOT, create_topic, free_port, health, start_receiver, stop_receiver, telemetry
from support.brokers import sent_of

from core import cloudevents
from core.cloudevents import BadEvent


class Headers(dict):
    def get(self, k, default=None):
        return super().get(k.lower(), default)


@pytest.mark.parametrize("ctype,headers,body,expected", [
    (None, {"ce-id": "e-1", "ce-fwrun": "r"}, b"x", [("e-1", "r")]),
    ("application/octet-stream", {"ce-id": "e-1"}, b"", [("e-1", None)]),
    ("application/cloudevents+json; charset=utf-8", {}, b'{"id":"e-2","fwrun":"r","specversion":"1.0"}', [("e-2", "r")]),
    ("application/cloudevents-batch+json", {}, b'[{"id":"a","fwrun":"r"},{"id":"b"}]', [("a", "r"), ("b", None)]),
])
def test_cloudevents_modes(ctype, headers, body, expected):
    assert cloudevents.parse(ctype, Headers(headers), body) == expected


@pytest.mark.parametrize("ctype,headers,body,reason", [
    (None, {}, b"x", "missing id"),
    (None, {"ce-id": ""}, b"x", "missing id"),
    (None, {"ce-id": "x" * 2000}, b"x", "id too long"),
    ("application/cloudevents+json", {"ce-id": "e"}, b"{not json", "malformed JSON"),
    ("application/cloudevents+json", {}, b'{"id": 5}', "missing id"),
    ("application/cloudevents+json", {}, b'["a"]', "not a JSON object"),
    ("application/cloudevents+json", {}, b"\xff\xfe", "malformed JSON"),
    ("application/cloudevents-batch+json", {}, b"[]", "batch is not a non-empty JSON array"),
    ("application/cloudevents-batch+json", {}, b'[{"id":"a"}, 3]', "not a JSON object"),
])
def test_cloudevents_refused_with_a_reason(ctype, headers, body, reason):
    with pytest.raises(BadEvent) as e:
        cloudevents.parse(ctype, Headers(headers), body)
    assert e.value.reason == reason


def wait_for_receives(broker, topic, run, n, seconds=60) -> list[dict]:
    deadline = time.monotonic() + seconds
    while True:
        recs = [r for r in telemetry(broker, topic, run) if r["kind"] == "recv"]
        if len({r["event_id"] for r in recs}) >= n or time.monotonic() > deadline:
            return recs


@pytest.mark.integration
def test_5000_events_give_exactly_5000_receive_records(broker, tmp_path):
    """Every event the generator sent gets exactly one receive record. The generator, like vegeta, sends
    nothing after its schedule's end, so a stalled machine may send a few short of 5,000 (CI once sent
    4,999; a slow machine 4,887, 113 short at 1,000/s: a flat 1% failed it), bounded by its own send delay
    (``sent_of``); the count to match is the one its report and its send records give."""
    topic, port = "tel-http-5000", free_port()
    create_topic(broker, topic)
    proc = start_receiver(broker, topic, tmp_path / "spool", port)
    runs = {"http-binary": (f"http://127.0.0.1:{port}/", 1000, 4), "http-structured": (f"http+structured://127.0.0.1:{port}/", 500, 2)}
    requests = {}
    try:
        for run, (target, rate, seconds) in runs.items():
            lg = subprocess.run([sys.executable, "-m", "loadgen", "attack", "--quiet", "--rate", str(rate), "--duration",
                                 f"{seconds}s", "--target", target, "--run", run, "--out", str(tmp_path / run),
                                 "--telemetry-bootstrap", broker, "--telemetry-topic", topic],
                                cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True, text=True, timeout=120)
            assert lg.returncode == 0, lg.stderr
            requests[run] = sent_of(json.loads((tmp_path / run / "report.json").read_text()), rate * seconds)
        recs = {run: wait_for_receives(broker, topic, run, requests[run]) for run in runs}
        sends = {run: [r for r in telemetry(broker, topic, run) if r["kind"] == "send"] for run in runs}
        h = health(port)
    finally:
        stop_receiver(proc)
    sent = sum(requests.values())
    assert sent > 0, requests  # short of the 5,000 by at most what fell due within the generator's lateness (sent_of)
    assert sum(len(s) for s in sends.values()) == sent
    assert sum(len(r) for r in recs.values()) == sent  # exactly: no receive lost, none reported twice
    for run in runs:
        assert sorted(r["event_id"] for r in recs[run]) == sorted(s["event_id"] for s in sends[run])
        sent_at = {s["event_id"]: s["at_ns"] for s in sends[run]}
        assert all(0 < r["at_ns"] - sent_at[r["event_id"]] < 5 * 10**9 for r in recs[run])  # stamped after the send, in ns
    assert h["received"] == sent and h["bad_total"] == 0 and h["telemetry"]["lost"] == 0


@pytest.mark.integration
def test_bad_requests_are_answered_400_counted_and_never_crash_it(broker, tmp_path):
    topic, port = "tel-http-bad", free_port()
    create_topic(broker, topic)
    proc = start_receiver(broker, topic, tmp_path / "spool", port)
    try:
        def post(headers, body=b"x"):
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("POST", "/", body=body, headers=headers)
            status = c.getresponse().status
            c.close()
            return status

        assert post({"ce-specversion": "1.0", "ce-fwrun": "bad"}) == 400                       # no event ID
        assert post({"content-type": "application/cloudevents+json"}, b'{"id": "x", ') == 400  # malformed JSON
        assert post({"content-type": "application/cloudevents-batch+json"}, b"{}") == 400
        assert post({"ce-id": "no-run"}) == 202                                                # no run: accepted, unattributed
        for garbage in (b"\x00\x01\x02 garbage\r\n\r\n", b"POST / HTTP/1.1\r\nContent-Length: -5\r\n\r\n",
                        b"POST / HTTP/1.1\r\n" + b"X-Big: " + b"a" * 100_000 + b"\r\n\r\n", b"POST / HTTP/1.1\r\nce-id: a"):
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.sendall(garbage)
                s.shutdown(socket.SHUT_WR)
                try:
                    s.recv(4096)
                except OSError:
                    pass
        assert post({"ce-id": "good-1", "ce-fwrun": "bad"}) == 202  # still serving
        assert proc.poll() is None
        h = health(port)
        recs = wait_for_receives(broker, topic, "bad", 1, seconds=30)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            metrics = r.read().decode()
    finally:
        stop_receiver(proc)
    assert h["bad"] == {"missing id": 1, "malformed JSON": 1, "batch is not a non-empty JSON array": 1}
    assert h["unattributed"] == 1 and h["received"] == 1
    assert [r["event_id"] for r in recs] == ["good-1"]
    # /metrics with telemetry on (the spool's counters too) is Prometheus text that its own parser reads whole
    from prometheus_client.parser import text_string_to_metric_families

    families = list(text_string_to_metric_families(metrics))
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families for s in f.samples}
    agent = ("agent", h["agent"])
    assert samples[("flightwatch_receiver_events_total", (agent,))] == 1
    assert samples[("flightwatch_receiver_bad_requests_total", (agent, ("reason", "missing id")))] == 1
    assert samples[("flightwatch_receiver_spool_over_budget", (agent,))] == 0
    assert samples[("flightwatch_receiver_telemetry_records_total", (agent, ("state", "spooled")))] == 1
    types = {f.name: f.type for f in families}
    assert types["flightwatch_receiver_requests"] == "counter" and types["flightwatch_receiver_telemetry_records"] == "counter"
    assert all(f.documentation for f in families)  # HELP on every one
    lint = subprocess.run(["promtool", "check", "metrics"], input=metrics, capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout + lint.stderr


@pytest.mark.integration
@pytest.mark.faults
def test_kill_9_of_receiver_and_shipper_loses_and_doubles_nothing(broker, tmp_path):
    """Every event answered 202 is reported exactly once, across a kill -9 of the receiver's process group."""
    topic, port, spool = "tel-http-kill", free_port(), tmp_path / "spool"
    create_topic(broker, topic)
    proc = start_receiver(broker, topic, spool, port)
    accepted, attempted = [], []
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)

    def send(i):
        nonlocal conn
        eid = f"k-{i}"
        attempted.append(eid)
        try:
            conn.request("POST", "/", body=b"x" * 64, headers={"ce-id": eid, "ce-fwrun": "kill"})
            resp = conn.getresponse()
            resp.read()
            if resp.status == 202:
                accepted.append(eid)
        except (OSError, http.client.HTTPException):
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)

    try:
        for i in range(3000):
            send(i)
        os.killpg(proc.pid, signal.SIGKILL)  # receiver and its shipper, mid-stream
        proc.wait()
        for i in range(3000, 3100):  # refused while it is down
            send(i)
        proc = start_receiver(broker, topic, spool, port)
        for i in range(3100, 6000):
            send(i)
        recs = wait_for_receives(broker, topic, "kill", len(accepted))
    finally:
        stop_receiver(proc)
    times = defaultdict(set)
    for r in recs:
        times[r["event_id"]].add(r["at_ns"])
    assert len(accepted) >= 5800
    assert set(accepted) <= set(times) <= set(attempted)       # nothing answered 202 is lost
    assert all(len(t) == 1 for t in times.values())             # a repeat is an identical re-send, never a second receive


def _scrape(port) -> dict:
    """{(sample name, sorted labels): value} of one scrape, read by prometheus-client's own parser."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


@pytest.mark.integration
def test_every_scrape_shows_every_worker_and_shipper(broker, tmp_path):
    """With --workers 2 the kernel hands each connection, scrapes too, to either worker. Through prometheus-client's
    multi-process files every scrape shows both workers' and both shippers' series, and once they have synced
    (each does once a second) the events sum to what was sent and the shippers have shipped as many records."""
    topic, port = "tel-http-workers", free_port()
    create_topic(broker, topic)
    proc = start_receiver(broker, topic, tmp_path / "spool", port, "--workers", "2")
    try:
        lg = subprocess.run([sys.executable, "-m", "loadgen", "attack", "--quiet", "--rate", "500", "--duration", "2s",
                             "--target", f"http://127.0.0.1:{port}/", "--run", "workers", "--out", str(tmp_path / "lg"),
                             "--telemetry-bootstrap", broker, "--telemetry-topic", topic, "--metrics-listen", "none"],
                            cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True, text=True, timeout=120)
        assert lg.returncode == 0, lg.stderr
        sent = json.loads((tmp_path / "lg" / "report.json").read_text())["requests"]
        wait_for_receives(broker, topic, "workers", sent)
        time.sleep(2.5)  # every process has synced its counters since
        scrapes = [_scrape(port) for _ in range(12)]
    finally:
        stop_receiver(proc)
    agents = ("receiver-http-0", "receiver-http-1")
    for s in scrapes:
        events = {a: s.get(("flightwatch_receiver_events_total", (("agent", a),))) for a in agents}
        shipped = {a: s.get(("flightwatch_shipper_records_total", (("agent", a),))) for a in agents}
        assert None not in events.values() and None not in shipped.values(), (events, shipped)
        assert sum(events.values()) == sent, (events, sent)
        assert sum(shipped.values()) == sent, (shipped, sent)  # one receive record an event (no clock records here)
