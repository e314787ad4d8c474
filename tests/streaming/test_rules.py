"""Each rule of ``streaming.rules`` (a join partition's) and ``streaming.run_rules`` (the driver's) on its own,
table by table: a batch runs through the rules in the order ``engine.process`` applies them (one join partition),
each rule's result is kept by its name, and what a rule counted and decided is compared with the table's row."""
import dataclasses
import json
from types import SimpleNamespace

import pandas as pd
import pytest

from core import contract as c
from core import output as o
from streaming import engine, partials, rules, run_rules
from streaming.decode import decode_messages
from streaming.rules import DROPPED, ERRORED, LATE, PENDING, RECEIVED, UNACCOUNTED, UNKNOWN
from streaming.state import NO_TIME_NS, JoinState

S = 1_800_000_000 * 10**9
MS = 10**6
CFG = engine.EngineConfig(run_id="r", drop_timeout_ns=10_000 * MS, watermark_delay_ns=1_000 * MS, retention_ns=10_000 * MS,
                          silence_timeout_ns=20_000 * MS)


def send(i, t_ms, intended_ms=None, agent="s"):
    return c.Send("r", agent, S + t_ms * MS, event_id=f"e{i}", intended_at_ns=S + (t_ms if intended_ms is None else intended_ms) * MS)


def recv(i, t_ms, route=None):
    return c.Receive("r", "rx", S + t_ms * MS, event_id=f"e{i}", route=route, dest=None if route is None else f"q.{route}")


def ack(i, t_ms, status=202, error=None):
    return c.Ack("r", "s", S + t_ms * MS, event_id=f"e{i}", sent_at_ns=S + t_ms * MS, status=status, error=error)


def beat(t_ms, agent="s"):
    return c.Heartbeat("r", agent, S + t_ms * MS)


def start(t_ms, shards=1, agent="s"):
    return c.RunStart("r", agent, S + t_ms * MS, config=json.dumps({"shards": shards}))


def stop(t_ms, agent="s"):
    return c.RunStop("r", agent, S + t_ms * MS, reason="done")


def table(records):
    return decode_messages([c.encode(records)], [0], [0]) if records else decode_messages([], [], [])


def given(history) -> engine.EngineState:
    """A state: as given, or after ``engine.process`` of these earlier batches."""
    if isinstance(history, engine.EngineState):
        return history
    state = engine.EngineState()
    for records in history:
        state, _ = engine.process(state, table(records), CFG)
    return state


def trace(history, records) -> dict:
    """One batch through every rule, as ``engine.plan``, ``join.take``, ``join.settle`` and ``engine.finish`` run
    them with one join partition: per rule, what it returned (``value``), the counts made so far, the known IDs and
    the orphans after it."""
    state, out, seen = given(history), partials.Collector(CFG.window_ns), {}
    part = state.joins[0] if state.joins else JoinState()

    def keep(name, value=None, known=None, orphans=None):
        seen[name] = SimpleNamespace(value=value, counts=counts(out), known=known, orphans=orphans)

    _, recs, _ = run_rules.start(table(records), CFG)
    max_event_ns, wm = run_rules.watermark(state, recs, CFG)
    keep("watermark", (max_event_ns, wm))
    gaps, judged = run_rules.judge(state, recs, wm, CFG)
    keep("judge", judged)
    known, sends_ns = rules.take_sends(rules.Known.of(part.known), recs, state.hole_until_ns, out)
    keep("take_sends", sends_ns, known)
    known, unnamed = rules.take_acks(known, recs, state.drops_named_ns, out)
    keep("take_acks", unnamed, known)
    got = rules.take_receives(known, part.orphans, recs, state.drops_named_ns, CFG, out)
    keep("take_receives", got, got.known, got.orphans)
    orphans = rules.expire_orphans(got.orphans, wm, CFG, out)
    keep("expire_orphans", orphans, got.known, orphans)
    record = run_rules.reset_record(state, recs)
    hole, reset, known = run_rules.hole_until(state, recs, record, CFG)[0], None, got.known
    if record is not None:
        known = rules.mark_unknown(known, hole)
    elif hole > state.hole_until_ns:
        known = rules.mark_unknown(known, hole, out, state.hole_until_ns)
    if record is not None:
        waiting = rules.waiting_before(got.known, len(part.known))
        reset = run_rules.incomplete_windows(state, recs, record, hole, waiting, CFG, out)
    elif hole > state.hole_until_ns:
        run_rules.more_incomplete_windows(state.hole_until_ns, hole, CFG, out)
    keep("reset", (hole, reset), known)
    known = rules.declare_drops(known, wm, CFG, out)
    keep("declare_drops", None, known)
    named = rules.name_drops(known, state.drops_named_ns, wm, judged, CFG)
    keep("name_drops", (named, rules.named_until(state.drops_named_ns, wm, judged, CFG)), known)
    known = rules.forget(known, wm, CFG)
    keep("forget", None, known)
    span, run_events = run_rules.run_span(state, recs, wm, CFG)
    keep("run_span", span)
    _, declared = run_rules.declare_gaps(gaps, sends_ns, got.fresh_recv_ns, judged, span["stop_ns"], wm, CFG, out)
    keep("declare_gaps", declared)
    events, _ = run_rules.gather_events(recs, run_events, [unnamed, *got.exemplars, named], declared,
                                        reset[0] if reset else None, span["start_ns"], span["stop_ns"], CFG, state.early)
    keep("gather_events", events)
    return seen


def counts(out: partials.Collector) -> dict:
    df = out.counts_frame()
    df = df[~df["name"].pipe(o.merges_by_max)]
    return {n: int(v) for n, v in df.groupby("name")["value"].sum().items() if v}


def statuses(known: rules.Known) -> dict:
    return dict(zip(known.frame["id"], known.status.tolist()))


def test_split_keeps_this_runs_and_the_shared_records_and_counts_the_rest():
    records = [send(1, 0), c.Send("other", "s", S, event_id="x", intended_at_ns=S),
               c.NodeSample(c.ANY_RUN, "n", S, node="n1", metric="cpu", value=0.5),
               c.Send(c.ANY_RUN, "s", S, event_id="y", intended_at_ns=S)]  # a send is no shared kind
    bad, good, shared, info = run_rules.split(table(records), "r")
    assert (bad.num_rows, good.num_rows, shared.num_rows, info["num_other_run"]) == (0, 1, 1, 2)


@pytest.mark.parametrize("history, records, max_event_ms, watermark_ms", [
    ([], [send(1, 0), send(2, 3_000)], 3_000, 2_000),
    ([[send(1, 5_000)]], [send(2, 3_000)], 5_000, 4_000),   # never back
    ([[send(1, 5_000)]], [], 5_000, 4_000),
])
def test_advance_watermark(history, records, max_event_ms, watermark_ms):
    max_event_ns, watermark_ns = trace(history, records)["watermark"].value
    assert (max_event_ns - S, watermark_ns - S) == (max_event_ms * MS, watermark_ms * MS)


@pytest.mark.parametrize("records, judged_ms", [
    ([send(1, 100), recv(1, 300)], 100),                                  # the slower agent holds judgement back
    ([send(1, 100), beat(900), recv(1, 300)], 300),                       # a heartbeat moves its agent on
    ([send(1, 100), recv(1, 300), stop(200)], 300),                       # a stopped agent writes nothing more
])
def test_judge(records, judged_ms):
    assert trace([[start(0)]], records)["judge"].value - S == judged_ms * MS


@pytest.mark.parametrize("history, records, expected, status", [
    ([], [send(1, 0)], {"sent": 1}, {"e1": PENDING}),
    ([], [send(1, 0), send(1, 0)], {"sent": 1, "repeated_send_records": 1}, {"e1": PENDING}),
    ([[send(1, 0)]], [send(1, 0)], {"repeated_send_records": 1}, {"e1": PENDING}),
    ([], [send(1, 10, intended_ms=20)], {"sent": 1, "negative_send_delay": 1}, {"e1": PENDING}),
    (dataclasses.replace(engine.EngineState(), hole_until_ns=S + 5 * MS), [send(1, 0), send(2, 10)], {"sent": 2},
     {"e1": UNKNOWN, "e2": PENDING}),  # sent inside a telemetry hole: its receive record may be gone
])
def test_take_sends(history, records, expected, status):
    t = trace(history, records)["take_sends"]
    assert (t.counts, statuses(t.known)) == (expected, status)


@pytest.mark.parametrize("history, records, expected, status, errored", [
    ([[send(1, 0)]], [ack(1, 0)], {"acked": 1}, PENDING, False),
    ([[send(1, 0)]], [ack(1, 0, 503)], {"errors": 1, "errors:http_503": 1}, PENDING, True),
    ([[send(1, 0)]], [ack(1, 0, None, "timeout")], {"errors": 1, "errors:timeout": 1}, PENDING, True),
    ([[send(1, 0)], [beat(12_000)]], [ack(1, 0, 500)], {"errors": 1, "errors:http_500": 1, "dropped": -1}, ERRORED, True),
    # received before its failure came back: in doubt; received late before it, no longer a drop
    ([[send(1, 0), recv(1, 5)]], [ack(1, 0, None, "connection lost")],
     {"errors": 1, "errors:connection lost": 1, "in_doubt": 1}, RECEIVED, True),
    ([[send(1, 0)], [recv(1, 10_500)]], [ack(1, 0, 503)],
     {"errors": 1, "errors:http_503": 1, "failed_late": 1, "dropped": -1}, LATE, True),
])
def test_take_acks(history, records, expected, status, errored):
    t = trace(history, records)["take_acks"]
    assert (t.counts, statuses(t.known)["e1"], bool(t.known.errored[0])) == (expected, status, errored)


@pytest.mark.parametrize("history, records, expected, status, orphans", [
    ([[send(1, 0)]], [recv(1, 5)], {"received": 1}, RECEIVED, 0),
    ([[send(1, 0)]], [recv(1, 5), recv(1, 6)], {"received": 1, "duplicates": 1}, RECEIVED, 0),
    ([[send(1, 0)]], [recv(1, 5), recv(1, 5)], {"received": 1, "repeated_receive_records": 1}, RECEIVED, 0),
    ([[send(1, 0), recv(1, 5)]], [recv(1, 5)], {"repeated_receive_records": 1}, RECEIVED, 0),
    # a batch of an agent's re-sent, holding a duplicate: a copy of the duplicate is no other duplicate (CI, 2026-11-30:
    # a producer's retry counted a batch's duplicates twice); a third delivery is one
    ([[send(1, 0), recv(1, 5), recv(1, 6)]], [recv(1, 5), recv(1, 6)], {"repeated_receive_records": 2}, RECEIVED, 0),
    ([[send(1, 0), recv(1, 5)], [recv(1, 6)]], [recv(1, 6), recv(1, 7)],
     {"repeated_receive_records": 1, "duplicates": 1}, RECEIVED, 0),
    ([[send(1, 0)]], [recv(1, 10_500)], {"dropped": 1, "late": 1}, LATE, 0),
    ([[send(1, 0)], [beat(12_000)]], [recv(1, 9_000)], {"received": 1, "dropped": -1}, RECEIVED, 0),
    ([[send(1, 0)]], [recv(2, 5)], {}, PENDING, 1),                         # its send has not come (yet)
    ([[recv(1, 5)]], [send(1, 0)], {"sent": 1, "received": 1}, RECEIVED, 0),  # an orphan meets its send
    ([[send(1, 0)], [ack(1, 0, 503)]], [recv(1, 10_500)], {"late": 1, "failed_late": 1}, LATE, 0),  # not a drop
    ([[send(1, 0)], [ack(1, 0, 503)]], [recv(1, 5)], {"received": 1, "in_doubt": 1}, RECEIVED, 0),  # failed, yet here
])
def test_take_receives(history, records, expected, status, orphans):
    t = trace(history, records)["take_receives"]
    assert (t.counts, statuses(t.known)["e1"], len(t.orphans)) == (expected, status, orphans)


@pytest.mark.parametrize("history, records, expected, left", [
    ([[recv(1, 0)]], [beat(20_000)], {}, 1),                               # deadline + retention not passed
    ([[recv(1, 0)]], [beat(21_500)], {"orphan_receives": 1}, 0),
])
def test_expire_orphans(history, records, expected, left):
    t = trace(history, records)["expire_orphans"]
    assert (t.counts, len(t.orphans)) == (expected, left)


def test_mark_reset_leaves_the_waiting_sends_unknown_and_flags_the_windows_to_the_hole():
    reset = c.TelemetryReset(c.ANY_RUN, "job", S, where="t", reason="the topic was recreated", count=7)
    history = [[send(1, 0), send(2, 500), recv(2, 600), beat(3_200)]]
    t = trace(history, [reset, send(3, 4_500)])["reset"]
    # the watermark stood at 2.2 s and e1 waited since 0: windows 0 .. the hole's next (the hole at 4.5 s) are flagged
    assert t.counts == {"sent": 1, "telemetry_incomplete": 6}
    assert statuses(t.known) == {"e1": UNKNOWN, "e2": RECEIVED, "e3": UNKNOWN}
    event, info = t.value[1]
    assert event["count"] == 7 and info["waiting"] == 1
    assert trace([], [reset, send(1, 0)])["reset"].value == (NO_TIME_NS, None)  # a reset before the run touches nothing


@pytest.mark.parametrize("history, records, expected, status", [
    ([[send(1, 0)]], [beat(10_500)], {}, PENDING),                          # the watermark (9.5 s) before the deadline
    ([[send(1, 0)]], [beat(11_500)], {"dropped": 1}, DROPPED),
    ([[send(1, 0)], [ack(1, 0, 503)]], [beat(11_500)], {}, ERRORED),        # failed at the sender: no drop
    (dataclasses.replace(engine.EngineState(), hole_until_ns=S + MS), [send(1, 0), beat(11_500)],
     {"sent": 1, "unaccounted": 1}, UNACCOUNTED),  # sent in a telemetry hole: not a drop
])
def test_declare_drops(history, records, expected, status):
    t = trace(history, records)["declare_drops"]
    assert (t.counts, statuses(t.known)["e1"]) == (expected, status)


@pytest.mark.parametrize("records, named", [
    ([beat(11_500)], []),                                   # the receiver has not written past the deadline
    ([beat(11_500), beat(11_500, "rx")], ["e1"]),           # now no agent can withdraw the drop
])
def test_name_drops(records, named):
    exemplars, named_ns = trace([[start(0), send(1, 0), recv(9, 0)]], records)["name_drops"].value
    ids = list(exemplars.loc[exemplars["kind"] == "dropped_id", "event_id"]) if len(exemplars) else []
    assert ids == named and (named_ns > S) == bool(named)


@pytest.mark.parametrize("records, kept", [
    ([beat(15_000)], ["e1", "e2"]),
    ([beat(21_500)], ["e2"]),        # e1 decided and past deadline + retention; e2 still pending
])
def test_forget(records, kept):
    t = trace([[send(1, 0), recv(1, 5), send(2, 11_000)]], records)["forget"]
    assert list(t.known.frame["id"]) == kept


@pytest.mark.parametrize("history, records, span", [
    ([], [start(0), send(1, 5), stop(900)], (0, 900, 1, None)),
    ([], [start(0, shards=2), stop(900)], (0, 900, 2, None)),
    ([[start(0, shards=2), stop(900)]], [start(10, agent="s2"), stop(950, agent="s2")], (0, 950, 2, None)),
    ([[start(0), send(1, 100)]], [beat(21_200)], (0, 100, 1, "aborted")),  # silent for 20 s: closed at its last record
    ([[start(0), send(1, 100)]], [beat(20_900)], (0, None, 1, None)),
])
def test_run_span(history, records, span):
    r = trace(history, records)["run_span"].value
    assert (r["start_ns"] - S, None if r["stop_ns"] is None else r["stop_ns"] - S, r["shards"],
            (r["aborted"] or "")[:7] or None) == (span[0] * MS, None if span[1] is None else span[1] * MS, span[2], span[3])


@pytest.mark.parametrize("records, gaps", [
    ([send(i, i * 10) for i in range(100)] + [recv(i, i * 10 + 1) for i in range(100)] + [beat(2_000), stop(2_000)], []),
    # at 100/s a silence over 200 ms (20 inter-arrivals) with events in flight is a gap: from receive to receive
    ([send(i, i * 10) for i in range(200)] + [recv(i, i * 10 + 1) for i in range(200) if not 100 <= i < 150]
     + [recv(i, 1_700) for i in range(100, 150)] + [beat(2_100), stop(2_100)], [(991, 1_501)]),  # the receives after the held ones resume at 1.501 s
])
def test_declare_gaps(records, gaps):
    t = trace([[start(0)]], records)["declare_gaps"]
    assert [((a - S) // MS, ((a - S) + d) // MS) for a, d, _ in t.value] == gaps
    assert t.counts.get(o.SILENCE_NS, 0) == sum(d for _, d, _ in t.value)


def test_gather_events_keeps_machine_records_within_the_runs_span():
    node = [c.NodeSample(c.ANY_RUN, "n", S + t * MS, node="n1", metric="cpu", value=0.5) for t in (-5_000, 500, 40_000)]
    events = trace([], [start(0), send(1, 10), stop(1_000), *node])["gather_events"].value
    assert sorted(events["kind"]) == ["node", "run_start", "run_stop"]
    assert (events["window_ns"] == (events["at_ns"] // 10**9) * 10**9).all()
    assert pd.api.types.is_integer_dtype(events["window_ns"])


def test_machine_records_read_before_the_runs_start_wait_for_its_span_as_a_replay_keeps_them():
    # a live job may read an agent's samples of the second before the run's first send in a batch before the run's
    # start record (CI: a seven-host run's replay had one window more, of a cgroup agent's samples); they wait in
    # the state until the span is known, then it keeps what a replay of the run in one batch keeps
    node = [c.NodeSample(c.ANY_RUN, "n", S + t * MS, node="n1", metric="cpu", value=0.5) for t in (-5_000, -500, 500)]
    rest = [start(0), send(1, 10), stop(1_000)]
    live = given([[node[0], node[1]]])
    assert sorted(live.early.column("at_ns").to_pylist()) == [S - 5_000 * MS, S - 500 * MS]
    after = trace(live, [*rest, node[2]])["gather_events"].value
    once = trace([], [*node, *rest])["gather_events"].value
    cols = ["kind", "at_ns", "window_ns", "value"]
    assert after[cols].sort_values("at_ns").reset_index(drop=True).equals(once[cols].sort_values("at_ns").reset_index(drop=True))
    assert sorted(after.loc[after["kind"] == "node", "at_ns"]) == [S - 500 * MS, S + 500 * MS]
    state, _ = engine.process(live, table([*rest, node[2]]), CFG)
    assert state.early is None  # given up to the span once it is known
    rows = json.loads(json.dumps(live.scalars()))["early"]  # a snapshot holds them as rows (``scalars.json``)
    assert rows == live.early.to_pylist()
    restored = trace(dataclasses.replace(live, early=rows), [*rest, node[2]])["gather_events"].value
    assert restored[cols].sort_values("at_ns").reset_index(drop=True).equals(once[cols].sort_values("at_ns").reset_index(drop=True))


def test_the_key_lookup_kept_across_batches_finds_every_row_as_a_fresh_index_does():
    # 40 batches: sends appended (some re-sending an ID forgotten earlier), rows forgotten from the front and from
    # the middle (a second sender's stragglers); after each, every key's row is the table's own index's answer
    import numpy as np
    rng = np.random.default_rng(3)
    frame = pd.DataFrame({"sent_ns": np.zeros(0, np.int64)}, index=pd.Index([], dtype=np.uint64))
    lookup, forgotten, next_key = rules.KeyLookup.of(frame.index), [], 0
    for _ in range(40):
        again = rng.choice(forgotten, size=min(5, len(forgotten)), replace=False).tolist() if forgotten else []
        keys = np.array([*range(next_key, next_key + 300), *again], dtype=np.uint64)
        forgotten = [k for k in forgotten if k not in again]
        next_key += 300
        new = pd.DataFrame({"sent_ns": np.zeros(len(keys), np.int64)}, index=pd.Index(keys, dtype=np.uint64))
        frame, lookup = pd.concat([frame, new]), lookup.appended(new.index)
        lookup = lookup or rules.KeyLookup.of(frame.index)
        gone = np.zeros(len(frame), bool)
        gone[: rng.integers(0, 250)] = True
        gone[rng.integers(0, len(frame), 20)] = True
        forgotten += frame.index[gone].tolist()
        frame, lookup = rules._without(frame, gone), lookup.kept(~gone)
        probe = np.concatenate([frame.index.to_numpy(), np.array(forgotten[-50:], np.uint64),
                                np.arange(next_key, next_key + 10, dtype=np.uint64)])
        assert lookup.size == len(frame)
        np.testing.assert_array_equal(lookup.positions(probe), frame.index.get_indexer(probe))


def test_forgetting_the_first_rows_is_a_slice_and_any_other_rows_a_filter():
    frame = pd.DataFrame({"a": range(6)})
    first = rules._without(frame, pd.Series([True, True, False, False, False, False]).to_numpy())
    some = rules._without(frame, pd.Series([True, False, True, False, False, False]).to_numpy())
    assert first["a"].tolist() == [2, 3, 4, 5] and some["a"].tolist() == [1, 3, 4, 5]
    assert rules._without(frame, pd.Series([True] * 6).to_numpy()).empty


def test_the_batch_accumulator_sums_counts_and_maxes_max_names_per_window():
    out = partials.Collector(1000 * MS)
    out.add(o.SENT, [S, S + 1, S + 1000 * MS])                               # one each
    out.add(o.DROPPED, [S, S + 2], [1, -1])                                  # signed: nets to 0, left out
    out.add(o.max_of(o.LATENCY), [S, S + 1, S + 1000 * MS], 7)               # a scalar is a value, not a count
    out.add(o.max_of(o.LATENCY), [S + 5], [9])
    rows = {(w - S, n): v for w, n, v in out.counts_frame().itertuples(index=False)}
    assert rows == {(0, o.SENT): 2, (1000 * MS, o.SENT): 1, (0, o.max_of(o.LATENCY)): 9,
                    (1000 * MS, o.max_of(o.LATENCY)): 7}


def test_the_ledger_puts_every_sent_event_in_exactly_one_bucket_whatever_the_order_of_its_records():
    """Ten events, each of one fate, their records in the orders agents send them (an answer before or after the
    receive, a receive in time or late, in batches the watermark moves between): ``output.ledger`` of the run's
    summed counts has each in its bucket, and the buckets sum to ``sent``."""
    batches = [
        [send(i, i) for i in range(10)] + [recv(0, 20), ack(3, 3, 503), ack(4, 4, None, "timeout"), recv(5, 30),
                                             ack(9, 9, None, "not connected")],
        [recv(4, 40), ack(5, 5, None, "connection lost"), ack(6, 6, 503), recv(8, 10_500), beat(10_700)],
        [recv(1, 10_800), recv(6, 10_900), beat(12_000)],
        [ack(8, 8, 500), recv(0, 25), beat(30_000)],  # e8's answer after its late receive; e0 again: a duplicate
    ]
    state, totals = engine.EngineState(), {}
    for records in batches:
        state, result = engine.process(state, table(records), CFG)
        for name, value in result.counts.groupby("name")["value"].sum().items():
            totals[name] = totals.get(name, 0) + int(value)
    led = o.ledger(totals)
    # received: e0 (in time, then a duplicate); late: e1; dropped: e2, e7 (never received); failed: e3, e9 (never
    # received); in doubt: e4 (failed, then received in time), e5 (received, then failed), e6 (failed, then received
    # late), e8 (received late, then failed)
    assert led == {"received": 1, "late": 1, "dropped": 2, "failed": 2, "in_doubt": 4, "misrouted": 0, "unaccounted": 0,
                   "pending": 0}, (led, totals)
    assert sum(led.values()) == totals["sent"] == 10 and totals["duplicates"] == 1
    assert o.ledger_text(totals) == "sent 10 = received 1 + late 1 + dropped 2 + failed 2 + in doubt 4"


def routed(i, t_ms, route):
    return dataclasses.replace(send(i, t_ms), route=route)


def test_an_event_first_received_on_a_route_it_was_not_sent_to_is_misrouted_never_received_and_the_ledger_balances():
    """Sends that name their route (a pair, a binding) and receives that name where they arrived, in every order:
    a receive on another route decides its event as misrouted (counted at the receive, with its exemplar), whatever
    came before it (a declared drop is withdrawn, an error at the sender is not a second bucket); a receive without
    a route, or of a send without one, is never misrouted; a later receive of a misrouted event is a duplicate."""
    batches = [
        [routed(10, 0, 1), routed(11, 1, 1), routed(12, 2, 1), routed(13, 3, 0), routed(15, 5, 2), send(16, 6),
         recv(10, 20, 2), recv(11, 21, 1), ack(13, 13, 503), recv(14, 24, 1), recv(15, 25), recv(16, 26, 3)],
        [routed(14, 4, 0), recv(13, 30, 1), recv(10, 40, 1), beat(10_700)],   # e14's send after its receive
        [beat(13_000)],                                                         # e12 is declared dropped
        [recv(12, 13_100, 0), beat(30_000)],                                     # e12 arrives late, elsewhere
    ]
    state, totals, exemplars = engine.EngineState(), {}, []
    for records in batches:
        state, result = engine.process(state, table(records), CFG)
        for name, value in result.counts.groupby("name")["value"].sum().items():
            totals[name] = totals.get(name, 0) + int(value)
        exemplars.append(result.events)
    led = o.ledger(totals)
    # misrouted: e10 (route 1, arrived on 2), e12 (dropped, then arrived on 0), e13 (failed, then on 1), e14 (its
    # receive on 1 before its send to 0); received: e11 (its own route), e15 (a receive naming no route), e16 (a send
    # naming none)
    assert led == {"received": 3, "late": 0, "dropped": 0, "failed": 0, "in_doubt": 0, "misrouted": 4, "unaccounted": 0,
                   "pending": 0}, (led, totals)
    assert sum(led.values()) == totals["sent"] == 7 and totals["duplicates"] == 1 and totals["errors"] == 1
    assert o.ledger_text(totals) == "sent 7 = received 3 + misrouted 4"
    ev = pd.concat([e for e in exemplars if e is not None and len(e)], ignore_index=True)
    mis = ev[ev["kind"] == "misrouted_id"].sort_values("at_ns")
    assert list(zip(mis["event_id"], mis["value"].astype(int))) == [("e10", 2), ("e14", 1), ("e13", 1), ("e12", 0)]
    # the exemplar of e12's drop, named when it was declared, is withdrawn
    dropped = ev[ev["kind"] == "dropped_id"].groupby("event_id")["count"].sum()
    assert dropped.get("e12", 0) == 0
