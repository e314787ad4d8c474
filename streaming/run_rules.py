"""The driver's rules: what is decided of a batch for the whole run, one function each.

``streaming.engine`` applies them and shows the flow: before the join partitions run, ``start`` (the batch's
records), ``watermark``, ``judge`` (how far every agent has written), ``reset_record`` and ``hole_until`` (a
telemetry reset's hole, and how far it reaches); after them, ``incomplete_windows`` (a reset's, or
``more_incomplete_windows`` as the hole grows), ``run_span``, ``declare_gaps`` and
``gather_events``. Like the join's rules (``streaming.rules``) each takes what it reads as arguments and returns
what it decides; counts go to ``out``, the batch's accumulator. None does I/O or reads a clock.
"""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from core import contract, output
from streaming import gaps as gap_tracking
from streaming import membership, partials
from streaming.rules import Records
from streaming.state import NO_TIME_NS, EngineConfig, EngineState

EVENT_KINDS = ("node", "oom", "restart", "clock", "lost", "held", "run_start", "run_stop")
"""Record kinds passed through to the events table as they are."""

EVENT_COLUMNS = ("kind", "agent", "at_ns", "node", "metric", "value", "missing", "source", "where", "count", "config",
                 "reason", "reference", "offset_us", "rtt_us", "event_id", "victim")


def split(batch: pa.Table, run_id: str) -> tuple[pa.Table, pa.Table, pa.Table, dict]:
    """(quarantined, this run's, shared, info): records of other runs are counted and left out
    (``streaming.membership``)."""
    bad, good, shared, num_other_run = membership.split(batch, run_id)
    info = {"num_records": batch.num_rows, "num_quarantined": bad.num_rows, "num_other_run": num_other_run}
    return bad, good, shared, info


def start(batch: pa.Table, cfg: EngineConfig) -> tuple[pa.Table, Records, dict]:
    """(quarantined records, the batch's records, info): ``split``, and this run's records counted by kind."""
    bad, good, shared, info = split(batch, cfg.run_id)
    records = Records.of(good, shared)
    for k in ("send", "recv", "ack", "heartbeat") + EVENT_KINDS:
        info[f"num_{k}"] = int((records.kinds == k).sum())
    return bad, records, info


def watermark(state: EngineState, records: Records, cfg: EngineConfig) -> tuple[int, int]:
    """(the newest event time seen, the watermark ``watermark_delay`` behind it, never back)."""
    max_event_ns = state.max_event_ns
    if records.good.num_rows:
        max_event_ns = max(max_event_ns, pc.max(records.good["at_ns"]).as_py())
    watermark_ns = (max(state.watermark_ns, max_event_ns - cfg.watermark_delay_ns)
                    if max_event_ns != NO_TIME_NS else state.watermark_ns)
    return int(max_event_ns), int(watermark_ns)


def written_through(records: Records) -> np.ndarray:
    """Per record, up to when its agent has written every record it stamped. A receiver writes in order: its stamp.
    A sender holds a send up to ``contract.SEND_HOLD_NS`` for its answer, and before it writes a line at ``t``
    (an ack, a send with its answer) it has written every send stamped before ``t - SEND_HOLD_NS``; a send written
    alone after its hold comes after every send stamped before it."""
    at = records.good["at_ns"].to_numpy()
    answered = records.answered_ns
    return np.where(answered != 0, answered - contract.SEND_HOLD_NS,
                    np.where(records.kinds == "ack", at - contract.SEND_HOLD_NS, at))


def judge(state: EngineState, records: Records, watermark_ns: int, cfg: EngineConfig) -> tuple[gap_tracking.GapTracker, int]:
    """(the gap tracker with the batch's progress noted, up to when no agent can still contradict a stamp):
    for gaps, and for naming drops (``streaming.gaps``)."""
    gaps = state.gaps.copy()
    if records.good.num_rows:
        gaps.note(records.good, np.isin(records.kinds, ("send", "ack", "recv")), records.kinds == "run_stop",
                  written_through(records))
    stops = records.of_kinds("run_stop")
    stop_known = max([x for x in (state.stop_ns, pc.max(stops).as_py() if len(stops) else None) if x is not None], default=None)
    return gaps, int(gaps.judged_until(stop_known is not None and watermark_ns >= stop_known + cfg.drop_timeout_ns))


def reset_record(state: EngineState, records: Records) -> dict | None:
    """The batch's telemetry reset record (the source's: the broker lost its data), if it holds one that touches
    the run."""
    shared = records.shared
    resets = shared.filter(pc.equal(shared["kind"], "reset")).to_pylist() if shared.num_rows else []
    return resets[-1] if resets and state.max_event_ns != NO_TIME_NS else None  # before the run: touches nothing


def _hole_ns(state: EngineState, records: Records) -> int:
    """In event time the hole lies after what the job had read and before the new log's first records."""
    alive = records.of_kinds("send", "ack", "recv")
    return max(state.max_event_ns, pc.min(alive).as_py() if len(alive) else state.max_event_ns)


def _first_data_stamps(records: Records) -> dict[str, int]:
    """When each agent wrote its first send, ack or receive in the batch: at the stamp, but a send with its answer
    when answered, and a send alone when its hold ended (``contract.SEND_HOLD_NS``)."""
    good = records.good
    if not good.num_rows:
        return {}
    at, answered = good["at_ns"].to_numpy(), records.answered_ns
    written = np.where(answered != 0, answered, np.where(records.kinds == "send", at + contract.SEND_HOLD_NS, at))
    data = np.isin(records.kinds, ("send", "ack", "recv"))
    firsts = (pa.table({"agent": good["agent"].filter(pa.array(data)), "at_ns": pa.array(written[data], pa.int64())})
              .group_by("agent").aggregate([("at_ns", "min")]).to_pydict())
    return {str(a): int(t) for a, t in zip(firsts["agent"], firsts["at_ns_min"])}


def hole_until(state: EngineState, records: Records, reset: dict | None, cfg: EngineConfig) -> tuple[int, list, int]:
    """(the new ``hole_until_ns``, the agents the hole still waits on, the latest it may end). A send before
    ``hole_until_ns`` that waits is unknown, not pending (``rules.mark_unknown``): its receive record, or its error
    ack, may have been lost.

    After a reset (``reset_record``) it is the end of the hole's next window at least. The lost records of an agent
    are those it wrote before its first record in the new log (each agent writes in order; ``_first_data_stamps``:
    when it wrote that record), so the hole reaches as far as the latest of those first records: an agent that held
    its records longer than the job's trigger (the load generator's messages, a receiver's spool) lost some written
    after the job's last read. The agents that wrote sends, acks or receives before the reset and have not stopped
    are waited on, batch after batch, until each has written again; none lost a record written after the broker was
    found gone (``reset["at_ns"]``)."""
    until, waiting, latest = state.hole_until_ns, list(state.hole_waiting), state.hole_latest_ns
    if reset is not None:
        hole_ns = _hole_ns(state, records)
        until = hole_ns - hole_ns % cfg.window_ns + 2 * cfg.window_ns
        waiting = sorted(set(state.gaps.progress) - set(state.gaps.stopped))
        latest = int(reset["at_ns"])
    if not waiting and reset is None:
        return until, waiting, latest
    firsts = _first_data_stamps(records)
    heard = [firsts[a] for a in (firsts if reset is not None else waiting) if a in firsts]
    if heard:
        until = max(until, min(max(heard), latest))
    return int(until), [a for a in waiting if a not in firsts], latest


def more_incomplete_windows(before_ns: int, until_ns: int, cfg: EngineConfig, out: partials.Collector) -> None:
    """The hole reaches on from ``before_ns`` to ``until_ns`` (``hole_until``): the windows that start in between are
    incomplete too (those before were counted)."""
    first = -(-before_ns // cfg.window_ns) * cfg.window_ns
    out.add(output.TELEMETRY_INCOMPLETE, np.arange(first, until_ns, cfg.window_ns, dtype=np.int64))


def incomplete_windows(state: EngineState, records: Records, r: dict, hole_until_ns: int, waiting: tuple[int, int, int],
                       cfg: EngineConfig, out: partials.Collector) -> tuple[dict, dict]:
    """After the reset ``r`` (``reset_record``), (its event, what the batch's info says of it), and the windows it
    leaves incomplete counted (``waiting``: ``rules.waiting_before`` summed over the join partitions): from the
    watermark, or the earliest waiting send, to ``hole_until_ns`` (``hole_until``)."""
    num_waiting, first_waiting_ns, first_sent_ns = waiting
    hole_ns = _hole_ns(state, records)
    since = min(state.watermark_ns, first_waiting_ns) if num_waiting else state.watermark_ns
    since = max(since, first_sent_ns) if first_sent_ns != NO_TIME_NS else since  # not before the run's first send
    first_window = since - since % cfg.window_ns
    out.add(output.TELEMETRY_INCOMPLETE, np.arange(first_window, hole_until_ns, cfg.window_ns, dtype=np.int64))
    event = {"kind": "reset", "agent": "job", "at_ns": int(hole_ns), "where": r["where"], "reason": r["reason"],
             "count": r["count"], "value": float(r["at_ns"])}  # value: when the source found out (wall ns)
    info = {"at_ns": int(r["at_ns"]), "reason": r["reason"], "lost": r["count"], "waiting": num_waiting,
            "incomplete_from_ns": int(first_window)}
    return event, info


def shards_of(config_text: str) -> int:
    """How many load-generator shards a run start record announces (1 unless ``shards`` says more)."""
    try:
        n = json.loads(config_text).get("shards", 1)
        return max(int(n), 1)
    except (ValueError, TypeError, AttributeError):
        return 1


def run_span(state: EngineState, records: Records, watermark_ns: int, cfg: EngineConfig) -> tuple[dict, pd.DataFrame]:
    """(the run's new start_ns, stop_ns, shards, stopped, last_sender_ns and aborted; the batch's run records as
    events). Run start and stop records pass through as events; the run spans its first start to its last stop
    over all shards. A load generator killed without its stop record: once it has been silent for the silence
    timeout (the job's heartbeats move the watermark on), the run is closed as aborted at its last record."""
    s = state
    ev = records.good.filter(pa.array(np.isin(records.kinds, EVENT_KINDS))).select(list(EVENT_COLUMNS)).to_pandas()
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
    alive = np.isin(records.kinds, ("send", "ack", "run_start", "run_stop"))
    last_sender_ns = s.last_sender_ns
    if alive.any():  # a send written with its answer: the answer is the later sign of life
        last_sender_ns = max(last_sender_ns, int(np.maximum(records.good["at_ns"].to_numpy(), records.answered_ns)[alive].max()))
    aborted = s.aborted
    if (aborted is None and start_ns is not None and len(stopped) < shards and last_sender_ns != NO_TIME_NS
            and watermark_ns >= last_sender_ns + cfg.silence_timeout_ns):
        aborted = (f"aborted: no record from {shards - len(stopped)} of {shards} load generator(s) for "
                   f"{cfg.silence_timeout_ns / 1e9:g} s (killed?); closed by the job at their last record")
        stop_ns = max(stop_ns if stop_ns is not None else last_sender_ns, last_sender_ns)
        stopped = sorted(set(stopped) | {"job"})
        shards = len(stopped)
        ev = pd.concat([ev, pd.DataFrame([{"kind": "run_stop", "agent": "job", "at_ns": stop_ns, "reason": aborted}])],
                       ignore_index=True)
    return ({"start_ns": start_ns, "stop_ns": stop_ns, "shards": shards, "stopped": stopped,
             "last_sender_ns": int(last_sender_ns), "aborted": aborted}, ev)


def declare_gaps(gaps: gap_tracking.GapTracker, sends_ns: np.ndarray, recvs_ns: np.ndarray, judged_ns: int,
                 stop_ns: int | None, watermark_ns: int, cfg: EngineConfig,
                 out: partials.Collector) -> tuple[gap_tracking.GapTracker, list]:
    """(the tracker moved on, the gaps judged by this batch: (start_ns, duration_ns, in_flight)): receive silences
    while events are in flight, judged once no agent can still write inside them (``streaming.gaps``); the silence
    counted per window."""
    gaps = gaps.copy()
    declared = gaps.advance(sends_ns, recvs_ns, judged_ns, stop_ns)
    gaps.forget(watermark_ns - cfg.retention_ns)
    if declared:
        out.add(output.SILENCE_NS, *gap_tracking.silence_by_window(declared, cfg.window_ns))
    return gaps, declared


def gather_events(records: Records, run_events: pd.DataFrame, exemplars: list, declared: list,
                  reset_event: dict | None, start_ns: int | None, stop_ns: int | None, cfg: EngineConfig,
                  early=None) -> tuple[pd.DataFrame, pa.Table | None]:
    """The batch's events: run records (``run_span``), exemplars, gaps, the reset (at its place in event time: the
    source stamped it with its own clock) and the records about the machines within the run's span (they never move
    the watermark: an agent's clock is not the run's event time); each with its window. Machine records that come
    before the run's span is known wait (``early``, in the state: ``machine_records``); also returned, what waits
    after this batch."""
    parts = [run_events, *[e.assign(agent="job") for e in exemplars if len(e)]]
    if declared:  # also in a batch with no exemplar (the one that let a gap be judged may hold only sends)
        parts.append(pd.DataFrame([{"kind": "gap", "agent": "job", "at_ns": a, "count": d, "value": float(n),
                                    "source": "receive silence"} for a, d, n in declared]))
    if reset_event is not None:
        parts.append(pd.DataFrame([reset_event]))
    machines, early = machine_records(records.shared, early, start_ns, stop_ns, cfg)
    if machines is not None:
        parts.append(machines)
    events = pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]
    events["window_ns"] = partials.window_of(events["at_ns"].to_numpy(), cfg.window_ns) if len(events) else pd.Series(dtype=np.int64)
    return events, early


EARLY_KEEP_NS = 120 * 10**9
"""Machine records that wait for the run's start (``machine_records``): the newest two minutes of them. The span keeps
those from a window before the start, so only a start record that reaches the job more than two minutes after the
machines' records of its second would find fewer than a replay."""


def machine_records(shared: pa.Table, early, start_ns: int | None, stop_ns: int | None,
                    cfg: EngineConfig) -> tuple[pd.DataFrame | None, pa.Table | None]:
    """The machine records within the run's span (from a window before its start to the drop timeout after its stop,
    the reset left out: ``gather_events`` places it), and those that wait for the span (``early``: an Arrow table
    between batches, rows as a snapshot holds them): all of them (the newest ``EARLY_KEEP_NS``) while the start is
    unknown. A live job that read them in a batch before the run's start record keeps what a replay, which reads the
    run in one batch, keeps."""
    table = shared.select(list(EVENT_COLUMNS))
    if isinstance(early, list):  # from a snapshot
        early = pa.Table.from_pylist(early, schema=table.schema) if early else None
    if early is not None and early.num_rows:
        table = pa.concat_tables([early, table], promote_options="default")
    if not table.num_rows:
        return None, None
    at = table["at_ns"].to_numpy()
    if start_ns is None:
        return None, table.filter(pa.array(at >= at.max() - EARLY_KEEP_NS))
    span = (at >= start_ns - cfg.window_ns) & (at <= (stop_ns if stop_ns is not None else at.max()) + cfg.drop_timeout_ns)
    span &= table["kind"].to_numpy(zero_copy_only=False) != "reset"  # placed by gather_events
    return (table.filter(pa.array(span)).to_pandas() if span.any() else None), None
