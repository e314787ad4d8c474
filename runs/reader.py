"""Reading a run folder's files: the batches' bookkeeping, the per-batch partials, quarantine, the job's verdict.

Only batches whose bookkeeping file exists are read, so a reader never sees half a batch. A ``RunReader`` that lives
as long as the run (the dashboard keeps one per run) re-reads only the files it has not read: each is cached by its
identity, in the reader, and nothing is kept between readers.
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

MAX_BATCH_FILES = 50_000
"""Bookkeeping files a reader keeps (a few hundred bytes each): a 13-hour run at one batch a second."""
MAX_PARTIAL_FILES = 20_000
"""Partial files a reader keeps (three a batch)."""


def read_json(path: str):
    with open(path) as f:
        return json.load(f)


class RunReader:
    """One run folder's files, each read once while it is unchanged (least recently used beyond the limits)."""

    def __init__(self, root: str, max_batch_files: int = MAX_BATCH_FILES, max_partial_files: int = MAX_PARTIAL_FILES) -> None:
        self.root = root
        self.paths = RunPaths(root)
        self._batches: OrderedDict[str, tuple[tuple, dict]] = OrderedDict()
        self._partials: OrderedDict[str, tuple[tuple, pa.Table]] = OrderedDict()
        self.max_batch_files, self.max_partial_files = max_batch_files, max_partial_files

    @classmethod
    def of(cls, run: RunReader | str) -> RunReader:
        """``run`` if it is a reader, else a new reader of the folder ``run`` (which reads every file once)."""
        return run if isinstance(run, RunReader) else cls(run)

    def settings(self) -> dict:
        """The job's settings for the run (its run.json: run ID, window, drop timeout, ...)."""
        return read_json(self.paths.run_file)

    def batch_ids(self) -> list[int]:
        """The completed micro-batches (those whose bookkeeping file exists)."""
        return ids_in(self.paths.batches, "batch-*.json")

    def batch_info(self, batch_id: int) -> dict:
        return read_json(batch_file(self.paths.batches, batch_id, "json"))

    def batches(self) -> pd.DataFrame:
        """One row per completed micro-batch: its bookkeeping (watermark, sizes, timings)."""
        rows = [self._cached(self._batches, self.max_batch_files, batch_file(self.paths.batches, b, "json"), read_json) for b in self.batch_ids()]
        return pd.DataFrame([r for r in rows if r is not None])

    def partials(self, kind: str, batch_ids=None) -> pd.DataFrame:
        """All partial rows of one kind (counts, hists, events), tagged with their batch ID (``batch_id``).

        Kept as Arrow tables, not DataFrames: frames built on a cached frame's arrays leave weak references in it,
        and a reader concatenating hundreds of them on every pass grew by tens of MiB in a 15-minute soak."""
        tables = []
        for b in self.batch_ids() if batch_ids is None else batch_ids:
            t = self._cached(self._partials, self.max_partial_files, batch_file(self.paths.partial(kind), b), lambda p, b=b: _with_batch_id(p, b))
            if t is not None and t.num_rows:
                tables.append(t)
        return pa.concat_tables(tables, promote_options="permissive").to_pandas() if tables else pd.DataFrame()

    def quarantine(self) -> pd.DataFrame:
        done = set(self.batch_ids())
        frames = [pq.read_table(batch_file(self.paths.quarantine, b)).to_pandas() for b in ids_in(self.paths.quarantine)
                  if b in done]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()

    def verdict(self) -> dict | None:
        """The verdict the streaming job last published for this run (``verdict.json``), if any."""
        try:
            return read_json(self.paths.verdict_file)
        except (OSError, ValueError):
            return None

    @staticmethod
    def _cached(cache: OrderedDict, limit: int, path: str, read):
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


def _file_identity(path: str) -> tuple | None:
    """(inode, mtime, size) of a batch file, None if absent: a batch file is written once, atomically, and
    rewritten whole only if its batch is redone, which changes all three."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def _with_batch_id(path: str, batch_id: int) -> pa.Table:
    t = pq.read_table(path)
    return t.append_column("batch_id", pa.array(np.full(t.num_rows, batch_id, dtype=np.int64)))
