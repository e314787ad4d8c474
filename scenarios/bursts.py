"""Bursts and sustained load (the Knative Eventing broker report's method): each burst's flight time and how long the
system took to recover from it, and the throughput of each receiver, from a run's archive.

A *burst* is a pace step at 1.5 times the first step's rate or more (the scenario's 10 s at twice the sustained
rate), followed by silence; an event belongs to the step it was due in (its intended send time). Its *recovery time* is from the burst's end until the last event sent in it was received:
the backlog it left drained (an event never received leaves it unrecovered, and is counted). The *sustained* figures
are those of the events sent in the other steps with a rate. A receiver is an agent that wrote receive records (the
HTTP receiver's processes are ``receiver-http-<i>``); its throughput is its receives over the seconds the schedule
sent in (silence left out).

    b = burst_figures(run_root, steps)
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from scenarios.pairs import events, join, nearest_rank

BURST_FACTOR = 1.5


def _flight(j: pd.DataFrame) -> dict:
    got = j[j["first"] >= 0]
    f = (got["first"] - got["at_ns"]).to_numpy() / 1000
    return {"sent": int(len(j)), "received": int(len(got)), "p50_us": nearest_rank(f, 50), "p99_us": nearest_rank(f, 99),
            "max_us": float(f.max()) if len(f) else None}


def burst_figures(root: str, steps: list[dict]) -> dict:
    """The sustained steps' flight time, each burst's (with its recovery time), and each receiver's throughput."""
    ev = events(root)
    j = join(ev)
    base = steps[0]["rate"] if steps else 0
    bursts, sustained = [], np.zeros(len(j), bool)
    for i, s in enumerate(steps):
        due = j["intended_at_ns"]  # a late send stays in the step it was due in
        sel = ((due >= s["start_ns"]) & (due < s["end_ns"])).to_numpy()
        if base and s["rate"] >= BURST_FACTOR * base:
            part = j[sel]
            unreceived = int((part["first"] < 0).sum())
            last = int(part["first"].max()) if len(part) else None
            bursts.append({"step": i + 1, "rate": s["rate"], "start_ns": s["start_ns"], "end_ns": s["end_ns"],
                           **_flight(part), "unreceived": unreceived,
                           "recovery_s": None if unreceived or last is None else max(last - s["end_ns"], 0) / 1e9})
        elif s["rate"] > 0:
            sustained |= sel
    active_s = sum((s["end_ns"] - s["start_ns"]) / 1e9 for s in steps if s["rate"] > 0)
    recv = ev[ev["kind"] == "recv"]
    per_receiver = recv.groupby("agent").size()
    return {"sustained": _flight(j[sustained]), "bursts": bursts,
            "receivers": {str(a): {"received": int(n), "per_s": n / active_s if active_s else None}
                          for a, n in per_receiver.items()}}
