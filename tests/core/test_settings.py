"""One table of every FLIGHTWATCH_* setting (``core.settings``): the code, the Makefile, the manifests and the README
agree with it. A setting read anywhere and not in the table fails; one in the table that nothing reads fails; the
README's table is the one ``python -m core.settings`` prints."""
from __future__ import annotations

import glob
import os
import re

from support import ROOT

from core.settings import SETTINGS, markdown

PLACES = ["agents", "core", "loadgen", "streaming", "stack", "bench", "ui"]


def _read_names() -> dict[str, set[str]]:
    files = [f for d in PLACES for f in glob.glob(os.path.join(ROOT, d, "**", "*.py"), recursive=True)
             if not f.endswith(os.path.join("core", "settings.py"))]
    files += [os.path.join(ROOT, "Makefile"), *glob.glob(os.path.join(ROOT, "deploy", "**", "*.yaml"), recursive=True),
              os.path.join(ROOT, "deploy", "spark-entrypoint.sh")]
    found: dict[str, set[str]] = {}
    for f in files:
        for name in re.findall(r"FLIGHTWATCH_[A-Z0-9_]*[A-Z0-9]", open(f).read()):
            found.setdefault(name, set()).add(os.path.relpath(f, ROOT))
    return found


def test_every_setting_read_is_in_the_table_and_every_one_in_it_is_read():
    found = _read_names()
    assert not set(found) - set(SETTINGS), {n: sorted(found[n]) for n in set(found) - set(SETTINGS)}
    assert not set(SETTINGS) - set(found), set(SETTINGS) - set(found)


def test_the_readme_has_the_table():
    text = open(os.path.join(ROOT, "README.md")).read()
    assert markdown() in text, "README's table of settings differs: paste `python -m core.settings` into it"
