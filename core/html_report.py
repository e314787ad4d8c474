"""A run's report.html, written by the dashboard's layer (``ui.report``) as a process of its own: the components
below it (the load generator at a run's close, the scenario runner at its end) ask for it here."""
from __future__ import annotations

import os
import subprocess
import sys

from core.rundir import ROOT


def _say(line: str) -> None:
    print(line, flush=True)


def write(folder: str, log=_say) -> None:
    """``python -m ui.report FOLDER`` (a run's or a scenario run's), its line said (``report: PATH (SIZE, TIME)``);
    a failure to write it is said and changes nothing else."""
    try:
        p = subprocess.run([sys.executable, "-m", "ui.report", os.path.abspath(folder)], cwd=ROOT, capture_output=True,
                           text=True, timeout=120)
    except subprocess.TimeoutExpired:
        log(f"report: not written within 120 s (python -m ui.report {folder})")
        return
    said = (p.stdout or p.stderr).strip().splitlines()
    log(said[-1] if said else f"report: not written (python -m ui.report exit {p.returncode})")
