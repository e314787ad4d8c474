"""Moving the embedded stack's ports moves every default with them: `make attack`, `make stream`, `make ui`, the
stack's own commands and each command's --help, from the same settings (FLIGHTWATCH_TELEMETRY_PORT, _SUT_PORT,
_UI_PORT, and the documented HOST:PORT metrics settings)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from support import ROOT

MOVED = {"FLIGHTWATCH_TELEMETRY_PORT": "19999", "FLIGHTWATCH_SUT_PORT": "29999", "FLIGHTWATCH_UI_PORT": "18777",
         "FLIGHTWATCH_KAFKA_RECEIVER_METRICS_LISTEN": "127.0.0.1:19888", "FLIGHTWATCH_NODE_METRICS_METRICS_LISTEN": "127.0.0.1:19889",
         "FLIGHTWATCH_NO_INSTALL": "1", "PYTHONPATH": ROOT}


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("FLIGHTWATCH_BOOTSTRAP", "FLIGHTWATCH_SUT_BOOTSTRAP")}
    return {**env, **MOVED}


def _run(*cmd) -> str:
    r = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_make_follows_the_stacks_ports():
    planned = " ".join(_run("make", "-n", "attack", "stream", "ui").split())
    assert "--telemetry-bootstrap 127.0.0.1:19999" in planned and "--bootstrap 127.0.0.1:19999" in planned
    assert "--server.port 18777" in planned and "19092" not in planned


def test_the_stack_and_every_command_follow_them():
    cmds = json.loads(_run(sys.executable, "-c", "import json, stack.__main__ as s; "
                                                 "print(json.dumps(s.commands(s.Stack.configured())))"))
    node, kafka = " ".join(cmds["node-metrics"]), " ".join(cmds["kafka-receiver"])
    assert "--telemetry-bootstrap 127.0.0.1:19999" in node and "--metrics-listen 127.0.0.1:19889" in node
    assert "--bootstrap 127.0.0.1:29999" in kafka and "--metrics-listen 127.0.0.1:19888" in kafka
    assert "--server.port 18777" in " ".join(cmds["ui"])
    assert "default kafka://127.0.0.1:29999/flightwatch.sut" in " ".join(_run(sys.executable, "-m", "loadgen", "attack",
                                                                                "--help").split())
    for cmd in (("streaming", "run"), ("agents.receiver", "http"), ("agents.node_metrics",), ("loadgen.synthetic",)):
        text = " ".join(_run(sys.executable, "-m", *cmd, "--help").split())
        assert "127.0.0.1:19999" in text and "19092" not in text, cmd


def test_the_stacks_flags_move_them_as_the_variables_do(tmp_path):
    """``python -m stack ACTION --telemetry-port P --stack-dir D``: the same as the variables (core.settings)."""
    code = ("import json, sys, stack.__main__ as s; "
            f"s.main(['status', '--telemetry-port', '19998', '--sut-port', '29998', '--stack-dir', {str(tmp_path)!r}]); "
            "st = s.Stack.configured(); print(json.dumps([st.dir, st.ports, s.commands(st)]))")
    env = {k: v for k, v in _env().items() if k not in ("FLIGHTWATCH_TELEMETRY_PORT", "FLIGHTWATCH_SUT_PORT")}
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    stack_dir, ports, cmds = json.loads(r.stdout.splitlines()[-1])
    assert stack_dir == str(tmp_path) and (ports["telemetry-broker"], ports["sut-broker"]) == (19998, 29998)
    assert "--telemetry-bootstrap 127.0.0.1:19998" in " ".join(cmds["node-metrics"])
    assert "--bootstrap 127.0.0.1:29998" in " ".join(cmds["kafka-receiver"])
    assert str(tmp_path) in " ".join(cmds["kafka-receiver"])
