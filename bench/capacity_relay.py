"""A system under test of known capacity, for the saturation tests: a CloudEvents relay.

    python -m bench.capacity_relay PORT TARGET_URL [--capacity N] [--delay S] [--hold-at S --hold-for S]
                                   [--forward-log FILE] [--forward-delay S [--forward-sigma X] [--seed N]]

Answers each POST with 202 (after ``--delay`` seconds), queues the event, and forwards the
queue to TARGET_URL (the HTTP receiver agent) at most ``--capacity`` events a second, like a
broker whose dispatcher has a fixed throughput: beyond it, a backlog builds up. ``--hold-at``/``--hold-for``:
forward nothing for that long, from that many seconds after the first event (a stall of known length);
``--forward-log``: the relay's own clock at each forward (ns, a line each, when its headers went out), ground truth for the stall.
``--forward-delay``: instead, each event is forwarded on a timer of its own, after a lognormal delay of that median
(seconds) and ``--forward-sigma``: a flight time of known median, for the regression verdict's real repeats
(``bench.relay_repeats``); ``--capacity`` and ``--hold-at`` do not apply to it.
"""
import argparse
import asyncio
import collections
import random
import sys
import time

import aiohttp
from aiohttp import web

CONNECTIONS = 32


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("port", type=int)
    ap.add_argument("target")
    ap.add_argument("--capacity", type=float, default=0, help="events/s forwarded at most (0: no limit)")
    ap.add_argument("--delay", type=float, default=0.0, help="seconds before answering 202")
    ap.add_argument("--hold-at", type=float, default=None, help="seconds after the first event: stop forwarding")
    ap.add_argument("--hold-for", type=float, default=0.0, help="for this many seconds")
    ap.add_argument("--forward-log", default=None, help="append each forward's time (ns) to this file")
    ap.add_argument("--forward-delay", type=float, default=None,
                    help="forward each event after a lognormal delay of this median (seconds), on its own timer")
    ap.add_argument("--forward-sigma", type=float, default=0.25, help="that delay's log-sd (default %(default)s)")
    ap.add_argument("--seed", type=int, default=None, help="the delays' random seed")
    return ap.parse_args(argv)


async def main() -> None:
    a = parse_args()
    delays = random.Random(a.seed)
    timed: list = []  # --forward-delay: the session the timers post through
    # asyncio keeps only weak references to tasks: each forward's task is held here until it is done
    in_flight: set = set()
    failed = [0]

    def forward_later(headers: dict, body: bytes) -> None:
        task = asyncio.ensure_future(post(timed[0], headers, body))
        in_flight.add(task)
        task.add_done_callback(in_flight.discard)
    first: list[float] = []
    log = open(a.forward_log, "a", buffering=1 << 16) if a.forward_log else None
    queue: collections.deque = collections.deque()
    wake = asyncio.Event()

    async def handle(request: web.Request) -> web.Response:
        body = await request.read()
        if not first:
            first.append(time.monotonic())
        headers = {k: v for k, v in request.headers.items() if k.lower().startswith("ce-")}
        if a.forward_delay is not None:
            asyncio.get_running_loop().call_later(delays.lognormvariate(0, a.forward_sigma) * a.forward_delay,
                                                  forward_later, headers, body)
            return web.Response(status=202)
        queue.append((headers, body))
        wake.set()
        if a.delay:
            await asyncio.sleep(a.delay)
        return web.Response(status=202)

    async def post(session, headers, body) -> None:
        for attempt in (1, 2):  # a keep-alive connection the target closed as it was reused: once more, on a new one
            try:
                async with session.post(a.target, data=body, headers=headers) as r:
                    await r.read()
                return
            except aiohttp.ClientError as e:
                if attempt == 2:
                    failed[0] += 1
                    print(f"capacity_relay: forward failed ({e!r}); {failed[0]} so far", file=sys.stderr, flush=True)

    async def headers_sent(*_) -> None:  # the forward's time: when its bytes go out, not when its coroutine starts
        log.write(f"{time.time_ns()}\n")

    trace = aiohttp.TraceConfig()
    if log is not None:
        trace.on_request_headers_sent.append(headers_sent)

    async def forward() -> None:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=CONNECTIONS), trace_configs=[trace]) as session:
            timed.append(session)
            credit, last = 0.0, time.monotonic()
            while True:
                if not queue:
                    wake.clear()
                    await wake.wait()
                now = time.monotonic()
                if a.hold_at is not None and first and first[0] + a.hold_at <= now < first[0] + a.hold_at + a.hold_for:
                    await asyncio.sleep(first[0] + a.hold_at + a.hold_for - now)
                    last = now = time.monotonic()
                if log is not None:
                    log.flush()
                credit = min(credit + (now - last) * a.capacity, max(a.capacity / 10, 1)) if a.capacity else len(queue)
                last = now
                batch = []
                while queue and credit >= 1 and len(batch) < CONNECTIONS:  # no post waits for a connection
                    batch.append(queue.popleft())
                    credit -= 1
                if batch:
                    await asyncio.gather(*(post(session, h, b) for h, b in batch))
                await asyncio.sleep(0.01)

    app = web.Application()
    app.router.add_post("/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", a.port).start()
    await forward()


if __name__ == "__main__":
    asyncio.run(main())
