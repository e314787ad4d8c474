"""Gaps exact to the nanosecond: receive silences while events are in flight, from every receive stamp.

A gap lasts from a receive to the next one (ns edges) when

* the silence is longer than ``max(MIN_GAP_NS, GAP_INTERARRIVALS`` expected inter-arrivals at the send rate
  of the second before it starts) (no send in that second: the run's tail, not a stall), and
* events are in flight during it: more sends than receives up to its start, or a send within it (at a low
  rate the last receive can leave nothing in flight, and the next events are the ones held), and
* it starts before the run's stop record (after it, receives thin out as the last events arrive: the run's tail).

Stamps wait in the tracker until every agent that sends or receives has written past them (each agent's records
come in order, a sender's within ``contract.SEND_HOLD_NS``; the job's watermark is no guide, since one Kafka partition can run seconds ahead of another); a
silence is then judged with every send and receive around it known, so the gaps do not depend on how the
records were cut into micro-batches. Once the run closes, everything left is judged. A receive that still comes
behind that point (an agent writing out of order, or a new one) and falls inside a declared gap splits it: the
gap is retracted (a negative partial) and what is left of it is declared again.

Partials: an event ``kind="gap"`` at the gap's start with ``count`` = its duration in ns (negative: a
retraction) and ``value`` = events in flight at its start; and per window the count ``silence_ns``, the
part of the window inside a gap. Both sum like every other partial.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

MIN_GAP_NS = 100_000_000
GAP_INTERARRIVALS = 20
RATE_LOOKBACK_NS = 1_000_000_000
"""The send rate at a silence's start is the number of sends in the second before it."""
NO_TIME_NS = -(2**62)
_I64 = np.int64


def _empty() -> np.ndarray:
    return np.array([], dtype=_I64)


@dataclass
class GapTracker:
    """Send and receive stamps not yet judged (``done_ns``), the counts of those that are, and each agent's progress."""

    sends: np.ndarray = field(default_factory=_empty)   # sorted; from min(last_recv, done) - RATE_LOOKBACK_NS on
    recvs: np.ndarray = field(default_factory=_empty)   # sorted; after ``done_ns``
    done_ns: int = NO_TIME_NS         # receives up to here are final
    last_recv_ns: int = NO_TIME_NS    # the newest final receive: a silence open at ``done_ns`` starts here
    sends_before: int = 0             # sends older than ``sends[0]``'s window, dropped from the array
    recvs_done: int = 0               # final receives
    recent: list = field(default_factory=list)   # declared gaps [start, end, in_flight, threshold] kept for late receives
    progress: dict = field(default_factory=dict)  # per sending or receiving agent, the newest stamp it wrote
    stopped: list = field(default_factory=list)   # agents whose stop record came: they write nothing more

    def copy(self) -> GapTracker:
        """A tracker to change without changing this one (its methods replace the arrays, never write into them)."""
        return dataclasses.replace(self, recent=list(self.recent), progress=dict(self.progress), stopped=list(self.stopped))

    def scalars(self) -> dict:
        return {"done_ns": self.done_ns, "last_recv_ns": self.last_recv_ns, "sends_before": self.sends_before,
                "recvs_done": self.recvs_done, "recent": self.recent, "progress": self.progress, "stopped": self.stopped}

    def note(self, records, data: np.ndarray, stops: np.ndarray, through_ns: np.ndarray | None = None) -> None:
        """A batch's records (an Arrow table with ``agent`` and ``at_ns``): ``data`` where the record is a send,
        ack or receive (the agents whose progress holds judgement back), ``stops`` where it is an agent's stop;
        ``through_ns``: per record, up to when its agent has written every stamp (``run_rules.written_through``;
        ``at_ns`` when not given)."""
        import pyarrow as pa

        if records.num_rows == 0:
            return
        t = records.select(["agent", "at_ns"]) if through_ns is None else pa.table(
            {"agent": records["agent"], "at_ns": pa.array(through_ns, pa.int64())})
        t = t.append_column("data", pa.array(data))
        for row in t.group_by("agent").aggregate([("at_ns", "max"), ("data", "any")]).to_pylist():
            agent = row["agent"]
            if agent in self.progress or row["data_any"]:
                self.progress[agent] = max(int(row["at_ns_max"]), self.progress.get(agent, NO_TIME_NS))
        if stops.any():
            for agent in set(records["agent"].filter(pa.array(stops)).to_pylist()) - set(self.stopped):
                self.stopped.append(str(agent))

    def judged_until(self, closing: bool) -> int:
        """Receives up to here can be judged: every agent still writing has written past it."""
        if closing:
            return 2**62
        live = [at for agent, at in self.progress.items() if agent not in self.stopped]
        return min(live) if live else (max(self.progress.values()) if self.progress else NO_TIME_NS)

    def stamps(self) -> pd.DataFrame:
        return pd.DataFrame({"kind": np.r_[np.zeros(len(self.sends), np.int8), np.ones(len(self.recvs), np.int8)],
                             "at_ns": np.r_[self.sends, self.recvs].astype(_I64)})

    @classmethod
    def restore(cls, scalars: dict, stamps: pd.DataFrame) -> GapTracker:
        kind, at = stamps["kind"].to_numpy(), stamps["at_ns"].to_numpy(_I64)
        return cls(sends=np.sort(at[kind == 0]), recvs=np.sort(at[kind == 1]), **scalars)

    def _sent_through(self, t: np.ndarray) -> np.ndarray:
        return self.sends_before + np.searchsorted(self.sends, t, side="right")

    def _threshold_ns(self, t: np.ndarray) -> np.ndarray:
        rate = np.searchsorted(self.sends, t, side="left") - np.searchsorted(self.sends, t - RATE_LOOKBACK_NS, side="left")
        with np.errstate(divide="ignore"):
            expected = np.where(rate > 0, GAP_INTERARRIVALS * RATE_LOOKBACK_NS / np.maximum(rate, 1), np.inf)
        return np.maximum(float(MIN_GAP_NS), expected)

    def advance(self, new_sends: np.ndarray, new_recvs: np.ndarray, until_ns: int,
                stop_ns: int | None = None) -> list[tuple[int, int, int]]:
        """Take a batch's new stamps (after ``note``), judge the silences up to ``until_ns`` (``judged_until``); return
        the gaps declared or retracted: (start_ns, signed duration_ns, in flight). ``stop_ns``: the run's stop, when
        known (the stop record comes before anything its agent would write after it)."""
        out: list[tuple[int, int, int]] = []
        new_sends = np.asarray(new_sends, dtype=_I64)
        new_recvs = np.asarray(new_recvs, dtype=_I64)
        old = new_sends < self._keep_from()
        self.sends_before += int(old.sum())
        self.sends = np.sort(np.r_[self.sends, new_sends[~old]], kind="stable")  # radix sort: O(n) on int64
        late = new_recvs[new_recvs <= self.done_ns]
        for x in np.sort(late):
            out += self._late_receive(int(x))
        self.recvs = np.sort(np.r_[self.recvs, new_recvs[new_recvs > self.done_ns]], kind="stable")
        if until_ns <= self.done_ns:
            return out
        final = self.recvs[self.recvs <= until_ns]
        if len(final):
            seq = np.r_[[self.last_recv_ns], final] if self.last_recv_ns != NO_TIME_NS else final
            if len(seq) > 1:
                start, end = seq[:-1], seq[1:]
                recv_through = self.recvs_done + np.arange(len(start))  # receives up to and including each start
                if self.last_recv_ns == NO_TIME_NS:
                    recv_through = recv_through + 1
                in_flight = self._sent_through(start) - recv_through
                threshold = self._threshold_ns(start)
                sent_within = self._sent_through(end - 1) - self._sent_through(start)
                hit = ((end - start) > threshold) & ((in_flight > 0) | (sent_within > 0)) & (start < (stop_ns if stop_ns is not None else np.inf))
                for a, b, n, th in zip(start[hit], end[hit], in_flight[hit], threshold[hit]):
                    out.append((int(a), int(b - a), int(n)))
                    self.recent.append([int(a), int(b), int(n), float(th)])
            self.last_recv_ns = int(final[-1])
            self.recvs_done += len(final)
            self.recvs = self.recvs[len(final):]
        self.done_ns = int(until_ns)
        n_old = int(np.searchsorted(self.sends, self._keep_from(), side="left"))
        self.sends_before += n_old
        self.sends = self.sends[n_old:]
        return out

    def _keep_from(self) -> int:
        """Sends older than this are only counted: the next silence starts at the last final receive, or (none
        yet: every event dropped so far) at a receive after ``done_ns``; its rate looks back a second from there."""
        since = self.done_ns if self.last_recv_ns == NO_TIME_NS else min(self.last_recv_ns, self.done_ns)
        return since - RATE_LOOKBACK_NS

    def _late_receive(self, x: int) -> list[tuple[int, int, int]]:
        """A receive behind ``done_ns``: split the declared gap it falls in (if any)."""
        self.recvs_done += 1
        self.last_recv_ns = max(self.last_recv_ns, x)
        for i, (a, b, n, th) in enumerate(self.recent):
            if a < x < b:
                del self.recent[i]
                out = [(a, -(b - a), n)]
                for lo, hi, k in ((a, x, n), (x, b, max(n - 1, 0))):
                    if hi - lo > th and k > 0:
                        out.append((lo, hi - lo, k))
                        self.recent.append([lo, hi, k, th])
                return out
        return []

    def forget(self, before_ns: int) -> None:
        """Declared gaps that ended before this can no longer be split."""
        self.recent = [g for g in self.recent if g[1] >= before_ns]


def silence_by_window(gaps: list[tuple[int, int, int]], window_ns: int) -> tuple[np.ndarray, np.ndarray]:
    """(an instant in each window a gap covers, the signed ns of that window inside the gap)."""
    at, ns = [], []
    for start, signed, _ in gaps:
        end, sign = start + abs(signed), (1 if signed > 0 else -1)
        w = (start // window_ns) * window_ns
        while w < end:
            lo, hi = max(start, w), min(end, w + window_ns)
            at.append(lo)
            ns.append(sign * (hi - lo))
            w += window_ns
    return np.asarray(at, dtype=_I64), np.asarray(ns, dtype=_I64)
