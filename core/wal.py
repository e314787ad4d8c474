"""A write-ahead log of one record: the last block written, readable after a kill -9 at any point.

    log = WriteAheadLog("<state-dir>/wal")
    last = log.last()          # bytes of the last intact block, or None (a fresh start)
    log.write(b"...")          # one append; the previous blocks stay until the file rotates

Each block is appended as ``<length> <crc32>\\n<payload>\\n`` with one ``write`` on a descriptor kept open. A block a
kill cut short fails its length or CRC, and ``last()`` returns the one before it. At ``rotate_bytes`` the next block
starts a new file, written aside and renamed over the log (the only rename). The Kafka receiver wrote its log as a
file written aside and renamed every batch: 133 µs of CPU a batch on ext4, which flushes a file renamed over another
(``auto_da_alloc``), against 9 µs for an append, at ~400 batches a second at 5,000 events/s a third of its CPU.
Like the page cache it writes to, it survives a crash of the process, not a power loss of the host.
"""
from __future__ import annotations

import os
import zlib

ROTATE_BYTES = 4 << 20


class WriteAheadLog:
    def __init__(self, path: str, rotate_bytes: int = ROTATE_BYTES) -> None:
        self.path, self.rotate_bytes = path, rotate_bytes
        self._fd: int | None = None  # None: the next write starts a new file (never after a torn block)
        self._size = 0

    def last(self) -> bytes | None:
        """The payload of the last intact block (None if there is none). A log of the format before blocks (the
        payload alone, renamed into place) is read whole."""
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return None
        if data[:1] == b"{":
            return data
        last, pos = None, 0
        while (nl := data.find(b"\n", pos)) != -1:
            try:
                length, crc = (int(x) for x in data[pos:nl].split(b" "))
            except ValueError:
                break
            payload = data[nl + 1:nl + 1 + length]
            if len(payload) != length or zlib.crc32(payload) != crc or data[nl + 1 + length:nl + 2 + length] != b"\n":
                break
            last, pos = payload, nl + 2 + length
        return last

    def write(self, payload: bytes) -> None:
        block = b"%d %d\n%s\n" % (len(payload), zlib.crc32(payload), payload)
        if self._fd is None or self._size + len(block) > self.rotate_bytes:
            self._start(block)
            return
        if os.write(self._fd, block) != len(block):  # a short write (a full disk): the torn block ends this file
            self._start(block)
            return
        self._size += len(block)

    def _start(self, block: bytes) -> None:
        """A new file holding ``block`` alone, renamed over the log: what was there stays readable until then."""
        self.close()
        tmp = self.path + ".tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        try:
            os.write(fd, block)
            os.replace(tmp, self.path)
        except BaseException:
            os.close(fd)
            raise
        self._fd, self._size = fd, len(block)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
