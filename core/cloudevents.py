"""Reading the event ID and run ID out of a CloudEvents HTTP request: pure functions, no I/O.

Three content modes of the CloudEvents HTTP binding are understood:

- **binary**: attributes in ``ce-*`` headers (``ce-id``; the run in ``ce-fwrun``), data in the body;
- **structured**: ``Content-Type: application/cloudevents+json``, one JSON object whose
  ``id`` (and ``fwrun``) attributes name the event;
- **batched**: ``Content-Type: application/cloudevents-batch+json``, a JSON array of such objects.

``parse`` answers a list of ``(event_id, run_id)`` (run ID ``None`` when the event names
none) or raises ``BadEvent`` with a short reason: the receiver answers 400 and counts it.
"""
from __future__ import annotations

import json

RUN_ATTRIBUTE = "fwrun"
"""The CloudEvents extension attribute carrying the flightwatch run ID (set by the load generator)."""
KAFKA_RUN_HEADER = "ce_" + RUN_ATTRIBUTE
KAFKA_ID_HEADER = "ce_id"
"""On Kafka (the CloudEvents Kafka binding, binary mode: every attribute a ``ce_`` header): the run ID, as the
extension ``fwrun``, and the event ID (also the record key)."""
LEGACY_KAFKA_RUN_HEADER = "fw_run"
"""Where runs recorded before the binding was complete carry the run ID: still read, so that they replay."""
STRUCTURED = "application/cloudevents+json"
BATCH = "application/cloudevents-batch+json"
MAX_ID_LENGTH = 1024


class BadEvent(ValueError):
    """The request is not a CloudEvent this receiver can attribute; ``reason`` is a short stable name."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _utf8(value: str, what: str) -> str:
    """A header's bytes that are not UTF-8 (aiohttp keeps them as surrogates), or a JSON string with a lone
    surrogate escape, cannot name an event in the telemetry: refused rather than altered."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise BadEvent(f"{what} not UTF-8") from None
    return value


def _checked_id(value) -> str:
    if not isinstance(value, str) or not value:
        raise BadEvent("missing id")
    if len(value) > MAX_ID_LENGTH:
        raise BadEvent("id too long")
    return _utf8(value, "id")


def _run(value) -> str | None:
    return _utf8(value, "run") if isinstance(value, str) and value else None


def _from_object(obj) -> tuple[str, str | None]:
    if not isinstance(obj, dict):
        raise BadEvent("not a JSON object")
    return _checked_id(obj.get("id")), _run(obj.get(RUN_ATTRIBUTE))


def _json(body: bytes):
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise BadEvent("malformed JSON") from None


def parse(content_type: str | None, headers, body: bytes) -> list[tuple[str, str | None]]:
    """The events one request carries. ``headers`` is any mapping with case-insensitive ``get``."""
    ctype = (content_type or "").split(";", 1)[0].strip().lower()
    if ctype == STRUCTURED:
        return [_from_object(_json(body))]
    if ctype == BATCH:
        items = _json(body)
        if not isinstance(items, list) or not items:
            raise BadEvent("batch is not a non-empty JSON array")
        return [_from_object(item) for item in items]
    return [(_checked_id(headers.get("ce-id")), _run(headers.get("ce-" + RUN_ATTRIBUTE)))]
