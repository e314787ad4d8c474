"""Each rule of ``streaming.rules`` on its own, table by table: the rules before it run as ``engine.process`` runs
them, the rule under test runs, and what it counted and decided is compared with the table's row."""
import dataclasses
import json

import pandas as pd
import pytest

from core import contract as c
from core import output as o
from streaming import engine, rules
from streaming.decode import decode_messages
from streaming.rules import DROPPED, ERRORED, LATE, PENDING, RECEIVED, UNACCOUNTED, UNKNOWN

S = 1_800_000_000 * 10**9
MS = 10**6
CFG = engine.EngineConfig(run_id="r", drop_timeout_ns=10_000 * MS, watermark_delay_ns=1_000 * MS, retention_ns=10_000 * MS,
                          silence_timeout_ns=20_000 * MS)
ORDER = [rules.advance_watermark, rules.judge, rules.take_sends, rules.take_acks, rules.take_receives, rules.expire_orphans,
         rules.mark_reset, rules.declare_drops, rules.name_drops, rules.forget, rules.run_span]


def send(i, t_ms, intended_ms=None, agent="s"):
    return c.Send("r", agent, S + t_ms * MS, event_id=f"e{i}", intended_at_ns=S + (t_ms if intended_ms is None else intended_ms) * MS)


def recv(i, t_ms):
    return c.Receive("r", "rx", S + t_ms * MS, event_id=f"e{i}")


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


def before(rule, history, records) -> rules.Work:
    """The working set of one batch after the rules before ``rule``, as ``engine.process`` applies them."""
    _, w = rules.start(given(history), table(records), CFG)
    for r in ORDER[:ORDER.index(rule)]:
        r(w)
    return w


def until(rule, history, records) -> rules.Work:
    """The working set after the rules before ``rule`` and ``rule`` itself."""
    w = before(rule, history, records)
    rule(w)
    return w


def ran(rule, history, records):
    """What ``rule`` returns, applied after the rules before it."""
    return rule(before(rule, history, records))


def counts(w: rules.Work) -> dict:
    df = w.out.counts_frame()
    df = df[~df["name"].pipe(o.merges_by_max)]
    return {n: int(v) for n, v in df.groupby("name")["value"].sum().items() if v}


def statuses(w: rules.Work) -> dict:
    return dict(zip(w.known["id"], w.status.tolist()))


def test_split_keeps_this_runs_and_the_shared_records_and_counts_the_rest():
    records = [send(1, 0), c.Send("other", "s", S, event_id="x", intended_at_ns=S),
               c.NodeSample(c.ANY_RUN, "n", S, node="n1", metric="cpu", value=0.5),
               c.Send(c.ANY_RUN, "s", S, event_id="y", intended_at_ns=S)]  # a send is no shared kind
    bad, good, shared, info = rules.split(table(records), "r")
    assert (bad.num_rows, good.num_rows, shared.num_rows, info["num_other_run"]) == (0, 1, 1, 2)


@pytest.mark.parametrize("history, records, max_event_ms, watermark_ms", [
    ([], [send(1, 0), send(2, 3_000)], 3_000, 2_000),
    ([[send(1, 5_000)]], [send(2, 3_000)], 5_000, 4_000),   # never back
    ([[send(1, 5_000)]], [], 5_000, 4_000),
])
def test_advance_watermark(history, records, max_event_ms, watermark_ms):
    w = until(rules.advance_watermark, history, records)
    assert (w.max_event_ns - S, w.watermark_ns - S) == (max_event_ms * MS, watermark_ms * MS)


@pytest.mark.parametrize("records, judged_ms", [
    ([send(1, 100), recv(1, 300)], 100),                                  # the slower agent holds judgement back
    ([send(1, 100), beat(900), recv(1, 300)], 300),                       # a heartbeat moves its agent on
    ([send(1, 100), recv(1, 300), stop(200)], 300),                       # a stopped agent writes nothing more
])
def test_judge(records, judged_ms):
    w = until(rules.judge, [[start(0)]], records)
    assert w.judged_ns - S == judged_ms * MS


@pytest.mark.parametrize("history, records, expected, status", [
    ([], [send(1, 0)], {"sent": 1}, {"e1": PENDING}),
    ([], [send(1, 0), send(1, 0)], {"sent": 1, "repeated_send_records": 1}, {"e1": PENDING}),
    ([[send(1, 0)]], [send(1, 0)], {"repeated_send_records": 1}, {"e1": PENDING}),
    ([], [send(1, 10, intended_ms=20)], {"sent": 1, "negative_send_delay": 1}, {"e1": PENDING}),
    (dataclasses.replace(engine.EngineState(), hole_until_ns=S + 5 * MS), [send(1, 0), send(2, 10)], {"sent": 2},
     {"e1": UNKNOWN, "e2": PENDING}),  # sent inside a telemetry hole: its receive record may be gone
])
def test_take_sends(history, records, expected, status):
    w = until(rules.take_sends, history, records)
    assert (counts(w), statuses(w)) == (expected, status)


@pytest.mark.parametrize("history, records, expected, status, errored", [
    ([[send(1, 0)]], [ack(1, 0)], {"acked": 1}, PENDING, False),
    ([[send(1, 0)]], [ack(1, 0, 503)], {"errors": 1, "errors:http_503": 1}, PENDING, True),
    ([[send(1, 0)]], [ack(1, 0, None, "timeout")], {"errors": 1, "errors:timeout": 1}, PENDING, True),
    ([[send(1, 0)], [beat(12_000)]], [ack(1, 0, 500)], {"errors": 1, "errors:http_500": 1, "dropped": -1}, ERRORED, True),
])
def test_take_acks(history, records, expected, status, errored):
    w = until(rules.take_acks, history, records)
    assert (counts(w), statuses(w)["e1"], bool(w.errored[0])) == (expected, status, errored)


@pytest.mark.parametrize("history, records, expected, status, orphans", [
    ([[send(1, 0)]], [recv(1, 5)], {"received": 1}, RECEIVED, 0),
    ([[send(1, 0)]], [recv(1, 5), recv(1, 6)], {"received": 1, "duplicates": 1}, RECEIVED, 0),
    ([[send(1, 0)]], [recv(1, 5), recv(1, 5)], {"received": 1, "repeated_receive_records": 1}, RECEIVED, 0),
    ([[send(1, 0), recv(1, 5)]], [recv(1, 5)], {"repeated_receive_records": 1}, RECEIVED, 0),
    ([[send(1, 0)]], [recv(1, 10_500)], {"dropped": 1, "late": 1}, LATE, 0),
    ([[send(1, 0)], [beat(12_000)]], [recv(1, 9_000)], {"received": 1, "dropped": -1}, RECEIVED, 0),
    ([[send(1, 0)]], [recv(2, 5)], {}, PENDING, 1),                         # its send has not come (yet)
    ([[recv(1, 5)]], [send(1, 0)], {"sent": 1, "received": 1}, RECEIVED, 0),  # an orphan meets its send
    ([[send(1, 0)], [ack(1, 0, 503)]], [recv(1, 10_500)], {"late": 1}, LATE, 0),  # failed: late, not a drop
])
def test_take_receives(history, records, expected, status, orphans):
    w = until(rules.take_receives, history, records)
    assert (counts(w), statuses(w)["e1"], len(w.orphans)) == (expected, status, orphans)


@pytest.mark.parametrize("history, records, expected, left", [
    ([[recv(1, 0)]], [beat(20_000)], {}, 1),                               # deadline + retention not passed
    ([[recv(1, 0)]], [beat(21_500)], {"orphan_receives": 1}, 0),
])
def test_expire_orphans(history, records, expected, left):
    w = until(rules.expire_orphans, history, records)
    assert (counts(w), len(w.orphans)) == (expected, left)


def test_mark_reset_leaves_the_waiting_sends_unknown_and_flags_the_windows_to_the_hole():
    reset = c.TelemetryReset(c.ANY_RUN, "job", S, where="t", reason="the topic was recreated", count=7)
    history = [[send(1, 0), send(2, 500), recv(2, 600), beat(3_200)]]
    w = until(rules.mark_reset, history, [reset, send(3, 4_500)])
    # the watermark stood at 2.2 s and e1 waited since 0: windows 0 .. the hole's next (the hole at 4.5 s) are flagged
    assert counts(w) == {"sent": 1, "telemetry_incomplete": 6}
    assert statuses(w) == {"e1": UNKNOWN, "e2": RECEIVED, "e3": UNKNOWN}
    assert w.reset_event["count"] == 7 and w.info["reset"]["waiting"] == 1
    assert ran(rules.mark_reset, [], [reset, send(1, 0)]) == rules.NO_TIME_NS  # a reset before the run touches nothing


@pytest.mark.parametrize("history, records, expected, status", [
    ([[send(1, 0)]], [beat(10_500)], {}, PENDING),                          # the watermark (9.5 s) before the deadline
    ([[send(1, 0)]], [beat(11_500)], {"dropped": 1}, DROPPED),
    ([[send(1, 0)], [ack(1, 0, 503)]], [beat(11_500)], {}, ERRORED),        # failed at the sender: no drop
    (dataclasses.replace(engine.EngineState(), hole_until_ns=S + MS), [send(1, 0), beat(11_500)],
     {"sent": 1, "unaccounted": 1}, UNACCOUNTED),  # sent in a telemetry hole: not a drop
])
def test_declare_drops(history, records, expected, status):
    w = until(rules.declare_drops, history, records)
    assert (counts(w), statuses(w)["e1"]) == (expected, status)


@pytest.mark.parametrize("records, named", [
    ([beat(11_500)], []),                                   # the receiver has not written past the deadline
    ([beat(11_500), beat(11_500, "rx")], ["e1"]),           # now no agent can withdraw the drop
])
def test_name_drops(records, named):
    w = until(rules.name_drops, [[start(0), send(1, 0), recv(9, 0)]], records)
    named_ns = ran(rules.name_drops, [[start(0), send(1, 0), recv(9, 0)]], records)
    ids = [e for ex in w.exemplars if len(ex) for e in ex.loc[ex["kind"] == "dropped_id", "event_id"]]
    assert ids == named and (named_ns > S) == bool(named)


@pytest.mark.parametrize("records, kept", [
    ([beat(15_000)], ["e1", "e2"]),
    ([beat(21_500)], ["e2"]),        # e1 decided and past deadline + retention; e2 still pending
])
def test_forget(records, kept):
    w = until(rules.forget, [[send(1, 0), recv(1, 5), send(2, 11_000)]], records)
    assert list(w.known["id"]) == kept


@pytest.mark.parametrize("history, records, span", [
    ([], [start(0), send(1, 5), stop(900)], (0, 900, 1, None)),
    ([], [start(0, shards=2), stop(900)], (0, 900, 2, None)),
    ([[start(0, shards=2), stop(900)]], [start(10, agent="s2"), stop(950, agent="s2")], (0, 950, 2, None)),
    ([[start(0), send(1, 100)]], [beat(21_200)], (0, 100, 1, "aborted")),  # silent for 20 s: closed at its last record
    ([[start(0), send(1, 100)]], [beat(20_900)], (0, None, 1, None)),
])
def test_run_span(history, records, span):
    r = ran(rules.run_span, history, records)
    assert (r["start_ns"] - S, None if r["stop_ns"] is None else r["stop_ns"] - S, r["shards"],
            (r["aborted"] or "")[:7] or None) == (span[0] * MS, None if span[1] is None else span[1] * MS, span[2], span[3])


@pytest.mark.parametrize("records, gaps", [
    ([send(i, i * 10) for i in range(100)] + [recv(i, i * 10 + 1) for i in range(100)] + [beat(2_000), stop(2_000)], []),
    # at 100/s a silence over 200 ms (20 inter-arrivals) with events in flight is a gap: from receive to receive
    ([send(i, i * 10) for i in range(200)] + [recv(i, i * 10 + 1) for i in range(200) if not 100 <= i < 150]
     + [recv(i, 1_700) for i in range(100, 150)] + [beat(2_100), stop(2_100)], [(991, 1_501)]),  # the receives after the held ones resume at 1.501 s
])
def test_declare_gaps(records, gaps):
    w = until(rules.run_span, [[start(0)]], records)
    rules.declare_gaps(w, S + 2_100 * MS)
    assert [((a - S) // MS, ((a - S) + d) // MS) for a, d, _ in w.declared] == gaps
    assert counts(w).get(o.SILENCE_NS, 0) == sum(d for _, d, _ in w.declared)


def test_gather_events_keeps_machine_records_within_the_runs_span():
    node = [c.NodeSample(c.ANY_RUN, "n", S + t * MS, node="n1", metric="cpu", value=0.5) for t in (-5_000, 500, 40_000)]
    w = until(rules.run_span, [], [start(0), send(1, 10), stop(1_000), *node])
    events = rules.gather_events(w, S, S + 1_000 * MS)
    assert sorted(events["kind"]) == ["node", "run_start", "run_stop"]
    assert (events["window_ns"] == (events["at_ns"] // 10**9) * 10**9).all()
    assert pd.api.types.is_integer_dtype(events["window_ns"])
