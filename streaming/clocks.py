"""Clock correction: every agent's stamps brought onto the clock reference's time, per agent and over time.

A flight time is ``receive stamp − send stamp``, taken by two agents, often on two hosts: each host's clock is off
the reference's by its own offset, and the flight by the difference (a few ms is usual under NTP; at 5 to 30 ms
flights, 10 to 100% of the figure). Every agent measures its offset against the clock reference every few seconds
(``core.clock``) and writes it as a ``clock`` record: ``offset_us`` (reference − agent) known to ± ``rtt_us`` / 2.

The job keeps, per agent, its recent estimates (``learn``) and corrects each send, ack, receive and run marker of
that agent (``correct``) by the estimate in force at its stamp: the latest one measured at or before it, or the
agent's earliest for stamps before any. An estimate is applied only when it is beyond its own error (``|offset| >
rtt / 2``); on one host it never is (``t0 ≤ t1 ≤ t2 ≤ t3`` on one clock bounds the estimate by ``rtt / 2``), so a
one-machine run is not touched.

Each corrected row keeps its correction and its error in two columns (``CORRECTION``, ``ERROR``, ns), which the
archive holds: the raw stamp is ``at_ns − CORRECTION``, and a replay takes the live run's corrections as they were
(a row with a correction is not corrected again), so it gives the run's own numbers whatever records it has read
first. ``--no-clock-correction`` keeps the raw stamps, and takes an archived correction back off.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

CORRECTION = "clock_correction_ns"
"""What was added to the row's stamps (``at_ns``, ``intended_at_ns``, ``sent_at_ns``, ``acked_at_ns``): reference −
agent, ns; 0 when none was applied."""
ERROR = "clock_error_ns"
"""The correction's uncertainty (± ns): half its estimate's round trip; null when the agent had no estimate."""
COLUMNS = (pa.field(CORRECTION, pa.int64()), pa.field(ERROR, pa.int64()))
CORRECTED_KINDS = ("send", "ack", "recv", "run_start", "run_stop", "heartbeat")
"""The records whose stamps are an agent's clock reading about the run."""
SHIFTED = ("at_ns", "intended_at_ns", "sent_at_ns", "acked_at_ns")
KEEP_ESTIMATES = 24
"""Estimates kept per agent (at one every 5 s, the last two minutes; they travel with every batch's verdicts): a
stamp older than them takes the oldest."""


def learn(table: dict, records: pa.Table) -> dict:
    """``table`` (agent -> [[measured_at_ns, offset_ns, error_ns], ...], sorted, JSON-able) with the ``clock``
    records among ``records``; the same estimate twice is kept once."""
    if records.num_rows == 0 or "kind" not in records.column_names:
        return table
    clocks = records.filter(pc.fill_null(pc.and_(pc.equal(records["kind"], "clock"),
                                                 pc.is_null(records["quarantine_reason"])), False))
    if clocks.num_rows == 0:
        return table
    out = {agent: list(rows) for agent, rows in table.items()}
    for agent, at, off_us, rtt_us in zip(clocks["agent"].to_pylist(), clocks["at_ns"].to_pylist(),
                                         clocks["offset_us"].to_pylist(), clocks["rtt_us"].to_pylist()):
        if agent is None or at is None or off_us is None or rtt_us is None:
            continue
        out.setdefault(agent, []).append([int(at), int(round(off_us * 1000)), int(round(rtt_us * 500))])
    for agent, rows in out.items():
        out[agent] = [list(r) for r in sorted({tuple(r) for r in rows})][-KEEP_ESTIMATES:]
    return out


def in_force(estimates: list, at_ns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(offset_ns, error_ns) of the estimate in force at each stamp: the latest measured at or before it, else the
    earliest."""
    e = np.asarray(estimates, dtype=np.int64).reshape(-1, 3)
    i = np.maximum(np.searchsorted(e[:, 0], at_ns, side="right") - 1, 0)
    return e[i, 1], e[i, 2]


def correct(t: pa.Table, table: dict, enabled: bool = True) -> pa.Table:
    """``t`` with its agents' stamps corrected (``enabled``) or raw: rows without a correction get one (0 when their
    agent has no estimate, or its estimate is within its error, or ``enabled`` is False); with ``enabled`` False, a
    correction a row has is taken back off. Other rows, and rows corrected already, are as they were."""
    if t.num_rows == 0:
        return with_columns(t)
    t = with_columns(t)
    corr = t[CORRECTION].to_numpy(zero_copy_only=False)
    has = ~np.isnan(corr) if corr.dtype.kind == "f" else np.ones(len(corr), bool)
    need = np.asarray(pc.fill_null(pc.and_(pc.is_in(t["kind"], pa.array(CORRECTED_KINDS)), pc.is_null(t["quarantine_reason"])),
                                   False)) & ~has
    old = np.where(has, np.nan_to_num(corr), 0).astype(np.int64)
    undo = has & (old != 0) & (not enabled)
    if not need.any() and not undo.any():
        return t
    new, err = old.copy(), t[ERROR].to_numpy(zero_copy_only=False).astype(np.float64)
    new[undo], err[undo] = 0, np.nan
    err[need] = np.nan
    new[need] = 0
    if enabled and table:
        agents, at = t["agent"].to_numpy(zero_copy_only=False), t["at_ns"].to_numpy(zero_copy_only=False)
        for agent in set(agents[need].tolist()) & set(table):
            rows = np.flatnonzero(need & (agents == agent))
            off, e = in_force(table[agent], at[rows].astype(np.int64))
            new[rows] = np.where(np.abs(off) > e, off, 0)
            err[rows] = e
    delta = new - old
    for name in SHIFTED:
        if name in t.column_names and delta.any():
            col = t[name]
            t = t.set_column(t.schema.get_field_index(name), name, pc.add(col, pa.array(delta, pa.int64())))
    mask = need | undo
    t = t.set_column(t.schema.get_field_index(CORRECTION), CORRECTION,
                     pa.array(np.where(mask | has, new, 0), pa.int64(), mask=~(mask | has)))
    return t.set_column(t.schema.get_field_index(ERROR), ERROR,
                        pa.array(np.nan_to_num(err).astype(np.int64), pa.int64(), mask=np.isnan(err)))


def with_columns(t: pa.Table) -> pa.Table:
    """``t`` with the two columns, null where it had none (an archive from before them)."""
    for f in COLUMNS:
        if f.name not in t.column_names:
            t = t.append_column(f, pa.nulls(t.num_rows, f.type))
    return t


def raw_stamps(t: pa.Table, name: str = "at_ns") -> np.ndarray:
    """A column's stamps as the agents took them (the correction taken off)."""
    corr = t[CORRECTION].to_numpy(zero_copy_only=False) if CORRECTION in t.column_names else 0
    return t[name].to_numpy(zero_copy_only=False).astype(np.int64) - np.nan_to_num(corr).astype(np.int64)
