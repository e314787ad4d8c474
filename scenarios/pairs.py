"""Figures for each sender-receiver pair of a run (``?pairs=N``), from its archive: the run's own telemetry, as the
job archived it, joined by event ID here. Counts are the whole run's; percentiles leave out the run's warm-up and
cool-down, as its pooled ones do.

Each event's pair is where it was sent (its send record's ``route``; in an archive from before routes, k mod N, as
``transports.amqp1.target`` sends event k), and a receive counts for it only where it arrived there (its receive
record's ``route``): one first received on another pair's address is that pair's ``misrouted``, never received.
For each pair: its sends, its receives, the lost (sent and
never received within the run), the late (received past the drop timeout), the duplicates, its flight time p50 and
p99 (nearest rank, exact: no histogram) and its send delay p99. Then the distribution across pairs, as the Dispatch
Router tests report it: the median pair's p99, the p99 of the pairs' p99s, the worst pair. The pairs' sums are checked
against the job's own totals (``consistent``): two ways of counting one run must agree.

    figures = pair_figures(run_root, pairs=1000, drop_timeout_ns=30 * 10**9)
"""
from __future__ import annotations

import glob
import os

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from core.rundir import RunPaths

COLUMNS = ["kind", "run_id", "agent", "event_id", "at_ns", "intended_at_ns", "route"]


def events(root: str) -> pd.DataFrame:
    """The run's sends and receives from its archive, each telemetry record once (a record the telemetry broker
    gave twice is one record; a receive the SUT gave twice has its own stamp, and stays)."""
    run_id = os.path.basename(os.path.normpath(root))
    parts = []
    for path in sorted(glob.glob(os.path.join(RunPaths(root).archive, "batch-*.parquet"))):
        cols = [c for c in COLUMNS if c in pq.read_schema(path).names]  # an archive from before routes has none
        t = pq.read_table(path, columns=cols).to_pandas(types_mapper={pa.int64(): pd.Int64Dtype()}.get)  # ns exact
        t = t if "route" in t else t.assign(route=pd.array([pd.NA] * len(t), pd.Int64Dtype()))
        parts.append(t[t["kind"].isin(("send", "recv")) & (t["run_id"] == run_id)])
    if not parts:
        return pd.DataFrame(columns=COLUMNS)
    return pd.concat(parts, ignore_index=True).drop_duplicates(["kind", "agent", "event_id", "at_ns"])


def join(ev: pd.DataFrame) -> pd.DataFrame:
    """Per event sent: ``at_ns`` (its send stamp), ``intended_at_ns`` (when it was due), ``first`` (its first
    receive, -1: none), ``receives``, ``route`` (where it was sent) and ``first_route`` (where it was first
    received; both ``<NA>`` where none was named); integers throughout (epoch ns lose ~100 ns in a float)."""
    sends = ev[ev["kind"] == "send"].drop_duplicates("event_id").set_index("event_id")
    rx = ev[ev["kind"] == "recv"].sort_values(["at_ns", "event_id"], kind="stable")
    recvs = rx.groupby("event_id")["at_ns"]
    route = rx.drop_duplicates("event_id").set_index("event_id")["route"]  # where each event was first received
    return pd.DataFrame({"at_ns": sends["at_ns"].astype(np.int64),
                         "intended_at_ns": sends["intended_at_ns"].fillna(sends["at_ns"]).astype(np.int64),
                         "first": recvs.min().reindex(sends.index, fill_value=-1).astype(np.int64),
                         "receives": recvs.size().reindex(sends.index, fill_value=0),
                         "route": sends["route"].astype("Int64"),
                         "first_route": route.astype("Int64").reindex(sends.index)})


def per_pair(ev: pd.DataFrame, pairs: int, drop_timeout_ns: int, span: tuple[int, int] | None = None) -> pd.DataFrame:
    """One row per pair (0 ... pairs-1): sent, received, lost, late, duplicates (the whole run's), and p50_us, p99_us
    (the receives in ``span``, as the job windows them; the whole run without one) and send_delay_p99_us (the sends
    in it)."""
    joined = join(ev)
    by_id = joined.index.to_series().str.rpartition("-")[2].astype(np.int64).to_numpy() % pairs
    joined["pair"] = joined["route"].fillna(pd.Series(by_id, index=joined.index)).astype(np.int64).to_numpy()
    # first received on another pair's address: misrouted, never this pair's receive (a receive or send naming no
    # route is where it was meant to be)
    mis = (joined["first"] >= 0) & joined["route"].notna() & joined["first_route"].notna() \
        & (joined["route"] != joined["first_route"]).fillna(False)
    joined["misrouted"] = mis.to_numpy(bool)
    joined.loc[joined["misrouted"], "first"] = -1
    flight = joined["first"] - joined["at_ns"]
    joined["flight_us"] = flight / 1000
    joined["in_time"] = flight <= drop_timeout_ns
    joined["delay_us"] = (joined["at_ns"] - joined["intended_at_ns"]) / 1000
    lo, hi = span or (np.iinfo(np.int64).min, np.iinfo(np.int64).max)
    joined["measured"] = (joined["first"] >= lo) & (joined["first"] < hi)
    joined.loc[(joined["at_ns"] < lo) | (joined["at_ns"] >= hi), "delay_us"] = np.nan
    rows = []
    for pair, g in joined.groupby("pair"):
        got, mis = g["first"] >= 0, g["misrouted"]
        ok = g.loc[got & g["in_time"] & g["measured"], "flight_us"].to_numpy()
        rows.append({"pair": int(pair), "sent": len(g), "received": int(got.sum()), "lost": int((~got & ~mis).sum()),
                     "misrouted": int(mis.sum()),
                     "late": int((got & ~g["in_time"]).sum()), "duplicates": int((g["receives"] - 1).clip(lower=0).sum()),
                     "measured": int(len(ok)), "mean_us": float(ok.mean()) if len(ok) else None,
                     "p50_us": nearest_rank(ok, 50), "p99_us": nearest_rank(ok, 99),
                     "send_delay_p99_us": nearest_rank(g["delay_us"].dropna().to_numpy(), 99)})
    out = pd.DataFrame(rows, columns=["pair", "sent", "received", "lost", "misrouted", "late", "duplicates", "measured", "mean_us",
                                      "p50_us", "p99_us", "send_delay_p99_us"])
    missing = sorted(set(range(pairs)) - set(out["pair"]))
    if missing:  # a pair that sent nothing is a pair too
        out = pd.concat([out, pd.DataFrame({"pair": missing, "sent": 0, "received": 0, "lost": 0, "misrouted": 0, "late": 0,
                                            "duplicates": 0, "measured": 0})], ignore_index=True)
    return out.sort_values("pair", ignore_index=True)


def nearest_rank(values: np.ndarray, p: float) -> float | None:
    if not len(values):
        return None
    v = np.sort(values)
    return float(v[max(int(np.ceil(p / 100 * len(v))), 1) - 1])


def distribution(rows: pd.DataFrame) -> dict:
    """Across the pairs: how many, how many lost or were late, their p99s' median, p99 and worst (which pair)."""
    p99 = rows["p99_us"].dropna()
    worst = rows.loc[p99.idxmax()] if len(p99) else None
    weight = rows["measured"].fillna(0)
    mean = float((rows["mean_us"].fillna(0) * weight).sum() / weight.sum()) if weight.sum() else None
    return {"pairs": int(len(rows)), "lost": int(rows["lost"].sum()), "pairs_with_loss": int((rows["lost"] > 0).sum()),
            "misrouted": int(rows["misrouted"].sum()),
            "mean_us": mean,
            "pairs_late": int((rows["late"] > 0).sum()), "pairs_silent": int((rows["sent"] == 0).sum()),
            "pair_p99_median_us": nearest_rank(p99.to_numpy(), 50), "pair_p99_p99_us": nearest_rank(p99.to_numpy(), 99),
            "worst_pair": None if worst is None else int(worst["pair"]),
            "worst_pair_p99_us": None if worst is None else float(worst["p99_us"]),
            "pair_p50_median_us": nearest_rank(rows["p50_us"].dropna().to_numpy(), 50),
            "send_delay_p99_worst_us": float(rows["send_delay_p99_us"].max()) if rows["send_delay_p99_us"].notna().any()
            else None}


def consistent(rows: pd.DataFrame, summary: dict) -> list[str]:
    """Where the pairs' sums disagree with the job's totals: empty when they agree. The job's ``received`` is the
    events received in time, once each; ``late`` those received past the drop timeout; ``duplicates`` the receives
    beyond an event's first."""
    sums = {"sent": int(rows["sent"].sum()), "received": int(rows["received"].sum() - rows["late"].sum()),
            "late": int(rows["late"].sum()), "duplicates": int(rows["duplicates"].sum()),
            "misrouted": int(rows["misrouted"].sum())}
    sums = {k: v for k, v in sums.items() if k != "misrouted" or k in summary}  # an older summary has no misrouted
    return [f"{k}: pairs {v:,}, job {summary.get(k)}" for k, v in sums.items() if summary.get(k) != v]


def pair_figures(root: str, pairs: int, drop_timeout_ns: int, summary: dict) -> dict:
    """A run's per-pair figures, their distribution, and any disagreement with its summary's totals."""
    m = summary.get("measured")  # the warm-up and cool-down left out of the percentiles, as from the pooled ones
    rows = per_pair(events(root), pairs, drop_timeout_ns, (m["from_ns"], m["to_ns"]) if m else None)
    return {**distribution(rows), "disagreements": consistent(rows, summary),
            "per_pair": rows.replace({np.nan: None}).to_dict("records")}
