"""Reads the JUnit XML files pytest wrote under the CI's log folder and prints each suite's slowest tests.

    python .ci/durations.py ci-logs/test.xml [--top 10]

Every test's time stays in the XML file (setup, call and teardown together); this prints the ``--top`` slowest and
the sum, so a CI log shows where a step's time went.
"""
from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET


def cases(path: str) -> list[tuple[float, str, str]]:
    """(seconds, test id, outcome) of every test case in a JUnit XML file."""
    out = []
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome = next((c.tag for c in case if c.tag in ("failure", "error", "skipped")), "passed")
        out.append((float(case.get("time") or 0), f"{case.get('classname')}::{case.get('name')}", outcome))
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
        rows.sort(reverse=True)
        print(f"{path}: {len(rows)} tests, {sum(r[0] for r in rows):,.0f} s of test time; the slowest:")
        for seconds, name, outcome in rows[:a.top]:
            print(f"  {seconds:7.1f} s  {name}" + ("" if outcome == "passed" else f"  ({outcome})"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
