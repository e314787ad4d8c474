"""A transport of the user's own, outside the repository, installed as a package with an entry point in
``flightwatch.transports`` (``transports.registry.more``): ``support/udp_transport.py``, one module with its descriptor,
target, receiver's source, flags and process, and nothing of flightwatch's changed. The load generator attacks through
it and starts its receiver for the run; the receiver runs in flightwatch's one receiver process (``agents.runner``);
every event sent is in the telemetry once, sent and received. An entry point that is no transport, or one that takes
another's scheme, is one line and exit 2."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest
from support import ROOT, create_topic, telemetry

SUPPORT = os.path.join(ROOT, "tests", "support")


def installed(site, entry_points: dict[str, str]) -> dict:
    """An environment in which a package of the user's is installed with these ``flightwatch.transports`` entry
    points (its ``.dist-info`` under ``site``, as pip leaves one): the user's module on the path."""
    info = site / "own_transports-1.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: own-transports\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[flightwatch.transports]\n"
                                          + "".join(f"{k} = {v}\n" for k, v in entry_points.items()))
    return dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, SUPPORT, str(site)]))


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.integration
def test_an_attack_through_a_transport_of_your_own_and_its_receiver_started_for_the_run_are_exact(broker, tmp_path):
    topic, run_id, rate, seconds = "tel-own-transport", "own-transport", 500, 4
    create_topic(broker, topic)
    env = dict(installed(tmp_path / "site", {"udp": "udp_transport:TRANSPORT"}), FLIGHTWATCH_CLOCK_REFERENCE="none",
               FLIGHTWATCH_CHECKPOINTS=str(tmp_path))
    lg = subprocess.run([sys.executable, "-m", "loadgen", "attack", "--target", f"udp://127.0.0.1:{free_udp_port()}",
                         "--rate", str(rate), "--duration", f"{seconds}s", "--run", run_id, "--payload", "256",
                         "--telemetry-bootstrap", broker, "--telemetry-topic", topic, "--out", str(tmp_path / "lg"),
                         "--metrics-listen", "none", "--receiver", "auto"], cwd=ROOT, env=env, capture_output=True, text=True,
                        timeout=120)
    assert lg.returncode == 0, lg.stdout[-3000:] + lg.stderr[-3000:]
    assert "receiver: started for the run on udp://127.0.0.1:" in lg.stdout, lg.stdout[-3000:]
    deadline, records = time.monotonic() + 30, []
    while time.monotonic() < deadline:  # the receiver's shipper drains its spool as it stops
        records = telemetry(broker, topic, run_id)
        sends = [r["event_id"] for r in records if r["kind"] == "send"]
        recvs = [r["event_id"] for r in records if r["kind"] == "recv"]
        if sends and len(recvs) >= len(sends):
            break
        time.sleep(0.5)
    agents = {r["agent"] for r in records if r["kind"] == "recv"}
    print(f"\nown transport: {len(sends):,} sent, {len(recvs):,} received by {agents}")
    assert rate * seconds * 0.99 <= len(sends) == len(set(sends)), len(sends)
    assert sorted(recvs) == sorted(sends), (len(recvs), len(set(recvs)), len(sends))  # each once, none lost
    assert agents == {"receiver-udp-run"} and f"{len(sends):,} events recorded" in lg.stdout, (agents, lg.stdout[-500:])


WHERE = "the transport {} ({}, entry point flightwatch.transports)"


@pytest.mark.parametrize("entry_points, said", [
    ({"udp": "json:TRANSPORT"}, WHERE.format("udp", "json:TRANSPORT") + ": AttributeError: module 'json' has no "
                                                                       "attribute 'TRANSPORT'"),
    ({"udp": "no_such_transport:TRANSPORT"}, WHERE.format("udp", "no_such_transport:TRANSPORT")
     + ": ModuleNotFoundError: No module named 'no_such_transport'"),
    ({"udp": "json:dumps"}, WHERE.format("udp", "json:dumps") + ": not a transports.base.Transport"),
    ({"udp": "udp_transport:TRANSPORT", "udp2": "udp_transport:TRANSPORT"},
     WHERE.format("udp2", "udp_transport:TRANSPORT") + ": its schemes (udp) or its receiver mode (udp) are another "
                                                        "transport's"),
])
def test_an_entry_point_that_is_no_transport_or_takes_anothers_scheme_is_one_line_and_exit_2(tmp_path, entry_points,
                                                                                              said):
    env = installed(tmp_path / "site", entry_points)
    for command, who in ((["-m", "loadgen", "attack", "--rate", "1"], "loadgen"), (["-m", "agents.receiver", "http"], "receiver")):
        r = subprocess.run([sys.executable, *command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
        assert (r.returncode, r.stdout, r.stderr) == (2, "", f"{who}: error: {said}\n")
