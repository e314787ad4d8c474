"""One owner of the run folder's paths (``core.rundir``): no module elsewhere joins a run folder's names by hand
(``os.path.join(run, "batches")``, ``run / "summary.json"``); each goes through ``RunPaths``. A grep over the code."""
from __future__ import annotations

import glob
import os
import re

from support import ROOT

NAMES = ("summary.json", "windows.parquet", "run.json", "partials", "batches", "archive", "quarantine", "verdict.json",
         "state", "spark", "joins", "joins.json", "driver.lease", "compare.json")
_ALT = "|".join(map(re.escape, NAMES))
BY_HAND = re.compile(rf"os\.path\.join\([^)\n]*\"({_ALT})\"|/ \"({_ALT})\"")


def test_no_module_but_rundir_joins_run_folder_paths_by_hand():
    found = []
    found = [f"{where}: {line}" for where, line in _product_lines() if BY_HAND.search(line)]
    assert not found, "\n".join(found)
    assert BY_HAND.search('os.path.join(run_dir, "batches")') and BY_HAND.search('tmp / "summary.json"')  # it can fail


PACKAGES = ("agents", "core", "transports", "runs", "loadgen", "streaming", "ui", "stack", "bench", "scenarios",
            "flightwatch")
REBUILT = re.compile(r"\bRunPaths\(")
AS_A_STRING = re.compile(r"(exists|isfile)\(RunPaths\([^)]*\)\.run_file\)")
REBUILT_AT_MOST = 23
"""``RunPaths(...)`` built from a string outside ``core``: where a folder's path comes in (a command line, the
dashboard, an object's constructor) and nowhere after; the run folder travels as a ``RunPaths`` (a job's
``JobConfig.paths``, a store's ``paths``). 42 when issue 64 counted; it may only shrink."""


def _product_lines():
    for d in PACKAGES:
        for path in sorted(glob.glob(os.path.join(ROOT, d, "**", "*.py"), recursive=True)):
            if path.endswith(os.path.join("core", "rundir.py")):
                continue
            for n, line in enumerate(open(path), 1):
                yield f"{os.path.relpath(path, ROOT)}:{n}", line.strip()


def test_the_run_folder_travels_as_run_paths_not_as_a_string_rebuilt_at_each_use():
    rebuilt = [f"{where}: {line}" for where, line in _product_lines()
               if REBUILT.search(line) and not where.startswith("core" + os.sep)]
    assert len(rebuilt) <= REBUILT_AT_MOST, "\n".join(rebuilt)
    assert len(rebuilt) == REBUILT_AT_MOST, f"{len(rebuilt)} now: lower REBUILT_AT_MOST to it"
    # whether a folder is a run's is asked of RunPaths.is_run (core.rundir.is_run_folder), not by hand
    by_hand = [f"{where}: {line}" for where, line in _product_lines() if AS_A_STRING.search(line)]
    assert not by_hand, "\n".join(by_hand)
    assert AS_A_STRING.search("os.path.exists(RunPaths(root).run_file)")  # it can fail
