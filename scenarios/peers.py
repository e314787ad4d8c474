"""A cell beside the broker's own tool (``--peer``, ``make scenario PEER=1``): after flightwatch's run, the peer's
tool (``python -m stack.peers``) on the same broker at the same rate, and one row that sets their figures side by side.

flightwatch's side is read from its run's archive, over the sends of the steps at the peer's rate inside the
measured span (warm-up and cool-down left out): throughput (those sends received, per second of the span), flight
p50/p99/p99.9 by nearest rank (exact, as ``scenarios.pairs``), and the generator's CPU per message (the load
generator's own figure; where the peer's process also consumes, the stack's receiver's CPU over the cell is added, so
both sides count a producer and a consumer).

The two are two samples of one rate, taken one after the other on the same machine, so they agree only as closely as
two runs do; where they differ by more than the peer's clock resolution, ``agreement`` says by how much and names
the causes each tool is known for (a closed model, whole-ms stamps, start-up in its summary, flightwatch's own
observer on the cores).
"""
from __future__ import annotations

import numpy as np

from core.suts import SUTS
from scenarios.pairs import events, join, nearest_rank

PEER_SUTS = tuple(name for name, sut in SUTS.items() if sut.peer)
"""The stack's SUTs a peer's tool runs against (``core.suts.Sut.peer``; ``stack.peers``). Whether the tool's one
process also consumes (its CPU per message set beside flightwatch's generator's and receiver's) and the causes it is
known for come with its figures (``with_consumer``, ``causes``)."""
COMMON = ("two runs one after the other on the same 2 cores: flightwatch's with its own observer beside the broker (the "
          "Spark job, the agents, the telemetry broker), the peer's alone, in a JVM new at its start")


def span_of(summary: dict, rate: float) -> tuple[int, int] | None:
    """The part of the run at ``rate``: its steps at that rate (the whole run for a constant pace), inside the
    measured span; None when no step ran at it."""
    steps = [s for s in (summary.get("verdict") or {}).get("steps") or [] if abs(s.get("rate", 0) - rate) < 0.5]
    if not steps:
        return None
    lo, hi = min(s["start_ns"] for s in steps), max(s["end_ns"] for s in steps)
    m = summary.get("measured") or {}
    return max(lo, m.get("from_ns", lo)), min(hi, m.get("to_ns", hi))


def ours(root: str, summary: dict, loadgen: dict, rate: float, drop_timeout_ns: int, receiver_cpu_s: float | None,
         with_consumer: bool) -> dict:
    """flightwatch's figures at ``rate`` over the measured span, from the archive of the run in folder ``root``."""
    span = span_of(summary, rate)
    if span is None or span[1] <= span[0]:
        return {"problem": f"no step at {rate:,.0f}/s inside the measured span"}
    joined = join(events(root))
    sent = joined[(joined["at_ns"] >= span[0]) & (joined["at_ns"] < span[1])]
    flight = sent["first"] - sent["at_ns"]
    ok = (flight[(sent["first"] >= 0) & (flight <= drop_timeout_ns)] / 1000).to_numpy(dtype=np.float64)
    gen = (loadgen.get("cpu") or {}).get("us_per_event")
    received = int(summary.get("received") or 0)
    cpu = gen
    if with_consumer and gen is not None and receiver_cpu_s is not None and received:
        cpu = gen + receiver_cpu_s * 1e6 / received
    return {"from_ns": int(span[0]), "to_ns": int(span[1]), "sent": int(len(sent)), "received": int(len(ok)),
            "throughput_per_s": len(ok) / ((span[1] - span[0]) / 1e9), "p50_us": nearest_rank(ok, 50),
            "p99_us": nearest_rank(ok, 99), "p999_us": nearest_rank(ok, 99.9), "generator_us_per_message": gen,
            "receiver_cpu_s": receiver_cpu_s, "cpu_us_per_message": cpu,
            "cpu_of": "generator and receiver" if with_consumer else "generator"}


def agreement(fw: dict, peer: dict) -> dict:
    """Whether the two agree within the peer's clock resolution, at p50 and p99; if not, by how much, and why."""
    res = peer.get("resolution_us") or 1
    diffs = {p: fw[f"{p}_us"] - peer[f"{p}_us"] for p in ("p50", "p99")
             if fw.get(f"{p}_us") is not None and peer.get(f"{p}_us") is not None}
    if not diffs:
        return {"agree": None, "text": "nothing to compare"}
    agree = all(abs(d) <= res for d in diffs.values())
    said = ", ".join(f"{p} {d / 1000:+,.3f} ms" for p, d in diffs.items())
    if agree:
        return {"agree": True, "diffs_us": diffs, "text": f"agree within the peer's resolution ({res / 1000:g} ms): {said}"}
    causes = [*peer.get("causes", []), COMMON]
    seconds = [x for x in peer.get("per_second_p99_us") or [] if x is not None]
    if len(seconds) >= 3:
        causes.append(f"the peer's p99 second by second: first {seconds[0] / 1000:,.2f} ms, median "
                      f"{float(np.median(seconds)) / 1000:,.2f} ms, worst {max(seconds) / 1000:,.2f} ms")
    return {"agree": False, "diffs_us": diffs, "causes": causes,
            "text": f"flightwatch less the peer: {said} (resolution {res / 1000:g} ms); " + "; ".join(causes)}


def compare(fw: dict, peer: dict) -> dict:
    """The row: both sides, the CPU ratio, the agreement."""
    if fw.get("problem") or peer.get("error"):
        return {"flightwatch": fw, "peer": peer, "problem": fw.get("problem") or f"the peer failed: {peer['error']}"}
    a, b = fw.get("cpu_us_per_message"), peer.get("cpu_us_per_message")
    return {"flightwatch": fw, "peer": peer, "cpu_ratio": a / b if a and b else None, "agreement": agreement(fw, peer)}
