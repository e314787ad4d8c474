"""The engine's rules, one function each, applied in order to one micro-batch's working set (``Work``).

``engine.process`` builds the working set from the state and the batch, calls the rules in the order below and
turns the result into the new state and the batch's partials. Each rule reads what the rules before it left and
writes counts (names: ``core.output``), exemplars and events; none does I/O or reads a clock.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from core import contract, output
from streaming import gaps as gap_tracking
from streaming import partials
from streaming.state import NO_TIME_NS, EngineConfig, EngineState

PENDING, RECEIVED, LATE, DROPPED, ERRORED, UNKNOWN, UNACCOUNTED = 0, 1, 2, 3, 4, 5, 6
"""Status of a known event ID: waiting; delivered in time; delivered after its deadline;
declared dropped; failed at the sender (an error ack) and never delivered in time; waiting when the telemetry broker
lost its data (its receive record may have gone with it); past its deadline so (not a drop: ``unaccounted``)."""

EVENT_KINDS = ("node", "oom", "restart", "clock", "lost", "run_start", "run_stop")
"""Record kinds passed through to the events table as they are."""

EVENT_COLUMNS = ("kind", "agent", "at_ns", "node", "metric", "value", "missing", "source", "where", "count", "config",
                 "reason", "reference", "offset_us", "rtt_us", "event_id", "victim")

KEY = "event_key"
"""A column of a join partition's records holding each event ID's hash (``streaming.join.split``), when present."""


def id_hash(event_ids: np.ndarray) -> np.ndarray:
    """64-bit key of each event ID string (deterministic across processes and runs)."""
    if len(event_ids) == 0:
        return np.array([], dtype=np.uint64)
    return pd.util.hash_array(np.asarray(event_ids, dtype=object), categorize=False)


def _column(df: pd.DataFrame, name: str) -> np.ndarray:
    return df[name].to_numpy()


@dataclass
class Work:
    """One batch's working set: the state before it, the batch's records, and what the rules have decided so far."""
    cfg: EngineConfig
    state: EngineState
    good: pa.Table                 # this run's valid records
    shared: pa.Table               # records about the machines and the telemetry (for every run)
    kinds: np.ndarray              # ``good``'s kinds
    out: partials.Collector
    info: dict
    max_event_ns: int = NO_TIME_NS
    watermark_ns: int = NO_TIME_NS
    judged_ns: int = NO_TIME_NS
    gaps: gap_tracking.GapTracker | None = None
    known: pd.DataFrame | None = None
    sent_ns: np.ndarray | None = None    # ``known``'s columns, as arrays the rules update
    status: np.ndarray | None = None
    errored: np.ndarray | None = None
    recv_ns: np.ndarray | None = None
    sends: pd.DataFrame | None = None    # this batch's new sends
    fresh_recv_ns: np.ndarray = field(default_factory=lambda: np.array([], np.int64))
    orphans: pd.DataFrame | None = None
    exemplars: list = field(default_factory=list)
    events: pd.DataFrame | None = None
    reset_event: dict | None = None
    declared: list = field(default_factory=list)  # gaps judged by this batch: (start_ns, duration_ns, in_flight)

    def rows(self, kind: str, cols: list[str]) -> pd.DataFrame:
        """This run's records of one kind (``event_id`` hashed, or its hash taken from ``KEY``; the ID itself in
        ``id``)."""
        keyed = "event_id" in cols and KEY in self.good.column_names
        sel = self.good.filter(pa.array(self.kinds == kind)).select(cols + [KEY] if keyed else cols)
        df = pd.DataFrame({c: sel[c].to_numpy(zero_copy_only=False) for c in cols})
        if "event_id" in df:
            df["id"] = df["event_id"]  # the ID itself, for exemplars
            df["event_id"] = sel[KEY].to_numpy() if keyed else id_hash(df["event_id"].to_numpy())
        return df

    def of_kinds(self, *kinds: str) -> pa.Array:
        """``at_ns`` of this run's records of these kinds."""
        return self.good.filter(pa.array(np.isin(self.kinds, kinds)))["at_ns"] if self.good.num_rows else pa.array([], pa.int64())


def split(batch: pa.Table, run_id: str) -> tuple[pa.Table, pa.Table, pa.Table, dict]:
    """(quarantined, this run's, shared, info): records of other runs are counted and left out."""
    bad = batch.filter(batch["quarantine_reason"].is_valid())
    good = batch.filter(batch["quarantine_reason"].is_null())
    mine = pc.fill_null(pc.equal(good["run_id"], run_id), False)
    is_shared = pc.fill_null(pc.and_(pc.equal(good["run_id"], contract.ANY_RUN),
                                     pc.is_in(good["kind"], pa.array(list(contract.SHARED_KINDS)))), False)
    num_other_run = good.num_rows - pc.sum(pc.or_(mine, is_shared)).as_py() if good.num_rows else 0
    info = {"num_records": batch.num_rows, "num_quarantined": bad.num_rows, "num_other_run": int(num_other_run or 0)}
    return bad, good.filter(mine), good.filter(is_shared), info


def start(state: EngineState, batch: pa.Table, cfg: EngineConfig) -> tuple[pa.Table, Work]:
    """(quarantined records, the batch's working set before any rule): ``split``, and this run's records by kind."""
    bad, good, shared, info = split(batch, cfg.run_id)
    kinds = good["kind"].to_numpy(zero_copy_only=False) if good.num_rows else np.array([], dtype=object)
    for k in ("send", "recv", "ack", "heartbeat") + EVENT_KINDS:
        info[f"num_{k}"] = int((kinds == k).sum())
    return bad, Work(cfg, state, good, shared, kinds, partials.Collector(cfg.window_ns), info)


def advance_watermark(w: Work) -> None:
    """The newest event time seen, and the watermark ``watermark_delay`` behind it (never back)."""
    w.max_event_ns = w.state.max_event_ns
    if w.good.num_rows:
        w.max_event_ns = max(w.max_event_ns, pc.max(w.good["at_ns"]).as_py())
    w.watermark_ns = (max(w.state.watermark_ns, w.max_event_ns - w.cfg.watermark_delay_ns)
                      if w.max_event_ns != NO_TIME_NS else w.state.watermark_ns)


def judge(w: Work) -> None:
    """Up to when no agent can still contradict a stamp (``streaming.gaps``): for gaps, and for naming drops."""
    s = w.state
    w.gaps = dataclasses.replace(s.gaps, recent=list(s.gaps.recent), progress=dict(s.gaps.progress), stopped=list(s.gaps.stopped))
    if w.good.num_rows:
        w.gaps.note(w.good, np.isin(w.kinds, ("send", "ack", "recv")), w.kinds == "run_stop")
    stops = w.of_kinds("run_stop")
    stop_known = max([x for x in (s.stop_ns, pc.max(stops).as_py() if len(stops) else None) if x is not None], default=None)
    w.judged_ns = w.gaps.judged_until(stop_known is not None and w.watermark_ns >= stop_known + w.cfg.drop_timeout_ns)


def take_sends(w: Work) -> None:
    """New IDs become pending (unknown when sent inside a telemetry hole); a re-sent send record (agent retry) is
    not counted twice. Counts ``sent`` and the send delay, by send window."""
    known = w.state.known
    sends = w.rows("send", ["event_id", "at_ns", "intended_at_ns"]).sort_values(["at_ns", "event_id"], kind="stable")
    repeat = sends["event_id"].duplicated().to_numpy() | (known.index.get_indexer(_column(sends, "event_id")) >= 0)
    if repeat.any():
        w.out.add(output.REPEATED_SEND_RECORDS, _column(sends[repeat], "at_ns"))
        sends = sends[~repeat]
    at = _column(sends, "at_ns")
    w.out.add(output.SENT, at)
    w.out.record(output.SEND_DELAY, at, (at - _column(sends, "intended_at_ns")) // 1000, output.NEGATIVE_SEND_DELAY)
    if len(sends):
        in_hole = at < w.state.hole_until_ns
        new = pd.DataFrame(
            {"sent_ns": at, "intended_ns": _column(sends, "intended_at_ns"),
             "errored": False, "recv_ns": np.int64(-1), "status": np.where(in_hole, UNKNOWN, PENDING).astype(np.int8),
             "id": _column(sends, "id")},
            index=pd.Index(_column(sends, "event_id"), dtype=np.uint64, name="event_id"),
        )
        known = pd.concat([known, new]) if len(known) else new
    w.known, w.sends = known, sends
    w.sent_ns = _column(known, "sent_ns")
    w.status = _column(known, "status").copy()
    w.errored = _column(known, "errored").copy()
    w.recv_ns = _column(known, "recv_ns").copy()


def take_acks(w: Work) -> None:
    """Failures by cause (``core.contract.failures``), charged to the send window; a failed send is not a drop, so a
    drop already declared for it is withdrawn (and unnamed)."""
    acks = w.rows("ack", ["event_id", "sent_at_ns", "status", "error"])
    if not len(acks):
        return
    st = acks["status"].to_numpy(dtype=np.float64, na_value=np.nan)
    err = acks["error"].to_numpy(dtype=object)
    failed = contract.failures(st, err)
    sent_at = _column(acks, "sent_at_ns")
    w.out.add(output.ACKED, sent_at[~failed])
    if not failed.any():
        return
    causes = np.where(pd.notna(err[failed]), err[failed], np.char.add("http_", np.nan_to_num(st[failed]).astype(np.int64).astype(str)).astype(object))
    w.out.add_names(np.char.add(output.ERRORS_BY_CAUSE, causes.astype(str)).astype(object), sent_at[failed])
    w.out.add(output.ERRORS, sent_at[failed])
    pos = w.known.index.get_indexer(_column(acks, "event_id")[failed])
    pos = np.unique(pos[pos >= 0])
    undo = pos[w.status[pos] == DROPPED]
    w.out.add(output.DROPPED, w.sent_ns[undo], -1)
    _unname(w, undo)
    w.status[undo] = ERRORED
    w.errored[pos] = True


def _unname(w: Work, pos: np.ndarray) -> None:
    """Withdraw the drop exemplars of these known IDs, if they were named already."""
    named = pos[w.sent_ns[pos] < w.state.drops_named_ns]
    if len(named):
        w.exemplars.append(pd.DataFrame({"kind": "dropped_id", "at_ns": w.sent_ns[named], "count": -1,
                                         "event_id": partials.ids(w.known, named)}))


def take_receives(w: Work) -> None:
    """With the earlier orphans: the first delivery of an ID decides (in time: received, latency; after its
    deadline: late, and a drop unless it failed); later ones are duplicates. An identical record (same event, same
    receive time) is an agent re-sending its telemetry after a restart, not a second delivery."""
    new_recv = w.rows("recv", ["event_id", "at_ns"]).assign(new=True)
    orphans = w.state.orphans
    recv = pd.concat([orphans.assign(new=False), new_recv], ignore_index=True) if len(orphans) else new_recv
    recv = recv.sort_values(["at_ns", "event_id"], kind="stable")
    repeat = recv.duplicated(["event_id", "at_ns"]).to_numpy()
    if repeat.any():
        w.out.add(output.REPEATED_RECEIVE_RECORDS, _column(recv, "at_ns")[repeat])
        recv = recv[~repeat]
    rid, rat = _column(recv, "event_id"), _column(recv, "at_ns").astype(np.int64)
    pos = w.known.index.get_indexer(rid)
    found = pos >= 0
    first = ~recv["event_id"].duplicated().to_numpy()
    prior = np.full(pos.shape, -1, dtype=np.int64)
    prior[found] = w.status[pos[found]]
    delivered_before = (prior == RECEIVED) | (prior == LATE)
    same_as_first = np.zeros(pos.shape, dtype=bool)
    same_as_first[found] = w.recv_ns[pos[found]] == rat[found]
    resent = found & delivered_before & same_as_first
    w.out.add(output.REPEATED_RECEIVE_RECORDS, rat[resent])
    w.fresh_recv_ns = rat[recv["new"].to_numpy(dtype=bool) & ~resent]  # every receive, once: the silences between them
    decide = found & first & ~delivered_before
    w.out.add(output.DUPLICATES, rat[found & ~decide & ~(delivered_before & same_as_first)])
    p, at, sent_ns = pos[decide], rat[decide], w.sent_ns
    in_time = at - sent_ns[p] <= w.cfg.drop_timeout_ns
    delta = (~in_time & ~w.errored[p]).astype(np.int64) - (w.status[p] == DROPPED).astype(np.int64)
    w.out.add(output.DROPPED, sent_ns[p][delta != 0], delta[delta != 0])
    w.out.add(output.UNACCOUNTED, sent_ns[p][w.status[p] == UNACCOUNTED], -1)  # its fate is known after all
    _unname(w, p[delta < 0])  # named already (an agent out of order)
    ok_p, ok_at = p[in_time], at[in_time]
    w.out.add(output.RECEIVED, ok_at)
    latency_us = (ok_at - sent_ns[ok_p]) // 1000
    w.out.record(output.LATENCY, ok_at, latency_us, output.CLOCK_SKEW)
    w.out.record(output.LATENCY_INTENDED, ok_at, (ok_at - _column(w.known, "intended_ns")[ok_p]) // 1000)
    w.out.add(output.max_of(output.LATENCY), ok_at, latency_us)
    w.exemplars.append(partials.slowest(ok_at, ok_at - sent_ns[ok_p], recv["id"].to_numpy(object)[decide][in_time],
                                        w.cfg.window_ns))
    w.out.add(output.LATE, at[~in_time])
    w.status[p] = np.where(in_time, RECEIVED, LATE).astype(np.int8)
    w.recv_ns[p] = at
    w.orphans = recv[~found][["event_id", "at_ns", "id"]]


def expire_orphans(w: Work) -> None:
    """Receives of IDs not seen (yet) as sent wait for their send; given up after deadline + retention."""
    expired = _column(w.orphans, "at_ns") + w.cfg.drop_timeout_ns + w.cfg.retention_ns < w.watermark_ns
    w.out.add(output.ORPHAN_RECEIVES, _column(w.orphans, "at_ns")[expired])
    w.orphans = w.orphans[~expired].reset_index(drop=True)


def mark_reset(w: Work) -> int:
    """The telemetry broker lost its data (the source's ``reset`` record): a send still waiting may have had its
    receive record in what was lost, so it is not a drop if none comes (``unaccounted``). ``hole_until`` finds the
    hole, ``mark_unknown`` marks the waiting sends, ``incomplete_windows`` flags the windows. Returns the new
    ``hole_until_ns``."""
    hole_until_ns = hole_until(w)
    if reset_record(w) is not None:
        waiting = waiting_before(w)
        mark_unknown(w, hole_until_ns)
        incomplete_windows(w, waiting)
    return hole_until_ns


def waiting_before(w: Work) -> tuple[int, int, int]:
    """(how many sends read before this batch still wait, the earliest of them, the earliest known send), 0 and
    ``NO_TIME_NS`` when none: what ``incomplete_windows`` needs of a join partition."""
    waiting = (w.status == PENDING) & (np.arange(len(w.status)) < len(w.state.known))  # sends read before the batch
    return (int(waiting.sum()), int(w.sent_ns[waiting].min()) if waiting.any() else NO_TIME_NS,
            int(w.sent_ns.min()) if len(w.sent_ns) else NO_TIME_NS)


def reset_record(w: Work) -> dict | None:
    """The batch's telemetry reset record, if it holds one that touches the run."""
    resets = w.shared.filter(pc.equal(w.shared["kind"], "reset")).to_pylist() if w.shared.num_rows else []
    return resets[-1] if resets and w.state.max_event_ns != NO_TIME_NS else None  # before the run: touches nothing


def _hole_ns(w: Work) -> int:
    """In event time the hole lies after what the job had read and before the new log's first records."""
    alive = w.of_kinds("send", "ack", "recv")
    return max(w.state.max_event_ns, pc.min(alive).as_py() if len(alive) else w.state.max_event_ns)


def hole_until(w: Work) -> int:
    """The new ``hole_until_ns``: after a reset, the end of the hole's next window (an agent re-sending what it
    buffered may go back further); else as it was."""
    if reset_record(w) is None:
        return w.state.hole_until_ns
    hole_ns = _hole_ns(w)
    return hole_ns - hole_ns % w.cfg.window_ns + 2 * w.cfg.window_ns


def incomplete_windows(w: Work, waiting: tuple[int, int, int]) -> None:
    """After a reset, the windows it leaves incomplete (``waiting``: ``waiting_before`` summed over the join
    partitions): from the watermark, or the earliest waiting send, to the end of the hole's next window; and the
    reset's event."""
    r = reset_record(w)
    if r is None:
        return
    s, cfg = w.state, w.cfg
    num_waiting, first_waiting_ns, first_sent_ns = waiting
    hole_ns = _hole_ns(w)
    since = min(s.watermark_ns, first_waiting_ns) if num_waiting else s.watermark_ns
    since = max(since, first_sent_ns) if first_sent_ns != NO_TIME_NS else since  # not before the run's first send
    first_window = since - since % cfg.window_ns
    w.out.add(output.TELEMETRY_INCOMPLETE, np.arange(first_window, hole_until(w), cfg.window_ns, dtype=np.int64))
    w.reset_event = {"kind": "reset", "agent": "job", "at_ns": int(hole_ns), "where": r["where"], "reason": r["reason"],
                     "count": r["count"], "value": float(r["at_ns"])}  # value: when the source found out (wall ns)
    w.info["reset"] = {"at_ns": int(r["at_ns"]), "reason": r["reason"], "lost": r["count"],
                       "waiting": num_waiting, "incomplete_from_ns": int(first_window)}


def mark_unknown(w: Work, hole_until_ns: int) -> None:
    """After a reset: the waiting sends (all sent before the hole) and those of the hole's windows read with the new
    log's first batch are unknown, not pending."""
    w.status[(w.status == PENDING) & (w.sent_ns < hole_until_ns)] = UNKNOWN


def declare_drops(w: Work) -> None:
    """Pending sends whose deadline the watermark has passed are dropped (errored ones are not drops); those a
    telemetry reset left unknown are unaccounted."""
    deadline = w.sent_ns + w.cfg.drop_timeout_ns
    for waiting, verdict, name in ((PENDING, DROPPED, output.DROPPED), (UNKNOWN, UNACCOUNTED, output.UNACCOUNTED)):
        due = (w.status == waiting) & (deadline < w.watermark_ns)
        w.out.add(name, w.sent_ns[due & ~w.errored])
        w.status[due] = np.where(w.errored[due], ERRORED, verdict).astype(np.int8)


def named_until(named_ns: int, watermark_ns: int, judged_ns: int, cfg: EngineConfig) -> int:
    """Drops of sends before this are final (``name_drops``): every agent has written past their deadline."""
    return max(named_ns, min(watermark_ns, judged_ns) - cfg.drop_timeout_ns)


def name_drops(w: Work) -> int:
    """Drop exemplars name only final drops: once every agent has written past the deadline, no receive or error
    ack can withdraw them (the watermark alone can run ahead: one partition seconds before another). Drops turn
    final in the order of their sends, so the first of each batch's final ones are the first of the window.
    Returns the new ``drops_named_ns``."""
    named_ns = w.state.drops_named_ns
    until = named_until(named_ns, w.watermark_ns, w.judged_ns, w.cfg)
    if until <= named_ns:
        return named_ns
    final = ((w.status == DROPPED) | (w.status == LATE)) & (w.sent_ns >= named_ns) & (w.sent_ns < until)
    w.exemplars.append(partials.first_dropped(w.sent_ns[final], w.known, np.flatnonzero(final), w.cfg.window_ns))
    return until


def forget(w: Work) -> None:
    """Decided IDs are kept ``retention`` past their deadline (for duplicates and late receives), then forgotten."""
    w.known = w.known.assign(status=w.status, errored=w.errored, recv_ns=w.recv_ns)
    gone = (w.status != PENDING) & (w.status != UNKNOWN) & (w.sent_ns + w.cfg.drop_timeout_ns + w.cfg.retention_ns < w.watermark_ns)
    if gone.any():
        w.known = w.known[~gone]


def shards_of(config_text: str) -> int:
    """How many load-generator shards a run start record announces (1 unless ``shards`` says more)."""
    try:
        n = json.loads(config_text).get("shards", 1)
        return max(int(n), 1)
    except (ValueError, TypeError, AttributeError):
        return 1


def run_span(w: Work) -> dict:
    """Run start and stop records pass through as events; the run spans its first start to its last stop over all
    shards. A load generator killed without its stop record: once it has been silent for the silence timeout (the
    job's heartbeats move the watermark on), the run is closed as aborted at its last record. Returns the run's
    new start_ns, stop_ns, shards, stopped, last_sender_ns and aborted."""
    s, cfg = w.state, w.cfg
    w.events = w.good.filter(pa.array(np.isin(w.kinds, EVENT_KINDS))).select(list(EVENT_COLUMNS)).to_pandas()
    ev = w.events
    start_ns, stop_ns = s.start_ns, s.stop_ns
    starts, stops = ev.loc[ev["kind"] == "run_start", "at_ns"], ev.loc[ev["kind"] == "run_stop", "at_ns"]
    if len(starts):
        start_ns = int(min(starts.min(), start_ns if start_ns is not None else starts.min()))
    if len(stops):
        stop_ns = int(max(stops.max(), stop_ns if stop_ns is not None else stops.max()))
    shards, stopped = s.shards, s.stopped
    for text in ev.loc[ev["kind"] == "run_start", "config"].dropna():
        shards = max(shards, shards_of(text))
    if len(stops):
        stopped = sorted(set(stopped) | set(ev.loc[ev["kind"] == "run_stop", "agent"].astype(str)))
    alive = w.of_kinds("send", "ack", "run_start", "run_stop")
    last_sender_ns = max(s.last_sender_ns, pc.max(alive).as_py() if len(alive) else NO_TIME_NS)
    aborted = s.aborted
    if (aborted is None and start_ns is not None and len(stopped) < shards and last_sender_ns != NO_TIME_NS
            and w.watermark_ns >= last_sender_ns + cfg.silence_timeout_ns):
        aborted = (f"aborted: no record from {shards - len(stopped)} of {shards} load generator(s) for "
                   f"{cfg.silence_timeout_ns / 1e9:g} s (killed?); closed by the job at their last record")
        stop_ns = max(stop_ns if stop_ns is not None else last_sender_ns, last_sender_ns)
        stopped = sorted(set(stopped) | {"job"})
        shards = len(stopped)
        w.events = pd.concat([ev, pd.DataFrame([{"kind": "run_stop", "agent": "job", "at_ns": stop_ns, "reason": aborted}])],
                             ignore_index=True)
    return {"start_ns": start_ns, "stop_ns": stop_ns, "shards": shards, "stopped": stopped,
            "last_sender_ns": int(last_sender_ns), "aborted": aborted}


def declare_gaps(w: Work, stop_ns: int | None) -> None:
    """Receive silences while events are in flight, judged once no agent can still write inside them
    (``streaming.gaps``): the silence per window and one ``gap`` event each."""
    w.declared = w.gaps.advance(_column(w.sends, "at_ns"), w.fresh_recv_ns, w.judged_ns, stop_ns)
    w.gaps.forget(w.watermark_ns - w.cfg.retention_ns)
    if w.declared:
        w.out.add(output.SILENCE_NS, *gap_tracking.silence_by_window(w.declared, w.cfg.window_ns))


def gather_events(w: Work, start_ns: int | None, stop_ns: int | None) -> pd.DataFrame:
    """The batch's events: run records, exemplars, gaps, the reset (at its place in event time: the source stamped
    it with its own clock) and the records about the machines within the run's span, once it is known (they never
    move the watermark: an agent's clock is not the run's event time); each with its window."""
    parts = [w.events, *[e.assign(agent="job") for e in w.exemplars if len(e)]]
    if w.declared:  # also in a batch with no exemplar (the one that let a gap be judged may hold only sends)
        parts.append(pd.DataFrame([{"kind": "gap", "agent": "job", "at_ns": a, "count": d, "value": float(n),
                                    "source": "receive silence"} for a, d, n in w.declared]))
    if w.reset_event is not None:
        parts.append(pd.DataFrame([w.reset_event]))
    shared, cfg = w.shared, w.cfg
    if shared.num_rows and start_ns is not None:
        at = shared["at_ns"].to_numpy()
        span = (at >= start_ns - cfg.window_ns) & (at <= (stop_ns if stop_ns is not None else at.max()) + cfg.drop_timeout_ns)
        span &= shared["kind"].to_numpy(zero_copy_only=False) != "reset"  # placed above
        if span.any():
            parts.append(shared.filter(pa.array(span)).select(list(EVENT_COLUMNS)).to_pandas())
    events = pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]
    events["window_ns"] = w.out.window(events["at_ns"].to_numpy()) if len(events) else pd.Series(dtype=np.int64)
    return events
