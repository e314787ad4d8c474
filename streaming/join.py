"""One join partition: the event IDs whose hash falls in it, joined send to receive, in two steps per micro-batch.

Event IDs are split by hash into ``join_partitions`` (P) partitions; each joins its own sends, acks and receives
with its own state (``streaming.state.JoinState``) and needs nothing of the others'. The run-level rules (the
watermark, each agent's progress, run start and stop, gaps, the reset's hole) are the driver's
(``streaming.engine``); it tells every partition the batch's watermark and how far the agents have written, as
Spark itself applies one watermark to every partition of a stateful operator. A partition's step needs nothing
else, so it runs where its records are: in this process, or in an executor's task (``streaming.executors``).

* ``summarize`` (before): the driver sees every record but this run's sends, acks and receives, and of those,
  per agent and kind, the first and last stamp: enough for the watermark, the agents' progress and a reset's hole,
  which it decides (``Verdicts``) before any partition runs.
* ``take``: the batch's sends, acks and receives of the partition (``rules.take_sends``, ``take_acks``,
  ``take_receives``), and a ``Report`` of what the driver needs after: the new send and receive stamps for the
  gap rule, and for a reset the sends still waiting.
* ``settle``: with the run-level decisions: orphans expire, a reset's unknowns, drops declared, named and
  forgotten (``rules.expire_orphans``, ``mark_unknown``, ``declare_drops``, ``name_drops``, ``forget``).

A partition's output is partials only (counts and histogram buckets summed per window, exemplar rows) plus the
send and receive stamps the driver's gap rule reads. Partials are sums (exemplars tops) over partitions, so the results
do not depend on P.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from streaming import clocks, membership, partials, rules
from streaming.state import EngineConfig, JoinState

DATA_KINDS = membership.DATA_KINDS
KEY = rules.KEY


def partition_of(keys: np.ndarray, num_partitions: int) -> np.ndarray:
    """The join partition of each event ID hash."""
    return (keys % np.uint64(num_partitions)).astype(np.int64)


def split(data: pa.Table, num_partitions: int) -> list[pa.Table]:
    """A batch's sends, acks and receives of this run (``summarize``) by their ID's partition, with the ID's hash in
    ``KEY`` (computed once, here)."""
    keys = rules.id_hash(data["event_id"].to_numpy(zero_copy_only=False))
    data = data.append_column(KEY, pa.array(keys, pa.uint64()))
    if num_partitions == 1:
        return [data]
    part = partition_of(keys, num_partitions)
    order = np.argsort(part, kind="stable")
    bounds = np.searchsorted(part[order], np.arange(num_partitions + 1))
    taken = data.take(pa.array(order))
    return [taken.slice(bounds[i], bounds[i + 1] - bounds[i]) for i in range(num_partitions)]


@dataclass
class Report:
    """What one partition's ``take`` tells the driver."""
    waiting: tuple         # ``rules.waiting_before``: for a reset
    new_sends_ns: np.ndarray   # the batch's new sends and receives (once each), for the gap rule
    fresh_recv_ns: np.ndarray


@dataclass(frozen=True)
class Verdicts:
    """The run-level decisions of a batch that every partition applies (``step``): the state's before it, and the
    new ones. JSON-able: a batch's are kept with it, to bring a partition's state back by redoing batches."""
    hole_until_before_ns: int   # the telemetry hole and the named drops as they were before the batch
    drops_named_before_ns: int
    watermark_ns: int
    judged_ns: int
    hole_until_ns: int
    reset: bool = False         # the batch holds a reset: the waiting sends are marked unknown
    clocks: dict = field(default_factory=dict)  # the agents' clock estimates the batch's stamps are corrected by


def step(state: JoinState, records: pa.Table, cfg: EngineConfig, v: Verdicts) -> tuple[Settled, Report]:
    """A batch in one partition: ``take``, then ``settle``."""
    taken, report = take(state, records, cfg, v)
    return settle(taken, cfg, v), report


@dataclass
class Taken:
    """A partition between its two steps: the IDs it knows and the orphans, with the batch's records taken."""
    known: rules.Known
    orphans: pd.DataFrame
    exemplars: list
    out: partials.Collector


def take(state: JoinState, records: pa.Table, cfg: EngineConfig, v: Verdicts) -> tuple[Taken, Report]:
    """Step one of a batch in one partition: its sends, acks and receives."""
    records = clocks.correct(records, v.clocks, cfg.clock_correction)  # corrected already when archived or local
    batch, out = rules.Records.of(records), partials.Collector(cfg.window_ns)
    known, sends_ns = rules.take_sends(rules.Known.of(state.known, state.lookup), batch, v.hole_until_before_ns, out)
    known, unnamed = rules.take_acks(known, batch, v.drops_named_before_ns, out)
    received = rules.take_receives(known, state.orphans, batch, v.drops_named_before_ns, cfg, out)
    waiting = rules.waiting_before(received.known, len(state.known))
    return (Taken(received.known, received.orphans, [unnamed, *received.exemplars], out),
            Report(waiting, sends_ns, received.fresh_recv_ns))


@dataclass
class Settled:
    """What one partition's ``settle`` gives: its new state and its partials of the batch, summed per window."""
    state: JoinState
    counts: pd.DataFrame      # ``partials.Collector.counts_frame``
    hists: pd.DataFrame       # ``partials.Collector.hists_frame``
    exemplars: list           # frames of ``partials.slowest`` and ``first_dropped`` rows
    sizes: dict               # IDs known, waiting and orphaned


def settle(t: Taken, cfg: EngineConfig, v: Verdicts) -> Settled:
    """Step two, with the driver's verdicts: orphans expire, a reset's unknowns are marked, drops are declared,
    named and forgotten."""
    out = t.out
    orphans = rules.expire_orphans(t.orphans, v.watermark_ns, cfg, out)
    known = t.known
    if v.reset:
        known = rules.mark_unknown(known, v.hole_until_ns)
    elif v.hole_until_ns > v.hole_until_before_ns:  # the hole grew: its drops are unaccounted too
        known = rules.mark_unknown(known, v.hole_until_ns, out, v.hole_until_before_ns)
    known = rules.declare_drops(known, v.watermark_ns, cfg, out)
    named = rules.name_drops(known, v.drops_named_before_ns, v.watermark_ns, v.judged_ns, cfg)
    known = rules.forget(known, v.watermark_ns, cfg)
    waiting = (known.status == rules.PENDING) | (known.status == rules.UNKNOWN)
    sizes = {"num_known": int(len(known.frame)), "num_pending": int(waiting.sum()), "num_orphans": int(len(orphans))}
    return Settled(JoinState(known=known.frame_out(), orphans=orphans, lookup=known.lookup), out.counts_frame(), out.hists_frame(),
                   [e for e in [*t.exemplars, named] if len(e)], sizes)


NUM_RECORDS = "num_records"
"""The column of a summary (``summarize``) that marks a row of first and last stamps, with how many records it
stands for (null on a record passed through)."""


def summarize(batch: pa.Table, run_id: str) -> tuple[pa.Table, pa.Table]:
    """(the driver's view of a batch, the records of the join partitions): this run's valid sends, acks and
    receives go to the partitions; the driver sees every other record as it is and, for those, per kind and agent
    two rows, the first and the last stamp, the first with their count in ``NUM_RECORDS`` (sends written with their
    answer apart, with the first and last answer's stamp too). Summaries of parts of a batch (each read task's)
    concatenate into the summary of the whole."""
    mine = membership.data(batch, run_id)
    data, rest = batch.filter(mine), batch.filter(pc.invert(mine))
    rest = rest.append_column(NUM_RECORDS, pa.nulls(rest.num_rows, pa.int64()))
    if data.num_rows == 0:
        return rest, data
    g = (data.select(["kind", "agent", "at_ns", "acked_at_ns", clocks.CORRECTION])
         .append_column("answered", pc.is_valid(data["acked_at_ns"]))
         .group_by(["kind", "agent", "answered"]).aggregate(
             [("at_ns", "min"), ("at_ns", "max"), ("at_ns", "count"), ("acked_at_ns", "min"), ("acked_at_ns", "max"),
              (clocks.CORRECTION, "min")]))
    n = g.num_rows
    stamps = pa.table({
        "kind": pa.concat_arrays([g["kind"].combine_chunks()] * 2), "agent": pa.concat_arrays([g["agent"].combine_chunks()] * 2),
        "run_id": pa.array([run_id] * (2 * n), pa.string()),
        "at_ns": pa.concat_arrays([g["at_ns_min"].combine_chunks(), g["at_ns_max"].combine_chunks()]),
        # sends written with their answer apart from those written alone: when they were written
        # (``run_rules.written_through``)
        "acked_at_ns": pa.concat_arrays([g["acked_at_ns_min"].combine_chunks(), g["acked_at_ns_max"].combine_chunks()]),
        NUM_RECORDS: pa.concat_arrays([g["at_ns_count"].combine_chunks().cast(pa.int64()), pa.array(np.zeros(n, np.int64))]),
        # corrected already (a replay, a driver that corrects the whole batch): the driver does not correct them again
        clocks.CORRECTION: pa.concat_arrays([g[f"{clocks.CORRECTION}_min"].combine_chunks()] * 2),
    })
    return pa.concat_tables([rest, stamps], promote_options="default"), data


def repartition(joins: list[JoinState], num_partitions: int) -> list[JoinState]:
    """The same state split into another number of partitions (a run resumed with another P)."""
    if len(joins) == num_partitions:
        return joins
    known = pd.concat([j.known for j in joins]) if joins else JoinState().known
    orphans = pd.concat([j.orphans for j in joins], ignore_index=True) if joins else JoinState().orphans
    kp = partition_of(known.index.to_numpy(np.uint64), num_partitions)
    op = partition_of(orphans["event_id"].to_numpy(np.uint64), num_partitions)
    return [JoinState(known=known[kp == i], orphans=orphans[op == i].reset_index(drop=True)) for i in range(num_partitions)]

