"""The per-run join and window arithmetic, pure: (state, decoded batch) -> (state, partial results).

No clock, no I/O. Each call consumes one micro-batch of decoded telemetry and returns
*partial* per-window figures (additive counts, sparse histogram buckets) that readers sum
per window. Classification uses event time only (a receive is in time when
``received - sent <= drop_timeout``), so the final sums do not depend on how records were
cut into batches; the watermark only decides *when* a drop is declared. A decision that
later data contradicts (an in-time receive that arrives after its drop was declared, an
error ack after a drop) is corrected by a negative partial, never by rewriting history.

Event IDs are keyed by a 64-bit hash (SipHash via pandas): with a million IDs in state the
chance of any collision is about 3e-8, and it buys a numeric join an order of magnitude
faster than one on strings. State is one table of known event IDs (pending, delivered, dropped, errored) plus the
receives whose send has not been seen yet (orphans). Delivered/dropped IDs are kept for
``retention_ns`` after their deadline to recognise duplicates and late receives.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from core import contract
from streaming import gaps as gap_tracking
from streaming import partials
from streaming.partials import EXEMPLARS, HISTS, MAX_PREFIX  # noqa: F401 - the engine's output names, read as engine.*

PENDING, RECEIVED, LATE, DROPPED, ERRORED, UNKNOWN, UNACCOUNTED = 0, 1, 2, 3, 4, 5, 6
"""Status of a known event ID: waiting; delivered in time; delivered after its deadline;
declared dropped; failed at the sender (an error ack) and never delivered in time; waiting when the telemetry broker
lost its data (its receive record may have gone with it); past its deadline so (not a drop: ``unaccounted``)."""


EVENT_KINDS = ("node", "oom", "restart", "clock", "lost", "run_start", "run_stop")
"""Record kinds passed through to the events table as they are."""

EVENT_COLUMNS = ("kind", "agent", "at_ns", "node", "metric", "value", "missing", "source", "where", "count", "config",
                 "reason", "reference", "offset_us", "rtt_us", "event_id", "victim")


NO_TIME_NS = gap_tracking.NO_TIME_NS  # -(2**62): no event time yet


@dataclass(frozen=True)
class EngineConfig:
    run_id: str
    window_ns: int = 1_000_000_000
    """Tumbling window length (event time)."""
    drop_timeout_ns: int = 30 * 10**9
    """A send with no receive within this is a drop (vegeta's default request timeout)."""
    watermark_delay_ns: int = 5 * 10**9
    """How far behind the newest event time the job waits before deciding drops."""
    retention_ns: int = 30 * 10**9
    """How long after its deadline an event ID is remembered for duplicates and late receives."""
    silence_timeout_ns: int = 60 * 10**9
    """A started run whose load generator has written nothing (no send, ack, start or stop) for this
    long, while the job's own heartbeats move the watermark on, is closed as aborted (killed)."""


def _empty_known() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "sent_ns": pd.Series(dtype=np.int64),
            "intended_ns": pd.Series(dtype=np.int64),
            "errored": pd.Series(dtype=bool),
            "recv_ns": pd.Series(dtype=np.int64),
            "status": pd.Series(dtype=np.int8),
            "id": pd.Series(dtype=object),
        },
        index=pd.Index([], dtype=np.uint64, name="event_id"),
    )


def _empty_orphans() -> pd.DataFrame:
    return pd.DataFrame({"event_id": pd.Series(dtype=np.uint64), "at_ns": pd.Series(dtype=np.int64),
                         "id": pd.Series(dtype=object)})


def id_hash(event_ids: np.ndarray) -> np.ndarray:
    """64-bit key of each event ID string (deterministic across processes and runs)."""
    if len(event_ids) == 0:
        return np.array([], dtype=np.uint64)
    return pd.util.hash_array(np.asarray(event_ids, dtype=object), categorize=False)


@dataclass
class EngineState:
    known: pd.DataFrame = field(default_factory=_empty_known)
    orphans: pd.DataFrame = field(default_factory=_empty_orphans)
    max_event_ns: int = NO_TIME_NS
    watermark_ns: int = NO_TIME_NS
    start_ns: int | None = None
    stop_ns: int | None = None
    num_batches: int = 0
    shards: int = 1                  # load-generator shards of the run (from its start records)
    stopped: list = field(default_factory=list)   # the senders whose stop record has arrived
    last_sender_ns: int = NO_TIME_NS  # the newest send, ack or start record: the generator's last sign of life
    aborted: str | None = None       # why the job closed the run itself
    gaps: gap_tracking.GapTracker = field(default_factory=gap_tracking.GapTracker)
    drops_named_ns: int = NO_TIME_NS  # drops of events sent before this are final and their exemplars written
    hole_until_ns: int = NO_TIME_NS   # the telemetry broker lost records before this: a send before it that comes
    #                                   only now may have had its receive record in what was lost (``UNKNOWN``)

    def scalars(self) -> dict:
        """Everything but the tables (``known``, ``orphans``, the gap tracker's stamps), as JSON can hold it."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("known", "orphans", "gaps")}
        return dict(out, gaps=self.gaps.scalars())


def _shards_of(config_text: str) -> int:
    """How many load-generator shards a run start record announces (1 unless ``shards`` says more)."""
    try:
        n = json.loads(config_text).get("shards", 1)
        return max(int(n), 1)
    except (ValueError, TypeError, AttributeError):
        return 1


@dataclass
class BatchResult:
    counts: pd.DataFrame       # window_ns, name, value
    hists: pd.DataFrame        # window_ns, hist, bucket, count
    events: pd.DataFrame       # EVENT_COLUMNS + window_ns
    quarantine: pa.Table       # decoded rows set aside, with their reason and raw text
    info: dict                 # per-batch bookkeeping (records by kind, state sizes, ...)
    finished: bool


def _column(df: pd.DataFrame, name: str) -> np.ndarray:
    return df[name].to_numpy()


def process(state: EngineState, batch: pa.Table, cfg: EngineConfig) -> tuple[EngineState, BatchResult]:
    """Consume one decoded batch (``streaming.decode.DECODED_SCHEMA``); return new state and partials."""
    out = partials.Collector(cfg.window_ns)
    exemplars: list[pd.DataFrame] = []   # see EXEMPLARS
    bad = batch.filter(batch["quarantine_reason"].is_valid())
    good = batch.filter(batch["quarantine_reason"].is_null())
    mine = pc.fill_null(pc.equal(good["run_id"], cfg.run_id), False)
    is_shared = pc.fill_null(pc.and_(pc.equal(good["run_id"], contract.ANY_RUN),
                                     pc.is_in(good["kind"], pa.array(list(contract.SHARED_KINDS)))), False)
    num_other_run = good.num_rows - pc.sum(pc.or_(mine, is_shared)).as_py() if good.num_rows else 0
    shared = good.filter(is_shared)
    good = good.filter(mine)
    info = {"num_records": batch.num_rows, "num_quarantined": bad.num_rows, "num_other_run": int(num_other_run or 0)}
    kinds = good["kind"].to_numpy(zero_copy_only=False) if good.num_rows else np.array([], dtype=object)
    for k in ("send", "recv", "ack", "heartbeat") + EVENT_KINDS:
        info[f"num_{k}"] = int((kinds == k).sum())

    known = state.known
    max_event_ns = state.max_event_ns
    if good.num_rows:
        max_event_ns = max(max_event_ns, pc.max(good["at_ns"]).as_py())
    watermark_ns = max(state.watermark_ns, max_event_ns - cfg.watermark_delay_ns) if max_event_ns != NO_TIME_NS else state.watermark_ns

    # Which stamps no agent can still contradict (``streaming.gaps``): for gaps, and for naming drops.
    gap_state = dataclasses.replace(state.gaps, recent=list(state.gaps.recent), progress=dict(state.gaps.progress),
                                    stopped=list(state.gaps.stopped))
    if good.num_rows:
        gap_state.note(good, np.isin(kinds, ("send", "ack", "recv")), kinds == "run_stop")
    batch_stops = good.filter(pa.array(kinds == "run_stop"))["at_ns"] if good.num_rows else None
    stop_known = max([x for x in (state.stop_ns, pc.max(batch_stops).as_py() if batch_stops is not None and len(batch_stops) else None)
                      if x is not None], default=None)
    judged_ns = gap_state.judged_until(stop_known is not None and watermark_ns >= stop_known + cfg.drop_timeout_ns)

    def rows(kind: str, cols: list[str]) -> pd.DataFrame:
        sel = good.filter(pa.array(kinds == kind)).select(cols)
        df = pd.DataFrame({c: sel[c].to_numpy(zero_copy_only=False) for c in cols})
        if "event_id" in df:
            df["id"] = df["event_id"]  # the ID itself, for exemplars
            df["event_id"] = id_hash(df["event_id"].to_numpy())
        return df

    # Sends: new IDs become pending; a re-sent send record (agent retry) is not counted twice.
    sends = rows("send", ["event_id", "at_ns", "intended_at_ns"]).sort_values(["at_ns", "event_id"], kind="stable")
    repeat = sends["event_id"].duplicated().to_numpy() | (known.index.get_indexer(_column(sends, "event_id")) >= 0)
    if repeat.any():
        out.add("repeated_send_records", _column(sends[repeat], "at_ns"))
        sends = sends[~repeat]
    out.add("sent", _column(sends, "at_ns"))
    out.record("send_delay_us", _column(sends, "at_ns"),
               (_column(sends, "at_ns") - _column(sends, "intended_at_ns")) // 1000, "negative_send_delay")
    if len(sends):
        in_hole = _column(sends, "at_ns") < state.hole_until_ns
        new = pd.DataFrame(
            {"sent_ns": _column(sends, "at_ns"), "intended_ns": _column(sends, "intended_at_ns"),
             "errored": False, "recv_ns": np.int64(-1), "status": np.where(in_hole, UNKNOWN, PENDING).astype(np.int8),
             "id": _column(sends, "id")},
            index=pd.Index(_column(sends, "event_id"), dtype=np.uint64, name="event_id"),
        )
        known = pd.concat([known, new]) if len(known) else new
    sent_ns = _column(known, "sent_ns")
    status = _column(known, "status").copy()
    errored = _column(known, "errored").copy()

    # Acks: failures by cause (charged to the send window); a failed send is not a drop.
    acks = rows("ack", ["event_id", "sent_at_ns", "status", "error"])
    if len(acks):
        st = acks["status"].to_numpy(dtype=np.float64, na_value=np.nan)
        err = acks["error"].to_numpy(dtype=object)
        failed = contract.failures(st, err)
        out.add("acked", _column(acks, "sent_at_ns")[~failed])
        if failed.any():
            causes = np.where(pd.notna(err[failed]), err[failed], np.char.add("http_", np.nan_to_num(st[failed]).astype(np.int64).astype(str)).astype(object))
            out.add_names(np.char.add("errors:", causes.astype(str)).astype(object), _column(acks, "sent_at_ns")[failed])
            out.add("errors", _column(acks, "sent_at_ns")[failed])
            pos = known.index.get_indexer(_column(acks, "event_id")[failed])
            pos = np.unique(pos[pos >= 0])
            undo = pos[status[pos] == DROPPED]
            out.add("dropped", sent_ns[undo], -1)
            named = undo[sent_ns[undo] < state.drops_named_ns]  # a drop already named as an exemplar: unname it
            exemplars.append(pd.DataFrame({"kind": "dropped_id", "at_ns": sent_ns[named], "count": -1,
                                           "event_id": partials.ids(known, named)}))
            status[undo] = ERRORED
            errored[pos] = True

    # Receives (with earlier orphans): first delivery per ID decides; the rest are duplicates.
    new_recv = rows("recv", ["event_id", "at_ns"]).assign(new=True)
    recv = pd.concat([state.orphans.assign(new=False), new_recv], ignore_index=True) if len(state.orphans) else new_recv
    recv = recv.sort_values(["at_ns", "event_id"], kind="stable")
    # An identical record (same event, same receive time) is the agent re-sending telemetry
    # after a restart, not a second delivery.
    repeat = recv.duplicated(["event_id", "at_ns"]).to_numpy()
    if repeat.any():
        out.add("repeated_receive_records", _column(recv, "at_ns")[repeat])
        recv = recv[~repeat]
    rid = _column(recv, "event_id")
    rat = _column(recv, "at_ns").astype(np.int64)
    pos = known.index.get_indexer(rid)
    found = pos >= 0
    first = ~recv["event_id"].duplicated().to_numpy()
    prior = np.full(pos.shape, -1, dtype=np.int64)
    prior[found] = status[pos[found]]
    delivered_before = (prior == RECEIVED) | (prior == LATE)
    recv_ns = _column(known, "recv_ns").copy()
    same_as_first = np.zeros(pos.shape, dtype=bool)
    same_as_first[found] = recv_ns[pos[found]] == rat[found]
    resent = found & delivered_before & same_as_first
    out.add("repeated_receive_records", rat[resent])
    fresh_recv_ns = rat[recv["new"].to_numpy(dtype=bool) & ~resent]  # every receive, once: the silences between them
    decide = found & first & ~delivered_before
    dup = found & ~decide & ~(delivered_before & same_as_first)
    out.add("duplicates", rat[dup])
    p = pos[decide]
    at = rat[decide]
    in_time = at - sent_ns[p] <= cfg.drop_timeout_ns
    drop_before = status[p] == DROPPED
    drop_after = ~in_time & ~errored[p]
    delta = drop_after.astype(np.int64) - drop_before.astype(np.int64)
    out.add("dropped", sent_ns[p][delta != 0], delta[delta != 0])
    out.add("unaccounted", sent_ns[p][status[p] == UNACCOUNTED], -1)  # its fate is known after all
    withdrawn = p[(delta < 0) & (sent_ns[p] < state.drops_named_ns)]  # named already (an agent out of order): unname
    if len(withdrawn):
        exemplars.append(pd.DataFrame({"kind": "dropped_id", "at_ns": sent_ns[withdrawn], "count": -1,
                                       "event_id": partials.ids(known, withdrawn)}))
    ok_p, ok_at = p[in_time], at[in_time]
    out.add("received", ok_at)
    latency_us = (ok_at - sent_ns[ok_p]) // 1000
    out.record("latency_us", ok_at, latency_us, "clock_skew")
    out.record("latency_intended_us", ok_at, (ok_at - _column(known, "intended_ns")[ok_p]) // 1000)
    out.add("max:latency_us", ok_at, latency_us)
    exemplars.append(partials.slowest(ok_at, ok_at - sent_ns[ok_p], recv["id"].to_numpy(object)[decide][in_time], cfg.window_ns))
    out.add("late", at[~in_time])
    status[p] = np.where(in_time, RECEIVED, LATE).astype(np.int8)
    recv_ns[p] = at

    # Orphans: receives of IDs not seen (yet) as sent; given up after deadline + retention.
    orphans = recv[~found][["event_id", "at_ns", "id"]]
    expired = _column(orphans, "at_ns") + cfg.drop_timeout_ns + cfg.retention_ns < watermark_ns
    out.add("orphan_receives", _column(orphans, "at_ns")[expired])
    orphans = orphans[~expired].reset_index(drop=True)

    # The telemetry broker lost its data (the source's ``reset`` record): a send still waiting may have had its
    # receive record in what was lost, so it is not a drop if none comes (``unaccounted``); the windows from the
    # watermark (or the earliest such send) to the reset are incomplete.
    # In event time the hole lies after what the job had read (``state.max_event_ns``) and before the new log's
    # first records (an agent re-sending what it buffered may go back further): one window more is flagged.
    resets = shared.filter(pc.equal(shared["kind"], "reset")).to_pylist() if shared.num_rows else []
    reset_event, hole_until_ns = None, state.hole_until_ns
    if resets and state.max_event_ns != NO_TIME_NS:  # a reset before the run's first record touches nothing of it
        r = resets[-1]
        waiting = (status == PENDING) & (np.arange(len(status)) < len(state.known))  # sends read before the reset
        alive = good.filter(pa.array(np.isin(kinds, ("send", "ack", "recv"))))["at_ns"] if good.num_rows else []
        hole_ns = max(state.max_event_ns, pc.min(alive).as_py() if len(alive) else state.max_event_ns)
        since = min(state.watermark_ns, int(sent_ns[waiting].min())) if waiting.any() else state.watermark_ns
        since = max(since, int(sent_ns.min()) if len(sent_ns) else since)  # not before the run's first send
        first_window = since - since % cfg.window_ns
        hole_until_ns = hole_ns - hole_ns % cfg.window_ns + 2 * cfg.window_ns  # the end of the hole's next window
        # the waiting ones (all sent before the hole) and those of the hole's windows read with the new log's first batch
        status[(status == PENDING) & (sent_ns < hole_until_ns)] = UNKNOWN
        out.add("telemetry_incomplete", np.arange(first_window, hole_until_ns, cfg.window_ns, dtype=np.int64))
        reset_event = {"kind": "reset", "agent": "job", "at_ns": int(hole_ns), "where": r["where"], "reason": r["reason"],
                       "count": r["count"], "value": float(r["at_ns"])}  # value: when the source found out (wall ns)
        info["reset"] = {"at_ns": int(r["at_ns"]), "reason": r["reason"], "lost": r["count"],
                         "waiting": int(waiting.sum()), "incomplete_from_ns": int(first_window)}
    # Drops: pending sends whose deadline the watermark has passed (errored ones are not drops).
    deadline = sent_ns + cfg.drop_timeout_ns
    due = (status == PENDING) & (deadline < watermark_ns)
    out.add("dropped", sent_ns[due & ~errored])
    status[due] = np.where(errored[due], ERRORED, DROPPED).astype(np.int8)
    due = (status == UNKNOWN) & (deadline < watermark_ns)
    out.add("unaccounted", sent_ns[due & ~errored])
    status[due] = np.where(errored[due], ERRORED, UNACCOUNTED).astype(np.int8)
    # Drop exemplars name only final drops: once every agent has written past the deadline, no receive or error
    # ack can withdraw them (the watermark alone can run ahead: one partition seconds before another). Drops turn
    # final in the order of their sends, so the first of each batch's final ones are the first of the window.
    drops_named_ns = state.drops_named_ns
    name_until = min(watermark_ns, judged_ns) - cfg.drop_timeout_ns
    if name_until > drops_named_ns:
        final = ((status == DROPPED) | (status == LATE)) & (sent_ns >= drops_named_ns) & (sent_ns < name_until)
        exemplars.append(partials.first_dropped(sent_ns[final], known, np.flatnonzero(final), cfg.window_ns))
        drops_named_ns = name_until

    known = known.assign(status=status, errored=errored, recv_ns=recv_ns)
    forget = (status != PENDING) & (status != UNKNOWN) & (deadline + cfg.retention_ns < watermark_ns)
    if forget.any():
        known = known[~forget]

    # Events passed through: node samples, OOM kills, run start/stop.
    ev_mask = np.isin(kinds, EVENT_KINDS)
    events = good.filter(pa.array(ev_mask)).select(list(EVENT_COLUMNS)).to_pandas()
    start_ns, stop_ns = state.start_ns, state.stop_ns
    starts = events.loc[events["kind"] == "run_start", "at_ns"]
    stops = events.loc[events["kind"] == "run_stop", "at_ns"]
    if len(starts):
        start_ns = int(min(starts.min(), start_ns if start_ns is not None else starts.min()))
    if len(stops):
        stop_ns = int(max(stops.max(), stop_ns if stop_ns is not None else stops.max()))
    shards, stopped = state.shards, state.stopped
    for text in events.loc[events["kind"] == "run_start", "config"].dropna():
        shards = max(shards, _shards_of(text))
    if len(stops):
        stopped = sorted(set(stopped) | set(events.loc[events["kind"] == "run_stop", "agent"].astype(str)))
    # A load generator killed without its stop record: once it has been silent for the silence
    # timeout (the job's heartbeats move the watermark on), close the run as aborted at its last record.
    alive = good.filter(pa.array(np.isin(kinds, ("send", "ack", "run_start", "run_stop"))))["at_ns"] if good.num_rows else None
    last_sender_ns = max(state.last_sender_ns, pc.max(alive).as_py() if alive is not None and len(alive) else NO_TIME_NS)
    aborted = state.aborted
    if (aborted is None and start_ns is not None and len(stopped) < shards and last_sender_ns != NO_TIME_NS
            and watermark_ns >= last_sender_ns + cfg.silence_timeout_ns):
        missing = shards - len(stopped)
        aborted = (f"aborted: no record from {missing} of {shards} load generator(s) for "
                   f"{cfg.silence_timeout_ns / 1e9:g} s (killed?); closed by the job at their last record")
        stop_ns = max(stop_ns if stop_ns is not None else last_sender_ns, last_sender_ns)
        stopped = sorted(set(stopped) | {"job"})
        shards = len(stopped)
        events = pd.concat([events, pd.DataFrame([{"kind": "run_stop", "agent": "job", "at_ns": stop_ns, "reason": aborted}])],
                           ignore_index=True)
    # Gaps: receive silences while events are in flight, judged once no agent can still write inside them.
    declared = gap_state.advance(_column(sends, "at_ns"), fresh_recv_ns, judged_ns, stop_ns)
    gap_state.forget(watermark_ns - cfg.retention_ns)
    if declared:
        out.add("silence_ns", *gap_tracking.silence_by_window(declared, cfg.window_ns))
    exemplars = [e for e in exemplars if len(e)]
    if exemplars:
        events = pd.concat([events, *[e.assign(agent="job") for e in exemplars]], ignore_index=True)
    if declared:  # also in a batch with no exemplar (the one that let a gap be judged may hold only sends)
        events = pd.concat([events, pd.DataFrame([{"kind": "gap", "agent": "job", "at_ns": a, "count": d, "value": float(n),
                                                    "source": "receive silence"} for a, d, n in declared])],
                           ignore_index=True)
    # Records about the machines (for every run): those within the run's span, once it is known.
    # They never move the watermark (an agent's clock is not the run's event time).
    info["num_shared"] = shared.num_rows
    if reset_event is not None:  # at its place in event time (the source stamped it with its own clock)
        events = pd.concat([events, pd.DataFrame([reset_event])], ignore_index=True)
    if shared.num_rows and start_ns is not None:
        at = shared["at_ns"].to_numpy()
        span = (at >= start_ns - cfg.window_ns) & (at <= (stop_ns if stop_ns is not None else at.max()) + cfg.drop_timeout_ns)
        span &= shared["kind"].to_numpy(zero_copy_only=False) != "reset"  # placed above
        if span.any():
            events = pd.concat([events, shared.filter(pa.array(span)).select(list(EVENT_COLUMNS)).to_pandas()],
                               ignore_index=True)
    events["window_ns"] = out.window(events["at_ns"].to_numpy()) if len(events) else pd.Series(dtype=np.int64)

    new_state = EngineState(known=known, orphans=orphans, max_event_ns=int(max_event_ns),
                            watermark_ns=int(watermark_ns), start_ns=start_ns, stop_ns=stop_ns,
                            num_batches=state.num_batches + 1, shards=shards, stopped=stopped,
                            last_sender_ns=int(last_sender_ns), aborted=aborted, gaps=gap_state,
                            drops_named_ns=int(drops_named_ns), hole_until_ns=int(hole_until_ns))
    # closed once every shard has stopped, the drop timeout has passed its last stop and nothing is pending
    finished = (stop_ns is not None and len(stopped) >= shards and watermark_ns >= stop_ns + cfg.drop_timeout_ns
                and not ((status == PENDING) | (status == UNKNOWN)).any())
    info.update({"watermark_ns": int(watermark_ns), "max_event_ns": int(max_event_ns), "judged_ns": int(judged_ns),
                 "num_known": int(len(known)), "num_pending": int(((status == PENDING) | (status == UNKNOWN)).sum()),
                 "num_orphans": int(len(orphans))})
    return new_state, BatchResult(out.counts_frame(), out.hists_frame(), events, bad, info, finished)
