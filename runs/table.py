"""The window table and the run's derived figures, as pure functions of a run's partials: counts merged by sum
(``max:*`` by max), histogram percentiles, OOM kills, in-flight and gap status, exemplars, gaps.

Works on a live run (the job still writing) and on a finished one.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from core import histogram, output

PERCENTILES = output.PERCENTILES


def sum_counts(counts: pd.DataFrame) -> pd.DataFrame:
    """(window_ns, name, value) partials to one column per name, merged by sum (max for max:*)."""
    if counts.empty:
        return pd.DataFrame(index=pd.Index([], name="window_ns", dtype=np.int64))
    is_max = counts["name"].pipe(output.merges_by_max)
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
            row[output.percentile_column(hist, p)] = v
        row[output.percentile_column(hist, "max")] = histogram.max_value(idx, cnt)
        if encode_hdr and hist == output.LATENCY:
            row[output.LATENCY_HDR] = histogram.encode(idx, cnt)
    return pd.DataFrame(list(rows.values())).set_index("window_ns")


def window_table(cfg: dict, batches: pd.DataFrame, counts: pd.DataFrame, hists: pd.DataFrame, events: pd.DataFrame,
                 encode_hdr: bool = True) -> pd.DataFrame:
    """The window table from a run's config (``run.json``), its completed batches and their partials (counts, hists,
    events): one row per 1 s window from the first to the last with data. ``encode_hdr``: include each window's
    encoded HdrHistogram (``latency_hdr``)."""
    window_ns, timeout_ns = cfg["window_ns"], cfg["drop_timeout_ns"]
    table = sum_counts(counts)
    table = table.join(hist_figures(hists, encode_hdr), how="outer")
    if not events.empty:
        node = events[events["kind"] == "node"]
        if len(node):
            node = node.assign(series=output.NODE + node["node"].astype(str) + ":" + node["metric"].astype(str))
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
    for name in output.COUNTS:
        table[name] = table[name].fillna(0).astype(np.int64) if name in table else 0
    for name in [c for c in table.columns if c.startswith((output.ERRORS_BY_CAUSE, output.OVERFLOW)) or c in output.RARE_COUNTS]:
        table[name] = table[name].fillna(0).astype(np.int64)
    for name in (output.SLOWEST, output.FIRST_DROPPED):  # the events behind the window's percentiles and drops
        table[name] = table[name].fillna("") if name in table else ""
    # the part of each window inside a gap (``streaming.gaps``), in ms
    table[output.SILENCE_MS] = table.pop(output.SILENCE_NS).fillna(0) / 1e6 if output.SILENCE_NS in table else 0.0
    judged = int(batches["judged_ns"].max()) if "judged_ns" in batches and batches["judged_ns"].notna().any() else None
    status = window_status(table.index.to_numpy(), table, window_ns, timeout_ns, int(batches["watermark_ns"].max()),
                           bool(batches["finished"].any()), judged)
    table = pd.concat([table, pd.DataFrame(status, index=table.index)], axis=1)
    # When each window's figures reached the sink (for freshness): first and last batch touching it.
    written = batches.set_index("batch_id")["written_at_ns"]
    recv_rows = counts[counts["name"] == output.RECEIVED] if not counts.empty else counts
    if len(recv_rows):
        at = recv_rows.assign(t=recv_rows["batch_id"].map(written)).groupby("window_ns")["t"]
        table[output.FIRST_WRITTEN_NS], table[output.LAST_WRITTEN_NS] = at.min(), at.max()
    return table.reset_index()


def oom_kills_per_window(per_source: pd.Series) -> pd.Series:
    """OOM kills per window from kills per (window_ns, source) (``core.output.oom_kills``)."""
    return per_source.groupby(level="window_ns").agg(output.oom_kills).rename(output.OOM_KILLS)


def window_status(windows: np.ndarray, counts, window_ns: int, timeout_ns: int, watermark: int | None, finished: bool,
                  judged: int | None) -> dict[str, np.ndarray]:
    """in_flight, receive_complete, settled, drops_final and gap of every window from the first to the last
    (``windows``), from their ``counts`` (sent, received, errors, dropped): for the live verdict's table too."""
    sent, received = np.asarray(counts[output.SENT], np.int64), np.asarray(counts[output.RECEIVED], np.int64)
    # In flight at a window's end: sent - received - errors - drops whose deadline has passed.
    shift = timeout_ns // window_ns
    get = lambda name: np.asarray(counts[name], np.int64) if name in counts else 0  # noqa: E731 (older tables lack it)
    dropped = np.asarray(counts[output.DROPPED], np.int64) + get(output.UNACCOUNTED)  # and sends a reset took
    dropped_at_deadline = np.concatenate((np.zeros(min(shift, len(dropped)), np.int64), dropped[:max(len(dropped) - shift, 0)]))
    # an event that failed at the sender yet was received in time is in received and errors both: once here
    in_doubt = get(output.IN_DOUBT)
    # a misrouted event is out of flight where it arrived; one that failed at the sender too is in errors already
    misrouted = get(output.MISROUTED) - get(output.FAILED_MISROUTED)
    in_flight = np.cumsum(sent - received - np.asarray(counts[output.ERRORS], np.int64) + in_doubt - misrouted
                          - dropped_at_deadline)
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
        output.IN_FLIGHT: in_flight, output.RECEIVE_COMPLETE: complete,
        # every agent that sends or receives has written past the window's end (``streaming.gaps``): its figures
        # are final, however far ahead another agent's partition has moved the watermark
        output.SETTLED: finished | ((ends <= judged) if judged is not None else never),
        output.DROPS_FINAL: finished | ((ends + timeout_ns <= watermark) if watermark is not None else never),
        output.GAP: (received == 0) & ((prev_in_flight > 0) | (sent > 0)) & during & complete}


def exemplars(events: pd.DataFrame, lo: int | None = None, hi: int | None = None,
              by_window: bool = False) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The slowest received events and the first dropped ones (``partials.EXEMPLARS`` of each), over the windows in
    [lo, hi) or per window: (slowest: event_id, at_ns, latency_us, window_ns; dropped: event_id, at_ns, window_ns).
    A withdrawn drop (its receive came in time after all, or an error ack) nets out."""
    from core.output import EXEMPLARS

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


def exemplar_records(events: pd.DataFrame) -> dict:
    slow, dropped = exemplars(events)
    return {"slowest": [{"event_id": str(r.event_id), "at_ns": int(r.at_ns), "latency_ms": round(float(r.latency_us) / 1000, 3)}
                        for r in slow.itertuples()],
            "first_dropped": [{"event_id": str(r.event_id), "sent_at_ns": int(r.at_ns)} for r in dropped.itertuples()],
            "misrouted": misrouted(events)}


def misrouted(events: pd.DataFrame, limit: int = 100) -> list[dict]:
    """The first misrouted receives (``limit`` of them): the event, when and on which route it arrived."""
    if events.empty or "kind" not in events:
        return []
    m = events[events["kind"] == "misrouted_id"].sort_values(["at_ns", "event_id"], kind="stable").head(limit)
    return [{"event_id": str(r.event_id), "at_ns": int(r.at_ns), "route": int(r.value)} for r in m.itertuples()]


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


def percentile_figures(idx: np.ndarray, cnt: np.ndarray) -> dict:
    """p50/p90/p99, max and count of histogram buckets (``core.histogram``; None where empty)."""
    ps = histogram.percentiles(idx, cnt, list(PERCENTILES))
    return {f"p{p}": v for p, v in zip(PERCENTILES, ps)} | {"max": histogram.max_value(idx, cnt), "count": int(np.sum(cnt))}
