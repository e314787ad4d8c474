"""Hand memory a long-lived process has freed back to the system.

A process whose working set rose once (a receiver holding 1,500 connections during a stall of
the system under test, a reader of a big batch) otherwise stays at that high-water mark for the
rest of a run, which reads like a leak in a soak. Two things keep it there:

- Python's own allocator (pymalloc) gives a 1 MiB arena back only once every object in it is
  gone, and a burst's objects are spread over arenas that also hold long-lived ones. The
  long-lived agents (``python -m agents.receiver``) therefore restart themselves at once with
  ``PYTHONMALLOC=malloc`` (``use_c_allocator``): the C library's allocator, no slower there (a receiver
  spent 48-50 µs of CPU per request with it, 52-63 with pymalloc). The commands that live for one run
  (``loadgen``, ``streaming``) keep pymalloc, faster for their many small objects, and take the glibc
  settings below for the rest.
- glibc keeps the free pages inside its heap until ``malloc_trim(0)`` hands them back.

A receiver on aiohttp's server (before it had its own) after a burst of 1,500 connections, all
closed: 36 MiB before, 61 at the peak, 51 after a collection and a trim with pymalloc, 41 with the
C allocator. Elsewhere (not glibc) trimming does nothing.
"""
from __future__ import annotations

import asyncio
import gc
import os
import subprocess
import sys

from core import settings

TRIM_EVERY_S = 10.0
"""How often a long-lived agent collects and trims by default (a few ms on a ~50 MiB heap; ``--trim-every-s``)."""


C_ALLOCATOR_ENV = {"MALLOC_ARENA_MAX": "2", "MALLOC_MMAP_THRESHOLD_": "131072"}
"""glibc settings that come with it (unless set): two arenas, not eight per core, for the few threads
these processes have; and blocks of 128 KiB or more (Arrow buffers, a batch's arrays) mapped and
unmapped on their own, instead of glibc raising that threshold after each large free and keeping
ever larger blocks in its heaps, where they fragment it."""


def use_c_allocator(module: str, keep_pymalloc: bool = False) -> None:
    """Restart this process (``python -m module`` with the same arguments, same PID) with ``C_ALLOCATOR_ENV`` and
    ``PYTHONMALLOC=malloc``, unless PYTHONMALLOC is set (``PYTHONMALLOC=pymalloc`` keeps Python's).

    ``keep_pymalloc``: a process that lives for one run (the load generator, the streaming job) keeps Python's allocator
    for its objects, and glibc's settings for the rest (Arrow's buffers): the Kafka load generator at 5,000/s spent
    41 µs of CPU an event with pymalloc against 47 with glibc's (medians of three), and at ``make attack RATE=5000``
    flightwatch as a whole took 0.79-0.81 core (0.88-0.92 before, with the receiver's write-ahead log fixed too). A
    run's high-water mark ends with it."""
    if os.environ.get("PYTHONMALLOC"):
        return
    sys.stdout.flush()
    sys.stderr.flush()
    env = {**C_ALLOCATOR_ENV, **os.environ, "PYTHONMALLOC": "pymalloc" if keep_pymalloc else "malloc"}
    os.execve(sys.executable, [sys.executable, *subprocess._args_from_interpreter_flags(), "-m", module, *sys.argv[1:]], env)


def _libc_trim():
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc: nothing to trim
        return None


_MALLOC_TRIM = _libc_trim()


def trim(collect: bool = False) -> None:
    """Hand free pages back; with ``collect``, first free what only reference cycles keep (a closed
    connection's handler and parser wait for a full collection, which may not come for minutes)."""
    if collect:
        gc.collect()
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)  # ctypes lets go of the GIL for the call


def trim_interval_s() -> float:
    """How often a long-lived process collects and trims: FLIGHTWATCH_TRIM_EVERY_S, else ``TRIM_EVERY_S``."""
    return float(settings.get("FLIGHTWATCH_TRIM_EVERY_S") or TRIM_EVERY_S)


async def trim_every(seconds: float | None = None) -> None:
    """An asyncio task: collect and trim every ``seconds`` (default ``trim_interval_s()``), on the default executor."""
    if seconds is None:
        seconds = trim_interval_s()
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(seconds)
        await loop.run_in_executor(None, trim, True)


def trace_from_env(name: str, every_s: float = 60.0) -> None:
    """With ``FLIGHTWATCH_MEMORY_TRACE=DIR``: trace Python allocations (tracemalloc, one frame: slows
    allocation-heavy code by a third or more) and, every ``every_s``, append to ``DIR/<name>-<pid>.log``
    the 25 source lines whose live memory grew most since the first report. A diagnosis aid for soaks."""
    import threading

    out_dir = settings.get("FLIGHTWATCH_MEMORY_TRACE")
    if not out_dir:
        return
    import time
    import tracemalloc

    tracemalloc.start(1)
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"{name}-{os.getpid()}.log")

    def report() -> None:
        first = None
        while True:
            time.sleep(every_s)
            snap = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
            if first is None:
                first = snap
                continue
            with open(path, "a") as f:
                total = sum(s.size for s in snap.statistics("filename")) >> 10
                f.write(f"--- {time.strftime('%H:%M:%S')} traced {total:,} KiB; growth since the first report:\n")
                for stat in snap.compare_to(first, "lineno")[:25]:
                    f.write(f"{stat}\n")

    threading.Thread(target=report, name="memory-trace", daemon=True).start()
