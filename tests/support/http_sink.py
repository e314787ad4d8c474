"""A CloudEvents HTTP sink for tests: answers 202, optionally after a delay.

    python tests/support/http_sink.py PORT [DELAY_S [ANNOUNCE_AFTER]]

With ANNOUNCE_AFTER it prints "served N" on stdout once it has answered N requests, so a test can act
on what the sink did rather than on a sleep.

Not the receiver agent (that one writes telemetry): a plain target for the load generator.
"""
import asyncio
import sys

from aiohttp import web


async def handle(request: web.Request) -> web.Response:
    await request.read()
    delay = request.app["delay"]
    if delay:
        await asyncio.sleep(delay)
    app = request.app
    app["served"] += 1
    if app["served"] == app["announce"]:
        print(f"served {app['served']}", flush=True)
    return web.Response(status=202)


def main() -> None:
    app = web.Application()
    app["delay"] = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
    app["announce"] = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    app["served"] = 0
    app.router.add_post("/{tail:.*}", handle)
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)


if __name__ == "__main__":
    main()
