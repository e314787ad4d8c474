"""A host's skewed clock for the stood-in hosts (``support.hosts.skewed``): Python loads this at start-up when its
folder leads ``PYTHONPATH``, and with ``SKEWCLOCK_S`` set, moves this process's wall clock (``time.time``,
``time.time_ns``, ``CLOCK_REALTIME``) that many seconds, as a host's clock off by that much would; its monotonic
clock stays (intervals do not change). The processes it starts inherit both.

Not libfaketime: Debian's 0.9.10 cannot run CPython 3.11 either way. With its monotonic clock faked, a timed
``threading.Event.wait`` never returns (libfaketime issue #390); with ``FAKETIME_DONT_FAKE_MONOTONIC=1``,
``time.sleep`` fails with EINVAL (its ``clock_nanosleep`` takes a TIMER_ABSTIME monotonic deadline for a wall-clock
one). Every stamp flightwatch's agents take is ``time.time_ns()``, so this moves exactly what libfaketime would.
"""
import os
import time

_skew = os.environ.get("SKEWCLOCK_S")
if _skew:
    _NS = round(float(_skew) * 1e9)
    _time_ns, _time, _gettime, _gettime_ns = time.time_ns, time.time, time.clock_gettime, time.clock_gettime_ns
    time.time_ns = lambda: _time_ns() + _NS
    time.time = lambda: _time() + _NS / 1e9
    time.clock_gettime = lambda clk: _gettime(clk) + (_NS / 1e9 if clk == time.CLOCK_REALTIME else 0)
    time.clock_gettime_ns = lambda clk: _gettime_ns(clk) + (_NS if clk == time.CLOCK_REALTIME else 0)
