"""What a run's markers say: its configuration and pace steps (``run_start``), lost telemetry, clock offsets."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd


def attack_config(events: pd.DataFrame) -> dict:
    """The load generator's configuration of the run: its run_start records' configs merged in time order (later
    ones add to it)."""
    out: dict = {}
    if events.empty or not (events["kind"] == "run_start").any():
        return out
    for text in events[events["kind"] == "run_start"].sort_values("at_ns")["config"].dropna():
        try:
            cfg = json.loads(text)
        except (ValueError, TypeError):
            continue
        if isinstance(cfg, dict):
            out.update(cfg)
    return out


def target_kind(attack: dict) -> str:
    """The kind of target a run attacked (``http``, ``kafka``), from its configuration; ``unknown`` if not recorded."""
    from urllib.parse import urlsplit

    return urlsplit(str(attack.get("target") or "")).scheme or "unknown"


def pace_steps(events: pd.DataFrame) -> list[dict]:
    """The schedule's steps in event time (``rate`` at the step's start, ``end_rate``, ``start_ns``, ``end_ns``), as
    the load generator published them in its ``run_start``; from the pace text for runs recorded before it did."""
    from core.pacer import Schedule

    cfg = attack_config(events)
    steps = cfg.get("steps")
    if isinstance(steps, list):
        try:
            return [{"rate": float(s["rate"]), "end_rate": float(s["end_rate"]), "start_ns": int(s["start_ns"]),
                     "end_ns": int(s["end_ns"])} for s in steps]
        except (KeyError, TypeError, ValueError):
            return []
    pace = cfg.get("pace")
    start = cfg.get("schedule_start_ns")
    if start is None and not events.empty and (events["kind"] == "run_start").any():
        start = int(events.loc[events["kind"] == "run_start", "at_ns"].min())
    if not pace or start is None:
        return []
    try:
        sched = Schedule.parse(str(pace))
    except (ValueError, TypeError):
        return []
    return sched.steps_from(int(start))


def measured_span(attack: dict, steps: list[dict], window_ns: int) -> dict | None:
    """The part of the schedule its latency figures are taken over, left of ``--warmup`` and ``--cooldown``
    (``warmup_s``, ``cooldown_s`` in the run's configuration): ``from_ns``, ``to_ns``, both on window bounds, the
    windows wholly inside; None when the run set neither (or its schedule is unknown)."""
    warmup_s, cooldown_s = float(attack.get("warmup_s") or 0), float(attack.get("cooldown_s") or 0)
    if not (warmup_s or cooldown_s) or not steps:
        return None
    lo = steps[0]["start_ns"] + int(warmup_s * 1e9)
    hi = steps[-1]["end_ns"] - int(cooldown_s * 1e9)
    lo, hi = -(-lo // window_ns) * window_ns, hi // window_ns * window_ns
    return {"from_ns": int(lo), "to_ns": int(max(hi, lo)), "warmup_s": warmup_s, "cooldown_s": cooldown_s}


def in_span(window_ns: pd.Series | np.ndarray, span: dict | None) -> np.ndarray:
    """Which windows (their start, ns) a measured span keeps: all of them without one."""
    w = np.asarray(window_ns, np.int64)
    if span is None:
        return np.ones(len(w), bool)
    return (w >= span["from_ns"]) & (w < span["to_ns"])


def records(events: pd.DataFrame, kind: str, columns: list[str]) -> list[dict]:
    if events.empty:
        return []
    sel = events[events["kind"] == kind]
    if sel.empty:  # a run without such records may lack their columns too
        return []
    sel = sel.reindex(columns=columns).sort_values("at_ns")
    return [{k: (None if isinstance(v, float) and v != v else v) for k, v in r.items()} for r in sel.to_dict("records")]


def telemetry_lost(events: pd.DataFrame) -> dict[str, int]:
    """Per agent, the records it reported it had to refuse (a re-sent report is counted once)."""
    if events.empty or not (events["kind"] == "lost").any():
        return {}
    lost = events[events["kind"] == "lost"].drop_duplicates(["agent", "at_ns", "count"])
    return {str(a): int(n) for a, n in lost.groupby("agent")["count"].sum().items() if n}


CLOCK_FLAG_US = 1000.0
"""A clock offset beyond ±1 ms is flagged: uncorrected, latencies measured across those hosts are off by it."""


def clock_offsets(events: pd.DataFrame, corrected: bool = True) -> list[dict]:
    """Per agent, its latest clock offset against the reference (``reference − agent``), the round trip and the
    estimate's error (± round trip / 2), and whether the job corrected its stamps by it (``streaming.clocks``: when
    ``corrected``, the run's setting, and the offset is beyond its error)."""
    if events.empty or not (events["kind"] == "clock").any():
        return []
    clocks = events[events["kind"] == "clock"].sort_values("at_ns").groupby("agent").agg(
        reference=("reference", "last"), offset_us=("offset_us", "last"), rtt_us=("rtt_us", "last"),
        max_abs_offset_us=("offset_us", lambda v: float(np.abs(v).max())), samples=("offset_us", "size"))
    out = []
    for agent, r in clocks.iterrows():
        error_us = float(r["rtt_us"]) / 2
        out.append({"agent": agent, "reference": r["reference"], "offset_us": float(r["offset_us"]),
                    "rtt_us": float(r["rtt_us"]), "error_us": error_us, "max_abs_offset_us": r["max_abs_offset_us"],
                    "samples": int(r["samples"]), "flagged": bool(r["max_abs_offset_us"] > CLOCK_FLAG_US),
                    "corrected": bool(corrected and abs(float(r["offset_us"])) > error_us)})
    return out


RECEIVER_SILENT_NS = 12_000_000_000
"""A receiver agent whose clock records (every 5 s, ``core.clock.REPORT_EVERY_S``) stopped this long before the run's
last one from any agent (two records missed, and 2 s for a busy machine) has stopped itself (killed, or its host
gone), if the receives stopped with it. (At 15 s, a receiver killed 5 s into a 24 s attack was missed in CI: its last
record came 14.5 s before the load generator's last.)"""


def receivers_stopped(events: pd.DataFrame) -> dict[str, int]:
    """Receiver agents (``receiver-*``) whose clock records stopped ``RECEIVER_SILENT_NS`` or more before the run's
    last clock record: each one's last record (epoch ns). Where agents keep no clock (``--clock-reference none``),
    nothing is known and nothing is said."""
    if events.empty or not (events["kind"] == "clock").any():
        return {}
    clocks = events[events["kind"] == "clock"]
    last = clocks.groupby("agent")["at_ns"].max()
    horizon = int(last.max())
    return {str(agent): int(at) for agent, at in last.items()
            if str(agent).startswith("receiver") and horizon - int(at) >= RECEIVER_SILENT_NS}


def telemetry_held(events: pd.DataFrame) -> dict[str, dict]:
    """Per agent, its telemetry held on the way to the broker (``core.contract.TelemetryHeld``, a re-sent report
    counted once): when the first hold began (``from_ns``), when the last ended (``until_ns``), the longest wait
    (``longest_s``) and the records that waited."""
    if events.empty or not (events["kind"] == "held").any():
        return {}
    held = events[events["kind"] == "held"].drop_duplicates(["agent", "at_ns", "count", "value"])
    out = {}
    for agent, g in held.groupby("agent"):
        ends = g["at_ns"].to_numpy() + (g["value"].to_numpy() * 1e9).astype("int64")
        out[str(agent)] = {"from_ns": int(g["at_ns"].min()), "until_ns": int(ends.max()),
                           "longest_s": round(float(g["value"].max()), 3), "records": int(g["count"].sum())}
    return out

