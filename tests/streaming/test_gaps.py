"""Exact gaps (``streaming.gaps``) in the engine, table by table, against ``loadgen.synthetic.exact_gaps``.

The expected gaps come from a one-silence-at-a-time reading of the definition over the injected stamps; the
engine must give the same edges (ns), the same events in flight and the same silence per window however the
records are cut into micro-batches.
"""
import numpy as np
import pandas as pd
import pytest

from core import contract as c
from loadgen.synthetic import exact_gaps
from runs import table
from streaming import engine, gaps
from streaming.decode import decode_messages

S = 1_800_000_000 * 10**9
MS = 10**6
NS = 10**9
CFG = engine.EngineConfig(run_id="g", drop_timeout_ns=2_000 * MS, watermark_delay_ns=500 * MS, retention_ns=2_000 * MS)


def flow(rate: int, seconds: float, silences: list[tuple[float, float]], seed: int = 7, drop_every: int = 0):
    """Sends at ``rate``/s with jitter; each receive ~3 ms after its send (exponential), none inside a silence
    (those events arrive at its end, in order, 10 µs apart). Returns (sends, receives) in ns, aligned by event."""
    rng = np.random.default_rng(seed)
    n = int(rate * seconds)
    sent = S + (np.arange(n) * NS) // rate + rng.integers(0, 50_000, n)
    recv = sent + rng.exponential(3 * MS, n).astype(np.int64) + 200_000
    for lo, hi in silences:
        a, b = S + int(lo * NS), S + int(hi * NS)
        held = (recv >= a) & (recv < b)
        recv[held] = b + np.arange(held.sum()) * 10_000
    if drop_every:
        recv[::drop_every] = -1
    return sent, recv


def records(sent, recv):
    out = [c.RunStart("g", "loadgen", S - NS)]
    for i, (s, r) in enumerate(zip(sent, recv)):
        out.append(c.Send("g", "s", int(s), event_id=f"e{i}", intended_at_ns=int(s)))
        if r > 0:
            out.append(c.Receive("g", "rx", int(r), event_id=f"e{i}"))
    stop = int(sent.max()) + MS
    out.append(c.RunStop("g", "loadgen", stop))
    out.append(c.Heartbeat("g", "s", stop + 10 * NS))
    out.sort(key=lambda r: r.at_ns)
    return out, stop


def through_engine(recs, cuts, most_sends_kept=None):
    """Feed ``recs`` cut at ``cuts``; return (gaps table as results reads it, silence ns per window).
    ``most_sends_kept``: a list that gets the most send stamps the tracker held after any batch."""
    state = engine.EngineState()
    events, counts = [], []
    for part in np.split(np.array(recs, dtype=object), cuts):
        decoded = decode_messages([c.encode(list(part))], [0], [0]) if len(part) else decode_messages([], [], [])
        state, res = engine.process(state, decoded, CFG)
        events.append(res.events)
        counts.append(res.counts)
        if most_sends_kept is not None:
            most_sends_kept[:] = [max(most_sends_kept + [len(state.gaps.sends)])]
    ev = pd.concat(events, ignore_index=True)
    cn = pd.concat(counts, ignore_index=True)
    sil = cn[cn["name"] == "silence_ns"].groupby("window_ns")["value"].sum()
    return table.gaps(ev), {int(w): int(v) for w, v in sil.items() if v}


def expected(sent, recv, stop):
    return exact_gaps(sent, recv[recv > 0], stop)


def check(recs, stop, sent, recv, cuts):
    want, want_silence = expected(sent, recv, stop)
    got, silence = through_engine(recs, cuts)
    assert [(int(a), int(b), int(n)) for a, b, n in zip(got["start_ns"], got["end_ns"], got["in_flight"])] == want
    assert silence == want_silence


@pytest.mark.parametrize("num_batches", [1, 7, 60, 200])
def test_a_150_ms_stall_at_5000_per_s_and_a_silence_across_windows_are_exact_for_every_cut(num_batches):
    sent, recv = flow(5000, 6.0, [(1.30, 1.45), (3.5, 5.2)])
    recs, stop = records(sent, recv)
    want, _ = expected(sent, recv, stop)
    assert len(want) == 2 and 150 * MS <= want[0][1] - want[0][0] < 160 * MS and want[1][1] - want[1][0] > 1_700 * MS
    rng = np.random.default_rng(num_batches)
    cuts = np.sort(rng.choice(np.arange(1, len(recs)), num_batches - 1, replace=False)) if num_batches > 1 else []
    check(recs, stop, sent, recv, cuts)


def test_silences_shorter_than_the_threshold_are_not_gaps_and_the_threshold_follows_the_rate():
    # at 100/s, 20 inter-arrivals are 200 ms: a 150 ms silence is no gap there, a 300 ms one is (it starts with
    # nothing in flight, ~3 ms after the last send: the events sent within it are the ones held)
    sent, recv = flow(100, 8.0, [(2.0, 2.15), (5.0, 5.3)])
    recs, stop = records(sent, recv)
    want, _ = expected(sent, recv, stop)
    assert len(want) == 1 and want[0][0] < S + 5 * NS < want[0][1] and want[0][2] == 0
    check(recs, stop, sent, recv, [len(recs) // 3, 2 * len(recs) // 3])


def test_a_slow_steady_flow_and_the_tail_after_the_stop_are_no_gaps():
    # one event a second, each received 1 ms later: 1 s silences, well within 20 inter-arrivals (20 s)
    sent = S + np.arange(10) * NS
    recv = sent + MS
    recs, _ = records(sent, recv)
    got, silence = through_engine(recs, [5])
    assert got.empty and silence == {}
    # drops keep events in flight, and the last receive comes 1.5 s after the stop: still no gap
    sent, recv = flow(1000, 3.0, [], drop_every=10)
    recv[-1] = int(sent.max()) + 1_500 * MS
    recs, _ = records(sent, recv)
    got, _ = through_engine(recs, [len(recs) // 2])
    assert got.empty


def test_nothing_received_for_seconds_keeps_only_a_seconds_sends_and_later_gaps_are_exact():
    # every receive held for the first 3 s (one long silence before any receive: no gap, it has no start), then a
    # 200 ms stall; the tracker keeps the sends of about a second plus what is not yet judged, not all of them
    sent, recv = flow(1000, 6.0, [(0.0, 3.0), (4.0, 4.2)])
    recs, stop = records(sent, recv)
    want, want_silence = expected(sent, recv, stop)
    assert len(want) == 1 and want[0][0] < S + 4 * NS < want[0][1]
    kept = []
    got, silence = through_engine(recs, list(range(200, len(recs), 200)), kept)
    assert [(int(a), int(b), int(n)) for a, b, n in zip(got["start_ns"], got["end_ns"], got["in_flight"])] == want
    assert silence == want_silence
    assert kept[0] < 2_500, kept  # ~1 s of sends (1,000) plus the unjudged tail, not the 3,000 of the long silence


def test_a_receive_arriving_after_the_watermark_passed_it_splits_the_declared_gap():
    sent, recv = flow(1000, 6.0, [(2.0, 4.0)])
    recs, stop = records(sent, recv)
    # one receive in the middle of the silence, written by a receiver that lags 3 s (beyond the 0.5 s delay)
    straggler = c.Receive("g", "rx2", S + 3 * NS, event_id="e-lag")
    late_send = c.Send("g", "s", S + 2_900 * MS, event_id="e-lag", intended_at_ns=S + 2_900 * MS)
    at = next(i for i, r in enumerate(recs) if r.at_ns > S + 5_500 * MS)
    recs = sorted(recs[:at] + [late_send], key=lambda r: r.at_ns) + [straggler] + recs[at:]
    sent2, recv2 = np.r_[sent, S + 2_900 * MS], np.r_[recv, S + 3 * NS]
    want, want_silence = expected(sent2, recv2, stop)
    assert len(want) == 2 and want[0][1] == want[1][0] == S + 3 * NS
    got, silence = through_engine(recs, [at - 10, at + 1])
    assert [(int(a), int(b)) for a, b in zip(got["start_ns"], got["end_ns"])] == [(a, b) for a, b, _ in want]
    assert silence == want_silence


def test_the_tracker_survives_a_snapshot_round_trip():
    t = gaps.GapTracker()
    t.advance(np.array([S, S + MS]), np.array([S + 2 * MS]), S + NS)
    back = gaps.GapTracker.restore(t.scalars(), t.stamps())
    assert back.scalars() == t.scalars()
    assert np.array_equal(back.sends, t.sends) and np.array_equal(back.recvs, t.recvs)


def test_a_gap_judged_in_a_batch_without_receives_is_still_reported():
    """The sender's records lag the receiver's: the batch that lets the gap be judged holds only sends (no
    delivery to name as slowest, no final drop), and the gap must still reach the events table. Each agent's
    records stay in their order, as in its partition."""
    sent, recv = flow(200, 6, [(2.0, 3.5)])
    recs, stop = records(sent, recv)
    gap_end = int(recv[recv >= S + int(3.5 * NS)].min())  # the receive that ends the silence
    lag = S + int(2.5 * NS)
    first = [r for r in recs if r.KIND == "run_start" or (r.KIND == "send" and r.at_ns < lag)
             or (r.KIND == "recv" and r.at_ns <= gap_end)]
    sends_only = [r for r in recs if r.KIND == "send" and lag <= r.at_ns < S + 4 * NS]
    taken = {id(r) for r in first + sends_only}
    rest = [r for r in recs if id(r) not in taken]
    want, _ = expected(sent, recv, stop)
    assert len(want) == 1 and want[0][1] == gap_end
    check(first + sends_only + rest, stop, sent, recv, [len(first), len(first) + len(sends_only)])
