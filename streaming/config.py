"""The job's configuration: one typed object built from flags (see ``streaming.job``)."""
from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field

from streaming.engine import EngineConfig

_UNITS_NS = {"ns": 1, "us": 1_000, "ms": 1_000_000, "s": 1_000_000_000, "m": 60_000_000_000, "h": 3_600_000_000_000}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ns|us|ms|s|m|h)?\s*$")


def parse_duration_ns(text: str) -> int:
    """'30s', '500ms', '2m', '1.5s' (a bare number is seconds) to nanoseconds."""
    m = _DURATION.match(str(text))
    if not m:
        raise ValueError(f"bad duration {text!r}: use e.g. 500ms, 30s, 2m")
    return int(float(m.group(1)) * _UNITS_NS[m.group(2) or "s"])


@dataclass(frozen=True)
class JobConfig:
    command: str
    run_dir: str
    engine: EngineConfig
    trigger_ms: int = 500
    available_now: bool = False
    master: str = "local[2]"
    bootstrap: str | None = None
    topic: str | None = None
    source: str = "flightwatch_kafka"
    starting_offsets: str = "earliest"
    max_offsets_per_trigger: int | None = None
    kafka_options: dict = field(default_factory=dict)
    heartbeat: bool = True
    partitions: int = 2

    @property
    def spark_checkpoint(self) -> str:
        return os.path.join(self.run_dir, "spark")

    @property
    def archive_dir(self) -> str:
        return os.path.join(self.source_dir or self.run_dir, "archive")

    source_dir: str | None = None

    def for_replay(self) -> "JobConfig":
        """Read the run's archive; write into <run>/replay with a fresh checkpoint."""
        run_cfg = _read_run_config(self.run_dir)
        eng = dataclasses.replace(self.engine, **{k: v for k, v in run_cfg.items() if k in
                                                  ("window_ns", "drop_timeout_ns", "watermark_delay_ns", "retention_ns")})
        return dataclasses.replace(self, engine=eng, source_dir=self.run_dir,
                                   run_dir=os.path.join(self.run_dir, "replay"), heartbeat=False)


def _read_run_config(run_dir: str) -> dict:
    import json

    with open(os.path.join(run_dir, "run.json")) as f:
        return json.load(f)
