"""A scenario's report, in the shape of its seed's: ``report.json`` (every cell's figures, for the dashboard and for
a later comparison) and ``report.md`` (the tables, as the benchmarks pages quote them), in ``checkpoints/<scenario run>/``.

    matrix   one table per figure, rows by one axis, columns by the others (the Event Streams report's size x acks
             tables): the throughput ceiling (the highest step's rate the saturation verdict still called ok: the
             open model's answer, not a closed loop's best burst) and the flight p99 over the measured span; then
             every cell in full
"""
from __future__ import annotations

import itertools
import json
import os
import time

from scenarios.spec import Scenario

REPORT_JSON, REPORT_MD = "report.json", "report.md"


def document(sc: Scenario, sut: str, scenario_run: str, cells: list[dict], started_ns: int, finished: bool) -> dict:
    return {"scenario": sc.name, "run": scenario_run, "title": sc.title, "seed": sc.seed, "method": sc.method,
            "kind": sc.kind, "sut": sut, "form": "short" if sc.short else "full", "started_ns": started_ns,
            "finished": finished, "settings": {"pace": sc.pace, "warmup": sc.warmup, "cooldown": sc.cooldown,
                                               "drop_timeout": sc.drop_timeout, "axes": sc.axes,
                                               "attack": list(sc.attack)},
            "rows": sc.rows, "columns": list(sc.columns), "cells": cells}


def write(folder: str, doc: dict) -> None:
    """Both files, each replaced whole (a reader never sees half of one)."""
    os.makedirs(folder, exist_ok=True)
    for name, text in ((REPORT_JSON, json.dumps(doc, indent=1, default=str)), (REPORT_MD, markdown(doc))):
        tmp = os.path.join(folder, f".{name}.tmp")
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, os.path.join(folder, name))


def _ms(us) -> str:
    return "-" if us is None else f"{us / 1000:,.2f} ms"


def _rate(x) -> str:
    return "-" if x is None else f"{x:,.0f}/s"


def _value(axis: str, v) -> str:
    return f"{v:,} B" if axis == "payload" else f"{v} partition{'s' if v != 1 else ''}" if axis == "partitions" \
        else f"{axis}={v}"


def matrix_table(doc: dict, figure: str, fmt) -> list[str]:
    """One figure of every cell: a row per value of the row axis, a column per combination of the column axes."""
    rows, cols, axes = doc["rows"], doc["columns"], doc["settings"]["axes"]
    combos = list(itertools.product(*(axes[c] for c in cols))) if cols else [()]
    by_cell = {tuple(c["cell"].get(a) for a in [rows, *cols]): c for c in doc["cells"]}
    head = [rows] + [", ".join(_value(a, v) for a, v in zip(cols, combo)) or figure for combo in combos]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in axes[rows]:
        line = [_value(rows, r)]
        for combo in combos:
            c = by_cell.get((r, *combo))
            line.append("not run" if c is None else "failed" if c.get("problem") else fmt(c))
        out.append("| " + " | ".join(line) + " |")
    return out


def _ceiling(c: dict) -> str:
    text = _rate(c.get("ceiling_per_s")) if c.get("ceiling_per_s") else "below the first step"
    return text + ("" if c.get("limit") else " (every step ok: the ceiling is higher)")


def _clock(ns) -> str:
    return "-" if not ns else time.strftime("%H:%M:%S", time.gmtime(ns / 1e9)) + f".{int(ns % 10**9) // 10**6:03d}"


def attached_text(c: dict) -> str:
    a = (c.get("pairs") or {}).get("attached") or {}
    if not a.get("first_send_ns"):
        return "-"
    if not a.get("before_first_send"):  # the runner set it only with both attach times before the first send
        return f"**no**: receivers {_clock(a.get('receivers_ns'))}, senders {_clock(a.get('senders_ns'))}, first send " \
               f"{_clock(a['first_send_ns'])}"
    last = max(a["receivers_ns"], a["senders_ns"])
    return f"yes, {(a['first_send_ns'] - last) / 1e9:.1f} s before the first send"


def _cpu(c: dict) -> str:
    cpu = c.get("cpu_us_per_event")
    return "-" if cpu is None else f"{cpu:.1f}"


def _verdict(c: dict) -> str:
    """The cell's verdict, safe inside a Markdown table."""
    return (c.get("message") or "").replace("|", "/")


SCHEDULE_KEPT_US = 10_000
"""A pair's schedule is kept when its sends' delay p99 is at most 10 ms (the issue's bound at 1,000 pairs x 10/s)."""


def schedule_text(p: dict) -> str:
    """Whether the senders kept every pair's schedule: the worst pair's send delay p99 against ``SCHEDULE_KEPT_US``;
    past it, the load generator was the limit on this machine, whatever the SUT did."""
    worst = p.get("send_delay_p99_worst_us")
    if worst is None:
        return "-"
    if worst <= SCHEDULE_KEPT_US:
        return f"kept (send delay p99 ≤ {_ms(worst)})"
    return f"**not kept: loadgen-bound**, send delay p99 up to {_ms(worst)} (> {_ms(SCHEDULE_KEPT_US)})"


def _misrouted(p: dict) -> str:
    """Beside a cell's lost: the events received on another pair's address, when there were any."""
    return f"; **{p['misrouted']:,} misrouted**" if p.get("misrouted") else ""


def pairs_table(doc: dict) -> list[str]:
    """The Dispatch Router tests' table: a row per number of pairs, the pooled flight time beside the pairs' spread."""
    out = ["| pairs | every link attached before the first send | sent | received | lost | late | mean | p50 | p99 | "
           "pairs' p99: median | p99 of pairs' p99s | worst pair (p99) | each pair's schedule | loadgen µs/event | "
           "verdict |", "|" + "---|" * 15]
    for c in doc["cells"]:
        n = c["cell"].get("pairs")
        if c.get("problem") or not c.get("pairs"):
            out.append(f"| {n:,} | exit {c['exit']}: {c.get('problem') or 'no pair figures'} |" + " |" * 13)
            continue
        p = c["pairs"]
        out.append(f"| {n:,} | {attached_text(c)} | {c['sent']:,} | {c['received']:,} | {p['lost']:,} "
                   f"({p['pairs_with_loss']} pairs){_misrouted(p)} | {c['late']:,} | {_ms(p.get('mean_us'))} | {_ms(c.get('p50_us'))} | "
                   f"{_ms(c.get('p99_us'))} | {_ms(p['pair_p99_median_us'])} | {_ms(p['pair_p99_p99_us'])} | "
                   f"#{p['worst_pair']} ({_ms(p['worst_pair_p99_us'])}) | {schedule_text(p)} | "
                   f"{_cpu(c)} | {_verdict(c)} |")
    notes = [f"- {c['cell']['pairs']:,} pairs: the pairs' sums disagree with the job's: {'; '.join(c['pairs']['disagreements'])}"
             for c in doc["cells"] if (c.get("pairs") or {}).get("disagreements")]
    return out + ([""] + notes if notes else [])


def routing_slope(doc: dict) -> dict:
    """The fitted growth of the broker's CPU per message across the cells, and its verdict (``scenarios.routing``)."""
    import numpy as np

    from scenarios import routing

    cells = [c for c in doc["cells"] if (c.get("broker") or {}).get("seconds")]
    return routing.slope([c["cell"]["bindings"] for c in cells],
                         [np.array(c["broker"]["per_second_us"]) for c in cells])


def routing_table(doc: dict) -> list[str]:
    """The RabbitMQ post's table: a row per number of bindings, the flight time and the broker's cost per message."""
    from scenarios import routing

    out = ["| bindings (queues) | sent | received | lost | p50 | p99 | broker CPU per message (mean, p90 of the seconds) "
           "| seconds measured | loadgen µs/event | verdict |", "|" + "---|" * 10]
    for c in doc["cells"]:
        if c.get("problem"):
            out.append(f"| {c['cell']['bindings']:,} | exit {c['exit']}: {c['problem']} |" + " |" * 8)
            continue
        b = c.get("broker") or {}
        cost = (f"{b['cpu_us_per_message']:,.1f} µs, {b['cpu_us_per_message_p90']:,.1f} µs"
                if b.get("cpu_us_per_message") is not None else "not measured")
        out.append(f"| {c['cell']['bindings']:,} | {c['sent']:,} | {c['received']:,} | "
                   f"{c['sent'] - c['received'] - c['late']:,} | {_ms(c.get('p50_us'))} | {_ms(c.get('p99_us'))} | "
                   f"{cost} | {b.get('seconds', 0)} | {_cpu(c)} | {_verdict(c)} |")
    return out + ["", "**Routing cost: " + routing.verdict_text(routing_slope(doc)) + "**"]


def _s(x) -> str:
    return "-" if x is None else f"{x * 1000:,.0f} ms" if x < 1 else f"{x:,.2f} s"


def bursts_table(doc: dict) -> list[str]:
    """The Knative report's figures: a row per number of receivers, the sustained flight time beside each burst's,
    the recovery after each burst, and each receiver's throughput."""
    out = ["| receivers | sent | received | sustained p50 / p99 | each burst: rate, p99, recovery | throughput of each "
           "receiver | verdict |", "|" + "---|" * 7]
    for c in doc["cells"]:
        n = c["cell"].get("receivers", "-")
        b = c.get("bursts")
        if c.get("problem") or not b:
            out.append(f"| {n} | exit {c['exit']}: {c.get('problem') or 'no burst figures'} |" + " |" * 5)
            continue
        bursts = "; ".join(
            f"{x['rate']:,.0f}/s: p99 {_ms(x['p99_us'])}, recovered in " + (
                _s(x["recovery_s"]) if x["recovery_s"] is not None else f"**never** ({x['unreceived']:,} unreceived)")
            for x in b["bursts"]) or "none"
        spread = ", ".join(f"{a.rsplit('-', 1)[-1] if a.startswith('receiver-http-') else a}: {r['per_s']:,.0f}/s"
                           for a, r in sorted(b["receivers"].items()) if r["per_s"] is not None) or "-"
        sus = b["sustained"]
        out.append(f"| {n} | {c['sent']:,} | {c['received']:,} | {_ms(sus['p50_us'])} / {_ms(sus['p99_us'])} | "
                   f"{bursts} | {spread} | {_verdict(c)} |")
    return out


def _pair(a, b, fmt) -> str:
    return f"{fmt(a)} / {fmt(b)}"


def peers_table(doc: dict) -> list[str]:
    """Each cell beside the broker's own tool at the same rate (``scenarios.peers``): flightwatch / the peer."""
    cpu = lambda x: "-" if x is None else f"{x:,.1f}"
    out = ["| cell | the peer's tool | rate | throughput | p50 | p99 | p99.9 | CPU µs/message (what it counts) | "
           "CPU ratio | the peer's model, resolution | agreement |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in doc["cells"]:
        row = c.get("peer")
        if not row:
            continue
        name = ", ".join(f"{k}={v}" for k, v in c["cell"].items())
        fw, pe = row["flightwatch"], row["peer"]
        ratio = "-" if row.get("cpu_ratio") is None else f"{row['cpu_ratio']:.2f}x"
        if row.get("problem"):
            out.append(f"| {name} | {pe.get('tool', '-')} | | {row['problem']} |" + " |" * 7)
            continue
        out.append(f"| {name} | {pe['tool']} | {pe['rate']:,}/s | {_pair(fw['throughput_per_s'], pe['throughput_per_s'], _rate)}"
                   f" | {_pair(fw['p50_us'], pe.get('p50_us'), _ms)} | {_pair(fw['p99_us'], pe.get('p99_us'), _ms)} | "
                   f"{_pair(fw['p999_us'], pe.get('p999_us'), _ms)} | {_pair(fw['cpu_us_per_message'], pe['cpu_us_per_message'], cpu)}"
                   f" ({fw['cpu_of']} / {pe['cpu_of']}) | "
                   f"{ratio} | "
                   f"{pe['model']}; {pe['resolution_us'] / 1000:g} ms | {row['agreement']['text']} |")
    return out


def markdown(doc: dict) -> str:
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(doc["started_ns"] / 1e9))
    s = doc["settings"]
    lines = [f"# {doc['title']}: {doc['scenario']} on {doc['sut']}", "",
             f"Scenario run `{doc['run']}`, {when}, {doc['form']} form" + ("" if doc["finished"] else
                                                                            " (**not finished**: the cells so far)"),
             "", f"Method (after the {doc['seed']}): {doc['method']}", "",
             f"Every cell: pace `{s['pace']}`, warm-up {s['warmup']} and cool-down {s['cooldown']} left out of its "
             f"latency figures, drop timeout {s['drop_timeout']}" + (f", `{' '.join(s['attack'])}`" if s["attack"]
                                                                       else "") + ".", ""]
    if doc["kind"] == "matrix":
        lines += ["## Throughput ceiling (the highest step's rate the saturation verdict called ok)", "",
                  *matrix_table(doc, "ceiling", _ceiling), "", "## Flight time p99 (measured span)", "",
                  *matrix_table(doc, "p99", lambda c: _ms(c.get("p99_us"))), ""]
    if doc["kind"] == "pairs":
        lines += ["## Flight time against pairs (each pair on its own address; pooled, and across the pairs)", "",
                  *pairs_table(doc), "", "Each pair's own figures: `pairs.json` in its run's folder.", ""]
    if doc["kind"] == "bursts":
        lines += ["## Bursts: flight time, recovery, and the throughput of each receiver", "",
                  "A burst's recovery is the time from its end until the last event sent in it was received.", "",
                  *bursts_table(doc), ""]
    if doc["kind"] == "routing":
        lines += ["## Flight time and the broker's CPU per message against bindings", "", *routing_table(doc), ""]
    if any(c.get("peer") for c in doc["cells"]):
        lines += ["## Beside the broker's own tool (flightwatch / the peer, at the same rate, one after the other)", "",
                  "flightwatch's figures are the sends of the steps at the peer's rate inside the measured span; the "
                  "peer's are its own, as it prints them. CPU ratio: flightwatch's CPU per message over the peer's.",
                  "", *peers_table(doc), ""]
    lines += ["## Every cell", "", "| cell | run | sent | received | dropped | errors | p50 | p99 | ceiling | beyond it |"
              " loadgen µs/event | verdict |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in doc["cells"]:
        name = ", ".join(f"{k}={v}" for k, v in c["cell"].items())
        if c.get("problem"):
            lines.append(f"| {name} | `{c['run_id']}` | exit {c['exit']}: {c['problem']} |" + " |" * 9)
            continue
        lines.append(f"| {name} | `{c['run_id']}` | {c['sent']:,} | {c['received']:,} | {c['dropped']:,} | "
                     f"{c['errors']:,} | {_ms(c.get('p50_us'))} | {_ms(c.get('p99_us'))} | {_rate(c.get('ceiling_per_s'))} | "
                     f"{c.get('limit') or 'every step ok'} | {_cpu(c)} | {_verdict(c)} |")
    return "\n".join(lines) + "\n"
