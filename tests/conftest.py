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

_BROKER_RUNS = ("test_rabbitmq.py::test_a_rabbitmq_killed", "test_artemis.py::test_an_artemis_killed",
                "test_secure_amqp.py::test_the_rabbitmq_example", "test_kafka.py::test_an_apache_kafka_killed",
                "test_secure_kafka.py::test_the_kafka_example", "test_secure_artemis.py::test_the_artemis_example",
                "test_rabbitmq.py::test_sends_whose_confirms", "test_secure_http.py::test_the_http_example",
                "test_secure_amqp.py::test_a_queue_with_a_consumer")
SLOW_FIRST = ("tests/system/test_scenarios.py", *(f"tests/system/{t}" for t in _BROKER_RUNS),
              "tests/system/test_multihost.py", "tests/system/test_distributed.py",
              "tests/core/test_idle_writers.py", "tests/system/", "tests/ui/test_app.py",
              "tests/streaming/test_saturation.py", "tests/agents/test_node_metrics.py")
"""The modules of the longest tests (the scenarios' stacks, Spark clusters, minutes of idle, whole runs), longest
first; in ``make test-brokers``, its whole runs in the order of their CI times (97 to 42 s on 2026-11-29), so that
the two workers end together: that step took 707 s for 1,272 s of tests, in module order."""


def pytest_collection_modifyitems(config, items):
    """The longest tests start first: on several workers (``make test``, ``make test-brokers``), none is left running
    one alone at the end."""
    def rank(item) -> int:
        return next((i for i, prefix in enumerate(SLOW_FIRST) if item.nodeid.startswith(prefix)), len(SLOW_FIRST))
    items.sort(key=rank)  # stable: within a rank, the files' own order


_MH = "tests/system/test_multihost.py::"
CLUSTER_SHARES = {
    _MH + "test_the_shared_volume_taken_from_a_host_fails_loudly_never_reads_as_empty": "share 1",
    _MH + "test_30_s_at_5000_per_s_across_seven_hosts_equals_its_local_replay": "share 1",
    "tests/system/test_host_limits.py": "share 1",
    "tests/system/test_hosts_checkout.py": "share 1",
    _MH + "test_a_hosts_path_to_the_broker_cut_then_a_worker_killed_mid_run_lose_nothing_and_blame_not_the_sut": "share 2",
    _MH + "test_a_slowed_hosts_tasks_run_again_speculatively_and_every_event_counts_once": "share 2",
    "tests/system/test_distributed.py": "share 2",
}
"""``make test-cluster`` on two workers (``--dist loadfile``): each share's tests one after another on a worker of its
own, one cluster at a time on each. Balanced by a fresh clone's CI times: 269 + 207 + 200 + 65 s and 185 + 129 + 435 s
(741 and 749 s; with the seven-host module whole on one worker they were 790 and 700 s). Every test builds its own
hosts (random names and subnets), so the seven-host module's tests can run on both."""


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """With ``--dist loadfile``: a file's tests on one worker, and each share of ``CLUSTER_SHARES`` on one."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class Shares(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            test = nodeid.split("[", 1)[0]
            file = nodeid.split("::", 1)[0]
            return CLUSTER_SHARES.get(test) or CLUSTER_SHARES.get(file, file)

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
