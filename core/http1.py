"""HTTP/1.1 request framing shared by the receiver's server and the load generator's client (hand-written; the
measurement against llhttp through ``httptools`` is still to come).

A request head over ``MAX_HEAD`` (431), a body over ``MAX_BODY`` (413) or bytes that are not HTTP/1.x (400)
raise ``Malformed`` with the status to answer.
"""
from __future__ import annotations

MAX_HEAD = 64 * 1024
MAX_BODY = 16 << 20
CHUNKED = -1
"""The body length of a chunked request (framed by ``dechunk``)."""


class Malformed(ValueError):
    """Not an HTTP/1.x request this server can frame: answered with ``status``, then the connection is closed."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status, self.reason = status, reason


def parse_head(head: bytes) -> tuple[str, str, bool, dict]:
    """(method, path without query, keep-alive by default, headers) of a request head without its blank line.
    Header names are lower-cased, the first of repeated ones kept; values are UTF-8 (bytes that are not stay as
    surrogates, which ``core.cloudevents`` refuses) without surrounding blanks."""
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[0].isalpha() or not parts[2].startswith("HTTP/1."):
        raise Malformed(400, "not an HTTP/1.x request line")
    method, target, version = parts
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip(" \t") or " " in name:
            raise Malformed(400, "malformed header line")
        name = name.lower()
        if name not in headers:
            headers[name] = value.strip(" \t").encode("latin-1").decode("utf-8", "surrogateescape")
    return method, target.split("?", 1)[0], version != "HTTP/1.0", headers


def dechunk(buf, pos: int, body: bytearray) -> tuple[bool, int]:
    """Read the chunks of a chunked body that start at ``pos`` into ``body``: (whether the body is complete,
    the position after what was read). Called again with the rest as it arrives; trailers are skipped."""
    while True:
        eol = buf.find(b"\r\n", pos)
        if eol < 0:
            if len(buf) - pos > 1024:
                raise Malformed(400, "malformed chunk size")
            return False, pos
        try:
            size = int(bytes(buf[pos:eol]).split(b";", 1)[0].strip(b" \t"), 16)
        except ValueError:
            raise Malformed(400, "malformed chunk size") from None
        if size < 0:
            raise Malformed(400, "malformed chunk size")
        if len(body) + size > MAX_BODY:
            raise Malformed(413, "body too large")
        if size == 0:  # the last chunk, then trailers (usually none) and a blank line
            end = buf.find(b"\r\n\r\n", eol)
            if end < 0:
                if len(buf) - pos > MAX_HEAD:
                    raise Malformed(431, "trailers too large")
                return False, pos
            return True, end + 4
        start = eol + 2
        if len(buf) < start + size + 2:
            return False, pos
        if buf[start + size:start + size + 2] != b"\r\n":
            raise Malformed(400, "malformed chunk")
        body += buf[start:start + size]
        pos = start + size + 2
