"""Open-loop pacing: intended send times are pure arithmetic from the run start."""
import pytest

from core.pacer import NS_PER_S, Schedule, Step

S = NS_PER_S


@pytest.mark.parametrize("pace,k,expected_ns", [
    # constant 1,000/s: send k at k ms
    ("1000:10", 0, 0),
    ("1000:10", 1, 1_000_000),
    ("1000:10", 9999, 9_999_000_000),
    ("1000:10", 10000, None),  # past the end
    # 3/s does not divide 1 s: k/3 s, rounded down to the ns
    ("3:2", 1, 333_333_333),
    ("3:2", 5, 1_666_666_666),
    # steps: 1,000/s for 1 s then 2,000/s for 1 s
    ("1000:1,2000:1", 999, 999_000_000),
    ("1000:1,2000:1", 1000, S),
    ("1000:1,2000:1", 1001, S + 500_000),
    ("1000:1,2000:1", 2999, S + 999_500_000),
    ("1000:1,2000:1", 3000, None),
    # linear ramp 0 -> 2,000/s over 1 s: hits(t) = 1000 t^2, so send k at sqrt(k/1000) s
    ("0.000001-2000:1", 250, 500_000_000),
    ("0.000001-2000:1", 1000, None),
    # milliseconds and minutes in step durations
    ("500:1500ms", 600, 1_200_000_000),
    ("1:1m", 59, 59 * S),
])
def test_intended_time_of_send_k(pace, k, expected_ns):
    got = Schedule.parse(pace).intended_ns(k)
    if expected_ns is None:
        assert got is None
    else:
        assert abs(got - expected_ns) <= 1_000  # within 1 µs (ramps use float sqrt)


@pytest.mark.parametrize("pace,total", [
    ("1000:10", 10_000),
    ("1000:60,1200:60", 132_000),
    ("100-1000:30", 16_500),  # (100 + 1000) / 2 * 30
    ("3:2", 6),
])
def test_total_hits(pace, total):
    assert Schedule.parse(pace).total_hits == total


def test_every_send_is_scheduled_in_order_and_per_second_counts_follow_the_rate():
    sched = Schedule.parse("1000:2,3000:2,1000-3000:2")
    times = [sched.intended_ns(k) for k in range(sched.total_hits)]
    assert times == sorted(times) and times[-1] < sched.duration_ns
    per_second = [sum(1 for t in times if s * S <= t < (s + 1) * S) for s in range(6)]
    assert per_second[:4] == [1000, 1000, 3000, 3000]
    assert per_second[4] == pytest.approx(1500, abs=2) and per_second[5] == pytest.approx(2500, abs=2)


def test_default_duration_and_describe():
    sched = Schedule.parse("5000", default_duration_ns=60 * S)
    assert sched.total_hits == 300_000 and sched.describe() == "5000:60"
    assert sched.step_at(30 * S) == 0 and sched.rate_at(30 * S) == 5000


@pytest.mark.parametrize("pace,words", [
    ("abc", "bad pace step"),
    ("-5:10", "bad pace step"),
    ("0:10", "out of range"),
    ("1000:0", "duration > 0"),
    ("1000", "needs a duration"),
    ("1000:10,", "bad pace step"),
    ("99999999999:1", "out of range"),
])
def test_bad_pace_is_refused_with_a_reason(pace, words):
    with pytest.raises(ValueError, match=words):
        Schedule.parse(pace)


def test_step_is_pure():
    step = Step(1000, S)
    assert step.hits(S // 2) == 500 and step.time_of_hit_ns(500) == S // 2


def test_shards_split_the_rate_and_together_send_the_whole():
    full = Schedule.parse("1000:10,1500-3000:20")
    half = full.share(2)
    assert half.describe() == "500:10,750-1500:20" and half.duration_ns == full.duration_ns
    assert abs(2 * half.total_hits - full.total_hits) <= 2  # each shard rounds its own steps up
    assert full.share(1) is full


@pytest.mark.parametrize("pace", ["1000:3", "3:2", "100-1000:2,1000:1", "333.3:2,7:1", "2000-500:1"])
@pytest.mark.parametrize("first,stride", [(0, 1), (1, 2), (2, 3)])
def test_a_workers_offsets_are_intended_ns_of_its_sends(pace, first, stride):
    """The worker's incremental walk (``offsets``) gives exactly ``intended_ns`` of sends first, first+stride, ..."""
    s = Schedule.parse(pace)
    expected, k = [], first
    while (t := s.intended_ns(k)) is not None:
        expected.append((k, t))
        k += stride
    assert list(s.offsets(first, stride)) == expected and expected


def test_due_sends_go_out_by_turn_and_none_after_the_schedule():
    """A worker's turn takes what is due (200 µs ahead at most), at most ``limit``; nothing once the schedule and
    its last turn are over."""
    from loadgen.attack import FIRE_AHEAD_NS, TURN_NS, Due

    due = Due(Schedule.parse("1000:1"), 0, 0, 1)
    assert due.take(5_000_000, 1000) == [(k, k * 1_000_000) for k in range(6)]  # 0..5 ms: six sends
    assert due.take(5_000_000, 1000) == []
    assert due.wait_s(5_000_000) == TURN_NS / S  # the next is due in 1 ms: wait a whole turn
    assert [k for k, _ in due.take(6_000_000 - FIRE_AHEAD_NS, 1000)] == [6]
    assert len(due.take(900_000_000, 3)) == 3  # capped: the rest wait for the next turn
    assert due.take(S + TURN_NS - 1, 10_000)[-1][0] == 999 and due.next_ns is None  # the last turn still sends
    late = Due(Schedule.parse("1000:1"), 0, 0, 1)
    assert late.take(S + TURN_NS, 10_000) == [] and late.next_ns is None  # behind by more than a turn at the end


def test_the_published_steps_are_the_schedules_in_absolute_ns_and_the_reader_takes_them():
    """The load generator publishes its steps (``steps_from``) in ``run_start``; ``runinfo.pace_steps`` returns
    them as they are, and reads the pace text only for a run recorded before (the same steps either way)."""
    import json

    import pandas as pd

    from runs import runinfo

    t0 = 1_800_000_000 * S
    steps = Schedule.parse("200:15,350-500:15").steps_from(t0)
    assert steps == [{"rate": 200.0, "end_rate": 200.0, "start_ns": t0, "end_ns": t0 + 15 * S},
                     {"rate": 350.0, "end_rate": 500.0, "start_ns": t0 + 15 * S, "end_ns": t0 + 30 * S}]

    def events(config: dict) -> pd.DataFrame:
        return pd.DataFrame([{"kind": "run_start", "at_ns": t0 - S, "config": json.dumps({"pace": "1:1"})},
                             {"kind": "run_start", "at_ns": t0, "config": json.dumps(config)}])

    # published steps win over the pace text (a shard's rounded text cannot disagree with them)
    assert runinfo.pace_steps(events({"pace": "999:1", "schedule_start_ns": t0, "steps": steps})) == steps
    assert runinfo.pace_steps(events({"pace": "200:15,350-500:15", "schedule_start_ns": t0})) == steps
    assert runinfo.pace_steps(events({"steps": [{"rate": "x"}]})) == []


def test_a_step_of_rate_zero_is_silence_and_a_pace_of_only_silence_is_refused():
    s = Schedule.parse("5:2,10:1,0:1,5:1")
    offsets = list(s.offsets(0, 1))
    assert s.total_hits == 25 and len(offsets) == 25
    assert [t for _, t in offsets[18:22]] == [2_800_000_000, 2_900_000_000, 4_000_000_000, 4_200_000_000]
    assert not [t for _, t in offsets if 3_000_000_000 <= t < 4_000_000_000]  # nothing in the silent second
    assert s.describe() == "5:2,10:1,0:1,5:1" and s.rate_at(3_500_000_000) == 0
    for text in ("0:10", "0:5,0:5"):
        with pytest.raises(ValueError, match="sends nothing"):
            Schedule.parse(text)
