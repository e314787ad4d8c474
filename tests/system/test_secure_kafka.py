"""A user's own Apache Kafka, as production runs it (``make test-brokers``): SASL/SCRAM-SHA-512 over TLS on its port
(a CA and a certificate for ``localhost`` made by ``openssl`` here), its users added when its storage is formatted.
``flightwatch run examples/kafka.toml`` exactly as written, its place, CA and password file from the environment as
the file says: the load generator's producer and the receiver it starts for the run both log in over TLS.

Ground truth is read back independently from the telemetry topic with kafka-python.
"""
from __future__ import annotations

import functools
import json
import re
import shutil

import pytest
from support import telemetry
from support.brokers import (
    EXACT_DROP_TIMEOUT,
    assert_exact,
    example_form,
    ground_truth,
    holding,
    run_example,
    running,
    secret_file,
)
from support.certs import make_certs

from stack import kafka

pytestmark = [pytest.mark.integration, pytest.mark.brokers,
              pytest.mark.skipif(shutil.which("java") is None, reason="Apache Kafka needs Java 17 (.ci/run has it)")]
SECRET = "kafka-pw-5e1d-not-in-any-output"
USER = "fw"


@pytest.fixture(scope="module")
def secure_kafka(tmp_path_factory):
    """The broker, its CA and the password's file: (port, certs, password file)."""
    folder = tmp_path_factory.mktemp("secure-kafka")
    certs = make_certs(str(folder / "certs"))
    secure = kafka.Secure(certs.chain, certs.ca, {kafka.BROKER_USER: "broker-pw", USER: SECRET})
    for b in running(functools.partial(kafka.start_kafka, secure=secure), kafka.stop_kafka, tmp_path_factory,
                     "kafka-sasl-ssl"):
        yield b.port, certs, secret_file(folder, SECRET)


def _run(tmp_path, broker: str, run_id: str, port: int, ca: str, pw: str, *more: str) -> tuple[int, str]:
    """``flightwatch run examples/kafka.toml`` at the module's broker: (its exit code, its output)."""
    p = run_example(tmp_path, broker, "kafka", run_id, dict(KAFKA_BOOTSTRAP=f"localhost:{port}", CA_FILE=ca, KAFKA_PASSWORD_FILE=pw,
                                                          DROP_TIMEOUT=EXACT_DROP_TIMEOUT, **example_form()[0]), *more)
    out = p.communicate(timeout=300)[0]
    return p.returncode, out


def test_the_kafka_example_over_sasl_ssl_is_exact(broker, secure_kafka, tmp_path):
    """2,000/s for 10 s (``DURATION``; 30 s as the file says with ``EXAMPLES=full``) with acks=all and an idempotent producer, as the file says, the producer and
    the run's receiver logged in as ``fw`` over TLS: the job's figures exact against the raw telemetry
    (``assert_exact``, with a 5 s drop timeout: counting is deterministic), every receive the run's receiver's, ``ok``,
    the file's thresholds held (exit 0), and the password in no output, log, report or record. (Apache Kafka's
    exactness over plain TCP was ``test_kafka``'s run of the same shape; this one holds its every assertion.)"""
    port, certs, pw = secure_kafka
    code, out = _run(tmp_path, broker, "kfk-sasl", port, certs.ca, pw)
    assert code == 0, out[-3000:]
    assert re.search(r"receiver: started for the run on kafka://localhost:\d+/orders \(pid \d+, receiver-kafka-run",
                     out), out[-3000:]
    root = tmp_path / "checkpoints" / "kfk-sasl"
    s, report = json.load(open(root / "summary.json")), json.load(open(root / "loadgen" / "report.json"))
    records = telemetry(broker, "tel-kfk-sasl", "kfk-sasl")
    _, planned, form = example_form()
    assert_exact(f"examples/kafka.toml over SASL_SSL, {form}", s, ground_truth(records), report, planned)
    assert {r["agent"] for r in records if r["kind"] == "recv"} == {"receiver-kafka-run"}
    assert s["verdict"]["state"] == "ok", s["verdict"]["message"]
    # the file's producer: every send acknowledged by all replicas, a retry written once (idempotent)
    assert report["client"]["acks"] == "all" and report["client"]["enable.idempotence"] == "true"
    assert report["success_ratio"] == 1.0
    assert 0 < report["latency_us"]["p50"]  # the ack latency: the load generator's own figure, apart from flight
    assert not holding(tmp_path, SECRET, out)


@pytest.mark.parametrize("how, cause", [
    ("wrong password", "SASL authentication failed"),
    ("unknown CA", "certificate"),
])
def test_a_wrong_login_or_ca_is_one_line_and_nothing_is_sent(broker, secure_kafka, tmp_path, how, cause):
    port, certs, pw = secure_kafka
    if how == "wrong password":
        (tmp_path / "wrong").write_text("not-the-password\n")
        pw = str(tmp_path / "wrong")
    code, out = _run(tmp_path, broker, f"kfk-bad-{how[:5]}", port, certs.other_ca if how == "unknown CA" else certs.ca, pw,
             "--probe-timeout", "10s")
    lines = [line for line in out.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and cause in lines[0], out[-2000:]
    assert not (tmp_path / "checkpoints" / f"kfk-bad-{how[:5]}" / "loadgen" / "report.json").exists()
