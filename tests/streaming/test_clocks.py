"""Clock correction (``streaming.clocks``): stamps of skewed agents brought onto the reference's time, per agent and
over time, each row keeping its correction and error; pure, without Spark (the seven stood-in hosts under libfaketime
are ``tests/system/test_multihost.py``)."""
import numpy as np
import pandas as pd
import pytest

from core import contract as c
from core import histogram, output
from streaming import clocks, engine
from streaming.decode import conform, decode_messages

S = 1_800_000_000 * 10**9
MS, US = 10**6, 10**3
LG_SKEW, RX_SKEW = 5 * MS, -3 * MS    # the generator's clock 5 ms ahead, the receiver's 3 ms behind
CFG = engine.EngineConfig(run_id="r", drop_timeout_ns=10_000 * MS, watermark_delay_ns=1_000 * MS, retention_ns=10_000 * MS)


def table(records):
    return decode_messages([c.encode(records)], [0], [0])


def clock(agent, at_ns, offset_us, rtt_us=40.0):
    return c.ClockOffset(c.ANY_RUN, agent, at_ns, reference="ref:1", offset_us=offset_us, rtt_us=rtt_us)


def flights(n=400):
    """True send times (every 10 ms) and flight times (1 to 20 ms, no order), ns."""
    sent = S + np.arange(n, dtype=np.int64) * 10 * MS
    return sent, (1 + (np.arange(n) * 7) % 20).astype(np.int64) * MS + np.arange(n) % 13 * 37 * US


def batches(lg_skew, rx_skew, estimates=True):
    """The run as skewed agents write it, in 4 batches of 100 events, the agents' clock estimates first (and again
    2 s in, the generator's 10 µs further: estimates move over time); then a heartbeat past the drop timeout."""
    sent, flight = flights()
    out = []
    for b in range(4):
        recs = []
        if estimates and b in (0, 2):
            at = S + b * 1000 * MS
            recs += [clock("lg", at + lg_skew, -(lg_skew + b * 5 * US) / US), clock("rx", at + rx_skew, -rx_skew / US)]
        for i in range(b * 100, b * 100 + 100):
            s = int(sent[i])
            recs += [c.Send("r", "lg", s + lg_skew, event_id=f"e{i}", intended_at_ns=s + lg_skew - 200 * US),
                     c.Receive("r", "rx", s + int(flight[i]) + rx_skew, event_id=f"e{i}")]
        out.append(recs)
    return out + [[c.Heartbeat("r", "lg", S + 20_000 * MS + lg_skew)]]


def run(batch_list, cfg=CFG):
    state, counts, hists = engine.EngineState(), [], []
    for records in batch_list:
        state, result = engine.process(state, table(records), cfg)
        counts.append(result.counts)
        hists.append(result.hists)
    h = pd.concat(hists, ignore_index=True)
    h = h[h["hist"] == output.LATENCY].groupby("bucket")["count"].sum()
    totals = pd.concat(counts).groupby("name")["value"].sum().to_dict()
    return histogram.percentiles(h.index.to_numpy(), h.to_numpy(), [50, 90, 99]), totals, state


def truth():
    sent, flight = flights()
    return [int(np.percentile(flight // US, p, method="inverted_cdf")) for p in (50, 90, 99)]


def test_skewed_agents_give_an_unskewed_runs_percentiles_within_the_estimates_error():
    exact, plain, _ = run(batches(0, 0, estimates=False))
    got, totals, state = run(batches(LG_SKEW, RX_SKEW))
    assert totals["received"] == 400 and "clock_skew" not in totals, totals
    # 40 µs of error (20 each side) and the histogram's buckets (under 1%)
    for p, want, base in zip((50, 90, 99), truth(), exact):
        assert abs(got[(50, 90, 99).index(p)] - base) <= 40 + 0.01 * base, (p, got, exact)
        assert abs(base - want) <= 0.01 * want, (p, exact, truth())
    assert [e[1] for e in state.clocks["lg"]] == [-LG_SKEW, -LG_SKEW - 10 * US]  # over time: both estimates kept


def test_without_correction_the_same_run_is_off_by_the_skew_and_shows_receives_before_their_sends():
    exact, _, _ = run(batches(0, 0, estimates=False))
    raw, totals, _ = run(batches(LG_SKEW, RX_SKEW), dataclass_replace(CFG, clock_correction=False))
    assert totals.get("clock_skew", 0) > 0, totals  # flights of 1 to 8 ms read as negative
    # each percentile ms short (8 ms, less the negative flights it no longer holds): 100 times the error and more
    assert all(abs(r - e) > 4_000 for r, e in zip(raw, exact)), (raw, exact)


def dataclass_replace(cfg, **kw):
    import dataclasses

    return dataclasses.replace(cfg, **kw)


def test_each_row_keeps_its_correction_and_error_and_its_raw_stamp_is_recoverable():
    t = table([clock("lg", S, -5000.0), clock("rx", S, 3000.0, rtt_us=60.0),
               c.Send("r", "lg", S + 10 * MS, event_id="a", intended_at_ns=S + 9 * MS),
               c.Ack("r", "lg", S + 12 * MS, event_id="a", sent_at_ns=S + 10 * MS, status=202),
               c.Receive("r", "rx", S + 11 * MS, event_id="a"), c.Receive("r", "nobody", S, event_id="b"),
               c.NodeSample(c.ANY_RUN, "node", S, node="n", metric="cpu", value=0.5)])
    got = engine.corrected(engine.EngineState(), t, CFG)
    rows = got.to_pandas().set_index("kind")
    assert rows.loc["send", "at_ns"] == S + 5 * MS and rows.loc["send", "intended_at_ns"] == S + 4 * MS
    assert rows.loc["ack", "at_ns"] == S + 7 * MS and rows.loc["ack", "sent_at_ns"] == S + 5 * MS
    recv = rows.loc["recv"].set_index("agent")
    assert recv.loc["rx", "at_ns"] == S + 14 * MS and recv.loc["rx", clocks.ERROR] == 30 * US
    assert recv.loc["nobody", clocks.CORRECTION] == 0 and pd.isna(recv.loc["nobody", clocks.ERROR])  # no estimate
    assert rows.loc["send", clocks.CORRECTION] == -5 * MS and rows.loc["send", clocks.ERROR] == 20 * US
    assert pd.isna(rows.loc["node", clocks.CORRECTION])                     # not an agent's stamp of the run
    assert list(clocks.raw_stamps(got)) == list(t["at_ns"].to_numpy())      # at_ns - correction
    assert engine.corrected(engine.EngineState(), got, CFG).equals(got)     # archived: not corrected again
    raw = engine.corrected(engine.EngineState(), got, dataclass_replace(CFG, clock_correction=False))
    assert raw["at_ns"].equals(t["at_ns"]) and set(raw[clocks.CORRECTION].to_pylist()) <= {0, None}  # taken back off


def test_an_estimate_within_its_error_is_not_applied():
    """On one host |offset| <= rtt / 2 always: a one-machine run keeps its stamps."""
    t = table([clock("lg", S, -15.0, rtt_us=40.0), c.Send("r", "lg", S + MS, event_id="a", intended_at_ns=S + MS)])
    got = engine.corrected(engine.EngineState(), t, CFG).to_pandas().set_index("kind")
    assert got.loc["send", "at_ns"] == S + MS and got.loc["send", clocks.CORRECTION] == 0
    assert got.loc["send", clocks.ERROR] == 20 * US


def test_the_estimate_in_force_is_the_latest_before_a_stamp_else_the_earliest():
    est = [[100, -10, 1], [200, -20, 1], [300, -30, 1]]
    off, err = clocks.in_force(est, np.array([50, 100, 150, 299, 300, 10**9]))
    assert list(off) == [-10, -10, -10, -20, -30, -30] and list(err) == [1] * 6
    learned = clocks.learn({}, table([clock("a", S, 1.0)] * 2 + [clock(f"b{i}", S + i, 2.0) for i in range(3)]))
    assert learned["a"] == [[S, 1000, 20000]] and len(learned) == 4  # the same estimate twice is kept once
    many = clocks.learn({}, table([clock("a", S + i, 1.0) for i in range(clocks.KEEP_ESTIMATES + 10)]))
    assert len(many["a"]) == clocks.KEEP_ESTIMATES and many["a"][0][0] == S + 10  # the oldest go


def test_an_archive_from_before_the_clock_columns_reads_with_them_null():
    old = table([c.Send("r", "lg", S, event_id="a", intended_at_ns=S)]).drop_columns([clocks.CORRECTION, clocks.ERROR])
    t = conform(old)
    assert t[clocks.CORRECTION].null_count == 1 and t.num_columns == old.num_columns + 2


@pytest.mark.parametrize("enabled", [True, False])
def test_a_corrected_run_redone_from_its_archive_gives_the_same_figures(enabled):
    """What the archive holds (corrected rows) gives the same figures when processed again in other batches."""
    cfg = dataclass_replace(CFG, clock_correction=enabled)
    live = run(batches(LG_SKEW, RX_SKEW), cfg)
    state, archived = engine.EngineState(), []
    for records in batches(LG_SKEW, RX_SKEW):
        t = engine.corrected(state, table(records), cfg)
        archived.append(t)
        state, _ = engine.process(state, t, cfg)
    import pyarrow as pa

    state, result = engine.process(engine.EngineState(), pa.concat_tables(archived), cfg)  # one batch: a replay
    h = result.hists[result.hists["hist"] == output.LATENCY].groupby("bucket")["count"].sum()
    assert histogram.percentiles(h.index.to_numpy(), h.to_numpy(), [50, 90, 99]) == live[0]
