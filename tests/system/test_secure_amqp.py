"""A user's own RabbitMQ, as production runs it (``make test-brokers``): TLS alone on its port (a CA and a certificate
for ``localhost`` made by ``openssl`` here), a vhost and a user of its own, the password in a file, no guest. The load
generator is given the URL with the user alone and ``FLIGHTWATCH_TARGET_PASSWORD=@FILE``, ``--receiver auto`` and a
probe, as ``make attack`` runs it: it starts the receiver where the load goes, over TLS with the same login, and
stops it after the run. The job (``--stream``), Tansu for the telemetry and the broker are real.

Ground truth is read back independently: every send and receive record from the telemetry topic with kafka-python.
"""
from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
import threading

import psutil
import pytest
from support import ROOT, create_topic, telemetry
from support.brokers import (
    EXACT_DROP_TIMEOUT,
    assert_exact,
    by_receiver,
    example_form,
    ground_truth,
    holding,
    run_example,
    running,
    secret_file,
    sent_of,
)
from support.certs import make_certs

from stack.rabbitmq import ctl, installed, start_rabbitmq, stop_rabbitmq

pytestmark = [pytest.mark.integration, pytest.mark.brokers,
              pytest.mark.skipif(not installed(), reason="rabbitmq-server is not installed (.ci/run installs it)")]
SECRET = "pw-9f3c2e-not-in-any-output"
VHOST, USER = "orders", "fw"


@pytest.fixture(scope="module")
def secure(tmp_path_factory):
    """The broker, its CA and the password's file: (port, certs, password file)."""
    folder = tmp_path_factory.mktemp("secure")
    certs = make_certs(str(folder / "certs"))
    start = functools.partial(start_rabbitmq, tls=(certs.ca, certs.cert, certs.key))
    for b in running(start, stop_rabbitmq, tmp_path_factory, "rabbitmq-tls"):
        for args in (("add_vhost", VHOST), ("add_user", USER, SECRET), ("delete_user", "guest"),
                     ("set_permissions", "-p", VHOST, USER, ".*", ".*", ".*"),
                     ("set_permissions", "-p", "/", USER, ".*", ".*", ".*")):  # AMQP 1.0's plugin serves vhost /
            ctl(b.port, b.folder, *args)
        yield b.port, certs, secret_file(folder, SECRET)


def _env(tmp_path, password: str) -> dict:
    return dict(os.environ, PYTHONPATH=ROOT, FLIGHTWATCH_CHECKPOINTS=str(tmp_path / "checkpoints"),
                FLIGHTWATCH_STACK_DIR=str(tmp_path / "stack"), FLIGHTWATCH_CLOCK_REFERENCE="none",
                FLIGHTWATCH_DRIVER_MEMORY="1g", FLIGHTWATCH_TARGET_PASSWORD=password)


def _attack(tmp_path, run_id: str, target: str, *args: str, password: str = "") -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "loadgen", "attack", "--target", target, "--run", run_id,
                             "--workers", "1", "--metrics-listen", "none", "--quiet", *args],
                            cwd=ROOT, env=_env(tmp_path, password), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def _telemetry(broker: str, topic: str) -> tuple[str, ...]:
    return ("--telemetry-bootstrap", broker, "--telemetry-topic", topic)


def _recorded_by_the_runs_receiver(broker, tel: str, run_id: str, out: str, report: dict, planned: int,
                                   agent: str) -> None:
    """The run checked against its raw telemetry: every send recorded once by the run's own receiver (and by no
    other), every send taken by the broker; the probe recorded by that receiver first; the receiver stopped after
    the run, having recorded the run and the 3 probe events."""
    started = re.search(r"receiver: started for the run on \S+ \(pid (\d+), " + agent, out)
    assert started, out[-3000:]
    assert not psutil.pid_exists(int(started.group(1))), "the run's receiver outlived the run"
    assert re.search(rf"probe: recorded by {agent} [\d.]+ s after it was sent", out), out[-3000:]
    n = sent_of(report, planned)
    records = telemetry(broker, tel, run_id)
    sends = [r["event_id"] for r in records if r["kind"] == "send"]
    recvs = [r["event_id"] for r in records if r["kind"] == "recv"]
    print(f"\n{run_id}: sent {len(sends):,} received {len(recvs):,} by {agent}; the broker's answer p50/p99 "
          f"{report['latency_us']['p50'] / 1000:.2f}/{report['latency_us']['p99'] / 1000:.2f} ms")
    assert len(sends) == len(set(sends)) == n and sorted(recvs) == sorted(sends)
    assert {r["agent"] for r in records if r["kind"] == "recv"} == {agent}
    assert report["success_ratio"] == 1.0 and f"{n + 3:,} events recorded" in out, out[-2000:]


def test_the_rabbitmq_example_and_amqp_1_0_over_tls_are_exact_with_receivers_started_for_the_run(
        broker, secure, tmp_path):
    """Side by side, 10 s each (the example 30 s, as its file says, with ``EXAMPLES=full``), both streamed, with a 5 s
    drop timeout (counting is deterministic):

    - ``flightwatch run examples/rabbitmq.toml`` exactly as written (its place, CA and password file from the
      environment, as the file says; the telemetry broker Tansu's, ``--no-stack``): AMQP 0-9-1 over TLS to a queue
      of the vhost at 2,000/s, with publisher confirms; the file's thresholds hold (exit 0).
    - AMQP 1.0 over TLS (RabbitMQ's plugin) at 1,000/s, unsettled: each transfer's outcome is the broker's accepted
      disposition.

    Each run is exact against its raw telemetry (``assert_exact``: every send received once, 0 dropped, 0 errors,
    p50/p90/p99 the raw flight times'), ``ok``; its receiver was started for the run with the user in its URL and the
    password in its environment, and recorded every event and the probe. The password is in no output, log, report
    or record of either run. (RabbitMQ's exactness over plain TCP was ``test_rabbitmq``'s two runs of these shapes;
    these hold their every assertion.)"""
    port, certs, pw = secure
    rate_and_duration, planned, _ = example_form()
    env = dict(RABBITMQ_PORT=str(port), CA_FILE=certs.ca, RABBITMQ_PASSWORD_FILE=pw, DROP_TIMEOUT=EXACT_DROP_TIMEOUT,
               **rate_and_duration)
    example = run_example(tmp_path, broker, "rabbitmq", "tls-091", env)
    create_topic(broker, "tel-tls-10")
    amqp1 = _attack(tmp_path, "tls-10", f"amqp1s://{USER}@localhost:{port}//queue/orders1?cafile={certs.ca}",
                    *_telemetry(broker, "tel-tls-10"), "--rate", "1000", "--duration", "10s", "--receiver", "auto",
                    "--probe-timeout", "10s", "--stream", "--drop-timeout", EXACT_DROP_TIMEOUT, password=f"@{pw}")
    outs = [p.communicate(timeout=300)[0] for p in (example, amqp1)]
    assert example.returncode == 0 and amqp1.returncode == 0, outs[0][-3000:] + outs[1][-3000:]
    for run_id, out, n, agent in (("tls-091", outs[0], planned, "receiver-amqp-run"),
                                  ("tls-10", outs[1], 10_000, "receiver-amqp1-run")):
        root = tmp_path / "checkpoints" / run_id
        s, report = json.load(open(root / "summary.json")), json.load(open(root / "loadgen" / "report.json"))
        records = telemetry(broker, f"tel-{run_id}", run_id)
        assert_exact(f"{run_id} over TLS, {n:,} events", s, ground_truth(records), report, n)
        assert s["verdict"]["state"] == "ok", s["verdict"]["message"]
        _recorded_by_the_runs_receiver(broker, f"tel-{run_id}", run_id, out, report, n, agent)
        assert 0 < report["latency_us"]["p50"]  # the broker's answer: the load generator's own figure, apart from flight
    assert json.load(open(tmp_path / "checkpoints" / "tls-10" / "loadgen" / "report.json"))["client"]["settle"] == \
        "unsettled"
    assert not holding(tmp_path, SECRET, *outs)


def test_a_queue_with_a_consumer_of_its_own_is_named_and_what_it_took_is_what_dropped(broker, secure, tmp_path):
    """A consumer that is not flightwatch's already on the queue (over TLS, the same login): the attack warns that
    the queue has 1 consumer besides flightwatch's; the broker shares the events between the two, and the run's
    drops are exactly the events that consumer took (it counts this run's, by their run header)."""
    import pika

    from transports.amqp import RUN_HEADER, AmqpAddress

    port, certs, pw = secure
    run_id, tel = "tls-taken", "tel-tls-taken"
    target = f"amqps://{USER}:{SECRET}@localhost:{port}/{VHOST}?queue=taken&cafile={certs.ca}"
    _, params = AmqpAddress.from_url(target)
    conn = pika.BlockingConnection(params)
    channel = conn.channel()
    channel.queue_declare("taken")
    taken: list[str] = []

    def on_message(ch, method, props, _body) -> None:
        if (props.headers or {}).get(RUN_HEADER) == run_id:
            taken.append(props.message_id)
        ch.basic_ack(method.delivery_tag)
    channel.basic_consume("taken", on_message)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            conn.process_data_events(time_limit=0.2)
    t = threading.Thread(target=serve)
    t.start()
    try:
        create_topic(broker, tel)
        p = _attack(tmp_path, run_id, target.replace(f":{SECRET}@", "@"), *_telemetry(broker, tel), "--rate",
                    "1000", "--duration", "6s", "--stream", "--drop-timeout", "5s", "--receiver", "auto",
                    "--probe-timeout", "10s", password=SECRET)
        out = p.communicate(timeout=300)[0]
    finally:
        stop.set()
        t.join()
        conn.close()
    assert p.returncode == 0, out[-3000:]
    assert re.search(r"receiver: warning: amqps://localhost:\d+/orders\?queue=taken\S* has 1 consumer besides "
                     r"flightwatch's: it takes events that flightwatch will count as dropped", out), out[-3000:]
    root = tmp_path / "checkpoints" / run_id
    s = json.load(open(root / "summary.json"))
    print(f"\nsent {s['sent']:,} received {s['received']:,} dropped {s['dropped']:,}; the other consumer took "
          f"{len(taken):,}; verdict {s['verdict']['message']!r}")
    assert len(set(taken)) == len(taken) > 0 and s["errors_by_cause"] == {} and s["duplicates"] == 0
    # every send the generator made is the run's (on a busy machine it made 5,980 of its 6,000 once: its own shortfall,
    # unsent, is not this test's subject; sent_of bounds it where a test is about the schedule)
    lg = json.load(open(root / "loadgen" / "report.json"))
    assert lg["scheduled"] == 6000 and s["sent"] == lg["requests"] == 6000 - lg["unsent"] > 0, lg
    assert s["dropped"] == len(taken) and s["received"] + s["dropped"] == s["sent"], s
    recvs = {r["event_id"] for r in telemetry(broker, tel, run_id) if r["kind"] == "recv"}
    assert not recvs & set(taken)  # what it took, the run's receiver never saw
    assert not holding(tmp_path, SECRET, out)


@pytest.mark.parametrize("how", ["wrong password", "unknown CA", "host not in the certificate", "plain to TLS port"])
def test_a_wrong_login_or_certificate_is_one_line_and_nothing_is_sent(secure, tmp_path, how):
    """Each over AMQP 0-9-1 and AMQP 1.0: exit 2 and one line naming the cause, before the load (no send record,
    no report)."""
    port, certs, pw = secure
    host, ca, password, s = {"wrong password": ("localhost", certs.ca, "not-the-password", "s"),
                             "unknown CA": ("localhost", certs.other_ca, f"@{pw}", "s"),
                             "host not in the certificate": ("127.0.0.1", certs.ca, f"@{pw}", "s"),
                             "plain to TLS port": ("localhost", None, f"@{pw}", "")}[how]
    cafile = f"cafile={ca}" if ca else ""
    targets = {"0-9-1": f"amqp{s}://{USER}@{host}:{port}/{VHOST}?queue=never&{cafile}".rstrip("&"),
               "1.0": f"amqp1{s}://{USER}@{host}:{port}//queue/never" + (f"?{cafile}" if ca else "")}
    procs = {k: _attack(tmp_path / k, f"bad-{k}", t, "--rate", "100", "--duration", "2s", "--no-telemetry",
                        "--out", str(tmp_path / k / "lg"), password=password)
             for k, t in targets.items()}
    want = {"wrong password": {"0-9-1": "access refused", "1.0": "unauthorized access"},
            "unknown CA": "the certificate is not signed by a trusted CA: give ?cafile=PATH",
            "host not in the certificate": "the certificate does not name the host in the URL (TLS host name mismatch)",
            "plain to TLS port": {"0-9-1": "not amqp 0-9-1", "1.0": "the port speaks TLS: use amqp1s://"}}[how]
    for k, p in procs.items():
        out = p.communicate(timeout=60)[0]
        lines = [line for line in out.splitlines() if line.strip()]
        expect = want[k] if isinstance(want, dict) else want
        assert p.returncode == 2 and len(lines) == 1 and expect in lines[0], (k, out[-2000:])
        assert lines[0].startswith("loadgen: error: ") and SECRET not in out
        assert not (tmp_path / k / "lg" / "report.json").exists()


def test_two_receivers_for_the_run_compete_for_the_queue_and_record_each_event_once(broker, secure, tmp_path):
    """``--receivers 2``: two competing consumers of the queue, started for the run over TLS; every send recorded
    once between them, by both. An exchange target's receivers would each bind a queue of their own (every event
    twice): one line, exit 2, nothing sent."""
    port, certs, pw = secure
    run_id, tel = "tls-two", "tel-tls-two"
    create_topic(broker, tel)
    target = f"amqps://{USER}@localhost:{port}/{VHOST}?queue=shared&cafile={certs.ca}"
    p = _attack(tmp_path, run_id, target, *_telemetry(broker, tel), "--rate", "1000", "--duration", "4s",
                "--receiver", "auto", "--receivers", "2", "--probe-timeout", "10s", password=f"@{pw}")
    out = p.communicate(timeout=240)[0]
    assert p.returncode == 0, out[-3000:]
    records = telemetry(broker, tel, run_id)
    n = sent_of(json.load(open(tmp_path / "checkpoints" / run_id / "loadgen" / "report.json")), 4000)
    sends, by = by_receiver(records)
    print(f"\nsent {len(sends):,}; recorded by {({a: len(v) for a, v in by.items()})}")
    assert len(sends) == n and sorted(sends) == sorted(e for v in by.values() for e in v)
    assert sorted(by) == ["receiver-amqp-run-0", "receiver-amqp-run-1"] and all(by.values())
    exchange = f"amqps://{USER}@localhost:{port}/{VHOST}?exchange=amq.topic&routing_key=k&cafile={certs.ca}"
    bad = _attack(tmp_path, "tls-two-x", exchange, *_telemetry(broker, tel), "--rate", "100", "--duration", "1s",
                  "--receiver", "auto", "--receivers", "2", password=f"@{pw}")
    lines = [line for line in bad.communicate(timeout=120)[0].splitlines() if line.strip()]
    assert bad.returncode == 2 and lines == ["loadgen: error: --receivers 2: an exchange's receivers each bind a queue "
                                             "of their own: one receiver, or aim at a queue"], lines
    assert not [r for r in telemetry(broker, tel, "tls-two-x") if r["kind"] == "send"]
    assert not holding(tmp_path, SECRET, out)
