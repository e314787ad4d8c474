"""A user's own ActiveMQ Artemis, as production runs it (``make test-brokers``): its one acceptor speaking TLS alone
with SASL PLAIN (a CA and a certificate for ``localhost`` made by ``openssl`` here, given to Artemis as a PEM key
store), a user of its own. ``flightwatch run examples/artemis.toml`` exactly as written, its place, CA and password
file from the environment as the file says: the load generator's sender and the receiver it starts for the run
(attached before the first send: Artemis drops what reaches an address with no queue) both log in over TLS.

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

from stack import artemis

pytestmark = [pytest.mark.integration, pytest.mark.brokers,
              pytest.mark.skipif(shutil.which("java") is None, reason="Artemis needs Java 17 (.ci/run installs it)")]
SECRET = "artemis-pw-77b1-not-in-any-output"
USER = "fw"


@pytest.fixture(scope="module")
def secure_artemis(tmp_path_factory):
    """The broker, its CA and the password's file: (port, certs, password file)."""
    folder = tmp_path_factory.mktemp("secure-artemis")
    certs = make_certs(str(folder / "certs"))
    start = functools.partial(artemis.start_artemis, login=(USER, SECRET), tls=certs.chain)
    for b in running(start, artemis.stop_artemis, tmp_path_factory, "artemis-tls"):
        yield b.port, certs, secret_file(folder, SECRET)


def _run(tmp_path, broker: str, run_id: str, port: int, ca: str, pw: str, *more: str) -> tuple[int, str]:
    """``flightwatch run examples/artemis.toml`` at the module's broker: (its exit code, its output)."""
    p = run_example(tmp_path, broker, "artemis", run_id, dict(ARTEMIS_PORT=str(port), CA_FILE=ca, ARTEMIS_PASSWORD_FILE=pw,
                                                          DROP_TIMEOUT=EXACT_DROP_TIMEOUT, **example_form(1000)[0]), *more)
    out = p.communicate(timeout=300)[0]
    return p.returncode, out


def test_the_artemis_example_over_tls_is_exact(broker, secure_artemis, tmp_path):
    """1,000/s (``RATE``; on a 2-core machine shared with the other broker tests, 2,000/s over TLS left 30 of
    20,000 sends unsent once) for 10 s (``DURATION``), or as the file says (2,000/s for 30 s) with ``EXAMPLES=full``,
    unsettled (each transfer waits for the broker's accepted
    outcome), as the file says: the job's figures exact against the raw telemetry (``assert_exact``, 5 s drop
    timeout: counting is deterministic), every receive the run's receiver's, ``ok``, the file's thresholds held
    (exit 0), the password in no output, log, report or record. (Artemis' exactness over plain TCP was
    ``test_artemis``'s run at 1,000/s; this one holds its every assertion.)"""
    port, certs, pw = secure_artemis
    code, out = _run(tmp_path, broker, "art-tls", port, certs.ca, pw)
    assert code == 0, out[-3000:]
    assert re.search(r"receiver: started for the run on amqp1s://localhost:\d+/orders\?\S* \(pid \d+, "
                     r"receiver-amqp1-run", out), out[-3000:]
    root = tmp_path / "checkpoints" / "art-tls"
    s, report = json.load(open(root / "summary.json")), json.load(open(root / "loadgen" / "report.json"))
    records = telemetry(broker, "tel-art-tls", "art-tls")
    _, planned, form = example_form(1000)
    assert_exact(f"examples/artemis.toml over TLS, {form}", s, ground_truth(records), report, planned)
    assert {r["agent"] for r in records if r["kind"] == "recv"} == {"receiver-amqp1-run"}
    assert s["verdict"]["state"] == "ok", s["verdict"]["message"]
    assert report["client"]["settle"] == "unsettled" and report["success_ratio"] == 1.0
    assert not holding(tmp_path, SECRET, out)


@pytest.mark.parametrize("how, cause", [
    ("wrong password", "unauthorized access"),
    ("unknown CA", "the certificate is not signed by a trusted CA"),
])
def test_a_wrong_login_or_ca_is_one_line_and_nothing_is_sent(broker, secure_artemis, tmp_path, how, cause):
    port, certs, pw = secure_artemis
    if how == "wrong password":
        (tmp_path / "wrong").write_text("not-the-password\n")
        pw = str(tmp_path / "wrong")
    run_id = f"art-bad-{how[:5]}"
    code, out = _run(tmp_path, broker, run_id, port, certs.other_ca if how == "unknown CA" else certs.ca, pw)
    lines = [line for line in out.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and cause in lines[0], out[-2000:]
    assert not (tmp_path / "checkpoints" / run_id / "loadgen" / "report.json").exists()
