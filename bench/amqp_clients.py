"""Which AMQP 0-9-1 client the RabbitMQ target and receiver use: CPU per message of aiormq and pika, publishing with
publisher confirms at a paced rate (many publishes in flight, 2 KiB, the target's headers), and consuming with a
prefetch and manual acks, each client in a process of its own against the same broker.

Usage:
    python -m bench.amqp_clients [--rate 5000] [--seconds 10] [--amqp-port 0]   # 0: a broker of its own

Prints one row per client and side: messages, confirmed or acked, CPU seconds, µs per message. Medians of --repeat.
"""
from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time

PAYLOAD = os.urandom(2048)
QUEUE = "bench.clients"
TURN_S = 0.002


def _headers(i: int) -> dict:
    return {"cloudEvents_id": f"loadgen-{i}", "cloudEvents_specversion": "1.0", "cloudEvents_source": "flightwatch/loadgen",
            "cloudEvents_type": "dev.flightwatch.load", "cloudEvents_fwrun": "bench", "fw_sent_ns": time.time_ns()}


def aiormq_publish(url: str, rate: float, n: int, out) -> None:
    import aiormq
    import uvloop
    from pamqp.commands import Basic

    async def main() -> tuple[int, float]:
        conn = await aiormq.connect(url)
        ch = await conn.channel(publisher_confirms=True)
        await ch.queue_declare(QUEUE)
        confirmed = 0

        def done(fut) -> None:
            nonlocal confirmed
            if isinstance(fut.result(), Basic.Ack):
                confirmed += 1
        cpu0, t0, sent, pending = time.process_time(), time.monotonic(), 0, set()
        while sent < n:
            due = min(n, int((time.monotonic() - t0) * rate))
            while sent < due:
                props = aiormq.spec.Basic.Properties(headers=_headers(sent), message_id=f"loadgen-{sent}",
                                                     content_type="application/octet-stream", delivery_mode=1)
                fut = asyncio.ensure_future(ch.basic_publish(PAYLOAD, routing_key=QUEUE, properties=props))
                fut.add_done_callback(done)
                pending.add(fut)
                fut.add_done_callback(pending.discard)
                sent += 1
            await asyncio.sleep(TURN_S)
        while pending:
            await asyncio.sleep(0.01)
        cpu = time.process_time() - cpu0
        await conn.close()
        return confirmed, cpu
    uvloop.install()
    out.put(("aiormq", "publish", n, *asyncio.run(main())))


def pika_publish(url: str, rate: float, n: int, out) -> None:
    import pika

    state = {"sent": 0, "confirmed": 0, "cpu0": 0.0, "t0": 0.0}
    params = pika.URLParameters(url)

    def on_open(conn) -> None:
        conn.channel(on_open_callback=on_channel)

    def on_channel(ch) -> None:
        ch.queue_declare(QUEUE, callback=lambda _f: ch.confirm_delivery(on_confirm, callback=lambda _f: start(ch)))

    def on_confirm(frame) -> None:
        method = frame.method
        if isinstance(method, pika.spec.Basic.Ack):
            state["confirmed"] = max(state["confirmed"], method.delivery_tag)  # RabbitMQ confirms in order
        if state["confirmed"] >= n:
            conn.close()

    def start(ch) -> None:
        state["cpu0"], state["t0"] = time.process_time(), time.monotonic()
        turn(ch)

    def turn(ch) -> None:
        due = min(n, int((time.monotonic() - state["t0"]) * rate))
        while state["sent"] < due:
            i = state["sent"]
            ch.basic_publish("", QUEUE, PAYLOAD, pika.BasicProperties(headers=_headers(i), message_id=f"loadgen-{i}",
                                                                      content_type="application/octet-stream",
                                                                      delivery_mode=1))
            state["sent"] += 1
        if state["sent"] < n:
            conn.ioloop.call_later(TURN_S, lambda: turn(ch))

    conn = pika.SelectConnection(params, on_open_callback=on_open, on_close_callback=lambda *_: conn.ioloop.stop())
    conn.ioloop.start()
    out.put(("pika", "publish", n, state["confirmed"], time.process_time() - state["cpu0"]))


def aiormq_consume(url: str, n: int, out, ready) -> None:
    import aiormq
    import uvloop

    async def main() -> tuple[int, float]:
        conn = await aiormq.connect(url)
        ch = await conn.channel()
        await ch.queue_declare(QUEUE)
        await ch.basic_qos(prefetch_count=1000)
        got, done, cpu0 = 0, asyncio.Event(), [0.0]

        async def on_message(msg) -> None:
            nonlocal got
            if got == 0:
                cpu0[0] = time.process_time()
            _ = (time.time_ns(), msg.header.properties.headers.get("cloudEvents_id"), len(msg.body))
            got += 1
            await ch.basic_ack(msg.delivery_tag)
            if got >= n:
                done.set()
        ready.set()
        await ch.basic_consume(QUEUE, on_message)
        await done.wait()
        cpu = time.process_time() - cpu0[0]
        await conn.close()
        return got, cpu
    uvloop.install()
    out.put(("aiormq", "consume", n, *asyncio.run(main())))


def pika_consume(url: str, n: int, out, ready) -> None:
    import pika

    state = {"got": 0, "cpu0": 0.0}

    def on_open(conn) -> None:
        conn.channel(on_open_callback=on_channel)

    def on_channel(ch) -> None:
        ch.queue_declare(QUEUE, callback=lambda _f: ch.basic_qos(prefetch_count=1000, callback=lambda _f: go(ch)))

    def go(ch) -> None:
        ready.set()
        ch.basic_consume(QUEUE, on_message)

    def on_message(ch, method, props, body) -> None:
        if state["got"] == 0:
            state["cpu0"] = time.process_time()
        _ = (time.time_ns(), (props.headers or {}).get("cloudEvents_id"), len(body))
        state["got"] += 1
        ch.basic_ack(method.delivery_tag)
        if state["got"] >= n:
            conn.close()

    conn = pika.SelectConnection(pika.URLParameters(url), on_open_callback=on_open,
                                 on_close_callback=lambda *_: conn.ioloop.stop())
    conn.ioloop.start()
    out.put(("pika", "consume", n, state["got"], time.process_time() - state["cpu0"]))


def one(url: str, client: str, rate: float, n: int) -> list[tuple]:
    ctx = mp.get_context("spawn")
    out, ready = ctx.Queue(), ctx.Event()
    consumer = ctx.Process(target={"aiormq": aiormq_consume, "pika": pika_consume}[client], args=(url, n, out, ready))
    consumer.start()
    ready.wait(30)
    producer = ctx.Process(target={"aiormq": aiormq_publish, "pika": pika_publish}[client], args=(url, rate, n, out))
    producer.start()
    rows = [out.get(timeout=n / rate + 120) for _ in range(2)]
    producer.join(30)
    consumer.join(30)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.amqp_clients", description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", type=float, default=5000.0)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--amqp-port", type=int, default=0, help="a running broker's AMQP port (default: start one)")
    a = p.parse_args(argv)
    from core.procs import free_port
    from stack.rabbitmq import start_rabbitmq, stop_rabbitmq

    broker = None
    port = a.amqp_port
    if not port:
        port = free_port()
        broker = start_rabbitmq(port, tempfile.mkdtemp(prefix="fw-rabbitmq-"))
    url = f"amqp://guest:guest@127.0.0.1:{port}/%2F"
    n = int(a.rate * a.seconds)
    try:
        results: dict[tuple, list] = {}
        for _ in range(a.repeat):
            for client in ("aiormq", "pika"):
                for name, side, num, ok, cpu in one(url, client, a.rate, n):
                    results.setdefault((name, side), []).append((num, ok, cpu))
        print(f"AMQP 0-9-1 clients at {a.rate:,.0f} msg/s for {a.seconds:g} s, 2 KiB, confirms / manual acks "
              f"(medians of {a.repeat})")
        print(f"{'client':8} {'side':8} {'messages':>9} {'confirmed/acked':>16} {'cpu s':>7} {'µs/msg':>8}")
        for (name, side), rows in sorted(results.items()):
            cpu = statistics.median(r[2] for r in rows)
            print(f"{name:8} {side:8} {rows[0][0]:>9,} {min(r[1] for r in rows):>16,} {cpu:>7.2f} "
                  f"{cpu * 1e6 / rows[0][0]:>8.1f}")
    finally:
        if broker is not None:
            stop_rabbitmq(broker.pid)
    return 0


if __name__ == "__main__":
    sys.exit(main())
