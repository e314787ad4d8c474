"""The states a run, a window and a shortfall episode can be in are enums beside each other in ``core.output``
(``State``, ``Lifecycle``, ``Episode``): code outside it compares with the enums, never with their text, so that a
state renamed there is renamed everywhere (issue 64). The guard walks every package of the product with the AST."""
from __future__ import annotations

import ast
import os

from support import ROOT

from core.output import Episode, Lifecycle, State

PACKAGES = ("agents", "bench", "core", "flightwatch", "loadgen", "runs", "scenarios", "stack", "streaming", "transports", "ui")
TEXTS = {m.value for enum in (State, Lifecycle, Episode) for m in enum}


def compared_texts(source: str) -> list[tuple[int, str]]:
    """``(line, text)`` of each state's text compared as a literal: ``x == "finished"``, ``x != "ok"``,
    ``x in ("ok", None)``. (A literal looked up in a mapping of one's own, ``"saturated" in seen``, is not a state.)"""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        for op, left, right in zip(node.ops, sides, sides[1:]):
            if isinstance(op, (ast.Eq, ast.NotEq)):
                literals = [x for x in (left, right) if isinstance(x, ast.Constant)]
            elif isinstance(op, (ast.In, ast.NotIn)) and isinstance(right, (ast.Tuple, ast.List, ast.Set)):
                literals = [x for x in right.elts if isinstance(x, ast.Constant)]
            else:
                continue
            found += [(x.lineno, x.value) for x in literals if x.value in TEXTS]
    return found


def test_the_lifecycle_and_episode_kinds_are_enums_beside_state():
    assert [m.value for m in Lifecycle] == ["waiting for data", "running", "finished"]
    assert [m.value for m in Episode] == ["stall", "saturated", "open"]
    assert Lifecycle.FINISHED == "finished" and f"{Episode.STALL}" == "stall"  # written as their text


def test_no_code_compares_with_a_states_text():
    found = []
    for package in PACKAGES:
        for folder, _, files in os.walk(os.path.join(ROOT, package)):
            for name in files:
                path = os.path.join(folder, name)
                if name.endswith(".py") and path != os.path.join(ROOT, "core", "output.py"):
                    found += [f"{os.path.relpath(path, ROOT)}:{line}: {text!r}"
                              for line, text in compared_texts(open(path).read())]
    assert found == [], "compare with core.output's State, Lifecycle or Episode:\n" + "\n".join(found)


def test_the_guard_sees_a_planted_comparison():
    planted = 'if summary["state"] == "finished":\n    pass\nok = state in ("ok", "degrading")\nseen = "saturated" in {}\n'
    assert compared_texts(planted) == [(1, "finished"), (3, "ok"), (3, "degrading")]
