"""Parse, validate, quarantine: bad lines are set aside with a reason, good lines in the same message kept."""
import pytest

from core import contract
from streaming.decode import decode_messages

T = 1_800_000_000_000_000_000
GOOD = contract.encode([contract.Receive("r", "rx", T, event_id="e1")])

CASES = [
    # (bad line, expected reason)
    (b"{not json", "not json"),
    (b"[1,2]", "not a json object"),
    (b'"text"', "not a json object"),
    (b'{"v":1,"kind":"recv","run_id":"r","agent":"a","at_ns":"soon","event_id":"e"}', "field at_ns: wrong type str"),
    (b'{"v":1,"kind":"recv","run_id":"r","agent":"a","at_ns":1.5,"event_id":"e"}', "field at_ns: wrong type float"),
    (b'{"v":1,"kind":"recv","run_id":"r","agent":"a","at_ns":true,"event_id":"e"}', "field at_ns: wrong type bool"),
    (b'{"v":1,"kind":"recv","run_id":"r","agent":"a","at_ns":99999999999999999999999,"event_id":"e"}', "field at_ns: wrong type int"),
    (b'{"v":2,"kind":"recv","run_id":"r","agent":"a","at_ns":1800000000000000000,"event_id":"e"}', "unsupported schema version"),
    (b'{"v":1,"kind":"warp","run_id":"r","agent":"a","at_ns":1800000000000000000}', "unknown kind"),
    (b'{"v":1,"kind":"recv","run_id":"r","agent":"a","at_ns":1800000000000000000}', "recv: missing event_id"),
    (b'{"v":1,"kind":"send","run_id":"r","agent":"a","at_ns":1800000000000000000,"event_id":"e"}', "send: missing intended_at_ns"),
    (b'{"v":1,"kind":"recv","run_id":"r","agent":"a","at_ns":-1,"event_id":"e"}', "field at_ns: out of range"),
    (b'{"v":1,"kind":"recv","run_id":"r","agent":"a","at_ns":9000000000000000000,"event_id":"e"}', "field at_ns: out of range"),
    (b'{"v":1,"kind":"recv","run_id":"r","agent":"a","at_ns":1800000000000000000,"event_id":"e","bytes_in":-4}', "field bytes_in: negative"),
    (b'{"v":1,"kind":"recv","run_id":"r","agent":"a","at_ns":1800000000000000000,"event_id":""}', "empty event_id"),
]


@pytest.mark.parametrize("line,reason", CASES)
def test_bad_line_is_quarantined_with_reason(line, reason):
    table = decode_messages([GOOD + b"\n" + line, GOOD], [0, 1], [5, 6])
    rows = table.to_pylist()
    bad = [r for r in rows if r["quarantine_reason"]]
    good = [r for r in rows if not r["quarantine_reason"]]
    assert [r["quarantine_reason"] for r in bad] == [reason]
    assert bad[0]["raw"] and bad[0]["src_offset"] == 5
    assert len(good) == 2 and {r["event_id"] for r in good} == {"e1"}


def test_unknown_fields_are_ignored_and_empty_messages_are_harmless():
    line = b'{"v":1,"kind":"recv","run_id":"r","agent":"a","at_ns":1800000000000000000,"event_id":"e","extra":{"x":1}}'
    table = decode_messages([line, b"", None], [0, 0, 0], [1, 2, 3])
    assert table.num_rows == 1 and table.column("quarantine_reason").null_count == 1


@pytest.mark.parametrize("body,reason", [
    # each of these crashed pyarrow 26's JSON reader (SIGSEGV) or slipped through it; found by tests/system/test_fuzz.py
    (b'null\n{"v":1,"kind":"heartbeat","run_id":"r","agent":"a","at_ns":1800000000000000000}', "not a json object"),
    (b' \tnull', "not a json object"),
    (b'{"v":1,"kind":"heartbeat","run_id":"r","agent":"a","at_ns":' + b"[" * 30000 + b"1" + b"]" * 30000 + b"}", "not json"),
    (b'{"v":1,"kind":"node","run_id":"*","agent":"n","at_ns":1800000000000000000,"node":"a","metric":"m","value":Infinity}',
     "field value: not a finite number"),
    (b'{"v":1,"kind":"node","run_id":"*","agent":"n","at_ns":1800000000000000000,"node":"a","metric":"m","value":NaN}',
     "field value"),
])
def test_inputs_that_crashed_the_arrow_reader_are_quarantined(body, reason):
    good = b'{"v":1,"kind":"heartbeat","run_id":"r","agent":"a","at_ns":1800000000000000001}'
    t = decode_messages([body, good], [0, 0], [1, 2])
    bad = t.filter(t["quarantine_reason"].is_valid())
    assert bad.num_rows == 1 and bad["quarantine_reason"][0].as_py().startswith(reason), bad.to_pylist()
    assert t.num_rows - bad.num_rows == body.count(b"\n") + 1  # the other lines of the body, and the good message


def test_a_line_longer_than_the_readers_block_is_decoded_whole():
    """Arrow's reader takes the batch in blocks (``decode._READ_OPTIONS``); a line longer than a block is no error: it
    comes out whole, with every other record of the batch, none quarantined."""
    from streaming import decode

    config = "x" * (decode._READ_OPTIONS.block_size + 4096)
    big = contract.encode([contract.RunStart("r", "loadgen", T, config=config)])
    t = decode_messages([GOOD + b"\n" + big, GOOD], [0, 0], [1, 2])
    assert t["kind"].to_pylist() == ["recv", "run_start", "recv"]
    assert t["quarantine_reason"].null_count == 3 and t["config"][1].as_py() == config
