"""A CloudEvents HTTP sink for tests: answers 202, optionally after a delay; counts by second.

    python tests/http_sink.py PORT [DELAY_S]

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
    return web.Response(status=202)


def main() -> None:
    app = web.Application()
    app["delay"] = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
    app.router.add_post("/{tail:.*}", handle)
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)


if __name__ == "__main__":
    main()
