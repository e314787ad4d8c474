"""The embedded stack's layout as the settings of a call have it (``Stack``): its folder, every component's port, the
/metrics ports of the processes without a port of their own, the clock's port and the SUT; built once by ``python -m
stack`` (``stack.__main__``) and passed down, read by the benchmarks that drive a stack."""
from __future__ import annotations

import os
from dataclasses import dataclass

from core import settings, suts
from core.procs import JOB_METRICS_PORT, LOADGEN_METRICS_PORT, NODE_METRICS_PORT, pid_from_file
from core.rundir import ROOT
from core.suts import SUTS
from transports.registry import ALL

HOST = "127.0.0.1"
PORT_SETTINGS = {"telemetry-broker": ("FLIGHTWATCH_TELEMETRY_PORT", 19092),
                 **{sut.broker: sut.port for sut in SUTS.values()},
                 "prometheus": ("FLIGHTWATCH_PROMETHEUS_PORT", 19090),
                 "node-exporter": ("FLIGHTWATCH_NODE_EXPORTER_PORT", 19100),
                 "ui": ("FLIGHTWATCH_UI_PORT", 18501), "clock": ("FLIGHTWATCH_CLOCK_PORT", 19123),
                 **{f"{t.receiver}-receiver": t.stack_port for t in ALL if t.stack_port}}
"""Each component's port: its setting (``--telemetry-port`` ..., or the variable) and default."""
STACK_SETTINGS = ("FLIGHTWATCH_STACK_DIR", "FLIGHTWATCH_NO_INSTALL", "FLIGHTWATCH_SUT", "FLIGHTWATCH_SUT_PARTITIONS",
                  "FLIGHTWATCH_SUT_PAIRS", "FLIGHTWATCH_SUT_BINDINGS",
                  *(name for name, _ in PORT_SETTINGS.values()))


def _listen_port(env: str, default: int) -> int:
    port = (settings.get(env) or "").rpartition(":")[2]
    return int(port) if port.isdigit() else default


AGENTS = (*(f"{t.receiver}-receiver" for t in ALL if t.stack_flags is not None and not t.sink), "node-metrics")
"""Components without a port of their own (started after the brokers): the stack's receivers but its sink's, and the
node-metrics agent."""
SUT_COMPONENTS = {name for sut in SUTS.values() for name in (sut.broker, sut.receiver)}
"""Components that run only when their SUT is the stack's (``--sut``)."""


@dataclass(frozen=True)
class Stack:
    """The embedded stack as the settings of this call have it: its folder, the ports of its components, the /metrics
    ports of the processes without a port of their own (where each one's documented HOST:PORT setting puts it, for
    Prometheus' targets), the clock reference's UDP port, and its SUT. Built once in ``main`` and passed down."""

    dir: str
    ports: dict[str, int]
    metrics_ports: dict[str, int]
    clock_port: int
    sut: str

    @classmethod
    def configured(cls, sut: str | None = None) -> Stack:
        """From the settings (flags exported by ``main``, the environment); ``sut`` None: the one a command aims at
        by default (``core.suts.stack_sut``: FLIGHTWATCH_SUT, the one `up --sut` recorded, or tansu)."""
        folder = settings.get("FLIGHTWATCH_STACK_DIR") or os.path.join(ROOT, ".stack")
        ports = {name: int(settings.get(env) or default) for name, (env, default) in PORT_SETTINGS.items()}
        metrics_ports = {
            **{f"{t.receiver}-receiver": _listen_port(*t.metrics_listen) for t in ALL if t.metrics_listen},
            "node-metrics": _listen_port("FLIGHTWATCH_NODE_METRICS_METRICS_LISTEN", NODE_METRICS_PORT),
            # started by `make attack`, not by the stack
            "job": _listen_port("FLIGHTWATCH_JOB_METRICS_LISTEN", JOB_METRICS_PORT),
            "loadgen": _listen_port("FLIGHTWATCH_LOADGEN_METRICS_LISTEN", LOADGEN_METRICS_PORT),
        }
        clock = ports.pop("clock")
        return cls(folder, ports, metrics_ports, clock, sut or suts.stack_sut(folder))

    def components(self) -> tuple[str, ...]:
        return tuple(self.ports) + AGENTS

    def pidfile(self, name: str) -> str:
        return os.path.join(self.dir, f"{name}.pid")

    def recorded_pid(self, name: str) -> int | None:
        """The component's PID if the very process `up` started still runs (its PID, start time and name, as
        recorded); a PID file that names another process now (after a reboot) gives None: nothing is signalled."""
        return pid_from_file(self.pidfile(name))
