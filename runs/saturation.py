"""Where the system under test saturates: pure rules over the window table, with their evidence.

Signals per 1 s window (only *settled* windows: every agent that sends or receives has written past the
window's end (``settled``, from the job), or, failing that, the window is ``SETTLE_WINDOWS`` behind the newest,
so a receive still on its way to the job is not mistaken for a loss):

    ratio       received / sent over the window and the one before
    backlog     in flight grew by more than 10% of a second's sends over the last 2 windows,
                to more than half a second of sends
    p99 jump    p99 at least ``P99_JUMP``× the previous pace step's median p99
    gap         no delivery while sending
    loadgen     sent below ``LOADGEN_SHORT`` of the scheduled rate: the generator is the limit
    node        CPU ≥ 95%, memory available < 5%, network drops, OOM kills
    observer    on a node with CPU ≥ 95%, flightwatch itself (``observer_cpu``) uses more than
                ``OBSERVER_SHARE`` of the busy cores (``cpu_util`` × ``cpu_cores``)

A *shortfall* is a window with ratio < 0.9, a growing backlog or a gap. Consecutive shortfall windows are one
episode, judged by whether it drains: once it is over, the events it held are delivered within ``DRAIN_WINDOWS``
(the deficit it built is gone) and none of its sends was lost or failed. An episode that drains is a *stall* (the SUT
paused and caught up: its windows are ``degrading``, and the verdict lists the stall with its interval and the events
it held), never saturation. One that does not is saturation (a SUT that crashed and lost what it held), and so is one
that lasts ``STALL_LIMIT_WINDOWS`` or more, drained or not (received/sent stayed low for seconds: an outage, as a
SUT broker killed and restarted gives). While one is still open, a shortfall with deliveries going on counts as
saturation at once, and a silence (a gap) once it has lasted ``STALL_LIMIT_WINDOWS``.

States, worst first: ``saturated``, ``loadgen-bound`` (the generator falls short of its schedule while the SUT keeps
up), ``observer-bound`` (flightwatch's own CPU is the limit: whatever else the window shows, it is not blamed on the
SUT), ``degrading`` (ratio < 0.97, a p99 jump, node pressure, an OOM kill, a stall), ``ok``; and, outside that
order, ``telemetry-incomplete``: flightwatch's own telemetry lost records of the window (its broker restarted empty),
so nothing in it is judged or blamed on the SUT. Node pressure is not judged in a run's first window (flightwatch's
own start-up). Saturation starts at the first of ``CONFIRM_WINDOWS`` consecutive saturated windows. A pace step's state is the worst that at least
``CONFIRM_WINDOWS`` of its whole windows reach (not the one across its end, which carries the next step's load). The knee is the highest-rate pace step before saturation whose
events were delivered ≥ 99% (by send time: not dropped, not failed; a window edge that the step does not
share with the 1 s windows does not count as a loss) with p99 ≤ the latency bound.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from core import output
from core.output import Episode, State

SETTLE_WINDOWS = 2
SATURATED_RATIO = 0.90
DEGRADING_RATIO = 0.97
KNEE_RATIO = 0.99
P99_JUMP = 4.0
LOADGEN_SHORT = 0.90
CPU_HIGH = 0.95
MEM_LOW = 0.05
OBSERVER_SHARE = 0.5
"""A node is observer-bound when flightwatch uses more than this share of its busy cores (and its CPU is high)."""
CONFIRM_WINDOWS = 2
OBSERVER_LASTED_SHARE = 0.2
"""A run is headlined observer-bound when at least this share of its judged windows are (``runs.verdict``) ..."""
OBSERVER_LASTED_WINDOWS = 5
"""... or this many in a row ..."""
OBSERVER_DISTURBED_FACTOR = 2.0
"""... or when in them the send delay's or flight time's p99 exceeded this many times the median of the other
windows about them (``runs.verdict.observer_weighs``)."""
OBSERVER_MAJORITY = 0.5
"""Past this share of observer-bound windows, the run is observer-bound even where the windows left look saturated."""
DRAIN_WINDOWS = 5
"""An episode of shortfall drains when its deficit is gone within this many windows after it."""
DRAIN_SLACK = 0.1
"""Drained: the deficit (sent - received since the episode began) is at most this share of a window's sends."""
STALL_LIMIT_WINDOWS = 5
"""A shortfall this many windows long is saturation, not a stall, even if it drains afterwards."""
BACKLOG_SECONDS = 0.5
"""A backlog counts once more than half a second of sends is in flight (start-up fills the pipe)."""
DEFAULT_LATENCY_BOUND_US = 500_000.0


def _node_max(w: pd.DataFrame, metric: str) -> pd.Series:
    cols = [w[c].to_numpy(float) for c in w.columns if c.startswith("node:") and c.endswith(":" + metric)]
    if not cols:
        return pd.Series(np.nan, index=w.index)
    stacked = np.vstack(cols)
    with np.errstate(invalid="ignore"):  # a window no node reported: NaN, as pandas' max gives
        out = np.where(np.isnan(stacked).all(axis=0), np.nan, np.nanmax(np.where(np.isnan(stacked), -np.inf, stacked), axis=0))
    return pd.Series(out, index=w.index)


def _observer_bound(w: pd.DataFrame) -> tuple[np.ndarray, list[str | None]]:
    """Per window: whether a node is observer-bound, and the evidence (``flightwatch 1.2 of 1.9 busy cores``)."""
    bound = np.zeros(len(w), bool)
    why: list[str | None] = [None] * len(w)
    for c in [c for c in w.columns if c.startswith("node:") and c.endswith(":observer_cpu")]:
        node = c[len("node:"):-len(":observer_cpu")]
        cpu, cores = w.get(f"node:{node}:cpu_util"), w.get(f"node:{node}:cpu_cores")
        if cpu is None or cores is None:
            continue
        busy = cpu.to_numpy(float) * cores.to_numpy(float)
        obs = w[c].to_numpy(float)
        with np.errstate(invalid="ignore", divide="ignore"):
            hit = (cpu.to_numpy(float) >= CPU_HIGH) & (obs > OBSERVER_SHARE * busy)
        for i in np.flatnonzero(hit & ~bound):
            why[i] = f"flightwatch {obs[i]:.2f} of {busy[i]:.2f} busy cores" + (f" on {node}" if node else "")
        bound |= hit
    return bound, why


def _mem_min_share(w: pd.DataFrame) -> pd.Series:
    out = pd.Series(np.nan, index=w.index)
    for c in [c for c in w.columns if c.startswith("node:") and c.endswith(":mem_available_bytes")]:
        used = c.replace(":mem_available_bytes", ":mem_used_bytes")
        if used in w:
            share = w[c] / (w[c] + w[used])
            out = pd.concat([out, share], axis=1).min(axis=1)
    return out


def step_of(window_ns: np.ndarray, steps: list[dict], length_ns: int = 1_000_000_000) -> np.ndarray:
    """Index of the pace step holding each window's middle (-1 outside every step)."""
    mid = np.asarray(window_ns) + length_ns // 2
    idx = np.full(len(mid), -1)
    for i, s in enumerate(steps):
        idx[(mid >= s["start_ns"]) & (mid < s["end_ns"])] = i
    return idx


def episodes(short: np.ndarray, gap: np.ndarray, sent: np.ndarray, recv: np.ndarray,
             lost: np.ndarray | None = None) -> list[dict]:
    """The episodes of consecutive shortfall windows (indices ``first``..``last``), each judged:

    ``stall``      it drained: within ``DRAIN_WINDOWS`` after it, the deficit it built was delivered, and none of
                   its sends was ``lost`` (dropped or failed, by send window)
    ``saturated``  it lasted ``STALL_LIMIT_WINDOWS``; it lost sends; it did not drain, though ``DRAIN_WINDOWS``
                   followed; or, still open, deliveries went on short (no gap) for ``CONFIRM_WINDOWS``
    ``open``       too soon to tell (an open silence, or a shortfall of one window)

    with ``held``: the largest deficit (events sent and not yet received) it built, ``lost`` and ``drained_at``."""
    out = []
    n = len(short)
    lost = np.zeros(n) if lost is None else np.nan_to_num(np.asarray(lost, float))
    typical = float(np.median(sent[sent > 0])) if (sent > 0).any() else 1.0  # a window's sends, as the run goes
    k = 0
    while k < n:
        if not short[k]:
            k += 1
            continue
        first = k
        while k < n and short[k]:
            k += 1
        last = k - 1
        deficit = np.cumsum(sent[first:] - recv[first:])
        held = float(deficit[: last - first + 1].max())
        if held <= DRAIN_SLACK * typical:
            continue  # no deficit worth the name (a partial first window, deliveries a moment behind): no episode
        drained_at = None
        for j in range(last + 1, min(last + 1 + DRAIN_WINDOWS, n)):
            if deficit[j - first] <= DRAIN_SLACK * max(sent[j], 1.0):
                drained_at = j
                break
        length, silent = last - first + 1, bool(gap[first:last + 1].any())
        num_lost = float(lost[first:(last if drained_at is None else drained_at) + 1].sum())
        if length >= STALL_LIMIT_WINDOWS:
            kind = Episode.SATURATED  # short for seconds: an outage, even one it caught up from
        elif drained_at is not None:
            kind = Episode.STALL if num_lost == 0 else Episode.SATURATED  # caught up, but lost or failed: not a pause
        elif n - 1 - last >= DRAIN_WINDOWS:
            kind = Episode.SATURATED
        else:
            kind = Episode.SATURATED if length >= CONFIRM_WINDOWS and not silent else Episode.OPEN
        out.append({"first": first, "last": last, "kind": kind, "held": held, "lost": num_lost, "drained_at": drained_at})
    return out


def assess_windows(w: pd.DataFrame, steps: list[dict], window_ns: int = 1_000_000_000) -> pd.DataFrame:
    """One row per settled window with sends: its signals, state and the reasons for it."""
    if w.empty or output.SENT not in w:
        return pd.DataFrame(columns=["window_ns", "step", "state", "reasons"])
    w = w.sort_values("window_ns").reset_index(drop=True)
    done = np.zeros(len(w), bool)
    done[: max(len(w) - SETTLE_WINDOWS, 0)] = True
    if output.SETTLED in w:  # as soon as its records are all in (a receiver that stalls holds this back: then the rule above)
        done |= w[output.SETTLED].fillna(False).to_numpy(bool)
    settled = w.iloc[: int(np.flatnonzero(~done)[0]) if (~done).any() else len(w)]
    sending = np.flatnonzero(settled[output.SENT].to_numpy() > 0)
    # from the first window with sends to the last: one where nothing went out in between is the generator held back
    # (at its in-flight cap while the SUT takes nothing), part of the SUT's episode, not a window to skip
    w = settled.iloc[sending[0]:sending[-1] + 1].copy() if len(sending) else settled.iloc[:0]
    if w.empty:
        return pd.DataFrame(columns=["window_ns", "step", "state", "reasons"])
    incomplete = (w[output.TELEMETRY_INCOMPLETE].fillna(0).to_numpy() > 0 if output.TELEMETRY_INCOMPLETE in w
                  else np.zeros(len(w), bool))
    judged = assess_complete(w[~incomplete], steps, window_ns)
    if not incomplete.any():
        return judged
    # the telemetry broker lost records of these: their figures are not the SUT's, and they are judged apart
    rest = w[incomplete].assign(step=step_of(w["window_ns"].to_numpy()[incomplete], steps, window_ns), state=State.TELEMETRY_INCOMPLETE,
                                reasons=[["flightwatch's telemetry incomplete (its broker lost records)"]] * int(incomplete.sum()))
    return pd.concat([judged, rest]).sort_values("window_ns").reset_index(drop=True) if len(judged) else rest


def _signals(w: pd.DataFrame, steps: list[dict], window_ns: int) -> dict[str, np.ndarray]:
    """The per-window signals of the module's docstring, as arrays over the windows of ``w``."""
    t = w["window_ns"].to_numpy()
    n = len(w)
    step = step_of(t, steps, window_ns)
    sent, recv = w[output.SENT].to_numpy(float), w[output.RECEIVED].to_numpy(float)
    # over two windows: a delivery that crosses a window edge is not a loss (nothing sent in either: no ratio)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = (recv + np.concatenate(([0.0], recv[:-1]))) / (sent + np.concatenate(([0.0], sent[:-1])))
    inflight = w[output.IN_FLIGHT].to_numpy(float) if output.IN_FLIGHT in w else np.zeros(n)
    grown = np.zeros(n, bool)
    grown[2:] = ((inflight[2:] - inflight[:-2] > 0.1 * sent[2:]) & (inflight[2:] > inflight[1:-1]) & (inflight[1:-1] > inflight[:-2])
                 & (inflight[2:] >= BACKLOG_SECONDS * sent[2:]))
    sched = np.array([steps[i]["rate"] if i >= 0 else np.nan for i in step], float)
    # only windows wholly inside a step are judged for the generator (the others are partly another step)
    first_or_last = np.array([i < 0 or t_ < steps[i]["start_ns"] or t_ + window_ns > steps[i]["end_ns"]
                              for i, t_ in zip(step, t)], bool)
    p99_col = output.percentile_column(output.LATENCY, 99)
    p99 = w[p99_col].to_numpy(float) if p99_col in w else np.full(n, np.nan)
    base = np.full(n, np.nan)
    for i in range(1, len(steps)):
        prev = p99[step == i - 1]
        prev = prev[~np.isnan(prev)]
        if len(prev):
            base[step == i] = np.median(prev)
    cpu = _node_max(w, "cpu_util").to_numpy(float, copy=True)
    observer_bound, observer_why = _observer_bound(w)
    observer_bound = observer_bound.copy()
    starting = t < t[0] + window_ns  # the run's first window: flightwatch's own start-up shares the node
    cpu[starting] = np.nan
    observer_bound[starting] = False
    with np.errstate(invalid="ignore"):
        p99_jump = p99 >= P99_JUMP * base
    return {"step": step, "sent": sent, "recv": recv, "ratio": ratio, "inflight": inflight, "grown": grown,
            "sched": sched, "loadgen_short": ~first_or_last & (sent < LOADGEN_SHORT * sched), "p99": p99, "base": base,
            "p99_jump": p99_jump, "cpu": cpu, "mem_share": _mem_min_share(w).to_numpy(float),
            "net_drops": (_node_max(w, "net_rx_drops_per_s").fillna(0) + _node_max(w, "net_tx_drops_per_s").fillna(0)).to_numpy(float),
            "observer_bound": observer_bound, "observer_why": observer_why,
            "gap": w["gap"].fillna(False).to_numpy(bool) if "gap" in w else np.zeros(n, bool),
            "oom": w[output.OOM_KILLS].fillna(0).to_numpy() if output.OOM_KILLS in w else np.zeros(n),
            "lost": sum((w[c].fillna(0).to_numpy(float) for c in (output.DROPPED, output.ERRORS) if c in w), np.zeros(n))}


def _judge(k: int, s: dict[str, np.ndarray], e: dict | None) -> tuple[State, list[str]]:
    """Window ``k``'s state and the reasons for it, from the signals and the shortfall episode it is in."""
    why = []
    ratio, gap, grown, loadgen_short = s["ratio"][k], bool(s["gap"][k]), s["grown"][k], s["loadgen_short"][k]
    if e is not None and e["kind"] == Episode.STALL:
        why.append(f"stall: {e['held']:,.0f} events held, drained")
    elif e is not None and e["lost"] and k == e["first"]:
        why.append(f"{e['lost']:,.0f} sent in it lost or failed")
    elif e is not None and e["kind"] == Episode.OPEN:
        why.append(f"shortfall: {e['held']:,.0f} events held, not drained yet")
    if ratio < SATURATED_RATIO:
        why.append(f"received/sent {ratio:.2f}")
    if grown:
        why.append(f"in flight growing ({s['inflight'][k]:,.0f})")
    if gap:
        why.append("gap: no deliveries")
    if loadgen_short:
        why.append(f"loadgen sent {s['sent'][k]:,.0f}/s of {s['sched'][k]:,.0f}/s")
    if s["p99_jump"][k]:
        why.append(f"p99 {_fmt_us(s['base'][k])} → {_fmt_us(s['p99'][k])}")
    if s["cpu"][k] >= CPU_HIGH:
        why.append(f"node cpu {s['cpu'][k]:.0%}")
    if s["mem_share"][k] < MEM_LOW:
        why.append(f"memory available {s['mem_share'][k]:.0%}")
    if s["net_drops"][k] > 0:
        why.append(f"network drops {s['net_drops'][k]:,.0f}/s")
    if s["oom"][k]:
        why.append(f"OOM kills {s['oom'][k]}")
    if s["observer_bound"][k]:  # flightwatch's own CPU: nothing else this window shows is the SUT's fault
        return State.OBSERVER_BOUND, why + [s["observer_why"][k]]
    if loadgen_short and ratio >= DEGRADING_RATIO and not grown and not gap:
        return State.LOADGEN_BOUND, why
    if e is not None and e["kind"] == Episode.SATURATED:
        return State.SATURATED, why
    if why or ratio < DEGRADING_RATIO:
        if ratio < DEGRADING_RATIO and not any(x.startswith("received/sent") for x in why):
            why.insert(0, f"received/sent {ratio:.2f}")
        return State.DEGRADING, why
    return State.OK, why


def assess_complete(w: pd.DataFrame, steps: list[dict], window_ns: int) -> pd.DataFrame:
    """``assess_windows`` over windows whose telemetry is complete."""
    if w.empty:
        return pd.DataFrame(columns=["window_ns", "step", "state", "reasons"])
    s = _signals(w, steps, window_ns)
    short = (s["ratio"] < SATURATED_RATIO) | s["grown"] | s["gap"]
    episode_of: list[dict | None] = [None] * len(w)
    for e in episodes(short, s["gap"], s["sent"], s["recv"], s["lost"]):
        for k in range(e["first"], e["last"] + 1):
            episode_of[k] = e
    states, reasons = zip(*(_judge(k, s, episode_of[k]) for k in range(len(w))))
    signals = pd.DataFrame({"step": s["step"], "ratio": s["ratio"], "backlog": s["grown"], "loadgen_short": s["loadgen_short"],
                            "p99_base": s["base"], "p99_jump": s["p99_jump"], "cpu": s["cpu"], "mem_share": s["mem_share"],
                            "net_drops": s["net_drops"], "observer_bound": s["observer_bound"], "state": list(states),
                            "reasons": list(reasons), "episode": [e["kind"] if e else None for e in episode_of],
                            "held": [e["held"] if e else 0.0 for e in episode_of]}, index=w.index)
    return pd.concat([w.drop(columns=[c for c in signals.columns if c in w]), signals], axis=1)


def step_counts(w: pd.DataFrame) -> dict:
    """A step's sent and received over its windows, and (where the table has drops) ``failed``: of the events
    sent in it, those dropped or failed (both are charged to send windows)."""
    out = {output.SENT: int(w[output.SENT].sum()), output.RECEIVED: int(w[output.RECEIVED].sum())}
    if output.DROPPED in w:
        out["failed"] = int(sum(w[c].sum() for c in (output.DROPPED, output.ERRORS) if c in w))
    return out


def _fmt_us(us) -> str:
    if us is None or us != us:
        return "–"
    return f"{us / 1000:.0f} ms" if us >= 10_000 else f"{us / 1000:.1f} ms"
