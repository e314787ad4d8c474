"""The engine's configuration and the state it carries from one micro-batch to the next (``streaming.engine``)."""
from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from streaming import gaps as gap_tracking

NO_TIME_NS = gap_tracking.NO_TIME_NS  # -(2**62): no event time yet


@dataclass(frozen=True)
class EngineConfig:
    run_id: str
    window_ns: int = 1_000_000_000
    """Tumbling window length (event time)."""
    drop_timeout_ns: int = 30 * 10**9
    """A send with no receive within this is a drop (vegeta's default request timeout)."""
    watermark_delay_ns: int = 5 * 10**9
    """How far behind the newest event time the job waits before deciding drops."""
    retention_ns: int = 30 * 10**9
    """How long after its deadline an event ID is remembered for duplicates and late receives."""
    silence_timeout_ns: int = 60 * 10**9
    """A started run whose load generator has written nothing (no send, ack, start or stop) for this
    long, while the job's own heartbeats move the watermark on, is closed as aborted (killed)."""
    join_partitions: int = 1
    """The join's partitions: event IDs are split by hash into this many, each joined on its own
    (``streaming.join``). The results do not depend on it."""
    clock_correction: bool = True
    """Stamps corrected by their agents' measured clock offsets (``streaming.clocks``); False: kept raw."""

    def settings(self) -> dict:
        """As the run's ``run.json`` holds them (``core.rundir.RunPaths.run_file``)."""
        return dataclasses.asdict(self)

    @classmethod
    def durations(cls, settings: dict) -> dict:
        """The durations among a run's settings (every field but ``run_id``, ``join_partitions`` and
        ``clock_correction``)."""
        return {f.name: settings[f.name] for f in dataclasses.fields(cls)
                if f.name not in ("run_id", "join_partitions", "clock_correction") and f.name in settings}


def _empty_known() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "sent_ns": pd.Series(dtype=np.int64),
            "intended_ns": pd.Series(dtype=np.int64),
            "errored": pd.Series(dtype=bool),
            "acked": pd.Series(dtype=bool),        # answered, not failed (a re-sent answer is not counted again)
            "recv_ns": pd.Series(dtype=np.int64),
            "dup_ns": pd.Series(dtype=np.int64),  # its latest duplicate's receive stamp, -1: none (``rules.take_receives``)
            "status": pd.Series(dtype=np.int8),
            "id": pd.Series(dtype=object),
            "route": pd.Series(dtype=np.int32),   # where it was sent (``core.contract.Send.route``), -1: anywhere
        },
        index=pd.Index([], dtype=np.uint64, name="event_id"),
    )


def _empty_orphans() -> pd.DataFrame:
    return pd.DataFrame({"event_id": pd.Series(dtype=np.uint64), "at_ns": pd.Series(dtype=np.int64),
                         "id": pd.Series(dtype=object), "route": pd.Series(dtype=np.int32)})


NO_ROUTE = -1
"""``route`` of a send or receive that names none (``core.contract``): a snapshot from before routes reads so."""


@dataclass
class JoinState:
    """One join partition's state: the event IDs it knows (pending, delivered, dropped, errored) and the receives
    whose send it has not seen yet (orphans)."""
    known: pd.DataFrame = field(default_factory=_empty_known)
    orphans: pd.DataFrame = field(default_factory=_empty_orphans)
    lookup: object = field(default=None, compare=False, repr=False)
    """``known``'s rows by ID hash as the last batch left them (``streaming.rules.KeyLookup``), so the next batch does
    not build it again; None: built when needed."""

    def nbytes(self) -> int:
        """Its memory, estimated without walking its strings: the arrays' bytes, the IDs as the first one's size
        times their number (a run's IDs are of one length), and the lookup's hash tables."""
        total = 0
        for frame in (self.known, self.orphans):
            total += int(frame.memory_usage(index=True, deep=False).sum())
            if len(frame):
                total += len(frame) * sys.getsizeof(frame["id"].iat[0])
        return total + (self.lookup.nbytes if self.lookup is not None else 0)


@dataclass
class EngineState:
    joins: list = field(default_factory=lambda: [JoinState()])  # one JoinState per join partition
    max_event_ns: int = NO_TIME_NS
    watermark_ns: int = NO_TIME_NS
    start_ns: int | None = None
    stop_ns: int | None = None
    num_batches: int = 0
    shards: int = 1                  # load-generator shards of the run (from its start records)
    stopped: list = field(default_factory=list)   # the senders whose stop record has arrived
    last_sender_ns: int = NO_TIME_NS  # the newest send, ack or start record: the generator's last sign of life
    aborted: str | None = None       # why the job closed the run itself
    gaps: gap_tracking.GapTracker = field(default_factory=gap_tracking.GapTracker)
    drops_named_ns: int = NO_TIME_NS  # drops of events sent before this are final and their exemplars written
    clocks: dict = field(default_factory=dict)  # each agent's recent clock estimates (``streaming.clocks.learn``)
    hole_until_ns: int = NO_TIME_NS   # the telemetry broker lost records before this: a send before it that comes
    #                                   only now may have had its receive record in what was lost (``UNKNOWN``)
    hole_waiting: list = field(default_factory=list)  # agents not yet heard from since the reset: the hole may reach on
    hole_latest_ns: int = NO_TIME_NS  # when the reset was found: no agent lost a record written after it
    early: object = field(default=None, compare=False)  # machine records read before the run's start (an Arrow
    #       table; rows as a snapshot holds them): they wait for its span (``streaming.run_rules.machine_records``)

    @property
    def known(self) -> pd.DataFrame:
        """Every partition's known IDs (one partition's own table when there is one; none when the joins run on the
        executors)."""
        return self._all("known")

    @property
    def orphans(self) -> pd.DataFrame:
        return self._all("orphans").reset_index(drop=True) if len(self.joins) > 1 else self._all("orphans")

    def _all(self, name: str) -> pd.DataFrame:
        if len(self.joins) == 1:
            return getattr(self.joins[0], name)
        return pd.concat([getattr(j, name) for j in self.joins]) if self.joins else getattr(JoinState(), name)

    def scalars(self) -> dict:
        """Everything but the tables (the partitions' ``known`` and ``orphans``, the gap tracker's stamps), as JSON can
        hold it: the machine records that wait (``early``) as rows."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("joins", "gaps", "early")}
        early = self.early.to_pylist() if hasattr(self.early, "to_pylist") else list(self.early or [])
        return dict(out, gaps=self.gaps.scalars(), early=early)
