"""The run folder's paths are named, one by one: a misspelt name is an error, not a folder nobody reads."""
from __future__ import annotations

import pytest

from core.rundir import RunPaths


def test_named_paths_and_a_typo_is_an_error():
    p = RunPaths("/runs/r1")
    assert (p.archive, p.batches, p.quarantine, p.state) == ("/runs/r1/archive", "/runs/r1/batches",
                                                            "/runs/r1/quarantine", "/runs/r1/state")
    assert (p.partial("hists"), p.windows_file, p.summary_file, p.run_file) == (
        "/runs/r1/partials/hists", "/runs/r1/windows.parquet", "/runs/r1/summary.json", "/runs/r1/run.json")
    with pytest.raises(AttributeError):
        p.archvie  # noqa: B018 - the typo is the test
