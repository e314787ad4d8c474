"""Stopping only what the stack started: a PID file records PID, start time and name, and a PID that names another
process now (after a reboot, or once PIDs wrap) is never signalled; `make clean` refuses while anything still runs
from the state it would remove. Real processes (sleep), a stack folder of the test's own."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from support import ROOT

from core.procs import pid_from_file, write_pid_file


def _sleeper():
    return subprocess.Popen(["sleep", "60"], start_new_session=True)


def _stack(tmp_path, *args):
    env = dict(os.environ, PYTHONPATH=ROOT, FLIGHTWATCH_STACK_DIR=str(tmp_path / "stack"),
               FLIGHTWATCH_CHECKPOINTS=str(tmp_path / "checkpoints"))
    return subprocess.run([sys.executable, "-m", "stack", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=60)


def test_a_pid_file_names_one_process_only(tmp_path):
    p = _sleeper()
    try:
        path = str(tmp_path / "x.pid")
        write_pid_file(path, p.pid)
        pid, started, name = open(path).read().split()
        assert int(pid) == p.pid and name == "sleep" and float(started) > time.time() - 60
        assert pid_from_file(path) == p.pid
        for text in (f"{p.pid}\n", f"{p.pid} {float(started) - 3600:.3f} sleep\n", f"{p.pid} {started} prometheus\n"):
            open(path, "w").write(text)  # an older file, another start time, another program: not ours
            assert pid_from_file(path) is None, text
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
    write_pid_file(path, os.getpid())
    open(path, "w").write(open(path).read().replace(str(os.getpid()), str(p.pid), 1))  # a dead PID
    assert pid_from_file(path) is None and pid_from_file(str(tmp_path / "none.pid")) is None


def test_down_never_signals_a_pid_that_names_another_process_now(tmp_path):
    (tmp_path / "stack").mkdir()
    stranger, ours = _sleeper(), _sleeper()
    try:
        write_pid_file(str(tmp_path / "stack" / "prometheus.pid"), stranger.pid)  # after a reboot: its PID reused
        text = (tmp_path / "stack" / "prometheus.pid").read_text().split()
        (tmp_path / "stack" / "prometheus.pid").write_text(f"{text[0]} {float(text[1]) - 86400:.3f} {text[2]}\n")
        write_pid_file(str(tmp_path / "stack" / "ui.pid"), ours.pid)
        r = _stack(tmp_path, "down")
        assert r.returncode == 0, r.stderr
        assert "prometheus         not running (its PID file names no process of ours now: nothing signalled)" in r.stdout
        assert f"ui                 stopped (pid {ours.pid})" in r.stdout
        assert stranger.poll() is None and ours.wait(10) == -signal.SIGTERM
        assert not list((tmp_path / "stack").glob("*.pid"))
    finally:
        for p in (stranger, ours):
            if p.poll() is None:
                os.kill(p.pid, signal.SIGKILL)
                p.wait()


def test_clean_is_refused_while_the_stack_runs_and_removes_its_state_after(tmp_path):
    run = tmp_path / "checkpoints" / "r1"
    run.mkdir(parents=True)
    (tmp_path / "stack").mkdir()
    p = _sleeper()
    try:
        write_pid_file(str(tmp_path / "stack" / "telemetry-broker.pid"), p.pid)
        r = _stack(tmp_path, "clean")
        assert r.returncode == 2 and r.stderr.startswith(f"stack: error: still running: telemetry-broker (pid {p.pid});")
        assert run.exists() and (tmp_path / "stack").exists()
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
    r = _stack(tmp_path, "clean")
    assert r.returncode == 0 and not run.exists() and not (tmp_path / "stack").exists(), r.stderr
    assert (tmp_path / "checkpoints").exists()  # the folder stays, its runs go


def test_a_long_named_program_is_known_from_its_first_moment(tmp_path):
    """The kernel keeps 15 characters of a name; psutil completes a longer one from the command line, but right after
    the start it gave the short one for the node exporter (``prometheus-node``), so the second `make up` did not
    know it again ("port taken"). The stack's node exporter, recorded at once, as `up` records it."""
    import shutil

    from core.procs import free_port

    p = subprocess.Popen([shutil.which("prometheus-node-exporter"), f"--web.listen-address=127.0.0.1:{free_port()}",
                          "--no-collector.systemd"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        write_pid_file(str(tmp_path / "x.pid"), p.pid)
        time.sleep(1)
        assert pid_from_file(str(tmp_path / "x.pid")) == p.pid
        pid, started, name = (tmp_path / "x.pid").read_text().split()
        (tmp_path / "x.pid").write_text(f"{pid} {started} {name[:15]}\n")  # as recorded in the first moment
        assert name.startswith("prometheus-node") and pid_from_file(str(tmp_path / "x.pid")) == p.pid
    finally:
        p.kill()
        p.wait()
