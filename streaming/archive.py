"""``flightwatch_archive``: the streaming source that replays a run's archive (Spark's Python Data Source API).

Archived micro-batches are read in the order the live job processed them, several at once: the engine's results do
not depend on how records are cut into batches, so a replay takes few, large batches (``rowsPerBatch``). In local
mode the read tasks hand the driver only the files' paths (``pathsOnly``) and the driver reads them itself
(``read_paths``): the rows would cross Arrow -> Spark rows -> Arrow inside one JVM for nothing.
"""
from __future__ import annotations

import gc
import os
import sys
import time
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

from core.rundir import RunPaths, batch_file, ids_in


def archived_batches(archive_dir: str) -> list[int]:
    """Batch IDs in an archive, in processing order."""
    return ids_in(archive_dir, "batch-*.parquet")


class _ArchivePartition(InputPartition):
    def __init__(self, paths: list[str]) -> None:
        self.paths = paths


class ArchiveDataSource(DataSource):
    """``spark.readStream.format("flightwatch_archive").option("path", archive_dir)``: one batch per trigger."""

    @classmethod
    def name(cls) -> str:
        return "flightwatch_archive"

    def schema(self):
        from pyspark.sql.pandas.types import from_arrow_schema

        from streaming.decode import DECODED_SCHEMA

        return from_arrow_schema(PATHS_SCHEMA if _paths_only(self.options) else DECODED_SCHEMA)

    def streamReader(self, schema) -> ArchiveStreamReader:
        return ArchiveStreamReader(self.options["path"], int(self.options.get("rowsPerBatch", "0")),
                                   _paths_only(self.options))


class ArchiveStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets are ``{"index": n}``: the first n archived batches have been read. A micro-batch takes archived
    batches until it holds ``rows_per_batch`` rows (at least one; 0: one archived batch per micro-batch)."""

    def __init__(self, path: str, rows_per_batch: int = 0, paths_only: bool = False) -> None:
        self.path, self.rows_per_batch, self.paths_only = path, rows_per_batch, paths_only
        self._rows: dict[int, int] = {}

    def initialOffset(self) -> dict:
        return {"index": 0}

    def prepareForTriggerAvailableNow(self) -> None:
        pass

    def latestOffset(self, start: dict, limit) -> dict:
        ids = archived_batches(self.path)
        end, rows = start["index"], 0
        while end < len(ids) and (end == start["index"] or rows < self.rows_per_batch):
            rows += self._num_rows(ids[end])
            end += 1
        return {"index": end}

    def _num_rows(self, batch_id: int) -> int:
        if batch_id not in self._rows:
            self._rows[batch_id] = archived_rows(batch_path(self.path, batch_id))
        return self._rows[batch_id]

    def partitions(self, start: dict, end: dict):
        """A task per archived batch, to be read on the executors; paths only: one task for them all (a task costs
        ~30 ms of Python worker and JVM: with one per archived batch, 90 of them took 3 s a million records)."""
        paths = [batch_path(self.path, i) for i in archived_batches(self.path)[start["index"]:end["index"]]]
        return [_ArchivePartition(paths)] if self.paths_only else [_ArchivePartition([p]) for p in paths]

    def read(self, partition: _ArchivePartition) -> Iterator[pa.RecordBatch]:
        from streaming.decode import conform

        if self.paths_only:
            yield pa.RecordBatch.from_arrays([pa.array(partition.paths)], schema=PATHS_SCHEMA)
            return
        gc.freeze()
        for path in partition.paths:
            yield from conform(pq.read_table(path)).to_batches()

    def commit(self, end: dict) -> None:
        pass


REPLAY_ROWS_PER_BATCH = 1_000_000
"""A replay's micro-batches take archived batches until they hold this many records (~200 MB decoded)."""
PATHS_SCHEMA = pa.schema([pa.field("path", pa.string())])


def _paths_only(options) -> bool:
    return str(options.get("pathsOnly", "false")).lower() == "true"


def batch_path(archive_dir: str, batch_id: int) -> str:
    return batch_file(archive_dir, batch_id)


def archived_rows(path: str) -> int:
    """Rows of an archived batch: a file, or a folder of parts (the joins ran on executors: ``streaming.executors``)."""
    if not os.path.isdir(path):
        return pq.ParquetFile(path).metadata.num_rows
    return sum(pq.ParquetFile(os.path.join(path, f)).metadata.num_rows for f in os.listdir(path)
               if f.endswith(".parquet") and not f.startswith("."))


def read_paths(paths: list[str]) -> pa.Table:
    """The archived batches at ``paths``, in that order, as one table of decoded rows (``pathsOnly``)."""
    from streaming.decode import DECODED_SCHEMA, conform

    tables = [conform(pq.read_table(p)) for p in paths]
    return pa.concat_tables(tables) if tables else DECODED_SCHEMA.empty_table()


class ReplayProgress:
    """Records done of the archive's total, the rate and an ETA, printed at most every ``every_s``; at the end the
    wall time and the speed-up over the run's own length, both counted from ``begin()`` (the query started: Spark's
    own start-up, ~10 s here, is not the replay's speed)."""

    def __init__(self, archive_dir: str, run_length_s: float | None, log=print, every_s: float = 1.0) -> None:
        self.total = sum(archived_rows(batch_path(archive_dir, i)) for i in archived_batches(archive_dir))
        self.run_length_s, self.log, self.every_s = run_length_s, log, every_s
        self.done, self.started, self.last = 0, time.monotonic(), 0.0

    def begin(self) -> None:
        self.started = time.monotonic()

    def add(self, rows: int) -> None:
        self.done += rows
        now = time.monotonic()
        if now - self.last >= self.every_s or self.done >= self.total:
            self.last = now
            elapsed = max(now - self.started, 1e-9)
            rate = self.done / elapsed
            eta = (self.total - self.done) / rate if rate > 0 else float("inf")
            self.log(f"replay: {self.done:,} of {self.total:,} records ({100 * self.done / max(self.total, 1):.0f}%), "
                     f"{rate:,.0f} records/s, ETA {eta:.0f} s")

    def finish(self) -> None:
        wall = max(time.monotonic() - self.started, 1e-9)
        speed = f"; {self.run_length_s / wall:.1f}x the run's own {self.run_length_s:.0f} s" if self.run_length_s else ""
        self.log(f"replayed {self.done:,} records in {wall:.1f} s ({self.done / wall:,.0f} records/s){speed}")
        sys.stdout.flush()


def run_length_s(run_dir: str | None) -> float | None:
    """The live run's length (its summary's start to stop), for a replay's speed-up."""
    import json

    try:
        with open(RunPaths(run_dir).summary_file) as f:
            s = json.load(f)
        return (s["stopped_at_ns"] - s["started_at_ns"]) / 1e9
    except (OSError, TypeError, KeyError, ValueError):
        return None
