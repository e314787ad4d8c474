"""The join on the executors (``streaming.executors``), its tasks called here as Spark's would call them: the same
run gives the local job's windows and summary, also when every task's state is lost and the driver restarts."""
import os

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from core.rundir import RunPaths
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
    task = executors.partition_task(store.paths, store.cfg, batch_id, plan.verdicts)

    def attempts(i):  # a failed task is tried again, up to spark.task.maxFailures (4) times
        for n in range(4):
            try:
                return task((pa.scalar(i, pa.int32()),), data.filter(pa.array(jp == i)))
            except OSError:
                if n == 3:
                    raise
    out = pa.concat_tables([attempts(i) for i in range(P)])
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
    caches = []
    for i, t in enumerate(_batches(23)):
        if i == restart_at:
            executors._STATES.clear()
            store = executors.ClusterRunStore(root, cfg)
        result = _cluster_batch(store, t, i)
        caches.append(result.info["join_cache"])
    assert result.finished
    # every task after the first batch found its state in its worker, but after the restart: those redid the batches
    # after the last snapshot (every 10 batches)
    assert [c["hits"] for c in caches[1:]] == [0 if i == restart_at else P for i in range(1, 23)], caches
    assert sum(c["redone_batches"] for c in caches) == (P * ((restart_at - 1) % 10) if restart_at else 0), caches
    windows, summary = _figures(root)
    pd.testing.assert_frame_equal(windows, local[0])
    assert summary == local[1]
    # the archive holds every record once, in a folder per batch, readable as the local archive is
    archived = sum(pq.read_table(f"{root}/archive/batch-{i:08d}.parquet").num_rows for i in range(23))
    assert archived == sum(t.num_rows for t in _batches(23))


def test_a_run_resumed_another_way_is_refused_in_one_line(tmp_path):
    # the join state lives where the run started: on the executors in P partitions, or in the driver's snapshots
    on, off = str(tmp_path / "on"), str(tmp_path / "off")
    assert executors.check_layout(RunPaths(on), True, 4) is None and executors.check_layout(RunPaths(on), True, 4) is None
    assert "--join-partitions 4" in executors.check_layout(RunPaths(on), True, 8)
    assert "--join-on executors" in executors.check_layout(RunPaths(on), False, 4)
    assert executors.check_layout(RunPaths(off), False, 1) is None and executors.check_layout(RunPaths(off), False, 2) is None  # re-split
    assert "--join-on driver" in executors.check_layout(RunPaths(off), True, 4)
    old = tmp_path / "old"  # a run folder from before: a driver snapshot and no layout file
    (old / "state" / "snap-00000010").mkdir(parents=True)
    assert "--join-on driver" in executors.check_layout(RunPaths(str(old)), True, 4)


def _run_cluster(root, batches, replay=False, restart_at=()):
    cfg = engine.EngineConfig(run_id=SPEC.run_id, join_partitions=P)
    store = executors.ClusterRunStore(root, cfg, archive=not replay)
    executors._STATES.clear()
    result = None
    for i, t in enumerate(batches):
        if i in restart_at:
            executors._STATES.clear()  # every worker lost: the tasks rebuild from snapshots and the archive's parts
        result = _cluster_batch(store, t, i)
    return result


def test_a_replay_on_executors_whose_workers_lose_their_state_gives_the_local_results(tmp_path, local):
    """A replay (no archive of its own in the driver) on a cluster: a task on a worker without the partition's state
    rebuilds it from the parts every task writes, empty ones too; before, a missing part read as an empty batch."""
    root = str(tmp_path / "x")
    assert _run_cluster(root, _batches(23), replay=True, restart_at=(5, 12, 13, 21)).finished
    windows, summary = _figures(root)
    pd.testing.assert_frame_equal(windows, local[0])
    assert summary == local[1]
    for b in range(23):  # a part per partition per batch, records or not
        assert sorted(os.listdir(f"{root}/archive/batch-{b:08d}.parquet")) == ["p-0.parquet", "p-1.parquet", "p-2.parquet",
                                                                           "run.parquet"]


def test_python_workers_never_reused_give_the_local_results(tmp_path, local):
    """``spark.python.worker.reuse=false``: every task in a new Python worker, with no state kept from the one
    before; each rebuilds its partition from the last snapshot and the archived parts after it."""
    root = str(tmp_path / "x")
    assert _run_cluster(root, _batches(23), restart_at=range(23)).finished
    windows, summary = _figures(root)
    pd.testing.assert_frame_equal(windows, local[0])
    assert summary == local[1]


def test_a_task_retried_after_a_partial_write_gives_the_local_results(tmp_path, local, monkeypatch):
    """A task killed half way through its writes (batch 10 of partition 1: its part and its state in the worker
    written, its snapshot half), then tried again by Spark in the same worker: the retry takes neither the dead
    attempt's state (it is after the batch, not before it) nor its half snapshot, and the run gives the local
    job's figures."""
    root = str(tmp_path / "x")
    save, killed = executors._save_snapshot, []

    def killed_half_way(root_, jp, batch_id, state):
        if (jp, batch_id) == (1, 10) and not killed:
            half = executors.unique_tmp(os.path.join(root_.joins(jp), f"snap-{batch_id:08d}"))
            os.makedirs(half)
            with open(os.path.join(half, "known.parquet"), "wb") as f:
                f.write(b"PAR1")  # the first bytes of a file never finished
            killed.append(batch_id)
            raise OSError("the executor was killed")
        save(root_, jp, batch_id, state)
    monkeypatch.setattr(executors, "_save_snapshot", killed_half_way)
    assert _run_cluster(root, _batches(23)).finished and killed == [10]
    windows, summary = _figures(root)
    pd.testing.assert_frame_equal(windows, local[0])
    assert summary == local[1]
    executors._STATES.clear()  # and a worker that rebuilds partition 1 from its snapshot of batch 20 gets it whole
    assert len(executors._state_before(RunPaths(root), engine.EngineConfig(run_id=SPEC.run_id, join_partitions=P), 1, 23)[0].known) > 0


def _cluster_run(root: str, batches: list) -> executors.ClusterRunStore:
    """A run's store on executors, its ``batches`` run through a worker that held nothing before."""
    store = executors.ClusterRunStore(root, engine.EngineConfig(run_id=SPEC.run_id, join_partitions=P))
    executors._STATES.clear()
    for i, t in enumerate(batches):
        _cluster_batch(store, t, i)
    return store


def test_a_missing_part_is_an_error_that_names_it_not_an_empty_batch(tmp_path):
    root = str(tmp_path / "x")
    batches = _batches(23)
    store = _cluster_run(root, batches[:14])
    os.remove(f"{root}/archive/batch-00000012.parquet/p-1.parquet")  # not shared, or not visible yet (NFS)
    executors._STATES.clear()
    with pytest.raises(FileNotFoundError, match=r"join partition 1 cannot be rebuilt: batch 12's part .*p-1.parquet is "
                                                r"missing \(is the run folder on storage every executor shares"):
        _cluster_batch(store, batches[14], 14)


def test_a_task_on_a_host_without_the_run_folder_fails_in_one_line_and_writes_nothing(tmp_path):
    """The volume taken away from the task's host mid-run: its worker still holds the partition's state, yet the
    task neither carries on nor writes its part to the host's own disk; it names the host and the folder (Spark runs
    it on another executor)."""
    import shutil
    import socket

    root = str(tmp_path / "x")
    batches = _batches(3)
    store = _cluster_run(root, batches[:2])
    assert any(k[0] == root for k in executors._STATES)  # the worker holds the state of batch 1
    shutil.rmtree(root)  # as the host sees it once the volume is gone: the mount point, empty
    os.makedirs(tmp_path / "x")
    task = executors.partition_task(RunPaths(root), store.cfg, 2, None)  # the check comes before anything else
    with pytest.raises(executors.RunFolderGone, match=rf"^run folder {root} is not on host {socket.gethostname()} "
                                                      r"\(no run.json there\): the volume .* taken away from this host"):
        task((pa.scalar(0, pa.int32()),), batches[2])
    assert os.listdir(root) == []


def test_two_attempts_of_a_task_neither_remove_nor_overwrite_each_others_files(tmp_path, monkeypatch):
    """Speculation or a zombie task: two attempts of one partition's step, in containers whose PIDs are the same,
    write the same batch's snapshot and part at once. Both finish; the snapshot is one attempt's, whole; no
    temporary file is left; a task that loads the snapshot meanwhile never finds it missing."""
    import threading

    from streaming.state import JoinState

    monkeypatch.setattr(os, "getpid", lambda: 1)  # the same PID in every container
    root = str(tmp_path / "x")
    paths = RunPaths(root)
    state = JoinState()
    table = _batches(3)[0]
    errors, loaded = [], []
    stop = threading.Event()

    def attempt():
        try:
            for _ in range(20):
                executors._save_snapshot(paths, 0, 10, state)
                executors._write_part(paths, 10, 0, table)
        except Exception as e:  # noqa: BLE001 - what the test looks for
            errors.append(e)

    def reader():
        while not stop.is_set():
            if os.path.isdir(paths.joins(0) + "/snap-00000010"):
                loaded.append(executors._load_snapshot(paths, 0, 10))

    threads = [threading.Thread(target=attempt) for _ in range(2)]
    r = threading.Thread(target=reader)
    r.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    r.join()
    assert not errors, errors
    assert loaded  # read while the attempts wrote, never missing
    assert sorted(os.listdir(paths.joins(0))) == ["snap-00000010"]
    assert sorted(os.listdir(f"{root}/archive/batch-00000010.parquet")) == ["p-0.parquet"]
    assert pq.read_table(f"{root}/archive/batch-00000010.parquet/p-0.parquet").num_rows == table.num_rows


def test_a_worker_keeps_only_its_current_runs_states():
    from streaming.state import JoinState

    executors._STATES.clear()
    executors.keep("/runs/a", 0, 5, JoinState())
    executors.keep("/runs/a", 1, 5, JoinState())
    executors.keep("/runs/b", 0, 0, JoinState())  # the same worker, the next run's job
    assert set(executors._STATES) == {("/runs/b", 0)}


def test_a_task_names_its_host_and_executor_folder():
    """Every executor pod has the same working folder: the host (the pod's name) tells them apart."""
    import socket

    assert executors.executor_name() == f"{socket.gethostname()}:{os.getcwd()}"


def test_a_worker_keeps_its_states_within_its_bound_and_drops_those_that_cannot_serve_again():
    """Stale states go (two batches old: a task takes the state of the batch just before its own), then the ones used
    longest ago while over the bound; the state kept now stays whatever its size; what it did is counted."""
    import numpy as np
    import pandas as pd

    from streaming.state import JoinState

    def state(n: int) -> JoinState:
        ids = [f"loadgen-{i:08d}" for i in range(n)]
        known = pd.DataFrame({"sent_ns": np.arange(n, dtype=np.int64), "intended_ns": np.arange(n, dtype=np.int64),
                              "errored": np.zeros(n, bool), "recv_ns": np.zeros(n, np.int64),
                              "dup_ns": np.full(n, -1, np.int64), "acked": np.zeros(n, bool),
                              "status": np.zeros(n, np.int8), "id": pd.Series(ids, dtype=object)},
                             index=pd.Index(np.arange(n, dtype=np.uint64), name="event_id"))
        return JoinState(known=known)

    one = state(10_000).nbytes()
    assert 10_000 * (8 * 5 + 1 + 1 + 8 + 50) <= one <= 10_000 * 130  # arrays, index, the ID strings
    executors._STATES.clear()
    assert executors.keep("/runs/a", 0, 7, state(10_000), bound=10 * one) == {"held_bytes": one, "evicted": 0}
    executors.keep("/runs/a", 1, 7, state(10_000), bound=10 * one)
    executors.keep("/runs/a", 2, 8, state(10_000), bound=10 * one)
    # partition 0 is used again at batch 8: the longest unused is now partition 1
    executors.keep("/runs/a", 0, 8, state(10_000), bound=10 * one)
    assert list(executors._STATES) == [("/runs/a", 1), ("/runs/a", 2), ("/runs/a", 0)]
    got = executors.keep("/runs/a", 3, 8, state(10_000), bound=int(2.5 * one))  # over the bound: 1 then 2 go
    assert got == {"held_bytes": 2 * one, "evicted": 2} and list(executors._STATES) == [("/runs/a", 0), ("/runs/a", 3)]
    got = executors.keep("/runs/a", 4, 10, state(30_000), bound=one)  # batch 10: those of 8 cannot serve; a big one stays
    assert got["evicted"] == 2 and list(executors._STATES) == [("/runs/a", 4)] and got["held_bytes"] > one
    assert executors._state_before(RunPaths("/runs/a"), None, 4, 11)[1] is None  # still served from the worker
