"""The day of testing's checks (``bench.workday_checks``) on samples made up here, with their figures known."""
import pytest

from bench.workday import Step
from bench.workday_checks import IDLE_CORES, _repeat, idle_cores, judge

MIB = 2**20


def sample(t, procs, logs=None, slices=0):
    """``procs``: pid -> (name, cpu seconds, RSS MiB, the SUT's)."""
    return {"t": t, "procs": {pid: {"name": n, "cpu_s": c, "rss": r * MIB, "sut": sut} for pid, (n, c, r, sut) in procs.items()},
            "logs": logs or {}, "slices_deleted": slices}


def test_idle_cores_sums_flightwatchs_processes_and_counts_one_that_went_away_inside_the_span():
    samples = [sample(0, {1: ("receiver", 10.0, 80, False), 2: ("sut", 0.0, 50, True)}),
               sample(10, {1: ("receiver", 10.5, 80, False), 2: ("sut", 9.0, 50, True), 3: ("job", 100.0, 300, False)}),
               sample(20, {1: ("receiver", 11.0, 80, False), 2: ("sut", 18.0, 50, True), 3: ("job", 101.0, 300, False)}),
               sample(30, {1: ("receiver", 11.5, 80, False), 2: ("sut", 27.0, 50, True)})]
    total, by = idle_cores(samples)
    # the receiver 1.5 s over 30 s; the job 1 s (between its two samples) over 30 s; the SUT not flightwatch's
    assert by == pytest.approx({"receiver": 1.5 / 30, "job": 1.0 / 30}) and total == pytest.approx(2.5 / 30)


def day(rss_last: float, cpu_per_s: float, log_bytes_per_s: float):
    """Two idle stretches of 300 s (judged from their second minute), sampled every 10 s."""
    steps = [Step("idle", "idle-1", started_s=0, ended_s=300), Step("idle", "idle-2", started_s=400, ended_s=700)]
    samples = []
    for t in list(range(0, 301, 10)) + list(range(400, 701, 10)):
        rss = 100 if t <= 300 else rss_last
        samples.append(sample(t, {7: ("http-receiver", cpu_per_s * t, rss, False), 8: ("sut-broker", 5.0 * t, 500 + t, True)},
                              {"/x/receiver.log": int(log_bytes_per_s * t)}, slices=t // 100))
    return judge(steps, samples)


def test_a_quiet_flat_day_passes_with_its_figures():
    bad, fig = day(rss_last=104, cpu_per_s=0.05, log_bytes_per_s=10)
    assert bad == []
    assert [round(r["cores"], 6) for r in fig["idle"]] == [0.05, 0.05]
    assert [(r["name"], round(r["change"], 3)) for r in fig["memory"]] == [("http-receiver", 0.04)]  # the SUT's not judged
    assert [round(r["bytes_per_hour"]) for r in fig["logs"]] == [36_000] and fig["slices_deleted"] == 7


def test_a_spinning_growing_chatty_process_fails_idle_memory_and_logs():
    bad, _ = day(rss_last=120, cpu_per_s=IDLE_CORES + 0.01, log_bytes_per_s=400)
    assert sorted({check for check, _ in bad}) == ["idle", "logs", "memory"]
    assert [what for check, what in bad if check == "memory"] == ["http-receiver (7): RSS 100 -> 120 MiB (+20%)"]


@pytest.mark.parametrize("median_us, judged", [(500, "within noise"), (1000, "within noise"), (3000, "regression")])
def test_a_repeat_is_a_regression_only_beyond_a_millisecond_as_well_as_5_percent(tmp_path, median_us, judged):
    """Synthetic runs (``bench.compare.build_run``) at HTTP's flight times: a repeat at the first's median (0.5 ms)
    or twice it (+0.5 ms, +100%: a busy machine's, as CI saw) is within noise; at six times it (+2.5 ms), a
    regression of p50, p90 and p99."""
    from bench.compare import build_run, spec_for

    for run_id, median in (("first", 500), ("repeat", median_us)):
        spec = spec_for(run_id, 7 if run_id == "first" else 8, 30, 300)
        spec.latency_median_us, spec.drop_fraction = float(median), 0.0
        build_run(str(tmp_path / run_id), spec)
    bad: list = []
    row = {"run": "repeat"}
    _repeat(Step("run", "http-2000", run_id="repeat"), {"run": "first"}, row, bad, str(tmp_path))
    assert row["compared"].startswith(judged), row["compared"]
    assert [check for check, _ in bad] == ([] if judged == "within noise" else ["repeat"])
