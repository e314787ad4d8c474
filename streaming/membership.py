"""Which telemetry records belong to a run: the one rule, over Arrow tables, that every reader of the topic applies.

A job analyses one run. Of the decoded records (``streaming.decode.DECODED_SCHEMA``) it reads

* the run's own: stamped with its ``run_id``;
* the machine-wide kinds (``core.contract.SHARED_KINDS``: node samples, OOM kills, restarts, clock offsets, lost
  telemetry, resets), stamped ``ANY_RUN``;
* quarantined records no other run can be told from (no run ID, this run's, or ``ANY_RUN``): set aside and counted
  by the job that reads them.

Of what it reads, the run's valid sends, acks and receives (``DATA_KINDS``) go to the join partitions; the rest is
the driver's. The Spark source (``.option("run", ...)``), the JVM connector's decoding, a driver that decodes, the
engine and the executors' joins all call ``of``; nothing else writes the rule.

    >>> m = membership.of(table, "run-1")
    >>> table.filter(m.read)       # what the job of run-1 reads
"""
from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from core import contract

DATA_KINDS = ("send", "ack", "recv")
"""The records that carry an event ID and go to its join partition; every other kind is the driver's."""


@dataclass(frozen=True)
class Membership:
    """Masks over one table's rows (boolean arrays, never null)."""

    valid: pa.Array        # not quarantined
    run: pa.Array          # stamped with the run's ID
    shared: pa.Array       # a machine-wide kind stamped ANY_RUN
    unattributed: pa.Array  # quarantined, and no other run's

    @property
    def read(self) -> pa.Array:
        """What the run's job reads."""
        return pc.or_(pc.or_(self.run, self.shared), self.unattributed)

    @property
    def mine(self) -> pa.Array:
        """The run's valid records."""
        return pc.and_(self.valid, self.run)

    @property
    def shared_valid(self) -> pa.Array:
        return pc.and_(self.valid, self.shared)

    @property
    def quarantined(self) -> pa.Array:
        return pc.invert(self.valid)


def of(t: pa.Table | pa.RecordBatch, run_id: str) -> Membership:
    """The masks of ``t``'s rows for the run ``run_id``."""
    run_col = t.column("run_id")
    run = pc.fill_null(pc.equal(run_col, run_id), False)
    any_run = pc.fill_null(pc.equal(run_col, contract.ANY_RUN), False)
    shared = pc.and_(any_run, pc.fill_null(pc.is_in(t.column("kind"), pa.array(contract.SHARED_KINDS)), False))
    valid = pc.is_null(t.column("quarantine_reason"))
    unattributed = pc.and_(pc.invert(valid), pc.or_(pc.or_(pc.is_null(run_col), run), any_run))
    return Membership(valid, run, shared, unattributed)


def read(t: pa.Table | pa.RecordBatch, run_id: str) -> pa.Table | pa.RecordBatch:
    """``t``'s rows that the run's job reads."""
    return t.filter(of(t, run_id).read) if t.num_rows else t


def data(t: pa.Table | pa.RecordBatch, run_id: str) -> pa.Array:
    """The mask of the run's valid sends, acks and receives: the join partitions' records."""
    kind = pc.fill_null(pc.is_in(t.column("kind"), pa.array(DATA_KINDS)), False)
    return pc.and_(of(t, run_id).mine, kind)


def data_batches(run_id: str):
    """A ``mapInArrow`` function keeping the join partitions' records of ``run_id`` (the executors' joins)."""
    def keep(batches):
        for b in batches:
            if b.num_rows:
                yield b.filter(data(b, run_id))
    return keep


def split(t: pa.Table, run_id: str) -> tuple[pa.Table, pa.Table, pa.Table, int]:
    """(quarantined, the run's valid records, valid machine-wide records, how many valid records are another run's)."""
    m = of(t, run_id)
    other = t.num_rows - pc.sum(pc.or_(m.quarantined, pc.or_(m.run, m.shared))).as_py() if t.num_rows else 0
    return t.filter(m.quarantined), t.filter(m.mine), t.filter(m.shared_valid), int(other or 0)
