"""Writers of time-sliced telemetry stay light after the job deletes the slices they wrote into: on a real Tansu broker,
real writer processes (the HTTP receiver's shipper, and a ``TelemetryWriter`` as the node-metrics agent and the load
generator hold one) measured with psutil over the 30 s that follow the deletions."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest
from support import ROOT, create_topic, free_port

from agents.spool import SpoolWriter
from core.procs import stop_process
from core.slices import parse_slice
from stack.tansu import start_tansu

SLICE_S = 10
IDLE_CORES = 0.02
"""The most a writer may use, caught up, over the 30 s after its slices were deleted."""
MEASURE_S = 30
WRITE_S = 15
"""The writers write for this long, into 2 slices and those created ahead, then go idle; measured for ``MEASURE_S``
after (the last slice created ahead ends at most 20 s after the writes: 10 s of the measure at least follow the last
deletion). With 25 s of writes and 40 s of measure, the test held a worker of `make test` for 73 s (issue 62)."""

_WRITER = """
import sys, time
from core import contract, logs
from core.kafka_options import telemetry_producer
from core.slices import TelemetryTopic
from core.telemetry import TelemetryWriter

logs.setup("idle-writer")
bootstrap, base = sys.argv[1], sys.argv[2]
topic = TelemetryTopic.for_broker(base, bootstrap)
writer = TelemetryWriter(telemetry_producer(bootstrap, **topic.producer_settings()), topic, agent="idle-writer")
end = time.time() + float(sys.argv[3])
while time.time() < end:  # a record a second, as the node-metrics agent writes, then caught up and idle
    writer.write(contract.Heartbeat("idle", "idle-writer", time.time_ns()))
    time.sleep(1.0)
print("writes done", flush=True)
time.sleep(3600)
"""


def _slices(admin, base: str) -> list[str]:
    return sorted(t for t in admin.list_topics(timeout=5).topics if parse_slice(base, t))


@pytest.mark.integration
def test_writers_whose_slices_were_deleted_stay_idle_and_log_it_at_most_once(tmp_path):
    """Two writers write into 10 s slices for 15 s, then go idle; the test deletes every slice whose end has passed,
    as the job does once it has archived one, for the next 30 s (the last slice created ahead ends at most 20 s after
    the writes, so at least 10 s of that is after the last deletion). Over those 30 s each writer uses at most 0.02 core
    (kafka-python's producers spun ~0.6 core each, forever, in ``ClusterMetadata._refresh_loop``) and its log names a
    deleted slice at most once (kafka-python logged ~50 ERROR lines a second)."""
    from confluent_kafka.admin import AdminClient

    port, base = free_port(), "tel-idle"
    bootstrap = f"127.0.0.1:{port}"
    broker = start_tansu(port, open(tmp_path / "tansu.log", "wb"), "flightwatch-idle")
    env = dict(os.environ, PYTHONPATH=ROOT, FLIGHTWATCH_TELEMETRY_SLICE=f"{SLICE_S}s")
    procs: dict[str, subprocess.Popen] = {}
    try:
        create_topic(bootstrap, base, partitions=2)
        spool_dir = tmp_path / "spool"
        spool = SpoolWriter(str(spool_dir), segment_bytes=1 << 20)
        for name, cmd in (("shipper", [sys.executable, "-m", "agents.shipper", "ship", "--spool-dir", str(spool_dir),
                                       "--bootstrap", bootstrap, "--topic", base, "--agent", "idle-shipper"]),
                          ("writer", [sys.executable, "-c", _WRITER, bootstrap, base, str(WRITE_S)])):
            procs[name] = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=open(tmp_path / f"{name}.log", "wb"),
                                           stderr=subprocess.STDOUT)
        t_end = time.monotonic() + WRITE_S
        i = 0
        while time.monotonic() < t_end:  # the HTTP receiver's lines, ten a second
            spool.append('{"v":1,"kind":"heartbeat","run_id":"idle","agent":"idle-shipper","at_ns":%d,"i":%d}'
                         % (time.time_ns(), i))
            i += 1
            time.sleep(0.1)
        spool.close()
        admin = AdminClient({"bootstrap.servers": bootstrap, "allow.auto.create.topics": False})
        written = _slices(admin, base)
        assert len(written) >= 3, written  # the writers wrote into (and created ahead) at least 3 slices
        time.sleep(2)
        deleted: set[str] = set()
        ps = {n: psutil.Process(p.pid) for n, p in procs.items()}
        cpu0 = {n: sum(p.cpu_times()[:2]) for n, p in ps.items()}
        t0 = time.monotonic()
        while time.monotonic() - t0 < MEASURE_S:  # delete each slice once its end has passed, as the job does
            now = time.time()
            gone = [t for t in _slices(admin, base) if sum(parse_slice(base, t)) <= now and t not in deleted]
            if gone:
                for f in admin.delete_topics(gone, request_timeout=5).values():
                    f.result(10)
                deleted.update(gone)
            time.sleep(1.0)
        took = time.monotonic() - t0
        cores = {n: (sum(p.cpu_times()[:2]) - cpu0[n]) / took for n, p in ps.items()}
        for p in procs.values():
            assert p.poll() is None, "a writer died"
        logs = {n: (tmp_path / f"{n}.log").read_text(errors="replace") for n in procs}
        mentions = {n: sum(1 for line in text.splitlines() if any(t in line for t in deleted)) for n, text in logs.items()}
        print(f"\n{len(deleted)} slices deleted over {took:.0f} s; cores {cores}; log lines naming them {mentions}")
        assert set(written) <= deleted  # every slice they wrote into (or created ahead) was deleted meanwhile
        for n in procs:
            assert cores[n] <= IDLE_CORES, (n, cores[n], logs[n][-3000:])
            assert mentions[n] <= 1, (n, logs[n][-3000:])
    finally:
        for p in procs.values():
            stop_process(p, wait_s=5)
        stop_process(broker)
