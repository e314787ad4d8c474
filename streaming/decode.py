"""Parse ▸ validate ▸ quarantine: raw Kafka messages (NDJSON bodies) to typed telemetry rows.

The fast path hands a whole set of messages to ``pyarrow.json`` in one call; a message
that Arrow refuses (bad JSON, a wrong type) is decoded line by line in Python so that
only the bad lines are set aside. Every row then passes the same vectorised checks
(version, kind, required fields per kind, timestamp range). A bad row is never dropped:
it leaves with ``quarantine_reason`` set and its text in ``raw``.
"""
from __future__ import annotations

import io
import json
import math
import re
from collections.abc import Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson

from core.contract import (
    ARROW_SCHEMA,
    COUNT_FIELDS,
    FIELD_TYPES,
    KINDS,
    MAX_TS_NS,
    MIN_TS_NS,
    SCHEMA_VERSION,
    TIMESTAMP_FIELDS,
)
from streaming.clocks import COLUMNS, with_columns

DECODED_SCHEMA = pa.schema(
    list(ARROW_SCHEMA)
    + [
        pa.field("quarantine_reason", pa.string()),
        pa.field("raw", pa.string()),
        pa.field("src_partition", pa.int32()),
        pa.field("src_offset", pa.int64()),
        *COLUMNS,
    ]
)
"""Decoded telemetry: the contract's fields plus where a row came from, why it was set aside, and its clock
correction (``streaming.clocks``: null until the job corrects it)."""

RAW_TEXT_MAX_CHARS = 2000
"""A quarantined line keeps at most this much of its text."""

_PARSE_OPTIONS = pajson.ParseOptions(unexpected_field_behavior="infer")
_READ_OPTIONS = pajson.ReadOptions(use_threads=True, block_size=1 << 20)
"""1 MiB blocks: a 5,000/s batch's 3.3 MiB of lines parsed in 41.5 ms of CPU against 48.8 in 4 MiB blocks (2 MiB:
42.1; medians of 41 interleaved passes on the 2-core machine), and in parallel. A line longer than a block is read
whole: Arrow's block then reaches to the line's end (tested)."""


ARROW_SAFE_NESTING = 1000
"""Arrow's JSON reader (pyarrow 26) recurses once per nesting level and crashes the whole process
(SIGSEGV, not an exception) at about 20,000 levels; a record of the contract nests once."""
_NULL_LINE = re.compile(rb"\n[ \t\r]*null")
_NULL_FIRST = re.compile(rb"[ \t\r\n]*null")


def arrow_safe(body: bytes) -> bool:
    """Whether Arrow's reader may be given ``body``. It crashes (SIGSEGV) on a line that is a bare
    ``null`` where a block starts, and on deep nesting; such a message is decoded line by line.
    Telemetry lines start with '{' and nest once, so this costs a few C-speed scans."""
    if _NULL_FIRST.match(body) or _NULL_LINE.search(body):
        return False
    if len(body) <= ARROW_SAFE_NESTING or body.count(b"{") + body.count(b"[") <= ARROW_SAFE_NESTING:
        return True
    b = np.frombuffer(body, dtype=np.uint8)
    o = b | 0x20  # '[' -> '{', ']' -> '}'
    at = np.flatnonzero((o == 0x7B) | (o == 0x7D))
    return int(np.cumsum(np.where(o[at] == 0x7B, 1, -1)).max(initial=0)) <= ARROW_SAFE_NESTING


def _arrow_parse(body: bytes) -> pa.Table:
    """NDJSON to ARROW_SCHEMA columns; raises ArrowInvalid if any value has the wrong type.

    Types are inferred (twice as fast as an explicit 22-column schema) and then held to the
    contract: a column may only widen int to float or be all-null; anything else (a string
    where a number belongs, a float where an integer belongs) sends the message to the
    line-by-line path, which names the bad line.
    """
    parsed = pajson.read_json(io.BytesIO(body), read_options=_READ_OPTIONS, parse_options=_PARSE_OPTIONS)
    columns = []
    for f in ARROW_SCHEMA:
        if f.name not in parsed.column_names:
            columns.append(pa.nulls(parsed.num_rows, f.type))
            continue
        col = parsed[f.name]
        if col.type == f.type:
            columns.append(col)
        elif pa.types.is_null(col.type) or (pa.types.is_integer(col.type) and pa.types.is_floating(f.type)):
            columns.append(col.cast(f.type))
        else:
            raise pa.ArrowInvalid(f"field {f.name}: {col.type} where {f.type} belongs")
    return pa.Table.from_arrays(columns, schema=ARROW_SCHEMA)


def _check_value(name: str, value) -> str | None:
    """Why a Python value cannot stand in field ``name`` (None when it can)."""
    t = FIELD_TYPES[name]
    if value is None:
        return None
    if pa.types.is_integer(t):
        ok = isinstance(value, int) and not isinstance(value, bool) and -2**63 <= value < 2**63
    elif pa.types.is_floating(t):  # NaN and Infinity parse in Python's json, but are no measurement
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    elif pa.types.is_boolean(t):
        ok = isinstance(value, bool)
    else:
        ok = isinstance(value, str)
    return None if ok else f"field {name}: wrong type {type(value).__name__}"


def _python_parse(body: bytes) -> tuple[list[dict], list[tuple[str, str]]]:
    """Line-by-line decode of one message: (good rows, [(reason, raw line)])."""
    good, bad = [], []
    for line in body.split(b"\n"):
        if not line.strip():
            continue
        text = line.decode("utf-8", errors="replace")
        try:
            obj = json.loads(text)
        except ValueError:
            bad.append(("not json", text))
            continue
        except RecursionError:
            bad.append(("not json: nested too deep", text))
            continue
        if not isinstance(obj, dict):
            bad.append(("not a json object", text))
            continue
        reason = next(
            (r for r in (_check_value(k, obj.get(k)) for k in FIELD_TYPES) if r is not None), None
        )
        if reason:
            bad.append((reason, text))
        else:
            good.append({k: obj.get(k) for k in FIELD_TYPES})
    return good, bad


def _validate(table: pa.Table) -> pa.Array:
    """A reason per row (null where the row is valid), all checks vectorised."""
    n = table.num_rows
    reasons = np.full(n, None, dtype=object)
    marked = np.zeros(n, dtype=bool)  # rows with a reason already (a row keeps its first)

    def mark(mask, reason: str) -> None:
        m = np.asarray(pc.fill_null(mask, True)) & ~marked
        if m.any():
            reasons[m] = reason
            marked[m] = True

    mark(pc.not_equal(table["v"], SCHEMA_VERSION), "unsupported schema version")
    codes = pc.index_in(table["kind"], value_set=pa.array(list(KINDS)))  # one pass over the kinds, null: unknown
    mark(codes.is_null(), "unknown kind")
    codes = np.asarray(codes.fill_null(-1))
    for code, (kind, rtype) in enumerate(KINDS.items()):
        is_kind = codes == code
        if not is_kind.any():
            continue
        for name in rtype.REQUIRED:
            missing = np.asarray(table[name].is_null()) & is_kind
            mark(pa.array(missing), f"{kind}: missing {name}")
    for name in TIMESTAMP_FIELDS:
        col = table[name]
        out = pc.or_(pc.less(col, MIN_TS_NS), pc.greater(col, MAX_TS_NS))
        mark(pc.fill_null(out, False), f"field {name}: out of range")
    for name in COUNT_FIELDS:
        mark(pc.fill_null(pc.less(table[name], 0), False), f"field {name}: negative")
    for name, t in FIELD_TYPES.items():  # Arrow's reader takes NaN and Infinity: no measurement is either
        if pa.types.is_floating(t):
            mark(pc.fill_null(pc.invert(pc.is_finite(table[name])), False), f"field {name}: not a finite number")
    mark(pc.fill_null(pc.equal(table["event_id"], ""), False), "empty event_id")
    return pa.array(reasons, type=pa.string())


def _raw_json(table: pa.Table, mask: np.ndarray) -> list[str | None]:
    rows = table.filter(pa.array(mask)).to_pylist()
    it = iter(rows)
    return [
        json.dumps({k: v for k, v in next(it).items() if v is not None})[:RAW_TEXT_MAX_CHARS]
        if m else None
        for m in mask
    ]


def decode_messages(values: Iterable[bytes | None], partitions: Iterable[int], offsets: Iterable[int]) -> pa.Table:
    """Kafka message bodies (with their partition and offset) to one DECODED_SCHEMA table."""
    values, partitions, offsets = list(values), list(partitions), list(offsets)
    pieces: list[pa.Table] = []
    # Fast path: every message Arrow can be given, at once; on failure, message by message.
    safe = [arrow_safe(v or b"") for v in values]
    fast = [i for i in range(len(values)) if safe[i]]
    groups = [[i] for i in range(len(values)) if not safe[i]]
    try:
        if fast:
            pieces.append(_with_source(_arrow_parse(b"\n".join(values[i] or b"" for i in fast)), values, partitions, offsets, fast))
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        groups += [[i] for i in fast]
    for group in sorted(groups):
        i = group[0]
        body = values[i] or b""
        if safe[i]:
            try:
                pieces.append(_with_source(_arrow_parse(body), values, partitions, offsets, group))
                continue
            except (pa.ArrowInvalid, pa.ArrowTypeError):
                pass
        good, bad = _python_parse(body)
        if good:
            t = pa.Table.from_pylist(good, schema=ARROW_SCHEMA)
            pieces.append(_attach(t, None, None, partitions[i], offsets[i]))
        if bad:
            t = pa.Table.from_pylist([{}] * len(bad), schema=ARROW_SCHEMA)
            pieces.append(_attach(t, [r for r, _ in bad], [raw[:RAW_TEXT_MAX_CHARS] for _, raw in bad], partitions[i], offsets[i]))
    if not pieces:
        return DECODED_SCHEMA.empty_table()
    table = pa.concat_tables(pieces)
    # Vectorised checks on every row parsed so far (rows already quarantined keep their reason).
    reasons = _validate(table.select(list(FIELD_TYPES)))
    prior = table["quarantine_reason"]
    merged = pc.coalesce(prior, reasons)
    newly = np.asarray(pc.and_(prior.is_null(), merged.is_valid()))
    if newly.any():  # rows the checks quarantined keep their line as JSON (no Python lists of a batch otherwise)
        fresh = _raw_json(table.select(list(FIELD_TYPES)), newly)
        raw = pa.array([f if f is not None else r for f, r in zip(fresh, table["raw"].to_pylist())], pa.string())
    else:
        raw = table["raw"].cast(pa.string())
    table = table.set_column(table.schema.get_field_index("quarantine_reason"), "quarantine_reason", merged)
    return table.set_column(table.schema.get_field_index("raw"), "raw", raw)


def _with_source(t: pa.Table, values, partitions, offsets, group: list[int]) -> pa.Table:
    """Give each parsed row the partition/offset of the message its line came from."""
    lines_per_msg = [(values[i] or b"").count(b"\n") + 1 if values[i] else 0 for i in group]
    if sum(lines_per_msg) != t.num_rows:  # blank lines somewhere: count the non-blank ones
        lines_per_msg = [sum(1 for ln in (values[i] or b"").split(b"\n") if ln.strip()) for i in group]
    if sum(lines_per_msg) != t.num_rows:  # cannot attribute lines: attribute to the first message
        return _attach(t, None, None, partitions[group[0]], offsets[group[0]])
    part = np.repeat(np.array([partitions[i] for i in group], dtype=np.int32), lines_per_msg)
    offs = np.repeat(np.array([offsets[i] for i in group], dtype=np.int64), lines_per_msg)
    return _attach(t, None, None, pa.array(part), pa.array(offs))


def _attach(t: pa.Table, reasons, raws, partition, offset) -> pa.Table:
    n = t.num_rows
    cols = {
        "quarantine_reason": pa.array(reasons if reasons is not None else [None] * n, pa.string()),
        "raw": pa.array(raws if raws is not None else [None] * n, pa.string()),
        "src_partition": partition if isinstance(partition, pa.Array) else pa.array(np.full(n, partition, np.int32)),
        "src_offset": offset if isinstance(offset, pa.Array) else pa.array(np.full(n, offset, np.int64)),
    }
    for name, col in cols.items():
        t = t.append_column(DECODED_SCHEMA.field(name), col)
    return with_columns(t)


def conform(t: pa.Table) -> pa.Table:
    """An archived table as DECODED_SCHEMA, from an archive written before the clock columns or a field of the
    contract too (null there)."""
    t = with_columns(t)
    for f in DECODED_SCHEMA:
        if f.name not in t.column_names:
            t = t.append_column(f, pa.nulls(t.num_rows, f.type))
    return t.select(DECODED_SCHEMA.names).cast(DECODED_SCHEMA)


def decode_record_batches(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` function: Kafka-source columns in, DECODED_SCHEMA batches out."""
    import gc

    gc.freeze()  # see streaming.sources: the worker's heap is not rescanned after every task
    for batch in batches:
        if batch.num_rows == 0:
            continue
        table = decode_messages(
            batch.column("value").to_pylist(),
            batch.column("partition").to_pylist(),
            batch.column("offset").to_pylist(),
        )
        yield from table.cast(DECODED_SCHEMA).to_batches()


def this_runs_rows(raw, run_id: str) -> pa.Table:
    """Raw Kafka rows (``value``, ``partition``, ``offset``) to the decoded rows ``run_id``'s job reads
    (``streaming.membership``), for a driver that decodes (``JobConfig.decodes_in_driver``)."""
    from streaming import membership

    t = decode_messages(raw.column("value").to_pylist(), raw.column("partition").to_pylist(),
                        raw.column("offset").to_pylist()).cast(DECODED_SCHEMA)
    return membership.read(t, run_id)


def run_record_batches(run_id: str):
    """A ``mapInArrow`` function: raw Kafka rows (Spark's connector) to the decoded rows ``run_id``'s job reads."""
    from streaming import membership

    def decode(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for b in decode_record_batches(batches):
            yield membership.read(b, run_id)
    return decode
