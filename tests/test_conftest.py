"""The test suite's own scheduling (``tests/conftest.py``): ``--dist worksteal`` never splits a module of
``KEEP_TOGETHER`` between workers, neither in its first split nor in a steal."""
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
