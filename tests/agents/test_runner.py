"""The one receiver process (``agents.runner.Process``) around a source of its own: its duties between the
source's turns, /metrics, and the spool's lines in the telemetry topic after its shutdown. A real spool, shipper,
Tansu broker and clock reference; the source is the test's (what it receives is counted by hand)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from types import SimpleNamespace

import pytest
from support import ROOT, create_topic, free_port, telemetry

from agents import runner
from core import contract
from core.clock import ClockReference

pytestmark = pytest.mark.integration


class Counting:
    """A source that receives one event a turn: stamped, taken, recorded (``agents.source.Source``)."""

    def __init__(self, spool, agent: str, run_id: str) -> None:
        self.spool, self.agent, self.run_id = spool, agent, run_id
        self.lines = contract.FastLines("", agent)
        self.num_received = self.num_unattributed = 0

    def receive(self) -> None:
        self.spool.append(self.lines.recv(self.run_id, time.time_ns(), f"e{self.num_received}", 10))
        self.num_received += 1

    def counters(self) -> dict:
        return {"agent": self.agent, "received": self.num_received, "unattributed": 0,
                "telemetry": self.spool.counters()}

    def collect(self):
        from core.metrics import family

        yield family("counter", "flightwatch_test_receiver_events", "events recorded", ["agent"],
                     [((self.agent,), self.num_received)])

    def progress(self) -> tuple[tuple, str]:
        return (self.num_received,), f"receiver {self.agent}: {self.num_received:,} received"


def blocking(broker: str, tel: str, run_id: str, agent: str, folder: str, port: int) -> dict:
    """200 turns of 10 ms of a ``Counting`` source in a ``Process``, then SIGTERM: what it said and served. Run in a
    process of its own (prometheus-client's multi-process folder is set before its import)."""
    os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
    runner.PROGRESS_S = 0.5
    ref = ClockReference("127.0.0.1", 0).start()
    said: list[str] = []
    a = SimpleNamespace(telemetry_bootstrap=broker, telemetry_topic=tel, clock_reference=ref.address)
    process = runner.Process(a, agent, os.path.join(folder, "spool"), 1 << 20, os.path.join(folder, "shipper.log"),
                             lambda line, **_: said.append(line), print, metrics_dir=os.path.join(folder, "metrics"))
    source = Counting(process.spool, agent, run_id)
    before = signal.getsignal(signal.SIGTERM)
    scraped: list[str] = []

    def turn() -> None:
        source.receive()
        time.sleep(0.01)
        if source.num_received == 150:
            scraped.append(urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode())
        if source.num_received == 200:
            os.kill(os.getpid(), signal.SIGTERM)

    try:
        process.start(source, f"127.0.0.1:{port}")
        process.run_blocking(turn)
    finally:
        process.close()  # the shipper drains the spool, then exits
        ref.close()
    return {"said": said, "scraped": scraped, "received": source.num_received,
            "handler_restored": signal.getsignal(signal.SIGTERM) is before}


def test_a_blocking_source_gets_every_duty_between_its_turns_and_its_lines_reach_the_telemetry(broker, tmp_path):
    """200 turns of 10 ms, then SIGTERM: the progress line said (every 0.5 s here) with the figures, /metrics serves
    the source's family, a clock record is in the telemetry beside the 200 receive lines, all of them once, and the
    process's SIGTERM handler is the one it had before."""
    tel, run_id, agent = "tel-runner", "runner-blocking", "rx-runner"
    create_topic(broker, tel)
    args = [broker, tel, run_id, agent, str(tmp_path), str(free_port())]
    p = subprocess.run([sys.executable, __file__, *args], cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.path.join(ROOT, "tests")])))
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["handler_restored"] and out["received"] == 200
    assert any(line == f"receiver {agent}: {n:,} received" for line in out["said"] for n in range(1, 200)), out
    assert f'flightwatch_test_receiver_events_total{{agent="{agent}"}}' in out["scraped"][0], out["scraped"][0][:2000]
    records = telemetry(broker, tel, run_id)
    assert sorted(r["event_id"] for r in records if r["kind"] == "recv") == sorted(f"e{i}" for i in range(200))
    clocks = [r for r in telemetry(broker, tel, contract.ANY_RUN) if r["kind"] == "clock"]
    assert clocks and {r["agent"] for r in clocks} == {agent}, clocks[:3]


if __name__ == "__main__":
    bootstrap, topic, run, name, where, listen = sys.argv[1:]
    print(json.dumps(blocking(bootstrap, topic, run, name, where, int(listen))))
