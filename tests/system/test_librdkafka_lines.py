"""librdkafka's own lines go through the repeat filter (``core.logs.librdkafka_logger``), in every process that has a
Kafka client: a Kafka SUT killed -9 under a live load generator and a live Kafka receiver agent, both on a real Tansu
broker. librdkafka says ``FAIL`` for each broker connection about three times a second while the broker is away; without
the filter the load generator's terminal got each of them, raw (``%3|…|FAIL|…``)."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest
from support import ROOT, create_topic

from core.procs import free_port, stop_process
from stack.tansu import start_tansu

pytestmark = pytest.mark.integration
AWAY_S = 8
"""How long the SUT broker is away while both clients run: ~24 librdkafka FAIL lines a connection, unfiltered."""
RAW = re.compile(r"^%\d\|\d")
"""A line librdkafka printed itself (``%3|1764000000.123|FAIL|rdkafka#producer-1| …``): none may reach a terminal."""


def librdkafka_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if RAW.match(line) or " librdkafka: " in line]


def test_a_kafka_sut_killed_under_a_live_client_gives_each_librdkafka_line_once_not_three_times_a_second(broker, tmp_path):
    port = free_port()
    sut = start_tansu(port, open(tmp_path / "sut.log", "wb"), "flightwatch-sut")
    bootstrap, topic = f"127.0.0.1:{port}", "sut-away"
    env = dict(os.environ, PYTHONPATH=ROOT, FLIGHTWATCH_CLOCK_REFERENCE="none")
    rx_log = tmp_path / "receiver.log"
    receiver = lg = None
    try:
        create_topic(bootstrap, topic)
        receiver = subprocess.Popen(
            [sys.executable, "-m", "agents.receiver", "kafka", "--bootstrap", bootstrap, "--topic", topic,
             "--telemetry-bootstrap", broker, "--telemetry-topic", "tel-sut-away", "--state-dir", str(tmp_path / "rx"),
             "--metrics-listen", "none", "--clock-reference", "none"],
            cwd=ROOT, env=env, stdout=open(rx_log, "w"), stderr=subprocess.STDOUT, start_new_session=True)
        lg = subprocess.Popen([sys.executable, "-m", "loadgen", "attack", "--quiet", "--target",
                               f"kafka://{bootstrap}/{topic}", "--rate", "200", "--duration", f"{AWAY_S + 3}s",
                               "--timeout", "3s", "--no-telemetry", "--metrics-listen", "none", "--wait", "0s", "--out",
                               str(tmp_path / "lg")],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(3)  # both clients connected and at work
        assert lg.poll() is None and receiver.poll() is None, rx_log.read_text()[-2000:]
        os.kill(sut.pid, signal.SIGKILL)  # by its PID
        sut.wait()
        out, err = lg.communicate(timeout=120)
    finally:
        stop_process(sut)
        for p in (lg, receiver):
            if p is not None and p.poll() is None:
                stop_process(p, wait_s=30, group=p is receiver)
    terminal = librdkafka_lines(out + err)
    logged = librdkafka_lines(rx_log.read_text(errors="replace"))
    print(f"\nthe SUT broker away {AWAY_S} s: the load generator's terminal {len(terminal)} librdkafka lines, the "
          f"receiver's log {len(logged)}:\n" + "\n".join(terminal + logged))
    for lines in (terminal, logged):
        assert not [line for line in lines if RAW.match(line)], lines  # none printed by librdkafka itself
        # each text (its numbers aside) at most once in the repeat filter's minute; a few texts (refused, disconnected,
        # timed out) for each of the client's connections, not ~3 a second for each
        texts = {re.sub(r"\d[\d,.:]*", "#", line.split(" librdkafka: ", 1)[-1]) for line in lines}
        assert len(lines) == len(texts) <= 12, lines
    assert terminal, "the load generator said nothing of the broker's going"
