"""Process and port helpers: every server here listens on loopback, every process is stopped by its PID."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time

HOST = "127.0.0.1"
JOB_METRICS_PORT = 19401
KAFKA_RECEIVER_METRICS_PORT = 19402
NODE_METRICS_PORT = 19403
LOADGEN_METRICS_PORT = 19404
"""Where each long-running process serves ``/metrics`` by default (the HTTP receiver serves it on its own port)."""
"""Where a streaming job serves its live figures for Prometheus by default (``streaming.metrics``)."""


def port_open(port: int, host: str = HOST) -> bool:
    try:
        socket.create_connection((host, port), timeout=0.5).close()
        return True
    except OSError:
        return False


def wait_port(port: int, seconds: float = 15.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if port_open(port):
            return True
        time.sleep(0.1)
    return False


def stop_process(proc, sig: int = signal.SIGTERM, wait_s: float = 10.0, group: bool = False) -> None:
    """Stop a process we started, by its PID: ``sig``, then SIGKILL (its whole group if ``group``) after ``wait_s``."""
    if proc.poll() is not None:
        return
    os.kill(proc.pid, sig)
    try:
        proc.wait(wait_s)
    except subprocess.TimeoutExpired:
        (os.killpg if group else os.kill)(proc.pid, signal.SIGKILL)
        proc.wait()


def free_port() -> int:
    """A loopback port nothing listens on right now."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]
