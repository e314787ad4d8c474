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

from dataclasses import dataclass

import pandas as pd
import pyarrow as pa

from streaming import rules
from streaming.rules import PENDING, UNKNOWN
from streaming.state import EngineConfig, EngineState  # noqa: F401 - read as engine.EngineConfig, engine.EngineState


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
    bad, w = rules.start(state, batch, cfg)
    info = w.info
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
    info["num_shared"] = w.shared.num_rows
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
