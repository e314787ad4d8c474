"""The run's streaming job, started by ``--stream`` beside the attack: start it and wait for its first batch, then
wait for it to close the run and print its figures."""
from __future__ import annotations

import json
import os
import sys
import time

from core import html_report, links, output, settings
from core.output import Lifecycle
from core.procs import tcp_unreachable
from core.rundir import CHECKPOINTS, ROOT, RunPaths
from loadgen import report
from loadgen.run import telemetry_marker
from transports.errors import UsageError


def start_job(cfg, drop_timeout: str | None = None):
    """The streaming job for this run, in the background (it stops by itself once the run is closed);
    ``drop_timeout``: the job's (``--drop-timeout``), else its default."""
    import subprocess

    paths = RunPaths.of_run(cfg.run_id, CHECKPOINTS)
    run_dir = paths.root
    os.makedirs(run_dir, exist_ok=True)
    log = open(paths.job_log, "ab")
    # from the topic's end: the run has not started, and the embedded telemetry broker keeps every earlier run
    # (after five runs at 5,000/s, reading them back held the first batch for 37 s); a restarted job resumes
    # from its checkpoint, not from here
    job = subprocess.Popen([sys.executable, "-m", "streaming", "run", "--run", cfg.run_id, "--bootstrap",
                            cfg.telemetry_bootstrap, "--topic", cfg.telemetry_topic, "--starting-offsets", "latest",
                            *(["--drop-timeout", drop_timeout] if drop_timeout else [])],
                           cwd=ROOT, stdout=log,
                           stderr=subprocess.STDOUT, env=dict(os.environ, PYTHONPATH=ROOT), start_new_session=True)
    print(f"streaming job: pid {job.pid}, results in {run_dir} (log job.log); waiting for it to start ...", flush=True)
    # Spark's start-up takes a core for ~10 s, and its first batch with records in it 3-6 s more (the source's
    # Python workers start, the first Arrow batches cross to the driver): released after the first batch, the load
    # met that second one, and its windows were headlined observer-bound. The attack starts once the job has
    # processed a batch of this run's heartbeats (written here meanwhile): the same path, no figure of the run's.
    # (The driver's own first time, imports and kernels, is 0.06 s: a synthetic batch through it bought nothing.)
    from core import contract

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and job.poll() is None:
        telemetry_marker(cfg, contract.Heartbeat(cfg.run_id, cfg.sender, time.time_ns()))
        if warm(paths.batches):
            break
        time.sleep(1.0)
    if job.poll() is not None:
        raise UsageError(f"the streaming job exited (code {job.returncode}); see {run_dir}/job.log")
    ui_port = int(settings.get("FLIGHTWATCH_UI_PORT", "18501"))
    if tcp_unreachable("127.0.0.1", ui_port, 0.5) is None:
        print(f"dashboard: {links.dashboard(run=cfg.run_id)}", flush=True)
    else:
        print("dashboard: not running (make ui)", flush=True)
    return job


def warm(batches: str) -> bool:
    """Whether the job has processed a batch with records in it (its manifests in ``batches``)."""
    try:
        names = sorted(os.listdir(batches))
    except FileNotFoundError:
        return False
    for name in names:
        try:
            with open(os.path.join(batches, name)) as f:
                if json.load(f).get("num_records", 0) > 0:
                    return True
        except (OSError, ValueError):  # written as we read it: the next look sees it whole
            continue
    return False


def wait_job(cfg, job, drop_timeout: str | None = None) -> output.Summary | None:
    """The run's summary once its job has closed it (it waits its drop timeout past the last send, then some); None,
    said, if it has not within 90 s more."""
    import subprocess

    from core.units import duration_text, parse_duration_ns

    drop_ns = parse_duration_ns(drop_timeout or "30s")
    print(f"waiting for the streaming job to close the run (drop timeout {duration_text(drop_ns)}) ...", flush=True)
    try:
        job.wait(drop_ns / 1e9 + 90)
    except subprocess.TimeoutExpired:
        print(f"streaming job still running (pid {job.pid}); see `make summary RUN={cfg.run_id}` later")
        return None
    paths = RunPaths.of_run(cfg.run_id, CHECKPOINTS)
    run_dir, summary_file = paths.root, paths.summary_file
    if os.path.exists(summary_file):  # written by the job when it closed the run
        with open(summary_file) as f:
            s = json.load(f)
    elif os.path.exists(paths.run_file):  # the read side computes it from the run folder
        from runs import results

        s = json.loads(json.dumps(results.summarize(run_dir), default=str))
    else:
        print(f"streaming job: no run folder at {run_dir}; see its job.log")
        return None
    if s.get("state") == Lifecycle.WAITING:
        print("streaming job: no windows written; see its job.log")
        return None
    lat = s[output.LATENCY]
    print(f"flight time (sender -> receiver): sent {s['sent']:,} received {s['received']:,} dropped {s['dropped']:,} "
          f"duplicates {s['duplicates']:,} late {s['late']:,} errors {s['errors']:,}; latency p50 {report._ms(lat['p50'])} "
          f"p90 {report._ms(lat['p90'])} p99 {report._ms(lat['p99'])} max {report._ms(lat['max'])}; gaps {len(s['gaps'])}")
    print(f"ledger: {output.ledger_text(s)}" + (f" (duplicates {s['duplicates']:,} and orphan receives "
                                                f"{s['orphan_receives']:,} beside it)" if s.get("duplicates") or
                                               s.get("orphan_receives") else ""))
    if m := s.get("measured"):
        lat = m[output.LATENCY]
        print(f"measured ({m['num_windows']} windows, warm-up {m['warmup_s']:g} s and cool-down {m['cooldown_s']:g} s "
              f"left out): sent {m['sent']:,} received {m['received']:,}; latency p50 {report._ms(lat['p50'])} "
              f"p90 {report._ms(lat['p90'])} p99 {report._ms(lat['p99'])} max {report._ms(lat['max'])}")
    v = s.get("verdict") or {}
    if v.get("message"):
        knee = v.get("knee")
        print(f"verdict: {v['message']}" + (f"; knee {knee['rate']:,.0f}/s" if knee else ""))
    html_report.write(run_dir)
    return s
