"""The live verdict's window table, kept up to date batch by batch in the job's driver.

``results.load_windows`` builds the run's full window table from the partial files: every column, for
the dashboard and the summary. The job's live verdict needs a few of them after every batch, and
rebuilding them from the files took 0.2-0.3 s of CPU a pass at 1,000 events/s, growing with the run
(a third of the driver's core, and the verdict more than 3 s late). ``LiveWindows`` adds what each
batch's partials bring to per-window sums, histogram buckets and node means (a pass costs what the
batch adds, plus one pass of the rules over the windows), and gives the verdict the same table and the
same per-step figures ``results.run_verdict`` computes from the files (tested equal after every batch).
"""
from __future__ import annotations

import os
from collections import defaultdict

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from core import histogram, output
from core.rundir import RunPaths, batch_file
from runs import results, table
from runs.reader import RunReader

COUNTS = (output.SENT, output.RECEIVED, output.DROPPED, output.ERRORS)
"""Window counts the rules read (``saturation.assess_windows``) and the step figures sum."""
RANGE_KINDS = ("node", "oom", "restart", "slowest", "dropped_id")
"""Event kinds that give a window a row of the full table (``results.load_windows``): the live table spans the same."""


class LiveWindows:
    """Per-window figures of one run, fed each batch's partials (``add``); ``verdict()`` gives the live verdict."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.cfg = RunReader(root).settings()
        self.window_ns = self.cfg["window_ns"]
        self.counts: dict[str, dict[int, int]] = {c: defaultdict(int) for c in COUNTS}
        self.buckets: dict[int, list[tuple[np.ndarray, np.ndarray]]] = defaultdict(list)  # window -> latency_us parts
        self.delay_buckets: dict[int, list[tuple[np.ndarray, np.ndarray]]] = defaultdict(list)  # send_delay_us parts
        self.last_table: pd.DataFrame | None = None          # the table of the latest verdict pass (for metrics)
        self.p99: dict[int, int | None] = {}                 # per window, cached until a batch adds to it
        self.ranges: dict[tuple[int, int], tuple[np.ndarray, dict[int, int]]] = {}  # (lo, hi) -> buckets, parts in
        self.node: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0.0, 0]))  # sum, n
        self.oom: dict[tuple[int, str], float] = defaultdict(float)  # (window, source) -> kills
        self.starts = pd.DataFrame(columns=["kind", "at_ns", "config"])  # run_start records: the schedule
        self.ooms = pd.DataFrame(columns=["kind", "at_ns", "source", "where"])  # oom records: where and when
        self.lo = self.hi = None                             # the first and last window with data
        self.watermark = self.judged = None
        self.finished = False

    @classmethod
    def from_files(cls, root: str, before_batch: int) -> LiveWindows:
        """The table as it stood after batch ``before_batch - 1``, from the partial files (a restarted job)."""
        live = cls(root)
        paths, run = RunPaths(root), RunReader(root)
        for b in [b for b in run.batch_ids() if b < before_batch]:
            parts = {}
            for kind in ("counts", "hists", "events"):
                f = batch_file(paths.partial(kind), b)
                parts[kind] = pq.read_table(f).to_pandas() if os.path.exists(f) else pd.DataFrame()
            live.add(parts["counts"], parts["hists"], parts["events"], run.batch_info(b))
        return live

    def _span(self, windows) -> None:
        if len(windows):
            lo, hi = int(np.min(windows)), int(np.max(windows))
            self.lo = lo if self.lo is None else min(self.lo, lo)
            self.hi = hi if self.hi is None else max(self.hi, hi)

    def add(self, counts: pd.DataFrame, hists: pd.DataFrame, events: pd.DataFrame, info: dict) -> None:
        """One batch's partials (``engine.BatchResult``) and its bookkeeping (watermark, judged, finished)."""
        if len(counts):  # a few rows a batch: the engine sums per window and name
            windows = counts["window_ns"].to_numpy(np.int64)
            self._span(windows)
            for name, w, v in zip(counts["name"].to_numpy(object), windows.tolist(), counts["value"].to_numpy(np.int64).tolist()):
                if name in self.counts:
                    self.counts[name][w] += v
        if len(hists):
            all_w = hists["window_ns"].to_numpy(np.int64)
            self._span(all_w)
            names = hists["hist"].to_numpy(object)
            for hist, into in ((output.LATENCY, self.buckets), (output.SEND_DELAY, self.delay_buckets)):
                sel = names == hist
                w, idx, cnt = all_w[sel], hists["bucket"].to_numpy(np.int64)[sel], hists["count"].to_numpy(np.int64)[sel]
                order = np.argsort(w, kind="stable")
                w, idx, cnt = w[order], idx[order], cnt[order]
                cuts = np.flatnonzero(w[1:] != w[:-1]) + 1
                for lo, hi in zip(np.concatenate(([0], cuts)).tolist(), np.concatenate((cuts, [len(w)])).tolist()):
                    if hi > lo:
                        into[int(w[lo])].append((idx[lo:hi], cnt[lo:hi]))
                        if hist == output.LATENCY:
                            self.p99.pop(int(w[lo]), None)
        if len(events):
            kinds = events["kind"].to_numpy(object)
            windows = events["window_ns"].to_numpy(np.int64)
            self._span(windows[np.isin(kinds, RANGE_KINDS)])
            node = np.flatnonzero(kinds == "node")
            if len(node):  # a few a second
                names = events["node"].to_numpy(object)[node]
                metrics = events["metric"].to_numpy(object)[node]
                values = events["value"].to_numpy(float, na_value=np.nan)[node]
                for n, m, w, v in zip(names, metrics, windows[node].tolist(), values.tolist()):
                    if v == v:
                        acc = self.node[output.node_column(n, m)][w]
                        acc[0] += v
                        acc[1] += 1
            oom = np.flatnonzero(kinds == "oom")
            if len(oom):
                counts_ = events["count"].to_numpy(float, na_value=np.nan)[oom]
                for w, src, n in zip(windows[oom].tolist(), events["source"].to_numpy(object)[oom], counts_.tolist()):
                    self.oom[(w, src)] += 1.0 if n != n else n
            if (kinds == "run_start").any():
                self.starts = pd.concat([self.starts, events.loc[kinds == "run_start", ["kind", "at_ns", "config"]]],
                                        ignore_index=True)
            if len(oom):  # the verdict names where they were (``runs.verdict``)
                self.ooms = pd.concat([self.ooms, events.iloc[oom].reindex(columns=self.ooms.columns)], ignore_index=True)
        if info.get("watermark_ns") is not None:
            self.watermark = max(self.watermark or info["watermark_ns"], info["watermark_ns"])
        if info.get("judged_ns") is not None:
            self.judged = max(self.judged or info["judged_ns"], info["judged_ns"])
            # send delay is kept for the metrics' latest settled window only: a few windows back
            old = [w for w in self.delay_buckets if w < self.judged - 10 * self.window_ns]
            for w in old:
                del self.delay_buckets[w]
        self.finished |= bool(info.get("finished"))

    def _window_p99(self, w: int) -> float:
        if w not in self.p99:
            parts = self.buckets.get(w)
            if not parts:
                return np.nan
            self.p99[w] = histogram.percentiles(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]),
                                                [99])[0]
        v = self.p99[w]
        return np.nan if v is None else float(v)

    def table(self) -> pd.DataFrame:
        """The window table the rules read: the columns of ``results.load_windows`` they use, the same rows."""
        if self.lo is None:
            return pd.DataFrame()
        index = np.arange(self.lo, self.hi + self.window_ns, self.window_ns, dtype=np.int64)
        keys = index.tolist()
        cols: dict[str, np.ndarray] = {output.WINDOW: index}
        for c in COUNTS:
            per = self.counts[c]
            cols[c] = np.array([per.get(w, 0) for w in keys], np.int64)
        if self.buckets:
            cols[output.percentile_column(output.LATENCY, 99)] = np.array([self._window_p99(w) for w in keys], float)
        for series, per in sorted(self.node.items()):
            cols[series] = np.array([per[w][0] / per[w][1] if w in per else np.nan for w in keys], float)
        kills = (table.oom_kills_per_window(pd.Series(self.oom, dtype=float).rename_axis(["window_ns", "source"]))
                 if self.oom else pd.Series(dtype=float))
        cols[output.OOM_KILLS] = kills.reindex(index, fill_value=0).to_numpy(np.int64)
        cols.update(table.window_status(index, cols, self.window_ns, self.cfg["drop_timeout_ns"], self.watermark,
                                          self.finished, self.judged))
        return pd.DataFrame(cols)

    def merged_percentiles(self, lo: int, hi: int) -> dict:
        """Latency percentiles over the windows in [lo, hi), as ``results.merged_percentiles`` gives them."""
        # dense buckets of the range, kept from pass to pass: a pass adds only the parts batches added since
        dense, used = self.ranges.get((lo, hi)) or (np.zeros(histogram.NUM_BUCKETS, np.int64), {})
        for w, parts in self.buckets.items():
            if lo <= w < hi and used.get(w, 0) < len(parts):
                for i, c in parts[used.get(w, 0):]:
                    np.add.at(dense, i, c)
                used[w] = len(parts)
        self.ranges[(lo, hi)] = (dense, used)
        idx = np.flatnonzero(dense)
        return table.percentile_figures(idx, dense[idx])

    def verdict(self) -> dict | None:
        """The live verdict (``results.live_verdict``'s, without reading a file); None before data."""
        t = self.table()
        self.last_table = t
        if t.empty:
            return None
        events = pd.concat([self.starts, self.ooms], ignore_index=True) if len(self.ooms) else self.starts
        return results.run_verdict(self.root, t, events, cfg=self.cfg, percentiles=self.merged_percentiles)

