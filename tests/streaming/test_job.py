"""Bad input to the job's command line: one line on stderr, exit code 2, no traceback."""
import json
import time

import pytest
from support import free_port, run_job

CASES = [
    # (arguments, words the one-line error must contain)
    (["run", "--run", "x", "--bogus"], "unrecognized arguments"),
    (["run"], "required"),
    (["run", "--run", "x", "--drop-timeout", "soon"], "bad duration"),
    (["run", "--run", "x", "--window", "7s"], "divide"),
    (["run", "--run", "x", "--max-offsets-per-trigger", "0"], "positive"),
    (["run", "--run", "x", "--join-partitions", "0"], "--join-partitions must be between 1 and"),
    (["run", "--run", "x", "--join-partitions", "many"], "invalid int value"),
    (["run", "--run", "x", "--join-cache", "lots"], "bad size"),
    (["frobnicate"], "invalid choice"),
    (["run", "--run", "x", "--bootstrap", "localhost"], "HOST:PORT"),
    (["run", "--run", "x", "--kafka-option", "sasl_plain_password=@/nonexistent/pw"], "cannot read /nonexistent/pw"),
    (["summary", "--run", "no-such-run", "--checkpoints", "/nonexistent"], "no run at"),
    (["replay", "--run", "no-such-run", "--checkpoints", "/nonexistent"], "nothing to replay"),
]


@pytest.mark.parametrize("args,words", CASES, ids=[" ".join(a) for a, _ in CASES])
def test_bad_flags(args, words):
    proc = run_job(*args, timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in proc.stderr


def test_unreachable_bootstrap():
    port = free_port()  # nothing listens there
    proc = run_job("run", "--run", "x", "--bootstrap", f"127.0.0.1:{port}", "--wait", "0s", timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert lines == [f"flightwatch streaming: error: the telemetry broker 127.0.0.1:{port} unreachable: Connection refused "
                     "(start it with `make up`)"], proc.stderr


@pytest.mark.integration
def test_a_topic_awaited_but_never_created_is_one_line_after_the_wait(broker):
    """On Kubernetes the job waits for the Topic Operator's topic instead of creating it (with replication 1)."""
    from kafka import KafkaAdminClient

    t0 = time.monotonic()
    proc = run_job("run", "--run", "x", "--bootstrap", broker, "--topic", "tel-never-created", "--await-topic",
                   "--wait", "2s", timeout=60)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and lines == ["flightwatch streaming: error: topic tel-never-created unreachable: "
                                              "not created yet, after waiting 2s"], proc.stderr
    assert "waiting for topic tel-never-created (not created yet)" in proc.stdout and time.monotonic() - t0 < 30
    admin = KafkaAdminClient(bootstrap_servers=broker)
    assert "tel-never-created" not in admin.list_topics()  # it waited; it did not create it
    admin.close()


def test_help_explains():
    proc = run_job("run", "--help", timeout=60)
    assert proc.returncode == 0 and "--drop-timeout" in proc.stdout and "--bootstrap" in proc.stdout
    proc = run_job("replay", "--help", timeout=60)
    assert proc.returncode == 0 and "--drop-timeout" in proc.stdout and "replay-<settings>" in proc.stdout


@pytest.mark.parametrize("flags,words", [(["--window", "7s"], "divide"), (["--drop-timeout", "soon"], "bad duration")])
def test_a_recomputation_with_settings_that_cannot_work_gives_one_line(tmp_path, flags, words):
    """The run's own drop timeout (30 s) with --window 7s, checked once the run's settings are read."""
    (tmp_path / "r" / "archive").mkdir(parents=True)
    (tmp_path / "r" / "run.json").write_text(json.dumps({"run_id": "r", "window_ns": 10**9, "drop_timeout_ns": 30 * 10**9}))
    proc = run_job("replay", "--run", "r", "--checkpoints", str(tmp_path), *flags, timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in proc.stderr
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == ["archive", "run.json"]  # nothing written


AGENT_CASES = [
    # (module, arguments, words the error line must contain); the usage line argparse prints is allowed
    ("agents.receiver", ["http", "--listen", "nope"], "bad --listen"),
    ("agents.receiver", ["http", "--workers", "0"], "at least 1"),
    ("agents.receiver", ["http", "--head-timeout", "soon"], "--head-timeout: bad duration"),
    ("agents.receiver", ["http", "--body-timeout", "0s"], "--body-timeout must be more than 0"),
    ("agents.receiver", ["http", "--max-connections", "0"], "--max-connections must be at least 1"),
    ("agents.receiver", ["http", "--bogus"], "unrecognized arguments"),
    ("agents.receiver", ["kafka", "--bootstrap", "127.0.0.1:{free}", "--wait", "0s"], "the SUT broker 127.0.0.1:"),
    ("agents.receiver", ["kafka", "--wait", "soon"], "--wait: bad duration"),
    ("agents.node_metrics", ["--telemetry-bootstrap", "127.0.0.1:{free}", "--wait", "1s"], "unreachable: Connection refused, after waiting 1s"),
    ("agents.node_metrics", ["--interval", "0s"], "too short"),
    ("agents.node_metrics", ["--interval", "x"], "bad duration"),
    ("agents.node_metrics", ["--cgroup", "/nonexistent"], "not a directory"),
    ("agents.node_metrics", ["--pid", "999999999"], "no such process"),
    ("agents.clock", ["probe", "nohostport"], "HOST:PORT"),
    ("loadgen", ["attack", "--rate", "10", "--duration", "1s", "--telemetry-bootstrap", "localhost"], "HOST:PORT"),
    ("agents.receiver", ["http", "--listen", "127.0.0.1:{free}", "--telemetry-bootstrap", "localhost"], "HOST:PORT"),
    ("agents.receiver", ["kafka", "--telemetry-bootstrap", "localhost"], "HOST:PORT"),
    ("agents.node_metrics", ["--telemetry-bootstrap", "localhost"], "HOST:PORT"),
]


@pytest.mark.parametrize("module,args,words", AGENT_CASES, ids=[f"{m} {' '.join(a)}" for m, a, _ in AGENT_CASES])
def test_agents_bad_flags(module, args, words):
    import subprocess
    import sys

    from support import ROOT

    args = [a.format(free=free_port()) for a in args]
    proc = subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.strip().splitlines() if not ln.startswith("usage:")]
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in proc.stderr


@pytest.mark.parametrize("module,args,flag", [("agents.receiver", ["http", "--help"], "--spool-dir"),
                                              ("agents.receiver", ["kafka", "--help"], "--state-dir"),
                                              ("agents.node_metrics", ["--help"], "--prometheus"),
                                              ("agents.shipper", ["ship", "--help"], "--spool-dir")])
def test_agents_help(module, args, flag):
    import subprocess
    import sys

    from support import ROOT

    proc = subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and flag in proc.stdout


@pytest.mark.integration
def test_a_job_started_before_its_broker_waits_then_processes_the_run(tmp_path):
    """As on a cluster that is still starting: the broker appears 3 s after the job; the job, backing off, then
    creates its topic and reads a synthetic run written there, whose sends it counts exactly."""
    import subprocess

    from support import ROOT, job_command, job_env

    from core.procs import stop_process
    from loadgen.synthetic import SyntheticSpec, generate, produce
    from stack.tansu import start_tansu

    port = free_port()
    bootstrap = f"127.0.0.1:{port}"
    job = subprocess.Popen(job_command("run", "--run", "late-job", "--bootstrap", bootstrap, "--topic", "tel-late",
                                       "--checkpoints", str(tmp_path), "--available-now", "--wait", "90s"),
                           cwd=ROOT, env=job_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    broker = None
    try:
        said = []  # the broker is started only once the job says it waits for it (a busy machine starts it slowly)
        while not any(f"waiting for the telemetry broker {bootstrap} (Connection refused)" in line for line in said):
            line = job.stdout.readline()
            assert line, "".join(said)  # the job ended instead of waiting
            said.append(line)
        assert job.poll() is None, "".join(said)  # still waiting
        broker = start_tansu(port, open(tmp_path / "tansu.log", "wb"), "flightwatch-late-job")
        deadline = time.monotonic() + 60
        from kafka import KafkaAdminClient

        admin = KafkaAdminClient(bootstrap_servers=bootstrap)
        while "tel-late" not in admin.list_topics():  # the job created it once it reached the broker
            assert time.monotonic() < deadline and job.poll() is None
            time.sleep(0.2)
        admin.close()
        run = generate(SyntheticSpec(run_id="late-job", duration_s=5, rate_per_sec=100, drop_timeout_s=5, pause=None,
                                     oom_at_s=(), num_malformed=0))
        produce(run, bootstrap, "tel-late")
        out = "".join(said) + job.communicate(timeout=240)[0]
    finally:
        if job.poll() is None:
            stop_process(job, group=True)
        if broker is not None:
            stop_process(broker)
    assert job.returncode == 0, out[-3000:]
    assert f"waiting for the telemetry broker {bootstrap} (Connection refused)" in out
    from runs import results

    sent = sum(int(r.get("sent", 0)) for r in results.load_windows(str(tmp_path / "late-job")).to_dict("records"))
    assert sent == run.sent_ns.size == 500


@pytest.mark.integration
def test_a_second_driver_on_a_run_folder_refuses_in_one_line(tmp_path, broker):
    """The first driver holds the folder's lease (here, this test's process): a second job on it exits 2, naming who
    holds it, and has written nothing there."""
    import os

    from core.rundir import DriverLease

    lease = DriverLease.take(str(tmp_path / "held"))
    before = sorted(os.listdir(tmp_path / "held"))
    try:
        proc = run_job("run", "--run", "held", "--checkpoints", str(tmp_path), "--bootstrap", broker, "--wait", "5s",
                       timeout=120)
    finally:
        lease.release()
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert f"is in use by another driver (pid {os.getpid()} on host " in lines[0], lines
    assert sorted(os.listdir(tmp_path / "held")) == before


@pytest.mark.integration
def test_a_run_resumed_with_other_settings_is_refused_naming_its_own(tmp_path, broker):
    from core.rundir import RunPaths, write_json
    from streaming.state import EngineConfig

    write_json(RunPaths(str(tmp_path / "r")).run_file, EngineConfig("r", window_ns=500_000_000).settings())
    proc = run_job("run", "--run", "r", "--checkpoints", str(tmp_path), "--bootstrap", broker, "--wait", "5s",
                   "--drop-timeout", "30s", timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and lines == [
        "flightwatch streaming: error: run r was started with --window 500ms, not --window 1s: resume it with its own "
        "settings, or recompute it with others (python -m streaming replay, into a folder of its own)"], proc.stderr
