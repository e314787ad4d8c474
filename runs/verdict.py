"""The run's verdict from its assessed windows (``runs.saturation``): its state and the message it opens with, where
saturation began and with what evidence, the stalls that drained, flightwatch's own telemetry outages, the per-step
profile and the knee."""
from __future__ import annotations

import time
from typing import NamedTuple

import numpy as np
import pandas as pd

from core import output
from core.output import SEVERITY, Episode, State
from runs.saturation import (
    CONFIRM_WINDOWS,
    DEFAULT_LATENCY_BOUND_US,
    KNEE_RATIO,
    OBSERVER_DISTURBED_FACTOR,
    OBSERVER_LASTED_SHARE,
    OBSERVER_LASTED_WINDOWS,
    OBSERVER_MAJORITY,
    assess_windows,
    step_counts,
)


def _step_state(states: list[str]) -> State | None:
    """A step's state: the worst that at least ``CONFIRM_WINDOWS`` of its windows reach (one busy second at
    start-up or one p99 blip is noise, not the step's state); a lone saturated window (a gap) still shows as
    degrading."""
    if not states:
        return None
    sev = np.array([SEVERITY.index(x) for x in states])
    for level in range(len(SEVERITY) - 1, 0, -1):
        if (sev >= level).sum() >= CONFIRM_WINDOWS:
            return SEVERITY[level]
    return State.DEGRADING if sev.max() == SEVERITY.index(State.SATURATED) else State.OK


def _outside_steps(window_ns: int, steps: list[dict]) -> str:
    """Where a window outside every pace step lies: before or after the schedule, at its UTC time."""
    at = time.strftime("%H:%M:%S UTC", time.gmtime(window_ns / 1e9))
    if steps and window_ns < steps[0]["start_ns"]:
        return f"{at}, before step 1"
    if steps and window_ns >= steps[-1]["end_ns"] - 1_000_000_000:
        return f"{at}, after the schedule's end"
    return at


def _clock(ns: int) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(ns / 1e9))


def _stalls(a: pd.DataFrame, window_ns: int, gaps: list[dict]) -> list[dict]:
    """The stalls that drained, from the assessed windows: their interval and the events they held. Where the run's
    gaps (``streaming.gaps``: receive silences, ns edges) lie within a stall's windows, its interval is theirs and
    ``held`` the most in flight at their start; else the window edges and the deficit at a window's end."""
    out: list[dict] = []
    rows = a[a["episode"] == Episode.STALL]
    for t, held in zip(rows["window_ns"].tolist(), rows["held"].tolist()):
        if out and t == out[-1]["end_ns"]:
            out[-1]["end_ns"] = t + window_ns
            out[-1]["held"] = max(out[-1]["held"], int(held))
        else:
            out.append({"start_ns": int(t), "end_ns": int(t + window_ns), "held": int(held)})
    for s in out:
        inside = [g for g in gaps if g["end_ns"] > s["start_ns"] and g["start_ns"] < s["end_ns"]]
        if inside:
            s.update(start_ns=int(min(g["start_ns"] for g in inside)), end_ns=int(max(g["end_ns"] for g in inside)),
                     held=max(s["held"], *(int(g.get("in_flight") or 0) for g in inside)))
    merged: list[dict] = []  # two episodes within one silence (a window between them that looked fine) are one stall
    for s in sorted(out, key=lambda s: s["start_ns"]):
        if merged and s["start_ns"] < merged[-1]["end_ns"]:
            merged[-1].update(end_ns=max(merged[-1]["end_ns"], s["end_ns"]), held=max(merged[-1]["held"], s["held"]))
        else:
            merged.append(s)
    return merged


def _outage(lost: pd.DataFrame, steps: list[dict], first_ns: int, outages: list[dict]) -> str:
    """One sentence on flightwatch's own telemetry outage: when (seconds into the run: the reset's hole, else the first
    incomplete window), why, windows not judged."""
    if lost.empty:
        return ""
    start = steps[0]["start_ns"] if steps else first_ns
    at_ns = int(outages[0]["at_ns"]) if outages and outages[0].get("at_ns") else int(lost["window_ns"].iloc[0])
    why = "lost its data" if not outages else {"deleted": "lost the topic"}.get(
        str(outages[0].get("reason")), "restarted empty" if "recreated" in str(outages[0].get("reason")) else
        f"lost records ({outages[0].get('reason')})")
    n = len(lost)
    return (f"flightwatch's telemetry broker {why} at {max(at_ns - start, 0) / 1e9:.0f} s: {n} window{'s' if n > 1 else ''} "
            "incomplete, not judged")


def _held(held: dict[str, dict], start_ns: int) -> str:
    """One sentence on agents whose telemetry was held on its way to the broker: flightwatch's outage, not the SUT's
    (their stamps were taken on time; the records only arrived late)."""
    return ("flightwatch's own telemetry outage, not the SUT's: " + ", ".join(
        f"{agent}'s records held up to {h['longest_s']:.1f} s from {max(h['from_ns'] - start_ns, 0) / 1e9:.0f} s "
        f"into the run ({h['records']:,} records)" for agent, h in sorted(held.items()))
        + " on the way to the telemetry broker, then delivered")


def _ooms(ooms: list[dict], start_ns: int) -> str:
    """One sentence on the run's OOM kills, by where they were (a host's cgroup by its host's name) and when; a kill
    the machine's counter saw too (``vmstat``) is named by the detector that says where."""
    by: dict[str, list[int]] = {}
    for o in [o for o in ooms if o.get("source") != "vmstat"] or ooms:
        where = str(o.get("where") or o.get("source"))
        where = where.split(":", 1)[0] if o.get("source") == "cgroup" else where  # <host>:<cgroup>
        by.setdefault(where, []).append(int(o["at_ns"]))
    return "OOM kills: " + ", ".join(f"{len(at)} on {where} from {max(min(at) - start_ns, 0) / 1e9:.0f} s into the run"
                                     for where, at in sorted(by.items()))


def verdict(w: pd.DataFrame, steps: list[dict], window_ns: int = 1_000_000_000, step_figures=None,
            latency_bound_us: float = DEFAULT_LATENCY_BOUND_US, outages: list[dict] | None = None,
            gaps: list[dict] | None = None, held: dict[str, dict] | None = None,
            ooms: list[dict] | None = None, stopped: dict[str, int] | None = None) -> output.Verdict:
    """The run's verdict: its state (the one its message opens with), where saturation began (with evidence), the
    stalls that drained, flightwatch's own telemetry outages, per-step profile and knee.

    ``step_figures(start_ns, end_ns)`` gives exact figures over a step (counts and merged percentiles);
    without it the step table is built from the windows. ``outages``: the run's telemetry resets (``at_ns``,
    ``reason``), to name them; ``gaps``: its receive silences (``start_ns``, ``end_ns``, ``in_flight``), to give a
    stall its exact interval; ``held``: per agent, its telemetry held on the way to the broker
    (``runs.runinfo.telemetry_held``), named as flightwatch's outage; ``ooms``: its OOM events (``at_ns``, ``source``,
    ``where``), named by where they were; ``stopped``: receiver agents whose records stopped mid-run (their last, epoch
    ns: ``runs.runinfo.receivers_stopped``): when nothing was received after one stopped, what went unrecorded is
    flightwatch's outage, and the run is judged on the windows before it.
    """
    everything = assess_windows(w, steps, window_ns)
    if everything.empty:
        return _built("no settled windows yet", latency_bound_us)
    lost = everything["state"] == State.TELEMETRY_INCOMPLETE
    a = everything[~lost].reset_index(drop=True)
    outage = _outage(everything[lost], steps, everything["window_ns"].iloc[0], outages or [])
    if a.empty:
        return _built(f"{State.TELEMETRY_INCOMPLETE}: {outage}", latency_bound_us, state=State.TELEMETRY_INCOMPLETE,
                      telemetry_incomplete_windows=int(lost.sum()))
    head = _receiver_headline(a, steps, stopped or {}, window_ns) or _headline(a, steps)
    stalls = _stalls(a, window_ns, gaps or [])
    observer = a[a["state"] == State.OBSERVER_BOUND]
    start_ns = steps[0]["start_ns"] if steps else int(everything["window_ns"].iloc[0])
    notes = [_stalls_note(stalls)] if stalls else []
    notes += [outage] if outage else []
    notes += [_held(held, start_ns)] if held else []
    notes += [_ooms(ooms, start_ns)] if ooms else []
    if len(observer) >= CONFIRM_WINDOWS and head.state != State.OBSERVER_BOUND:
        notes.append(_observer_windows(observer, steps, everything["window_ns"].iloc[0], window_ns))
    profile = _profile(a, steps, window_ns, step_figures)
    sat_step = head.fields["saturated_at"]["step"] if head.fields.get("saturated_at") else None
    return _built("; ".join([head.message, *notes]), latency_bound_us, telemetry_incomplete_windows=int(lost.sum()),
                  **head.fields, state=head.state, stalls=stalls, steps=profile,
                  knee=_knee(profile, sat_step, latency_bound_us), observer_bound_windows=int(len(observer)),
                  **_observer_bound_at(observer))


def _built(message: str, latency_bound_us: float, **fields) -> output.Verdict:
    """A verdict, whole: what every verdict says (nothing saturated, no knee, no steps, no stalls, until ``fields``
    say otherwise), then ``fields``."""
    return {"state": State.OK, "saturated_at": None, "knee": None, "steps": [], "stalls": [], "message": message,
            "latency_bound_us": latency_bound_us, **fields}


def _receiver_headline(a: pd.DataFrame, steps: list[dict], stopped: dict[str, int], window_ns: int) -> Headline | None:
    """When a receiver agent stopped and nothing was received after it: the run's events since are flightwatch's
    outage, and the run is judged on the windows before it (``_receiver_gone``); else None."""
    if (gone := _receiver_gone(a, stopped, window_ns)) is None:
        return None
    agent, silent_ns = gone
    before = a[a["window_ns"] < silent_ns]
    prior = _headline(before, steps).message if not before.empty else "no window before it"
    return Headline(State.TELEMETRY_INCOMPLETE, (
        f"{State.TELEMETRY_INCOMPLETE}: flightwatch's receiver {agent} stopped recording "
        f"{max(silent_ns - (steps[0]['start_ns'] if steps else int(a['window_ns'].iloc[0])), 0) / 1e9:.0f} s into "
        f"the run, and nothing was received after it: the events it did not record are flightwatch's own "
        f"outage, not the SUT's (restart the receiver, or let flightwatch start one); before it: {prior}"), {})


def _observer_bound_at(observer: pd.DataFrame) -> dict:
    """``observer_bound_at`` (its first window and step) once flightwatch was the limit in ``CONFIRM_WINDOWS``
    windows or more; else nothing."""
    if len(observer) < CONFIRM_WINDOWS:
        return {}
    ob = observer.iloc[0]
    return {"observer_bound_at": {"window_ns": int(ob["window_ns"]), "step": int(ob["step"]) + 1 if ob["step"] >= 0 else None}}


def _receiver_gone(a: pd.DataFrame, stopped: dict[str, int], window_ns: int) -> tuple[str, int] | None:
    """The receiver agent whose stop explains the run's silence, and when the silence began: it had recorded receives
    before its last record, and from the time its next record was due (``core.clock.REPORT_EVERY_S`` later) to the
    end, events went out and none was received; else None."""
    from core.clock import REPORT_EVERY_S

    received = a[output.RECEIVED].to_numpy()
    for agent, last_ns in sorted(stopped.items(), key=lambda kv: kv[1]):
        after = a[a["window_ns"] >= last_ns + int(REPORT_EVERY_S * 1e9)]
        if after.empty or after[output.SENT].sum() == 0 or after[output.RECEIVED].sum() > 0:
            continue
        if a.loc[a["window_ns"] + window_ns <= last_ns, output.RECEIVED].sum() == 0:
            continue
        last_received = int(np.flatnonzero(received > 0)[-1])
        return agent, int(a["window_ns"].iloc[last_received]) + window_ns
    return None


def _stalls_note(st: list[dict]) -> str:
    return (f"{len(st)} stall{'s' if len(st) > 1 else ''} that drained (the SUT paused and caught up): "
            + ", ".join(f"{_clock(s['start_ns'])} for {(s['end_ns'] - s['start_ns']) / 1e9:.1f} s, "
                        f"{s['held']:,} events held" for s in st[:3]) + (", ..." if len(st) > 3 else ""))


class Headline(NamedTuple):
    """The state a verdict opens with, its message, and the verdict's fields it sets (``saturated_at``, ...)."""
    state: State
    message: str
    fields: dict


def _headline(a: pd.DataFrame, steps: list[dict]) -> Headline:
    """The verdict's state and the message it opens with: where saturation began (with its evidence), else
    observer-bound, loadgen-bound, degrading or ok: the first of them that holds."""
    sat = (a["state"] == State.SATURATED).to_numpy()
    run = np.convolve(sat.astype(int), np.ones(CONFIRM_WINDOWS, int), "valid") == CONFIRM_WINDOWS
    first = int(np.flatnonzero(run)[0]) if run.any() else None
    num_observer = int((a["state"] == State.OBSERVER_BOUND).sum())
    if first is not None and num_observer > OBSERVER_MAJORITY * len(a):
        first = None  # flightwatch was the limit in most of the run: the few windows left do not convict the SUT
    if first is not None:
        r = a.iloc[first]
        step = int(r["step"])
        ev = list(r["reasons"])
        where = f"step {step + 1} ({steps[step]['rate']:,.0f}/s)" if step >= 0 else _outside_steps(int(r["window_ns"]), steps)
        return Headline(State.SATURATED, f"{State.SATURATED} at {where}: " + ", ".join(ev), {"saturated_at": {
            "window_ns": int(r["window_ns"]), "step": step + 1 if step >= 0 else None,
            "rate": steps[step]["rate"] if step >= 0 else None, "evidence": ev}})
    if (why := observer_weighs(a)) is not None:
        ob = a[a["state"] == State.OBSERVER_BOUND].iloc[0]
        return Headline(State.OBSERVER_BOUND, f"{State.OBSERVER_BOUND}: " + ", ".join(ob["reasons"]) + f"; {why}"
                        " (flightwatch itself, not the SUT, is the limit: run it on another machine)", {})
    if (a["state"] == State.LOADGEN_BOUND).sum() >= CONFIRM_WINDOWS:
        lb = a[a["state"] == State.LOADGEN_BOUND].iloc[0]
        return Headline(State.LOADGEN_BOUND, f"{State.LOADGEN_BOUND}: " + ", ".join(lb["reasons"])
                        + " (the generator, not the SUT, is the limit)",
                        {"loadgen_bound_at": {"window_ns": int(lb["window_ns"]),
                                              "step": int(lb["step"]) + 1 if lb["step"] >= 0 else None}})
    if a["state"].iloc[-1] == State.DEGRADING:
        return Headline(State.DEGRADING, f"{State.DEGRADING}: " + ", ".join(a["reasons"].iloc[-1]), {})
    return Headline(State.OK, str(State.OK), {})


def _longest_run(flags: np.ndarray) -> int:
    """The most consecutive True values."""
    best = cur = 0
    for f in flags:
        cur = cur + 1 if f else 0
        best = max(best, cur)
    return best


def observer_weighs(a: pd.DataFrame) -> str | None:
    """Whether flightwatch's own CPU weighs on the whole run, so that the run is headlined ``observer-bound``: why,
    or None. It does when its pressure lasted (at least ``OBSERVER_LASTED_SHARE`` of the judged windows, or
    ``OBSERVER_LASTED_WINDOWS`` in a row), or when it changed what was measured (in one of its windows, the send
    delay's or the flight time's p99 over ``OBSERVER_DISTURBED_FACTOR`` times the undisturbed level about it: the
    median p99 of the other windows within ``OBSERVER_LASTED_WINDOWS`` of it, or of the whole run's if none is). The
    level is local because a SUT's own latency drifts: Tansu's p99 rose from 24 to 100 ms over a minute at 5,000/s,
    and its last windows were 2x the run's median whoever was busy. A few busy windows (the job's start-up) that
    changed nothing are named, not headlined."""
    ob = (a["state"] == State.OBSERVER_BOUND).to_numpy()
    n = int(ob.sum())
    if n < CONFIRM_WINDOWS:
        return None
    if (longest := _longest_run(ob)) >= OBSERVER_LASTED_WINDOWS:
        return f"for {longest} windows in a row"
    if n >= OBSERVER_LASTED_SHARE * len(a):
        return f"in {n} of {len(a)} windows"
    for hist, what in ((output.SEND_DELAY, "send delay"), (output.LATENCY, "flight time")):
        col = output.percentile_column(hist, 99)
        if col not in a:
            continue
        p99 = a[col].to_numpy(float)
        calm = ~ob & ~np.isnan(p99)
        if not calm.any():
            continue
        for i in np.flatnonzero(ob & ~np.isnan(p99)):
            about = slice(max(i - OBSERVER_LASTED_WINDOWS, 0), i + OBSERVER_LASTED_WINDOWS + 1)
            near = calm[about]
            level = max(float(np.median(p99[about][near] if near.any() else p99[calm])), 1.0)
            if p99[i] > OBSERVER_DISTURBED_FACTOR * level:
                return (f"{what} p99 {p99[i] / 1000:.1f} ms in them, {p99[i] / level:.1f}x the windows' about them "
                        f"({level / 1000:.1f} ms)")
    return None


def _observer_windows(observer: pd.DataFrame, steps: list[dict], first_ns: int, window_ns: int) -> str:
    """The windows where flightwatch itself was the limit, named as a stall is: how many, when (seconds into the
    run), and ``start-up`` when they are within the first ``OBSERVER_LASTED_WINDOWS`` seconds of the load."""
    start = steps[0]["start_ns"] if steps else first_ns
    t0 = (int(observer["window_ns"].min()) - start) / 1e9
    t1 = (int(observer["window_ns"].max()) + window_ns - start) / 1e9
    startup = t1 <= OBSERVER_LASTED_WINDOWS * window_ns / 1e9 + 1
    n = len(observer)
    return (f"flightwatch itself was the limit in {n} window{'s' if n > 1 else ''} ({max(t0, 0):.0f} s–{t1:.0f} s"
            + (", start-up)" if startup else ")"))


def _profile(a: pd.DataFrame, steps: list[dict], window_ns: int, step_figures) -> list[output.Step]:
    """Per pace step: achieved rates, success ratio, p50/p99 and its state."""
    rows = []
    for i, s in enumerate(steps):
        in_step = a[a["step"] == i]
        if step_figures is not None:
            f = step_figures(s["start_ns"], s["end_ns"])
        else:
            f = {**step_counts(in_step),
                 "latency_us": {"p50": None, "p99": float(in_step["latency_us_p99"].median()) if len(in_step) else None}}
        secs = (s["end_ns"] - s["start_ns"]) / 1e9
        # a window across the step's edge carries the next step's load too: the state is its whole windows' (all of
        # its windows if it has too few whole ones)
        whole = in_step[(in_step["window_ns"] >= s["start_ns"]) & (in_step["window_ns"] + window_ns <= s["end_ns"])]
        state = _step_state((whole if len(whole) >= CONFIRM_WINDOWS else in_step)["state"].tolist())
        lost = f.get("failed", f["sent"] - f["received"])  # by send time when known: a late delivery is no loss
        row = {"step": i + 1, "rate": s["rate"], "start_ns": s["start_ns"], "end_ns": s["end_ns"],
               "sent_per_s": f["sent"] / secs, "received_per_s": f["received"] / secs,
               "success_ratio": (f["sent"] - lost) / f["sent"] if f["sent"] else None,
               "p50_us": f["latency_us"].get("p50"), "p99_us": f["latency_us"].get("p99"), "state": state}
        rows.append(row)
    return rows


def _knee(rows: list[output.Step], sat_step: int | None, latency_bound_us: float) -> dict | None:
    """The highest-rate step before saturation that delivered ≥ 99% with p99 under the bound."""
    knee = None
    for row in rows:
        if sat_step is not None and row["step"] >= sat_step:
            break
        if row["success_ratio"] is not None and row["success_ratio"] >= KNEE_RATIO and row["p99_us"] is not None \
                and row["p99_us"] <= latency_bound_us and row["state"] in (State.OK, State.DEGRADING) \
                and (knee is None or row["rate"] > knee["rate"]):
            knee = {"step": row["step"], "rate": row["rate"], "p99_us": row["p99_us"]}
    return knee
