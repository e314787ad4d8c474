"""``bench.transports``' measuring, on lines and processes whose figures are known here: each tool's line a second
(as the real tools printed it), and the CPU and events between the lines kept."""
import sys

import pytest

from bench import transports
from stack import artemis, kafka, rabbitmq
from stack.peer import GENERATOR_LINE, measure

LINES = {"flightwatch": GENERATOR_LINE, "perftest": rabbitmq.LINE, "artemis": artemis.LINE, "kafka": kafka.LINE}
"""Each tool's line a second (its ``Peer.line``), by the tool."""

REAL_LINES = [  # copied from each tool's output on this machine
    ("flightwatch", "  46s  sent   2,001/s  completed   1,998/s  errors     0  in flight      9  send-delay p99   2.469ms", 2001),
    ("perftest", "id: test-221525-128, time 2.001 s, sent: 1001 msg/s, confirmed: 1001 msg/s, nacked: 0 msg/s, "
                 "min/median/75th/95th/99th confirm latency: 88/286/353/876/3244 µs", 1001),
    ("artemis", "--- sent:           999 msg/sec ", 999),
    ("kafka", "1006 records sent, 1005.0 records/sec (1.96 MB/sec), 5.2 ms avg latency, 17.0 ms max latency.", 1006),
]


@pytest.mark.parametrize("kind, line, sent", REAL_LINES, ids=[k for k, _, _ in REAL_LINES])
def test_each_tools_line_a_second_gives_what_it_sent(kind, line, sent):
    m = LINES[kind].search(line)
    assert m and int(m.group(1).replace(",", "")) == sent
    others = [k for k in LINES if k != kind]
    assert not any(LINES[k].search(line) for k in others)  # no tool's line is taken for another's


def test_kafkas_final_summary_is_not_a_second():
    assert not LINES["kafka"].search("6000 records sent, 991.571641 records/sec (1.94 MB/sec), 139.03 ms avg latency, "
                                     "955.00 ms max latency, 7 ms 50th, 588 ms 95th")


BUSY = """
import time
for i in range(10):
    t = time.process_time()
    while time.process_time() - t < 0.05:   # 50 ms of CPU a line
        pass
    print(f"  {i}s  sent   1,000/s  completed   1,000/s", flush=True)
    time.sleep(0.05)
"""


def test_cpu_per_event_is_the_cpu_between_the_lines_kept_over_the_events_they_say():
    """Ten lines, 50 ms of CPU and 1,000 events each: three left out at the start, one at the end; between the first
    and the last kept, 5 lines' CPU over their 5,000 events = 50 µs an event."""
    got = measure([sys.executable, "-c", BUSY], GENERATOR_LINE, 10)
    assert got["lines"] == 6 and got["events_per_s"] == 1000
    assert got["us_per_event"] == pytest.approx(50, rel=0.25)


def test_a_tool_that_prints_too_few_lines_is_an_error_with_its_last_words():
    got = measure([sys.executable, "-c", "print('cannot connect: refused')"], rabbitmq.LINE, 5)
    assert "error" in got and "cannot connect: refused" in got["error"]


@pytest.mark.parametrize("args, words", [(["--only", "mqtt"], "unknown transport mqtt"),
                                         (["--rates", "fast"], "--rates 'fast'"),
                                         (["--seconds", "2"], "--seconds at least")])
def test_bad_flags_are_one_line_and_exit_2(args, words, capsys):
    with pytest.raises(SystemExit) as e:
        transports.main(args)
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and words in err[0], err
