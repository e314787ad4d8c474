"""``flightwatch``: one command for what ``make`` and ``python -m`` do, each subcommand the component's own command
with the same flags (``flightwatch attack --rate 5000`` is ``make attack RATE=5000``).

    flightwatch up [--sut kafka]          the embedded stack (python -m stack up)
    flightwatch attack [--rate 5000]      the stack's SUT renewed (or, with --target, no SUT started), then the attack,
                                          streamed, its receiver following the target, a probe first
    flightwatch summary --run RUN         ... and down, status, scenario, replay, compare, history, report, ui

Each subcommand runs its component as this process (exec), so its exit code, signals and output are the component's.
``flightwatch CMD --help`` shows an example, then the component's own flags.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass

from core import settings, testfile
from core.units import one_line


@dataclass(frozen=True)
class Command:
    module: str            # python -m MODULE
    head: tuple[str, ...]  # what comes before the user's arguments
    what: str
    example: str


COMMANDS = {
    "up": Command("stack", ("up",), "start the embedded stack on loopback: brokers, Prometheus, receivers, node "
                  "metrics (--sut rabbitmq|rabbitmq-amqp1|artemis|kafka: that broker as the SUT, remembered until "
                  "down)", "flightwatch up --sut kafka"),
    "down": Command("stack", ("down",), "stop exactly what `up` started, by the PIDs it recorded", "flightwatch down"),
    "status": Command("stack", ("status",), "what of the embedded stack runs", "flightwatch status"),
    "attack": Command("loadgen", ("attack",), "attack a target at a rate or pace, streamed live; the stack's SUT "
                      "renewed first, or with --target none started; a receiver follows the target (--no-receiver: "
                      "yours do) and a probe goes first (--probe-timeout 10s); --no-stack: none of the embedded "
                      "stack is started (your telemetry broker: --telemetry-bootstrap)",
                      "flightwatch attack --target kafka://127.0.0.1:29192/orders --rate 2000 --duration 30s"),
    "run": Command("loadgen", ("attack",), "run a test written down as a file (TOML: the target, its login, the "
                   "rate or pace, thresholds, a gate; flightwatch run --help lists its keys), as flightwatch attack "
                   "with those flags; flags after the file override it", "flightwatch run examples/kafka.toml"),
    "scenario": Command("scenarios", ("run",), "run a seed's experiment on the stack, one report (their names: "
                        "flightwatch scenario list)", "flightwatch scenario kafka-matrix --short"),
    "replay": Command("streaming", ("replay",), "recompute a run from its archive", "flightwatch replay --run r1"),
    "summary": Command("streaming", ("summary",), "print a run's summary", "flightwatch summary --run r1"),
    "compare": Command("runs", ("compare",), "is a run worse than its baseline, beyond the noise?",
                       "flightwatch compare r1 r2 --fail-on-regression 'p99>+10%'"),
    "history": Command("runs", ("history",), "a scenario's runs and their significant changes",
                       "flightwatch history checkout"),
    "report": Command("ui.report", (), "write a run's (or a scenario run's) report.html: one self-contained file "
                      "to hand on, no server needed (flightwatch attack writes it when the run closes)",
                      "flightwatch report demo"),
    "ui": Command("streamlit", ("run",), "serve the dashboard on loopback (opens on the live run, else the latest; "
                  "FLIGHTWATCH_UI_PORT, default 18501)", "flightwatch ui"),
}
ATTACK_DEFAULTS = ("--stream", "--receiver", "auto", "--probe-timeout", "10s")
"""What ``flightwatch attack`` adds, as ``make attack`` does (the user's own flags come after, and win)."""
DEFAULT_RATE = "5000"


def usage() -> str:
    lines = [__doc__.split("\n\n")[0], "", "usage: flightwatch COMMAND [ARGS]   (flightwatch COMMAND --help: its flags)",
             "", "commands:"]
    lines += [textwrap.fill(c.what, 118, initial_indent=f"  {name:<10}", subsequent_indent=" " * 12)
              for name, c in COMMANDS.items()]
    lines += ["", "examples:"] + [f"  {c.example}" for c in COMMANDS.values()]
    return "\n".join(lines)


def argv_of(name: str, args: list[str]) -> list[str]:
    """The component's command line for ``flightwatch NAME ARGS``."""
    c = COMMANDS[name]
    if name == "ui":  # the stack's own dashboard command; --server.port N (or FLIGHTWATCH_UI_PORT) moves it
        from stack.__main__ import ui_command

        port = settings.get("FLIGHTWATCH_UI_PORT", "18501")
        if "--server.port" in args[:-1]:
            at = args.index("--server.port")
            port, args = args[at + 1], args[:at] + args[at + 2:]
        return [*ui_command(int(port)), *args]
    extra: list[str] = []
    if name == "scenario" and args[:1] in (["list"], ["report"]):  # python -m scenarios' other actions
        return [sys.executable, "-m", c.module, *args]
    if name == "attack":
        extra = list(ATTACK_DEFAULTS)
        if not any(a in ("--rate", "--pace") or a.startswith(("--rate=", "--pace=")) for a in args):
            extra += ["--rate", DEFAULT_RATE]
        args = [a for a in args if a != "--no-stack"]
    return [sys.executable, "-m", c.module, *c.head, *extra, *args]


def run_help() -> str:
    """``flightwatch run --help``: the test file's keys, each with the attack's flag it stands for, and a
    scenario's."""
    head = testfile.__doc__.split("\n\n")
    lines = ["usage: flightwatch run FILE.toml [ATTACK FLAGS]   (a scenario: [SCENARIO FLAGS], e.g. --short, --peer)",
             "", head[0], "", head[1], "", "keys:"]
    own = "(the file's own)"
    lines += [f"  {k:<20} {(v.flag or own):<22} {v.what}" for k, v in testfile.KEYS.items()]
    prose = [textwrap.fill(" ".join(h.replace("``", "").split()), 118) for h in head[2:]]
    lines += ["", prose[0], "",
              f"a scenario's keys besides {', '.join(testfile.CELL_KEYS)} and the ones it shares with a test:"]
    lines += [f"  {k:<20} {v}" for k, v in testfile.SCENARIO_KEYS.items()]
    return "\n".join([*lines, "", *prose[1:]])


def run_file(path: str, more: list[str]) -> tuple[str, list[str]]:
    """``flightwatch run FILE [FLAGS]`` as the command it is: a test's attack with the file's flags, or a scenario's
    run (a file with ``[axes]``, checked by ``python -m scenarios`` as it starts); ``testfile.FileError`` for a
    mistake in a test, at its line."""
    from transports.registry import TargetSpec

    text, doc = testfile.read(path)
    if testfile.is_scenario(doc):
        return "scenario", [path, *more]
    return "attack", testfile.flags(path, text, doc, check_target=TargetSpec.parse) + more


def stack_step(args: list[str]) -> list[str] | None:
    """``flightwatch attack``'s first step, as ``make attack`` runs it: the SUT renewed (restarted empty), or with
    ``--target`` the stack without a SUT broker; None with ``--no-stack`` (telemetry elsewhere)."""
    if "--no-stack" in args or "--help" in args or "-h" in args:
        return None
    target = any(a == "--target" or a.startswith("--target=") for a in args)
    sut = [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--sut"]
    step = ["up", "--no-sut"] if target or settings.get("FLIGHTWATCH_TARGET") else ["renew-sut"]
    return [sys.executable, "-m", "stack", *step, *(["--sut", sut[-1]] if sut else [])]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if argv else 2
    name, args = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"flightwatch: error: unknown command {name!r}: one of {', '.join(COMMANDS)} (flightwatch --help)",
              file=sys.stderr)
        return 2
    c = COMMANDS[name]
    if name == "run":
        if not args or args[0] in ("-h", "--help"):
            print(run_help())
            return 0 if args else 2
        try:
            name, args = run_file(args[0], args[1:])
        except testfile.FileError as e:
            print(f"flightwatch: error: {one_line(str(e))}", file=sys.stderr)
            return 2
        c = COMMANDS[name]
    if "--help" in args or "-h" in args:
        print(f"flightwatch {name}: {c.what}\n  example: {c.example}\n\nits flags, as python -m {c.module} "
              f"{' '.join(c.head)} takes them:\n", flush=True)
    if name == "attack" and (step := stack_step(args)) is not None:
        code = subprocess.call(step)
        if code != 0:
            return code
    command = argv_of(name, args)
    os.execv(command[0], command)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
