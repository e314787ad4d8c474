"""Reads the JUnit XML files pytest wrote under the CI's log folder and prints each suite's slowest tests.

    python .ci/durations.py ci-logs/test.xml [--top 10]

Every test's time stays in the XML file (setup, call and teardown together), with its CPU seconds where the suite
recorded them (the ``cpu_s`` property: its own process' and those it started, ``tests/conftest.py``); this prints the
``--top`` slowest and the ``--top`` costliest in CPU, and the sums, so a CI log shows where a step's time and its
cores went.
"""
from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET


def cases(path: str) -> list[tuple[float, str, str, float | None]]:
    """(seconds, test id, outcome, CPU seconds or None) of every test case in a JUnit XML file."""
    out = []
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome = next((c.tag for c in case if c.tag in ("failure", "error", "skipped")), "passed")
        cpu = next((float(p.get("value")) for p in case.iter("property") if p.get("name") == "cpu_s"), None)
        out.append((float(case.get("time") or 0), f"{case.get('classname')}::{case.get('name')}", outcome, cpu))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("xml", nargs="+", help="JUnit XML files (pytest --junitxml)")
    ap.add_argument("--top", type=int, default=10, help="how many of the slowest to print (default 10)")
    a = ap.parse_args(argv)
    for path in a.xml:
        try:
            rows = cases(path)
        except (OSError, ET.ParseError) as e:
            print(f"durations: {path}: {e}", file=sys.stderr)
            continue
        rows.sort(key=lambda r: r[0], reverse=True)
        cpus = [r[3] for r in rows if r[3] is not None]
        cpu = f", {sum(cpus):,.0f} CPU-s" if cpus else ""
        print(f"{path}: {len(rows)} tests, {sum(r[0] for r in rows):,.0f} s of test time{cpu}; the slowest:")
        for seconds, name, outcome, cpu_s in rows[:a.top]:
            print(f"  {seconds:7.1f} s {'' if cpu_s is None else f'{cpu_s:7.1f} CPU-s'}  {name}"
                  + ("" if outcome == "passed" else f"  ({outcome})"))
        if cpus:
            print("  the costliest in CPU:")
            for seconds, name, _, cpu_s in sorted((r for r in rows if r[3] is not None), key=lambda r: -r[3])[:a.top]:
                print(f"  {seconds:7.1f} s {cpu_s:7.1f} CPU-s  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
