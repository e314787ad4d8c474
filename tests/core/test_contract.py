"""The telemetry contract: round trips, one schema for every consumer."""
import dataclasses

import pytest
from pyspark.sql.pandas.types import from_arrow_schema

from core import contract
from streaming.decode import DECODED_SCHEMA, decode_messages

T = 1_800_000_000_000_000_000

RECORDS = [
    contract.Send("r", "sender-0", T, event_id="sender-0-1", intended_at_ns=T - 5, bytes_out=2048, worker=3),
    contract.Send("r", "sender-0", T, event_id="sender-0-3", intended_at_ns=T - 5, bytes_out=2048, worker=3,
                  acked_at_ns=T + 30, status=202),
    contract.Receive("r", "receiver-0", T + 10, event_id="sender-0-1", bytes_in=2048),
    contract.Ack("r", "sender-0", T + 20, event_id="sender-0-1", sent_at_ns=T, status=503, error=None),
    contract.Ack("r", "sender-0", T + 20, event_id="sender-0-2", sent_at_ns=T, error="connection refused"),
    contract.NodeSample("r", "node-metrics", T, node="n1", metric="cpu_utilization", value=0.75),
    contract.NodeSample("r", "node-metrics", T, node="n1", metric="cpu_utilization", missing=True),
    contract.OomEvent("r", "oom", T, source="cgroup", where="n1:/leak", count=1),
    contract.RunStart("r", "loadgen", T, config='{"rate": 5000}'),
    contract.RunStop("r", "loadgen", T, reason="completed"),
    contract.Heartbeat("r", "job", T),
    contract.TelemetryHeld(contract.ANY_RUN, "receiver-http", T, count=9_000, value=5.4),
]


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: r.KIND)
def test_wire_round_trip(record):
    # every kind survives encode -> strict decode unchanged
    assert contract.decode(contract.encode([record])) == [record]


def test_batch_round_trip_through_the_job_decoder():
    # the Arrow decoder the job uses gives back every field of every kind, none quarantined
    table = decode_messages([contract.encode(RECORDS)], [0], [7])
    assert table.column("quarantine_reason").null_count == table.num_rows
    rows = table.to_pylist()
    for record, row in zip(RECORDS, rows):
        expected = record.to_dict()
        assert {k: row[k] for k in expected} == expected
        assert row["src_offset"] == 7


def test_schema_is_derived_not_retyped():
    # the union schema holds exactly the dataclasses' fields, and Spark's schema derives from it
    names = {f.name for t in contract.RECORD_TYPES for f in __import__("dataclasses").fields(t)} | {"v", "kind"}
    assert set(contract.ARROW_SCHEMA.names) == names
    spark_schema = from_arrow_schema(DECODED_SCHEMA)
    assert spark_schema.fieldNames() == DECODED_SCHEMA.names
    assert all(r.to_dict()["v"] == contract.SCHEMA_VERSION for r in RECORDS)


def test_failure_rule():
    assert contract.is_failure(503, None) and contract.is_failure(None, "timeout")
    assert not contract.is_failure(202, None) and not contract.is_failure(None, None)


@pytest.mark.parametrize("status,error", [(202, None), (503, None), (None, "timeout"), (None, 'odd "cause"\n'), (None, None)])
def test_fast_lines_equal_the_record_encoding(status, error):
    # the load generator's hot-path formatter writes exactly what the dataclasses encode to
    fast = contract.FastLines('run "q"', "loadgen-1")
    send = contract.Send('run "q"', "loadgen-1", T, event_id="loadgen-7", intended_at_ns=T - 3, bytes_out=2048, worker=1)
    ack = contract.Ack('run "q"', "loadgen-1", T + 9, event_id="loadgen-7", sent_at_ns=T, status=status, error=error)
    assert contract.encode([fast.send(T, "loadgen-7", T - 3, 2048, 1)]) == contract.encode([send])
    assert contract.encode([fast.ack(T + 9, "loadgen-7", T, status, error)]) == contract.encode([ack])
    assert contract.decode(contract.encode([fast.ack(T + 9, "loadgen-7", T, status, error)])) == [ack]
    # a send written with its answer
    held = dataclasses.replace(send, acked_at_ns=T + 9, status=status, error=error)
    line = fast.send_acked(T, "loadgen-7", T - 3, 2048, 1, T + 9, status, error)
    assert contract.encode([line]) == contract.encode([held]) and contract.decode(contract.encode([line])) == [held]
    # with the route it was sent to (a pair, a binding), alone and with its answer
    routed = dataclasses.replace(send, route=7)
    assert contract.encode([fast.send(T, "loadgen-7", T - 3, 2048, 1, 7)]) == contract.encode([routed])
    line = fast.send_acked(T, "loadgen-7", T - 3, 2048, 1, T + 9, status, error, 7)
    assert contract.decode(contract.encode([line])) == [dataclasses.replace(held, route=7)]


@pytest.mark.parametrize("run_id", ['r"1', "plain", "100%d", "ü"])
@pytest.mark.parametrize("event_id", ["loadgen-3", 'q"uote', "back\\slash", "tab\t", "é-ü", "a/b", "", "%s%d"])
def test_fast_receive_line_equals_the_record_encoding(run_id, event_id):
    fast = contract.FastLines("", "receiver-kafka")
    for _ in range(2):  # the second time from the per-run cache
        rec = contract.Receive(run_id, "receiver-kafka", T, event_id=event_id, bytes_in=2048)
        assert contract.encode([fast.recv(run_id, T, event_id, 2048)]) == contract.encode([rec])
        # where it arrived: a queue and the key it was published with, an address and its pair, a topic's partition
        for dest, route, key in ((event_id or "q", 3, 'fw."3"'), ("orders", 0, None), (None, None, None), ("/", None, None)):
            where = dataclasses.replace(rec, dest=dest, route=route, key=key)
            line = fast.recv(run_id, T, event_id, 2048, fast.where(dest, route, key))
            assert contract.encode([line]) == contract.encode([where]) and contract.decode(contract.encode([line])) == [where]


def test_a_message_acknowledged_a_second_or_more_after_it_was_sent_is_said_held():
    from core.held import HELD_S, held_record

    assert held_record("receiver-http", T, 100, now_ns=T + int(HELD_S * 1e9) - 1) is None
    line = held_record("receiver-http", T, 100, now_ns=T + 5_400_000_000)
    assert contract.decode(line) == [contract.TelemetryHeld(contract.ANY_RUN, "receiver-http", T, count=100, value=5.4)]

