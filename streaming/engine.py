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

import numpy as np
import pandas as pd
import pyarrow as pa

from streaming import join, rules
from streaming.state import NO_TIME_NS, EngineConfig, EngineState  # noqa: F401 - read as engine.EngineConfig, engine.EngineState


@dataclass
class BatchResult:
    counts: pd.DataFrame       # window_ns, name, value
    hists: pd.DataFrame        # window_ns, hist, bucket, count
    events: pd.DataFrame       # EVENT_COLUMNS + window_ns
    quarantine: pa.Table       # decoded rows set aside, with their reason and raw text
    info: dict                 # per-batch bookkeeping (records by kind, state sizes, ...)
    finished: bool


def process(state: EngineState, batch: pa.Table, cfg: EngineConfig) -> tuple[EngineState, BatchResult]:
    """Consume one decoded batch (``streaming.decode.DECODED_SCHEMA``); return new state and partials.

    The batch's sends, acks and receives are joined in their ID's partition (``streaming.join``, step one); the
    run-level rules then see the other records and each partition's first and last stamps; every partition settles
    with the new watermark (step two); the gaps and the events follow."""
    bad, w = rules.start(state, batch, cfg)
    info = w.info
    parts, rest = join.split(w.good, w.kinds, cfg.join_partitions)
    joins = join.repartition(state.joins, cfg.join_partitions)
    taken = [join.take(j, records, cfg, state.hole_until_ns, state.drops_named_ns) for j, records in zip(joins, parts)]
    # the run-level rules: the records that are not a partition's, and what the partitions said of time
    w.good = pa.concat_tables([rest, *(r.stamps for _, r in taken)], promote_options="default")
    w.kinds = w.good["kind"].to_numpy(zero_copy_only=False) if w.good.num_rows else np.array([], dtype=object)
    rules.advance_watermark(w)
    rules.judge(w)
    hole_until_ns = rules.reset_hole(w, _summed_waiting([r.waiting for _, r in taken]))
    verdicts = join.Verdicts(int(w.watermark_ns), int(w.judged_ns), int(hole_until_ns))
    settled = [join.settle(pw, verdicts) for pw, _ in taken]
    drops_named_ns = rules.named_until(state.drops_named_ns, w.watermark_ns, w.judged_ns, cfg)
    run = rules.run_span(w)
    w.sends = pd.DataFrame({"at_ns": np.concatenate([r.new_sends_ns for _, r in taken])})
    w.fresh_recv_ns = np.concatenate([r.fresh_recv_ns for _, r in taken])
    rules.declare_gaps(w, run["stop_ns"])
    for pw, _ in taken:
        w.exemplars += pw.exemplars
        w.out.merge(pw.out)
    info["num_shared"] = w.shared.num_rows
    events = rules.gather_events(w, run["start_ns"], run["stop_ns"])
    new_state = EngineState(joins=[j for j, _ in settled], max_event_ns=int(w.max_event_ns),
                            watermark_ns=int(w.watermark_ns), num_batches=state.num_batches + 1, gaps=w.gaps,
                            drops_named_ns=int(drops_named_ns), hole_until_ns=int(hole_until_ns), **run)
    sizes = {k: sum(n[k] for _, n in settled) for k in ("num_known", "num_pending", "num_orphans")}
    # closed once every shard has stopped, the drop timeout has passed its last stop and nothing is pending
    stop_ns = run["stop_ns"]
    finished = (stop_ns is not None and len(run["stopped"]) >= run["shards"] and w.watermark_ns >= stop_ns + cfg.drop_timeout_ns
                and not sizes["num_pending"])
    info.update({"watermark_ns": int(w.watermark_ns), "max_event_ns": int(w.max_event_ns), "judged_ns": int(w.judged_ns),
                 **sizes})
    return new_state, BatchResult(w.out.counts_frame(), w.out.hists_frame(), events, bad, info, finished)


def _summed_waiting(parts: list[tuple[int, int, int]]) -> tuple[int, int, int]:
    """``rules.waiting_before`` over all partitions."""
    n = sum(p[0] for p in parts)
    first_waiting = min((p[1] for p in parts if p[0]), default=NO_TIME_NS)
    first_sent = min((p[2] for p in parts if p[2] != NO_TIME_NS), default=NO_TIME_NS)
    return n, first_waiting, first_sent
