"""The test suite's own scheduling (``tests/conftest.py``): ``--dist worksteal`` deals whole modules in its first
split and never splits a module of ``KEEP_TOGETHER`` between workers, neither in its first split nor in a steal."""
from __future__ import annotations

import importlib.util
import os

# by its path: under xdist, "conftest" in sys.modules may be another folder's
_spec = importlib.util.spec_from_file_location("tests_root_conftest", os.path.join(os.path.dirname(__file__), "conftest.py"))
conftest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(conftest)

P = "tests/system/test_pipeline.py::"


def test_a_cut_inside_a_kept_module_moves_off_it_and_a_steal_takes_less_or_the_whole_module():
    col = ["tests/a.py::t1", "tests/a.py::t2", P + "t1", P + "t2", P + "t3", "tests/b.py::t1", "tests/b.py::t2"]
    cls = conftest.grouped_class()
    s = cls.__new__(cls)
    s.collection = col
    queue = list(range(len(col)))
    assert s._off_group(queue, 3) == 5 and s._off_group(queue, 2) == 2 and s._off_group(queue, 6) == 6
    assert s._steal_cut(queue, 3) == 2  # 3 would cut the module: b's 2 instead
    assert s._steal_cut(queue, 2) == 2  # b's two: no cut
    assert s._steal_cut([0, 1, 2, 3, 4], 2) == 3  # the module at the queue's end: stolen whole
    assert s._steal_cut([2, 3, 4], 1) == 0  # the module alone, its first test running: nothing to steal


class _Node:
    """A worker as the scheduler sees it: what it was sent."""

    def __init__(self) -> None:
        self.sent: list[int] = []
        self.shutting_down = False

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent += indices


def test_the_first_split_deals_the_longest_modules_to_every_worker_and_keeps_each_module_whole():
    """A module's tests on one worker, one after another: dealt test by test, a worker went back to a module after
    others and built its module fixture again (``test_sources``' topic filled twice on the worker's broker)."""
    col = ["tests/s.py::slow1", "tests/t.py::slow2", "tests/u.py::slow3", "tests/u.py::slow4", P + "t1", P + "t2",
           "tests/b.py::t1", "tests/b.py::t2", "tests/b.py::t3", "tests/c.py::t1", "tests/s.py::t9"]
    cls = conftest.grouped_class()
    s = cls.__new__(cls)
    s.collection, s.pending = col, list(range(len(col)))
    nodes = [_Node(), _Node(), _Node()]
    s.node2pending = {n: [] for n in nodes}
    s._deal(nodes)
    # the three longest modules first, one to each worker; then the next ones, a module's tests never split
    assert [n.sent for n in nodes] == [[0, 4, 5, 10], [1, 6, 7, 8], [2, 3, 9]]
    assert s.pending == [] and [s.node2pending[n] for n in nodes] == [n.sent for n in nodes]


def test_a_mark_is_on_a_test_never_on_a_helper():
    """``@pytest.mark.integration`` on a helper marks nothing: ``test_security``'s TLS run (real brokers, a Spark job)
    ran in ``make test-fast`` for that. Every ``pytest.mark`` decorator in tests/ is on a test or a test class."""
    import ast
    import glob

    root = os.path.dirname(__file__)
    stray = []
    for path in glob.glob(os.path.join(root, "**", "*.py"), recursive=True):
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and not node.name.startswith(("test", "Test")):
                for d in node.decorator_list:
                    target = d.func if isinstance(d, ast.Call) else d
                    if "pytest.mark." in ast.unparse(target):
                        stray.append(f"{os.path.relpath(path, root)}:{node.lineno} {node.name}")
    assert not stray, stray


def test_a_tests_cpu_counts_the_processes_it_starts_and_ci_prints_it(tmp_path):
    """``tree_cpu_s`` counts a child busy for 0.5 s of CPU, reaped or still alive; the JUnit XML's ``cpu_s``
    property is what ``.ci/durations.py`` prints and sums."""
    import subprocess
    import sys

    burn = "import time\nt=time.process_time()\nwhile time.process_time()-t<0.5: pass\nprint('done', flush=True)\n"
    before = conftest.tree_cpu_s()
    subprocess.run([sys.executable, "-c", burn], check=True)
    reaped = conftest.tree_cpu_s() - before
    alive = subprocess.Popen([sys.executable, "-c", burn + "import time; time.sleep(30)"], stdout=subprocess.PIPE,
                             text=True)
    try:
        assert alive.stdout.readline() == "done\n"
        live = conftest.tree_cpu_s() - before - reaped
    finally:
        alive.kill()
        alive.wait()
    assert 0.5 <= reaped < 1.5 and 0.5 <= live < 1.5, (reaped, live)

    xml = tmp_path / "t.xml"
    xml.write_text('<testsuites><testsuite><testcase classname="tests.a" name="t1" time="3.5"><properties>'
                   '<property name="cpu_s" value="6.25"/></properties></testcase>'
                   '<testcase classname="tests.a" name="t2" time="1.0"/></testsuite></testsuites>')
    ci = os.path.join(os.path.dirname(os.path.dirname(__file__)), ".ci", "durations.py")
    out = subprocess.run([sys.executable, ci, "--top", "2", str(xml)], capture_output=True, text=True, check=True).stdout
    assert "2 tests, 4 s of test time, 6 CPU-s" in out and "3.5 s     6.2 CPU-s  tests.a::t1" in out, out
