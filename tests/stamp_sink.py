"""An HTTP sink that stamps each event's arrival, for the send-stamp test: answers 202 at once.

    python tests/stamp_sink.py PORT OUT_FILE

For each request it notes ``ce-id`` and the wall-clock time (``time.time_ns``, the clock the load generator
stamps with) of the read that brought the request's first bytes; on SIGTERM it writes ``ID ARRIVAL_NS`` lines
to OUT_FILE. Plain asyncio on uvloop, one request a connection at a time (as the load generator sends): the
stamp is taken in the first callback after the kernel hands over the bytes.
"""
import asyncio
import signal
import sys
import time

import uvloop

ANSWER = b"HTTP/1.1 202 Accepted\r\nContent-Length: 0\r\n\r\n"


class Conn(asyncio.Protocol):
    def __init__(self, arrivals: list) -> None:
        self.arrivals, self.buf, self.first_ns, self.transport = arrivals, bytearray(), 0, None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        now = time.time_ns()
        if not self.buf:
            self.first_ns = now
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self.buf[:end]).decode("latin-1").lower()
            length = int(head.split("content-length:", 1)[1].split("\r\n", 1)[0]) if "content-length:" in head else 0
            if len(self.buf) < end + 4 + length:
                return
            eid = head.split("ce-id:", 1)[1].split("\r\n", 1)[0].strip() if "ce-id:" in head else ""
            self.arrivals.append((eid, self.first_ns))
            del self.buf[:end + 4 + length]
            self.first_ns = now
            self.transport.write(ANSWER)


async def main(port: int, out: str) -> None:
    arrivals: list = []
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    server = await loop.create_server(lambda: Conn(arrivals), "127.0.0.1", port, backlog=1024)
    await stop.wait()
    server.close()
    with open(out, "w") as f:
        f.writelines(f"{eid} {at}\n" for eid, at in arrivals)


if __name__ == "__main__":
    uvloop.install()
    asyncio.run(main(int(sys.argv[1]), sys.argv[2]))
