"""The job's configuration: one typed object built from flags (see ``streaming.job``)."""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field

from streaming.engine import EngineConfig


@dataclass(frozen=True)
class JobConfig:
    command: str
    run_dir: str
    engine: EngineConfig
    trigger_ms: int = 500
    idle_batch_ms: int = 2000
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
    metrics_listen: str | None = None  # HOST:PORT of the live figures' /metrics (streaming.metrics); None: off

    @property
    def spark_checkpoint(self) -> str:
        return os.path.join(self.run_dir, "spark")

    @property
    def archive_dir(self) -> str:
        return os.path.join(self.source_dir or self.run_dir, "archive")

    source_dir: str | None = None

    def decodes_in_driver(self) -> bool:
        """In local mode the read tasks hand the driver raw messages (hundreds of records each) and the driver
        decodes them: decoded rows would cross Arrow -> Spark rows -> Arrow inside one JVM for nothing (at 5,000
        events/s, half of the JVM's CPU). A cluster's read tasks decode on the executors."""
        return self.command != "replay" and self.source == "flightwatch_kafka" and self.master.startswith("local")

    def for_replay(self) -> JobConfig:
        """Read the run's archive; write into <run>/replay with a fresh checkpoint."""
        run_cfg = _read_run_config(self.run_dir)
        eng = dataclasses.replace(self.engine, **{k: v for k, v in run_cfg.items() if k in
                                                  ("window_ns", "drop_timeout_ns", "watermark_delay_ns", "retention_ns",
                                                   "silence_timeout_ns")})
        return dataclasses.replace(self, engine=eng, source_dir=self.run_dir,
                                   run_dir=os.path.join(self.run_dir, "replay"), heartbeat=False)


def _read_run_config(run_dir: str) -> dict:
    import json

    with open(os.path.join(run_dir, "run.json")) as f:
        return json.load(f)
