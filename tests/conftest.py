"""Shared fixtures: a real Tansu broker on a free loopback port, stopped by its recorded PID, and a real Prometheus.
The helpers the tests share are in ``tests/support``."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # the project's packages; this folder is on the path too (``support``)


from core.procs import free_port, stop_process  # noqa: E402
from stack.tansu import start_tansu  # noqa: E402

SLOW_FIRST = ("tests/system/test_scenarios.py", "tests/system/test_multihost.py", "tests/system/test_distributed.py",
              "tests/core/test_idle_writers.py", "tests/system/", "tests/ui/test_app.py",
              "tests/streaming/test_saturation.py", "tests/agents/test_node_metrics.py")
"""The modules of the longest tests (the scenarios' stacks, Spark clusters, minutes of idle, whole runs), longest
first."""


def pytest_collection_modifyitems(config, items):
    """The longest tests start first: on several workers (``make test``, ``make test-brokers``), none is left running
    one alone at the end."""
    def rank(item) -> int:
        return next((i for i, prefix in enumerate(SLOW_FIRST) if item.nodeid.startswith(prefix)), len(SLOW_FIRST))
    items.sort(key=rank)  # stable: within a rank, the files' own order


ONE_WORKER = dict.fromkeys(("tests/system/test_distributed.py", "tests/system/test_host_limits.py",
                            "tests/system/test_hosts_checkout.py"), "the other Spark clusters")
"""``make test-cluster`` on two workers (``--dist loadfile``): the seven-host module on one, these files one after
another on the other (one cluster at a time on each; in a fresh clone's CI, 790 s and 700 s of tests side by side,
1,490 s one after the other)."""


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """With ``--dist loadfile``: a file's tests on one worker, and the files of ``ONE_WORKER`` together on one."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class Shares(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            file = nodeid.split("::", 1)[0]
            return ONE_WORKER.get(file, file)

    return Shares(config, log)


@pytest.fixture(scope="session")
def broker(tmp_path_factory):
    """A real Kafka-protocol broker (Tansu, in-memory) for the whole session: its bootstrap address."""
    port = free_port()
    proc = start_tansu(port, open(tmp_path_factory.mktemp("broker") / "tansu.log", "wb"), "flightwatch-test")
    try:
        yield f"127.0.0.1:{port}"
    finally:
        stop_process(proc)


@pytest.fixture(scope="session")
def prometheus(tmp_path_factory):
    """A real Prometheus (1 s scrapes) and node exporter on free loopback ports: Prometheus' base URL.

    Both come from Debian's packages (`.ci/run` installs them); the URL is answered once the
    node exporter has been scraped twice (rates need two samples).
    """
    import shutil

    from support import wait_for_scrapes

    from core.procs import wait_port
    from stack.__main__ import NODE_COLLECTORS, prometheus_config

    node_bin, prom_bin = shutil.which("prometheus-node-exporter"), shutil.which("prometheus")
    if not node_bin or not prom_bin:
        pytest.fail("prometheus and prometheus-node-exporter are needed (apt-get install prometheus prometheus-node-exporter)")
    d = tmp_path_factory.mktemp("prometheus")
    node_port, prom_port = free_port(), free_port()
    (d / "prometheus.yml").write_text(prometheus_config(node_port))
    log = open(d / "log", "wb")
    node = subprocess.Popen([node_bin, f"--web.listen-address=127.0.0.1:{node_port}", *NODE_COLLECTORS], stdout=log,
                            stderr=subprocess.STDOUT)
    prom = subprocess.Popen([prom_bin, f"--config.file={d / 'prometheus.yml'}", f"--web.listen-address=127.0.0.1:{prom_port}",
                             f"--storage.tsdb.path={d / 'data'}"], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{prom_port}"
    try:
        assert wait_port(node_port) and wait_port(prom_port, 30), (d / "log").read_text()
        wait_for_scrapes(url, "node", 3, "10s", seconds=30, poll_s=0.5)
        yield url
    finally:
        stop_process(prom)
        stop_process(node)
