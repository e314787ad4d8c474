"""Reading a run folder's files: the batches' bookkeeping, the per-batch partials, quarantine, the job's verdict.

Only batches whose bookkeeping file exists are read, so a reader never sees half a batch. A reader that lives as
long as the run (the dashboard) re-reads only the files it has not read: each is cached by its identity.
"""
from __future__ import annotations

import json
import os
from collections import OrderedDict

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from core.rundir import RunPaths, batch_file, ids_in


def job_settings(root: str) -> dict:
    """The job's settings for the run (its run.json: run ID, window, drop timeout, ...)."""
    with open(RunPaths(root).run_file) as f:
        return json.load(f)


_BATCH_ROWS: OrderedDict[str, tuple[tuple, dict]] = OrderedDict()


_BATCH_ROWS_MAX = 50_000


def load_batches(root: str) -> pd.DataFrame:
    """One row per completed micro-batch: its bookkeeping (watermark, sizes, timings).

    Each file is read once (cached by its identity, as partials are): a live reader re-reads only new ones."""
    paths = RunPaths(root)
    rows = []
    for b in ids_in(paths.batches, "batch-*.json"):
        row = _cached_read(_BATCH_ROWS, _BATCH_ROWS_MAX, batch_file(paths.batches, b, "json"), _read_json)
        if row is not None:
            rows.append(row)
    return pd.DataFrame(rows)


def _read_json(path: str):
    with open(path) as f:
        return json.load(f)


def load_partials(root: str, kind: str, batch_ids=None) -> pd.DataFrame:
    """All partial rows of one kind (counts, hists, events), tagged with their batch ID (``batch_id``).

    A reader that lives as long as the run (the dashboard) re-reads only the files it has not read
    (``_read_partial``). The job's live verdict does not read them at all (``streaming.live``)."""
    paths = RunPaths(root)
    if batch_ids is None:
        batch_ids = ids_in(paths.batches, "batch-*.json")
    tables = []
    for b in batch_ids:
        t = _read_partial(batch_file(paths.partial(kind), b), b)
        if t is not None and t.num_rows:
            tables.append(t)
    return pa.concat_tables(tables, promote_options="permissive").to_pandas() if tables else pd.DataFrame()


_PARTIALS: OrderedDict[str, tuple[tuple, pa.Table]] = OrderedDict()


_PARTIALS_MAX = 20_000


def _file_identity(path: str) -> tuple | None:
    """(inode, mtime, size) of a batch file, None if absent: a batch file is written once, atomically, and
    rewritten whole only if its batch is redone, which changes all three."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def _read_partial(path: str, batch_id: int) -> pa.Table | None:
    """One batch's partial file with its ``batch_id``, cached by its identity (a live reader re-reads only what is
    new). Kept as an Arrow table, not a DataFrame: frames built on a cached frame's arrays leave weak references in
    it, and a reader concatenating hundreds of them on every pass grew by tens of MiB in a 15-minute soak."""
    return _cached_read(_PARTIALS, _PARTIALS_MAX, path, lambda p: _with_batch_id(p, batch_id))


def _with_batch_id(path: str, batch_id: int) -> pa.Table:
    t = pq.read_table(path)
    return t.append_column("batch_id", pa.array(np.full(t.num_rows, batch_id, dtype=np.int64)))


def _cached_read(cache: OrderedDict, limit: int, path: str, read):
    """``read(path)``, cached by the file's identity in ``cache`` (least recently used beyond ``limit``); None if absent."""
    key = _file_identity(path)
    if key is None:
        return None
    hit = cache.get(path)
    if hit is not None and hit[0] == key:
        cache.move_to_end(path)
        return hit[1]
    value = read(path)
    cache[path] = (key, value)
    if len(cache) > limit:
        cache.popitem(last=False)
    return value


def load_quarantine(root: str) -> pd.DataFrame:
    paths = RunPaths(root)
    done = set(ids_in(paths.batches, "batch-*.json"))
    frames = [pq.read_table(batch_file(paths.quarantine, b)).to_pandas() for b in ids_in(paths.quarantine) if b in done]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def job_verdict(root: str) -> dict | None:
    """The verdict the streaming job last published for this run (``verdict.json``), if any."""
    try:
        with open(os.path.join(root, "verdict.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None
