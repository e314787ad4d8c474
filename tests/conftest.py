"""Shared fixtures: a real Tansu broker on a free loopback port, stopped by its recorded PID, and a real Prometheus.
The helpers the tests share are in ``tests/support``."""
from __future__ import annotations

import itertools
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # the project's packages; this folder is on the path too (``support``)
# pytest rewrites each test module's asserts and caches the result in its __pycache__ unless bytecode is not written:
# where PYTHONDONTWRITEBYTECODE is set (CI's machines), every worker of every step rewrote all ~150 modules again,
# 6 of the 12 CPU-s a worker's collection takes. This process writes them; the processes tests start are unchanged.
sys.dont_write_bytecode = False


from core.procs import free_port, stop_process  # noqa: E402
from stack.tansu import start_tansu  # noqa: E402

_BROKER_RUNS = ("test_rabbitmq.py::test_a_rabbitmq_killed", "test_artemis.py::test_an_artemis_killed",
                "test_secure_amqp.py::test_the_rabbitmq_example", "test_kafka.py::test_an_apache_kafka_killed",
                "test_secure_kafka.py::test_the_kafka_example", "test_secure_artemis.py::test_the_artemis_example",
                "test_rabbitmq.py::test_sends_whose_confirms", "test_secure_http.py::test_the_http_example",
                "test_misrouting.py::test_events_a_relay", "test_secure_amqp.py::test_a_queue_with_a_consumer")
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
_DI = "tests/system/test_distributed.py::"
CLUSTER_SHARES = {
    _MH + "test_the_shared_volume_taken_from_a_host_fails_loudly_never_reads_as_empty": "share 1",
    _MH + "test_the_shared_volume_taken_from_the_drivers_host_stops_its_job_in_one_line": "share 1",
    _MH + "test_30_s_at_5000_per_s_across_seven_hosts_equals_its_local_replay": "share 1",
    "tests/system/test_host_limits.py": "share 1",
    "tests/system/test_hosts_checkout.py": "share 1",
    _DI + "test_the_job_submitted_as_the_driver_pod_runs_it_follows_the_cluster": "share 1",
    _MH + "test_a_hosts_path_to_the_broker_cut_then_a_worker_killed_mid_run_lose_nothing_and_blame_not_the_sut": "share 2",
    _MH + "test_a_slowed_hosts_tasks_run_again_speculatively_and_every_event_counts_once": "share 2",
    "tests/system/test_distributed.py": "share 2",
}
"""``make test-cluster`` on two workers (``--dist loadfile``): each share's tests one after another on a worker of its
own, one cluster at a time on each. Balanced by a fresh clone's CI times (2026-11-30, ec5aadd: 715 and 810 s), with
the volume test's second run (from the driver's host: 2-3 minutes) become a test of two hosts and no cluster, and the
driver pod's test (106 s) moved to the first share: about 720 and 700 s. Every test builds its own hosts (random
names and subnets) and the session's broker is per worker, so a module's tests can run on both."""


KEEP_TOGETHER = ("tests/system/test_pipeline.py",)
"""Modules whose tests share a costly module fixture (``test_pipeline``'s live run, ~50 s of a worker): ``--dist
worksteal`` keeps each on one worker instead of splitting it, which built that fixture two or three times in one CI
run (``grouped_worksteal``)."""


def _module(nodeid: str) -> str:
    return nodeid.split("::")[0]


def grouped_worksteal(config, log):
    """xdist's work stealing, except that neither the first split nor a steal cuts through a module of
    ``KEEP_TOGETHER``."""
    return grouped_class()(config, log)


def grouped_class() -> type:
    """The scheduler of ``grouped_worksteal``: xdist 3.8's ``WorkStealingScheduling``, its ``check_schedule`` kept as
    it is but for the cut of a steal."""
    from xdist.scheduler import WorkStealingScheduling
    from xdist.scheduler.worksteal import MIN_PENDING, NodePending

    class Grouped(WorkStealingScheduling):
        def _together(self, i: int, j: int) -> bool:
            a, b = _module(self.collection[i]), _module(self.collection[j])
            return a == b and a in KEEP_TOGETHER

        def _off_group(self, queue: list[int], cut: int) -> int:
            """``cut`` moved forward (less taken from the queue's head, or less stolen from its tail) off a group."""
            while 0 < cut < len(queue) and self._together(queue[cut - 1], queue[cut]):
                cut += 1
            return cut

        def _steal_cut(self, queue: list[int], num_steal: int) -> int:
            """How many of the queue's tail to steal: less, or else the whole group, so that no group is cut; 0 if
            neither leaves the victim ``MIN_PENDING``."""
            cut = self._off_group(queue, len(queue) - num_steal)
            if cut < len(queue):
                return len(queue) - cut
            back = len(queue) - num_steal
            while back > MIN_PENDING and self._together(queue[back - 1], queue[back]):
                back -= 1
            return len(queue) - back if back >= MIN_PENDING and not self._together(queue[back - 1], queue[back]) else 0

        def _send_tests(self, node, num: int) -> None:
            super()._send_tests(node, self._off_group(self.pending, num))

        def _deal(self, nodes: list) -> None:
            """The first split: the modules, longest first (``SLOW_FIRST``), dealt to ``nodes`` one by one like cards
            (a module's run of tests in the sorted list as one card), so that every worker starts on its share of the
            longest. xdist cuts the list into contiguous slices instead, which gave the first worker all of the longest
            tests: the others ran out and waited on its last one. Dealt test by test, a worker ran a module's tests
            between other modules' and built its module fixtures again on the same session broker (in CI, a topic
            filled twice). On a fresh clone's 910 test times the modules dealt simulate 913 s of wall, the tests
            dealt 953 s, the slices 1,064 s (911 s the perfect split)."""
            units = [list(run) for _, run in itertools.groupby(self.pending, key=lambda i: _module(self.collection[i]))]
            hands: list[list[int]] = [[] for _ in nodes]
            for k, unit in enumerate(units):
                hands[k % len(nodes)].extend(unit)
            del self.pending[:]
            for node, hand in zip(nodes, hands):
                if hand:
                    self.node2pending[node].extend(hand)
                    node.send_runtest_some(hand)

        def check_schedule(self) -> None:
            nodes_up = [NodePending(node, pending) for node, pending in self.node2pending.items()
                        if not node.shutting_down]
            idle = [node for node, pending in nodes_up if len(pending) < MIN_PENDING]
            if not idle:
                return
            if self.pending and len(self.pending) == len(self.collection) and len(idle) > 1:
                self._deal(idle)
                idle = [node for node, pending in nodes_up if len(pending) < MIN_PENDING]
                if not idle:
                    return
            if self.pending:
                for i, node in enumerate(idle):
                    self._send_tests(node, len(self.pending) // (len(idle) - i))
                idle = [node for node, pending in nodes_up if len(pending) < MIN_PENDING]
                if not idle:
                    return
            if self.steal_requested_from_node is not None:
                return
            steal_from = max(nodes_up, key=lambda n: len(n.pending), default=None)
            num_steal = 0
            if steal_from is not None:
                queue = steal_from.pending
                num_steal = min(len(queue) // 2, max(0, len(queue) - MIN_PENDING))
                num_steal = self._steal_cut(queue, num_steal) if num_steal else 0
            if num_steal == 0:
                for node in idle:
                    node.shutdown()
                return
            steal_from.node.send_steal(steal_from.pending[-num_steal:])
            self.steal_requested_from_node = steal_from.node

    return Grouped


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """With ``--dist loadfile``: a file's tests on one worker, and each share of ``CLUSTER_SHARES`` on one. With
    ``--dist worksteal``: ``grouped_worksteal``."""
    if config.getoption("dist") == "worksteal":
        return grouped_worksteal(config, log)
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class Shares(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            test = nodeid.split("[", 1)[0]
            file = nodeid.split("::", 1)[0]
            return CLUSTER_SHARES.get(test) or CLUSTER_SHARES.get(file, file)

    return Shares(config, log)


def tree_cpu_s() -> float:
    """CPU seconds of this process and its descendants so far: its own, its reaped children's, and each live
    descendant's with the children it reaped (a process whose parent died before it is lost to the count)."""
    import resource

    import psutil

    own, reaped = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    total = own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime
    for p in psutil.Process().children(recursive=True):
        try:
            t = p.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    item.stash[_CPU_AT_SETUP] = tree_cpu_s()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Each test's CPU (setup, call and teardown, the processes it started too: its fixtures' the first time they
    are built) as the ``cpu_s`` property of its JUnit XML case: CI's step is bound by the two cores, and
    ``.ci/durations.py`` prints where the CPU went beside where the time went."""
    if call.when == "teardown" and _CPU_AT_SETUP in item.stash:
        item.user_properties.append(("cpu_s", f"{tree_cpu_s() - item.stash[_CPU_AT_SETUP]:.2f}"))
    yield


_CPU_AT_SETUP = pytest.StashKey[float]()


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
