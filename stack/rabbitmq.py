"""A RabbitMQ broker (Debian's rabbitmq-server 3.10) on loopback, with its AMQP 1.0 plugin: a SUT of the stack's
(``make up SUT=rabbitmq``) and the tests'.

It runs in the foreground as root without systemd, in a session of its own, with everything under one folder: its
Erlang cookie (``HOME``), Mnesia, logs, config and plugins file. Its own epmd runs in that session on a port of its
own, bound to loopback, so nothing of it listens on every interface and nothing outlives it; stop it by signalling the
session's group (``stop_rabbitmq``), which the server's script turns into a clean stop.

    proc = start_rabbitmq(amqp_port, folder)   # waits until AMQP is served
    stop_rabbitmq(proc.pid)
"""
from __future__ import annotations

import os
import shutil
import subprocess

from core.procs import HOST, start_server, stop_session

SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"
"""The server's own script: the one in /usr/sbin switches to the rabbitmq user and its home."""
EPMD = "epmd"
START_S = 60.0
"""Seconds a start may take (about 10 here, more on a busy machine)."""
INSTALL_HINT = ("RabbitMQ is not installed: apt-get install rabbitmq-server (with a policy-rc.d that exits 101, so "
                "that the package does not start its own service)")


def installed() -> bool:
    return os.access(SERVER, os.X_OK) and shutil.which(EPMD) is not None


def ports(amqp_port: int) -> dict[str, int]:
    """The broker's three ports from its AMQP port: Erlang distribution and epmd on the two above it."""
    return {"amqp": amqp_port, "dist": amqp_port + 1, "epmd": amqp_port + 2}


def environment(amqp_port: int, folder: str) -> dict[str, str]:
    """The server's settings as RabbitMQ's ``RABBITMQ_*`` and Erlang's variables, and its files written in ``folder``."""
    p = ports(amqp_port)
    home = os.path.join(folder, "home")
    os.makedirs(home, exist_ok=True)
    plugins = os.path.join(folder, "enabled_plugins")
    with open(plugins, "w") as f:
        f.write("[rabbitmq_amqp1_0].\n")  # AMQP 1.0 on the same port (the rabbitmq-amqp1 SUT)
    conf = os.path.join(folder, "rabbitmq.conf")
    with open(conf, "w") as f:
        f.write(f"listeners.tcp.1 = {HOST}:{amqp_port}\n"
                "loopback_users = none\n"            # it listens on loopback only anyway
                "log.console = true\nlog.console.level = warning\nlog.file = false\n")
    return dict(os.environ, HOME=home, RABBITMQ_NODENAME="fw@localhost", RABBITMQ_NODE_IP_ADDRESS=HOST,
                RABBITMQ_NODE_PORT=str(amqp_port), RABBITMQ_DIST_PORT=str(p["dist"]), ERL_EPMD_PORT=str(p["epmd"]),
                ERL_EPMD_ADDRESS=HOST, RABBITMQ_MNESIA_BASE=os.path.join(folder, "mnesia"),
                RABBITMQ_LOG_BASE=os.path.join(folder, "log"), RABBITMQ_ENABLED_PLUGINS_FILE=plugins,
                RABBITMQ_CONFIG_FILE=conf,
                RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}")


def command() -> list[str]:
    """epmd on the broker's own port in the foreground (so the broker starts none as a daemon), then the server, under
    one shell that stays (the PID recorded names it for as long as the broker runs) and takes epmd down with it."""
    return ["sh", "-c", f'{EPMD} -port "$ERL_EPMD_PORT" -address {HOST} & e=$!; {SERVER}; s=$?; kill $e; exit $s']


def start_rabbitmq(amqp_port: int, folder: str, log=subprocess.DEVNULL) -> subprocess.Popen:
    """The broker on ``HOST:amqp_port`` in its own session, its state in ``folder``; RuntimeError if it is not
    installed or does not serve AMQP within ``START_S``."""
    if not installed():
        raise RuntimeError(INSTALL_HINT)
    return start_server(command(), amqp_port, START_S, "rabbitmq", log, env=environment(amqp_port, folder))


def stop_rabbitmq(pid: int, kill: bool = False, wait_s: float = 30.0) -> None:
    """Stop the broker started as ``pid`` (its session's group: the script, the Erlang VM, its epmd); ``kill``:
    at once, as a crash would (kill -9)."""
    stop_session(pid, kill, wait_s)
