"""The seeds' experiments, one command each: a scenario's cells run on the stack, one report.

    python -m scenarios list                         # the scenarios, what each is after
    python -m scenarios show kafka-matrix            # its method, settings and cells
    python -m scenarios run kafka-matrix             # every cell, then checkpoints/scenario-kafka-matrix-<time>/report.md
    python -m scenarios run kafka-matrix --short     # the CI's form: fewer cells, shorter steps
    python -m scenarios run kafka-matrix --only payload=128,1024
    python -m scenarios run kafka-matrix --peer      # each cell, then Kafka's own tools at its rate, side by side
    python -m scenarios report checkpoints/scenario-kafka-matrix-<time>   # its report.md again, from report.json

(``make scenario NAME=kafka-matrix [SUT=kafka] [SHORT=1]``.) Each cell is a whole run (``python -m loadgen attack
--stream``) on a SUT broker renewed empty: the dashboard shows it live, and lists the scenario's report beside the
runs once its first cell is done. Exit 0 when every cell closed its run, 1 when one did not, 2 on bad input, 130
when interrupted (the report keeps the cells done).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from core.cli import OneLineParser
from core.rundir import CHECKPOINTS
from core.suts import SUTS
from scenarios import report, runner, spec
from scenarios.peers import PEER_SUTS


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m scenarios", description=__doc__.split("\n\n")[0],
                      formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    sub = p.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    sub.add_parser("list", help="the scenarios, and the report each method is after")
    rp = sub.add_parser("report", help="write a scenario run's report.md again from its report.json, with this "
                                       "version's tables", description="write a scenario run's report.md again")
    rp.add_argument("folder", help="the scenario run's folder (checkpoints/scenario-<name>-<time>)")
    for name, what in (("show", "a scenario's method, settings and cells"), ("run", "run a scenario's cells, write its report")):
        s = sub.add_parser(name, help=what, description=what)
        s.add_argument("name", help="the scenario (`python -m scenarios list`), or a scenario file's path (a test "
                                    "file with [axes]: `flightwatch run --help`)")
        s.add_argument("--short", action="store_true", help="its short form, as the CI runs it")
        s.add_argument("--only", action="append", default=[], metavar="AXIS=V[,V...]",
                       help="run only these values of one axis (repeatable), e.g. payload=128,1024")
        s.add_argument("--sut", choices=tuple(SUTS), help="the stack's SUT to run it on (default: the scenario's)")
    r = sub.choices["run"]
    r.add_argument("--run", metavar="ID", help="the scenario run's ID (default scenario-<name>-<UTC time>); its "
                                               "cells' runs are ID-c01, ID-c02, ...")
    r.add_argument("--peer", action="store_true", help="after each cell, the broker's own tool on the same broker "
                   "at the same rate (Kafka: kafka-producer-perf-test and EndToEndLatency; Artemis: artemis perf "
                   "client; RabbitMQ: PerfTest), and a table of both: throughput, flight p50/p99/p99.9, the "
                   "generator's CPU per message (`python -m stack.peers --help`)")
    r.add_argument("--target", metavar="URL", help="a scenario of HTTP (bursts): attack this HTTP broker, e.g. a "
                   "Knative broker's ingress, instead of the stack's HTTP receiver (its subscribers are the receivers)")
    return p


def scenario_of(a: argparse.Namespace) -> tuple[spec.Scenario, str]:
    sc = spec.load(a.name, a.short)
    for text in a.only:
        axis, eq, values = text.partition("=")
        if not eq or not values:
            raise spec.ScenarioError(f"bad --only {text!r}: AXIS=V[,V...], e.g. payload=128,1024")
        sc = sc.only(axis.strip(), [v.strip() for v in values.split(",") if v.strip()])
    if getattr(a, "target", None) and sc.sink is None:
        raise spec.ScenarioError(f"--target is for a scenario of a sink ({', '.join(sink_scenarios())}); {sc.name} "
                                 "runs on the stack's SUT")
    if getattr(a, "target", None) and a.target.partition("://")[0] not in sc.sink.target.SCHEMES:
        raise spec.ScenarioError(f"bad --target {a.target!r}: {sc.sink.target.EXAMPLE}")
    sut = a.sut or sc.sut
    if sut not in sc.suts:
        raise spec.ScenarioError(f"scenario {sc.name} runs on {', '.join(sc.suts)}, not on {sut}")
    if getattr(a, "peer", False) and (sc.sink is not None or sut not in PEER_SUTS):
        raise spec.ScenarioError(f"--peer: no peer's tool for {sut if sc.sink is None else sc.sink.name.upper()} "
                                 f"(there are for {', '.join(PEER_SUTS)})")
    return sc, sut


def sink_scenarios() -> list[str]:
    """The scenarios whose cells attack a sink (``target = NAME``), not the stack's SUT."""
    return [name for name in spec.names() if spec.load(name).sink is not None]


def show(sc: spec.Scenario, sut: str) -> None:
    cells = sc.cells()
    where = f"the stack's {runner.stack_receiver(sc)} (or --target)" if sc.sink is not None else sut
    print(f"{sc.name}: {sc.title} (after the {sc.seed}); at {where}, {'short' if sc.short else 'full'} form")
    print(f"method: {sc.method}")
    print(f"every cell: pace {sc.pace} ({sc.schedule().duration_ns / 1e9:g} s), warm-up {sc.warmup}, cool-down "
          f"{sc.cooldown}, drop timeout {sc.drop_timeout}" + (f"; its attack also {' '.join(sc.attack)}" if sc.attack else ""))
    if sut in PEER_SUTS and sc.sink is None:
        print(f"with --peer: after each cell, the broker's own tool at the cell's {'rate' if sc.peer_rate is None else f'step of {sc.peer_rate:,}/s'} "
              f"for {sc.peer_seconds} s (`python -m stack.peers --help`)")
    print(f"{len(cells)} cells:")
    for k, cell in enumerate(cells, 1):
        pace = sc.cell_pace(cell)
        print(f"  c{k:02d}  {runner.cell_name(cell)}" + (f"  (pace {pace})" if pace != sc.pace else ""))


def rewrite(folder: str) -> int:
    """report.md again from report.json (what each ramp's limit was is read again from its steps)."""
    import json

    try:
        with open(os.path.join(folder, report.REPORT_JSON)) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        print(f"scenarios: error: {folder}: no readable {report.REPORT_JSON} ({e})", file=sys.stderr)
        return 2
    for c in doc["cells"]:
        if c.get("steps") is not None:
            c["limit"] = runner.limit(c["steps"], next((st["step"] for st in c["steps"]
                                                        if st.get("rate") == c.get("ceiling_per_s")), None))
    report.write(folder, doc)
    print(report.markdown(doc))
    return 0


def main(argv=None) -> int:
    try:
        a = build_parser().parse_args(argv)
        if a.command == "report":
            return rewrite(a.folder)
        if a.command == "list":
            for name in spec.names():
                sc = spec.load(name)
                where = sc.sink.name.upper() if sc.sink is not None else ", ".join(sc.suts)
                print(f"{name:20} {sc.title} (after the {sc.seed}; {where}; {len(sc.cells())} cells)")
            return 0
        sc, sut = scenario_of(a)
    except SystemExit as e:
        return 2 if e.code else 0
    except spec.ScenarioError as e:
        print(f"scenarios: error: {e}", file=sys.stderr)
        return 2
    if a.command == "show":
        show(sc, sut)
        return 0
    scenario_run = a.run or time.strftime(f"scenario-{sc.name}-%Y%m%d-%H%M%S", time.gmtime())
    folder = os.path.join(CHECKPOINTS, scenario_run)
    if os.path.exists(folder):
        print(f"scenarios: error: {folder} exists: give another --run", file=sys.stderr)
        return 2
    started = time.time_ns()
    write = lambda cells, done=False: report.write(folder, report.document(sc, sut, scenario_run, cells, started, done))
    from core import links

    print(f"scenario {sc.name} on {sut}: {len(sc.cells())} cells, report in {folder}/{report.REPORT_MD}; dashboard: "
          f"{links.dashboard(scenario=scenario_run)}", flush=True)
    try:
        cells = runner.run(sc, sut, scenario_run, log=lambda line: print(line, flush=True), on_cell=write,
                           target=a.target, peer=a.peer)
    except KeyboardInterrupt:
        print(f"interrupted: the report of the cells done is in {folder}", file=sys.stderr)
        return 130
    except RuntimeError as e:
        print(f"scenarios: error: {e}", file=sys.stderr)
        return 1
    write(cells, True)
    print()
    print(report.markdown(report.document(sc, sut, scenario_run, cells, started, True)))
    from core import html_report

    html_report.write(folder)  # every cell and the peers' rows, one file
    return 0 if all(not c.get("problem") and c["exit"] == 0 for c in cells) else 1


if __name__ == "__main__":
    sys.exit(main())
