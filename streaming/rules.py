"""The join's rules: what one join partition decides of the event IDs it holds, one function each.

``streaming.join`` applies them in this order, and shows the flow: ``take_sends``, ``take_acks``, ``take_receives``
(step one, with the batch's records), then ``expire_orphans``, ``mark_unknown`` (after a telemetry reset),
``declare_drops``, ``name_drops`` and ``forget`` (step two, with the driver's watermark and verdicts). Each rule
takes what it reads as arguments and returns what it decides, as new values (a ``Known`` is never changed in
place); the counts it makes go to ``out``, the batch's accumulator (``partials.Collector``; names: ``core.output``),
the only argument a rule writes to. None does I/O or reads a clock. The driver's rules (watermark, the agents'
progress, the run's span, gaps, events) are ``streaming.run_rules``.
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from core import contract, output
from streaming import misrouting, partials
from streaming.keylookup import KeyLookup
from streaming.state import NO_ROUTE, NO_TIME_NS, EngineConfig

PENDING, RECEIVED, LATE, DROPPED, ERRORED, UNKNOWN, UNACCOUNTED, MISROUTED = 0, 1, 2, 3, 4, 5, 6, 7
"""Status of a known event ID: waiting; delivered in time; delivered after its deadline;
declared dropped; failed at the sender (an error ack) and never delivered in time; waiting when the telemetry broker
lost its data (its receive record may have gone with it); past its deadline so (not a drop: ``unaccounted``); first
delivered on a route it was not sent to (``core.contract.Receive``)."""

KEY = "event_key"
"""A column of a join partition's records holding each event ID's hash (``streaming.join.split``), when present."""


def id_hash(event_ids: np.ndarray) -> np.ndarray:
    """64-bit key of each event ID string (deterministic across processes and runs)."""
    if len(event_ids) == 0:
        return np.array([], dtype=np.uint64)
    return pd.util.hash_array(np.asarray(event_ids, dtype=object), categorize=False)


def _column(df: pd.DataFrame, name: str) -> np.ndarray:
    return df[name].to_numpy()


@dataclass(frozen=True)
class Records:
    """A batch's records, read-only: ``good`` (the run's valid records), ``shared`` (machine-wide records) and
    ``good``'s kinds.

        >>> r = Records.of(table)
        >>> r.rows("send", ["event_id", "at_ns"])   # a frame of the run's sends
    """
    good: pa.Table
    shared: pa.Table
    kinds: np.ndarray

    @classmethod
    def of(cls, good: pa.Table, shared: pa.Table | None = None) -> Records:
        kinds = good["kind"].to_numpy(zero_copy_only=False) if good.num_rows else np.array([], dtype=object)
        return cls(good, good.schema.empty_table() if shared is None else shared, kinds)

    def rows(self, kind: str, cols: list[str]) -> pd.DataFrame:
        """The records of one kind (``event_id`` hashed, or its hash taken from ``KEY``; the ID itself in ``id``)."""
        return self._frame(self.kinds == kind, cols)

    @functools.cached_property
    def answered_ns(self) -> np.ndarray:
        """Per record, when a send written with its answer was answered (``acked_at_ns``); 0 for any other."""
        good = self.good
        if not good.num_rows or "acked_at_ns" not in good.column_names or good["acked_at_ns"].null_count == good.num_rows:
            return np.zeros(good.num_rows, np.int64)
        return np.where(self.kinds == "send", pc.fill_null(good["acked_at_ns"], 0).to_numpy(), 0)

    def answers(self) -> pd.DataFrame:
        """The answers to sends as ack records give them (``event_id``, ``sent_at_ns``, ``status``, ``error``): the
        ack records, and the sends written with their answer (``contract.SEND_HOLD_NS``)."""
        cols = ["event_id", "sent_at_ns", "status", "error"]
        acks = self.rows("ack", cols)
        answered = self.answered_ns != 0
        if not answered.any():
            return acks
        sends = self._frame(answered, ["event_id", "at_ns", "status", "error"]).rename(columns={"at_ns": "sent_at_ns"})
        return pd.concat([acks, sends], ignore_index=True) if len(acks) else sends

    def _frame(self, mask: np.ndarray, cols: list[str]) -> pd.DataFrame:
        """``route`` is a column of ints (``NO_ROUTE`` where none was given, or the table has none)."""
        names = self.good.column_names
        keyed = "event_id" in cols and KEY in names
        present = [c for c in cols if c in names]
        sel = self.good.filter(pa.array(mask)).select(present + [KEY] if keyed else present)
        df = pd.DataFrame({c: sel[c].to_numpy(zero_copy_only=False) if c != "route" else
                           pc.fill_null(sel[c], NO_ROUTE).to_numpy().astype(np.int32) for c in present})
        if "route" in cols and "route" not in names:
            df["route"] = np.full(len(df), NO_ROUTE, np.int32)
        if "event_id" in df:
            df["id"] = df["event_id"]  # the ID itself, for exemplars
            df["event_id"] = sel[KEY].to_numpy() if keyed else id_hash(df["event_id"].to_numpy())
        return df

    def of_kinds(self, *kinds: str) -> pa.Array:
        """``at_ns`` of the records of these kinds."""
        return self.good.filter(pa.array(np.isin(self.kinds, kinds)))["at_ns"] if self.good.num_rows else pa.array([], pa.int64())


DECIDED = ("status", "errored", "recv_ns", "dup_ns", "acked")
"""The columns of a partition's known IDs that the rules decide (``Known``'s arrays)."""


@dataclass(frozen=True)
class Known:
    """A partition's known event IDs: ``frame`` (index: the ID's hash; ``sent_ns``, ``intended_ns``, ``id``) and
    what has been decided of each, as arrays aligned with it. A rule returns a new ``Known``; the arrays it got are
    never written to.

        >>> known = Known.of(join_state.known)
        >>> known.frame_out()      # the state's table again
    """
    frame: pd.DataFrame
    status: np.ndarray
    errored: np.ndarray
    recv_ns: np.ndarray
    dup_ns: np.ndarray
    acked: np.ndarray
    lookup: KeyLookup | None = None   # ``frame``'s rows by ID hash (``positions``), carried over by the rules

    @classmethod
    def of(cls, frame: pd.DataFrame, lookup: KeyLookup | None = None) -> Known:
        if lookup is not None and lookup.size != len(frame):
            lookup = None
        return cls(frame, _column(frame, "status"), _column(frame, "errored"), _column(frame, "recv_ns"),
                   _column(frame, "dup_ns"), _column(frame, "acked"), lookup or KeyLookup.of(frame.index))

    @property
    def sent_ns(self) -> np.ndarray:
        return _column(self.frame, "sent_ns")

    @property
    def nbytes(self) -> int:
        """Its pieces' arrays, and each index's hash table (about three times its keys')."""
        return sum(4 * index.nbytes + now.nbytes for index, now in self.pieces)

    def positions(self, keys: np.ndarray) -> np.ndarray:
        """Each key's row, -1 for a key not known."""
        return self.lookup.positions(keys)

    def frame_out(self) -> pd.DataFrame:
        """The table the state keeps, with the decisions in it (``frame`` itself when no rule changed one)."""
        if all(np.may_share_memory(getattr(self, c), _column(self.frame, c)) for c in DECIDED):
            return self.frame
        return self.frame.assign(**{c: getattr(self, c) for c in DECIDED})

    def unname(self, pos: np.ndarray, drops_named_ns: int) -> pd.DataFrame:
        """Exemplar rows withdrawing the drop exemplars of these rows, if they were named already."""
        named = pos[self.sent_ns[pos] < drops_named_ns]
        if not len(named):
            return pd.DataFrame()
        return pd.DataFrame({"kind": "dropped_id", "at_ns": self.sent_ns[named], "count": -1,
                             "event_id": partials.ids(self.frame, named)})


def take_sends(known: Known, records: Records, hole_until_ns: int, out: partials.Collector) -> tuple[Known, np.ndarray]:
    """(known with the new IDs, the new sends' stamps): new IDs become pending (unknown when sent inside a telemetry
    hole); a re-sent send record (agent retry) is not counted twice. Counts ``sent`` and the send delay, by send
    window."""
    sends = records.rows("send", ["event_id", "at_ns", "intended_at_ns", "route"]).sort_values(["at_ns", "event_id"], kind="stable")
    repeat = sends["event_id"].duplicated().to_numpy() | (known.positions(_column(sends, "event_id")) >= 0)
    if repeat.any():
        out.add(output.REPEATED_SEND_RECORDS, _column(sends[repeat], "at_ns"))
        sends = sends[~repeat]
    at = _column(sends, "at_ns")
    out.add(output.SENT, at)
    out.record(output.SEND_DELAY, at, (at - _column(sends, "intended_at_ns")) // 1000, output.NEGATIVE_SEND_DELAY)
    if not len(sends):
        return known, at
    new = pd.DataFrame(
        {"sent_ns": at, "intended_ns": _column(sends, "intended_at_ns"), "errored": False, "recv_ns": np.int64(-1),
         "dup_ns": np.int64(-1), "acked": False,
         "status": np.where(at < hole_until_ns, UNKNOWN, PENDING).astype(np.int8), "id": _column(sends, "id"),
         "route": _column(sends, "route")},
        index=pd.Index(_column(sends, "event_id"), dtype=np.uint64, name="event_id"),
    )
    if not len(known.frame):
        return Known.of(new), at
    return Known.of(pd.concat([known.frame_out(), new]), known.lookup.appended(new.index)), at


def take_acks(known: Known, records: Records, drops_named_ns: int, out: partials.Collector) -> tuple[Known, pd.DataFrame]:
    """(known with the answered sends marked, exemplar rows withdrawn): failures by cause (``core.contract.failures``),
    charged to the send window; a failed send is not a drop, so a drop already declared for it is withdrawn (and
    unnamed). An answer to a send answered already is the sender's record re-sent (a restart, a producer's retry):
    counted once, as its send."""
    acks = records.answers()
    if not len(acks):
        return known, pd.DataFrame()
    at = known.positions(_column(acks, "event_id"))
    again = acks["event_id"].duplicated().to_numpy(copy=True)
    again[at >= 0] |= known.errored[at[at >= 0]] | known.acked[at[at >= 0]]
    if again.any():
        acks, at = acks[~again], at[~again]
    st = acks["status"].to_numpy(dtype=np.float64, na_value=np.nan)
    err = acks["error"].to_numpy(dtype=object)
    failed = contract.failures(st, err)
    sent_at = _column(acks, "sent_at_ns")
    out.add(output.ACKED, sent_at[~failed])
    if (~failed & (at >= 0)).any():
        acked = known.acked.copy()
        acked[at[~failed & (at >= 0)]] = True
        known = dataclasses.replace(known, acked=acked)
    if not failed.any():
        return known, pd.DataFrame()
    causes = np.where(pd.notna(err[failed]), err[failed], np.char.add("http_", np.nan_to_num(st[failed]).astype(np.int64).astype(str)).astype(object))
    out.add_names(np.char.add(output.ERRORS_BY_CAUSE, causes.astype(str)).astype(object), sent_at[failed])
    out.add(output.ERRORS, sent_at[failed])
    pos = at[failed]
    pos = np.unique(pos[pos >= 0])
    # received before its failure came back: in doubt (the ledger's); received late, it was also counted as a drop
    fresh = pos[~known.errored[pos]]
    out.add(output.IN_DOUBT, known.sent_ns[fresh[known.status[fresh] == RECEIVED]])
    late = fresh[known.status[fresh] == LATE]
    out.add(output.FAILED_LATE, known.sent_ns[late])
    out.add(output.FAILED_MISROUTED, known.sent_ns[fresh[known.status[fresh] == MISROUTED]])
    out.add(output.DROPPED, known.sent_ns[late], -1)
    undo = pos[known.status[pos] == DROPPED]
    out.add(output.DROPPED, known.sent_ns[undo], -1)
    status, errored = known.status.copy(), known.errored.copy()
    status[undo] = ERRORED
    errored[pos] = True
    return dataclasses.replace(known, status=status, errored=errored), known.unname(undo, drops_named_ns)


@dataclass(frozen=True)
class Received:
    """What ``take_receives`` decides."""
    known: Known
    orphans: pd.DataFrame        # receives whose send has not been seen (yet)
    fresh_recv_ns: np.ndarray    # every new receive, once: the silences between them (``streaming.gaps``)
    exemplars: list              # the slowest deliveries; drop exemplars withdrawn


def take_receives(known: Known, orphans: pd.DataFrame, records: Records, drops_named_ns: int, cfg: EngineConfig,
                  out: partials.Collector) -> Received:
    """With the earlier orphans: the first delivery of an ID decides (in time: received, latency; after its
    deadline: late, and a drop unless it failed); later ones are duplicates. An identical record (same event, same
    receive time as its first delivery or its latest duplicate) is an agent re-sending its telemetry (a restart, a
    producer's retry), not another delivery."""
    new_recv = records.rows("recv", ["event_id", "at_ns", "route"]).assign(new=True)
    recv = pd.concat([orphans.assign(new=False), new_recv], ignore_index=True) if len(orphans) else new_recv
    recv = recv.sort_values(["at_ns", "event_id"], kind="stable")
    repeat = recv.duplicated(["event_id", "at_ns"]).to_numpy()
    if repeat.any():
        out.add(output.REPEATED_RECEIVE_RECORDS, _column(recv, "at_ns")[repeat])
        recv = recv[~repeat]
    rid, rat = _column(recv, "event_id"), _column(recv, "at_ns").astype(np.int64)
    pos = known.positions(rid)
    found = pos >= 0
    first = ~recv["event_id"].duplicated().to_numpy()
    prior = np.full(pos.shape, -1, dtype=np.int64)
    prior[found] = known.status[pos[found]]
    delivered_before = (prior == RECEIVED) | (prior == LATE) | (prior == MISROUTED)
    seen = np.zeros(pos.shape, dtype=bool)
    seen[found] = (known.recv_ns[pos[found]] == rat[found]) | (known.dup_ns[pos[found]] == rat[found])
    resent = found & delivered_before & seen
    out.add(output.REPEATED_RECEIVE_RECORDS, rat[resent])
    fresh_recv_ns = rat[recv["new"].to_numpy(dtype=bool) & ~resent]
    decide = found & first & ~delivered_before
    duplicate = found & ~decide & ~resent
    out.add(output.DUPLICATES, rat[duplicate])
    sent_ns = known.sent_ns
    mis = misrouting.misrouted(_column(known.frame, "route") if "route" in known.frame else None, pos,
                               _column(recv, "route"), decide)
    pm = pos[mis]
    exemplars = [misrouting.take(known, pm, rat[mis], recv["id"].to_numpy(object)[mis], _column(recv, "route")[mis],
                                 known.status[pm] == DROPPED, known.status[pm] == UNACCOUNTED, drops_named_ns, out)]
    decide &= ~mis
    p, at = pos[decide], rat[decide]
    in_time = at - sent_ns[p] <= cfg.drop_timeout_ns
    failed = known.errored[p]  # failed at the sender, yet received: in doubt (the ledger's), by its send window
    out.add(output.IN_DOUBT, sent_ns[p][failed & in_time])
    out.add(output.FAILED_LATE, sent_ns[p][failed & ~in_time])
    delta = (~in_time & ~failed).astype(np.int64) - (known.status[p] == DROPPED).astype(np.int64)
    out.add(output.DROPPED, sent_ns[p][delta != 0], delta[delta != 0])
    out.add(output.UNACCOUNTED, sent_ns[p][known.status[p] == UNACCOUNTED], -1)  # its fate is known after all
    exemplars.append(known.unname(p[delta < 0], drops_named_ns))  # named already (an agent out of order)
    ok_p, ok_at = p[in_time], at[in_time]
    out.add(output.RECEIVED, ok_at)
    latency_us = (ok_at - sent_ns[ok_p]) // 1000
    out.record(output.LATENCY, ok_at, latency_us, output.CLOCK_SKEW)
    out.record(output.LATENCY_INTENDED, ok_at, (ok_at - _column(known.frame, "intended_ns")[ok_p]) // 1000)
    out.add(output.max_of(output.LATENCY), ok_at, latency_us)
    exemplars.append(partials.slowest(ok_at, ok_at - sent_ns[ok_p], recv["id"].to_numpy(object)[decide][in_time],
                                      cfg.window_ns))
    out.add(output.LATE, at[~in_time])
    status, recv_ns, dup_ns = known.status.copy(), known.recv_ns.copy(), known.dup_ns.copy()
    status[p] = np.where(in_time, RECEIVED, LATE).astype(np.int8)
    recv_ns[p] = at
    status[pm], recv_ns[pm] = MISROUTED, rat[mis]
    dup_ns[pos[duplicate]] = rat[duplicate]  # in receive order: an ID's latest
    return Received(dataclasses.replace(known, status=status, recv_ns=recv_ns, dup_ns=dup_ns),
                    recv[~found][["event_id", "at_ns", "id", "route"]], fresh_recv_ns, exemplars)


def waiting_before(known: Known, num_before: int) -> tuple[int, int, int]:
    """(how many of the first ``num_before`` IDs (those read before the batch) still wait, the earliest of them,
    the earliest known send), 0 and ``NO_TIME_NS`` when none: what a reset's incomplete windows need of a
    partition (``streaming.run_rules.incomplete_windows``)."""
    waiting = (known.status == PENDING) & (np.arange(len(known.status)) < num_before)
    sent_ns = known.sent_ns
    return (int(waiting.sum()), int(sent_ns[waiting].min()) if waiting.any() else NO_TIME_NS,
            int(sent_ns.min()) if len(sent_ns) else NO_TIME_NS)


def expire_orphans(orphans: pd.DataFrame, watermark_ns: int, cfg: EngineConfig, out: partials.Collector) -> pd.DataFrame:
    """The orphans still waiting: a receive of an ID not seen (yet) as sent waits for its send; given up after
    deadline + retention."""
    expired = _column(orphans, "at_ns") + cfg.drop_timeout_ns + cfg.retention_ns < watermark_ns
    out.add(output.ORPHAN_RECEIVES, _column(orphans, "at_ns")[expired])
    return orphans[~expired].reset_index(drop=True)


def mark_unknown(known: Known, hole_until_ns: int, out: partials.Collector | None = None,
                 grown_from_ns: int = NO_TIME_NS) -> Known:
    """After a reset: the waiting sends (all sent before the hole) and those of the hole's windows read with the new
    log's first batch are unknown, not pending. When the hole grows (``run_rules.hole_until``) from ``grown_from_ns``,
    a send in what it grew over that was declared dropped meanwhile is unaccounted instead (counted into ``out``):
    whether the drop came first depends on how the new log was cut into batches, not on the data."""
    status = known.status.copy()
    status[(status == PENDING) & (known.sent_ns < hole_until_ns)] = UNKNOWN
    if out is not None:
        undo = (status == DROPPED) & (known.sent_ns >= grown_from_ns) & (known.sent_ns < hole_until_ns)  # never errored
        out.add(output.DROPPED, known.sent_ns[undo], -1)
        out.add(output.UNACCOUNTED, known.sent_ns[undo])
        status[undo] = UNACCOUNTED
    return dataclasses.replace(known, status=status)


def declare_drops(known: Known, watermark_ns: int, cfg: EngineConfig, out: partials.Collector) -> Known:
    """Pending sends whose deadline the watermark has passed are dropped (errored ones are not drops); those a
    telemetry reset left unknown are unaccounted."""
    deadline = known.sent_ns + cfg.drop_timeout_ns
    status = known.status.copy()
    for waiting, verdict, name in ((PENDING, DROPPED, output.DROPPED), (UNKNOWN, UNACCOUNTED, output.UNACCOUNTED)):
        due = (known.status == waiting) & (deadline < watermark_ns)
        out.add(name, known.sent_ns[due & ~known.errored])
        status[due] = np.where(known.errored[due], ERRORED, verdict).astype(np.int8)
    return dataclasses.replace(known, status=status)


def named_until(named_ns: int, watermark_ns: int, judged_ns: int, cfg: EngineConfig) -> int:
    """Drops of sends before this are final (``name_drops``): every agent has written past their deadline."""
    return max(named_ns, min(watermark_ns, judged_ns) - cfg.drop_timeout_ns)


def name_drops(known: Known, named_ns: int, watermark_ns: int, judged_ns: int, cfg: EngineConfig) -> pd.DataFrame:
    """The drop exemplars to name: only final drops, once every agent has written past the deadline, no receive or
    error ack can withdraw them (the watermark alone can run ahead: one partition seconds before another). Drops
    turn final in the order of their sends, so the first of each batch's final ones are the first of the window.
    The sends named are those before ``named_until``."""
    until = named_until(named_ns, watermark_ns, judged_ns, cfg)
    if until <= named_ns:
        return pd.DataFrame()
    sent_ns = known.sent_ns
    final = ((known.status == DROPPED) | (known.status == LATE)) & (sent_ns >= named_ns) & (sent_ns < until)
    return partials.first_dropped(sent_ns[final], known.frame, np.flatnonzero(final), cfg.window_ns)


def forget(known: Known, watermark_ns: int, cfg: EngineConfig) -> Known:
    """Decided IDs are kept ``retention`` past their deadline (for duplicates and late receives), then forgotten."""
    gone = ((known.status != PENDING) & (known.status != UNKNOWN)
            & (known.sent_ns + cfg.drop_timeout_ns + cfg.retention_ns < watermark_ns))
    if not gone.any():
        return known
    return Known.of(_without(known.frame_out(), gone), known.lookup.kept(~gone))


def _without(frame: pd.DataFrame, gone: np.ndarray) -> pd.DataFrame:
    """``frame`` without the ``gone`` rows. They are nearly always its first rows (IDs are forgotten in the order of
    their sends, which is the table's order with one sender): then a slice, which copies nothing."""
    first_kept = int(np.argmin(gone)) if not gone.all() else len(gone)
    if not gone[first_kept:].any():
        return frame.iloc[first_kept:]
    return frame[~gone]
