"""A test as a file (``flightwatch run FILE.toml``, ``core.testfile``): every key is one of the attack's flags,
``${VAR}`` comes from the environment, secrets are files next to it, and anything wrong is ``FILE:LINE: ...``, exit 2,
before anything starts. The examples are run for real by ``tests/system/test_secure_amqp.py`` (RabbitMQ)."""
from __future__ import annotations

import glob
import os
import subprocess
import sys

import pytest
from support import ROOT
from support.certs import make_certs

from core import testfile

EXAMPLES = sorted(glob.glob(os.path.join(ROOT, "examples", "*.toml")))


def test_every_broker_and_an_http_sink_has_an_example_and_each_reads_whole(tmp_path, monkeypatch):
    assert [os.path.basename(p) for p in EXAMPLES] == ["artemis.toml", "http.toml", "kafka.toml", "rabbitmq.toml"]
    for name in ("rabbitmq", "kafka", "artemis"):
        (tmp_path / f"{name}.pw").write_text("s3cret\n")
        monkeypatch.setenv(f"{name.upper()}_PASSWORD_FILE", str(tmp_path / f"{name}.pw"))
    ca = make_certs(str(tmp_path / "certs")).ca
    monkeypatch.setenv("CA_FILE", ca)
    for path in EXAMPLES:
        flags = testfile.load(path)
        given = dict(zip(flags[::2], flags[1::2]))
        assert given["--rate"] == "2000" and given["--duration"] == "30s" and "--fail-on" in flags, (path, flags)
        assert "s3cret" not in " ".join(flags)  # a secret stays in its file
    rabbit = testfile.load(os.path.join(ROOT, "examples", "rabbitmq.toml"))
    assert rabbit[:4] == ["--target", f"amqps://fw@localhost:5671/orders?queue=orders&cafile={ca}",
                          "--target-password", f"@{tmp_path / 'rabbitmq.pw'}"]
    kafka = testfile.load(os.path.join(ROOT, "examples", "kafka.toml"))
    assert "sasl.password=@" + str(tmp_path / "kafka.pw") in kafka and "security.protocol=SASL_SSL" in kafka


@pytest.mark.parametrize("text, error", [
    ('rate = 100\nduraton = "10s"\n', ":2: unknown key 'duraton': one of title,"),
    ('target = "kafka://h:1/t"\nrate = "fast"\n', ":2: rate = 'fast': a number more than 0"),
    ('rate = true\n', ":1: rate = True: a whole number or a number or a string (events per second)"),
    ('rate = 0\n', ":1: rate = '0': a number more than 0"),
    ('rate = 10\nduration = "ten seconds"\n', ":2: duration = 'ten seconds': "),
    ('target = "kafka://${NO_SUCH_VAR_HERE}/t"\n', ":1: ${NO_SUCH_VAR_HERE} is not set (set it, or write"),
    ('target = "amqp://h/%2F"\n', ":1: target = 'amqp://h/%2F': bad target"),
    ('receivers = "some"\n', ":1: receivers = 'some': auto, none, or a number of receivers (1 to 32)"),
    ('receivers = 0\n', ":1: receivers = '0': auto, none, or a number of receivers (1 to 32)"),
    ('fail_on = ["p99 > soon"]\n', ":1: fail_on = 'p99 > soon': bad fail_on"),
    ('rate = 10\n\n[kafka_options]\nacks = "all"\n"sasl.password" = "@missing.pw"\n',
     ":5: the secret's file "),
    ('rate = [10\n', ":1: not TOML: "),
    ('target = "amqps://fw@h/%2F?queue=q"\npassword = "hunter2"\n', ":2: password: write @FILE, a file that holds it"),
    ('rate = 10\n[kafka_options]\n"sasl.password" = "hunter2"\n', ":3: sasl.password: write @FILE"),
    ('no_stack = "yes"\n', ":1: no_stack = 'yes': true or false"),
])
def test_anything_wrong_is_named_by_its_line_before_anything_starts(tmp_path, text, error):
    path = tmp_path / "checkout.toml"
    path.write_text(text)
    from transports.registry import TargetSpec

    with pytest.raises(testfile.FileError) as e:
        testfile.load(str(path), TargetSpec.parse)  # as flightwatch run checks it: the load generator's own parser
    assert str(e.value).startswith(str(path) + ":") and error in str(e.value), str(e.value)


def test_flightwatch_run_says_it_in_one_line_and_exit_2(tmp_path):
    path = tmp_path / "checkout.toml"
    path.write_text('title = "checkout"\nrate = 2000\nduration = "30s"\nwarmpu = "5s"\n')
    r = subprocess.run([sys.executable, "-m", "flightwatch", "run", str(path)], cwd=ROOT, capture_output=True,
                       text=True, timeout=60, env=dict(os.environ, PYTHONPATH=ROOT))
    assert r.returncode == 2 and r.stdout == "", r.stdout
    assert r.stderr.strip() == f"flightwatch: error: {path}:4: unknown key 'warmpu': one of " + ", ".join(testfile.KEYS)
    h = subprocess.run([sys.executable, "-m", "flightwatch", "run", "--help"], cwd=ROOT, capture_output=True, text=True,
                       timeout=60, env=dict(os.environ, PYTHONPATH=ROOT))
    assert h.returncode == 0 and all(f"  {key} " in h.stdout for key in testfile.KEYS)


def test_a_files_flags_come_first_so_that_flags_after_it_override(tmp_path, monkeypatch):
    from flightwatch.cli import argv_of

    path = tmp_path / "t.toml"
    path.write_text('target = "kafka://h:1/t"\nrate = 2000\nreceivers = "none"\n')
    cmd = argv_of("attack", [*testfile.load(str(path)), "--rate", "50"])
    assert cmd.index("--rate") < len(cmd) - 2 and cmd[-2:] == ["--rate", "50"] and "--no-receiver" in cmd
    path.write_text('target = "kafka://h:1/t"\nrate = "${RATE:-2000}"\nreceivers = 3\n')
    monkeypatch.setenv("RATE", "750")
    assert testfile.load(str(path)) == ["--target", "kafka://h:1/t", "--rate", "750", "--receiver", "auto",
                                        "--receivers", "3"]


MATRIX = os.path.join(ROOT, "scenarios", "kafka-matrix.toml")


def _scenario(tmp_path, extra: str) -> str:
    """A copy of the Kafka matrix's file with ``extra`` keys first: a user's own scenario."""
    path = tmp_path / "my-matrix.toml"
    path.write_text(extra + open(MATRIX).read())
    return str(path)


def test_a_scenario_is_a_test_file_with_axes_whose_test_keys_set_every_cells_attack(tmp_path):
    """One language: a scenario file takes a test's keys for every cell (checked as a test's are), its own
    ``title``, ``pace``, ``warmup``, ``cooldown`` and ``drop_timeout`` mean what a test's do, and it loads by its
    path (``flightwatch scenario FILE``, ``flightwatch run FILE``)."""
    from flightwatch.cli import run_file
    from scenarios import spec

    path = _scenario(tmp_path, 'workers = 1\ntimeout = "5s"\nfail_on = ["success<100%"]\n')
    sc = spec.load(path, short=True)
    assert sc.name == "my-matrix" and sc.path == path and [c["payload"] for c in sc.cells()] == [1024, 1024]
    assert sc.attack == ("--workers", "1", "--timeout", "5s", "--fail-on", "success<100%")
    assert run_file(path, ["--short"]) == ("scenario", [path, "--short"])  # flightwatch run: the scenario's run
    assert spec.load("kafka-matrix").attack == ()  # the seeds' own files set nothing more


@pytest.mark.parametrize("extra, error", [
    ('fail_on = ["p99 > soon"]\n', ":1: fail_on = 'p99 > soon': bad fail_on"),
    ('workers = 0\n', ":1: workers = '0': a number of processes, or auto"),
    ('payload = 512\n', ":1: payload is an axis of this scenario: each cell has its own"),
    ('label = "v2"\nrate = 100\n', ":2: unknown key 'rate': a scenario's own ("),
    ('probe_timeout = "soon"\n', ":1: probe_timeout = 'soon': "),
])
def test_a_wrong_scenario_file_is_named_by_its_line_before_anything_starts(tmp_path, extra, error):
    path = _scenario(tmp_path, extra)
    r = subprocess.run([sys.executable, "-m", "flightwatch", "run", path, "--short"], cwd=ROOT, capture_output=True,
                       text=True, timeout=60, env=dict(os.environ, PYTHONPATH=ROOT))
    assert r.returncode == 2 and r.stdout == "" and len(r.stderr.strip().splitlines()) == 1, r.stdout + r.stderr
    assert r.stderr.startswith(f"scenarios: error: {path}:") and error in r.stderr, r.stderr


def test_flightwatch_run_help_lists_a_scenarios_keys_too():
    h = subprocess.run([sys.executable, "-m", "flightwatch", "run", "--help"], cwd=ROOT, capture_output=True, text=True,
                       timeout=60, env=dict(os.environ, PYTHONPATH=ROOT))
    assert h.returncode == 0 and all(f"  {key} " in h.stdout for key in testfile.SCENARIO_KEYS)
    assert "A file with [axes] is a scenario in the same language" in h.stdout
