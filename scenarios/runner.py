"""Run a scenario's cells one after another on the stack, each a whole flightwatch run, and gather their figures.

Each cell: the SUT broker renewed empty with the cell's broker settings (``python -m stack renew-sut``), then
``python -m loadgen attack --stream`` with the cell's flags, its warm-up and cool-down, under the run ID
``<scenario run>-cNN`` and the series ``<scenario>/<cell>`` (``runs history`` follows each cell across scenario
runs). The attack's own lines pass through as they come, prefixed with the cell; its run folder is a run like any
other (the dashboard shows it live). A cell that fails is recorded with its exit code and the scenario goes on;
Ctrl-C stops at once and keeps the report of the cells done.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np

from core.observer import STACK_DIR
from core.output import State
from core.procs import pid_from_file
from core.rundir import CHECKPOINTS, ROOT, RunPaths
from core.suts import SUTS, default_target, pairs_target, routing_target
from core.units import parse_duration_ns
from scenarios.spec import Scenario
from transports import amqp

SUT_BROKERS = {name: sut.broker for name, sut in SUTS.items()}
"""The stack's component that runs each SUT's broker (its PID file: ``<stack dir>/<component>.pid``)."""
CELL_LIMIT_S = 600.0
"""A cell's attack and its run's close, beyond its schedule and drop timeout, before it is stopped as hung."""


def cell_name(cell: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in cell.items())


def cell_flags(cell: dict, sut: str) -> tuple[dict, list[str]]:
    """What a cell's knobs set (``scenarios.spec.KNOBS``): the stack's environment, and the attack's flags."""
    env, flags = {}, []
    for knob, value in cell.items():
        if knob == "payload":
            flags += ["--payload", str(value)]
        elif knob == "acks":
            flags += ["--kafka-option", f"acks={value}"]
        elif knob == "partitions":
            env["FLIGHTWATCH_SUT_PARTITIONS"] = str(value)
        elif knob == "pairs":
            env["FLIGHTWATCH_SUT_PAIRS"] = str(value)
            flags += ["--target", pairs_target(default_target(sut), value)]
        elif knob == "bindings":
            env["FLIGHTWATCH_SUT_BINDINGS"] = str(value)
            flags += ["--target", routing_target(value)]
        elif knob == "receivers":
            env["FLIGHTWATCH_RECEIVER_WORKERS"] = str(value)
    return env, flags


def attack_command(sc: Scenario, sut: str, cell: dict, run_id: str, flags: list[str]) -> list[str]:
    return [sys.executable, "-m", "loadgen", "attack", "--sut", sut, "--pace", sc.cell_pace(cell), "--run", run_id,
            "--stream",
            "--scenario", f"{sc.name}/{cell_name(cell)}", "--warmup", sc.warmup, "--cooldown", sc.cooldown,
            "--drop-timeout", sc.drop_timeout, *flags, *sc.attack]


def _passthrough(cmd: list[str], env: dict, prefix: str, limit_s: float, log) -> int:
    """Run ``cmd``, its lines said with ``prefix`` as they come; its exit code (124 if it outlived ``limit_s``)."""
    import threading

    proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, **env, "PYTHONPATH": ROOT}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, bufsize=1, start_new_session=True)
    reader = threading.Thread(target=lambda: [log(f"{prefix} {line.rstrip()}") for line in proc.stdout], daemon=True)
    reader.start()
    try:
        try:
            code = proc.wait(limit_s)
        except subprocess.TimeoutExpired:
            log(f"{prefix} still running after {limit_s:.0f} s: stopped")
            os.killpg(proc.pid, 15)
            proc.wait(30)
            code = 124
    except KeyboardInterrupt:
        os.killpg(proc.pid, 2)  # the attack stops its workers and its job itself on SIGINT
        proc.wait(60)
        raise
    reader.join(5)
    return code


def renew(sut: str, env: dict, prefix: str, log) -> None:
    """The SUT broker empty, with the cell's settings; ``RuntimeError`` if the stack could not."""
    code = _passthrough([sys.executable, "-m", "stack", "renew-sut", "--sut", sut], env, prefix, 300.0, log)
    if code != 0:
        raise RuntimeError(f"`python -m stack renew-sut --sut {sut}` failed (exit {code}); see the lines above")


def receivers_attached(receiver: str, count: int, since_ns: int, within_s: float = 120.0) -> int:
    """When the stack's ``receiver`` had attached every pair's link, or bound and consumed every queue (epoch ns),
    waited for: no sender starts before it. ``RuntimeError`` if it has not within ``within_s``."""
    state = os.path.join(STACK_DIR, receiver)
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        a = amqp.read_attached(state)
        if a and a.get("count") == count and a["attached_ns"] and a["attached_ns"] >= since_ns:
            return int(a["attached_ns"])
        time.sleep(0.5)
    raise RuntimeError(f"the stack's {receiver} did not attach its {count:,} links or queues within {within_s:.0f} s "
                       f"(see {STACK_DIR}/{receiver}.log)")


def broker_cost(run_id: str, samples: list, summary: dict) -> dict:
    """The broker's CPU per message, second by second over the run's measured span (``scenarios.routing``)."""
    import pandas as pd

    from scenarios import routing

    paths = RunPaths.of_run(run_id, CHECKPOINTS)
    windows = pd.read_parquet(paths.windows_file, columns=["window_ns", "received"])
    m = summary.get("measured") or {}
    steps = (summary.get("attack") or {}).get("steps") or []
    span = (m["from_ns"], m["to_ns"]) if m else (steps[0]["start_ns"], steps[-1]["end_ns"]) if steps else (0, 2**62)
    costs = routing.cost_per_second(samples, windows, span)
    return {"cpu_us_per_message": float(costs.mean()) if len(costs) else None,
            "cpu_us_per_message_p90": float(np.percentile(costs, 90)) if len(costs) else None,
            "seconds": int(len(costs)), "per_second_us": [round(float(c), 3) for c in costs]}


def pair_figures(run_id: str, cell: dict, drop_timeout: str, summary: dict, receivers_ns: int, lg: dict) -> dict:
    """The cell's pairs: their distribution for the report (each pair's rows in the run folder's ``pairs.json``), and
    when every client was attached against the first send."""
    from scenarios import pairs as pair_stats

    root = RunPaths.of_run(run_id, CHECKPOINTS).root
    f = pair_stats.pair_figures(root, cell["pairs"], parse_duration_ns(drop_timeout), summary)
    with open(os.path.join(root, "pairs.json"), "w") as out:
        json.dump(f.pop("per_pair"), out)
    first = (summary.get("attack") or {}).get("schedule_start_ns")
    senders = (lg.get("client") or {}).get("attached_ns")
    f["attached"] = {"receivers_ns": receivers_ns, "senders_ns": senders, "first_send_ns": first,
                     "before_first_send": bool(first and senders and max(receivers_ns, senders) < first)}
    return f


def limit(steps: list[dict], knee_step: int | None) -> str | None:
    """What stopped the ramp above its ceiling: the first step past the knee the verdict did not call ok (a step
    below the knee that wobbled and recovered is not the limit); None when every step past it was ok."""
    above = [st for st in steps if knee_step is None or st.get("step", 0) > knee_step]
    bad = next((st for st in above if st.get("state") not in (State.OK, None)), None)
    return f"{bad['state']} at {bad['rate']:,.0f}/s" if bad else None


def cell_figures(run_id: str) -> dict:
    """A cell's figures from its run folder: the job's summary and the load generator's report."""
    paths = RunPaths.of_run(run_id, CHECKPOINTS)
    out: dict = {"run_id": run_id}
    try:
        with open(paths.summary_file) as f:
            s = json.load(f)
    except (OSError, ValueError):
        return {**out, "problem": "no summary: the run was not closed (see its job.log)"}
    try:
        with open(paths.loadgen_report()) as f:
            lg = json.load(f)
    except (OSError, ValueError):
        lg = {}
    v = s.get("verdict") or {}
    lat = (s.get("measured") or {}).get("latency_us") or s.get("latency_us") or {}
    knee = v.get("knee") or {}
    knee_step = next((st for st in v.get("steps", []) if st.get("step") == knee.get("step")), {})
    return {**out, "summary": s, "loadgen": lg,
            **{k: s.get(k) for k in ("sent", "received", "dropped", "duplicates", "late", "errors", "unaccounted")},
            "loadgen_sent": lg.get("requests"), "p50_us": lat.get("p50"), "p99_us": lat.get("p99"),
            "max_us": lat.get("max"), "state": v.get("state"), "message": v.get("message"),
            "ceiling_per_s": knee.get("rate"), "delivered_per_s": knee_step.get("received_per_s"),
            "knee_p99_us": knee.get("p99_us"),
            "limit": limit(v.get("steps", []), knee.get("step")),
            "steps": v.get("steps", []), "send_delay_p99_us": (s.get("send_delay_us") or {}).get("p99"),
            "cpu_us_per_event": (lg.get("cpu") or {}).get("us_per_event")}


def stack_receiver(sc: Scenario) -> str:
    """The stack's component that is the scenario's sink: its transport's receiver (``MODE-receiver``)."""
    return f"{sc.sink.receiver}-receiver"


def prepare(sc: Scenario, sut: str, cell: dict, target: str | None, prefix: str, log) -> tuple[list[str], int | None]:
    """The cell's SUT as the cell wants it, every receiver attached: renewed (or the stack's HTTP receiver restarted
    with the cell's processes); the attack's flags, and when the receivers had attached (pairs)."""
    env, flags = cell_flags(cell, sut)
    started = time.time_ns()
    if sc.sink is not None:
        flags += ["--target", target or sc.sink.stack_target()]
        if target is None:
            component = stack_receiver(sc)
            code = _passthrough([sys.executable, "-m", "stack", "restart", component], env, prefix, 120.0, log)
            if code != 0:
                raise RuntimeError(f"`python -m stack restart {component}` failed (exit {code}); see the lines above")
        elif "receivers" in cell:
            log(f"{prefix} receivers={cell['receivers']} sets the stack's {stack_receiver(sc)} only: at {target}, the "
                "receivers are your broker's subscribers")
        return flags, None
    renew(sut, env, prefix, log)
    if "bindings" in cell:
        receivers_attached("amqp-receiver", cell["bindings"], started)
        log(f"{prefix} the receiver bound and consumes all {cell['bindings']:,} queues")
    if "pairs" in cell:
        attached = receivers_attached("amqp1-receiver", cell["pairs"], started)
        log(f"{prefix} the receiver attached all {cell['pairs']:,} links; the senders attach theirs next")
        return flags, attached
    return flags, None


LOADGEN_PAYLOAD = 2048
"""The attack's payload when a scenario sets none (``loadgen attack --payload``'s default): the peer sends the same."""


def peer_flags(sc: Scenario, sut: str, cell: dict, out: str) -> list[str]:
    """``python -m stack.peers``' flags for a cell: its rate, payload and broker settings."""
    payload = cell.get("payload") or next((sc.attack[i + 1] for i, f in enumerate(sc.attack[:-1]) if f == "--payload"),
                                          LOADGEN_PAYLOAD)
    flags = ["--sut", sut, "--rate", str(sc.peer_rate_of(cell)), "--seconds", str(sc.peer_seconds), "--payload",
             str(payload), "--warmup", str(max(1, round(parse_duration_ns(sc.warmup) / 1e9))), "--json", out]
    for knob in ("acks", "partitions", "pairs", "bindings"):
        if knob in cell:
            flags += [f"--{knob}", str(cell[knob])]
    return flags


def run_peer(sc: Scenario, sut: str, cell: dict, run_id: str, summary: dict, lg: dict,
             receiver_cpu_s: float | None, prefix: str, log) -> dict:
    """The broker's own tool after the cell, at its rate (``scenarios.peers``): the row of both."""
    from scenarios import peers

    root = RunPaths.of_run(run_id, CHECKPOINTS).root
    out = os.path.join(root, "peer.json")
    log(f"{prefix} the broker's own tool at {sc.peer_rate_of(cell):,}/s for {sc.peer_seconds} s ...")
    code = _passthrough([sys.executable, "-m", "stack.peers", *peer_flags(sc, sut, cell, out)], {}, f"{prefix} [peer]",
                        sc.peer_seconds + CELL_LIMIT_S, log)
    try:
        with open(out) as f:
            peer = json.load(f)
    except (OSError, ValueError):
        peer = {"error": f"`python -m stack.peers` wrote no figures (exit {code}); see the lines above"}
    fw = peers.ours(root, summary, lg or {}, sc.peer_rate_of(cell), parse_duration_ns(sc.drop_timeout),
                    receiver_cpu_s, bool(peer.get("with_consumer")))
    row = peers.compare(fw, peer)
    log(f"{prefix} [peer] " + (row.get("problem") or row["agreement"]["text"]))
    return row


def receiver_cpu(sut: str) -> float | None:
    """The stack's receiver of ``sut``: its process tree's CPU seconds so far (None: not running)."""
    from core.observer import tree_cpu_s

    pid = pid_from_file(os.path.join(STACK_DIR, f"{SUTS[sut].receiver}.pid"))
    return tree_cpu_s(pid) if pid else None


def run_cell(sc: Scenario, sut: str, cell: dict, run_id: str, target: str | None, prefix: str, log,
             peer: bool = False) -> dict:
    """One cell: its SUT prepared, its attack and run, its figures (with the scenario kind's own; with ``peer``,
    the broker's own tool's beside them)."""
    started = time.time_ns()
    flags, receivers_ns = prepare(sc, sut, cell, target, prefix, log)
    sampler = None
    if sc.kind == "routing":
        from scenarios.routing import CpuSampler

        pid = pid_from_file(os.path.join(STACK_DIR, f"{SUT_BROKERS[sut]}.pid"))
        sampler = CpuSampler(pid) if pid else None
    limit_s = sc.schedule().duration_ns / 1e9 + CELL_LIMIT_S
    cpu0 = receiver_cpu(sut) if peer else None
    code = _passthrough(attack_command(sc, sut, cell, run_id, flags), {}, prefix, limit_s, log)
    cpu1 = receiver_cpu(sut) if peer else None
    samples = sampler.stop() if sampler is not None else None
    figures = {"cell": cell, "exit": code, "started_ns": started, **cell_figures(run_id)}
    summary, lg = figures.pop("summary", None), figures.pop("loadgen", None)
    if summary is None:
        return figures
    if "pairs" in cell:
        figures["pairs"] = pair_figures(run_id, cell, sc.drop_timeout, summary, receivers_ns, lg)
    if samples is not None:
        figures["broker"] = broker_cost(run_id, samples, summary)
    if sc.kind == "bursts":
        from scenarios.bursts import burst_figures

        figures["bursts"] = burst_figures(RunPaths.of_run(run_id, CHECKPOINTS).root,
                                          (summary.get("attack") or {}).get("steps") or [])
    if peer:
        used = cpu1 - cpu0 if cpu0 is not None and cpu1 is not None else None
        figures["peer"] = run_peer(sc, sut, cell, run_id, summary, lg, used, prefix, log)
    return figures


def run(sc: Scenario, sut: str, scenario_run: str, log=print, on_cell=None, target: str | None = None,
        peer: bool = False) -> list[dict]:
    """Every cell of ``sc`` on ``sut`` (or at ``target``, for a scenario of the HTTP receiver); their figures in
    order. ``on_cell(cells_so_far)`` after each (the report is written as the scenario goes); ``peer``: each cell
    followed by the broker's own tool (``scenarios.peers``)."""
    cells = sc.cells()
    out: list[dict] = []
    try:
        for k, cell in enumerate(cells, 1):
            run_id = f"{scenario_run}-c{k:02d}"
            prefix = f"[{k}/{len(cells)} {cell_name(cell)}]"
            where = target or (f"the stack's {stack_receiver(sc)}" if sc.sink is not None else f"{sut}, renewed")
            log(f"{prefix} run {run_id}: {where}, then {sc.cell_pace(cell)} ...")
            figures = run_cell(sc, sut, cell, run_id, target, prefix, log, peer)
            out.append(figures)
            log(f"{prefix} done: {one_line(figures)}")
            if on_cell is not None:
                on_cell(out)
    finally:
        restore(sc, sut, target, log)
    return out


def restore(sc: Scenario, sut: str, target: str | None, log) -> None:
    """The stack as the user's settings have it again: the receiver a cell reshaped (5 HTTP processes, 1,000 links
    or queues) started afresh without the cell's settings, so an idle stack does not keep them."""
    if not any(k in sc.axes for k in ("receivers", "pairs", "bindings")) or (sc.sink is not None and target):
        return
    cmd = ["restart", stack_receiver(sc)] if sc.sink is not None else ["renew-sut", "--sut", sut]
    code = _passthrough([sys.executable, "-m", "stack", *cmd], {}, "[restore]", 300.0, lambda line: None)
    log(f"the stack's receiver is as before the scenario again (`python -m stack {' '.join(cmd)}`: exit {code})")


def one_line(f: dict) -> str:
    if f.get("problem"):
        return f"exit {f['exit']}: {f['problem']}"
    ceiling = f"{f['ceiling_per_s']:,.0f}/s" if f.get("ceiling_per_s") else "below the first step"
    p99 = f"{f['p99_us'] / 1000:,.2f} ms" if f.get("p99_us") is not None else "-"
    return (f"sent {f['sent']:,} received {f['received']:,} dropped {f['dropped']:,}; p99 {p99}; ceiling {ceiling}"
            + (f" ({f['limit']})" if f.get("limit") else "") + f"; {f['state']}")
