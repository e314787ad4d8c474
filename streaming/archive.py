"""``flightwatch_archive``: the streaming source that replays a run's archive (Spark's Python Data Source API).

One archived micro-batch per micro-batch, in the order the live job processed them, so a replay sees the same
batches and gives the same numbers.
"""
from __future__ import annotations

import gc
import glob
import os
import re
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

_BATCH_FILE = re.compile(r"batch-(\d+)\.parquet$")


def archived_batches(archive_dir: str) -> list[int]:
    """Batch IDs in an archive, in processing order."""
    ids = []
    for path in glob.glob(os.path.join(archive_dir, "batch-*.parquet")):
        m = _BATCH_FILE.search(path)
        if m:
            ids.append(int(m.group(1)))
    return sorted(ids)


class _ArchivePartition(InputPartition):
    def __init__(self, path: str) -> None:
        self.path = path


class ArchiveDataSource(DataSource):
    """``spark.readStream.format("flightwatch_archive").option("path", archive_dir)``: one batch per trigger."""

    @classmethod
    def name(cls) -> str:
        return "flightwatch_archive"

    def schema(self):
        from pyspark.sql.pandas.types import from_arrow_schema

        from streaming.decode import DECODED_SCHEMA

        return from_arrow_schema(DECODED_SCHEMA)

    def streamReader(self, schema) -> ArchiveStreamReader:
        return ArchiveStreamReader(self.options["path"])


class ArchiveStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets are ``{"index": n}``: the first n archived batches have been read."""

    def __init__(self, path: str) -> None:
        self.path = path

    def initialOffset(self) -> dict:
        return {"index": 0}

    def prepareForTriggerAvailableNow(self) -> None:
        pass

    def latestOffset(self, start: dict, limit) -> dict:
        n = len(archived_batches(self.path))
        return {"index": min(start["index"] + 1, n)}  # one archived batch per micro-batch

    def partitions(self, start: dict, end: dict):
        ids = archived_batches(self.path)[start["index"]:end["index"]]
        return [_ArchivePartition(os.path.join(self.path, f"batch-{i:08d}.parquet")) for i in ids]

    def read(self, partition: _ArchivePartition) -> Iterator[pa.RecordBatch]:
        from streaming.decode import DECODED_SCHEMA

        gc.freeze()

        table = pq.read_table(partition.path).cast(DECODED_SCHEMA)
        yield from table.to_batches()

    def commit(self, end: dict) -> None:
        pass
