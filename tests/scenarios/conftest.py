"""What the scenarios' tests share: a synthetic run written by the real decoder, engine and sink (no Spark)."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    """``synthetic(name, **spec)``: (run folder, spec, the injected run) of a ``SyntheticSpec`` with no OOM kills, no
    malformed records and a 5 s drop timeout unless given."""
    from bench.compare import build_run
    from loadgen.synthetic import SyntheticSpec, generate

    def make(name: str, **fields):
        spec = SyntheticSpec(run_id=name, **{"oom_at_s": (), "num_malformed": 0, "drop_timeout_s": 5, **fields})
        root = str(tmp_path_factory.mktemp("runs") / name)
        build_run(root, spec)
        return root, spec, generate(spec)
    return make
