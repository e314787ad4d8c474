"""Durations, sizes and addresses as every flightwatch command line spells them: durations as Go's
time.ParseDuration (vegeta's and k6's) reads them, 500ms, 30s, 1m30s, 2h, 250us (a bare number is seconds);
64MiB, 2GiB, 500KB (a bare number is bytes); HOST:PORT."""
from __future__ import annotations

import re

UNITS_NS = {"ns": 1, "us": 1_000, "µs": 1_000, "μs": 1_000, "ms": 1_000_000, "s": 1_000_000_000, "m": 60_000_000_000,
            "h": 3_600_000_000_000}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_BARE = re.compile(r"\d+(?:\.\d+)?")


def parse_duration_ns(text: str) -> int:
    """'30s', '500ms', '1m30s', '2h', '250us', '1.5s' (a bare number is seconds) to nanoseconds, as Go's
    time.ParseDuration (but never negative); ValueError otherwise."""
    t = str(text).strip()
    if _BARE.fullmatch(t):
        return int(float(t) * UNITS_NS["s"])
    parts = _PART.findall(t)
    if not t or "".join(n + u for n, u in parts) != t:
        raise ValueError(f"bad duration {text!r}: use e.g. 500ms, 30s, 1m30s, 2h")
    return int(sum(float(n) * UNITS_NS[u] for n, u in parts))


def duration_text(ns: int) -> str:
    """Nanoseconds as ``parse_duration_ns`` reads them, in the largest unit that divides them: 500ms, 30s, 2m."""
    for unit in ("h", "m", "s", "ms", "us"):
        if ns and ns % UNITS_NS[unit] == 0:
            return f"{ns // UNITS_NS[unit]}{unit}"
    return f"{ns}ns"


SIZE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$")


def parse_size(text: str) -> int:
    """'2GiB', '64MiB', '500KB', '1048576' (bytes) to bytes, > 0; ValueError otherwise."""
    m = _SIZE.match(str(text).lower())
    if not m or m.group(2) not in SIZE_UNITS or float(m.group(1)) <= 0:
        raise ValueError(f"bad size {text!r}: use e.g. 64MiB, 2GiB, 500KB")
    return int(float(m.group(1)) * SIZE_UNITS[m.group(2)])


def split_host_port(text: str, what: str = "address", example: str = "127.0.0.1:18080") -> tuple[str, int]:
    """'HOST:PORT' to (host, port); ValueError naming ``what`` otherwise."""
    host, _, port = str(text).strip().rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"bad {what} {text!r}: use HOST:PORT, e.g. {example}")
    return host, int(port)


def parse_part(text: str, flag: str) -> tuple[int, int]:
    """``INDEX/COUNT``: part INDEX (from 0) of COUNT, as ``--shard`` and ``--share`` take it; ``ValueError`` naming
    ``flag``."""
    index, _, count = str(text).partition("/")
    try:
        i, n = int(index), int(count)
    except ValueError:
        raise ValueError(f"bad {flag} {text!r}: use INDEX/COUNT, e.g. 0/2") from None
    if not (n >= 1 and 0 <= i < n):
        raise ValueError(f"bad {flag} {text!r}: INDEX must be 0..COUNT-1 and COUNT >= 1")
    return i, n


def one_line(text: str) -> str:
    """``text`` with line breaks and other control characters escaped: an error message stays one line."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in str(text))
