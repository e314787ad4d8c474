"""One owner of the run folder's paths (``core.rundir``): no module elsewhere joins a run folder's names by hand
(``os.path.join(run, "batches")``, ``run / "summary.json"``); each goes through ``RunPaths``. A grep over the code."""
from __future__ import annotations

import glob
import os
import re

from support import ROOT

NAMES = ("summary.json", "windows.parquet", "run.json", "partials", "batches", "archive", "quarantine", "verdict.json",
         "state", "spark")
_ALT = "|".join(map(re.escape, NAMES))
BY_HAND = re.compile(rf"os\.path\.join\([^)\n]*\"({_ALT})\"|/ \"({_ALT})\"")


def test_no_module_but_rundir_joins_run_folder_paths_by_hand():
    found = []
    for d in ("agents", "core", "transports", "runs", "loadgen", "streaming", "ui", "stack", "bench"):
        for path in glob.glob(os.path.join(ROOT, d, "**", "*.py"), recursive=True):
            if path.endswith(os.path.join("core", "rundir.py")):
                continue
            for n, line in enumerate(open(path), 1):
                if BY_HAND.search(line):
                    found.append(f"{os.path.relpath(path, ROOT)}:{n}: {line.strip()}")
    assert not found, "\n".join(found)
    assert BY_HAND.search('os.path.join(run_dir, "batches")') and BY_HAND.search('tmp / "summary.json"')  # it can fail
