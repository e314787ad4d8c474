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

The rules themselves, one function each, are the driver's (``streaming.run_rules``) and the join partitions'
(``streaming.rules``); ``plan``, ``join.step`` and ``finish`` show their flow.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa

from streaming import clocks, join, partials, rules, run_rules
from streaming.state import NO_TIME_NS, EngineConfig, EngineState  # noqa: F401 - read as engine.EngineConfig, engine.EngineState


@dataclass
class BatchResult:
    counts: pd.DataFrame       # window_ns, name, value
    hists: pd.DataFrame        # window_ns, hist, bucket, count
    events: pd.DataFrame       # EVENT_COLUMNS + window_ns
    quarantine: pa.Table       # decoded rows set aside, with their reason and raw text
    info: dict                 # per-batch bookkeeping (records by kind, state sizes, ...)
    finished: bool

    def work(self) -> tuple:
        """What the batch did for its run, as its progress line is said on (``core.logs.Progress``): a job left
        live with no run under way reads only machine records, and says its line every 10 minutes, not every batch."""
        i = self.info
        return i["num_send"], i["num_recv"], i["num_pending"], i["num_quarantined"], self.finished


def process(state: EngineState, batch: pa.Table, cfg: EngineConfig) -> tuple[EngineState, BatchResult]:
    """Consume one decoded batch (``streaming.decode.DECODED_SCHEMA``); return new state and partials.

    The driver's view of the batch (``join.summarize``) decides the run-level verdicts (``plan``); this run's sends,
    acks and receives are joined in their ID's partition with them (``join.step``); the gaps, the events and the
    batch's partials follow (``finish``)."""
    summary, data = join.summarize(corrected(state, batch, cfg), cfg.run_id)
    plan_ = plan(state, summary, cfg)
    joins = join.repartition(state.joins, cfg.join_partitions)
    steps = [join.step(j, records, cfg, plan_.verdicts) for j, records in zip(joins, join.split(data, cfg.join_partitions))]
    return finish(plan_, [s for s, _ in steps], [r for _, r in steps])


def corrected(state: EngineState, records: pa.Table, cfg: EngineConfig) -> pa.Table:
    """``records`` with their stamps on the clock reference's time (``streaming.clocks``), by the agents' estimates
    known so far and those among them; a row corrected already (archived) as it was."""
    return clocks.correct(records, clocks.learn(state.clocks, records), cfg.clock_correction)


@dataclass
class Plan:
    """The driver's part of a batch before the join partitions run: what it read and decided, and the verdicts
    every partition applies."""
    state: EngineState
    cfg: EngineConfig
    records: rules.Records      # the batch's records but this run's sends, acks and receives (``join.summarize``)
    quarantine: pa.Table
    info: dict
    max_event_ns: int
    gaps: object                # ``streaming.gaps.GapTracker`` with the batch's progress noted
    reset: dict | None          # the batch's telemetry reset record (``run_rules.reset_record``)
    verdicts: join.Verdicts
    hole: dict                  # the hole's new ``hole_waiting`` and ``hole_latest_ns`` (``run_rules.hole_until``)


def plan(state: EngineState, summary: pa.Table, cfg: EngineConfig) -> Plan:
    """The run-level rules before the partitions: the watermark, how far every agent has written, a reset's hole."""
    bad, records, info = run_rules.start(summary, cfg)
    stamps = summary.filter(summary[join.NUM_RECORDS].is_valid())  # this run's sends, acks and receives, counted
    by_kind = stamps.group_by("kind").aggregate([(join.NUM_RECORDS, "sum")])
    counts = dict(zip(by_kind["kind"].to_pylist(), by_kind[f"{join.NUM_RECORDS}_sum"].to_pylist()))
    info["num_records"] = summary.num_rows - stamps.num_rows + sum(counts.values())
    for k in join.DATA_KINDS:
        info[f"num_{k}"] = int(counts.get(k, 0))
    max_event_ns, watermark_ns = run_rules.watermark(state, records, cfg)
    gaps, judged_ns = run_rules.judge(state, records, watermark_ns, cfg)
    reset = run_rules.reset_record(state, records)
    until, hole_waiting, hole_latest_ns = run_rules.hole_until(state, records, reset, cfg)
    v = join.Verdicts(int(state.hole_until_ns), int(state.drops_named_ns), watermark_ns, judged_ns, until,
                      reset is not None, clocks.learn(state.clocks, summary))
    return Plan(state, cfg, records, bad, info, max_event_ns, gaps, reset, v,
                {"hole_waiting": hole_waiting, "hole_latest_ns": hole_latest_ns})


def finish(p: Plan, settled: list[join.Settled], reports: list[join.Report]) -> tuple[EngineState, BatchResult]:
    """The run-level rules after the partitions: a reset's incomplete windows (and those its hole grows over), the
    run's span, the gaps, the events; the partitions' partials merged with the driver's."""
    v, state, cfg, info = p.verdicts, p.state, p.cfg, p.info
    out = partials.Collector(cfg.window_ns)
    reset_event = None
    if p.reset is not None:
        reset_event, info["reset"] = run_rules.incomplete_windows(state, p.records, p.reset, v.hole_until_ns,
                                                                  summed_waiting([r.waiting for r in reports]), cfg, out)
    elif v.hole_until_ns > v.hole_until_before_ns:  # the hole reaches further: its windows are incomplete too
        run_rules.more_incomplete_windows(v.hole_until_before_ns, v.hole_until_ns, cfg, out)
    run, run_events = run_rules.run_span(state, p.records, v.watermark_ns, cfg)
    sends_ns = np.concatenate([np.zeros(0, np.int64)] + [r.new_sends_ns for r in reports])
    recvs_ns = np.concatenate([np.zeros(0, np.int64)] + [r.fresh_recv_ns for r in reports])
    gaps, declared = run_rules.declare_gaps(p.gaps, sends_ns, recvs_ns, v.judged_ns, run["stop_ns"], v.watermark_ns, cfg, out)
    exemplars = []
    for part in settled:
        exemplars += part.exemplars
        out.take(part.counts, part.hists)
    info["num_shared"] = p.records.shared.num_rows
    events, early = run_rules.gather_events(p.records, run_events, exemplars, declared, reset_event, run["start_ns"],
                                            run["stop_ns"], cfg, state.early)
    drops_named_ns = rules.named_until(state.drops_named_ns, v.watermark_ns, v.judged_ns, cfg)
    new_state = EngineState(joins=[part.state for part in settled], max_event_ns=p.max_event_ns,
                            watermark_ns=v.watermark_ns, num_batches=state.num_batches + 1, gaps=gaps,
                            drops_named_ns=int(drops_named_ns), hole_until_ns=v.hole_until_ns, clocks=v.clocks, early=early,
                            **p.hole, **run)
    sizes = {k: sum(part.sizes[k] for part in settled) for k in ("num_known", "num_pending", "num_orphans")}
    # closed once every shard has stopped, the drop timeout has passed its last stop and nothing is pending
    stop_ns = run["stop_ns"]
    stopped = stop_ns is not None and len(run["stopped"]) >= run["shards"]
    finished = stopped and v.watermark_ns >= stop_ns + cfg.drop_timeout_ns and not sizes["num_pending"]
    closing = stopped and not finished  # only the wait is left
    info.update({"watermark_ns": v.watermark_ns, "max_event_ns": p.max_event_ns, "judged_ns": v.judged_ns, **sizes,
                 "closing": closing})
    return new_state, BatchResult(out.counts_frame(), out.hists_frame(), events, p.quarantine, info, finished)


def summed_waiting(parts: list[tuple[int, int, int]]) -> tuple[int, int, int]:
    """``rules.waiting_before`` over all partitions."""
    n = sum(p[0] for p in parts)
    first_waiting = min((p[1] for p in parts if p[0]), default=NO_TIME_NS)
    first_sent = min((p[2] for p in parts if p[2] != NO_TIME_NS), default=NO_TIME_NS)
    return n, first_waiting, first_sent
