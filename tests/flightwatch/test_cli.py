"""``flightwatch``, the one command (``flightwatch.cli``): every subcommand is its component's own command with the same
flags, ``attack`` is what ``make attack`` runs, and the make targets call it."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from support import ROOT

from flightwatch.cli import ATTACK_DEFAULTS, COMMANDS, DEFAULT_RATE, argv_of, stack_step

ISSUE_NAMES = ("up", "down", "status", "attack", "scenario", "replay", "summary", "compare", "history", "ui")


def _flightwatch(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flightwatch", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env=env or dict(os.environ, PYTHONPATH=ROOT))


def test_help_lists_every_command_with_an_example_and_a_wrong_one_is_one_line():
    out = _flightwatch("--help")
    assert out.returncode == 0
    for name in ISSUE_NAMES:
        assert re.search(rf"^  {name} +\S", out.stdout, re.M) and f"  flightwatch {name}" in out.stdout, name
    bad = _flightwatch("atack", "--rate", "5")
    assert bad.returncode == 2 and bad.stdout == "" and len(bad.stderr.strip().splitlines()) == 1
    assert "unknown command 'atack': one of up, down," in bad.stderr


@pytest.mark.parametrize("name", ["attack", "summary", "compare", "up", "report"])
def test_each_commands_help_is_an_example_then_its_components_own_flags(name):
    out = _flightwatch(name, "--help")
    c = COMMANDS[name]
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"flightwatch {name}: {c.what}\n  example: {c.example}\n")
    assert f"usage: python -m {c.module}" in out.stdout


def test_attack_is_make_attacks_defaults_under_the_users_own_flags():
    cmd = argv_of("attack", ["--pace", "1000:5", "--no-receiver", "--no-stack"])
    assert cmd[1:4] == ["-m", "loadgen", "attack"] and "--no-stack" not in cmd
    assert cmd[4:4 + len(ATTACK_DEFAULTS)] == list(ATTACK_DEFAULTS) and "--rate" not in cmd
    assert cmd.index("--no-receiver") > cmd.index("--receiver")  # argparse: the last one wins
    assert argv_of("attack", [])[-2:] == ["--rate", DEFAULT_RATE] and "--rate" not in argv_of("attack", ["--rate=9"])[:-1]


@pytest.mark.parametrize("args, step", [
    ([], ["renew-sut"]),
    (["--sut", "kafka", "--rate", "10"], ["renew-sut", "--sut", "kafka"]),
    (["--target", "kafka://h:1/orders"], ["up", "--no-sut"]),            # a broker of the user's: no SUT started
    (["--target=amqps://h/%2F?queue=q", "--sut", "rabbitmq"], ["up", "--no-sut", "--sut", "rabbitmq"]),
    (["--no-stack", "--target", "kafka://h:1/orders"], None),            # telemetry elsewhere: nothing of the stack
    (["--help"], None),
])
def test_attack_first_renews_the_stacks_sut_or_starts_none_for_a_target(args, step, monkeypatch):
    monkeypatch.delenv("FLIGHTWATCH_TARGET", raising=False)
    got = stack_step(args)
    assert (got if got is None else got[1:]) == (step if step is None else ["-m", "stack", *step])


def test_the_make_targets_call_it():
    makefile = open(os.path.join(ROOT, "Makefile")).read()
    for target, name in (("up", "up"), ("status", "status"), ("attack", "attack"), ("scenario", "scenario"),
                         ("replay", "replay"), ("summary", "summary"), ("compare", "compare"), ("history", "history"),
                         ("ui", "ui")):
        recipe = re.search(rf"^{target}:.*\n((?:\t.*\n)+)", makefile, re.M).group(1)
        assert f"$(FLIGHTWATCH) {name}" in recipe, (target, recipe)
    planned = subprocess.run(["make", "-n", "attack", "RATE=100", "TARGET=kafka://h:1/t", "NO_RECEIVER=1"], cwd=ROOT,
                             capture_output=True, text=True, timeout=60, env=dict(os.environ, FLIGHTWATCH_NO_INSTALL="1"))
    line = " ".join(planned.stdout.replace("\\\n", " ").split())
    assert re.search(r"bin/flightwatch attack --rate 100 --duration 60s --target kafka://h:1/t .* --no-receiver", line), line


def test_scenario_list_is_the_scenarios_own():
    assert argv_of("scenario", ["list"])[1:] == ["-m", "scenarios", "list"]
    assert argv_of("scenario", ["kafka-matrix", "--short"])[1:] == ["-m", "scenarios", "run", "kafka-matrix", "--short"]
