"""A micro-batch's partial outputs, per window: additive counts (merged as ``core.output.merges_by_max`` says), sparse histogram buckets and the
exemplar rows (the slowest deliveries, the first drops) that readers merge over any time range."""
from __future__ import annotations

import numpy as np
import pandas as pd

from core import histogram, output
from core.output import EXEMPLARS


def window_of(at_ns, window_ns: int) -> np.ndarray:
    """The start of each stamp's window."""
    return (np.asarray(at_ns, dtype=np.int64) // window_ns) * window_ns


class Collector:
    """Accumulates (window, name, value) triples (names: ``core.output``) and histogram values for one batch."""

    def __init__(self, window_ns: int) -> None:
        self.window_ns = window_ns
        self.counts: list[pd.DataFrame] = []
        self.hist_parts: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {h: [] for h in output.HISTS}
        self.summed_hists: list[pd.DataFrame] = []  # other collectors' ``hists_frame``s (``take``)

    def take(self, counts: pd.DataFrame, hists: pd.DataFrame) -> None:
        """Add a join partition's partials, already summed per window (its ``counts_frame`` and ``hists_frame``)."""
        if len(counts):
            self.counts.append(counts)
        if len(hists):
            self.summed_hists.append(hists)

    def window(self, at_ns) -> np.ndarray:
        return window_of(at_ns, self.window_ns)

    def add(self, name: str, at_ns, values=1) -> None:
        at_ns = np.asarray(at_ns, dtype=np.int64)
        if at_ns.size == 0:
            return
        values = np.broadcast_to(np.asarray(values, dtype=np.int64), at_ns.shape)
        self.counts.append(pd.DataFrame({"window_ns": self.window(at_ns), "name": name, "value": values}))

    def add_names(self, names, at_ns) -> None:
        at_ns = np.asarray(at_ns, dtype=np.int64)
        if at_ns.size:
            self.counts.append(pd.DataFrame({"window_ns": self.window(at_ns), "name": np.asarray(names, dtype=object), "value": 1}))

    def record(self, hist: str, at_ns, values_us, clock_skew_name: str | None = None) -> None:
        """Histogram values by window; negatives and overflows are counted, never lost."""
        at_ns = np.asarray(at_ns, dtype=np.int64)
        values_us = np.asarray(values_us, dtype=np.int64)
        negative = values_us < 0
        overflow = values_us > histogram.HIGHEST_US
        if negative.any() and clock_skew_name:
            self.add(clock_skew_name, at_ns[negative])
        if overflow.any():
            self.add(f"overflow:{hist}", at_ns[overflow])
        ok = ~(negative | overflow)
        self.hist_parts[hist].append((at_ns[ok], values_us[ok]))

    def counts_frame(self) -> pd.DataFrame:
        if not self.counts:
            return pd.DataFrame({"window_ns": pd.Series(dtype=np.int64), "name": pd.Series(dtype=object), "value": pd.Series(dtype=np.int64)})
        df = pd.concat(self.counts, ignore_index=True)
        is_max = df["name"].pipe(output.merges_by_max)
        summed = df[~is_max].groupby(["window_ns", "name"], as_index=False, sort=True)["value"].sum()
        maxed = df[is_max].groupby(["window_ns", "name"], as_index=False, sort=True)["value"].max()
        out = pd.concat([summed, maxed], ignore_index=True)
        return out[out["value"] != 0].reset_index(drop=True) if len(out) else out

    def hists_frame(self) -> pd.DataFrame:
        frames = []
        for hist, parts in self.hist_parts.items():
            if not parts:
                continue
            at_ns = np.concatenate([p[0] for p in parts])
            values = np.concatenate([p[1] for p in parts])
            if at_ns.size == 0:
                continue
            widx = at_ns // self.window_ns
            key = widx * histogram.NUM_BUCKETS + histogram.bucket_index(values)
            ukey, cnt = np.unique(key, return_counts=True)
            frames.append(pd.DataFrame({
                "window_ns": (ukey // histogram.NUM_BUCKETS) * self.window_ns,
                "hist": hist,
                "bucket": (ukey % histogram.NUM_BUCKETS).astype(np.int32),
                "count": cnt.astype(np.int64),
            }))
        if not frames and not self.summed_hists:
            return pd.DataFrame({"window_ns": pd.Series(dtype=np.int64), "hist": pd.Series(dtype=object),
                                 "bucket": pd.Series(dtype=np.int32), "count": pd.Series(dtype=np.int64)})
        out = pd.concat(frames + self.summed_hists, ignore_index=True)
        if self.summed_hists and len(frames) + len(self.summed_hists) > 1:  # the same buckets from several partitions
            out = out.groupby(["window_ns", "hist", "bucket"], as_index=False, sort=True)["count"].sum()
        return out


def slowest(at_ns: np.ndarray, latency_ns: np.ndarray, ids: np.ndarray, window_ns: int) -> pd.DataFrame:
    """Per window, the ``EXEMPLARS`` slowest of these deliveries (``kind="slowest"``, ``value`` in µs)."""
    if len(at_ns) == 0:
        return pd.DataFrame()
    w = at_ns // window_ns
    order = np.lexsort((at_ns, -latency_ns, w))  # by window, slowest first, then earliest
    ws = w[order]
    rank = np.arange(len(order)) - np.searchsorted(ws, ws, side="left")
    pick = order[rank < EXEMPLARS]
    return pd.DataFrame({"kind": "slowest", "at_ns": at_ns[pick].astype(np.int64),
                         "value": latency_ns[pick] / 1000, "event_id": ids[pick]})


def ids(known: pd.DataFrame, positions: np.ndarray) -> np.ndarray:
    """The ID strings of these rows of ``known`` (only these: the column is Arrow-backed, and turning all of it
    into Python strings every batch cost more than the rest of the join)."""
    return known["id"].iloc[positions].to_numpy(object)


def first_dropped(sent_ns: np.ndarray, known: pd.DataFrame, positions: np.ndarray, window_ns: int) -> pd.DataFrame:
    """Per window of their sends, the ``EXEMPLARS`` first of these drops (``kind="dropped_id"``, ``count`` 1)."""
    if len(positions) == 0:
        return pd.DataFrame()
    order = np.lexsort((sent_ns, sent_ns // window_ns))
    w = (sent_ns // window_ns)[order]
    rank = np.arange(len(order)) - np.searchsorted(w, w, side="left")
    pick = order[rank < EXEMPLARS]
    return pd.DataFrame({"kind": "dropped_id", "at_ns": sent_ns[pick].astype(np.int64), "count": 1,
                         "event_id": ids(known, positions[pick])})
