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
    """Accumulates (window, name, value) triples (names: ``core.output``) and histogram values for one batch.

    Counts are summed (``max:*`` names: maxed) per window and name as they come: a batch's records fall in a few
    windows, so this holds a few entries per name, where a row per record and a groupby at the end cost a fifth of
    the join at 5,000 events/s."""

    def __init__(self, window_ns: int) -> None:
        self.window_ns = window_ns
        self.sums: dict[tuple[int, str], int] = {}
        self.maxes: dict[tuple[int, str], int] = {}
        self.hist_parts: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {h: [] for h in output.HISTS}
        self.summed_hists: list[pd.DataFrame] = []  # other collectors' ``hists_frame``s (``take``)

    def _merge(self, window_ns: int, name: str, value: int) -> None:
        if output.merges_by_max(name):
            key = (window_ns, name)
            self.maxes[key] = max(self.maxes.get(key, value), value)
        else:
            self.sums[(window_ns, name)] = self.sums.get((window_ns, name), 0) + value

    def take(self, counts: pd.DataFrame, hists: pd.DataFrame) -> None:
        """Add a join partition's partials, already summed per window (its ``counts_frame`` and ``hists_frame``)."""
        for w, name, value in zip(counts["window_ns"].tolist(), counts["name"].tolist(), counts["value"].tolist()):
            self._merge(w, name, value)
        if len(hists):
            self.summed_hists.append(hists)

    def window(self, at_ns) -> np.ndarray:
        return window_of(at_ns, self.window_ns)

    def add(self, name: str, at_ns, values=1) -> None:
        at_ns = np.asarray(at_ns, dtype=np.int64)
        if at_ns.size == 0:
            return
        windows, which = np.unique(self.window(at_ns), return_inverse=True)
        values = np.asarray(values, dtype=np.int64)
        if output.merges_by_max(name):
            per = np.full(len(windows), np.iinfo(np.int64).min, dtype=np.int64)
            np.maximum.at(per, which, np.broadcast_to(values, which.shape))
        elif values.ndim == 0:
            per = np.bincount(which, minlength=len(windows)).astype(np.int64) * values
        else:
            per = np.zeros(len(windows), dtype=np.int64)
            np.add.at(per, which, values)
        for w, value in zip(windows.tolist(), per.tolist()):
            self._merge(w, name, value)

    def add_names(self, names, at_ns) -> None:
        at_ns = np.asarray(at_ns, dtype=np.int64)
        for w, name in zip(self.window(at_ns).tolist(), np.asarray(names, dtype=object).tolist()):
            self._merge(w, name, 1)

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
        """The counts, a row per window and name (sums first, then maxes; each by window and name), zeros left out."""
        rows = [(w, n, v) for part in (self.sums, self.maxes) for (w, n), v in sorted(part.items()) if v != 0]
        if not rows:
            return pd.DataFrame({"window_ns": pd.Series(dtype=np.int64), "name": pd.Series(dtype=object), "value": pd.Series(dtype=np.int64)})
        windows, names, values = zip(*rows)
        return pd.DataFrame({"window_ns": np.array(windows, dtype=np.int64), "name": list(names),
                             "value": np.array(values, dtype=np.int64)})

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


def misrouted(at_ns: np.ndarray, ids: np.ndarray, routes: np.ndarray) -> pd.DataFrame:
    """Misrouted receives (``kind="misrouted_id"``, at the receive, ``value`` the route it arrived on, ``count`` 1):
    every one (they are rare, and each is a fault of the system under test worth its name)."""
    return pd.DataFrame({"kind": "misrouted_id", "at_ns": at_ns.astype(np.int64), "value": routes.astype(np.float64),
                         "count": 1, "event_id": ids})


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
