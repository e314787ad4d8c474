"""One driver per run folder (``core.rundir.DriverLease``): a second is refused while the first lives, also from
another process; a kill -9 lets the lease go; a driver whose lease another took over writes nothing more."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import pyarrow as pa
import pytest

from core.rundir import ROOT, DriverLease, LeaseHeld, LeaseLost, RunPaths, ids_in

HOLD = """
import sys, time
from core.rundir import DriverLease
lease = DriverLease.take(sys.argv[1])
print(lease.token, flush=True)
time.sleep(600)
"""


def _holder(root: str) -> tuple[subprocess.Popen, str]:
    p = subprocess.Popen([sys.executable, "-c", HOLD, root], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                         env=dict(os.environ, PYTHONPATH=ROOT))
    return p, p.stdout.readline().strip()


def test_a_second_driver_is_refused_until_the_first_is_killed(tmp_path):
    root = str(tmp_path / "run")
    proc, token = _holder(root)
    try:
        assert token.startswith("1-")
        with pytest.raises(LeaseHeld, match=rf"in use by another driver \(pid {proc.pid} on host "):
            DriverLease.take(root)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    lease = DriverLease.take(root)  # the kernel let the lock go with the process
    assert lease.token.startswith("2-")
    lease.check()
    lease.release()


def test_a_driver_whose_lease_was_taken_over_writes_nothing_more(tmp_path):
    """The folder made again under a live driver (its lock went with the old file): the new driver's token is in the
    file, and the old driver's next batch stops before its first write."""
    from streaming.sinks import RunStore
    from streaming.state import EngineConfig

    root = str(tmp_path / "run")
    old = DriverLease.take(root)
    store = RunStore(root, EngineConfig("run"), lease=old)
    os.remove(RunPaths(root).lease_file)
    new = DriverLease.take(root)
    assert new.token.startswith("1-") and new.token != old.token  # a count from 1 again, and a nonce of its own
    with pytest.raises(LeaseLost, match="another driver took run folder"):
        store.process_batch(pa.table({}), 0)
    assert ids_in(RunPaths(root).archive) == [] and ids_in(RunPaths(root).batches) == []
    new.check()
    old.release()
    new.release()


def test_a_driver_whose_run_folder_is_gone_from_its_host_stops_in_one_line_before_writing(tmp_path):
    """The volume taken away from the driver's host mid-run: its next batch stops before its first write, and the
    error says the folder is gone from this host, not that another driver took it."""
    import shutil
    import socket

    from streaming.sinks import RunStore
    from streaming.state import EngineConfig

    root = str(tmp_path / "run")
    lease = DriverLease.take(root)
    store = RunStore(root, EngineConfig("run"), lease=lease)
    shutil.rmtree(root)
    os.makedirs(root)  # the mount point, empty
    with pytest.raises(LeaseLost, match=rf"^run folder {root} is gone from host {socket.gethostname()} \(no "
                                        r"driver.lease there\): removed, or its volume taken away"):
        store.process_batch(pa.table({}), 0)
    assert os.listdir(root) == []
    lease.release()

