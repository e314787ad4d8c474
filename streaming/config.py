"""The job's configuration: one typed object built from flags (see ``streaming.job``)."""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field

from core.rundir import RunPaths
from core.units import duration_text, parse_size
from streaming.state import EngineConfig

JOIN_CACHE = "256MiB"
JOIN_CACHE_BYTES = parse_size(JOIN_CACHE)
"""What a Python worker keeps of the join partitions' states it served, at most (``--join-cache``): beyond, the states
it used longest ago go (a later task of theirs loads a snapshot and redoes the batches after it)."""
RECOMPUTABLE = {"drop_timeout_ns": "drop", "window_ns": "window", "watermark_delay_ns": "watermark"}
"""Engine settings a replay may change (``replay --drop-timeout 10s``: the key without ``_ns``), and how its folder's
name spells them."""


@dataclass(frozen=True)
class JobConfig:
    command: str
    run_dir: str
    engine: EngineConfig
    trigger_ms: int = 500
    idle_batch_ms: int = 2000
    quiet_batch_ms: int = 10_000
    slice_grace_ms: int = 90_000  # a time slice of the topic is deleted this long after its end, once read
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
    join_on: str = "auto"  # where the join partitions run: auto, driver or executors (``joins_on_executors``)
    join_cache_bytes: int = JOIN_CACHE_BYTES  # what a Python worker keeps of join states (``streaming.executors.keep``)
    await_topic: bool = False  # wait for the telemetry topic instead of creating it (a KafkaTopic on Kubernetes)
    metrics_listen: str | None = None  # HOST:PORT of the live figures' /metrics (streaming.metrics); None: off
    recompute: dict = field(default_factory=dict)  # a replay's RECOMPUTABLE settings given on its command line (ns)

    @property
    def paths(self) -> RunPaths:
        """The run folder's paths (``core.rundir``): the run's, or a replay's under it."""
        return RunPaths(self.run_dir)

    @property
    def spark_checkpoint(self) -> str:
        return self.paths.spark

    @property
    def archive_dir(self) -> str:
        return (RunPaths(self.source_dir) if self.source_dir else self.paths).archive

    source_dir: str | None = None

    def decodes_in_driver(self) -> bool:
        """In local mode the read tasks hand the driver raw messages (hundreds of records each) and the driver
        decodes them: decoded rows would cross Arrow -> Spark rows -> Arrow inside one JVM for nothing (at 5,000
        events/s, half of the JVM's CPU). A cluster's read tasks decode on the executors."""
        return (self.command != "replay" and self.source == "flightwatch_kafka" and self.master.startswith("local")
                and not self.joins_on_executors())

    def joins_on_executors(self) -> bool:
        """On a cluster the join partitions run in executor tasks (``streaming.executors``); in local mode in the
        driver, with no shuffle; ``join_on`` may say otherwise."""
        return self.join_on == "executors" or (self.join_on == "auto" and not self.master.startswith("local"))

    def for_replay(self) -> JobConfig:
        """Read the run's archive with the run's own settings, but those given in ``recompute``; write into
        <run>/replay, or <run>/replay-drop10s-window500ms when a setting differs from the run's (a recomputation
        sits beside the run and the dashboard lists it), with a fresh checkpoint."""
        run_cfg = _read_run_config(self.paths)
        own = EngineConfig.durations(run_cfg)
        changed = {k: v for k, v in self.recompute.items() if own.get(k) != v}
        folder = "replay" + "".join(f"-{name}{duration_text(changed[k])}" for k, name in RECOMPUTABLE.items() if k in changed)
        folder += "" if self.engine.clock_correction else "-rawclocks"
        return dataclasses.replace(self, engine=dataclasses.replace(self.engine, **{**own, **self.recompute}),
                                   source_dir=self.run_dir, run_dir=os.path.join(self.run_dir, folder), heartbeat=False)


CLUSTER_JOIN_PARTITIONS = 8
"""Join partitions on a cluster unless told: enough tasks for a few executors' cores; give ``--join-partitions``
two or three per executor core for more."""


MAX_JOIN_PARTITIONS = 4096
"""More join partitions than this would spend more on each partition's fixed cost than on its records."""


def engine_problem(eng: EngineConfig) -> str | None:
    """Why these engine settings cannot work together, or None."""
    if eng.window_ns <= 0 or eng.drop_timeout_ns <= 0 or eng.drop_timeout_ns % eng.window_ns:
        return "--window must be > 0 and divide --drop-timeout"
    if not 1 <= eng.join_partitions <= MAX_JOIN_PARTITIONS:
        return f"--join-partitions must be between 1 and {MAX_JOIN_PARTITIONS}"
    if eng.silence_timeout_ns <= eng.window_ns:
        return "--silence-timeout must be longer than a window"
    return None


def _read_run_config(paths: RunPaths) -> dict:
    import json

    with open(paths.run_file) as f:
        return json.load(f)


RESUMED_AS_STARTED = {"window_ns": "--window", "drop_timeout_ns": "--drop-timeout",
                      "watermark_delay_ns": "--watermark-delay", "silence_timeout_ns": "--silence-timeout"}
"""The engine settings a run keeps from its start: its state (windows, deadlines) was built with them."""


def resume_problem(paths: RunPaths, eng: EngineConfig) -> str | None:
    """A run resumed with other settings than it started with would mix two sets of windows and deadlines in one
    state: refused, with the settings it has (None when it is new or they are the same)."""
    if not paths.is_run:
        return None
    had = _read_run_config(paths)
    differ = [(flag, had[key], getattr(eng, key)) for key, flag in RESUMED_AS_STARTED.items()
              if key in had and had[key] != getattr(eng, key)]
    if not differ:
        return None
    started = " ".join(f"{flag} {duration_text(was)}" for flag, was, _ in differ)
    given = " ".join(f"{flag} {duration_text(now)}" for flag, _, now in differ)
    return (f"run {eng.run_id} was started with {started}, not {given}: resume it with its own settings, or recompute "
            "it with others (python -m streaming replay, into a folder of its own)")
