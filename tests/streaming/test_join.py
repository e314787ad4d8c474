"""Join partitions (``streaming.join``): event IDs split by hash, each partition joined on its own, the run-level
rules on the driver. The results must not depend on the number of partitions P, nor on a run resumed with another P."""
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from loadgen.synthetic import SyntheticSpec, generate, messages
from runs import results
from streaming import engine, join
from streaming.decode import decode_messages
from streaming.sinks import RunStore
from streaming.state import JoinState

SPEC = SyntheticSpec(run_id="p", duration_s=20, rate_per_sec=300, pause=(8.0, 2.0), late_count=3, oom_at_s=(12.5,))
WALL_CLOCK_KEYS = ("computed_at_ns",)
"""Summary fields that say when it was computed, not what was measured."""


def _batches(msgs, n):
    chunks = np.array_split(np.arange(len(msgs)), n)
    return [decode_messages([msgs[i][1] for i in ch], [0] * len(ch), list(ch)) for ch in chunks if len(ch)]


def _run(tmp_path, name, batches, partitions_by_batch):
    """Process the batches through a RunStore, with P given per batch (a restart between two Ps: a new store)."""
    root, store, last_p = str(tmp_path / name), None, None
    for i, (table, p) in enumerate(zip(batches, partitions_by_batch)):
        if p != last_p:  # a job restarted with another P: it recovers from the snapshot and the archive
            store, last_p = RunStore(root, engine.EngineConfig(run_id=SPEC.run_id, join_partitions=p)), p
        store.process_batch(table, i)
    windows = results.load_windows(root)
    summary = results.summarize(root, windows)
    return windows, {k: v for k, v in summary.items() if k not in WALL_CLOCK_KEYS}


@pytest.fixture(scope="module")
def msgs():
    return messages(generate(SPEC), 50)


def test_the_same_run_with_1_2_and_8_join_partitions_gives_identical_windows_and_summary(tmp_path, msgs):
    # drops, duplicates, errors, late receives, a 2 s pause (a gap), an OOM kill and malformed records, in 9 batches
    batches = _batches(msgs, 9)
    got = {p: _run(tmp_path, f"p{p}", batches, [p] * len(batches)) for p in (1, 2, 8)}
    windows_1, summary_1 = got[1]
    assert summary_1["sent"] == len(generate(SPEC).event_id) and summary_1["dropped"] > 0 and summary_1["gaps"]
    for p in (2, 8):
        pd.testing.assert_frame_equal(got[p][0], windows_1)
        assert got[p][1] == summary_1


def test_a_run_resumed_with_another_number_of_partitions_gives_the_same_results(tmp_path, msgs):
    # 1 partition for three batches, 8 for three (the state re-split from the snapshot), then 2
    batches = _batches(msgs, 9)
    windows_1, summary_1 = _run(tmp_path, "one", batches, [1] * 9)
    windows, summary = _run(tmp_path, "mixed", batches, [1, 1, 1, 8, 8, 8, 2, 2, 2])
    pd.testing.assert_frame_equal(windows, windows_1)
    assert summary == summary_1


@pytest.mark.parametrize("num_partitions", [1, 2, 3, 8])
def test_split_puts_every_send_ack_and_receive_in_its_ids_partition_once(num_partitions, msgs):
    table = _batches(msgs, 1)[0]
    _, data = join.summarize(table, SPEC.run_id)
    parts = join.split(data, num_partitions)
    assert sum(p.num_rows for p in parts) == data.num_rows
    for i, part in enumerate(parts):
        ids = part["event_id"].to_numpy(zero_copy_only=False)
        # every record of one ID in one partition: the partition its hash names, the hash kept in KEY
        assert (join.partition_of(engine.rules.id_hash(ids), num_partitions) == i).all()
        assert np.array_equal(part[join.KEY].to_numpy(), engine.rules.id_hash(ids))
    if num_partitions > 1:  # and spread: no partition holds more than twice its share
        assert max(p.num_rows for p in parts) < 2 * data.num_rows / num_partitions


def test_summaries_of_parts_of_a_batch_say_what_the_summary_of_the_whole_says(msgs):
    # the driver's view: every record but this run's valid sends, acks and receives, and of those per kind and agent
    # the first and last stamp with their count; read tasks summarize their parts, which concatenate
    table = _batches(msgs, 1)[0]
    whole, data = join.summarize(table, SPEC.run_id)
    parts = [join.summarize(table.slice(i, 5000), SPEC.run_id)[0] for i in range(0, table.num_rows, 5000)]
    df = data.to_pandas()
    truth = df.groupby(["kind", "agent"])["at_ns"].agg(["min", "max", "count"])
    for summary in (whole, pa.concat_tables(parts)):
        stamps = summary.filter(summary[join.NUM_RECORDS].is_valid()).to_pandas()  # (at_ns is null on malformed rows)
        got = stamps.groupby(["kind", "agent"]).agg(min=("at_ns", "min"), max=("at_ns", "max"), count=(join.NUM_RECORDS, "sum"))
        pd.testing.assert_frame_equal(got.astype(np.int64), truth.astype(np.int64))
        assert summary[join.NUM_RECORDS].null_count == table.num_rows - data.num_rows
    assert data.num_rows > 0.9 * table.num_rows and set(df["kind"]) == set(join.DATA_KINDS)


def test_repartition_keeps_every_id_and_orphan_once():
    keys = np.arange(1, 1001, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    known = pd.DataFrame({"sent_ns": np.arange(1000), "intended_ns": 0, "errored": False, "recv_ns": -1, "dup_ns": -1, "acked": False,
                          "status": np.int8(0), "id": [f"e{i}" for i in range(1000)]},
                         index=pd.Index(keys, dtype=np.uint64, name="event_id"))
    orphans = pd.DataFrame({"event_id": keys[:10], "at_ns": np.arange(10), "id": "o"})
    joins = join.repartition([JoinState(known=known, orphans=orphans)], 8)
    assert sorted(np.concatenate([j.known.index.to_numpy() for j in joins]).tolist()) == sorted(keys.tolist())
    assert sum(len(j.orphans) for j in joins) == 10
    back = join.repartition(joins, 1)[0]
    assert len(back.known) == 1000 and set(back.known["id"]) == set(known["id"])
    assert len(back.orphans) == 10
