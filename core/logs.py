"""Logging for flightwatch's long-running processes (agents, shipper, streaming job): stdlib ``logging`` to standard
output, one line per record with a UTC timestamp, the level and the process's name:

    2026-11-24T00:55:00.123Z INFO receiver-http: http://127.0.0.1:18080/ -> spool ...

``FLIGHTWATCH_LOG_LEVEL`` (DEBUG, INFO, WARNING, ERROR; default INFO) sets the level. A bad flag is not logged: it
stays one line on standard error and exit code 2 (``core.cli``)."""
from __future__ import annotations

import logging
import os
import sys
import time

LEVEL_ENV = "FLIGHTWATCH_LOG_LEVEL"
INFO, WARNING, ERROR = logging.INFO, logging.WARNING, logging.ERROR
FORMAT = "%(asctime)s.%(msecs)03dZ %(levelname)s %(name)s: %(message)s"
DATE_FORMAT = "%Y-%m-%dT%H:%M:%S"


def setup(name: str) -> logging.Logger:
    """The process's logger, ``name`` (its agent name), writing to standard output (flushed per line)."""
    root = logging.getLogger()
    if not any(getattr(h, "_flightwatch", False) for h in root.handlers):
        handler = logging.StreamHandler(sys.stdout)
        formatter = logging.Formatter(FORMAT, DATE_FORMAT)
        formatter.converter = time.gmtime
        handler.setFormatter(formatter)
        handler._flightwatch = True
        root.addHandler(handler)
        level = os.environ.get(LEVEL_ENV, "INFO").upper()
        root.setLevel(level if level in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL") else "INFO")
        for noisy in ("kafka", "py4j", "urllib3"):  # their INFO lines are per connection, not ours
            logging.getLogger(noisy).setLevel(max(root.level, logging.WARNING))
    return logging.getLogger(name)


def printer(logger: logging.Logger, level: int = logging.INFO):
    """A ``log(message, flush=...)`` callable, for code that takes ``log=print``, writing to ``logger``."""

    def log(message="", *_, **__) -> None:
        logger.log(level, "%s", message)

    return log
