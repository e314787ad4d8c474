"""A clock record every 5 s, as a task of a receiver process's asyncio loop (``agents.runner``'s duties for the HTTP
sink and the AMQP 0-9-1 receiver).

    asyncio.create_task(clock_every(spool, agent, reference, warn))   # a clock record every 5 s
"""
from __future__ import annotations

import asyncio

from core import clock, contract


async def clock_every(spool, agent: str, reference: str, warn, seconds: float = clock.REPORT_EVERY_S) -> None:
    """A clock record into ``spool`` every ``seconds``. The exchange with the reference (UDP, up to 8 round trips)
    runs in a thread, so the loop keeps serving; the record is appended here, on the loop's own thread. The spool is
    not thread-safe and the receiver appends every event on this thread: appended from the exchange's thread, a clock
    record and a receive line could take the same bytes, and the receive would be lost."""
    loop = asyncio.get_running_loop()
    while True:
        records: list = []
        await loop.run_in_executor(None, clock.report, records.append, agent, reference, warn)
        for rec in records:
            spool.append(contract.encode([rec]).decode().rstrip("\n"))
        await asyncio.sleep(seconds)
