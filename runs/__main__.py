"""Compare finished runs, and follow a scenario's history.

    python -m runs compare BASELINE CANDIDATE [--fail-on-regression 'p99>+10%' ...]
    python -m runs compare --baseline r1,r2,r3 CANDIDATE             # a baseline of several runs
    python -m runs compare --baseline-series NAME --last 5 CANDIDATE  # the series' last 5 runs before it
    python -m runs history [NAME] [--fail-on-change [any]] [--recent 3] [--min-change 5%]
    python -m runs index [--rebuild]

A run is named by its ID (a folder under checkpoints/, FLIGHTWATCH_CHECKPOINTS) or by a path to its folder.
Exit codes: 0 done, 1 a --fail-on-regression gate crossed or a --fail-on-change change found, 2 bad input (a run
missing or unfinished, runs that are not the same test, a bad flag).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from core.cli import OneLineParser
from core.rundir import CHECKPOINTS, RunPaths, is_run_folder, write_json


def run_folder(name: str, checkpoints: str | None = None) -> str:
    """A run's folder from its ID or path; ValueError naming what was looked for."""
    if os.path.isdir(name) and is_run_folder(name):
        return name
    folder = RunPaths.of_run(name, checkpoints).root
    if is_run_folder(folder):
        return folder
    raise ValueError(f"no run {name!r} (not a run folder, nor a run in {checkpoints or CHECKPOINTS})")


def dashboard_link(candidate: str, baseline: str | None) -> str | None:
    """The dashboard's link to the candidate compared with ``baseline`` (``core.links``), when both are runs it lists
    (under the checkpoints folder)."""
    from core import links

    top = os.path.abspath(CHECKPOINTS)
    ids = [os.path.relpath(os.path.abspath(f), top) if f else None for f in (candidate, baseline)]
    if any(i is not None and (i.startswith("..") or os.path.isabs(i)) for i in ids):
        return None
    return links.dashboard(run=ids[0], compare=ids[1])


def run_compare(baseline: str | list[str], candidate: str, gates_text: list[str], block_s: float | None = None,
                noise: float = 0.05, reps: int = 2000, out: str | None = None, floor_us: float = 0.0, print_=print,
                run_spread: float | None = None) -> int:
    """Compare a run with one baseline run or several (IDs or folders; a comma-separated text is several): print the
    comparison, write ``compare.json`` (in the candidate's folder unless ``out``), apply the gates. Exit code 0, 1 (a
    gate crossed) or 2 (bad input, said in one line)."""
    from runs import compare

    names = [b for b in (baseline.split(",") if isinstance(baseline, str) else baseline) if b.strip()]
    try:
        gates = [compare.Gate.parse(t) for t in gates_text]
        if not names:
            raise ValueError("no baseline run given")
        bases = [compare.RunSample.load(run_folder(b.strip())) for b in names]
        cand = compare.RunSample.load(run_folder(candidate))
        if cand.root in {b.root for b in bases}:
            raise ValueError(f"the candidate {cand.run_id} is one of its baseline runs")
        report = compare.compare(bases, cand, block_s=block_s, reps=reps, noise=noise, floor_us=floor_us,
                                 run_spread=compare.RUN_SPREAD if run_spread is None else run_spread)
    except ValueError as e:  # Incomparable is one
        print(f"runs compare: error: {e}", file=sys.stderr)
        return 2
    print_(compare.text(report), end="")
    crossed = [g.text for g in gates if g.crossed(report)]
    report["gates"] = [{"gate": g.text, "crossed": g.text in crossed} for g in gates]
    path = out or RunPaths(cand.root).compare_file
    write_json(path, report)
    print_(f"written: {path}")
    link = dashboard_link(cand.root, bases[0].root if len(bases) == 1 else None)
    if link:
        print_(f"dashboard: {link}")
    for g in crossed:
        print(f"regression gate crossed: {g}", file=sys.stderr)
    return 1 if crossed else 0


def build_parser() -> OneLineParser:
    p = OneLineParser(prog="python -m runs", description=__doc__.split("\n\n")[0],
                      epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compare", help="is the candidate worse than the baseline, beyond the noise?",
                       description="Compare a finished run with one baseline run or several, of the same schedule "
                       "and target kind: flight-time "
                       "p50/p90/p99/max, send delay, achieved and delivered throughput, loss and the knee, for the whole "
                       "run and each pace step, each change with a 95%% confidence interval from a block bootstrap over "
                       "the runs' windows (the baseline runs drawn first), judged with Holm's rule across the figures. "
                       "Written to the candidate's compare.json.")
    c.add_argument("runs", nargs="+", metavar="[BASELINE] CANDIDATE",
                   help="the baseline run (run ID or folder; several: r1,r2,r3) and the run under judgement; the "
                        "candidate alone with --baseline or --baseline-series")
    c.add_argument("--baseline", metavar="R1,R2,...", help="the baseline runs: their run-to-run spread is measured and "
                   "taken into every interval (runs drawn, then blocks within each)")
    c.add_argument("--baseline-series", metavar="NAME", help="the baseline: the last --last finished runs of this "
                   "series before the candidate (`python -m runs history` lists the series)")
    c.add_argument("--last", type=int, default=5, help="runs of --baseline-series (default %(default)s)")
    c.add_argument("--run-spread", default="5%", metavar="PERCENT",
                   help="with one baseline run the run-to-run spread is unknown: times are taken to spread this much "
                        "a run, in both runs (default %(default)s); with two, their measured spread is shrunk toward "
                        "it; from five on, their own spread also sets the least width (a prediction interval)")
    c.add_argument("--fail-on-regression", action="append", default=[], metavar="GATE",
                   help="exit 1 when the change's interval lies wholly beyond the limit: 'p99>+10%%' (the lower bound "
                        "above +10%%), 'delivered<-5%%' (the upper bound below -5%%), 'loss>+0.5%%' (loss in "
                        "percentage points); metrics p50 p90 p99 send_delay_p50 send_delay_p99 achieved delivered loss; "
                        "repeatable")
    c.add_argument("--block", default="auto", metavar="DURATION",
                   help="bootstrap block length: windows drawn together; auto (the default): from the runs' own "
                        "autocorrelation (Politis-White), printed")
    c.add_argument("--noise", default="5%", metavar="PERCENT",
                   help="changes whose interval reaches inside ±this are within noise (default %(default)s; loss: "
                        "±0.1 points)")
    c.add_argument("--floor", default="0s", metavar="DURATION",
                   help="an absolute floor as well: changes of a time smaller than this are within noise too (default "
                        "%(default)s: the relative --noise alone)")
    c.add_argument("--resamples", type=int, default=2000, help="bootstrap resamples (default %(default)s)")
    c.add_argument("--json", metavar="FILE", help="write the comparison here (default: the candidate's compare.json)")
    h = sub.add_parser("history", help="a series' runs, their figures and significant changes",
                       description="The finished runs of a series (their --scenario name, else their target kind and "
                       "schedule), oldest first, with p50, p99 and delivered throughput, and the significant changes "
                       "of each: PELT (ruptures) proposes; a t test of the whole series, then of each proposal within "
                       "its neighbours (Bonferroni over the splits searched), keeps those with p <= 0.05 and a change "
                       "of at least --min-change; each change names the first run after it and that run's --label. "
                       "Runs of another test (target, pace, "
                       "payload, workers, trim or job settings other than the newest run's) are left out and named. "
                       "Without NAME: the series there are.")
    h.add_argument("name", nargs="?", help="the series: a --scenario name, or 'KIND PACE' such as 'kafka 5000:60'")
    h.add_argument("--json", action="store_true", help="print the history as JSON")
    h.add_argument("--fail-on-change", nargs="?", const="regression", choices=("regression", "any"),
                   help="for CI: exit 1 when a change's first run is among the --recent newest runs; 'regression' (the "
                        "default when given bare): latency up or throughput down; 'any': either way")
    h.add_argument("--min-change", default="5%", metavar="PERCENT",
                   help="the smallest change said, however significant (default %(default)s: runs compare's --noise)")
    h.add_argument("--recent", type=int, default=3, metavar="N",
                   help="with --fail-on-change: the newest runs a change must start in (default %(default)s: a change "
                        "is seen once two runs follow it, and fails the gate for the runs that confirm it)")
    x = sub.add_parser("index", help="the index of finished runs (checkpoints/index.sqlite)",
                       description="The index the job keeps as it closes each run, and that runs history and the "
                       "dashboard read: brought up to date with the run folders (new or changed ones read), or, with "
                       "--rebuild, made again from every folder.")
    x.add_argument("--rebuild", action="store_true", help="forget the index and read every run folder again")
    return p


def history_main(a: argparse.Namespace) -> int:
    from runs import history

    try:
        min_change = _percent(a.min_change, "--min-change")
        if a.recent < 1:
            raise ValueError("--recent must be >= 1")
    except ValueError as e:
        print(f"runs history: error: {e}", file=sys.stderr)
        return 2
    if a.name is None:
        if a.fail_on_change:
            print("runs history: error: --fail-on-change needs a series NAME", file=sys.stderr)
            return 2
        found = history.series_list()
        if not found:
            print(f"no finished runs in {CHECKPOINTS}")
        for name, n in sorted(found.items()):
            print(f"{n:>5} runs  {name}")
        return 0
    try:
        h = history.history(a.name, min_change=min_change)
    except LookupError as e:
        print(f"runs history: error: {e.args[0]}", file=sys.stderr)
        return 2
    print(json.dumps(h, indent=1) if a.json else history.text(h), end="\n" if a.json else "")
    if a.fail_on_change:
        bad = history.recent_changes(h, a.recent, regressions_only=a.fail_on_change == "regression")
        for c in bad:
            print(f"change in series {a.name!r}: {history.change_text(c)}, {history.p_text(c['p_value'])}",
                  file=sys.stderr)
        return 1 if bad else 0
    return 0


def index_main(a: argparse.Namespace) -> int:
    from runs import index

    n = index.rebuild() if a.rebuild else len(index.points())
    print(f"{n} finished runs in {os.path.join(CHECKPOINTS, index.FILE)}" + (" (rebuilt)" if a.rebuild else ""))
    return 0


def _percent(text: str, flag: str) -> float:
    t = text.strip().rstrip("%")
    try:
        v = float(t) / 100
    except ValueError:
        raise ValueError(f"bad {flag} {text!r}: a percentage, e.g. 5%") from None
    if not 0 <= v < 1:
        raise ValueError(f"bad {flag} {text!r}: from 0% to under 100%")
    return v


def baselines(a: argparse.Namespace) -> tuple[list[str], str]:
    """The baseline runs and the candidate from ``compare``'s arguments; ValueError saying what is wrong."""
    given = [x for x in (a.baseline, a.baseline_series) if x]
    if len(given) > 1:
        raise ValueError("give --baseline or --baseline-series, not both")
    if given and len(a.runs) != 1:
        raise ValueError(f"with --baseline or --baseline-series give the candidate alone, not {' '.join(a.runs)}")
    if not given and len(a.runs) != 2:
        raise ValueError("give BASELINE CANDIDATE, or --baseline R1,R2,... CANDIDATE")
    candidate = a.runs[-1]
    if a.baseline:
        return a.baseline.split(","), candidate
    if not a.baseline_series:
        return a.runs[0].split(","), candidate
    from runs import index

    cand_id = os.path.basename(os.path.normpath(candidate))
    pts = [p for p in index.points() if p.series == a.baseline_series]
    if not pts:
        raise ValueError(f"no finished runs in series {a.baseline_series!r} (`python -m runs history` lists them)")
    before = [p for p in pts if p.run_id != cand_id and p.started_at_ns < next(
        (q.started_at_ns for q in pts if q.run_id == cand_id), 2**63)]
    if not before:
        raise ValueError(f"series {a.baseline_series!r} has no finished run before {cand_id}")
    return [p.run_id for p in before[-a.last:]], candidate


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    if a.cmd == "compare":
        from core.units import parse_duration_ns

        try:
            block_s = None if a.block == "auto" else parse_duration_ns(a.block) / 1e9
            noise, floor_us = _percent(a.noise, "--noise"), parse_duration_ns(a.floor) / 1e3
            spread = _percent(a.run_spread, "--run-spread")
            if (block_s is not None and block_s <= 0) or a.resamples < 100 or a.last < 1:
                raise ValueError("--block must be > 0, --resamples >= 100 and --last >= 1")
            baseline, candidate = baselines(a)
        except ValueError as e:
            print(f"runs compare: error: {e}", file=sys.stderr)
            return 2
        return run_compare(baseline, candidate, a.fail_on_regression, block_s, noise, a.resamples, a.json, floor_us,
                           run_spread=spread)
    return history_main(a) if a.cmd == "history" else index_main(a)


if __name__ == "__main__":
    sys.exit(main())
