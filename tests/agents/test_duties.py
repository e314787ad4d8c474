"""A receiver's loop duties (``agents.duties``) against a real clock reference and a real spool."""
from __future__ import annotations

import asyncio
import glob
import json
import threading

from agents.duties import clock_every
from agents.spool import SpoolWriter
from core.clock import ClockReference


def test_clock_records_are_appended_on_the_loops_thread_beside_the_receives(tmp_path):
    """The exchange runs in a thread, the append on the loop's: the spool is not thread-safe, and the HTTP and AMQP
    receivers appended clock records from the executor's thread while their loop appended receives. Every append
    here is on the loop's thread, and every line (500 receives, the clock records) is whole in the spool."""
    ref = ClockReference("127.0.0.1", 0).start()
    spool = SpoolWriter(str(tmp_path / "spool"), agent="recv")
    threads: list[int] = []
    append = spool.append

    def traced(line: str) -> bool:
        threads.append(threading.get_ident())
        return append(line)

    spool.append = traced

    async def main() -> int:
        loop_thread = threading.get_ident()
        duty = asyncio.create_task(clock_every(spool, "recv", ref.address, print, seconds=0.01))
        for i in range(500):
            spool.append(json.dumps({"type": "recv", "event_id": f"e{i}"}))
            await asyncio.sleep(0.001)
        duty.cancel()
        return loop_thread

    try:
        loop_thread = asyncio.run(main())
    finally:
        ref.close()
    spool.close()
    assert set(threads) == {loop_thread}
    lines = [line for path in sorted(glob.glob(str(tmp_path / "spool" / "*")))
             for line in open(path, "rb").read().rstrip(b"\0").decode().splitlines()]
    records = [json.loads(line) for line in lines]
    assert [r["event_id"] for r in records if r.get("type") == "recv"] == [f"e{i}" for i in range(500)]
    clocks = [r for r in records if r.get("type") != "recv"]
    assert clocks and all(r["agent"] == "recv" for r in clocks), clocks[:3]
