"""Telemetry held on its way to the broker: a message acknowledged ``HELD_S`` or more after it was first sent.

The agent's host lost its path to the telemetry broker for a while (a link or a route down, the broker away or
slow), and its records waited in its buffer or spool, then arrived. Their stamps were taken on time, so no figure is
wrong; but a reader of the run must know the wait was flightwatch's, not the SUT's. The agent says so in a
``core.contract.TelemetryHeld`` record, and the run's verdict names it (``runs.verdict``).

Light on purpose: the spool's shipper imports it, and takes ``core.contract`` (and with it Arrow) only on a hold.
"""
from __future__ import annotations

import time

HELD_S = 1.0
"""A healthy path acknowledges in milliseconds, a busy broker in a few hundred: a second or more is a hold."""


def held_record(agent: str, began_ns: int, count: int, now_ns: int | None = None) -> bytes | None:
    """The wire line of a ``TelemetryHeld`` for ``count`` records first sent at ``began_ns`` and acknowledged now,
    or None when they did not wait ``HELD_S``."""
    waited_s = ((now_ns or time.time_ns()) - began_ns) / 1e9
    if waited_s < HELD_S:
        return None
    from core import contract

    return contract.encode([contract.TelemetryHeld(contract.ANY_RUN, agent, began_ns, count=count,
                                                   value=round(waited_s, 3))])
