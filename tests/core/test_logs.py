"""Repeated warnings and errors are shown at most once a minute, with a count (``core.logs.Repeats``)."""
from __future__ import annotations

import logging
import os

from support import ROOT

from core.logs import Progress, Repeats


def _shown(events: list[tuple[float, int, str]]) -> list[str]:
    """The messages a ``Repeats`` filter lets through, for (time s, level, message) events."""
    now = [0.0]
    f = Repeats(window_s=60, clock=lambda: now[0])
    out = []
    for t, level, msg in events:
        now[0] = t
        rec = logging.LogRecord("agent", level, __file__, 1, "%s", (msg,), None)
        if f.filter(rec):
            out.append(rec.getMessage())
    return out


def test_a_repeated_error_is_shown_once_a_minute_with_the_count_held_back():
    # 50 a second for 2 minutes (kafka-python's "topic not found" at idle): 3 lines, not 6,000
    burst = [(i / 50, logging.ERROR, "Topic t.slice-1764079260-60 not found in cluster metadata") for i in range(6000)]
    shown = _shown(burst)
    assert shown[0] == "Topic t.slice-1764079260-60 not found in cluster metadata"
    assert len(shown) == 2
    assert shown[1].endswith("(and 2,999 more like it in the last 60 s)")


def test_numbers_aside_one_text_and_other_texts_levels_and_info_pass():
    events = [
        (0, logging.WARNING, "shipper a: broker not acknowledging; 1,024 bytes spooled"),
        (10, logging.WARNING, "shipper a: broker not acknowledging; 9,999,424 bytes spooled"),  # same text: held back
        (11, logging.WARNING, "receiver: topic came back under a new ID"),                     # another text: shown
        (12, logging.ERROR, "shipper a: broker not acknowledging; 5 bytes spooled"),           # another level: shown
        (13, logging.INFO, "receiver: 10 received"),                                            # INFO: never held
        (14, logging.INFO, "receiver: 10 received"),
        (61, logging.WARNING, "shipper a: broker not acknowledging; 7 bytes spooled"),         # a minute on: shown
    ]
    shown = _shown(events)
    assert shown == [events[0][2], events[2][2], events[3][2], events[4][2], events[5][2],
                     events[6][2] + " (and 1 more like it in the last 61 s)"]


def test_the_filter_forgets_old_texts_past_its_bound():
    now = [0.0]
    f = Repeats(window_s=60, clock=lambda: now[0])
    for i in range(3 * Repeats.MAX_TEXTS):
        now[0] = i * 0.1
        f.filter(logging.LogRecord("a", logging.ERROR, __file__, 1, "text %s", ("x" * (i % 7) + chr(65 + i % 26) * (i // 26),), None))
    assert len(f._seen) <= Repeats.MAX_TEXTS


def test_a_progress_line_comes_when_the_work_changed_and_every_10_minutes_at_idle():
    """An idle receiver spools its own clock record every 30 s: the line shows the spool's count, but only the work
    (receives, losses) makes it say the line again; at idle it says it once every 600 s."""
    said, now = [], [0.0]
    say = Progress(lambda line: said.append((now[0], line)), clock=lambda: now[0])
    for t in range(0, 1300, 10):  # asked every 10 s for 21 minutes; a clock record every 30 s, receives at 100-120 s
        now[0] = float(t)
        received = 0 if t < 100 else min(t - 90, 30) * 100
        say((received, 0), f"{received} received; spooled {t // 30 + received}")
    assert said == [(0.0, "0 received; spooled 0"), (100.0, "1000 received; spooled 1003"),
                    (110.0, "2000 received; spooled 2003"), (120.0, "3000 received; spooled 3004"),
                    (720.0, "3000 received; spooled 3024")]
    assert not say((3000, 0), "3000 received; spooled 3050") and say((3000, 1), "3000 received; 1 lost")  # a loss


def test_librdkafkas_lines_go_through_the_filter_before_and_after_the_process_sets_up_its_log():
    """A command line's librdkafka lines (no ``setup``): to standard error, each text once; once the process sets up its
    log, to its handler on standard output, once (the stand-alone handler gone, nothing twice)."""
    import subprocess
    import sys

    code = ("from core import logs\n"
            "lg = logs.librdkafka_logger()\n"
            "for n in range(30): lg.error('FAIL [rdkafka#producer-1]: Connect to 127.0.0.1:%d failed', 9000 + n)\n"
            "lg.info('purging unserved events')\n"
            "logs.setup('agent')\n"
            "assert logs.librdkafka_logger() is lg\n"
            "for n in range(30): lg.error('FAIL [rdkafka#consumer-2]: Connect to 127.0.0.1:%d failed', 9000 + n)\n")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": ROOT})
    assert p.returncode == 0, p.stderr
    err, out = p.stderr.splitlines(), p.stdout.splitlines()
    assert len(err) == 1 and " ERROR librdkafka: FAIL [rdkafka#producer-1]: Connect to 127.0.0.1:9000 failed" in err[0], err
    assert len(out) == 1 and " ERROR librdkafka: FAIL [rdkafka#consumer-2]: Connect to 127.0.0.1:9000 failed" in out[0], out
