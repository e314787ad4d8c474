"""STOMP 1.2 frames, written and read (https://stomp.github.io/stomp-specification-1.2.html).

    COMMAND EOL (NAME:VALUE EOL)* EOL BODY NUL      a frame; EOL is LF or CR LF, between frames EOLs are heart-beats

A header's name and value escape backslash, CR, LF and colon (``\\\\``, ``\\r``, ``\\n``, ``\\c``), except in CONNECT
and CONNECTED; a frame with ``content-length`` has that many bytes of body (NULs too), one without ends at its first NUL.
Hand-written, not measured against a library: the protocol is this page's worth, and stomp.py (PyPI's most used client)
runs its own reader thread with listener callbacks, where a target writes on the worker's asyncio loop and a receiver
reads in its runner's turns.
"""
from __future__ import annotations

from dataclasses import dataclass, field

_ESCAPE = str.maketrans({"\\": "\\\\", "\r": "\\r", "\n": "\\n", ":": "\\c"})
_UNESCAPE = {"\\\\": "\\", "\\r": "\r", "\\n": "\n", "\\c": ":"}
RAW = ("CONNECT", "CONNECTED")
"""The frames whose headers are not escaped."""
MAX_HEADERS_BYTES = 1 << 20
"""A frame's command and headers, at most: more without the blank line that ends them is not STOMP."""


class FrameError(ValueError):
    """Bytes that are no STOMP frame."""


def _unescape(text: str) -> str:
    if "\\" not in text:
        return text
    out, i = [], 0
    while i < len(text):
        if text[i] == "\\":
            pair = text[i:i + 2]
            if pair not in _UNESCAPE:
                raise FrameError(f"undefined escape {pair!r} in a header")
            out.append(_UNESCAPE[pair])
            i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def frame(command: str, headers: dict[str, str] | None = None, body: bytes = b"") -> bytes:
    """One frame's bytes; a body gets its ``content-length``."""
    raw = command in RAW
    lines = [command]
    for name, value in (headers or {}).items():
        name, value = str(name), str(value)
        lines.append(f"{name}:{value}" if raw else f"{name.translate(_ESCAPE)}:{value.translate(_ESCAPE)}")
    if body:
        lines.append(f"content-length:{len(body)}")
    return ("\n".join(lines) + "\n\n").encode() + body + b"\0"


class SendFrames:
    """The load's SEND frames, built from a template: the fixed headers escaped once, per event only its ID, send
    stamp and receipt (the event ID too) filled in."""

    def __init__(self, destination: str, fixed: dict[str, str], id_header: str, sent_header: str, body: bytes) -> None:
        head = frame("SEND", {"destination": destination, **fixed}, b"")[:-3].decode()  # less its blank line and NUL
        self._prefix = (head + f"\n{id_header}:").encode()
        self._sent = f"\n{sent_header}:".encode()
        self._tail = f"\ncontent-length:{len(body)}\n\n".encode() + body + b"\0"

    def encode(self, event_id: str, sent_ns: int) -> bytes:
        eid = event_id.translate(_ESCAPE).encode()
        return b"".join((self._prefix, eid, self._sent, str(sent_ns).encode(), b"\nreceipt:", eid, self._tail))


@dataclass
class Frame:
    command: str
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    size: int = 0
    """The frame's bytes on the wire."""


class FrameReader:
    """Frames out of a byte stream fed in pieces: ``feed(data)`` returns the frames it completed."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[Frame]:
        self._buf += data
        out: list[Frame] = []
        buf = self._buf
        start = 0
        while True:
            while start < len(buf) and buf[start] in (0x0A, 0x0D):  # heart-beats between frames
                start += 1
            if start >= len(buf):
                break
            end = buf.find(b"\n\n", start)
            crlf = buf.find(b"\r\n\r\n", start)
            if crlf != -1 and (end == -1 or crlf < end):
                end, gap = crlf, 4
            else:
                gap = 2
            if end == -1:
                if len(buf) - start > MAX_HEADERS_BYTES:
                    raise FrameError(f"no end of a frame's headers in {MAX_HEADERS_BYTES:,} bytes")
                break
            head = bytes(buf[start:end]).decode("utf-8", errors="strict").replace("\r\n", "\n").split("\n")
            command, headers = head[0], {}
            for line in head[1:]:
                name, colon, value = line.partition(":")
                if not colon:
                    raise FrameError(f"a header without a colon in a {command} frame: {line[:80]!r}")
                if command not in RAW:
                    name, value = _unescape(name), _unescape(value)
                headers.setdefault(name, value)  # a repeated header: the first one counts
            body_at = end + gap
            length = headers.get("content-length")
            if length is not None:
                if not length.isdigit():
                    raise FrameError(f"content-length {length!r} in a {command} frame")
                stop = body_at + int(length)
                if len(buf) < stop + 1:
                    break
                if buf[stop] != 0:
                    raise FrameError(f"a {command} frame's body is not followed by NUL")
            else:
                stop = buf.find(b"\0", body_at)
                if stop == -1:
                    break
            out.append(Frame(command, headers, bytes(buf[body_at:stop]), stop + 1 - start))
            start = stop + 1
        del buf[:start]
        return out
