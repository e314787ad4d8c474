"""Compare finished runs, and follow a scenario's history.

    python -m runs compare BASELINE CANDIDATE [--fail-on-regression 'p99>+10%' ...]
    python -m runs history [NAME]

A run is named by its ID (a folder under checkpoints/, FLIGHTWATCH_CHECKPOINTS) or by a path to its folder.
Exit codes: 0 done, 1 a --fail-on-regression gate crossed, 2 bad input (a run missing or unfinished, runs that are
not the same test, a bad flag).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from core.cli import OneLineParser
from core.rundir import CHECKPOINTS, RunPaths, write_json


def run_folder(name: str, checkpoints: str | None = None) -> str:
    """A run's folder from its ID or path; ValueError naming what was looked for."""
    if os.path.isdir(name) and os.path.exists(RunPaths(name).run_file):
        return name
    folder = RunPaths.of_run(name, checkpoints).root
    if os.path.exists(RunPaths(folder).run_file):
        return folder
    raise ValueError(f"no run {name!r} (not a run folder, nor a run in {checkpoints or CHECKPOINTS})")


def run_compare(baseline: str, candidate: str, gates_text: list[str], block_s: float = 5.0, noise: float = 0.05,
                reps: int = 2000, out: str | None = None, floor_us: float = 1000.0, print_=print) -> int:
    """Compare two runs (IDs or folders): print the comparison, write ``compare.json`` (in the candidate's folder
    unless ``out``), apply the gates. Exit code 0, 1 (a gate crossed) or 2 (bad input, said in one line)."""
    from runs import compare

    try:
        gates = [compare.Gate.parse(t) for t in gates_text]
        base = compare.RunSample.load(run_folder(baseline))
        cand = compare.RunSample.load(run_folder(candidate))
        report = compare.compare(base, cand, block_s=block_s, reps=reps, noise=noise, floor_us=floor_us)
    except ValueError as e:  # Incomparable is one
        print(f"runs compare: error: {e}", file=sys.stderr)
        return 2
    print_(compare.text(report), end="")
    crossed = [g.text for g in gates if g.crossed(report)]
    report["gates"] = [{"gate": g.text, "crossed": g.text in crossed} for g in gates]
    path = out or RunPaths(cand.root).compare_file
    write_json(path, report)
    print_(f"written: {path}")
    for g in crossed:
        print(f"regression gate crossed: {g}", file=sys.stderr)
    return 1 if crossed else 0


def build_parser() -> OneLineParser:
    p = OneLineParser(prog="python -m runs", description=__doc__.split("\n\n")[0],
                      epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compare", help="is the candidate worse than the baseline, beyond the noise?",
                       description="Compare two finished runs of the same schedule and target kind: flight-time "
                       "p50/p90/p99/max, send delay, achieved and delivered throughput, loss and the knee, for the whole "
                       "run and each pace step, each change with a 95%% confidence interval from a block bootstrap over "
                       "the runs' windows. Written to the candidate's compare.json.")
    c.add_argument("baseline", help="the run to compare against (run ID or folder)")
    c.add_argument("candidate", help="the run under judgement (run ID or folder)")
    c.add_argument("--fail-on-regression", action="append", default=[], metavar="GATE",
                   help="exit 1 when the change's interval lies wholly beyond the limit: 'p99>+10%%' (the lower bound "
                        "above +10%%), 'delivered<-5%%' (the upper bound below -5%%), 'loss>+0.5%%' (loss in "
                        "percentage points); metrics p50 p90 p99 send_delay_p50 send_delay_p99 achieved delivered loss; "
                        "repeatable")
    c.add_argument("--block", default="5s", metavar="DURATION",
                   help="bootstrap block length: windows drawn together, as long as a stall lasts (default %(default)s)")
    c.add_argument("--noise", default="5%", metavar="PERCENT",
                   help="changes whose interval reaches inside ±this are within noise (default %(default)s; loss: "
                        "±0.1 points)")
    c.add_argument("--floor", default="1ms", metavar="DURATION",
                   help="changes of a time (flight time, send delay) smaller than this are within noise too: the "
                        "machine's own jitter between repeats (default %(default)s; 0s: judge every µs)")
    c.add_argument("--resamples", type=int, default=2000, help="bootstrap resamples (default %(default)s)")
    c.add_argument("--json", metavar="FILE", help="write the comparison here (default: the candidate's compare.json)")
    h = sub.add_parser("history", help="a scenario's runs, their figures and change points",
                       description="The finished runs of a series (their --scenario name, else their target kind and "
                       "schedule), oldest first, with p50, p99 and delivered throughput, and the change points of each "
                       "(PELT, ruptures): the first run after each change. Without NAME: the series there are.")
    h.add_argument("name", nargs="?", help="the series: a --scenario name, or 'KIND PACE' such as 'kafka 5000:60'")
    h.add_argument("--json", action="store_true", help="print the history as JSON")
    return p


def _percent(text: str) -> float:
    t = text.strip().rstrip("%")
    try:
        v = float(t) / 100
    except ValueError:
        raise ValueError(f"bad --noise {text!r}: a percentage, e.g. 5%") from None
    if not 0 <= v < 1:
        raise ValueError(f"bad --noise {text!r}: from 0% to under 100%")
    return v


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    if a.cmd == "compare":
        from core.units import parse_duration_ns

        try:
            block_s, noise, floor_us = parse_duration_ns(a.block) / 1e9, _percent(a.noise), parse_duration_ns(a.floor) / 1e3
            if block_s <= 0 or a.resamples < 100:
                raise ValueError("--block must be > 0 and --resamples >= 100")
        except ValueError as e:
            print(f"runs compare: error: {e}", file=sys.stderr)
            return 2
        return run_compare(a.baseline, a.candidate, a.fail_on_regression, block_s, noise, a.resamples, a.json, floor_us)
    from runs import history

    if a.name is None:
        found = history.series_list()
        if not found:
            print(f"no finished runs in {CHECKPOINTS}")
        for name, n in sorted(found.items()):
            print(f"{n:>5} runs  {name}")
        return 0
    try:
        h = history.history(a.name)
    except LookupError as e:
        print(f"runs history: error: {e.args[0]}", file=sys.stderr)
        return 2
    print(json.dumps(h, indent=1) if a.json else history.text(h), end="\n" if a.json else "")
    return 0


if __name__ == "__main__":
    sys.exit(main())
