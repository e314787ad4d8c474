"""The index of finished runs: one SQLite file beside the run folders (``checkpoints/index.sqlite``).

    >>> index.record("checkpoints/attack-20261127-101500")   # the job, as it closes a run
    >>> [p.run_id for p in index.points() if p.series == "kafka 5000:60"]
    ['attack-20261127-101500', ...]
    $ python -m runs index --rebuild                          # every folder read again

A row holds what ``runs history`` needs of a finished run: its series, label, start, figures (latency over the
measured span: less the warm-up and cool-down) and the settings that make two runs the same test (``fingerprint``).
The job writes a run's row when it closes the run; ``points`` reads the index and adds any folder it does not know
yet or whose ``summary.json`` changed since (one ``stat`` per folder, no summary read again), so runs closed by an
older flightwatch or copied in are found too. Folders that are gone leave the index. SQLite (the standard library's): one file, safe for the job, the dashboard
and a command reading and writing at once.
"""
from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from dataclasses import dataclass, field

from core.output import Lifecycle
from core.rundir import CHECKPOINTS, RunPaths
from runs.reader import RunReader, read_json

FILE = "index.sqlite"
SCHEMA = 2
"""Bumped when a row's columns change: an index of another schema is rebuilt on first use."""
COLUMNS = ("folder", "run_id", "series", "label", "started_at_ns", "fingerprint", "p50_us", "p90_us", "p99_us",
           "delivered_per_s", "summary_mtime_ns")
FINGERPRINT_KEYS = ("target", "pace", "payload_bytes", "workers", "max_inflight", "warmup_s", "cooldown_s", "shards")
"""The attack's settings that make two runs the same test (with the job's window, drop timeout and watermark)."""


@dataclass(frozen=True)
class RunPoint:
    """One finished run of a series: when it started, its label, its whole-run figures and its settings."""

    run_id: str
    series: str
    started_at_ns: int
    p50_us: float | None
    p99_us: float | None
    delivered_per_s: float | None
    p90_us: float | None = None
    label: str | None = None
    fingerprint: dict = field(default_factory=dict)

    def figure(self, name: str) -> float | None:
        return {"p50": self.p50_us, "p90": self.p90_us, "p99": self.p99_us, "delivered": self.delivered_per_s}[name]


def series_name(attack: dict) -> str:
    """A run's series: its ``--scenario``, else its target kind and schedule."""
    from runs.runinfo import target_kind

    if attack.get("scenario"):
        return str(attack["scenario"])
    return f"{target_kind(attack)} {attack.get('pace', '?')}"


def fingerprint(attack: dict, summary: dict) -> dict:
    """The settings two runs of one series must share to be compared: the attack's and the job's."""
    out = {k: attack[k] for k in FINGERPRINT_KEYS if attack.get(k) not in (None, "")}
    out.update({k: v for k, v in (summary.get("settings") or {}).items() if v is not None})
    return out


def run_point(root: str) -> RunPoint | None:
    """A finished run's point, read from its folder (None for a run that is not finished or sent nothing)."""
    from runs import runinfo

    try:
        summary = read_json(RunPaths(root).summary_file)
    except (OSError, ValueError):
        return None
    if summary.get("state") != Lifecycle.FINISHED or not summary.get("sent"):
        return None
    attack = summary.get("attack")
    if attack is None:  # a run closed before summaries kept the attack's configuration
        attack = runinfo.attack_config(RunReader(root).partials("events"))
    seconds = _schedule_s(attack) or summary.get("num_windows") or 0
    # the measured span's percentiles (warm-up and cool-down left out) where the run set them, as `runs compare` takes
    lat = (summary.get("measured") or {}).get("latency_us") or summary.get("latency_us") or {}
    return RunPoint(run_id=summary["run_id"], series=series_name(attack),
                    started_at_ns=int(summary.get("started_at_ns") or os.stat(root).st_mtime_ns),
                    p50_us=lat.get("p50"), p90_us=lat.get("p90"), p99_us=lat.get("p99"),
                    delivered_per_s=summary["received"] / seconds if seconds else None,
                    label=attack.get("label"), fingerprint=fingerprint(attack, summary))


def _schedule_s(attack: dict) -> float | None:
    """The schedule's length in seconds, from its steps or its pace text (None if neither is known)."""
    from core.pacer import Schedule

    steps = attack.get("steps") or []
    if steps:
        return (steps[-1]["end_ns"] - steps[0]["start_ns"]) / 1e9
    try:
        return Schedule.parse(str(attack["pace"])).duration_ns / 1e9 if attack.get("pace") else None
    except ValueError:
        return None


@contextlib.contextmanager
def connect(checkpoints: str | None = None):
    """The index of ``checkpoints`` (``CHECKPOINTS``), made or remade (another schema) as needed; closed after."""
    folder = checkpoints or CHECKPOINTS
    os.makedirs(folder, exist_ok=True)
    db = sqlite3.connect(os.path.join(folder, FILE), timeout=30, isolation_level=None)
    try:
        db.execute("PRAGMA journal_mode=WAL")
        _schema(db)
        yield db
    finally:
        db.close()


def _schema(db: sqlite3.Connection) -> None:
    if db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA:
        return  # made already: a read takes no write lock
    db.execute("BEGIN IMMEDIATE")  # one process makes the tables; the others wait, then find them made
    if db.execute("PRAGMA user_version").fetchone()[0] != SCHEMA:
        db.execute("DROP TABLE IF EXISTS runs")
        db.execute("DROP TABLE IF EXISTS seen")
        db.execute("CREATE TABLE runs (folder TEXT PRIMARY KEY, run_id TEXT, series TEXT, label TEXT, "
                   "started_at_ns INTEGER, fingerprint TEXT, p50_us REAL, p90_us REAL, p99_us REAL, "
                   "delivered_per_s REAL, summary_mtime_ns INTEGER)")
        db.execute("CREATE INDEX runs_series ON runs (series, started_at_ns)")
        # folders read that are not finished runs (a running run, a scenario's report, a run that sent nothing)
        db.execute("CREATE TABLE seen (folder TEXT PRIMARY KEY, summary_mtime_ns INTEGER)")
        db.execute(f"PRAGMA user_version = {SCHEMA}")
    db.execute("COMMIT")


def _mtime(root: str) -> int:
    try:
        return os.stat(RunPaths(root).summary_file).st_mtime_ns
    except OSError:
        return 0


def _put(db: sqlite3.Connection, root: str) -> RunPoint | None:
    name, mtime = os.path.basename(os.path.normpath(root)), _mtime(root)
    p = run_point(root) if mtime else None
    db.execute("DELETE FROM runs WHERE folder = ?", (name,))
    db.execute("DELETE FROM seen WHERE folder = ?", (name,))
    if p is None:
        db.execute("INSERT INTO seen VALUES (?, ?)", (name, mtime))
        return None
    db.execute(f"INSERT INTO runs VALUES ({', '.join('?' * len(COLUMNS))})",
               (name, p.run_id, p.series, p.label, p.started_at_ns, json.dumps(p.fingerprint, sort_keys=True),
                p.p50_us, p.p90_us, p.p99_us, p.delivered_per_s, mtime))
    return p


def record(root: str) -> RunPoint | None:
    """Index the run in folder ``root`` (in the index beside it), as the job does when it closes the run."""
    root = os.path.abspath(root)
    with connect(os.path.dirname(root)) as db:
        db.execute("BEGIN IMMEDIATE")
        p = _put(db, root)
        db.execute("COMMIT")
        return p


def points(checkpoints: str | None = None) -> list[RunPoint]:
    """Every finished run under ``checkpoints`` (``CHECKPOINTS``), oldest first: the index, brought up to date with
    the folders as they are (new or changed summaries read, folders that are gone dropped)."""
    folder = checkpoints or CHECKPOINTS
    if not os.path.isdir(folder):
        return []
    try:
        return _indexed(folder)
    except sqlite3.Error:  # an index that cannot be opened or written here (a read-only copy of the runs): read them
        found = (run_point(os.path.join(folder, n)) for n in sorted(os.listdir(folder)))
        return sorted((p for p in found if p is not None), key=lambda p: (p.started_at_ns, p.run_id))


def _indexed(folder: str) -> list[RunPoint]:
    with connect(folder) as db:
        known = dict(db.execute("SELECT folder, summary_mtime_ns FROM runs UNION ALL "
                                "SELECT folder, summary_mtime_ns FROM seen").fetchall())
        here = {n for n in os.listdir(folder) if os.path.isdir(os.path.join(folder, n))}
        changed = [n for n in sorted(here) if n not in known or known[n] != _mtime(os.path.join(folder, n))]
        if changed or set(known) - here:
            db.execute("BEGIN IMMEDIATE")
            for name in changed:
                _put(db, os.path.join(folder, name))
            for name in set(known) - here:
                db.execute("DELETE FROM runs WHERE folder = ?", (name,))
                db.execute("DELETE FROM seen WHERE folder = ?", (name,))
            db.execute("COMMIT")
        rows = db.execute(f"SELECT {', '.join(COLUMNS)} FROM runs ORDER BY started_at_ns, folder").fetchall()
    return [_point(dict(zip(COLUMNS, r))) for r in rows]


def _point(r: dict) -> RunPoint:
    return RunPoint(run_id=r["run_id"], series=r["series"], started_at_ns=r["started_at_ns"], p50_us=r["p50_us"],
                    p99_us=r["p99_us"], delivered_per_s=r["delivered_per_s"], p90_us=r["p90_us"], label=r["label"],
                    fingerprint=json.loads(r["fingerprint"] or "{}"))


def rebuild(checkpoints: str | None = None) -> int:
    """Forget the index and read every folder again; the number of finished runs found."""
    folder = checkpoints or CHECKPOINTS
    path = os.path.join(folder, FILE)
    for p in (path, path + "-wal", path + "-shm"):
        if os.path.exists(p):
            os.remove(p)
    return len(points(folder))
