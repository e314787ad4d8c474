"""The run folder: the only code that knows the paths under ``checkpoints/<run>/``.

    checkpoints/<run>/run.json           the run's record (load generator and job)
                      windows.parquet    the window table, summary.json its summary (when the run closed)
                      partials/<kind>/   the job's per-batch outputs (counts, hists, events)
                      archive/ batches/ quarantine/ state/ spark/ verdict.json job.log compare.json   (``RunPaths.<name>``)
"""
from __future__ import annotations

import glob
import json
import os
import re
import uuid
from dataclasses import dataclass

from core import settings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
"""The project's folder."""
CHECKPOINTS = settings.get("FLIGHTWATCH_CHECKPOINTS", os.path.join(ROOT, "checkpoints"))
"""Where run folders live (FLIGHTWATCH_CHECKPOINTS, else ./checkpoints)."""
PARTIAL_KINDS = ("counts", "hists", "events")
_ID = re.compile(r"(\d+)")


def atomic(path: str, write) -> None:
    """Write ``path`` through a temporary file and a rename: a reader sees the old file or the new, whole."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp-{uuid.uuid4().hex}"  # unique across processes, containers and hosts sharing the folder
    write(tmp)
    os.replace(tmp, path)


def write_json(path: str, obj) -> None:
    def w(tmp: str) -> None:
        with open(tmp, "w") as f:
            json.dump(obj, f, indent=1, default=str)
    atomic(path, w)


def batch_file(directory: str, batch_id: int, ext: str = "parquet") -> str:
    return os.path.join(directory, f"batch-{batch_id:08d}.{ext}")


def ids_in(directory: str, pattern: str = "batch-*") -> list[int]:
    return sorted(int(_ID.search(os.path.basename(p)).group(1)) for p in glob.glob(os.path.join(directory, pattern))
                  if ".tmp-" not in p)


@dataclass(frozen=True)
class RunPaths:
    """The paths of one run folder, each named: a misspelt one is an AttributeError, not a new folder."""

    root: str

    @property
    def archive(self) -> str:
        """The raw telemetry the run read, batch by batch (what a replay reads)."""
        return os.path.join(self.root, "archive")

    @property
    def batches(self) -> str:
        """Each batch's manifest (``batch-N.json``), written when the batch is done."""
        return os.path.join(self.root, "batches")

    @property
    def quarantine(self) -> str:
        """Malformed telemetry records, set aside with why."""
        return os.path.join(self.root, "quarantine")

    @property
    def state(self) -> str:
        """The engine's state: snapshots and their deltas."""
        return os.path.join(self.root, "state")

    @property
    def spark(self) -> str:
        """Spark's own checkpoint of the query (offsets and commits)."""
        return os.path.join(self.root, "spark")

    @property
    def verdict_file(self) -> str:
        """The live verdict, rewritten after each batch."""
        return os.path.join(self.root, "verdict.json")

    @property
    def job_log(self) -> str:
        """The streaming job's log, when a command started it (``make attack``, benchmarks)."""
        return os.path.join(self.root, "job.log")

    def loadgen(self, shard: int = 0, shards: int = 1) -> str:
        """The load generator's reports (``report.txt``, ``report.json``, ``latency.hlog``): ``loadgen/``, or
        ``loadgen<shard>/`` for each shard of a run sent from several machines."""
        return os.path.join(self.root, "loadgen" if shards == 1 else f"loadgen{shard}")

    @classmethod
    def of_run(cls, run_id: str, checkpoints: str | None = None) -> RunPaths:
        """The folder of run ``run_id`` under ``checkpoints`` (``CHECKPOINTS``)."""
        return cls(os.path.join(checkpoints or CHECKPOINTS, run_id))

    def partial(self, kind: str) -> str:
        return os.path.join(self.root, "partials", kind)

    @property
    def windows_file(self) -> str:
        return os.path.join(self.root, "windows.parquet")

    @property
    def summary_file(self) -> str:
        return os.path.join(self.root, "summary.json")

    @property
    def compare_file(self) -> str:
        """The comparison with a baseline run (``python -m runs compare``), when one was made."""
        return os.path.join(self.root, "compare.json")

    @property
    def run_file(self) -> str:
        return os.path.join(self.root, "run.json")
