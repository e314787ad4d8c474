"""An event as an AMQP 1.0 message, both ways, for the per-event paths: the load generator's encoding and the
receiver's reading of what it needs (event ID, run ID, body size).

    enc = EventEncoder({"cloudEvents_source": "...", ...}, payload, "application/octet-stream")
    enc.encode("s1-42", sent_ns)      # bytes: [a header,] a properties, an application-properties and a data section
    read_event(message_bytes)         # ("s1-42", "run-...", 2048); ValueError if it is not an AMQP 1.0 message

Hand-written because proton's ``Message`` costs 59 µs to encode such an event and 34 µs to decode it (measured with
python-qpid-proton 0.40), most of the receiver's budget at 2,000/s; these take a few µs. proton stays the oracle:
the tests decode what ``encode`` writes with ``proton.Message`` and read what proton encodes, in every shape it has.

The encoding (AMQP 1.0 part 3, "Messaging", and part 1, "Types"): each section is a described value,
``0x00 0x53 <code>``; a string is ``0xa1 <len8>`` or ``0xb1 <len32>``; a list and a map carry their size and count.
A reader needs no table of types to step over a value: its constructor's high nibble says how its length is
written (``_width``).
"""
from __future__ import annotations

import struct
import uuid

PROPERTIES, APPLICATION_PROPERTIES, DATA, AMQP_SEQUENCE, AMQP_VALUE = 0x73, 0x74, 0x75, 0x76, 0x77
_SECTION_NAMES = {b"amqp:properties:list": PROPERTIES, b"amqp:application-properties:map": APPLICATION_PROPERTIES,
                  b"amqp:data:binary": DATA, b"amqp:amqp-sequence:list": AMQP_SEQUENCE,
                  b"amqp:amqp-value:*": AMQP_VALUE}
_LONG = struct.Struct(">q")


def _str(text: str, small: int = 0xa1, large: int = 0xb1) -> bytes:
    raw = text.encode()
    return bytes((small, len(raw))) + raw if len(raw) < 256 else bytes((large,)) + struct.pack(">I", len(raw)) + raw


def _compound(small: int, large: int, count: int, body: bytes) -> bytes:
    """A list (0xc0/0xd0) or map (0xc1/0xd1): its size counts the count field and the body."""
    if len(body) + 1 < 256 and count < 256:
        return bytes((small, len(body) + 1, count)) + body
    return bytes((large,)) + struct.pack(">II", len(body) + 4, count) + body


class EventEncoder:
    """One sender's events: the fixed application properties encoded once; per event, the ID (message ID and
    ``id_key``) and the send stamp (``stamp_key``, an AMQP long)."""

    def __init__(self, fixed: dict[str, str], payload: bytes, content_type: str, id_key: str, stamp_key: str,
                 durable: bool = False) -> None:
        # a header section (durable: true) only when asked: without one a message is not durable, AMQP's default
        self._header = b"\x00\x53\x70\xc0\x02\x01\x41" if durable else b""
        self._pairs = b"".join(_str(k) + _str(v) for k, v in fixed.items())
        self._count = 2 * (len(fixed) + 2)
        self._id_key, self._stamp_key = _str(id_key), _str(stamp_key) + b"\x81"
        self._content_type = _str(content_type, 0xa3, 0xb3)
        size = struct.pack(">I", len(payload))
        self._data = b"\x00\x53\x75\xb0" + size + payload

    def encode(self, event_id: str, sent_ns: int) -> bytes:
        eid = _str(event_id)
        # properties: message-id, then user-id, to, subject, reply-to, correlation-id absent (null), content-type
        props = _compound(0xc0, 0xd0, 7, eid + b"\x40\x40\x40\x40\x40" + self._content_type)
        app = _compound(0xc1, 0xd1, self._count, self._pairs + self._id_key + eid + self._stamp_key
                        + _LONG.pack(sent_ns))
        return self._header + b"\x00\x53\x73" + props + b"\x00\x53\x74" + app + self._data


_FIXED = {0x4: 0, 0x5: 1, 0x6: 2, 0x7: 4, 0x8: 8, 0x9: 16}


def _width(buf, i: int) -> tuple[int, int]:
    """Where the value whose constructor is at ``i`` starts (after its length, if any) and where it ends."""
    kind = buf[i] >> 4
    fixed = _FIXED.get(kind)
    if fixed is not None:
        return i + 1, i + 1 + fixed
    if kind in (0xa, 0xc, 0xe):
        return i + 2, i + 2 + buf[i + 1]
    if kind in (0xb, 0xd, 0xf):
        return i + 5, i + 5 + int.from_bytes(buf[i + 1:i + 5], "big")
    raise ValueError(f"not an AMQP 1.0 type: 0x{buf[i]:02x} at byte {i}")


def _skip(buf, i: int) -> int:
    """Past the value at ``i``, described or not."""
    if buf[i] == 0:
        return _skip(buf, _skip(buf, i + 1))
    return _width(buf, i)[1]


_SIGNED = frozenset((0x81, 0x71, 0x61, 0x51, 0x54, 0x55))
_INTEGERS = frozenset((0x80, 0x70, 0x60, 0x50, 0x52, 0x53)) | _SIGNED
_TEXTS = frozenset((0xa1, 0xb1, 0xa3, 0xb3, 0xa0, 0xb0))


def _scalar(buf, i: int):
    """The value at ``i`` as an event's text (strings, symbols, binary, integers, a UUID); None for the rest."""
    c = buf[i]
    start, end = _width(buf, i)
    if c in _TEXTS:
        return bytes(buf[start:end]).decode("utf-8", "replace") or None
    if c in _INTEGERS:
        return str(int.from_bytes(buf[start:end], "big", signed=c in _SIGNED))
    if c == 0x44 or c == 0x43:
        return "0"
    if c == 0x98:
        return str(uuid.UUID(bytes=bytes(buf[start:end])))
    return None


def _first(buf, i: int) -> tuple[int, int]:
    """The first element's start and the element count of the list or map at ``i`` (null, list0: no element)."""
    c = buf[i]
    if c == 0xc0 or c == 0xc1:
        return i + 3, buf[i + 2]
    if c == 0xd0 or c == 0xd1:
        return i + 9, int.from_bytes(buf[i + 5:i + 9], "big")
    if c == 0x40 or c == 0x45:
        return i + 1, 0
    raise ValueError(f"a list or map was expected: 0x{c:02x} at byte {i}")


def read_event(buf, id_key: bytes, run_key: bytes) -> tuple[str | None, str | None, int]:
    """The event ID (application property ``id_key``, else the message ID), the run ID (``run_key``) and the body's
    size (the bytes of its data sections, or of a binary or string value, else the value's encoding) of one encoded message; ``ValueError`` for bytes
    that are not an AMQP 1.0 message. The keys are given as UTF-8."""
    message_id = event_id = run_id = None
    body = 0
    i, n = 0, len(buf)
    try:
        while i < n:
            if buf[i] != 0:
                raise ValueError(f"a message section was expected at byte {i}")
            d = buf[i + 1]
            if d == 0x53:
                code, i = buf[i + 2], i + 3
            elif d == 0x80:
                code, i = int.from_bytes(buf[i + 2:i + 10], "big"), i + 10
            else:
                start, end = _width(buf, i + 1)
                code, i = _SECTION_NAMES.get(bytes(buf[start:end]), -1), end
            end = _skip(buf, i)
            if code == APPLICATION_PROPERTIES:
                j, count = _first(buf, i)
                for _ in range(count // 2):
                    start, value = _width(buf, j)
                    key = buf[start:value]
                    if key == id_key:
                        event_id = _scalar(buf, value)
                    elif key == run_key:
                        run_id = _scalar(buf, value)
                    j = _skip(buf, value)
            elif code == PROPERTIES:
                j, count = _first(buf, i)
                if count:
                    message_id = _scalar(buf, j)
            elif code == DATA or (code == AMQP_VALUE and buf[i] in _TEXTS):
                body += end - _width(buf, i)[0]
            elif code == AMQP_VALUE or code == AMQP_SEQUENCE:
                body += end - i
            i = end
        if i != n:
            raise ValueError("a section runs past the message's end")
    except IndexError:
        raise ValueError("the message ends inside a value") from None
    return event_id or message_id, run_id, body
