"""The fifth transport, STOMP 1.2 (``transports/stomp/``, one folder and its line in ``transports.registry.OURS``):
its frames against the specification's grammar, its URL's errors (its receiver's /metrics are linted with the others',
``tests/core/test_metrics_lint.py``), and a run through a real Artemis (``make
test-brokers``): the load generator's SEND frames acknowledged by the broker's RECEIPTs, the receiver it starts for
the run subscribed to the queue, the job's figures exact against the raw telemetry."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from support import ROOT, create_topic, telemetry
from support.brokers import EXACT_DROP_TIMEOUT, assert_exact, ground_truth, running

from stack import artemis
from transports.stomp.codec import FrameError, FrameReader, SendFrames, frame

LOGIN = f"{artemis.USER}:{artemis.PASSWORD}"


def feed_all(data: bytes, piece: int) -> list:
    """The frames of ``data`` fed ``piece`` bytes at a time."""
    reader = FrameReader()
    return [f for i in range(0, len(data), piece) for f in reader.feed(data[i:i + piece])]


@pytest.mark.parametrize("piece", [1, 7, 1 << 20])
def test_frames_are_read_whole_however_the_bytes_arrive(piece):
    """Escaped headers (``\\c \\n \\\\``) come back as written; a body with NULs is read by its ``content-length``; EOLs
    between frames are heart-beats; CR LF ends lines as LF does; CONNECTED's headers are not escaped; a frame's size is
    its bytes on the wire."""
    send = frame("SEND", {"destination": "a:b", "note": "line\nwith\\slash"}, b"x\0y")
    connected = b"CONNECTED\r\nversion:1.2\r\nserver:a\\b\r\n\r\n\0"
    out = feed_all(b"\n\n" + send + b"\r\n" + connected + b"\n", piece)
    assert [(f.command, f.headers, f.body, f.size) for f in out] == [
        ("SEND", {"destination": "a:b", "note": "line\nwith\\slash", "content-length": "3"}, b"x\0y", len(send)),
        ("CONNECTED", {"version": "1.2", "server": "a\\b"}, b"", len(connected))]


def test_the_loads_send_frame_is_the_frame_the_grammar_gives():
    frames = SendFrames("orders:eu", {"ce-fwrun": "r1"}, "ce-id", "fw-sent-ns", b"\0" * 5)
    data = frames.encode("lg-0-42", 1_800_000_000_123_456_789)
    assert data == frame("SEND", {"destination": "orders:eu", "ce-fwrun": "r1", "ce-id": "lg-0-42",
                                  "fw-sent-ns": "1800000000123456789", "receipt": "lg-0-42"}, b"\0" * 5)
    (f,) = FrameReader().feed(data)
    assert f.headers["destination"] == "orders:eu" and f.body == b"\0" * 5


@pytest.mark.parametrize("data, said", [
    (b"SEND\nno colon here\n\n\0", "a header without a colon"),
    (b"SEND\nx:a\\tb\n\n\0", "undefined escape"),
    (b"SEND\ncontent-length:2\n\nabc\0", "not followed by NUL"),
    (b"SEND\ncontent-length:-1\n\n\0", "content-length '-1'"),
])
def test_bytes_that_are_no_stomp_are_said(data, said):
    with pytest.raises(FrameError, match=said):
        FrameReader().feed(data)


@pytest.mark.parametrize("target, said", [
    ("stomp://127.0.0.1:61613/", "names its destination"),
    ("stomp://127.0.0.1:61613/q?type=fanout", "?type=fanout: anycast or multicast"),
    ("stomp://127.0.0.1:61613/q?prefetch=5", "unknown option 'prefetch'"),
])
def test_a_bad_stomp_target_is_one_line_and_exit_2(target, said):
    r = subprocess.run([sys.executable, "-m", "loadgen", "attack", "--target", target, "--rate", "10", "--duration",
                        "1s", "--no-telemetry", "--metrics-listen", "none"], cwd=ROOT, capture_output=True, text=True,
                       timeout=60, env=dict(os.environ, PYTHONPATH=ROOT))
    assert r.returncode == 2 and said in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


@pytest.fixture(scope="module")
def stomp_artemis(tmp_path_factory):
    if shutil.which("java") is None:
        pytest.skip("Artemis needs Java 17 (.ci/run installs it)")
    yield from running(artemis.start_artemis, artemis.stop_artemis, tmp_path_factory, "artemis-stomp")


@pytest.mark.integration
@pytest.mark.brokers
def test_a_run_through_artemis_over_stomp_with_its_receiver_started_for_it_is_exact(broker, stomp_artemis, tmp_path):
    """1,000/s for 8 s to Artemis' queue over STOMP (its one acceptor speaks every protocol): every SEND acknowledged
    by its RECEIPT, the receiver started for the run (``--receiver auto``) subscribed before the load, the job's
    figures exact against the raw telemetry (``assert_exact``), every receive the run receiver's."""
    port, _, _ = stomp_artemis
    run_id, topic, rate, seconds = "stomp-exact", "tel-stomp", 1000, 8
    create_topic(broker, topic)
    env = dict(os.environ, PYTHONPATH=ROOT, FLIGHTWATCH_CLOCK_REFERENCE="none", FLIGHTWATCH_DRIVER_MEMORY="1g",
               FLIGHTWATCH_CHECKPOINTS=str(tmp_path / "checkpoints"))
    lg = subprocess.run([sys.executable, "-m", "loadgen", "attack", "--target",
                         f"stomp://{LOGIN}@127.0.0.1:{port}/{artemis.QUEUE}", "--rate", str(rate), "--duration",
                         f"{seconds}s", "--run", run_id, "--telemetry-bootstrap", broker, "--telemetry-topic", topic,
                         "--out", str(tmp_path / "lg"), "--metrics-listen", "none", "--receiver", "auto", "--stream",
                         "--drop-timeout", EXACT_DROP_TIMEOUT, "--quiet"],
                        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert lg.returncode == 0, lg.stdout[-3000:] + lg.stderr[-3000:]
    assert "receiver: started for the run on stomp://" in lg.stdout, lg.stdout[-3000:]
    assert f":{artemis.PASSWORD}@" not in lg.stdout + lg.stderr  # the URL shown with its user alone
    s = json.load(open(tmp_path / "checkpoints" / run_id / "summary.json"))
    report = json.load(open(tmp_path / "lg" / "report.json"))
    records = telemetry(broker, topic, run_id)
    assert_exact(f"stomp:// to Artemis, {rate:,}/s {seconds} s", s, ground_truth(records), report, rate * seconds)
    assert {r["agent"] for r in records if r["kind"] == "recv"} == {"receiver-stomp-run"}
    assert report["success_ratio"] == 1.0 and 0 < report["latency_us"]["p50"]  # the RECEIPT: the broker's answer
