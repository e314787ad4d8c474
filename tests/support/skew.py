"""The check of a run whose agents ran with skewed clocks (libfaketime, ``support.hosts.skewed``): the offsets the
agents found against those set, and the run's percentiles, corrected, against the true flight times; then the same
check on a replay without correction, which must fail it."""
from __future__ import annotations

import glob
import os

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from core import histogram
from streaming import clocks
from streaming.decode import conform
from support import run_job

PCTS = (50, 90, 99)


def archived(run_dir) -> pd.DataFrame:
    """The run's archived sends and receives: event ID, agent, stamp as taken, correction and its error."""
    parts = [conform(pq.read_table(p)) for p in sorted(glob.glob(os.path.join(run_dir, "archive", "batch-*.parquet")))]
    frames = []
    for t in parts:
        keep = t.filter(np.isin(t["kind"].to_numpy(zero_copy_only=False), ["send", "recv"]))
        frames.append(pd.DataFrame({"kind": keep["kind"].to_numpy(zero_copy_only=False),
                                    "event_id": keep["event_id"].to_numpy(zero_copy_only=False),
                                    "agent": keep["agent"].to_numpy(zero_copy_only=False),
                                    "raw_ns": clocks.raw_stamps(keep),
                                    "at_ns": keep["at_ns"].to_numpy(zero_copy_only=False).astype(np.int64),
                                    "error_ns": keep[clocks.ERROR].to_numpy(zero_copy_only=False)}))
    return pd.concat(frames, ignore_index=True)


def true_flights(run_dir, skews: dict[str, float], corrected: bool = False) -> tuple[np.ndarray, ...]:
    """(each event's true flight time in µs, from the raw stamps less the skews set; the error the job stated for
    its correction, send's and receive's, in µs; with ``corrected``, also its flight time as the job corrected it)."""
    a = archived(run_dir)
    a["true_ns"] = a["raw_ns"] - (a["agent"].map(skews).fillna(0) * 1e9).round().astype(np.int64)
    s = a[a["kind"] == "send"].drop_duplicates("event_id").set_index("event_id")
    r = a[a["kind"] == "recv"].sort_values("raw_ns").drop_duplicates("event_id").set_index("event_id")
    j = s.add_suffix("_s").join(r.add_suffix("_r"), how="inner")
    out = ((j["true_ns_r"] - j["true_ns_s"]) // 1000).to_numpy(), ((j["error_ns_s"] + j["error_ns_r"]) / 1000).to_numpy()
    return (*out, ((j["at_ns_r"] - j["at_ns_s"]) // 1000).to_numpy()) if corrected else out


def percentiles(us: np.ndarray) -> list[int]:
    idx, counts = histogram.sparse_counts(us[us >= 0])
    return histogram.percentiles(idx, counts, list(PCTS))


def check_skew_corrected(shared, run_id: str, s: dict, skews: dict[str, float]) -> dict:
    """Every skewed agent's offset found within its stated error of the one set; the run's p50/p90/p99 within the
    corrections' error (and the histogram's 0.1%) of the true ones; a replay without correction outside it."""
    from runs import results

    found = {c["agent"]: c for c in s["clock_offsets"]}
    for agent, seconds in skews.items():
        c = found[agent]
        assert c["corrected"] and abs(c["offset_us"] + seconds * 1e6) <= c["error_us"] + 1, (agent, seconds, c)
        assert c["samples"] >= 2, c  # measured again while the run went on (every core.clock.REPORT_EVERY_S)
    truth_us, error_us, corrected_us = true_flights(shared / run_id, skews, corrected=True)
    assert len(truth_us) == s["received"], (len(truth_us), s["received"])
    truth, bound = percentiles(truth_us), float(np.nanmax(error_us))
    got = [s["latency_us"][f"p{p}"] for p in PCTS]
    within = [abs(g - t) <= bound + 0.001 * t + 1 for g, t in zip(got, truth)]
    # on a failure, which one is off: each event's correction beyond its stated error, or the percentiles of the
    # job's whole-run histogram against those of the archive's corrected flights
    miss = np.abs(corrected_us - truth_us) > np.nan_to_num(error_us, nan=0.0) + 1
    assert all(within), ("corrected", got, "true", truth, "error", bound, "archive's corrected", percentiles(corrected_us),
                         f"{int(miss.sum())} of {len(miss)} events corrected beyond their stated error, by up to "
                         f"{float(np.max(np.abs(corrected_us - truth_us)[miss], initial=0)):.0f} µs")
    r = run_job("replay", "--run", run_id, "--checkpoints", str(shared), "--master", "local[2]", "--no-clock-correction")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    raw = results.summarize(str(shared / run_id / "replay-rawclocks"))
    raw_p = [raw["latency_us"][f"p{p}"] for p in PCTS]
    assert not any(abs((g or 0) - t) <= bound + 0.001 * t + 1 for g, t in zip(raw_p, truth)), (raw_p, truth)
    windows = pd.read_parquet(shared / run_id / "replay-rawclocks" / "windows.parquet")
    skewed = int(windows["clock_skew"].sum()) if "clock_skew" in windows else 0  # receives stamped before their sends
    assert raw["received"] == s["received"] and skewed > 0, (raw["received"], skewed)
    figures = {"offsets_set_us": {a: v * 1e6 for a, v in skews.items()},
               "offsets_found_us": {a: (found[a]["offset_us"], found[a]["error_us"]) for a in skews},
               "true": truth, "corrected": got, "uncorrected": raw_p, "error_us": bound, "clock_skew_raw": skewed}
    print(f"\nskewed clocks: {figures}")
    return figures
