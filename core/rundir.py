"""The run folder: the only code that knows the paths under ``checkpoints/<run>/``.

    checkpoints/<run>/run.json           the run's record (load generator and job)
                      windows.parquet    the window table, summary.json its summary (when the run closed)
                      partials/<kind>/   the job's per-batch outputs (counts, hists, events)
                      archive/ batches/ quarantine/ state/ spark/ verdict.json job.log compare.json   (``RunPaths.<name>``)
"""
from __future__ import annotations

import fcntl
import glob
import json
import os
import re
import socket
import time
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

    @property
    def receiver(self) -> str:
        """The state (write-ahead log, spool) and log of the receiver the load generator started for the run, when
        none was on the place the load went (``loadgen.follow``)."""
        return os.path.join(self.root, "receiver")

    @property
    def lease_file(self) -> str:
        """The live job's lease on the folder (``DriverLease``)."""
        return os.path.join(self.root, "driver.lease")

    @property
    def is_run(self) -> bool:
        """Whether this folder is a run's (its ``run.json`` is there: the load generator or the job wrote it)."""
        return os.path.isfile(self.run_file)

    def manifest(self, batch_id: int) -> str:
        """Batch ``batch_id``'s manifest under ``batches/``."""
        return batch_file(self.batches, batch_id, "json")

    def archived(self, batch_id: int) -> str:
        """Batch ``batch_id``'s raw telemetry under ``archive/`` (a file, or on a cluster a folder of parts)."""
        return batch_file(self.archive, batch_id)

    def joins(self, partition: int | None = None) -> str:
        """The join partitions' state on a cluster's executors (``state/joins/``), or one partition's."""
        d = os.path.join(self.state, "joins")
        return d if partition is None else os.path.join(d, f"p-{partition}")

    @property
    def joins_file(self) -> str:
        """Where the run's join state lives (``state/joins.json``: driver or executors, and how many partitions)."""
        return os.path.join(self.state, "joins.json")

    def loadgen_report(self, shard: int = 0, shards: int = 1) -> str:
        """The load generator's ``report.json`` (of shard ``shard`` of ``shards``)."""
        return os.path.join(self.loadgen(shard, shards), "report.json")

    def latency_log(self, shard: int = 0, shards: int = 1) -> str:
        """The load generator's HdrHistogram log of request latency (``latency.hlog``)."""
        return os.path.join(self.loadgen(shard, shards), "latency.hlog")


def is_run_folder(path: str) -> bool:
    """Whether ``path`` is a run folder (``RunPaths.is_run``)."""
    return RunPaths(path).is_run


class LeaseHeld(Exception):
    """Another driver holds the run folder: one line, which says who."""


class LeaseLost(Exception):
    """Another driver took the run folder over: this one must write nothing more."""


class DriverLease:
    """One driver per run folder: a lock held while the job lives, and a fencing token checked before each write.

        lease = DriverLease.take(root)   # LeaseHeld if another driver holds it
        lease.check()                    # LeaseLost once another driver took the folder over

    The lock is ``flock`` on ``driver.lease``: the kernel (or an NFS server) lets it go when the process ends,
    also by kill -9. The file holds the holder's token (a count of the drivers the run has had and a nonce), its
    PID, host and start. A driver that took the lease writes its token; ``check`` reads the file again, so a driver
    whose lock went with the file (the folder removed and made again, an NFS lease that expired while it was cut
    off) sees that the token is no longer its own before it writes a batch over the new driver's."""

    def __init__(self, path: str, fd: int, token: str) -> None:
        self.path, self.fd, self.token = path, fd, token

    @classmethod
    def take(cls, root: str) -> DriverLease:
        path = RunPaths(root).lease_file
        os.makedirs(root, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            held = _lease_record(path)
            os.close(fd)
            since = time.strftime("%H:%M:%S", time.gmtime(held.get("since_ns", 0) / 1e9))
            raise LeaseHeld(f"run folder {root} is in use by another driver (pid {held.get('pid', '?')} on host "
                            f"{held.get('host', '?')}, since {since} UTC): stop it first, or give another --run") from None
        count = int(str(_lease_record(path).get("token", "0")).split("-")[0] or 0) + 1
        token = f"{count}-{uuid.uuid4().hex[:12]}"
        data = json.dumps({"token": token, "pid": os.getpid(), "host": socket.gethostname(), "since_ns": time.time_ns()})
        os.ftruncate(fd, 0)
        os.pwrite(fd, data.encode(), 0)
        return cls(path, fd, token)

    def check(self) -> None:
        if not os.path.exists(self.path):
            raise LeaseLost(f"run folder {os.path.dirname(self.path)} is gone from host {socket.gethostname()} (no "
                            f"{os.path.basename(self.path)} there): removed, or its volume taken away; this driver "
                            "stops without writing")
        if _lease_record(self.path).get("token") != self.token:
            raise LeaseLost(f"another driver took run folder {os.path.dirname(self.path)} over: this one stops "
                            "without writing")

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _lease_record(path: str) -> dict:
    try:
        with open(path) as f:
            return json.loads(f.read() or "{}")
    except (FileNotFoundError, ValueError):
        return {}
