"""The join on the executors (``streaming.executors``), its tasks called here as Spark's would call them: the same
run gives the local job's windows and summary, also when every task's state is lost and the driver restarts."""
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from loadgen.synthetic import SyntheticSpec, generate, messages
from runs import results
from streaming import engine, executors, join
from streaming.decode import decode_messages
from streaming.sinks import RunStore

SPEC = SyntheticSpec(run_id="x", duration_s=20, rate_per_sec=300, pause=(8.0, 2.0), late_count=3, oom_at_s=(12.5,))
P = 3


def _batches(n):
    msgs = messages(generate(SPEC), 50)
    chunks = np.array_split(np.arange(len(msgs)), n)
    return [decode_messages([msgs[i][1] for i in ch], [0] * len(ch), list(ch)) for ch in chunks if len(ch)]


def _cluster_batch(store, table, batch_id):
    """What ``cluster_sink`` has Spark do: read tasks summarize their parts, the driver plans, a task per partition
    (an empty one too: every partition settles every batch), the driver finishes."""
    parts = [table.slice(i, 700) for i in range(0, table.num_rows, 700)]
    summary = pa.concat_tables([b for part in parts for b in
                                [pa.Table.from_batches(list(executors.summarize_batches(SPEC.run_id)(part.to_batches())),
                                                       schema=executors.SUMMARY_SCHEMA)]])
    plan = store.plan_batch(summary, batch_id)
    _, data = join.summarize(table, SPEC.run_id)
    jp = join.partition_of(engine.rules.id_hash(data["event_id"].to_numpy(zero_copy_only=False)), P)
    task = executors.partition_task(store.paths.root, store.cfg, batch_id, plan.verdicts, store.archive)
    out = pa.concat_tables([task((pa.scalar(i, pa.int32()),), data.filter(pa.array(jp == i))) for i in range(P)])
    return store.finish_batch(plan, out, batch_id, 0.0)


def _figures(root):
    windows = results.load_windows(root)
    return windows.drop(columns=["first_written_ns", "last_written_ns"]), {
        k: v for k, v in results.summarize(root, windows).items() if k not in ("computed_at_ns",)}


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("local") / "x")
    store = RunStore(root, engine.EngineConfig(run_id=SPEC.run_id))
    for i, t in enumerate(_batches(23)):
        store.process_batch(t, i)
    return _figures(root)


@pytest.mark.parametrize("restart_at", [None, 7, 15])
def test_the_join_on_executors_gives_the_local_results_also_after_state_is_lost(tmp_path, local, restart_at):
    # a restart: every worker's state gone and a new driver; the tasks and the driver come back from their snapshots
    # (every 10 batches) and the batches after them (the archive's parts, the driver's kept inputs)
    root = str(tmp_path / "x")
    cfg = engine.EngineConfig(run_id=SPEC.run_id, join_partitions=P)
    store = executors.ClusterRunStore(root, cfg)
    executors._STATES.clear()
    for i, t in enumerate(_batches(23)):
        if i == restart_at:
            executors._STATES.clear()
            store = executors.ClusterRunStore(root, cfg)
        result = _cluster_batch(store, t, i)
    assert result.finished
    windows, summary = _figures(root)
    pd.testing.assert_frame_equal(windows, local[0])
    assert summary == local[1]
    # the archive holds every record once, in a folder per batch, readable as the local archive is
    archived = sum(pq.read_table(f"{root}/archive/batch-{i:08d}.parquet").num_rows for i in range(23))
    assert archived == sum(t.num_rows for t in _batches(23))


def test_a_run_resumed_another_way_is_refused_in_one_line(tmp_path):
    # the join state lives where the run started: on the executors in P partitions, or in the driver's snapshots
    on, off = str(tmp_path / "on"), str(tmp_path / "off")
    assert executors.check_layout(on, True, 4) is None and executors.check_layout(on, True, 4) is None
    assert "--join-partitions 4" in executors.check_layout(on, True, 8)
    assert "--join-on executors" in executors.check_layout(on, False, 4)
    assert executors.check_layout(off, False, 1) is None and executors.check_layout(off, False, 2) is None  # re-split
    assert "--join-on driver" in executors.check_layout(off, True, 4)
    old = tmp_path / "old"  # a run folder from before: a driver snapshot and no layout file
    (old / "state" / "snap-00000010").mkdir(parents=True)
    assert "--join-on driver" in executors.check_layout(str(old), True, 4)
