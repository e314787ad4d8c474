"""``bench.capacity_relay --forward-delay``: the relay that the regression verdict's real repeats run through
(``bench.relay_repeats``) holds each event for a lognormal delay of the median it is given. Measured here from the
outside: the time from each POST's answer to its forward's arrival at a real sink, matched by event ID."""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import numpy as np
from aiohttp import ClientSession, web

from core.procs import free_port, stop_process

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EVENTS, MEDIAN_S, SIGMA = 400, 0.02, 0.25


async def _measure(relay_port: int, sink_port: int) -> np.ndarray:
    arrived: dict[str, int] = {}

    async def sink(request: web.Request) -> web.Response:
        await request.read()
        arrived[request.headers["ce-id"]] = time.monotonic_ns()
        return web.Response(status=202)

    app = web.Application()
    app.router.add_post("/", sink)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", sink_port).start()
    sent: dict[str, int] = {}
    async with ClientSession() as s:
        for _ in range(100):  # the relay's port open
            try:
                async with s.post(f"http://127.0.0.1:{relay_port}/", data=b"x", headers={"ce-id": "probe"}):
                    break
            except OSError:
                await asyncio.sleep(0.1)
        for i in range(EVENTS):
            async with s.post(f"http://127.0.0.1:{relay_port}/", data=b"{}", headers={"ce-id": f"e{i}"}) as r:
                assert r.status == 202
                sent[f"e{i}"] = time.monotonic_ns()
            await asyncio.sleep(0.002)
        await asyncio.sleep(MEDIAN_S * 8)
    await runner.cleanup()
    assert set(sent) <= set(arrived), f"{len(set(sent) - set(arrived))} events not forwarded"
    return np.array([(arrived[k] - sent[k]) / 1e9 for k in sent])


def test_forward_delay_has_the_median_and_spread_it_is_given():
    relay_port, sink_port = free_port(), free_port()
    relay = subprocess.Popen([sys.executable, "-m", "bench.capacity_relay", str(relay_port),
                              f"http://127.0.0.1:{sink_port}/", "--forward-delay", str(MEDIAN_S), "--forward-sigma",
                              str(SIGMA), "--seed", "1"], cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT))
    try:
        d = asyncio.run(_measure(relay_port, sink_port))
    finally:
        stop_process(relay)
    # the answer goes out before the timer starts, and the forward adds a loopback POST: a little above the median
    assert MEDIAN_S * 0.97 <= np.median(d) <= MEDIAN_S * 1.15, np.median(d)
    # the spread from the quartiles of log(delay) (a normal's interquartile range is 1.349 sigma; its standard error
    # at 400 events is ~4% of sigma): the standard deviation took in the busy machine's scheduling stalls, a few
    # events late by tens of ms (CI, make test on three workers: 0.395 for 0.25, the median right)
    q25, q75 = np.percentile(np.log(d), [25, 75])
    assert 0.8 * SIGMA <= (q75 - q25) / 1.349 <= 1.25 * SIGMA, ((q75 - q25) / 1.349, np.std(np.log(d)))
