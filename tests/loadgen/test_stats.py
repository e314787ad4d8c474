"""The load generator's per-second statistics: seconds close once every worker is past them, and
nothing is kept of a closed second but its row (bounded memory over a long attack)."""
from __future__ import annotations

import numpy as np

from loadgen.stats import FINAL_S, Interval, RunStats


def snap(second: int, latencies_us: list[int], errors: int = 0) -> dict:
    iv = Interval(second)
    for i, us in enumerate(latencies_us):
        iv.add_send(1_000 * i, 100)
        iv.add_completion(us * 1_000, 202 if i >= errors else 503, None, i >= errors)
    return iv.snapshot()


def test_a_second_closes_when_every_worker_has_shipped_past_it():
    closed = []
    stats = RunStats(workers=2, on_close=closed.append)
    stats.merge(snap(0, [100, 200]))
    stats.merge(snap(1, [300]))
    stats.merge(snap(3, [400]))  # worker 0; nobody sends in second 2
    stats.merge(snap(0, [150]))  # worker 1
    assert stats.shipped(0, 4) == [] and len(stats.open) == 3  # worker 1 has not shipped anything yet
    assert [iv.second for iv in stats.shipped(1, 1)] == [0]
    assert [iv.second for iv in stats.shipped(1, 4)] == [1, 2, 3]  # the quiet second 2 closes empty
    assert stats.open == {}
    assert [iv.second for iv in closed] == [0, 1, 2, 3]
    assert [(r["second"], r["sent"], r["completed"]) for r in stats.rows] == [(0, 3, 3), (1, 1, 1), (2, 0, 0), (3, 1, 1)]
    t = stats.total()
    assert (t.sent, t.completed, t.ok) == (5, 5, 5)
    assert t.latency_min_us == 100 and t.latency_sum_us == 1_150


def test_final_ship_closes_what_there_is_and_nothing_beyond():
    stats = RunStats(workers=2)
    stats.merge(snap(0, [100]))
    stats.merge(snap(5, [100], errors=1))
    stats.shipped(0, FINAL_S)
    assert stats.rows == []  # worker 1 still going
    stats.merge(snap(6, [100]))
    assert [iv.second for iv in stats.shipped(1, FINAL_S)] == [0, 1, 2, 3, 4, 5, 6]
    assert stats.close_all() == []
    assert stats.total().errors == {"http 503": 1}
    late = snap(2, [900])  # a snapshot for a closed second (not expected) still counts in the total
    stats.merge(late)
    assert stats.total().completed == 4


def test_close_all_after_a_failed_worker():
    stats = RunStats(workers=2)
    stats.merge(snap(0, [100]))
    stats.merge(snap(1, [100]))
    stats.shipped(0, 2)  # worker 1 died without shipping
    assert [iv.second for iv in stats.close_all()] == [0, 1]


def test_memory_is_bounded_over_a_long_attack():
    """900 seconds of two workers: only the seconds not yet shipped by both stay open; the total's
    percentiles equal those over every latency."""
    rng = np.random.default_rng(7)
    stats = RunStats(workers=2)
    every = []
    for s in range(900):
        for w in range(2):
            lat = rng.lognormal(7, 1, 50).astype(int).tolist()
            every += lat
            stats.merge(snap(s, lat))
            stats.shipped(w, s)  # as a worker does: everything before the current second
        assert len(stats.open) <= 2
    assert len(stats.rows) == 899
    stats.close_all()
    t = stats.total()
    assert t.completed == len(every) == 90_000
    p50, p99 = t.latency_percentiles((50, 99))
    for got, want in ((p50, np.percentile(every, 50)), (p99, np.percentile(every, 99))):
        assert abs(got - want) <= 0.01 * want + 1


def test_an_answer_without_status_or_error_counts_as_add_completion_counts_it():
    """``add_ok`` (Kafka acks, confirms: the fast path) gives the snapshot ``add_completion`` gives, negative
    latencies (a clock step) at 0 as there."""
    fast, full = Interval(0), Interval(0)
    for ns in (5_000, 1_999, -40, 123_456_789, 7_000):
        fast.add_ok(ns)
        full.add_completion(ns, None, None, True)
    assert fast.snapshot() == full.snapshot()
    assert (fast.completed, fast.ok, fast.latency_min_us, fast.latency_sum_us) == (5, 5, 0, 5 + 1 + 0 + 123_456 + 7)
