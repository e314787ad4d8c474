"""One join partition: the event IDs whose hash falls in it, joined send to receive, in two steps per micro-batch.

Event IDs are split by hash into ``join_partitions`` (P) partitions; each joins its own sends, acks and receives
with its own state (``streaming.state.JoinState``) and needs nothing of the others'. The run-level rules (the
watermark, each agent's progress, run start and stop, gaps, the reset's hole) are the driver's
(``streaming.engine``); between the two steps it tells every partition the new watermark and how far the agents
have written, as Spark itself applies a watermark to every partition of a stateful operator.

* ``take``: the batch's sends, acks and receives of the partition (``rules.take_sends``, ``take_acks``,
  ``take_receives``), and a ``Report`` of what the driver needs: per agent and kind the first and last stamp of
  these records, and for a reset the sends still waiting.
* ``settle``: with the run-level decisions (``Verdicts``): orphans expire, a reset's unknowns, drops declared,
  named and forgotten (``rules.expire_orphans``, ``mark_unknown``, ``declare_drops``, ``name_drops``, ``forget``).

A partition's output is partials only (counts and histogram values by window, exemplar rows) plus the send and
receive stamps the driver's gap rule reads. Partials are sums (exemplars tops) over partitions, so the results
do not depend on P.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from streaming import partials, rules
from streaming.state import EngineConfig, EngineState, JoinState

DATA_KINDS = ("send", "ack", "recv")
"""The records that carry an event ID and go to its join partition; every other kind is the driver's."""
KEY = rules.KEY


def partition_of(keys: np.ndarray, num_partitions: int) -> np.ndarray:
    """The join partition of each event ID hash."""
    return (keys % np.uint64(num_partitions)).astype(np.int64)


def split(good: pa.Table, kinds: np.ndarray, num_partitions: int) -> tuple[list[pa.Table], pa.Table]:
    """(each partition's sends, acks and receives, the rest): a batch's valid records of this run by their ID's
    partition, with the ID's hash in ``KEY`` (computed once, here)."""
    data = np.isin(kinds, DATA_KINDS)
    rest = good.filter(pa.array(~data))
    mine = good.filter(pa.array(data))
    keys = rules.id_hash(mine["event_id"].to_numpy(zero_copy_only=False))
    mine = mine.append_column(KEY, pa.array(keys, pa.uint64()))
    if num_partitions == 1:
        return [mine], rest
    part = partition_of(keys, num_partitions)
    order = np.argsort(part, kind="stable")
    bounds = np.searchsorted(part[order], np.arange(num_partitions + 1))
    taken = mine.take(pa.array(order))
    return [taken.slice(bounds[i], bounds[i + 1] - bounds[i]) for i in range(num_partitions)], rest


@dataclass
class Report:
    """What one partition's ``take`` tells the driver."""
    stamps: pa.Table       # per agent and kind, the first and last ``at_ns`` of the partition's records (kind, agent, at_ns)
    waiting: tuple         # ``rules.waiting_before``: for a reset
    new_sends_ns: np.ndarray   # the batch's new sends and receives (once each), for the gap rule
    fresh_recv_ns: np.ndarray


@dataclass
class Verdicts:
    """The run-level decisions every partition applies in ``settle``."""
    watermark_ns: int
    judged_ns: int
    hole_until_ns: int


def take(state: JoinState, records: pa.Table, cfg: EngineConfig, hole_until_ns: int, drops_named_ns: int) -> tuple[rules.Work, Report]:
    """Step one of a batch in one partition: its sends, acks and receives."""
    kinds = records["kind"].to_numpy(zero_copy_only=False) if records.num_rows else np.array([], dtype=object)
    view = EngineState(joins=[state], hole_until_ns=hole_until_ns, drops_named_ns=drops_named_ns)
    w = rules.Work(cfg, view, records, records.schema.empty_table(), kinds, partials.Collector(cfg.window_ns), {})
    rules.take_sends(w)
    rules.take_acks(w)
    rules.take_receives(w)
    return w, Report(_first_and_last(records), rules.waiting_before(w), w.sends["at_ns"].to_numpy(), w.fresh_recv_ns)


def settle(w: rules.Work, v: Verdicts) -> tuple[JoinState, dict]:
    """Step two: orphans expire, a reset's unknowns are marked, drops are declared, named and forgotten. Returns the
    partition's new state and its counts of IDs (known, waiting, orphans)."""
    w.watermark_ns, w.judged_ns = v.watermark_ns, v.judged_ns
    rules.expire_orphans(w)
    if v.hole_until_ns != w.state.hole_until_ns:
        rules.mark_unknown(w, v.hole_until_ns)
    rules.declare_drops(w)
    rules.name_drops(w)
    rules.forget(w)
    waiting = (w.status == rules.PENDING) | (w.status == rules.UNKNOWN)
    return JoinState(known=w.known, orphans=w.orphans), {
        "num_known": int(len(w.known)), "num_pending": int(waiting.sum()), "num_orphans": int(len(w.orphans))}


def _first_and_last(records: pa.Table) -> pa.Table:
    """Per agent and kind, two rows: the first and the last stamp (all a partition's records say of time)."""
    if records.num_rows == 0:
        return pa.table({"kind": pa.array([], pa.string()), "agent": pa.array([], pa.string()), "at_ns": pa.array([], pa.int64())})
    g = records.select(["kind", "agent", "at_ns"]).group_by(["kind", "agent"]).aggregate([("at_ns", "min"), ("at_ns", "max")])
    return pa.table({"kind": pc.list_flatten(pa.array([[k, k] for k in g["kind"].to_pylist()])),
                     "agent": pc.list_flatten(pa.array([[a, a] for a in g["agent"].to_pylist()])),
                     "at_ns": pa.array(np.ravel(np.c_[g["at_ns_min"].to_numpy(), g["at_ns_max"].to_numpy()]), pa.int64())})


def repartition(joins: list[JoinState], num_partitions: int) -> list[JoinState]:
    """The same state split into another number of partitions (a run resumed with another P)."""
    if len(joins) == num_partitions:
        return joins
    known = pd.concat([j.known for j in joins]) if joins else JoinState().known
    orphans = pd.concat([j.orphans for j in joins], ignore_index=True) if joins else JoinState().orphans
    kp = partition_of(known.index.to_numpy(np.uint64), num_partitions)
    op = partition_of(orphans["event_id"].to_numpy(np.uint64), num_partitions)
    return [JoinState(known=known[kp == i], orphans=orphans[op == i].reset_index(drop=True)) for i in range(num_partitions)]

