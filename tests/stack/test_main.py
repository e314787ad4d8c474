"""`make up` / `make down`: the embedded stack on loopback, idempotent, stopped by recorded PID."""
import json
import os
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest
from support import ROOT, free_port

from core.procs import port_open

pytestmark = pytest.mark.integration


def stack(cmd, env):
    return subprocess.run([sys.executable, "-m", "stack", cmd], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_up_is_idempotent_and_down_stops_what_up_started(tmp_path):
    ports = {k: free_port() for k in ("TELEMETRY", "SUT", "PROMETHEUS", "NODE_EXPORTER", "RECEIVER", "UI")}
    env = dict(os.environ, FLIGHTWATCH_STACK_DIR=str(tmp_path), PYTHONPATH=ROOT,
               FLIGHTWATCH_CLOCK_PORT=str(free_port()), **{f"FLIGHTWATCH_{k}_PORT": str(v) for k, v in ports.items()})
    first = stack("up", env)
    try:
        assert first.returncode == 0, first.stdout + first.stderr
        for _name, key in (("telemetry-broker", "TELEMETRY"), ("sut-broker", "SUT"), ("prometheus", "PROMETHEUS"),
                          ("node-exporter", "NODE_EXPORTER"), ("http-receiver", "RECEIVER"), ("ui", "UI")):
            assert f"127.0.0.1:{ports[key]}" in first.stdout and "started" in first.stdout, first.stdout
        pids = {p.stem: int(p.read_text().split()[0]) for p in tmp_path.glob("*.pid")}
        assert len(pids) == 8
        assert json.loads((tmp_path / "addresses.json").read_text())["telemetry-broker"] == f"127.0.0.1:{ports['TELEMETRY']}"
        assert (tmp_path / "sut").read_text() == "tansu\n"  # remembered for the commands after, until `down`
        again = stack("up", env)
        assert again.returncode == 0 and again.stdout.count("running") == 8
        assert {p.stem: int(p.read_text().split()[0]) for p in tmp_path.glob("*.pid")} == pids
        # Prometheus scrapes the node exporter on loopback (1 s interval)
        url = f"http://127.0.0.1:{ports['PROMETHEUS']}/api/v1/query?query=node_vmstat_oom_kill"
        deadline = time.monotonic() + 30
        while True:
            result = json.loads(urllib.request.urlopen(url, timeout=5).read())["data"]["result"]
            if result or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert result and float(result[0]["value"][1]) >= 0
        # every server the stack started, and every process they started, listens on loopback only (TCP and UDP)
        from support.sockets import descendants, is_loopback, listening

        bound = listening(descendants(pids.values()))
        assert len(bound["tcp"]) >= 6 and bound["udp"], bound  # six servers, and the clock reference (UDP)
        assert [a for a in bound["tcp"] + bound["udp"] if not is_loopback(a)] == [], bound
        # the HTTP receiver takes a CloudEvent
        req = urllib.request.Request(f"http://127.0.0.1:{ports['RECEIVER']}/", data=b"x", method="POST",
                                     headers={"ce-id": "stack-1", "ce-fwrun": "stack"})
        assert urllib.request.urlopen(req, timeout=5).status == 202
        # renew-sut (before each `make attack` on the embedded SUT): the SUT broker restarts empty, with the Kafka
        # receiver on it afresh; nothing else is touched
        from kafka import KafkaProducer

        producer = KafkaProducer(bootstrap_servers=f"127.0.0.1:{ports['SUT']}")
        producer.send("flightwatch.sut", b"held").get(timeout=30)
        producer.close()
        renewed = stack("renew-sut", env)
        assert renewed.returncode == 0, renewed.stdout + renewed.stderr
        after = {p.stem: int(p.read_text().split()[0]) for p in tmp_path.glob("*.pid")}
        assert {k for k in pids if after[k] != pids[k]} == {"sut-broker", "kafka-receiver"}, (pids, after)
        from confluent_kafka import Consumer, TopicPartition

        c = Consumer({"bootstrap.servers": f"127.0.0.1:{ports['SUT']}", "group.id": "renew-check"})
        assert all(c.get_watermark_offsets(TopicPartition("flightwatch.sut", p), timeout=10)[1] == 0 for p in (0, 1))
        c.close()
        pids = after
    finally:
        down = stack("down", env)
    assert down.returncode == 0 and down.stdout.count("stopped") == 8 and not (tmp_path / "sut").exists()
    for pid in pids.values():
        assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"


def test_up_without_a_sut_starts_no_sut_broker_and_the_sut_up_started_is_the_default_until_down(tmp_path):
    """`make attack TARGET=...` runs `stack up --no-sut`: the telemetry plane, no SUT broker nor its receiver. After
    `make up SUT=kafka` (recorded in the stack's folder), the load generator aims at Apache Kafka's default topic
    without being told, and `stack up` keeps that SUT, until `down`."""
    ports = {k: free_port() for k in ("TELEMETRY", "SUT", "PROMETHEUS", "NODE_EXPORTER", "RECEIVER", "UI", "KAFKA")}
    env = dict(os.environ, FLIGHTWATCH_STACK_DIR=str(tmp_path), PYTHONPATH=ROOT, FLIGHTWATCH_CLOCK_PORT=str(free_port()),
               **{f"FLIGHTWATCH_{k}_PORT": str(v) for k, v in ports.items()})
    env.pop("FLIGHTWATCH_SUT", None)
    plane = subprocess.run([sys.executable, "-m", "stack", "up", "--no-sut"], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=120)
    try:
        assert plane.returncode == 0, plane.stdout + plane.stderr
        started = {p.stem for p in tmp_path.glob("*.pid")}
        assert "telemetry-broker" in started and not started & {"sut-broker", "kafka-receiver", "kafka", "rabbitmq"}
        assert not (tmp_path / "sut").exists() and not port_open(ports["SUT"])
    finally:
        assert stack("down", env).returncode == 0
    (tmp_path / "sut").write_text("kafka\n")  # as `python -m stack up --sut kafka` leaves it
    aimed = subprocess.run([sys.executable, "-m", "loadgen", "attack", "--rate", "10", "--duration", "1s",
                            "--no-telemetry", "--wait", "0s"], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=60)
    assert aimed.returncode == 2 and f"kafka://127.0.0.1:{ports['KAFKA']}/flightwatch.sut" in aimed.stderr, aimed.stderr
    told = subprocess.run([sys.executable, "-m", "loadgen", "attack", "--rate", "10", "--duration", "1s", "--sut", "tansu",
                           "--no-telemetry", "--wait", "0s"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=60)
    assert f"kafka://127.0.0.1:{ports['SUT']}/flightwatch.sut" in told.stderr, told.stderr
    refused = subprocess.run([sys.executable, "-m", "stack", "status", "--no-sut"], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1 and "--no-sut is for up" in refused.stderr


def test_prometheus_scrapes_every_flightwatch_process_during_an_attack(tmp_path):
    """`make up`'s real Prometheus (1 s scrapes) during an attack into the stack's HTTP receiver, with the streaming
    job live: `up` is 1 for every flightwatch target at once (receiver, Kafka receiver, node-metrics agent, job,
    load generator), and the receiver's and the load generator's counters are readable through Prometheus."""
    ports = {k: free_port() for k in ("TELEMETRY", "SUT", "PROMETHEUS", "NODE_EXPORTER", "RECEIVER", "UI",
                                      "KAFKA_RECEIVER_METRICS", "NODE_METRICS")}
    job_port, loadgen_port = free_port(), free_port()
    env = dict(os.environ, FLIGHTWATCH_STACK_DIR=str(tmp_path / "stack"), PYTHONPATH=ROOT,
               FLIGHTWATCH_CLOCK_PORT=str(free_port()), **{f"FLIGHTWATCH_{k}_PORT": str(v) for k, v in ports.items()},
               FLIGHTWATCH_JOB_METRICS_LISTEN=f"127.0.0.1:{job_port}", FLIGHTWATCH_LOADGEN_METRICS_LISTEN=f"127.0.0.1:{loadgen_port}")
    # the stack writes Prometheus' targets from these, as `make up` does
    up = stack("up", env)
    job = None
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        telemetry = f"127.0.0.1:{ports['TELEMETRY']}"
        job = subprocess.Popen([sys.executable, "-m", "streaming", "run", "--run", "scraped", "--bootstrap", telemetry,
                                # a drop timeout longer than the board's wait: the job (and its series) are still up
                                # when a busy machine settles its first window after the attack has ended
                                "--checkpoints", str(tmp_path / "runs"), "--drop-timeout", "180s"],
                               cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=open(tmp_path / "job.log", "wb"),
                               start_new_session=True)
        from core.procs import wait_port

        assert wait_port(job_port, 120), "the job did not serve its metrics"
        attack = subprocess.Popen([sys.executable, "-m", "loadgen", "attack", "--quiet", "--rate", "200", "--duration", "12s",
                                   "--target", f"http://127.0.0.1:{ports['RECEIVER']}/", "--run", "scraped",
                                   "--out", str(tmp_path / "lg"), "--telemetry-bootstrap", telemetry],
                                  cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        jobs = {"flightwatch-receiver", "flightwatch-kafka-receiver", "flightwatch-node-metrics", "flightwatch-job",
                "flightwatch-loadgen"}

        def query(q):
            url = f"http://127.0.0.1:{ports['PROMETHEUS']}/api/v1/query?" + urllib.parse.urlencode({"query": q})
            return json.loads(urllib.request.urlopen(url, timeout=5).read())["data"]["result"]

        seen, all_up, sent, received = {}, False, 0.0, 0.0

        def value(q):
            return max((float(r["value"][1]) for r in query(q)), default=0.0)

        while attack.poll() is None and not (all_up and sent > 0 and received > 0):
            seen = {r["metric"]["job"]: float(r["value"][1]) for r in query('up{job=~"flightwatch-.*"}')}
            all_up = all_up or all(seen.get(j) == 1 for j in jobs)
            # the run's ID is on the info metric alone: a run's series are found by joining on it
            sent = value('flightwatch_loadgen_requests_total{outcome="sent"} * on(job, instance, sender) '
                         'group_left(run) flightwatch_loadgen_info{run="scraped"}')
            received = value("flightwatch_receiver_events_total")
            time.sleep(0.5)
        # CI, three workers on two cores: the job settled no window within 30 s of the attack's first events
        board = board_results(query, "scraped", wait_s=120.0)
        assert attack.wait(60) == 0, attack.stderr.read()
    finally:
        if job is not None:
            os.killpg(job.pid, 15)
            job.wait(60)
        stack("down", env)
    assert all_up, seen
    assert sent > 0 and received > 0, (sent, received)
    # every query of the Grafana board ran against the real Prometheus, found the live run by its ID, and the
    # figures the job always has (verdict, in flight, flight time, throughput, loss) were there
    for title in ("Verdict", "In flight", "Gap windows", "Flight time, latest settled window", "Throughput", "Loss"):
        assert board.get(title), (title, board, (tmp_path / "job.log").read_text(errors="replace")[-3000:])
    assert all(r["metric"].get("run") == "scraped" for rs in board.values() for r in rs
               if "state" not in r["metric"] and "run" in r["metric"]), board


def board_results(query, run: str, wait_s: float = 30.0) -> dict[str, list]:
    """{panel title: the results of its queries} of the Grafana board (``$run`` = ``run``), once its flight-time
    panel has a value (a settled window, which on a busy machine may come after the attack has ended) or ``wait_s``
    have passed; every query must be valid PromQL."""
    dash = json.loads(open(os.path.join(ROOT, "deploy", "base", "grafana", "flightwatch.json")).read())
    targets = [(p["title"], t["expr"].replace("$run", run)) for p in dash["panels"] for t in p["targets"]]
    flight = next(e for title, e in targets if title.startswith("Flight time"))
    deadline = time.time() + wait_s
    while not query(flight) and time.time() < deadline:
        time.sleep(0.5)
    out: dict[str, list] = {}
    for title, expr in targets:
        out.setdefault(title, []).extend(query(expr))
    return out
