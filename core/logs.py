"""Logging for flightwatch's long-running processes (agents, shipper, streaming job): stdlib ``logging`` to standard
output, one line per record with a UTC timestamp, the level and the process's name:

    2026-11-24T00:55:00.123Z INFO receiver-http: http://127.0.0.1:18080/ -> spool ...

``FLIGHTWATCH_LOG_LEVEL`` (DEBUG, INFO, WARNING, ERROR; default INFO) sets the level. A bad flag is not logged: it
stays one line on standard error and exit code 2 (``core.cli``).

A warning or error that repeats is shown at most once a minute (``Repeats``): a stack left up all day must not fill
its disk with one line 50 times a second. The next time it is shown it says how many times it came meanwhile."""
from __future__ import annotations

import logging
import re
import sys
import time

from core import settings

LEVEL_ENV = "FLIGHTWATCH_LOG_LEVEL"
INFO, WARNING, ERROR = logging.INFO, logging.WARNING, logging.ERROR
FORMAT = "%(asctime)s.%(msecs)03dZ %(levelname)s %(name)s: %(message)s"
DATE_FORMAT = "%Y-%m-%dT%H:%M:%S"


REPEAT_WINDOW_S = 60.0
"""A warning or error with the same text (numbers aside) is shown at most once in this long."""
_NUMBER = re.compile(r"\d[\d,.:]*")


class Repeats(logging.Filter):
    """Shows a warning or error once per ``window_s`` for each text (its numbers aside: "3 bytes" and "5 bytes" are
    one text); the others are counted, and the next one shown carries the count. INFO and below pass as they are.

        handler.addFilter(Repeats())
    """

    MAX_TEXTS = 1000

    def __init__(self, window_s: float = REPEAT_WINDOW_S, clock=time.monotonic) -> None:
        super().__init__()
        self.window_s, self.clock = window_s, clock
        self._seen: dict[tuple, list] = {}  # text -> [when last shown, times held back since]

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        text = record.getMessage()
        key = (record.name, record.levelno, _NUMBER.sub("#", text))
        now = self.clock()
        seen = self._seen.get(key)
        if seen is not None and now - seen[0] < self.window_s:
            seen[1] += 1
            return False
        if seen is not None and seen[1]:
            record.msg, record.args = f"{text} (and {seen[1]:,} more like it in the last {now - seen[0]:.0f} s)", ()
        if len(self._seen) >= self.MAX_TEXTS:
            self._seen = {k: v for k, v in self._seen.items() if now - v[0] < self.window_s}
        self._seen[key] = [now, 0]
        return True


IDLE_PROGRESS_S = 600
"""At idle (its figures unchanged) a long-lived agent's progress line comes this often: the log shows it alive."""


class Progress:
    """A long-lived agent's progress line: said when its ``figures`` changed since it was last said, and every
    ``idle_s`` when they did not. The figures are the agent's work (receives, failures), not the records it writes
    about itself: its clock records every 30 s would make an idle agent say the same line twice a minute.

        progress = Progress(log)
        progress((received, lost), f"{received:,} received, {spooled:,} spooled")
    """

    def __init__(self, log, idle_s: float = IDLE_PROGRESS_S, clock=time.monotonic) -> None:
        self.log, self.idle_s, self.clock = log, idle_s, clock
        self.figures: tuple | None = None
        self.said_at = -float("inf")

    def __call__(self, figures: tuple, line: str) -> bool:
        """Say ``line`` if ``figures`` changed or ``idle_s`` passed; whether it was said."""
        now = self.clock()
        if figures == self.figures and now - self.said_at < self.idle_s:
            return False
        self.log(line)
        self.figures, self.said_at = figures, now
        return True


LIBRDKAFKA = "librdkafka"
"""The logger of librdkafka's own lines (confluent-kafka's ``logger`` setting: ``librdkafka_logger``)."""


def _handler(stream) -> logging.Handler:
    handler = logging.StreamHandler(stream)
    formatter = logging.Formatter(FORMAT, DATE_FORMAT)
    formatter.converter = time.gmtime
    handler.setFormatter(formatter)
    handler.addFilter(Repeats())
    handler._flightwatch = True
    return handler


def _ours(logger: logging.Logger) -> list[logging.Handler]:
    return [h for h in logger.handlers if getattr(h, "_flightwatch", False)]


def setup(name: str) -> logging.Logger:
    """The process's logger, ``name`` (its agent name), writing to standard output (flushed per line)."""
    root = logging.getLogger()
    if not _ours(root):
        root.addHandler(_handler(sys.stdout))
        level = (settings.get(LEVEL_ENV) or "INFO").upper()
        root.setLevel(level if level in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL") else "INFO")
        for noisy in (LIBRDKAFKA, "py4j", "urllib3"):  # their INFO lines are per connection, not ours
            logging.getLogger(noisy).setLevel(max(root.level, logging.WARNING))
        rdkafka = logging.getLogger(LIBRDKAFKA)
        for h in _ours(rdkafka):  # librdkafka's lines given a handler of their own before: now the process's
            rdkafka.removeHandler(h)
        rdkafka.propagate = True
    return logging.getLogger(name)


def librdkafka_logger() -> logging.Logger:
    """The logger for a librdkafka client (confluent-kafka's ``logger`` setting), so that its own lines (``%3|…|FAIL|``
    three times a second while a broker is away) go through the repeat filter: in a process set up with ``setup``,
    to its handler; in one that is not (a command line's, whose standard output is its report), to standard error,
    a line each, WARNING and above. Without it librdkafka writes every line to standard error itself."""
    logger = logging.getLogger(LIBRDKAFKA)
    if not _ours(logging.getLogger()) and not _ours(logger):
        logger.addHandler(_handler(sys.stderr))
        logger.propagate = False
        if logger.level < logging.WARNING:
            logger.setLevel(logging.WARNING)
    return logger


def printer(logger: logging.Logger, level: int = logging.INFO):
    """A ``log(message, flush=...)`` callable, for code that takes ``log=print``, writing to ``logger``."""

    def log(message="", *_, **__) -> None:
        logger.log(level, "%s", message)

    return log
