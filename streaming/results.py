"""Reading a run: sum the per-batch partials into per-window figures, gaps and a run summary.

Only batches whose bookkeeping file exists are read, so a reader never sees half a batch.
Everything here works on a live run (the job still writing) and on a finished one.
"""
from __future__ import annotations

import json
import os
from collections import OrderedDict

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from streaming import engine, histogram
from streaming.sinks import RunPaths, batch_file, ids_in

PERCENTILES = (50, 90, 99)


def run_config(root: str) -> dict:
    with open(RunPaths(root).run_file) as f:
        return json.load(f)


_BATCH_ROWS: "OrderedDict[str, tuple[tuple, dict]]" = OrderedDict()
_BATCH_ROWS_MAX = 50_000


def load_batches(root: str) -> pd.DataFrame:
    """One row per completed micro-batch: its bookkeeping (watermark, sizes, timings).

    Each file is read once (cached by its identity, as partials are): a live reader re-reads only new ones."""
    paths = RunPaths(root)
    rows = []
    for b in ids_in(paths.batches, "batch-*.json"):
        row = _cached_read(_BATCH_ROWS, _BATCH_ROWS_MAX, batch_file(paths.batches, b, "json"), _read_json)
        if row is not None:
            rows.append(row)
    return pd.DataFrame(rows)


def _read_json(path: str):
    with open(path) as f:
        return json.load(f)


def load_partials(root: str, kind: str, batch_ids=None) -> pd.DataFrame:
    """All partial rows of one kind (counts, hists, events), tagged with their batch ID (``batch_id``).

    A reader that lives as long as the run (the dashboard) re-reads only the files it has not read
    (``_read_partial``). The job's live verdict does not read them at all (``streaming.live``)."""
    paths = RunPaths(root)
    if batch_ids is None:
        batch_ids = ids_in(paths.batches, "batch-*.json")
    tables = []
    for b in batch_ids:
        t = _read_partial(batch_file(paths.partial(kind), b), b)
        if t is not None and t.num_rows:
            tables.append(t)
    return pa.concat_tables(tables, promote_options="permissive").to_pandas() if tables else pd.DataFrame()


_PARTIALS: "OrderedDict[str, tuple[tuple, pa.Table]]" = OrderedDict()
_PARTIALS_MAX = 20_000


def _file_identity(path: str) -> tuple | None:
    """(inode, mtime, size) of a batch file, None if absent: a batch file is written once, atomically, and
    rewritten whole only if its batch is redone, which changes all three."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def _read_partial(path: str, batch_id: int) -> pa.Table | None:
    """One batch's partial file with its ``batch_id``, cached by its identity (a live reader re-reads only what is new).

    A batch file is written once, atomically (rewritten whole only if its batch is redone after
    a crash, which changes its inode and mtime): the cache key is (inode, mtime, size). Kept as
    an Arrow table, not a DataFrame: every pandas frame built on a cached frame's arrays leaves a
    weak reference in it (copy-on-write bookkeeping, ~500 kept per block), and a reader that
    concatenates hundreds of cached frames on every pass grew by tens of MiB in a 15-minute soak.
    """
    return _cached_read(_PARTIALS, _PARTIALS_MAX, path, lambda p: _with_batch_id(p, batch_id))


def _with_batch_id(path: str, batch_id: int) -> pa.Table:
    t = pq.read_table(path)
    return t.append_column("batch_id", pa.array(np.full(t.num_rows, batch_id, dtype=np.int64)))


def _cached_read(cache: OrderedDict, limit: int, path: str, read):
    """``read(path)``, cached by the file's identity in ``cache`` (least recently used beyond ``limit``); None if absent."""
    key = _file_identity(path)
    if key is None:
        return None
    hit = cache.get(path)
    if hit is not None and hit[0] == key:
        cache.move_to_end(path)
        return hit[1]
    value = read(path)
    cache[path] = (key, value)
    if len(cache) > limit:
        cache.popitem(last=False)
    return value


def sum_counts(counts: pd.DataFrame) -> pd.DataFrame:
    """(window_ns, name, value) partials to one column per name, merged by sum (max for max:*)."""
    if counts.empty:
        return pd.DataFrame(index=pd.Index([], name="window_ns", dtype=np.int64))
    is_max = counts["name"].str.startswith(engine.MAX_PREFIX)
    summed = counts[~is_max].pivot_table(index="window_ns", columns="name", values="value", aggfunc="sum", fill_value=0)
    maxed = counts[is_max].pivot_table(index="window_ns", columns="name", values="value", aggfunc="max")
    return summed.join(maxed, how="outer") if len(maxed) else summed


def hist_figures(hists: pd.DataFrame, encode_hdr: bool = True) -> pd.DataFrame:
    """Per window and histogram: p50/p90/p99/max and (``encode_hdr``) the encoded HdrHistogram of the merged buckets."""
    if hists.empty:
        return pd.DataFrame(index=pd.Index([], name="window_ns", dtype=np.int64))
    merged = hists.groupby(["window_ns", "hist", "bucket"], as_index=False, sort=True)["count"].sum()
    w, h = merged["window_ns"].to_numpy(), merged["hist"].to_numpy()
    b, c = merged["bucket"].to_numpy(), merged["count"].to_numpy()
    cuts = np.flatnonzero((w[1:] != w[:-1]) | (h[1:] != h[:-1])) + 1
    rows: dict[int, dict] = {}
    for lo, hi in zip(np.concatenate(([0], cuts)), np.concatenate((cuts, [len(w)]))):
        idx, cnt, hist = b[lo:hi], c[lo:hi], h[lo]
        row = rows.setdefault(int(w[lo]), {"window_ns": int(w[lo])})
        for p, v in zip(PERCENTILES, histogram.percentiles(idx, cnt, list(PERCENTILES))):
            row[f"{hist}_p{p}"] = v
        row[f"{hist}_max"] = histogram.max_value(idx, cnt)
        if encode_hdr and hist == "latency_us":
            row["latency_hdr"] = histogram.encode(idx, cnt)
    return pd.DataFrame(list(rows.values())).set_index("window_ns")


def load_windows(root: str, encode_hdr: bool = True) -> pd.DataFrame:
    """The run's window table: one row per 1 s window from the first to the last with data.

    ``encode_hdr``: include each window's encoded HdrHistogram (``latency_hdr``; costly, the
    dashboard does without)."""
    cfg = run_config(root)
    window_ns, timeout_ns = cfg["window_ns"], cfg["drop_timeout_ns"]
    batches = load_batches(root)
    if batches.empty:
        return pd.DataFrame()
    counts = load_partials(root, "counts")
    table = sum_counts(counts)
    table = table.join(hist_figures(load_partials(root, "hists"), encode_hdr), how="outer")
    events = load_partials(root, "events")
    if not events.empty:
        node = events[events["kind"] == "node"]
        if len(node):
            node = node.assign(series="node:" + node["node"].astype(str) + ":" + node["metric"].astype(str))
            table = table.join(node.pivot_table(index="window_ns", columns="series", values="value", aggfunc="mean"), how="outer")
            holes = node[node["missing"].fillna(False).astype(bool)].groupby("window_ns").size().rename("node_samples_missing")
            table = table.join(holes, how="outer")
        oom = events[events["kind"] == "oom"]
        if len(oom):
            per_source = oom.assign(n=oom["count"].fillna(1)).groupby(["window_ns", "source"])["n"].sum()
            table = table.join(oom_kills_per_window(per_source), how="outer")
        restarts = events[events["kind"] == "restart"]
        if len(restarts):
            table = table.join(restarts.groupby("window_ns").size().rename("container_restarts"), how="outer")
        slow, dropped = exemplars(events, by_window=True)
        if len(slow):
            table = table.join(slow.groupby("window_ns").apply(_slowest_text, include_groups=False).rename("slowest"), how="outer")
        if len(dropped):
            table = table.join(dropped.groupby("window_ns")["event_id"].agg("; ".join).rename("first_dropped"), how="outer")
    if table.empty:
        return table
    full = np.arange(table.index.min(), table.index.max() + window_ns, window_ns, dtype=np.int64)
    table = table.reindex(pd.Index(full, name="window_ns"))
    for name in ("sent", "received", "dropped", "duplicates", "late", "errors", "acked", "oom_kills", "orphan_receives",
                 "container_restarts"):
        table[name] = table[name].fillna(0).astype(np.int64) if name in table else 0
    for name in [c for c in table.columns if c.startswith("errors:") or c.startswith("overflow:") or c in ("clock_skew", "repeated_send_records", "negative_send_delay")]:
        table[name] = table[name].fillna(0).astype(np.int64)
    for name in ("slowest", "first_dropped"):  # the events behind the window's percentiles and drops
        table[name] = table[name].fillna("") if name in table else ""
    # the part of each window inside a gap (``streaming.gaps``), in ms
    table["silence_ms"] = table.pop("silence_ns").fillna(0) / 1e6 if "silence_ns" in table else 0.0
    judged = int(batches["judged_ns"].max()) if "judged_ns" in batches and batches["judged_ns"].notna().any() else None
    status = window_status(table.index.to_numpy(), table, window_ns, timeout_ns, int(batches["watermark_ns"].max()),
                           bool(batches["finished"].any()), judged)
    table = pd.concat([table, pd.DataFrame(status, index=table.index)], axis=1)
    # When each window's figures reached the sink (for freshness): first and last batch touching it.
    written = batches.set_index("batch_id")["written_at_ns"]
    recv_rows = counts[counts["name"] == "received"] if not counts.empty else counts
    if len(recv_rows):
        at = recv_rows.assign(t=recv_rows["batch_id"].map(written)).groupby("window_ns")["t"]
        table["first_written_ns"], table["last_written_ns"] = at.min(), at.max()
    return table.reset_index()


def oom_kills_per_window(per_source: pd.Series) -> pd.Series:
    """OOM kills per window from kills per (window_ns, source). One kill is often seen by two detectors (vmstat
    and its cgroup): per window, the detector that saw most, not their sum."""
    return per_source.groupby(level="window_ns").max().rename("oom_kills")


def window_status(windows: np.ndarray, counts, window_ns: int, timeout_ns: int, watermark: int | None, finished: bool,
                  judged: int | None) -> dict[str, np.ndarray]:
    """in_flight, receive_complete, settled, drops_final and gap of every window from the first to the last
    (``windows``), from their ``counts`` (sent, received, errors, dropped): for the live verdict's table too."""
    sent, received = np.asarray(counts["sent"], np.int64), np.asarray(counts["received"], np.int64)
    # In flight at a window's end: sent - received - errors - drops whose deadline has passed.
    shift = timeout_ns // window_ns
    dropped = np.asarray(counts["dropped"], np.int64)
    dropped_at_deadline = np.concatenate((np.zeros(min(shift, len(dropped)), np.int64), dropped[:max(len(dropped) - shift, 0)]))
    in_flight = np.cumsum(sent - received - np.asarray(counts["errors"], np.int64) - dropped_at_deadline)
    # Complete once the watermark has passed; all of them once the run is finished (no send
    # comes after its stop, so no later record can change a window).
    ends = np.asarray(windows, np.int64) + window_ns
    never = np.zeros(len(ends), bool)
    complete = finished | ((ends <= watermark) if watermark is not None else never)
    # A gap window: nothing delivered while sending was under way and events were in flight.
    prev_in_flight = np.concatenate(([0], in_flight[:-1]))
    sending = np.flatnonzero(sent > 0)
    during = (np.arange(len(sent)) >= sending[0]) & (np.arange(len(sent)) <= sending[-1]) if len(sending) else never
    return {
        "in_flight": in_flight, "receive_complete": complete,
        # every agent that sends or receives has written past the window's end (``streaming.gaps``): its figures
        # are final, however far ahead another agent's partition has moved the watermark
        "settled": finished | ((ends <= judged) if judged is not None else never),
        "drops_final": finished | ((ends + timeout_ns <= watermark) if watermark is not None else never),
        "gap": (received == 0) & ((prev_in_flight > 0) | (sent > 0)) & during & complete}


def exemplars(events: pd.DataFrame, lo: int | None = None, hi: int | None = None,
              by_window: bool = False) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The slowest received events and the first dropped ones (``engine.EXEMPLARS`` of each), over the windows in
    [lo, hi) or per window: (slowest: event_id, at_ns, latency_us, window_ns; dropped: event_id, at_ns, window_ns).
    A withdrawn drop (its receive came in time after all, or an error ack) nets out."""
    from streaming.engine import EXEMPLARS

    empty = pd.DataFrame(columns=["event_id", "at_ns", "latency_us", "window_ns"])
    if events.empty or "event_id" not in events:
        return empty, empty.drop(columns="latency_us")
    sel = events
    if lo is not None:
        sel = sel[sel["window_ns"] >= lo]
    if hi is not None:
        sel = sel[sel["window_ns"] < hi]
    keys = ["window_ns"] if by_window else []
    slow = sel[sel["kind"] == "slowest"].rename(columns={"value": "latency_us"})
    slow = slow.sort_values(["latency_us", "at_ns"], ascending=[False, True], kind="stable")
    slow = slow.groupby(keys, sort=False).head(EXEMPLARS) if keys else slow.head(EXEMPLARS)
    d = sel[sel["kind"] == "dropped_id"]
    d = d.groupby("event_id", as_index=False).agg(at_ns=("at_ns", "min"), window_ns=("window_ns", "min"), n=("count", "sum"))
    d = d[d["n"] > 0].sort_values(["at_ns", "event_id"], kind="stable")
    d = d.groupby(keys, sort=False).head(EXEMPLARS) if keys else d.head(EXEMPLARS)
    return (slow[["event_id", "at_ns", "latency_us", "window_ns"]].reset_index(drop=True),
            d[["event_id", "at_ns", "window_ns"]].reset_index(drop=True))


def _exemplar_records(events: pd.DataFrame) -> dict:
    slow, dropped = exemplars(events)
    return {"slowest": [{"event_id": str(r.event_id), "at_ns": int(r.at_ns), "latency_ms": round(float(r.latency_us) / 1000, 3)}
                        for r in slow.itertuples()],
            "first_dropped": [{"event_id": str(r.event_id), "sent_at_ns": int(r.at_ns)} for r in dropped.itertuples()]}


def _slowest_text(g: pd.DataFrame) -> str:
    return "; ".join(f"{i} ({v / 1000:.1f} ms)" for i, v in zip(g["event_id"], g["latency_us"]))


GAP_COLUMNS = ["start_ns", "end_ns", "duration_s", "in_flight"]


def gaps(events: pd.DataFrame) -> pd.DataFrame:
    """The run's gaps, exact (``streaming.gaps``): start and end (ns, the receives around the silence),
    duration, and events in flight at the start. Retractions (negative partials) cancel what they undo."""
    g = events[events["kind"] == "gap"] if not events.empty else events
    if g.empty:
        return pd.DataFrame(columns=GAP_COLUMNS)
    net = g.groupby("at_ns").agg(duration_ns=("count", "sum"), in_flight=("value", "max"))
    net = net[net["duration_ns"] > 0]
    starts = net.index.to_numpy(np.int64)
    dur = net["duration_ns"].to_numpy(np.int64)
    return pd.DataFrame({"start_ns": starts, "end_ns": starts + dur, "duration_s": dur / 1e9,
                         "in_flight": net["in_flight"].to_numpy(np.int64)}, columns=GAP_COLUMNS)


def merged_percentiles(root: str, hist: str = "latency_us", start_ns: int | None = None, end_ns: int | None = None,
                       hists: pd.DataFrame | None = None) -> dict:
    """Exact (HDR-precision) percentiles over any time range, merged from the window histograms.

    ``hists``: the run's histogram partials when the caller has them already loaded.
    """
    h = load_partials(root, "hists") if hists is None else hists
    if h.empty:
        return percentile_figures(np.array([], np.int64), np.array([], np.int64))
    h = h[h["hist"] == hist]
    if start_ns is not None:
        h = h[h["window_ns"] >= start_ns]
    if end_ns is not None:
        h = h[h["window_ns"] < end_ns]
    return percentile_figures(h["bucket"].to_numpy(), h["count"].to_numpy())


def percentile_figures(idx: np.ndarray, cnt: np.ndarray) -> dict:
    """p50/p90/p99, max and count of histogram buckets (``streaming.histogram``; None where empty)."""
    ps = histogram.percentiles(idx, cnt, list(PERCENTILES))
    return {f"p{p}": v for p, v in zip(PERCENTILES, ps)} | {"max": histogram.max_value(idx, cnt), "count": int(np.sum(cnt))}


def load_quarantine(root: str) -> pd.DataFrame:
    paths = RunPaths(root)
    done = set(ids_in(paths.batches, "batch-*.json"))
    frames = [pq.read_table(batch_file(paths.quarantine, b)).to_pandas() for b in ids_in(paths.quarantine) if b in done]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def run_configuration(events: pd.DataFrame) -> dict:
    """The run's configuration: the run_start records' configs merged in time order (later ones add to it)."""
    out: dict = {}
    if events.empty or not (events["kind"] == "run_start").any():
        return out
    for text in events[events["kind"] == "run_start"].sort_values("at_ns")["config"].dropna():
        try:
            cfg = json.loads(text)
        except (ValueError, TypeError):
            continue
        if isinstance(cfg, dict):
            out.update(cfg)
    return out


def pace_steps(events: pd.DataFrame) -> list[dict]:
    """The schedule's steps in event time (``rate`` at the step's start, ``end_rate``, ``start_ns``, ``end_ns``)."""
    from loadgen.pacer import Schedule

    cfg = run_configuration(events)
    pace = cfg.get("pace")
    start = cfg.get("schedule_start_ns")
    if start is None and not events.empty and (events["kind"] == "run_start").any():
        start = int(events.loc[events["kind"] == "run_start", "at_ns"].min())
    if not pace or start is None:
        return []
    try:
        sched = Schedule.parse(str(pace))
    except (ValueError, TypeError):
        return []
    out, t = [], int(start)
    for step in sched.steps:
        out.append({"rate": float(step.rate_per_sec), "end_rate": float(step.final_rate_per_sec), "start_ns": t,
                    "end_ns": t + step.duration_ns})
        t += step.duration_ns
    return out


def run_verdict(root: str, windows: pd.DataFrame, events: pd.DataFrame, hists: pd.DataFrame | None = None,
                cfg: dict | None = None, percentiles=None) -> dict:
    """The saturation verdict and scalability profile (``streaming.saturation``) with exact per-step figures.

    ``percentiles(lo, hi)``: latency percentiles over the windows in [lo, hi) (default: ``merged_percentiles``
    over the histogram partials, ``hists`` if given)."""
    from streaming import saturation

    cfg = run_config(root) if cfg is None else cfg
    steps = pace_steps(events)
    if percentiles is None:
        h = load_partials(root, "hists") if hists is None else hists

        def percentiles(lo: int, hi: int) -> dict:
            return merged_percentiles(root, "latency_us", lo, hi, hists=h)
    counts = windows.set_index("window_ns")

    half = cfg["window_ns"] // 2

    def figures(lo: int, hi: int) -> dict:  # the windows whose middle lies in [lo, hi), as the detector assigns them
        lo, hi = lo - half, hi - half
        return {**saturation.step_counts(counts[(counts.index >= lo) & (counts.index < hi)]), "latency_us": percentiles(lo, hi)}
    return saturation.verdict(windows, steps, cfg["window_ns"], figures,
                              cfg.get("latency_bound_us", saturation.DEFAULT_LATENCY_BOUND_US))


def live_verdict(root: str) -> dict | None:
    """The verdict over the windows written so far (what the job publishes after each batch); None before data."""
    windows = load_windows(root, encode_hdr=False)
    if windows.empty or "sent" not in windows:
        return None
    return run_verdict(root, windows, load_partials(root, "events"))


def job_verdict(root: str) -> dict | None:
    """The verdict the streaming job last published for this run (``verdict.json``), if any."""
    try:
        with open(os.path.join(root, "verdict.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _records(events: pd.DataFrame, kind: str, columns: list[str]) -> list[dict]:
    if events.empty:
        return []
    sel = events[events["kind"] == kind][columns].sort_values("at_ns")
    return [{k: (None if isinstance(v, float) and v != v else v) for k, v in r.items()} for r in sel.to_dict("records")]


def telemetry_lost(events: pd.DataFrame) -> dict[str, int]:
    """Per agent, the records it reported it had to refuse (a re-sent report is counted once)."""
    if events.empty or not (events["kind"] == "lost").any():
        return {}
    lost = events[events["kind"] == "lost"].drop_duplicates(["agent", "at_ns", "count"])
    return {str(a): int(n) for a, n in lost.groupby("agent")["count"].sum().items() if n}


CLOCK_FLAG_US = 1000.0
"""A clock offset beyond ±1 ms is flagged: latencies measured across those hosts are off by it."""


def clock_offsets(events: pd.DataFrame) -> list[dict]:
    """Per agent, its latest clock offset against the reference (``reference − agent``) and the round trip."""
    if events.empty or not (events["kind"] == "clock").any():
        return []
    clocks = events[events["kind"] == "clock"].sort_values("at_ns").groupby("agent").agg(
        reference=("reference", "last"), offset_us=("offset_us", "last"), rtt_us=("rtt_us", "last"),
        max_abs_offset_us=("offset_us", lambda v: float(np.abs(v).max())), samples=("offset_us", "size"))
    out = []
    for agent, r in clocks.iterrows():
        out.append({"agent": agent, "reference": r["reference"], "offset_us": float(r["offset_us"]),
                    "rtt_us": float(r["rtt_us"]), "max_abs_offset_us": r["max_abs_offset_us"], "samples": int(r["samples"]),
                    "flagged": bool(r["max_abs_offset_us"] > CLOCK_FLAG_US)})
    return out


def summarize(root: str, windows: pd.DataFrame | None = None) -> dict:
    """Run-level figures: totals, exact run percentiles, errors by cause, gaps, OOM events."""
    cfg = run_config(root)
    windows = load_windows(root) if windows is None else windows
    batches = load_batches(root)
    if windows.empty:
        return {"run_id": cfg["run_id"], "state": "waiting for data"}
    total = {c: int(windows[c].sum()) for c in ("sent", "received", "dropped", "duplicates", "late", "errors", "orphan_receives", "oom_kills")}
    errors = {c.split(":", 1)[1]: int(windows[c].sum()) for c in windows.columns if c.startswith("errors:")}
    events = load_partials(root, "events")
    hists = load_partials(root, "hists")
    ooms = _records(events, "oom", ["at_ns", "source", "where", "count", "victim"] if "victim" in events else
                    ["at_ns", "source", "where", "count"])
    by_source: dict[str, int] = {}
    for o in ooms:
        by_source[o["source"]] = by_source.get(o["source"], 0) + int(o["count"] or 1)
    total["oom_kills"] = max(by_source.values(), default=0)
    starts = events[events["kind"] == "run_start"]["at_ns"] if not events.empty else []
    stops = events[events["kind"] == "run_stop"]["at_ns"] if not events.empty else []
    finished = bool(len(batches) and batches["finished"].any())
    return {
        "run_id": cfg["run_id"],
        "state": "finished" if finished else "running",
        "started_at_ns": int(min(starts)) if len(starts) else None,
        "stopped_at_ns": int(max(stops)) if len(stops) else None,
        "stop_reasons": _records(events, "run_stop", ["at_ns", "agent", "reason"]),
        "aborted": bool(len(stops)) and any(str(r).startswith(("aborted", "failed"))
                                            for r in events.loc[events["kind"] == "run_stop", "reason"].dropna()),
        "num_windows": int(len(windows)),
        **total,
        "loss_ratio": (total["dropped"] / total["sent"]) if total["sent"] else None,
        "errors_by_cause": errors,
        "quarantined": int(batches["num_quarantined"].sum()) if len(batches) else 0,
        **{name: merged_percentiles(root, name, hists=hists)
           for name in ("latency_us", "latency_intended_us", "send_delay_us")},
        "exemplars": _exemplar_records(events),
        "gaps": [{"start_ns": int(g.start_ns), "end_ns": int(g.end_ns), "duration_s": float(g.duration_s),
                  "in_flight": int(g.in_flight)} for g in gaps(events).itertuples()],
        "oom_events": ooms,
        "oom_kills_by_source": by_source,
        "container_restarts": _records(events, "restart", ["at_ns", "where", "reason", "count"]),
        "clock_offsets": clock_offsets(events),
        "telemetry_lost": telemetry_lost(events),
        # while live, the job's own verdict (one detector for the UI, the CLI and CI); at the end, recomputed here
        "verdict": (live if not finished and (live := job_verdict(root)) else run_verdict(root, windows, events, hists, cfg)),
        "watermark_ns": int(batches["watermark_ns"].max()) if len(batches) else None,
        "num_batches": int(len(batches)),
    }
