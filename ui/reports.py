"""The scenario reports (``python -m scenarios run``) as the dashboard lists them: read from their folders."""
from __future__ import annotations

import json
import os

import pandas as pd

from ui.data import fmt_us, folder_names, plain


def list_scenario_reports(checkpoints: str) -> list[dict]:
    """The scenario reports in a checkpoints folder (``<scenario run>/report.json``, written by ``python -m
    scenarios run`` after each cell), newest first; a report being replaced right now is read at the next refresh."""
    out = []
    for name in folder_names(checkpoints):
        path = os.path.join(checkpoints, name, "report.json")
        try:
            with open(path) as f:
                doc = json.load(f)
            with open(os.path.join(checkpoints, name, "report.md")) as f:
                doc["markdown"] = f.read()
        except (OSError, ValueError):
            continue
        out.append(doc)
    return sorted(out, key=lambda d: d.get("started_ns", 0), reverse=True)


def scenario_cells(doc: dict) -> pd.DataFrame:
    """A scenario report's cells as a table: its axes, then the figures an operator reads first."""
    rows = []
    for c in doc.get("cells", []):
        rows.append({**c["cell"], "run": c.get("run_id"), "sent": c.get("sent"), "received": c.get("received"),
                     "dropped": c.get("dropped"), "p50": fmt_us(c.get("p50_us")), "p99": fmt_us(c.get("p99_us")),
                     "ceiling/s": c.get("ceiling_per_s"), "beyond it": c.get("limit") or "every step ok",
                     "verdict": plain(c.get("message") or c.get("problem") or "")})
    return pd.DataFrame(rows)
