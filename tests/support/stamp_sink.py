"""An HTTP sink that stamps each event's arrival, for the send-stamp test: answers 202 at once.

    python tests/stamp_sink.py PORT OUT_FILE

For each request it notes ``ce-id`` and the kernel's receive stamp of its first bytes
(``SO_TIMESTAMPNS``: CLOCK_REALTIME, the clock the load generator stamps with, taken when loopback queued the
segment, so the sink's own scheduling on a busy machine is not in it); on SIGTERM it writes
``ID ARRIVAL_NS`` lines to OUT_FILE. One request a connection at a time, as the load generator sends.
"""
import selectors
import signal
import socket
import struct
import sys

ANSWER = b"HTTP/1.1 202 Accepted\r\nContent-Length: 0\r\n\r\n"
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)  # Linux's value; Python names it from 3.13 on
TIMESPEC = struct.Struct("qq")


def main(port: int, out: str) -> None:
    arrivals: list = []
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    sel = selectors.DefaultSelector()
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)  # inherited: bytes that come before accept() are stamped too
    server.bind(("127.0.0.1", port))
    server.listen(1024)
    server.setblocking(False)
    sel.register(server, selectors.EVENT_READ, None)
    bufs: dict = {}
    cmsg_size = socket.CMSG_SPACE(TIMESPEC.size)
    while not stop:
        for key, _ in sel.select(0.2):
            if key.data is None:
                try:
                    conn, _ = server.accept()
                except BlockingIOError:
                    continue
                conn.setblocking(False)
                bufs[conn] = [bytearray(), 0]  # bytes so far, stamp of the first of them
                sel.register(conn, selectors.EVENT_READ, "conn")
                continue
            conn = key.fileobj
            try:
                data, anc, _, _ = conn.recvmsg(1 << 16, cmsg_size)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                data = b""
            if not data:
                sel.unregister(conn)
                conn.close()
                bufs.pop(conn, None)
                continue
            sec, nsec = next(TIMESPEC.unpack(d[:TIMESPEC.size]) for lvl, typ, d in anc
                             if lvl == socket.SOL_SOCKET and typ == SO_TIMESTAMPNS)
            at = sec * 1_000_000_000 + nsec
            buf, first = bufs[conn]
            if not buf:
                first = at
            buf += data
            while True:
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    break
                head = bytes(buf[:end]).decode("latin-1").lower()
                length = int(head.split("content-length:", 1)[1].split("\r\n", 1)[0]) if "content-length:" in head else 0
                if len(buf) < end + 4 + length:
                    break
                eid = head.split("ce-id:", 1)[1].split("\r\n", 1)[0].strip() if "ce-id:" in head else ""
                arrivals.append((eid, first))
                del buf[:end + 4 + length]
                first = at
                conn.sendall(ANSWER)
            bufs[conn][1] = first
    with open(out, "w") as f:
        f.writelines(f"{eid} {at}\n" for eid, at in arrivals)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
