"""The load generator against real loopback targets, with its telemetry in a real broker."""
from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from hdrh.log import HistogramLogReader
from support import ROOT, answers, create_topic, free_port, script, telemetry

from core import histogram
from core.contract import SEND_HOLD_NS
from core.pacer import NS_PER_S, Schedule
from core.procs import wait_port

pytestmark = pytest.mark.integration


@pytest.fixture
def sink():
    """Start an HTTP sink (optionally slow); yields a factory returning its URL."""
    procs = []

    def start(delay_s: float = 0.0) -> str:
        port = free_port()
        p = subprocess.Popen([sys.executable, script("http_sink.py"), str(port), str(delay_s)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        procs.append(p)
        assert wait_port(port)
        return f"http://127.0.0.1:{port}/"

    yield start
    for p in procs:
        os.kill(p.pid, signal.SIGTERM)
        p.wait(10)


def attack(*args, timeout=180):
    return subprocess.run([sys.executable, "-m", "loadgen", "attack", "--quiet", *args], cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True, text=True, timeout=timeout)


@pytest.mark.serial  # how late sends go out is the generator's timing: the machine to itself
def test_rate_accuracy_intended_times_and_telemetry_match_the_report(sink, broker, tmp_path):
    url = sink()
    topic = "lg-telemetry-rate"
    create_topic(broker, topic)
    proc = attack("--rate", "2000", "--duration", "10s", "--target", url, "--run", "rate", "--out", str(tmp_path),
                  "--telemetry-bootstrap", broker, "--telemetry-topic", topic)
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert abs(report["requests"] - 20_000) <= 200 and report["success_ratio"] == 1.0
    recs = telemetry(broker, topic, "rate")
    sends = [r for r in recs if r["kind"] == "send"]
    acks = answers(recs)
    # the telemetry matches the report exactly; every send has one answer, and those that came within the hold are
    # written with their send (a 202 from the sink on loopback, all but a few)
    assert len(sends) == report["requests"] and len(acks) == report["completed"] == report["requests"]
    assert len({a["event_id"] for a in acks}) == len(acks)
    assert sum(1 for r in recs if r["kind"] == "ack") <= len(sends) // 100
    # a sender's lines in the order they were written: a line written at t (an answer) comes after every send stamped
    # before t - SEND_HOLD_NS (streaming.run_rules.written_through: the job's progress rule)
    for agent in {r["agent"] for r in sends}:
        lines = [r for r in recs if r["agent"] == agent and r["kind"] in ("send", "ack")]
        stamps = np.array([r["at_ns"] for r in lines if r["kind"] == "send"])
        seen = np.cumsum([r["kind"] == "send" for r in lines])
        for i, r in enumerate(lines):
            written = r["at_ns"] if r["kind"] == "ack" else r.get("acked_at_ns")
            if written is not None:
                assert seen[i] >= int((stamps < written - SEND_HOLD_NS).sum()), (agent, i, r)
    assert sum(1 for a in acks if a.get("error") or not 200 <= a.get("status", 0) < 300) == sum(report["errors"].values())
    assert {r["kind"] for r in recs} >= {"run_start", "run_stop"}
    # intended send times are exactly the schedule's, from the run start
    start = report["start_ns"]
    sched = Schedule.constant(2000, 10 * NS_PER_S)
    k = np.array([int(s["event_id"].rsplit("-", 1)[1]) for s in sends])
    intended = np.array([s["intended_at_ns"] for s in sends])
    expected = np.array([start + sched.intended_ns(int(i)) for i in k])
    assert (intended == expected).all()
    # per-second sent counts after the first second: the median within 1% of 2,000. A second the machine
    # stalls the generator sends its backlog in the next (CI saw 1,807 then 2,289), so single seconds are
    # judged by how late their sends went out: half within 5 ms of their intended time, 99% within 250 ms
    sent_at = np.array([s["at_ns"] for s in sends])
    per_second = np.bincount((sent_at - start) // NS_PER_S)[:10]
    assert abs(np.median(per_second[1:]) - 2000) <= 20, per_second.tolist()
    late_ms = (sent_at - intended) / 1e6
    assert (late_ms > -1).all() and np.percentile(late_ms, 50) <= 5 and np.percentile(late_ms, 99) <= 250, \
        (np.percentile(late_ms, [50, 90, 99, 100]).tolist(), per_second.tolist())
    # the .hlog round-trips through hdrh's reader with every completed request in it
    reader = HistogramLogReader(str(tmp_path / "latency.hlog"), histogram.new_hdr())
    total, n = 0, 0
    while (h := reader.get_next_interval_histogram()) is not None:
        total += h.get_total_count()
        n += 1
    assert total == report["completed"] and n >= 10


def test_paced_steps_produce_each_steps_rate(sink, broker, tmp_path):
    url = sink()
    proc = attack("--pace", "500:3,1500:3", "--target", url, "--run", "paced", "--out", str(tmp_path), "--no-telemetry")
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    # sends still due when the schedule ends are not sent late (as in vegeta): a loaded machine (make test runs three
    # workers on two cores) may miss a few, at most 1% (how fast the generator is on a machine of its own: bench.loadgen)
    assert 0 <= 500 * 3 + 1500 * 3 - report["requests"] == report["unsent"] <= 60
    per_second = [iv["sent"] for iv in report["intervals"]][:6]
    # sends are counted in the second they went out: a stall of a busy machine moves a few late ones into the next
    # second (CI: 1417, 1582, 1500), so each step's total is held to 2% and each second to 10%
    steps = sum(per_second[:3]), sum(per_second[3:6])
    assert abs(steps[0] - 1500) <= 30 and abs(steps[1] - 4500) <= 90, per_second
    assert all(abs(n - 500) <= 50 for n in per_second[:3]) and all(abs(n - 1500) <= 150 for n in per_second[3:6]), per_second


def test_a_stalled_target_shows_growing_send_delay_not_a_lower_rate(sink, tmp_path):
    url = sink(delay_s=1.0)  # every answer takes 1 s; 2 workers x 20 in flight = at most 40/s
    proc = attack("--rate", "200", "--duration", "4s", "--target", url, "--workers", "2", "--max-inflight", "20",
                  "--run", "stall", "--out", str(tmp_path), "--no-telemetry", timeout=120)
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    # at most 40/s get out; the shortfall is reported, and the delay of what went out grows
    assert report["requests"] < 200 and report["requested_rate_per_sec"] == 200
    delays = [iv["send_delay_p99_us"] for iv in report["intervals"] if iv["sent"]]
    assert delays[-1] > 2 * 1_000_000 and delays[-1] > delays[1] > delays[0]  # seconds behind by the end, growing
    assert "loadgen saturated: achieved" in proc.stdout and len(report["loadgen_bound_seconds"]) >= 3
    # what was still due at the end is not sent late, but said: counted, in the text report and on stderr
    assert report["scheduled"] == 800 and report["unsent"] == 800 - report["requests"] > 600
    assert f"Unsent        [due at the end, of scheduled]    {report['unsent']}, 800" in proc.stdout
    assert f"{report['unsent']:,} of 800 scheduled sends were still due when the schedule ended" in proc.stderr


def test_the_connection_pool_shrinks_back_after_a_stall(monkeypatch):
    """A stall opens one connection per outstanding request; once the target is fast again, the
    pool (and the target's side) gets back to what the rate needs instead of keeping them all warm."""
    import asyncio

    from aiohttp import web

    from transports.http import client as http

    monkeypatch.setattr(http, "IDLE_TIMEOUT_S", 1.0)
    head = b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 2\r\n\r\n"

    async def scenario():
        delay = {"s": 0.3}

        async def handle(request):
            await request.read()
            await asyncio.sleep(delay["s"])
            return web.Response(status=202)

        server = web.Server(handle)
        port = free_port()
        srv = await asyncio.get_running_loop().create_server(server, "127.0.0.1", port, backlog=1024)
        pool = http.HttpPool("127.0.0.1", port, max_connections=200, timeout_s=5)
        pool.start()
        try:
            stalled = await asyncio.gather(*(pool.request(head, b"{}") for _ in range(150)))
            during = len(pool.all), len(server.connections)
            delay["s"] = 0.0
            for _ in range(60):  # one request at a time for 3 s: a single connection suffices
                assert await pool.request(head, b"{}") == (202, None)
                await asyncio.sleep(0.05)
            return stalled, during, (len(pool.all), len(server.connections))
        finally:
            await pool.close()
            srv.close()
            await server.shutdown(1)

    stalled, during, after = asyncio.run(scenario())
    assert stalled == [(202, None)] * 150
    assert during == (150, 150)
    assert after == (1, 1), after


def test_answers_framed_by_length_chunked_or_close_keep_their_connection_as_they_should():
    """The client reads each answer's framing: chunked (with an extension and a trailer) and Content-Length
    answers leave the connection for the next request; ``Connection: close`` ends it; a malformed chunk
    size fails that request and closes its connection, never the client."""
    import asyncio

    from transports.http import client as http

    answers = [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;x=1\r\nabc\r\n0\r\nT: 1\r\n\r\n",
               b"HTTP/1.1 202 Accepted\r\nContent-Length: 2\r\n\r\nok",
               b"HTTP/1.1 201 Created\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
               b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
               b"HTTP/1.1 204 No Content\r\n\r\n"]
    accepted = []

    async def scenario():
        async def serve(reader, writer):
            accepted.append(writer)
            while answers:
                try:
                    await reader.readuntil(b"\r\n\r\n")
                    await reader.readexactly(2)
                except asyncio.IncompleteReadError:  # the client closed this connection
                    break
                writer.write(answers.pop(0))

        port = free_port()
        srv = await asyncio.start_server(serve, "127.0.0.1", port)
        pool = http.HttpPool("127.0.0.1", port, max_connections=1, timeout_s=5)
        pool.start()
        head = b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 2\r\n\r\n"
        try:
            return [await pool.request(head, b"{}") for _ in range(5)]
        finally:
            await pool.close()
            srv.close()

    got = asyncio.run(scenario())
    assert [status for status, _ in got] == [200, 202, 201, None, 204], got
    assert len(accepted) == 3  # a new connection after the close and after the malformed answer


def test_a_target_that_dies_mid_run_is_reported_not_a_crash(tmp_path):
    port = free_port()
    # The sink says when it has answered 100 sends (half a second at 200/s): killed then, whatever the machine's
    # speed, the run has successes before and failures after (a fixed sleep once killed it before the first send).
    sink = subprocess.Popen([sys.executable, script("http_sink.py"), str(port), "0", "100"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True, text=True)
    assert wait_port(port)
    proc = subprocess.Popen([sys.executable, "-m", "loadgen", "attack", "--rate", "200", "--duration", "4s", "--target",
                             f"http://127.0.0.1:{port}/", "--no-telemetry", "--out", str(tmp_path), "--timeout", "2s"],
                            cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ready, _, _ = select.select([sink.stdout], [], [], 60)
    assert ready and sink.stdout.readline().strip() == "served 100", "the sink never answered 100 sends"
    os.kill(sink.pid, signal.SIGKILL)
    sink.wait()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["requests"] + report["unsent"] == 800 and report["unsent"] <= 8  # a busy machine: 1% left due at most
    assert report["completed"] == report["requests"]
    assert 0 < report["success_ratio"] < 1
    assert set(report["errors"]) <= {"connection refused", "connection reset", "server disconnected", "timeout"}
    assert sum(report["errors"].values()) == report["requests"] - report["status_codes"]["202"]
    assert "Error Set:" in out and "connection refused" in out


@pytest.mark.parametrize("args,words", [
    (["--rate", "abc"], "bad rate"),
    (["--rate", "-5"], "out of range"),
    (["--rate", "0"], "out of range"),
    (["--pace", "1000:60,banana"], "bad pace step"),
    (["--rate", "10", "--pace", "10:1"], "exactly one"),
    (["--rate", "10", "--duration", "soon"], "bad duration"),
    (["--rate", "10", "--target", "ftp://x/"], "bad target"),
    (["--rate", "10", "--fail-on", "p99 is big"], "bad --fail-on"),
    (["--rate", "10", "--fail-on", "p99>5ms for 0s"], "at least 1s"),
    (["--rate", "10", "--fail-on", "loss>0.1%"], "needs --stream"),
    (["--rate", "10", "--abort-on", "loss>1%"], "use it with --fail-on"),
    (["--rate", "10", "--abort-on", "p99>5%"], "us, ms or s"),
    (["--rate", "10", "--bogus"], "unrecognized"),
    (["--rate", "10", "--shard", "2/2", "--run", "r"], "bad --shard"),
    (["--rate", "10", "--shard", "one/two", "--run", "r"], "bad --shard"),
    (["--rate", "10", "--shard", "0/2"], "needs --run"),
    (["--rate", "10", "--duration", "1m30"], "bad duration"),
    (["--rate", "10", "--fail-on", "loss>1"], "a bare 1 is read as a ratio"),
    (["--rate", "10", "--target", "kafka://127.0.0.1:9/t", "--kafka-option", "acks"], "bad --kafka-option 'acks'"),
    (["--rate", "10", "--target", "kafka://127.0.0.1:9/t", "--kafka-option", "max_flights=3"], "not a librdkafka property"),
    (["--rate", "10", "--target", "http://127.0.0.1:9/", "--kafka-option", "acks=1"], "the target is http://"),
    (["--rate", "10", "--fail-on-regression", "p99>+10%"], "--fail-on-regression needs --baseline RUN"),
    (["--rate", "10", "--baseline", "some-run"], "--baseline needs --stream"),
    (["--rate", "10", "--duration", "10s", "--warmup", "8s", "--cooldown", "2s"], "leave nothing of the 10 s schedule"),
    (["--rate", "10", "--warmup", "a while"], "--warmup/--cooldown: bad duration"),
])
def test_bad_input_is_one_line_and_exit_2(args, words):
    proc = attack(*args, "--no-telemetry", timeout=30)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and words in lines[0], proc.stderr


@pytest.mark.parametrize("args,words", [
    (["--baseline", "base"], "--baseline base is another test: it attacked kafka:// paced 100:10, this run attacks "
                             "kafka:// paced 10:10"),
    (["--baseline", "nope"], "--baseline: no run 'nope'"),
    (["--baseline", "base", "--fail-on-regression", "p99>10ms"], "bad --fail-on-regression 'p99>10ms'"),
])
def test_a_baseline_that_cannot_be_compared_is_refused_before_the_attack(tmp_path, args, words):
    """``--baseline`` is checked before anything starts: a finished run of the same schedule and target kind."""
    from bench.compare import build_run, spec_for

    if not (tmp_path / "base").exists():
        build_run(str(tmp_path / "base"), spec_for("base", 1, 10, 100))  # kafka://, paced 100:10
    proc = subprocess.run([sys.executable, "-m", "loadgen", "attack", "--rate", "10", "--duration", "10s", "--stream",
                           "--no-telemetry", *args], cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=ROOT, FLIGHTWATCH_CHECKPOINTS=str(tmp_path)),
                          capture_output=True, text=True, timeout=60)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and words in lines[0], proc.stderr


def test_streaming_into_a_run_that_has_results_is_exit_2(tmp_path):
    """Its job would resume the old run's checkpoint and archive (seen: a crash on a snapshot of an older version)."""
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "run.json").write_text("{}")
    proc = subprocess.run([sys.executable, "-m", "loadgen", "attack", "--rate", "10", "--run", "taken", "--stream",
                           "--no-telemetry"], cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT, FLIGHTWATCH_CHECKPOINTS=str(tmp_path)),
                          capture_output=True, text=True, timeout=30)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "run taken already has results in" in lines[0], proc.stderr


def test_unreachable_target_is_exit_2():
    proc = attack("--rate", "10", "--target", f"http://127.0.0.1:{free_port()}/", "--no-telemetry", "--wait", "0s", timeout=30)
    assert proc.returncode == 2 and "unreachable" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_a_target_still_unreachable_when_the_wait_ends_is_one_line_and_exit_2():
    t0 = time.monotonic()
    proc = attack("--rate", "10", "--target", f"http://127.0.0.1:{free_port()}/", "--no-telemetry", "--wait", "3s", timeout=30)
    took = time.monotonic() - t0
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "unreachable" in lines[0] and "after waiting 3s" in lines[0], proc.stderr
    waits = [x for x in proc.stdout.splitlines() if x.startswith("loadgen: waiting for target")]
    assert 3 <= len(waits) <= 4 and 3.0 <= took < 15, (took, proc.stdout)  # tries at 0, 0.5, 1.5 and 3 s


def test_a_load_generator_started_before_its_target_and_broker_waits_then_attacks(tmp_path):
    """As on a cluster that is still starting: nothing listens yet; the receiver and the broker appear 3 s later."""
    from core.procs import stop_process
    from stack.tansu import start_tansu

    target_port, broker_port = free_port(), free_port()
    lg = subprocess.Popen([sys.executable, "-m", "loadgen", "attack", "--quiet", "--rate", "200", "--duration", "2s",
                           "--target", f"http://127.0.0.1:{target_port}/", "--run", "late", "--out", str(tmp_path),
                           "--telemetry-bootstrap", f"127.0.0.1:{broker_port}", "--telemetry-topic", "lg-late",
                           "--wait", "60s"], cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(3)
    assert lg.poll() is None, lg.communicate()  # still waiting
    broker = start_tansu(broker_port, open(tmp_path / "tansu.log", "wb"), "flightwatch-late")
    create_topic(f"127.0.0.1:{broker_port}", "lg-late")  # before the target: the generator waits for both
    sink = subprocess.Popen([sys.executable, script("http_sink.py"), str(target_port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        out, err = lg.communicate(timeout=120)
        sends = [r for r in telemetry(f"127.0.0.1:{broker_port}", "lg-late", "late") if r["kind"] == "send"]
    finally:
        stop_process(sink)
        stop_process(broker)
    report = json.loads((tmp_path / "report.json").read_text())
    assert lg.returncode == 0, err
    assert "waiting for target" in out and "telemetry broker" in out
    assert report["requests"] + report["unsent"] == 400 and report["unsent"] <= 4  # a busy machine: 1% left due at most
    assert report["success_ratio"] == 1.0 and len(sends) == report["requests"]


def test_fail_on_threshold_gives_exit_1(sink, tmp_path):
    proc = attack("--rate", "50", "--duration", "2s", "--target", sink(), "--no-telemetry", "--out", str(tmp_path),
                  "--fail-on", "p99>0.001ms", "--fail-on", "success<99%")
    assert proc.returncode == 1 and "threshold crossed: p99" in proc.stderr and "success" not in proc.stderr


def test_sustained_fail_on_and_abort_on_give_their_exit_codes(sink, tmp_path):
    slow = sink(0.1)  # every answer takes 100 ms
    held = attack("--rate", "50", "--duration", "4s", "--target", slow, "--no-telemetry", "--out", str(tmp_path / "a"),
                  "--fail-on", "p99>50ms for 3s", "--fail-on", "p99>50ms for 30s")
    assert held.returncode == 1 and "threshold crossed: p99>50ms for 3s (from 0 s)" in held.stderr
    assert "for 30s" not in held.stderr  # never held that long
    started = time.monotonic()
    aborted = attack("--rate", "50", "--duration", "30s", "--target", slow, "--no-telemetry", "--out", str(tmp_path / "b"),
                     "--abort-on", "p99>50ms for 2s", "--fail-on", "p99>50ms")
    assert aborted.returncode == 3, aborted.stderr
    assert "aborted by --abort-on 'p99>50ms for 2s' at 1 s" in aborted.stderr
    assert time.monotonic() - started < 20  # stopped long before its 30 s
    report = json.load(open(tmp_path / "b" / "report.json"))
    assert report["requests"] < 50 * 6


@pytest.mark.serial  # a stamp-to-arrival median in µs, and 5,000/s from one worker: the machine to itself
@pytest.mark.parametrize("rate", [1000, 5000])
def test_the_send_stamp_is_taken_where_the_event_leaves(broker, tmp_path, rate):
    """A sink stamps each event's arrival with the same clock: arrival minus the send record's stamp is never
    negative (the stamp is not taken after the bytes left) and at most 500 µs at the median (it is not taken
    long before: a stamp at the intended time, or before a wait for a connection or the generator's next 2 ms
    loop turn, puts the median near the send delay's, about 1 ms).

    Only the median is bounded: the tail is the receiving kernel's. On a busy machine loopback's receive work
    is deferred (ksoftirqd) and the sink's kernel stamp comes late: instrumented, every gap over 1 ms had its
    send call return 6 µs (median) after the stamp and the arrival stamp 1.7 ms after that; with one CPU hog
    beside it p99 went to 7.2 ms while the median stayed at 293 µs (CI: p50 224 µs, p99 3.0 ms)."""
    port, topic, run_id = free_port(), f"lg-stamp-{rate}", f"stamp{rate}"
    create_topic(broker, topic)
    out = tmp_path / "arrivals.txt"
    p = subprocess.Popen([sys.executable, script("stamp_sink.py"), str(port), str(out)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        assert wait_port(port)
        proc = attack("--rate", str(rate), "--duration", "4s", "--target", f"http://127.0.0.1:{port}/", "--run", run_id,
                      "--out", str(tmp_path / "lg"), "--telemetry-bootstrap", broker, "--telemetry-topic", topic)
        assert proc.returncode == 0, proc.stderr
    finally:
        os.kill(p.pid, signal.SIGTERM)
        p.wait(10)
    arrived = dict(line.split() for line in out.read_text().splitlines())
    sends = {r["event_id"]: r["at_ns"] for r in telemetry(broker, topic, run_id) if r["kind"] == "send"}
    report = json.loads((tmp_path / "lg" / "report.json").read_text())
    # every send it made has its record (a busy machine may leave some due when the schedule ends: at most 1%)
    assert len(sends) == report["requests"] == 4 * rate - report["unsent"] and report["unsent"] <= 4 * rate // 100
    assert set(arrived) == set(sends)
    gap_us = np.array([int(arrived[e]) - at for e, at in sends.items()]) / 1000
    p50, p99, worst = np.percentile(gap_us, [50, 99, 100])
    print(f"\n{rate}/s: arrival - send stamp p50 {p50:.0f} µs, p99 {p99:.0f} µs, max {worst:.0f} µs, min {gap_us.min():.0f} µs")
    assert gap_us.min() >= 0 and p50 <= 500, (p50, p99, worst, report["send_delay_us"])


def _raw_server(answer: bytes):
    """A loopback server answering every request it reads with ``answer``, byte for byte; (port, stop)."""
    import re
    import socket
    import threading

    srv = socket.create_server(("127.0.0.1", 0))
    srv.settimeout(0.2)
    stop = threading.Event()

    def serve(conn):
        conn.settimeout(0.2)
        buf = b""
        with conn:
            while not stop.is_set():
                try:
                    data = conn.recv(65536)
                except TimeoutError:
                    continue
                except OSError:
                    return
                if not data:
                    return
                buf += data
                while b"\r\n\r\n" in buf:  # the generator's requests carry a Content-Length body
                    head, rest = buf.split(b"\r\n\r\n", 1)
                    n = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))
                    if len(rest) < n:
                        break
                    buf = rest[n:]
                    conn.sendall(answer)

    def accept():
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            threading.Thread(target=serve, args=(conn,), daemon=True).start()
        srv.close()

    threading.Thread(target=accept, daemon=True).start()
    return srv.getsockname()[1], stop


@pytest.mark.parametrize("answer,codes,errors", [
    (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 202 Accepted\r\nContent-Length: 0\r\n\r\n", {"202": 100}, {}),
    (b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 503 Busy\r\nContent-Length: 2\r\n\r\nno", {"503": 100},
     {"http 503": 100}),
    (b"HTTP/1.1 202 Accepted\r\nContent-Length: abc\r\n\r\n", {}, {"malformed response": 100}),
    (b"HTTP/1.1 202 Accepted\r\nContent-Length: 0\r\nContent-Length: 5\r\n\r\n", {}, {"malformed response": 100}),
], ids=["100 then 202", "103 then 503", "bad Content-Length", "two Content-Lengths"])
def test_the_clients_answers_are_framed_by_llhttp(tmp_path, answer, codes, errors):
    """A 1xx is interim: the final answer is the one counted. An answer the client cannot frame fails its request
    as ``malformed response`` (it was counted as a connection reset) and the run goes on."""
    port, stop = _raw_server(answer)
    try:
        # 20 ms apart: a failed answer closes the connection, and a busy machine's reconnects stay within it
        proc = attack("--rate", "50", "--duration", "2s", "--target", f"http://127.0.0.1:{port}/", "--no-telemetry",
                      "--out", str(tmp_path / "r"), "--timeout", "5s")
    finally:
        stop.set()
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    # each failed answer costs a new connection to a one-thread server: a busy machine may leave a few due at the end
    n = report["requests"]
    assert n + report["unsent"] == 100 and n >= 90, proc.stderr
    assert report["status_codes"] == {k: n for k in codes} and report["errors"] == {k: n for k in errors}, (
        report["status_codes"], report["errors"])


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root for a mount namespace")
def test_runs_from_a_read_only_install(sink, tmp_path):
    """As in its pod (``readOnlyRootFilesystem``, the install folder another user's): the checkout is mounted read-only
    in a mount namespace of its own (``unshare -m``) and the attack runs from it, writing only its --out folder. It
    used to die at start-up creating ``.stack/observers`` under the install folder."""
    url = sink()
    env = {k: v for k, v in os.environ.items() if k != "FLIGHTWATCH_STACK_DIR"}
    cmd = (f"mount --bind {ROOT} {ROOT} && mount -o remount,bind,ro {ROOT} && "
           f"exec {sys.executable} -m loadgen attack --quiet --rate 500 --duration 2s --target {url} --no-telemetry "
           f"--out {tmp_path}/out")
    proc = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", cmd], cwd=ROOT,
                          env=dict(env, PYTHONPATH=ROOT), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["requests"] + report["unsent"] == 1000 and report["unsent"] <= 10  # a busy machine: 1% at most
    assert report["requests"] == report["completed"] and report["success_ratio"] == 1.0


def test_kafka_records_are_cloudevents_as_the_sdk_reads_them(broker, tmp_path):
    """Every record the Kafka target sends is a CloudEvent in the Kafka binding's binary mode, as the CloudEvents SDK
    (``cloudevents.core.bindings.kafka``, the reference the Knative KafkaSource and the SDKs follow) reads it back:
    specversion, id (the record key), source, type, time (the send stamp), the run as the extension ``fwrun``, the
    payload as data. Read with kafka-python, a client independent of the load generator's librdkafka."""
    from datetime import datetime

    from cloudevents.core.bindings.kafka import KafkaMessage, from_kafka_event
    from kafka import KafkaConsumer

    topic = "lg-cloudevents"
    create_topic(broker, topic)
    t0 = time.time()
    proc = attack("--rate", "200", "--duration", "2s", "--target", f"kafka://{broker}/{topic}", "--run", "ce-run",
                  "--payload", "512", "--out", str(tmp_path), "--no-telemetry", "--kafka-option", "compression.type=gzip",
                  "--kafka-option", "linger_ms=10")
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["requests"] + report["unsent"] == 400 and report["unsent"] <= 4  # a busy machine: 1% left due at most
    # librdkafka's defaults (acks=all), Nagle off, and what was asked for, as the report says they took effect
    assert report["client"] == {
        "acks": "all", "linger.ms": 10, "batch.size": 1_000_000, "compression.type": "gzip", "enable.idempotence": False,
        "max.in.flight.requests.per.connection": 1_000_000, "socket.nagle.disable": True}
    assert ("Producer      [acks, linger.ms, batch.size, compression.type, enable.idempotence, "
            "max.in.flight.requests.per.connection, socket.nagle.disable]  all, 10, 1000000, gzip, false, 1000000, true"
            in (tmp_path / "report.txt").read_text())
    c = KafkaConsumer(topic, bootstrap_servers=broker, auto_offset_reset="earliest", enable_auto_commit=False,
                      consumer_timeout_ms=5000)
    events = [(r.key, from_kafka_event(KafkaMessage(headers=dict(r.headers), key=r.key, value=r.value))) for r in c]
    c.close()
    assert len(events) == report["requests"]
    for key, e in events:
        assert e.get_specversion() == "1.0" and e.get_id() == key.decode() and e.get_id().startswith("loadgen-")
        assert e.get_source() == "flightwatch/loadgen" and e.get_type() == "dev.flightwatch.load"
        assert e.get_extension("fwrun") == "ce-run" and e.get_datacontenttype() == "application/octet-stream"
        assert isinstance(e.get_time(), datetime) and t0 - 1 < e.get_time().timestamp() < time.time()
        assert len(e.get_data()) == 512
    assert len({e.get_id() for _, e in events}) == report["requests"]
