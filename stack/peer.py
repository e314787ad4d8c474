"""What every broker's own load tool shares (``stack.peers`` runs them): its descriptor (``Peer``, kept in its
broker's module and named by the broker's ``stack.brokers.Broker.peer``), how its per-second lines are read and its
CPU per message measured (``measure``), and its percentiles as the reports give them."""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass

from core.observer import tree_cpu_s
from core.rundir import ROOT

SKIP_LINES = 3
PREFIX = "flightwatch.peer"
"""The topics, addresses and queues the peers use: never the SUT's own."""

GENERATOR_LINE = re.compile(r"^\s*\d+s\s+sent\s+([\d,]+)/s")
"""The load generator's line a second -> what it sent in that second (each tool's: its ``Peer.line``)."""


@dataclass(frozen=True)
class Peer:
    """A broker's own load tool, as its users run it, for figures to set beside flightwatch's."""

    tool: str
    """Its name and version, as the reports print it."""
    speaks: str
    """The URL scheme of the transport it sends over (a SUT it runs against is addressed so)."""
    line: re.Pattern
    """Its line a second -> what it sent in that second (``measure``)."""
    fetch: Callable[[], str]
    """Its jars' folder (Artemis: its home), fetched if need be; ``RuntimeError`` saying what failed."""
    run: Callable[[str, int, argparse.Namespace, Callable], dict]
    """Its run beside a cell (``python -m stack.peers``): given the folder, the broker's port, the flags and a log."""
    producer: Callable[[str, int, str, int, float, int], list[str]]
    """Its producer alone (``bench.transports``): its command given the folder, port, queue, rate (0: unbounded),
    seconds and payload."""
    with_consumer: bool
    """Its one process also consumes: its CPU per message is set beside flightwatch's generator's and receiver's."""
    causes: tuple[str, ...] = ()
    """Why its figures are known to differ from flightwatch's (``scenarios.peers.agreement``)."""


def measure(cmd: list[str], pattern: re.Pattern, seconds: float, env: dict | None = None, log=None) -> dict:
    """Run ``cmd`` (stopped after ``seconds`` + 60 at most, by its PID); read its per-second lines as they come, the
    CPU of its processes at each: {events_per_s, us_per_event, lines, output} over the lines kept, or {error,
    output}. ``log(line)`` sees every line as it comes."""
    from core.procs import stop_session

    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                            env=env or os.environ, start_new_session=True)
    samples: list[tuple[float, int]] = []  # (CPU s at the line, events sent in its second)
    output: list[str] = []

    def read() -> None:
        for line in proc.stdout:
            m = pattern.search(line)
            if m:
                samples.append((tree_cpu_s(proc.pid) or 0.0, int(m.group(1).replace(",", ""))))
            if len(output) < 20_000:
                output.append(line.rstrip("\n"))
            if log is not None:
                log(line.rstrip())
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        proc.wait(seconds + 60)
    except subprocess.TimeoutExpired:
        pass
    finally:
        stop_session(proc.pid, wait_s=5)
        reader.join(5)
    kept = samples[SKIP_LINES:-1]
    if len(kept) < 3:
        return {"error": f"{len(samples)} lines a second: " + "\n".join(output[-5:]).strip()[-300:], "output": output}
    events = sum(n for _, n in kept[1:])
    if not events:
        return {"error": f"sent nothing in the seconds measured, after {[n for _, n in samples[:SKIP_LINES + 1]]} in "
                         f"its first: {' '.join(cmd[:4])} ...", "output": output}
    cpu = kept[-1][0] - kept[0][0]
    return {"events_per_s": statistics.median(n for _, n in kept[1:]), "us_per_event": cpu * 1e6 / events,
            "lines": len(kept), "output": output}


def pct(values: dict, p50, p99, p999, scale: float) -> dict:
    get = lambda k: None if k is None or values.get(k) is None else float(values[k]) * scale
    return {"p50_us": get(p50), "p99_us": get(p99), "p999_us": get(p999)}
