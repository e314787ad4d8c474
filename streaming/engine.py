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

The rules themselves, one function each, are in ``streaming.rules``.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pyarrow as pa

from streaming import gaps as gap_tracking
from streaming import partials, rules
from streaming.rules import NO_TIME_NS, PENDING, UNKNOWN, Work


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


@dataclass
class BatchResult:
    counts: pd.DataFrame       # window_ns, name, value
    hists: pd.DataFrame        # window_ns, hist, bucket, count
    events: pd.DataFrame       # EVENT_COLUMNS + window_ns
    quarantine: pa.Table       # decoded rows set aside, with their reason and raw text
    info: dict                 # per-batch bookkeeping (records by kind, state sizes, ...)
    finished: bool


def process(state: EngineState, batch: pa.Table, cfg: EngineConfig) -> tuple[EngineState, BatchResult]:
    """Consume one decoded batch (``streaming.decode.DECODED_SCHEMA``); return new state and partials."""
    bad, good, shared, info = rules.split(batch, cfg.run_id)
    kinds = good["kind"].to_numpy(zero_copy_only=False) if good.num_rows else np.array([], dtype=object)
    for k in ("send", "recv", "ack", "heartbeat") + rules.EVENT_KINDS:
        info[f"num_{k}"] = int((kinds == k).sum())
    w = Work(cfg, state, good, shared, kinds, partials.Collector(cfg.window_ns), info)
    rules.advance_watermark(w)
    rules.judge(w)
    rules.take_sends(w)
    rules.take_acks(w)
    rules.take_receives(w)
    rules.expire_orphans(w)
    hole_until_ns = rules.mark_reset(w)
    rules.declare_drops(w)
    drops_named_ns = rules.name_drops(w)
    rules.forget(w)
    run = rules.run_span(w)
    rules.declare_gaps(w, run["stop_ns"])
    info["num_shared"] = shared.num_rows
    events = rules.gather_events(w, run["start_ns"], run["stop_ns"])
    new_state = EngineState(known=w.known, orphans=w.orphans, max_event_ns=int(w.max_event_ns),
                            watermark_ns=int(w.watermark_ns), num_batches=state.num_batches + 1, gaps=w.gaps,
                            drops_named_ns=int(drops_named_ns), hole_until_ns=int(hole_until_ns), **run)
    waiting = (w.status == PENDING) | (w.status == UNKNOWN)
    # closed once every shard has stopped, the drop timeout has passed its last stop and nothing is pending
    stop_ns = run["stop_ns"]
    finished = (stop_ns is not None and len(run["stopped"]) >= run["shards"] and w.watermark_ns >= stop_ns + cfg.drop_timeout_ns
                and not waiting.any())
    info.update({"watermark_ns": int(w.watermark_ns), "max_event_ns": int(w.max_event_ns), "judged_ns": int(w.judged_ns),
                 "num_known": int(len(w.known)), "num_pending": int(waiting.sum()), "num_orphans": int(len(w.orphans))})
    return new_state, BatchResult(w.out.counts_frame(), w.out.hists_frame(), events, bad, info, finished)
