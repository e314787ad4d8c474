"""The load generator's errors: bad input (exit 2, one line), and the short, stable names of failed sends that
reports count errors by (as vegeta's report lists them)."""
from __future__ import annotations

import asyncio
import ssl

from core import tls
from core.units import one_line


class UsageError(Exception):
    """Bad input: printed as one line (user text in it is escaped), exit code 2."""

    def __init__(self, message: str) -> None:
        super().__init__(one_line(message))


def error_cause(exc: BaseException) -> str:
    """A short, stable name for a failed send (what vegeta's report lists as errors)."""
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
        return "timeout"
    if isinstance(exc, ssl.SSLError):
        return tls.short_cause(exc)
    if isinstance(exc, ConnectionRefusedError) or "Connect call failed" in str(exc) or "refused" in str(exc).lower():
        return "connection refused"
    if isinstance(exc, ConnectionResetError) or "reset" in str(exc).lower():
        return "connection reset"
    name = type(exc).__name__
    return {"ServerDisconnectedError": "server disconnected", "ClientOSError": "connection error",
            "ClientConnectorError": "connection refused", "KafkaTimeoutError": "timeout"}.get(name, name)
