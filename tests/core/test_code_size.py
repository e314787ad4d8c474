"""The house stays readable: no function of the product over 80 lines, no module over 400 (an orchestration that
grows becomes an object with named steps, a module that grows splits by role). An AST walk over the code."""
from __future__ import annotations

import ast
import gc
import glob
import os

from support import ROOT

PACKAGES = ("agents", "core", "transports", "runs", "loadgen", "streaming", "ui", "stack", "bench", "scenarios")
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 400


def too_long(source: str, name: str) -> list[str]:
    """What in one module's source is over the limits."""
    found = []
    lines = source.count("\n")
    if lines > MAX_MODULE_LINES:
        found.append(f"{name}: {lines} lines (at most {MAX_MODULE_LINES})")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n = node.end_lineno - node.lineno + 1
            if n > MAX_FUNCTION_LINES:
                found.append(f"{name}:{node.lineno}: {node.name} is {n} lines (at most {MAX_FUNCTION_LINES})")
    return found


def over_the_product(check) -> list[str]:
    """``check(source, name)`` over every module of the product, its findings together."""
    found = []
    # no collection while parsing: a finalizer that logs a traceback (an earlier test's failed asyncio task) parses
    # with ast too, and re-entered mid-parse CPython 3.11's AST state raised "recursion depth mismatch" (CI)
    gc.collect()
    gc.disable()
    try:
        for d in PACKAGES:
            for path in sorted(glob.glob(os.path.join(ROOT, d, "**", "*.py"), recursive=True)):
                found += check(open(path).read(), os.path.relpath(path, ROOT))
    finally:
        gc.enable()
    return found


def test_no_function_over_80_lines_and_no_module_over_400():
    found = over_the_product(too_long)
    assert not found, "\n".join(found)
    long_function = "def f():\n" + "    x = 1\n" * 80
    assert too_long(long_function, "m") == ["m:1: f is 81 lines (at most 80)"]  # it can fail
    assert too_long("x = 1\n" * 401, "m") == ["m: 401 lines (at most 400)"]


def rebound_globals(source: str, name: str) -> list[str]:
    """Where one module's functions rebind a module global (``global``): state set at import and changed at run time."""
    return [f"{name}:{node.lineno}: global {', '.join(node.names)}" for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Global)]


def test_no_function_rebinds_a_module_global():
    """Settings that a command's flags change are a value built once and passed down (``stack.config.Stack``), not
    module globals rebound by ``main`` (``stack.__main__`` did, issue 64 point 4)."""
    found = over_the_product(rebound_globals)
    assert not found, "\n".join(found)
    assert rebound_globals("X = 1\ndef main():\n    global X\n    X = 2\n", "m") == ["m:3: global X"]  # it can fail
