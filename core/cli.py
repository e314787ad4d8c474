"""Command-line helpers shared by every command: a bad flag is one line on stderr and exit code 2."""
from __future__ import annotations

import argparse
import sys

from core import settings
from core.procs import DEFAULT_WAIT, WAIT_ENV, servers_unreachable, wait_for
from core.units import one_line, parse_duration_ns, split_host_port


class OneLineParser(argparse.ArgumentParser):
    """argparse, but an error is one line (``prog: error: ...``), without the usage block, and exit code 2;
    ``--help`` still shows everything. Its subparsers are of this class too."""

    def error(self, message: str):
        print(f"{self.prog}: error: {one_line(message)}", file=sys.stderr)
        sys.exit(2)


def bootstrap_arg(text: str) -> str:
    """An argparse ``type``: Kafka bootstrap servers, ``HOST:PORT[,HOST:PORT...]``."""
    try:
        for server in str(text).split(","):
            split_host_port(server, "bootstrap server", "127.0.0.1:19092")
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def add_wait(p: argparse.ArgumentParser, what: str) -> None:
    """``--wait DURATION``: how long a starting process waits for ``what`` (env FLIGHTWATCH_WAIT, default 10m)."""
    settings.add(p, WAIT_ENV, "--wait", default=DEFAULT_WAIT, metavar="DURATION",
                 help=f"wait this long for {what} to be reachable, trying again with backoff and saying what it "
                      f"waits for, before giving up with exit 2 (0s: fail at once)")


def add_telemetry(p: argparse.ArgumentParser, agent: str | None) -> None:
    """A writer's telemetry flags: the broker, the topic, and (``agent``: its default) its name in its records; and
    every long-lived component's (``settings.add_process_wide``). The load generator names its senders itself (None)."""
    from core.procs import telemetry_bootstrap

    settings.add(p, "FLIGHTWATCH_BOOTSTRAP", "--telemetry-bootstrap", default=telemetry_bootstrap(), type=bootstrap_arg,
                 help="telemetry Kafka bootstrap")
    settings.add(p, "FLIGHTWATCH_TOPIC", "--telemetry-topic", default="flightwatch.telemetry", help="the telemetry topic")
    if agent is not None:
        settings.add(p, "FLIGHTWATCH_AGENT", "--agent", default=agent,
                     help="this agent's name in its records, unique per agent (on Kubernetes the pod's name)")
    settings.add_process_wide(p)


def add_clock_reference(p: argparse.ArgumentParser) -> None:
    """``--clock-reference HOST:PORT``: where a component measures its host's clock offset (``core.clock``)."""
    from core.clock import DEFAULT_REFERENCE

    settings.add(p, "FLIGHTWATCH_CLOCK_REFERENCE", "--clock-reference", default=DEFAULT_REFERENCE, metavar="HOST:PORT",
                 help="clock reference to estimate this host's clock offset against ('none' to skip)")


def add_memory_trace(p) -> None:
    """``--memory-trace DIR``: tracemalloc reports of a process' growth (``core.memory.trace_from_env``)."""
    settings.add(p, "FLIGHTWATCH_MEMORY_TRACE", "--memory-trace", metavar="DIR",
                 help="trace Python allocations and report the lines that grew, every minute, to DIR (a diagnosis aid)")


def wait_for_servers(checks: dict, wait: str, log, hints: dict | None = None) -> str | None:
    """Wait up to ``wait`` (a ``--wait`` value) for every check (``core.procs.wait_for``). None once all pass, else
    the one-line error: what is still unreachable, why, and ``hints[what]`` when given. A bad duration: ValueError."""
    try:
        bound_s = parse_duration_ns(wait) / 1e9
    except ValueError as e:
        raise ValueError(f"--wait: {e}") from None
    failing = wait_for(checks, bound_s, log=log)
    if failing is None:
        return None
    what, why = failing
    return f"{what} unreachable: {why}{(hints or {}).get(what, '')}" + (f", after waiting {wait}" if bound_s else "")


def await_brokers(prog: str, brokers: dict, wait: str) -> bool:
    """An agent's start: wait (``--wait``) for each of ``brokers`` (name -> bootstrap servers), saying so on stdout.
    False, with the one-line error on stderr, when one is still unreachable at the bound or ``wait`` is bad."""
    from core.slices import setting_problem

    problem = setting_problem(brokers["telemetry"]) if "telemetry" in brokers else None
    if problem:
        print(f"{prog}: error: {problem}", file=sys.stderr)
        return False
    try:
        problem = wait_for_servers({f"the {name} broker {servers}": (lambda s=servers: servers_unreachable(s))
                                    for name, servers in brokers.items()}, wait, lambda line: print(f"{prog}: {line}", flush=True))
    except ValueError as e:
        problem = str(e)
    if problem:
        print(f"{prog}: error: {problem}", file=sys.stderr)
    return problem is None
