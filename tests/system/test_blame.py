"""Blame goes where it belongs, with real parts end to end: the load generator on the Kafka target, the Kafka receiver
agent with its spool and shipper, the streaming job on Spark, two Tansu brokers (the telemetry plane's and the SUT's).

flightwatch's own outage (its telemetry broker killed) is never the SUT's latency nor its saturation; a crash of the
system under test (its broker killed) still is."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
from support import ROOT, create_topic, job_command, job_env, telemetry, wait_for_first_batch
from support.brokers import EXACT_DROP_TIMEOUT

from core.procs import free_port, stop_process
from stack.tansu import start_tansu

pytestmark = [pytest.mark.integration, pytest.mark.faults]
RATE, SECONDS = 2000, 20
MAX_NOISE_US = 35_000
"""How far the flight-time max (one event's) of this test's two runs fall apart with nothing wrong: 25.5 to 40.3 ms in
30 undisturbed runs here (14.8 ms apart), and in CI on 2026-11-29 an outage run's max of 60.9 ms against the calm run's
28.1 (32.8 ms: one stall on the shared machine, its p99 24.7 ms against 22.7). What this bounds fails by far more: the
receiver held up by the outage (max 5.3 s), and the job's catch-up at a plain ``os.nice`` (85.6 ms against 35.0)."""


def _receiver_count(port: int) -> int:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return int(sum(float(line.split()[-1]) for line in text.splitlines()
                   if line.startswith("flightwatch_kafka_receiver_events_total")))


@dataclass
class _Run:
    """One run of ``RATE``/s for ``SECONDS`` on the Kafka target: its folder, topics, receiver and live job."""
    d: Path
    tel: str
    sut_bootstrap: str
    drop_timeout: str
    metrics_port: int = 0
    receiver: subprocess.Popen | None = None
    job: subprocess.Popen | None = None

    @property
    def name(self) -> str:
        return self.d.name

    def start(self) -> _Run:
        """Its receiver and job, until the job has run its first batch."""
        self.d.mkdir()
        topic, sut_topic = f"tel-{self.name}", f"sut-{self.name}"
        create_topic(self.tel, topic)
        create_topic(self.sut_bootstrap, sut_topic)
        self.metrics_port = free_port()
        self.receiver = subprocess.Popen(
            [sys.executable, "-m", "agents.receiver", "kafka", "--bootstrap", self.sut_bootstrap, "--topic", sut_topic,
             "--telemetry-bootstrap", self.tel, "--telemetry-topic", topic, "--state-dir", str(self.d / "rx"),
             "--metrics-listen", f"127.0.0.1:{self.metrics_port}"],
            cwd=ROOT, env=ENV, stdout=open(self.d / "receiver.log", "w"), stderr=subprocess.STDOUT,
            start_new_session=True)
        self.job = subprocess.Popen(job_command("run", "--run", self.name, "--bootstrap", self.tel, "--topic", topic,
                                                "--checkpoints", str(self.d), "--drop-timeout", self.drop_timeout),
                                    cwd=ROOT, env=job_env(), stdout=open(self.d / "job.log", "w"),
                                    stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_for_first_batch(self.tel, topic, self.name, self.d / self.name / "batches")
        except BaseException:
            self.stop()
            raise
        return self

    def attack(self, fault=None) -> None:
        """The load generator's attack, ``fault(lg)`` beside it."""
        try:
            lg = subprocess.Popen([sys.executable, "-m", "loadgen", "attack", "--quiet", "--target",
                                   f"kafka://{self.sut_bootstrap}/sut-{self.name}", "--run", self.name, "--workers", "1",
                                   "--out", str(self.d / "lg"), "--telemetry-bootstrap", self.tel, "--telemetry-topic",
                                   f"tel-{self.name}", "--rate", str(RATE), "--duration", f"{SECONDS}s"],
                                  cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            t = threading.Thread(target=fault, args=(lg,)) if fault else None
            if t:
                t.start()
            out = lg.communicate(timeout=240)[0]
            if t:
                t.join()
            assert lg.returncode in (0, 1), out[-3000:]
        except BaseException:
            self.stop()
            raise

    def close(self) -> tuple[dict, int, list]:
        """Once the job has closed the run: its summary, the receives the receiver counted, and the run's telemetry as
        written after the run."""
        try:
            assert self.job.wait(300) == 0, (self.d / "job.log").read_text()[-3000:]
            received = _receiver_count(self.metrics_port)
            records = telemetry(self.tel, f"tel-{self.name}", self.name)
        finally:
            self.stop()
        return json.load(open(self.d / self.name / "summary.json")), received, records

    def stop(self) -> None:
        for p in (self.job, self.receiver):
            if p is not None and p.poll() is None:
                stop_process(p, wait_s=30, group=True)


ENV = dict(os.environ, PYTHONPATH=ROOT, FLIGHTWATCH_CLOCK_REFERENCE="none")


def _kafka_run(tmp_path, name: str, tel_port: int, sut_bootstrap: str, fault=None,
               drop_timeout: str = "10s") -> tuple[dict, int, list]:
    """One run of ``RATE``/s for ``SECONDS`` on the Kafka target, the job live: its summary, the receives the receiver
    counted, and the run's telemetry as written after the run. ``fault(lg)`` runs beside the attack."""
    run = _Run(tmp_path / name, f"127.0.0.1:{tel_port}", sut_bootstrap, drop_timeout).start()
    run.attack(fault)
    return run.close()


def _flight(s: dict) -> dict:
    return {k: s["latency_us"][k] for k in ("p50", "p99", "max")}


@pytest.mark.serial
def test_a_telemetry_broker_killed_for_10s_is_not_the_suts_latency_nor_its_saturation(broker, tmp_path):
    """kill -9 of the telemetry broker 5 s into a 2,000/s Kafka-target attack, started again (empty) 10 s later. The
    Kafka receiver never waits on telemetry (its receive records go to its disk spool), so flight time is the SUT's:
    against an undisturbed run of the same schedule, `runs compare` finds no percentile worse beyond the noise, and the
    max is within 20% or the measured noise of a max (``MAX_NOISE_US``). No event is counted as
    dropped because the broker lost its records, none twice; the verdict is not saturated and names the outage."""
    tel_port = free_port()
    tel_broker = start_tansu(tel_port, open(tmp_path / "tel-1.log", "wb"), "flightwatch-tel")
    state = {"broker": tel_broker}

    def kill_and_restart(lg) -> None:
        time.sleep(5)
        os.kill(state["broker"].pid, signal.SIGKILL)  # by its PID: everything it held is gone
        state["broker"].wait()
        state["killed_ns"] = time.time_ns()
        time.sleep(10)
        state["broker"] = start_tansu(tel_port, open(tmp_path / "tel-2.log", "wb"), "flightwatch-tel")
        create_topic(f"127.0.0.1:{tel_port}", "tel-outage")

    tel = f"127.0.0.1:{tel_port}"
    try:
        calm = _Run(tmp_path / "calm", tel, broker, EXACT_DROP_TIMEOUT).start()
        calm.attack()
        # the second run's receiver and job start while the first run's job closes it: what it measured is done
        outage = _Run(tmp_path / "outage", tel, broker, EXACT_DROP_TIMEOUT).start()
        calm, calm_rx, _ = calm.close()
        outage.attack(kill_and_restart)
        hit, hit_rx, records = outage.close()
    finally:
        stop_process(state["broker"])
    recvs = [r for r in records if r["kind"] == "recv"]
    after = [r for r in recvs if r["at_ns"] > state["killed_ns"]]
    v = hit["verdict"]
    print(f"\nundisturbed: flight {_flight(calm)} us, {calm['sent']:,} sent, {calm['received']:,} received, "
          f"verdict {calm['verdict']['message']!r}\n"
          f"telemetry broker killed 10 s: flight {_flight(hit)} us, {hit['sent']:,} sent, {hit['received']:,} received, "
          f"{hit['dropped']} dropped, {hit.get('unaccounted', 0)} unaccounted, receiver counted {hit_rx:,} "
          f"(undisturbed {calm_rx:,}); {len(after):,} receive records written after the kill; verdict {v['message']!r}")
    assert calm_rx == calm["sent"] == calm["received"] and calm["dropped"] == 0
    assert hit_rx >= RATE * SECONDS * 0.98  # the receiver consumed on through the outage
    # flight time is the SUT's, not flightwatch's outage (before, the receiver stopped consuming: p99 4.9 s, max 5.3 s):
    # compared with the undisturbed run as `runs compare` does, no percentile is worse beyond the noise
    from runs.compare import RunSample, compare, text

    rep = compare(RunSample.load(str(tmp_path / "calm" / "calm")), RunSample.load(str(tmp_path / "outage" / "outage")))
    print(text(rep))
    for r in rep["whole_run"]:
        if r["metric"] in ("p50", "p90", "p99"):
            assert r["verdict"] != "regression", text(rep)
    assert rep["windows_left_out"]["baseline"] == 0 < rep["windows_left_out"]["candidate"] <= 12
    # the max is one event's, as noisy as one stall of the machine: within 20%, or within the noise a max was measured
    # to have (MAX_NOISE_US) of the undisturbed run's
    # (the job catches up at nice 10 in its own scheduling group: with os.nice alone, which autogroup scheduling confines
    # to the job's session, its catching up after the restart made this max 53.8 ms against 33.7, which this bound no
    # longer tells from a stall, and 85.6 against 35.0, which it does; tests/core/test_priority.py holds the group's share)
    assert hit["latency_us"]["max"] <= max(1.2 * calm["latency_us"]["max"], calm["latency_us"]["max"] + MAX_NOISE_US), (
        _flight(hit), _flight(calm))
    # every receive made while the broker was away reached the new broker, once (identical repeats aside)
    assert len(after) >= RATE * 9 and len({r["event_id"] for r in after}) == len({(r["event_id"], r["at_ns"]) for r in after})
    assert hit["duplicates"] == 0 and hit["late"] == 0
    assert hit["dropped"] == 0  # no false drops: sends whose receive records the broker lost are unaccounted
    assert hit["telemetry_reset"]
    assert v["saturated_at"] is None and v["state"] in ("ok", "degrading"), v["message"]
    assert "flightwatch's telemetry broker" in v["message"] and v["telemetry_incomplete_windows"] >= 1


def test_a_killed_sut_broker_is_still_the_suts_saturation(tmp_path):
    """kill -9 of the SUT broker 8 s into a 2,000/s Kafka-target attack, started again (empty) 6 s later: what it held
    is lost, sends failed meanwhile. That is the system under test's, and the verdict says saturated."""
    tel_port, sut_port = free_port(), free_port()
    tel_broker = start_tansu(tel_port, open(tmp_path / "tel.log", "wb"), "flightwatch-tel")
    sut = {"broker": start_tansu(sut_port, open(tmp_path / "sut-1.log", "wb"), "flightwatch-sut")}
    sut_bootstrap = f"127.0.0.1:{sut_port}"

    def kill_and_restart(lg) -> None:
        time.sleep(8)
        os.kill(sut["broker"].pid, signal.SIGKILL)
        sut["broker"].wait()
        time.sleep(6)
        sut["broker"] = start_tansu(sut_port, open(tmp_path / "sut-2.log", "wb"), "flightwatch-sut")
        try:
            create_topic(sut_bootstrap, "sut-sutcrash")
        except Exception:  # noqa: BLE001 - a client's metadata request created it already
            pass

    try:
        s, _, _ = _kafka_run(tmp_path, "sutcrash", tel_port, sut_bootstrap, fault=kill_and_restart)
    finally:
        stop_process(sut["broker"])
        stop_process(tel_broker)
    v = s["verdict"]
    print(f"\nSUT broker killed 6 s: {s['sent']:,} sent, {s['received']:,} received, {s['dropped']:,} dropped, "
          f"errors {s.get('errors')}; verdict {v['message']!r}")
    assert v["state"] == "saturated" and v["saturated_at"] is not None, v["message"]
    assert v["message"].startswith("saturated at step 1 (2,000/s): ")
    assert s["latency_us"]["max"] >= 5_000_000  # the events the SUT held while it was away
