"""RabbitMQ for real (``make test-brokers``): Debian's rabbitmq-server on a free loopback port, the load generator's
AMQP 0-9-1 target, the AMQP receiver agent, the telemetry broker (Tansu) and the streaming job, all real.

Ground truth is read back independently: every send, ack and receive record of the run from the telemetry topic with
kafka-python (not the product's librdkafka), joined here by event ID with numpy.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from support import ROOT, create_topic, telemetry
from support.brokers import (
    EXACT_DROP_TIMEOUT,
    Attack,
    assert_accounted,
    assert_amqp1_kill,
    attack,
    finished,
    run_attacks,
    running,
    start_receiver,
    url,
    url1,
)

from core.procs import stop_process
from stack.rabbitmq import installed, start_rabbitmq, stop_rabbitmq

pytestmark = [pytest.mark.integration, pytest.mark.brokers,
              pytest.mark.skipif(not installed(), reason="rabbitmq-server is not installed (.ci/run installs it)")]


@pytest.fixture(scope="module")
def rabbit(tmp_path_factory):
    yield from running(start_rabbitmq, stop_rabbitmq, tmp_path_factory, "rabbitmq")


# Exactness over AMQP 0-9-1 at 2,000/s and over the AMQP 1.0 plugin at 1,000/s: test_secure_amqp's runs, over TLS
# with a login of their own (every assertion of the plain runs of the same shape that were here).


def test_a_queue_that_routes_nowhere_is_counted_as_returned_by_cause(broker, rabbit, tmp_path):
    """An exchange with no binding for the key: every publish comes back (mandatory), counted as an error by cause."""
    import pika

    port, _, _ = rabbit
    conn = pika.BlockingConnection(pika.URLParameters(f"amqp://guest:guest@127.0.0.1:{port}/%2F"))
    conn.channel().exchange_declare("fw-nowhere", "direct")
    conn.close()
    target = f"amqp://guest:guest@127.0.0.1:{port}/%2F?exchange=fw-nowhere&routing_key=none"
    lg = attack(broker, "unused", "rmq-returned", target, tmp_path, "--rate", "200", "--duration", "2s",
                "--no-telemetry")
    out = lg.communicate(timeout=120)[0]
    report = json.load(open(tmp_path / "lg" / "report.json"))
    assert lg.returncode == 0, out
    assert report["errors"] == {"returned no route": 400}, report["errors"]


@pytest.mark.parametrize("case, words", [
    ("credentials", "access refused"),
    ("vhost", "not allowed"),
    ("missing queue", "not found"),
    ("kafka port", "an amqp broker?"),
    ("1.0 credentials", "unauthorized"),
    ("1.0 missing queue", "not found"),
    ("1.0 kafka port", "an amqp 1.0 broker?"),
    ("1.0 durable on a transient queue", "inequivalent arg 'durable'"),
])
def test_bad_amqp_input_is_one_line_and_exit_2_for_the_target_and_the_receiver(broker, rabbit, tmp_path, case, words):
    port, _, _ = rabbit
    kafka_port = int(broker.rsplit(":", 1)[1])
    targets = {"credentials": url(port, "q1", user="guest:wrong"), "vhost": url(port, "q1", vhost="nope"),
               "missing queue": url(port, "fw-absent", "&declare=false"),
               "kafka port": url(kafka_port, "q1"),
               "1.0 credentials": url1(port, "/queue/q1", user="guest:wrong"),
               "1.0 missing queue": url1(port, "/amq/queue/fw-absent"),   # /amq/queue/ names a queue that must exist
               "1.0 kafka port": url1(kafka_port, "/queue/q1"),
               "1.0 durable on a transient queue": url1(port, "/queue/fw-transient?durable=true")}
    target = targets[case]
    if case == "1.0 durable on a transient queue":  # declared before by a link with no durable terminus
        import pika

        conn = pika.BlockingConnection(pika.URLParameters(f"amqp://guest:guest@127.0.0.1:{port}/%2F"))
        conn.channel().queue_declare("fw-transient", durable=False)
        conn.close()
    # the target and the receiver side by side (against a Kafka port each waits out its AMQP handshake)
    lg, rx = finished(
        subprocess.Popen([sys.executable, "-m", "loadgen", "attack", "--rate", "10", "--duration", "1s", "--target",
                          target, "--no-telemetry", "--metrics-listen", "none", "--wait", "0s", "--out",
                          str(tmp_path / "lg")], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=dict(os.environ, PYTHONPATH=ROOT, FLIGHTWATCH_CLOCK_REFERENCE="none")),
        subprocess.Popen([sys.executable, "-m", "agents.receiver", target.split(":", 1)[0], "--url", target,
                          "--telemetry-bootstrap", broker, "--state-dir", str(tmp_path / "rx"), "--metrics-listen",
                          "none", "--clock-reference", "none"], cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=ROOT)))
    # RabbitMQ 3.x's AMQP 1.0 plugin accepts a transfer to a queue that does not exist (and routes it nowhere: the
    # job counts those as drops); only consuming from one is refused
    checked = (("receiver", rx),) if case == "1.0 missing queue" else (("loadgen", lg), ("receiver", rx))
    for name, p in checked:
        errors = [line for line in p.stderr.splitlines() if "error" in line]
        assert p.returncode == 2, (name, p.stdout[-2000:], p.stderr[-2000:])
        assert len(errors) == 1 and words in errors[0].lower(), (name, p.stderr[-2000:])
        assert "wrong" not in p.stderr  # the password is never shown


def test_an_event_over_rabbitmqs_max_message_size_is_one_line_and_exit_2_before_any_send(rabbit, tmp_path):
    """AMQP 0-9-1 does not tell a client the broker's size limit (RabbitMQ's ``max_message_size``, 128 MiB by
    default): the target's probe, one event-sized message to a queue of its own, finds it; the queue the attack
    aims at gets nothing."""
    port, _, _ = rabbit
    lg = subprocess.run([sys.executable, "-m", "loadgen", "attack", "--rate", "10", "--duration", "1s", "--target",
                         url(port, "oversized"), "--payload", str(128 * 1024 * 1024 + 1), "--no-telemetry",
                         "--metrics-listen", "none", "--wait", "0s", "--out", str(tmp_path / "lg")],
                        cwd=ROOT, capture_output=True, text=True, timeout=120,
                        env=dict(os.environ, PYTHONPATH=ROOT, FLIGHTWATCH_CLOCK_REFERENCE="none"))
    errors = [line for line in lg.stderr.splitlines() if "error" in line]
    assert lg.returncode == 2 and len(errors) == 1, lg.stderr[-2000:]
    assert "over the broker's max_message_size" in errors[0] and "134217728" in errors[0], errors
    assert not (tmp_path / "lg" / "report.json").exists()


def test_a_rabbitmq_killed_mid_attack_and_restarted_is_accounted_exactly_and_blamed_on_the_sut(
        broker, rabbit, tmp_path):
    """One kill -9 under four runs side by side: over AMQP 0-9-1 and over RabbitMQ's AMQP 1.0 plugin, each on a
    transient queue and on a durable one. (Until 2026-11-29 the two protocols were two tests, each with its own kill:
    the same assertions, 77 s of CI's brokers step each.)

    - AMQP 0-9-1: the kill fails the unconfirmed publishes, by cause; persistent messages in a durable queue that the
      broker confirmed survive its crash.
    - AMQP 1.0: with ``?durable=true`` (a durable header and a durable terminus, so the plugin's ``/queue/NAME`` is a
      durable queue) no message the broker accepted is lost. The receiver keeps the queue near empty, so this kill
      rarely finds a message waiting: the next test parks them."""
    port, _, _ = rabbit
    cases = (("killed-transient", False, False), ("killed-durable", True, False),
             ("killed1-transient", False, True), ("killed1-durable", True, True))
    runs = [Attack(f"rmq1-kill-{queue}", url1(port, f"/queue/{queue}" + ("?durable=true" if durable else "")), 1000, 20)
            if amqp1 else Attack(f"rmq-kill-{queue}", url(port, queue, "&durable=true" if durable else ""), 1000, 20)
            for queue, durable, amqp1 in cases]
    results = run_attacks(broker, tmp_path, runs, during=rabbit.kill_and_restart())
    for (queue, durable, amqp1), (s, truth, report) in zip(cases, results):
        if amqp1:
            assert_amqp1_kill(f"RabbitMQ AMQP 1.0 killed ({queue})", s, truth, report, durable)
            continue
        assert_accounted(f"RabbitMQ killed ({queue})", s, truth, report)
        assert sum(s["errors_by_cause"].values()) == truth["errored"]
        assert truth["errored"] > 0  # the kill failed the unconfirmed publishes, by cause
        assert all(c.startswith(("connection closed", "channel closed", "not connected", "timeout"))
                   for c in s["errors_by_cause"]), s["errors_by_cause"]
        if durable:  # persistent messages in a durable queue that the broker confirmed survive its crash (a drop
            assert truth["lost"] == 0 and s["dropped"] <= s["late"]  # is one that came after its drop timeout)


def test_sends_whose_confirms_were_lost_yet_were_received_are_in_doubt_and_the_ledger_balances(broker, rabbit,
                                                                                               tmp_path):
    """The load generator's connection to RabbitMQ through a proxy that, 2 s into a 1,000/s attack, swallows the
    broker's replies for 1 s (the publishes still reach the queue, and the receiver, on a connection of its own,
    takes them), then resets it: the publishes of that second fail at the sender as ``connection lost``, yet were
    received. They are in doubt, counted once (with the received, shown apart), and the ledger balances against the
    raw telemetry (``assert_accounted``)."""
    from support.fault_proxy import FaultProxy

    from core.procs import free_port

    port, _, _ = rabbit
    proxy = FaultProxy(free_port(), port).start()
    events = []

    def mute_then_cut() -> None:
        time.sleep(2)
        proxy.mute()
        events.append(("replies swallowed", time.time_ns()))
        time.sleep(1)
        proxy.cut()
        events.append(("connection reset", time.time_ns()))
        time.sleep(0.5)
        proxy.restore()
    mute_then_cut.events = events
    try:
        (s, truth, report), = run_attacks(broker, tmp_path, [Attack("rmq-doubt", url(proxy.listen_port, "doubt"), 1000, 6,
                                                                     drop_timeout=EXACT_DROP_TIMEOUT,
                                                                     receive_from=url(port, "doubt"))], mute_then_cut)
    finally:
        proxy.stop()
    assert_accounted("RabbitMQ, replies lost for 1 s", s, truth, report)
    led = s["ledger"]
    assert 800 <= led["in_doubt"] == s["in_doubt"] + s["failed_late"] <= 1100, led  # about the second muted
    assert s["errors_by_cause"].get("channel closed: connection lost", 0) >= led["in_doubt"], s["errors_by_cause"]


@pytest.mark.parametrize("durable", [False, True], ids=["transient", "durable"])
def test_what_the_amqp_1_0_plugin_accepted_and_nobody_consumed_outlives_a_kill_only_when_durable(broker, rabbit, tmp_path,
                                                                                                 durable):
    """1,000 messages sent with no receiver, then RabbitMQ killed -9 and started again, then the receiver. With
    ``?durable=true`` every message the plugin accepted is received; without, none is (the plugin declares
    ``/queue/NAME`` durable only for a durable terminus, and a transient queue is gone after the crash)."""
    port, _, _ = rabbit
    queue = "parked1-durable" if durable else "parked1-transient"
    target = url1(port, f"/queue/{queue}" + ("?durable=true" if durable else ""))
    lg = attack(broker, "unused", queue, target, tmp_path, "--rate", "500", "--duration", "2s", "--no-telemetry")
    out = lg.communicate(timeout=120)[0]
    assert lg.returncode == 0, out[-3000:]
    report = json.load(open(tmp_path / "lg" / "report.json"))
    accepted = report["requests"] - sum(report["errors"].values())
    # every send accepted; a generator on a busy machine can end its 2 s one short of 1,000 (999 sent, with 3 pytest
    # workers), which is not what this is about
    assert not report["errors"] and 990 <= accepted <= 1000, (report["requests"], report["errors"])
    rabbit.kill_and_restart(after_s=0, down_s=1)()
    topic = f"tel-{queue}"
    create_topic(broker, topic)
    rx = start_receiver(broker, topic, target, tmp_path / "rx")
    try:
        deadline = time.monotonic() + (30 if durable else 5)  # the transient queue: 5 s for anything to come
        while time.monotonic() < deadline and len(receives(broker, topic, queue)) < accepted:
            time.sleep(1)
    finally:
        stop_process(rx, wait_s=30, group=True)
    received = receives(broker, topic, queue)
    print(f"\nRabbitMQ AMQP 1.0, {queue}: {accepted:,} accepted, {len(received):,} received after kill -9")
    assert len(received) == (accepted if durable else 0)


def receives(broker: str, topic: str, run_id: str) -> set[str]:
    return {r["event_id"] for r in telemetry(broker, topic, run_id) if r["kind"] == "recv"}
