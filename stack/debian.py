"""Debian packages the stack installs when it runs as root and finds them missing (``--no-install``,
FLIGHTWATCH_NO_INSTALL: never): Prometheus, the node exporter, RabbitMQ."""
from __future__ import annotations

import os
import shutil
import subprocess

from core import settings
from stack import rabbitmq

PACKAGES = {"prometheus": "prometheus", "prometheus-node-exporter": "prometheus-node-exporter"}
"""Binary -> the package that brings it."""
POLICY_RC = "/usr/sbin/policy-rc.d"


def _may_install() -> bool:
    return os.geteuid() == 0 and not settings.get("FLIGHTWATCH_NO_INSTALL")


def ensure(binary: str) -> str | None:
    """The binary's path, its package installed first if it is missing and the stack may."""
    found = shutil.which(binary)
    if found or not _may_install():
        return found
    install(PACKAGES[binary])
    return shutil.which(binary)


def ensure_rabbitmq() -> bool:
    if not rabbitmq.installed() and _may_install():
        install("rabbitmq-server")
    return rabbitmq.installed()


def install(package: str) -> None:
    """Install a Debian package, with a ``policy-rc.d`` that keeps its service from starting (the stack starts it,
    on its own ports) while it installs, when none is there."""
    print(f"installing {package} (Debian package) ...", flush=True)
    ours = not os.path.exists(POLICY_RC)
    if ours:
        with open(POLICY_RC, "w") as f:
            f.write("#!/bin/sh\nexit 101\n")
        os.chmod(POLICY_RC, 0o755)
    try:
        subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends", package],
                       env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"), stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, check=False)
    finally:
        if ours:
            os.remove(POLICY_RC)
