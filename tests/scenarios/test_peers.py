"""A cell beside the broker's own tool (``scenarios.peers``): flightwatch's side read from a run's archive against
the injected data, the agreement rule, the row and its table, and the peers' bad input. The tools themselves run
against the real brokers in ``tests/system/test_scenarios.py``."""
from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
from support import ROOT

from loadgen.synthetic import NS
from scenarios import peers, report, spec


def nearest(v, p):
    v = np.sort(v)
    return float(v[max(math.ceil(p / 100 * len(v)), 1) - 1])


@pytest.fixture(scope="module")
def run(synthetic):
    return synthetic("peers", duration_s=20, rate_per_sec=400, drop_fraction=0.02, duplicate_fraction=0.01,
                     late_count=5, pause=None)


def test_flightwatchs_side_is_the_sends_of_the_peers_step_inside_the_measured_span(run):
    """A two-step pace, 200/s then 400/s (the peer's rate), with 2 s of cool-down: the figures are those of the
    events sent in the second step before the cool-down, received within the drop timeout, by nearest rank."""
    root, sp, truth = run
    t0 = sp.start_ns
    summary = {"verdict": {"steps": [{"rate": 200.0, "start_ns": t0, "end_ns": t0 + 10 * NS},
                                     {"rate": 400.0, "start_ns": t0 + 10 * NS, "end_ns": t0 + 20 * NS}]},
               "measured": {"from_ns": t0 + 2 * NS, "to_ns": t0 + 18 * NS}, "received": 7000}
    fw = peers.ours(root, summary, {"cpu": {"us_per_event": 40.0}}, 400, sp.drop_timeout_s * NS, 0.7, True)
    lo, hi = t0 + 10 * NS, t0 + 18 * NS
    mine = (truth.sent_ns >= lo) & (truth.sent_ns < hi)
    flight = truth.recv_ns - truth.sent_ns
    ok = mine & (truth.recv_ns > 0) & (flight <= sp.drop_timeout_s * NS)
    assert (fw["from_ns"], fw["to_ns"], fw["sent"], fw["received"]) == (lo, hi, int(mine.sum()), int(ok.sum()))
    assert 0 < fw["received"] < fw["sent"]  # the injected drops and late ones are not flights
    us = flight[ok] / 1000
    assert (fw["p50_us"], fw["p99_us"], fw["p999_us"]) == (nearest(us, 50), nearest(us, 99), nearest(us, 99.9))
    assert fw["throughput_per_s"] == pytest.approx(ok.sum() / 8)
    assert fw["cpu_us_per_message"] == pytest.approx(40.0 + 0.7e6 / 7000) and fw["cpu_of"] == "generator and receiver"
    alone = peers.ours(root, summary, {"cpu": {"us_per_event": 40.0}}, 400, sp.drop_timeout_s * NS, 0.7, False)
    assert alone["cpu_us_per_message"] == 40.0 and alone["cpu_of"] == "generator"
    assert "no step at 300/s" in peers.ours(root, summary, {}, 300, NS, None, False)["problem"]


def test_agreement_is_within_the_peers_resolution_at_p50_and_p99_else_says_by_how_much_and_why():
    fw = {"p50_us": 2400.0, "p99_us": 11_200.0}
    from stack import kafka as kafka_broker

    kafka = {"sut": "kafka", "p50_us": 2000.0, "p99_us": 11_000.0, "resolution_us": 1000,
             "causes": list(kafka_broker.PEER.causes)}  # as python -m stack.peers writes them
    a = peers.agreement(fw, kafka)
    assert a["agree"] is True and a["diffs_us"] == {"p50": 400.0, "p99": 200.0} and "within the peer's resolution (1 ms)" in a["text"]
    b = peers.agreement({**fw, "p50_us": 5300.0}, kafka)
    assert b["agree"] is False and "p50 +3.300 ms" in b["text"] and "closed model" in b["text"]
    art = {"sut": "artemis", "p50_us": 800.0, "p99_us": 48_900.0, "resolution_us": 1,
           "per_second_p99_us": [90_000, 4_000, 5_000, 6_000]}
    c = peers.agreement({"p50_us": 400.0, "p99_us": 4_170.0}, art)
    assert c["agree"] is False and "p99 -44.730 ms" in c["text"] and "first 90.00 ms, median 5.50 ms" in c["text"]
    assert peers.agreement({"p50_us": None}, art)["agree"] is None


def test_the_row_has_the_cpu_ratio_and_a_failed_peer_is_said_not_compared():
    fw = {"p50_us": 400.0, "p99_us": 4170.0, "p999_us": 9000.0, "cpu_us_per_message": 441.2, "throughput_per_s": 500.0,
          "cpu_of": "generator and receiver"}
    pe = {"tool": "artemis perf client", "sut": "artemis", "rate": 500, "p50_us": 810.0, "p99_us": 48_900.0,
          "p999_us": 86_020.0, "cpu_us_per_message": 779.9, "throughput_per_s": 501.0, "resolution_us": 1,
          "model": "open", "cpu_of": "producers and consumers (one JVM)"}
    row = peers.compare(fw, pe)
    assert row["cpu_ratio"] == pytest.approx(441.2 / 779.9) and row["agreement"]["agree"] is False
    failed = peers.compare(fw, {"error": "artemis perf client wrote no summary"})
    assert failed["problem"] == "the peer failed: artemis perf client wrote no summary"
    doc = {"cells": [{"cell": {"pairs": 50}, "peer": row}, {"cell": {"pairs": 100}, "peer": failed}, {"cell": {}}]}
    table = report.peers_table(doc)
    assert len(table) == 4 and table[2].startswith("| pairs=50 | artemis perf client | 500/s | 500/s / 501/s | "
                                                   "0.40 ms / 0.81 ms | 4.17 ms / 48.90 ms | 9.00 ms / 86.02 ms | "
                                                   "441.2 / 779.9 (generator and receiver / producers and consumers "
                                                   "(one JVM)) | 0.57x |")
    assert "the peer failed" in table[3]


def test_the_peers_rate_is_a_step_of_the_pace_or_the_cells_highest():
    good = {"title": "T", "seed": "S", "method": "m", "kind": "matrix", "sut": "kafka", "pace": "1000:10,2000:10",
            "axes": {"payload": [128]}}
    assert spec.parse("x", "x.toml", good).peer_rate_of({"payload": 128}) == 2000
    sc = spec.parse("x", "x.toml", {**good, "peer_rate": 1000, "peer_seconds": 12})
    assert (sc.peer_rate_of({}), sc.peer_seconds) == (1000, 12)
    with pytest.raises(spec.ScenarioError, match="peer_rate 1500 must be the rate of one of the pace's steps"):
        spec.parse("x", "x.toml", {**good, "peer_rate": 1500})
    with pytest.raises(spec.ScenarioError, match="peer_seconds 5: whole seconds, at least 8"):
        spec.parse("x", "x.toml", {**good, "peer_seconds": 5})
    pairs = spec.load("dispatch-pairs")
    assert pairs.peer_rate_of({"pairs": 100, "payload": 100}) == 1000


@pytest.mark.parametrize("args, words", [
    (["-m", "stack.peers", "--sut", "kafka", "--rate", "0"], "--rate > 0"),
    (["-m", "stack.peers", "--sut", "tansu", "--rate", "10"], "invalid choice: 'tansu'"),
    (["-m", "stack.peers", "--sut", "artemis", "--rate", "10", "--seconds", "10", "--warmup", "10"], "--warmup < --seconds"),
    (["-m", "scenarios", "run", "bursts", "--peer"], "--peer: no peer's tool for HTTP"),
    (["-m", "scenarios", "run", "dispatch-pairs", "--sut", "rabbitmq-amqp1", "--peer"], "no peer's tool for rabbitmq-amqp1"),
])
def test_bad_input_to_the_peers_is_one_line_and_exit_2(args, words):
    p = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and words in lines[0], p.stderr


def test_each_sut_with_a_peer_has_its_brokers_tool_and_it_speaks_the_suts_transport():
    """The tools are their brokers' (``stack.brokers.Broker.peer``, kept in the broker's module); a SUT has one when
    ``core.suts.Sut.peer`` says so, and the tool sends over the SUT's own transport."""
    from core.suts import SUTS
    from stack.peers import peer_of, peer_suts

    assert peer_suts() == ("rabbitmq", "artemis", "kafka") and peers.PEER_SUTS == peer_suts()
    for sut in peer_suts():
        assert peer_of(sut).speaks == SUTS[sut].target.partition("://")[0], sut
    assert [peer_of(s).with_consumer for s in peer_suts()] == [True, True, False]
    with pytest.raises(ValueError, match="no broker's own tool runs against rabbitmq-amqp1"):
        peer_of("rabbitmq-amqp1")


def test_bench_transports_runs_each_tools_producer_and_the_generator_as_it_always_has():
    """``bench.transports`` finds its brokers and tools through the descriptors: the commands are those it ran when
    it named each transport itself (2026-11-30), to the letter."""
    from bench import transports as bt
    from stack import artemis, rabbitmq

    assert bt.compared() == {"amqp": "rabbitmq", "amqp1": "artemis", "kafka": "kafka"}
    assert bt.peer("rabbitmq", 4242, 1000, 14, {"rabbitmq": "/L"}) == (rabbitmq.LINE, [
        "java", "-cp", "/L/*", "com.rabbitmq.perf.PerfTest", "-h", "amqp://guest:guest@127.0.0.1:4242/%2F", "-x", "1",
        "-y", "0", "-u", "bench.transports", "-p", "-s", "2048", "-c", "1000", "-z", "14", "-r", "1000"])
    assert bt.peer("artemis", 4242, 0, 14, {"artemis": "/H"}) == (artemis.LINE, [
        "/H/bin/artemis", "perf", "producer", "--url", "amqp://127.0.0.1:4242", "--protocol", "AMQP", "--user",
        "artemis", "--password", "artemis", "--message-size", "2048", "--max-pending", "100", "--duration", "14",
        "queue://bench.transports"])
    assert bt.peer("kafka", 4242, 0, 14, {"kafka": "/K"})[1][-8:] == [
        "--throughput", "-1", "--reporting-interval", "1000", "--command-property", "bootstrap.servers=127.0.0.1:4242",
        "acks=all", "linger.ms=5"]
    assert bt.ours("artemis", 4242, 5000, 2, 14, "/o")[4:6] == ["--target",
                                                                "amqp1://artemis:artemis@127.0.0.1:4242/bench.transports"]
