"""The join and window rules, table by table, without Spark or a broker (pure function tests)."""
import dataclasses
import json
import os

import numpy as np
import pandas as pd
import pytest

from core import contract as c
from core import output
from loadgen.synthetic import SyntheticSpec, generate, messages
from streaming import engine
from streaming.decode import decode_messages

S = 1_800_000_000 * 10**9
MS = 10**6
NS = 10**9
CFG = engine.EngineConfig(run_id="r", drop_timeout_ns=10_000 * MS, watermark_delay_ns=1_000 * MS, retention_ns=10_000 * MS)


def send(i, t_ms):
    return c.Send("r", "s", S + t_ms * MS, event_id=f"e{i}", intended_at_ns=S + t_ms * MS)


def sendack(i, t_ms, acked_ms, **answer):
    """A send written with its answer (the load generator's form: ``contract.SEND_HOLD_NS``)."""
    return c.Send("r", "s", S + t_ms * MS, event_id=f"e{i}", intended_at_ns=S + t_ms * MS, acked_at_ns=S + acked_ms * MS,
                  **answer)


def recv(i, t_ms):
    return c.Receive("r", "rx", S + t_ms * MS, event_id=f"e{i}")


def beat(t_ms):
    return c.Heartbeat("r", "s", S + t_ms * MS)


def reset(t_ms):
    return c.TelemetryReset(c.ANY_RUN, "job", S + t_ms * MS, where="t", reason="the topic was recreated", count=7)


def run(batches):
    """Feed batches of records; return summed counts by name and by (window second, name)."""
    state = engine.EngineState()
    counts = []
    for records in batches:
        table = decode_messages([c.encode(records)], [0], [0]) if records else decode_messages([], [], [])
        state, result = engine.process(state, table, CFG)
        counts.append(result.counts)
    df = pd.concat(counts, ignore_index=True)
    df = df[~df["name"].str.startswith(output.MAX)]
    totals = df.groupby("name")["value"].sum().to_dict()
    by_window = {((w - S) // 10**9, n): int(v) for (w, n), v in df.groupby(["window_ns", "name"])["value"].sum().items() if v}
    return {k: int(v) for k, v in totals.items() if v}, by_window, state


CASES = [
    # (description, batches, expected non-zero totals)
    ("matched in one batch", [[send(1, 0), recv(1, 5)]], {"sent": 1, "received": 1}),
    ("receive before its send", [[recv(1, 5)], [send(1, 0)]], {"sent": 1, "received": 1}),
    ("duplicate in the same batch", [[send(1, 0), recv(1, 5), recv(1, 6)]], {"sent": 1, "received": 1, "duplicates": 1}),
    ("duplicate in a later batch", [[send(1, 0), recv(1, 5)], [recv(1, 900)]], {"sent": 1, "received": 1, "duplicates": 1}),
    ("never received: dropped once the watermark passes", [[send(1, 0)], [beat(12_000)]], {"sent": 1, "dropped": 1}),
    ("not yet due: no drop", [[send(1, 0)], [beat(10_500)]], {"sent": 1}),
    ("received after the timeout: dropped and late", [[send(1, 0)], [recv(1, 10_500)]], {"sent": 1, "dropped": 1, "late": 1}),
    ("in-time receive arriving after the drop was declared: corrected",
     [[send(1, 0)], [beat(12_000)], [recv(1, 9_000)]], {"sent": 1, "received": 1}),
    ("late receive after the drop was declared", [[send(1, 0)], [beat(12_000)], [recv(1, 11_000)]], {"sent": 1, "dropped": 1, "late": 1}),
    ("error ack: an error, not a drop",
     [[send(1, 0), c.Ack("r", "s", S + MS, event_id="e1", sent_at_ns=S, status=503)], [beat(12_000)]],
     {"sent": 1, "errors": 1, "errors:http_503": 1}),
    ("error ack after the drop was declared: the drop is withdrawn",
     [[send(1, 0)], [beat(12_000)], [c.Ack("r", "s", S + 11_000 * MS, event_id="e1", sent_at_ns=S, error="timeout")]],
     {"sent": 1, "errors": 1, "errors:timeout": 1}),
    ("successful ack", [[send(1, 0), recv(1, 3), c.Ack("r", "s", S + 2 * MS, event_id="e1", sent_at_ns=S, status=202)]],
     {"sent": 1, "received": 1, "acked": 1}),
    ("a send written with its answer", [[sendack(1, 0, 2, status=202), recv(1, 5)]], {"sent": 1, "received": 1, "acked": 1}),
    ("a send written with its error: an error, not a drop", [[sendack(1, 0, 1, error="timeout")], [beat(12_000)]],
     {"sent": 1, "errors": 1, "errors:timeout": 1}),
    ("a re-sent send record is not counted twice", [[send(1, 0)], [send(1, 0), recv(1, 4)]],
     {"sent": 1, "received": 1, "repeated_send_records": 1}),
    ("a re-sent send written with its answer: its answer once", [[sendack(1, 0, 2, status=202)],
     [sendack(1, 0, 2, status=202), recv(1, 5)]], {"sent": 1, "received": 1, "acked": 1, "repeated_send_records": 1}),
    ("a re-sent failure: one error", [[sendack(1, 0, 1, error="timeout"), recv(1, 5)], [sendack(1, 0, 1, error="timeout")]],
     {"sent": 1, "received": 1, "errors": 1, "errors:timeout": 1, "in_doubt": 1, "repeated_send_records": 1}),
    ("an identical receive record re-sent by a restarted agent is not a duplicate",
     [[send(1, 0), recv(1, 5)], [recv(1, 5)]], {"sent": 1, "received": 1, "repeated_receive_records": 1}),
    ("identical receive records in one batch", [[send(1, 0), recv(1, 5), recv(1, 5)]],
     {"sent": 1, "received": 1, "repeated_receive_records": 1}),
    ("receive with no send ever: orphan after the wait", [[recv(7, 0)], [beat(25_000)]], {"orphan_receives": 1}),
    ("other runs are ignored", [[c.Send("other", "s", S, event_id="x", intended_at_ns=S)]], {}),
    ("clock skew: receive before send is counted, kept out of the histogram",
     [[send(1, 100), recv(1, 50)]], {"sent": 1, "received": 1, "clock_skew": 1}),
    # the telemetry broker lost its data (the source's reset record, stamped with the source's clock): e1 was waiting,
    # its receive record may have gone with the broker; windows from its send (or the watermark, if earlier) to the
    # hole (the newest record read before, or the new log's first) and one more are incomplete
    ("waiting at a telemetry reset: unaccounted, not dropped",
     [[send(1, 0), send(2, 100), recv(2, 200), beat(3_000)], [reset(3_000)], [beat(12_000)]],
     {"sent": 2, "received": 1, "unaccounted": 1, "telemetry_incomplete": 5}),
    ("waiting at a telemetry reset, received after it: received",
     [[send(1, 0), beat(3_000)], [reset(3_000), recv(1, 3_500)], [beat(12_000)]],
     {"sent": 1, "received": 1, "telemetry_incomplete": 3}),  # from the watermark (2 s): e1 came in the same batch
    ("unaccounted, then its in-time receive arrives: withdrawn",
     [[send(1, 0), beat(3_000)], [reset(3_000)], [beat(12_000)], [recv(1, 9_000)]],
     {"sent": 1, "received": 1, "telemetry_incomplete": 5}),
    # (nothing was waiting: from the watermark, not before the run; the sender's first record in the new log, at 3.1 s,
    # takes the hole on to when the reset was found, 3 s: no record written after it was lost)
    ("sent after the hole and never received: a drop",
     [[send(1, 0), recv(1, 5)], [reset(3_000)], [send(2, 3_100)], [beat(15_000)]],
     {"sent": 2, "received": 1, "dropped": 1, "telemetry_incomplete": 3}),
    ("a receiver first heard from after the reset was found does not take the hole past it: a drop",
     [[send(1, 0), recv(1, 5)], [reset(3_000)], [send(2, 3_100), send(3, 3_150), recv(3, 3_200)], [beat(15_000)]],
     {"sent": 3, "received": 2, "dropped": 1, "telemetry_incomplete": 3}),
    # the job had read to 1 s (the hole's next window ends at 3 s); the sender's records from 1 s to 3.5 s and the
    # receiver's to 3.6 s were lost, among them e2's receive: the receiver's first record in the new log ends the hole
    ("a send before a receiver's first record in the new log, after the hole's next window: unaccounted",
     [[send(1, 0), recv(1, 5), beat(1_000)], [reset(6_000)], [send(2, 3_500), send(3, 3_550), recv(3, 3_600)],
      [beat(15_000)]],
     {"sent": 3, "received": 2, "unaccounted": 1, "telemetry_incomplete": 4}),
    ("the hole waits on an agent across batches: the receiver's first record comes a batch after the sender's",
     [[send(1, 0), recv(1, 5), beat(1_000)], [reset(6_000)], [send(2, 3_500), send(3, 3_550)], [recv(3, 3_600)],
      [beat(15_000)]],
     {"sent": 3, "received": 2, "unaccounted": 1, "telemetry_incomplete": 4}),
    ("a send of the hole's windows read only after the reset (its receive record may be lost): unaccounted",
     [[send(1, 0), recv(1, 5)], [reset(3_000), send(2, 1_500)], [beat(15_000)]],
     {"sent": 2, "received": 1, "unaccounted": 1, "telemetry_incomplete": 3}),
    # the sender writes a send with its answer: its first line in the new log was written when e2 was answered, at
    # 3.54 s, after the receiver's first record (3.4 s), though e3's stamp (3.3 s) is the earliest: the hole ends
    # there, and e2, sent at 3.45 s and never received, is unaccounted, not a drop
    ("the hole ends when a sender wrote its first line, a send with its answer: when it was answered",
     [[send(1, 0), recv(1, 5), beat(1_000)], [reset(6_000)],
      [recv(3, 3_400), sendack(2, 3_450, 3_540), sendack(3, 3_300, 3_560)], [beat(15_000)]],
     {"sent": 3, "received": 2, "acked": 2, "unaccounted": 1, "telemetry_incomplete": 4}),
    # as when the hole waits on the receiver across batches, but the sender's first records move the watermark past
    # e2's and e3's deadlines: both are declared dropped; then e3's in-time receive withdraws its drop, and the hole,
    # grown to the receiver's first record, e2's
    ("a send declared dropped before the receiver's first record in the new log: unaccounted after all",
     [[send(1, 0), recv(1, 5), beat(1_000)], [reset(20_000)], [send(2, 3_500), send(3, 3_550), beat(15_000)],
      [recv(3, 3_600)], [beat(30_000)]],
     {"sent": 3, "received": 2, "unaccounted": 1, "telemetry_incomplete": 4}),
]



@pytest.mark.parametrize("desc,batches,expected", CASES, ids=[c[0] for c in CASES])
def test_rules(desc, batches, expected):
    totals, _, _ = run(batches)
    assert totals == expected


def test_a_senders_progress_is_its_lines_writing_less_the_hold():
    # a line written at t (a send with its answer, an ack) says every send stamped before t - SEND_HOLD_NS is written:
    # the gap rule waits for that, not for the stamps (e3's, stamped before e2's, comes after it)
    hold_ms = c.SEND_HOLD_NS // MS
    _, _, state = run([[sendack(2, 100, 160)]])
    assert state.gaps.progress["s"] == S + (160 - hold_ms) * MS
    _, _, state = run([[sendack(2, 100, 160)], [sendack(3, 90, 170), c.Ack("r", "s", S + 300 * MS, event_id="e4", sent_at_ns=S)]])
    assert state.gaps.progress["s"] == S + (300 - hold_ms) * MS
    _, _, state = run([[send(5, 400)]])  # a send written alone, after its hold: every send before it is written
    assert state.gaps.progress["s"] == S + 400 * MS


def test_counts_land_in_the_right_windows():
    # sends by send time, receives and duplicates by receive time, drops by send time
    _, by_window, _ = run([[send(1, 900), recv(1, 1_100), recv(1, 2_100), send(2, 1_500)], [beat(20_000)]])
    assert by_window == {(0, "sent"): 1, (1, "sent"): 1, (1, "received"): 1, (2, "duplicates"): 1, (1, "dropped"): 1}


def test_state_is_bounded_by_retention():
    _, _, state = run([[send(i, i) for i in range(100)] + [recv(i, i + 3) for i in range(100)], [beat(40_000)]])
    assert len(state.known) == 0 and len(state.orphans) == 0


def _sum_partials(batch_tables):
    state, parts, hists = engine.EngineState(), [], []
    for t in batch_tables:
        state, r = engine.process(state, t, engine.EngineConfig(run_id="synthetic"))
        parts.append(r.counts)
        hists.append(r.hists)
    h = pd.concat(hists).groupby(["window_ns", "hist", "bucket"])["count"].sum()
    counts = pd.concat(parts)
    summed = counts[~counts["name"].str.startswith(output.MAX)].groupby(["window_ns", "name"])["value"].sum()
    return summed[summed != 0], h


def test_results_do_not_depend_on_batch_boundaries():
    # the same telemetry cut into 1, 7 and 60 batches gives identical window sums and histograms
    run_ = generate(SyntheticSpec(run_id="synthetic", duration_s=20, rate_per_sec=300, pause=(8.0, 2.0), late_count=2))
    msgs = messages(run_, 50)
    results = []
    for n in (1, 7, 60):
        chunks = np.array_split(np.arange(len(msgs)), n)
        tables = [decode_messages([msgs[i][1] for i in ch], [0] * len(ch), list(ch)) for ch in chunks if len(ch)]
        results.append(_sum_partials(tables))
    for counts, hists in results[1:]:
        pd.testing.assert_series_equal(counts, results[0][0])
        pd.testing.assert_series_equal(hists, results[0][1])


def test_telemetry_messages_re_sent_a_few_batches_on_change_nothing():
    """A producer's retry, or an agent restarted from its spool, writes some of its messages again, later in the topic
    (here 10 s of event time later, inside the job's retention): every window sums as without them, and the repeats
    are counted as such, duplicates among them too (CI, 2026-11-30: a copy of a duplicate was another one)."""
    run_ = generate(SyntheticSpec(run_id="synthetic", duration_s=20, rate_per_sec=300, pause=None, late_count=2))
    msgs = messages(run_, 50)
    chunks = np.array_split(np.arange(len(msgs)), 20)
    tables = lambda chunks: [decode_messages([msgs[i][1] for i in ch], [0] * len(ch), list(ch)) for ch in chunks]  # noqa: E731
    again = [*chunks[:10], np.r_[chunks[10], chunks[1], chunks[2]], *chunks[11:]]
    (counts, hists), (counts2, hists2) = _sum_partials(tables(chunks)), _sum_partials(tables(again))
    repeats = counts2.xs(output.REPEATED_SEND_RECORDS, level="name").sum() + counts2.xs(
        output.REPEATED_RECEIVE_RECORDS, level="name").sum()
    assert counts.xs("duplicates", level="name").sum() > 0 and repeats > 100
    pd.testing.assert_series_equal(counts2[~counts2.index.get_level_values("name").isin(
        [output.REPEATED_SEND_RECORDS, output.REPEATED_RECEIVE_RECORDS])], counts)
    pd.testing.assert_series_equal(hists2, hists)


def test_sends_written_with_their_answer_give_the_results_of_sends_and_acks_apart():
    # the load generator's form: each send written with its answer, up to SEND_HOLD_NS after its stamp, so out of the
    # stamps' order. Cut into 1, 7 and 60 batches: the same sums; and those of the same run written with sends and
    # error acks apart, but for the answers counted (that form has no successful acks)
    spec = dict(run_id="synthetic", duration_s=20, rate_per_sec=300, pause=(8.0, 2.0), late_count=2)
    held = messages(generate(SyntheticSpec(**spec, held=True)), 50)
    results = []
    for n in (1, 7, 60):
        chunks = np.array_split(np.arange(len(held)), n)
        results.append(_sum_partials([decode_messages([held[i][1] for i in ch], [0] * len(ch), list(ch)) for ch in chunks]))
    for counts, hists in results[1:]:
        pd.testing.assert_series_equal(counts, results[0][0])
        pd.testing.assert_series_equal(hists, results[0][1])
    apart = messages(generate(SyntheticSpec(**spec)), 50)
    counts, hists = _sum_partials([decode_messages([m[1] for m in apart], [0] * len(apart), list(range(len(apart))))])
    acked = results[0][0].xs(output.ACKED, level="name")
    assert acked.sum() == 20 * 300 - int(counts.xs(output.ERRORS, level="name").sum()) > 0
    assert results[0][0].xs("silence_ns", level="name").sum() >= 2 * NS  # the pause, a gap judged the same way
    pd.testing.assert_series_equal(results[0][0].drop(output.ACKED, level="name"), counts)
    pd.testing.assert_series_equal(results[0][1], hists)


def _finished(batches, closing: list | None = None) -> list[bool]:
    """Each batch's ``finished``; ``closing`` gets each batch's info ``closing`` (every shard stopped, not closed)."""
    state, out = engine.EngineState(), []
    for records in batches:
        state, result = engine.process(state, decode_messages([c.encode(records)], [0], [0]), CFG)
        out.append(result.finished)
        if closing is not None:
            closing.append(result.info["closing"])
    return out


def test_a_sharded_run_closes_only_once_every_shard_has_stopped():
    def start(agent):
        return c.RunStart("r", agent, S, config='{"pace": "200:30", "shards": 2}')

    def stop(agent, t_ms):
        return c.RunStop("r", agent, S + t_ms * MS, reason="completed")
    # shard 0 stops at 1 s; shard 1 keeps sending until 30 s; the watermark passes shard 0's stop + timeout at 12 s
    closing: list[bool] = []
    assert _finished([[start("loadgen0"), start("loadgen1"), send(1, 0), recv(1, 2), stop("loadgen0", 1_000)],
                      [send(2, 20_000), recv(2, 20_002)], [stop("loadgen1", 30_000)], [beat(45_000)]], closing) \
        == [False, False, False, True]
    # the job's heartbeats quicken (streaming.job) only from the last shard's stop to the close
    assert closing == [False, False, True, False]
    # one shard alone (the default, no "shards" in the start record) closes the run as before
    assert _finished([[c.RunStart("r", "loadgen", S, config="{}"), send(1, 0), recv(1, 2), stop("loadgen", 1_000)],
                      [beat(15_000)]]) == [False, True]
    # a stop re-sent by the same shard does not count as the other shard's
    assert _finished([[start("loadgen0"), start("loadgen1"), send(1, 0), recv(1, 2), stop("loadgen0", 1_000)],
                      [stop("loadgen0", 1_000), beat(15_000)]]) == [False, False]


def test_a_silent_load_generator_is_closed_as_aborted():
    """kill -9 of the generator: no stop record. The job's heartbeats move the watermark; after the
    silence timeout (here 20 s) the run closes as aborted at the generator's last record."""
    cfg = dataclasses.replace(CFG, silence_timeout_ns=20_000 * MS)
    state, finished, events = engine.EngineState(), [], []
    batches = [[c.RunStart("r", "loadgen", S, config="{}"), send(1, 0), recv(1, 2), send(2, 1_000)],  # 2 is never received
               [beat(15_000)], [beat(25_000)], [beat(26_000)], [beat(45_000)]]
    for records in batches:
        state, result = engine.process(state, decode_messages([c.encode(records)], [0], [0]), cfg)
        finished.append(result.finished)
        events.append(result.events)
    # at 15 s the watermark (14 s) is short of the last record + 20 s; at 25 s it is past it (24 s > 21 s)
    assert finished == [False, False, True, True, True]
    ev = pd.concat(events)
    stop = ev[ev["kind"] == "run_stop"]
    assert len(stop) == 1 and stop["agent"].iloc[0] == "job" and stop["at_ns"].iloc[0] == S + 1_000 * MS
    assert stop["reason"].iloc[0].startswith("aborted: no record from 1 of 1 load generator(s) for 20 s")
    assert state.aborted is not None
    # what was sent is kept: 2 sent, 1 received, the other dropped after the drop timeout
    totals, _, _ = run(batches)  # the default silence timeout (60 s) has not passed: same counts, run still open
    assert totals["sent"] == 2 and totals["received"] == 1


def test_a_generator_that_stops_is_not_aborted():
    state = engine.EngineState()
    for records in [[c.RunStart("r", "loadgen", S, config="{}"), send(1, 0), recv(1, 2),
                     c.RunStop("r", "loadgen", S + 1_000 * MS, reason="completed")], [beat(100_000)]]:
        state, result = engine.process(state, decode_messages([c.encode(records)], [0], [0]), CFG)
    assert result.finished and state.aborted is None


def test_a_failure_of_the_live_verdict_never_fails_a_batch_and_its_figures_come_back_from_the_files(tmp_path, monkeypatch):
    """The verdict is advice: an error while adding a batch's figures is logged, the batch goes on, and the next
    batch rebuilds the figures from the files (which hold every batch so far): the verdict is the fresh reader's."""
    import json

    from runs import results
    from streaming import live
    from streaming.sinks import RunStore

    spec = SyntheticSpec(run_id="flaky", duration_s=8, rate_per_sec=100, pause=None, oom_at_s=(), late_count=0)
    msgs = messages(generate(spec), 50)
    logged = []
    store = RunStore(str(tmp_path / "r"), engine.EngineConfig(run_id="flaky"), log=logged.append, live_verdict=True)
    cuts = np.array_split(np.arange(len(msgs)), 6)
    real_add = live.LiveWindows.add
    for b, ch in enumerate(cuts):
        if b == 3:
            monkeypatch.setattr(live.LiveWindows, "add", lambda *a: (_ for _ in ()).throw(ValueError("boom")))
        elif b == 4:
            monkeypatch.setattr(live.LiveWindows, "add", real_add)
        store.process_batch(decode_messages([msgs[i][1] for i in ch], [0] * len(ch), list(ch)), b)
    assert any("verdict: not computed after batch 3 (ValueError: boom)" in line for line in logged), logged
    published = json.loads(open(tmp_path / "r" / "verdict.json").read())
    assert published["batch_id"] == 5
    published.pop("batch_id"), published.pop("computed_at_ns")
    assert published == json.loads(json.dumps(results.live_verdict(str(tmp_path / "r"))))


def test_a_snapshot_of_an_older_version_restores_with_empty_event_id_strings(tmp_path):
    """Seen live: a run folder from before exemplars (its snapshot's tables lack the ``id`` column) crashed the
    job at recovery (a KeyError in astype). Its state restores; the IDs of events it held are empty strings, and
    their routes (a snapshot from before routes) and their duplicates' stamps (from before those) none."""
    import glob

    import pyarrow.parquet as pq

    from streaming.sinks import RunStore

    run_ = generate(SyntheticSpec(run_id="old", duration_s=6, rate_per_sec=100, pause=None, oom_at_s=()))
    msgs = messages(run_, 50)
    cfg = engine.EngineConfig(run_id="old")
    store = RunStore(str(tmp_path / "r"), cfg)
    halves = np.array_split(np.arange(len(msgs)), 2)
    store.process_batch(decode_messages([msgs[i][1] for i in halves[0]], [0] * len(halves[0]), list(halves[0])), 0)
    (snap,) = glob.glob(str(tmp_path / "r" / "state" / "snap-*"))
    for name in ("known", "orphans"):  # an older snapshot: one pair of tables, no join partitions
        t = pq.read_table(f"{snap}/{name}-0.parquet")
        old = [c for c in ("id", "route", "dup_ns", "acked") if c in t.column_names]  # from before exemplars, routes, ...
        pq.write_table(t.drop_columns(old), f"{snap}/{name}.parquet")
        os.remove(f"{snap}/{name}-0.parquet")
    scalars = json.load(open(f"{snap}/scalars.json"))
    scalars.pop("join_partitions")
    json.dump(scalars, open(f"{snap}/scalars.json", "w"))
    pending = len(store.state.known)
    again = RunStore(str(tmp_path / "r"), cfg)
    again.process_batch(decode_messages([msgs[i][1] for i in halves[1]], [0] * len(halves[1]), list(halves[1])), 1)
    assert pending > 0 and again.state.known["id"].map(type).eq(str).all()
    assert (again.state.known["route"] == -1).all()  # sent to no route in particular
    assert again.state.known["dup_ns"].dtype == np.int64 and (again.state.known["dup_ns"] >= -1).all()


def test_the_jobs_live_verdict_equals_a_fresh_readers_after_every_batch_and_after_a_restart(tmp_path):
    """The job keeps the verdict's window figures batch by batch (``streaming.live``) instead of re-reading the
    files: after every batch its ``verdict.json`` equals ``results.live_verdict`` over all partial files (per-window
    rules, per-step merged percentiles, knee), with drops, errors, a pause, an OOM kill and node samples in the run;
    a store restarted mid-run rebuilds the figures from the files and stays equal."""
    import json

    from runs import results
    from streaming.sinks import RunStore

    spec = SyntheticSpec(run_id="live", duration_s=24, rate_per_sec=200, pause=(15.0, 2.0), oom_at_s=(9.5,),
                         drop_timeout_s=2, late_count=0)
    run_ = generate(spec)
    for _t, r in run_.records:
        if r.get("kind") == "run_start":
            r["config"] = json.dumps({"rate": 200, "pace": "200:8,200:8,200:8", "schedule_start_ns": spec.start_ns + 400_000_000})
    msgs = messages(run_, 50)
    cfg = engine.EngineConfig(run_id="live", drop_timeout_ns=2 * NS, retention_ns=2 * NS, watermark_delay_ns=1 * NS)
    root = str(tmp_path / "r")
    store = RunStore(root, cfg, live_verdict=True)
    cuts = np.array_split(np.arange(len(msgs)), 45)
    compared = 0
    for b, ch in enumerate(cuts):
        if b == 20:  # the job restarts: a fresh store recovers the engine state and the verdict's figures
            store = RunStore(root, cfg, live_verdict=True)
        result = store.process_batch(decode_messages([msgs[i][1] for i in ch], [0] * len(ch), list(ch)), b)
        if result.finished:
            break
        fresh = results.live_verdict(root)
        if fresh is None:
            continue
        live = json.loads(open(f"{root}/verdict.json").read())
        assert live["batch_id"] == b
        live.pop("batch_id"), live.pop("computed_at_ns")
        assert live == json.loads(json.dumps(fresh)), f"batch {b}"
        compared += 1
    assert compared >= 30 and len(fresh["steps"]) == 3 and fresh["message"]
    windows = results.load_windows(root)
    assert windows["dropped"].sum() > 0 and windows["errors"].sum() > 0 and windows["oom_kills"].sum() > 0
    assert windows["gap"].any() and windows.filter(like="cpu_utilization").notna().any().any()


def test_an_archive_from_before_routes_replays_to_the_figures_of_its_run(tmp_path):
    """An archive written before sends and receives said where they went (its batches lack ``dest``, ``route`` and
    ``key``) replays, as ``streaming replay`` does (``archive.read_paths`` into the run's store, batch by batch), to
    the figures its run had: the same totals, ledger and percentiles, nothing misrouted. The run is one with drops,
    duplicates, errors, late receives and a pause (``loadgen.synthetic``)."""
    import glob

    import pyarrow.parquet as pq

    from core.rundir import RunPaths
    from runs import results
    from streaming.archive import read_paths
    from streaming.sinks import RunStore

    run_ = generate(SyntheticSpec(run_id="old", duration_s=12, rate_per_sec=300, pause=(5.0, 1.0), late_count=3,
                                  drop_timeout_s=2, heartbeat_until_s=30, oom_at_s=()))
    msgs = messages(run_, 50)
    cfg = engine.EngineConfig(run_id="old", drop_timeout_ns=2 * 10**9)
    live = RunStore(str(tmp_path / "live" / "old"), cfg)
    for b, part in enumerate(np.array_split(np.arange(len(msgs)), 8)):
        live.process_batch(decode_messages([msgs[i][1] for i in part], [0] * len(part), list(part)), b)
    before = tmp_path / "before"
    os.makedirs(before)
    paths = []
    for path in sorted(glob.glob(os.path.join(RunPaths(str(tmp_path / "live" / "old")).archive, "batch-*.parquet"))):
        t = pq.read_table(path)
        assert {"dest", "route", "key"} <= set(t.column_names)
        pq.write_table(t.drop_columns(["dest", "route", "key"]), before / os.path.basename(path))  # as written before
        paths.append(str(before / os.path.basename(path)))
    replay = RunStore(str(tmp_path / "replay" / "old"), cfg, archive=False)
    for b, path in enumerate(paths):
        replay.process_batch(read_paths([path]), b)
    a, r = (json.load(open(os.path.join(d, "old", "summary.json"))) for d in (tmp_path / "live", tmp_path / "replay"))
    keys = [*output.SUMMARY_TOTALS, "ledger", "latency_us", "latency_intended_us", "send_delay_us", "gaps"]
    assert {k: r[k] for k in keys} == {k: a[k] for k in keys}
    assert r["misrouted"] == 0 and r["sent"] == len(run_.event_id) and r["dropped"] > 0 and r["duplicates"] > 0
    assert sum(r["ledger"].values()) == r["sent"] and results.summarize(str(tmp_path / "replay" / "old"))["sent"] == r["sent"]
