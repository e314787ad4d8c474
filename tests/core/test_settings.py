"""One table of every FLIGHTWATCH_* setting (``core.settings``): the code, the Makefile, the manifests and the
documentation agree with it. A setting read anywhere and not in the table fails; one in the table that nothing reads
fails; the documentation's table is the one ``python -m core.settings`` prints (generated at every build)."""
from __future__ import annotations

import glob
import os
import re

from support import ROOT

from core.settings import SETTINGS, markdown

PLACES = ["agents", "core", "transports", "loadgen", "streaming", "stack", "bench", "ui"]


def _read_names() -> dict[str, set[str]]:
    files = [f for d in PLACES for f in glob.glob(os.path.join(ROOT, d, "**", "*.py"), recursive=True)
             if not f.endswith(os.path.join("core", "settings.py"))]
    files += [os.path.join(ROOT, "Makefile"), *glob.glob(os.path.join(ROOT, "deploy", "**", "*.yaml"), recursive=True),
              os.path.join(ROOT, "deploy", "spark-entrypoint.sh")]
    found: dict[str, set[str]] = {}
    for f in files:
        for name in re.findall(r"FLIGHTWATCH_[A-Z0-9_]*[A-Z0-9]", open(f).read()):
            found.setdefault(name, set()).add(os.path.relpath(f, ROOT))
    return found


def test_every_setting_read_is_in_the_table_and_every_one_in_it_is_read():
    found = _read_names()
    assert not set(found) - set(SETTINGS), {n: sorted(found[n]) for n in set(found) - set(SETTINGS)}
    assert not set(SETTINGS) - set(found), set(SETTINGS) - set(found)


def test_the_documentation_has_the_table():
    """The settings page is generated: its table is ``python -m core.settings`` at every build of the site."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("generated", os.path.join(ROOT, "docs", "hooks", "generated.py"))
    generated = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generated)
    page = open(os.path.join(ROOT, "docs", "reference", "settings.md")).read()
    assert markdown() in generated.expand(page), "the settings page does not show `python -m core.settings`"


def _options(parser) -> set[str]:
    """Every option string of ``parser`` and of its subcommands."""
    import argparse

    out: set[str] = set()
    for action in parser._actions:
        out.update(action.option_strings or [action.dest])
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                out |= _options(sub)
    return out


def _parsers() -> dict[str, set[str]]:
    """Each component's flags, as the table names components."""
    from agents import node_metrics, receiver
    from loadgen.__main__ import build_parser as loadgen_parser
    from stack import deploy, image
    from stack.__main__ import _parser as stack_parser
    from streaming.cli import build_parser as job_parser

    rec = receiver._parser()
    sub = next(a for a in rec._actions if a.__class__.__name__ == "_SubParsersAction").choices
    return {"job": _options(job_parser()), "HTTP receiver": _options(sub["http"]),
            "Kafka receiver": _options(sub["kafka"]), "node metrics": _options(node_metrics._parser()),
            "load generator": _options(loadgen_parser()), "stack": _options(stack_parser()),
            "deploy": _options(deploy.parser()), "image": _options(image.parser())}


def test_every_setting_is_a_flag_and_named_after_it(monkeypatch):
    from core.settings import Setting, regular

    assert all(SETTINGS[n].flag for n in SETTINGS), [n for n in SETTINGS if not SETTINGS[n].flag]
    assert all(regular(n) for n in SETTINGS), [(n, SETTINGS[n].flag) for n in SETTINGS if not regular(n)]
    # the earlier names were not their flags'
    monkeypatch.setitem(SETTINGS, "FLIGHTWATCH_JOB_METRICS", Setting("--metrics-listen (job)", "", ""))
    monkeypatch.setitem(SETTINGS, "FLIGHTWATCH_OOM_CGROUPS", Setting("--cgroup", "", ""))
    assert not regular("FLIGHTWATCH_JOB_METRICS") and not regular("FLIGHTWATCH_OOM_CGROUPS")


def test_every_flag_the_table_names_is_in_its_components_help():
    """``--x (component)``: in that component's parser; ``--x``: in some component's; the process-wide settings: in
    every long-lived component's."""
    from core.settings import PROCESS_WIDE

    parsers = _parsers()
    missing = []
    for name, s in SETTINGS.items():
        for entry in re.split(r", (?=--)", s.flag):
            flag, _, where = entry.partition(" (")
            components = [c.strip() for c in where.rstrip(")").split(",")] if where else []
            known = [c for c in components if c in parsers] or list(parsers)
            if not any(flag.strip() in parsers[c] for c in known) or (
                    components and any(c in parsers and flag.strip() not in parsers[c] for c in components)):
                missing.append((name, entry))
    for name in PROCESS_WIDE:
        flag = SETTINGS[name].flag
        missing += [(name, c) for c in ("job", "HTTP receiver", "Kafka receiver", "node metrics", "load generator")
                    if flag not in parsers[c]]
    assert not missing, missing


def _variable_reads(path: str) -> list[int]:
    """Lines of ``path`` that read a FLIGHTWATCH_ variable from the environment: ``os.environ.get(...)``,
    ``os.environ[...]``, ``os.getenv(...)``, ``... in os.environ``, by name or through a module constant."""
    import ast

    tree = ast.parse(open(path).read())
    names = {t.id for n in tree.body if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
             and str(n.value.value).startswith("FLIGHTWATCH_") for t in n.targets if isinstance(t, ast.Name)}

    def environ(e) -> bool:
        return isinstance(e, ast.Attribute) and e.attr == "environ"

    lines = []
    for n in ast.walk(tree):
        key = None
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.args and (
                (n.func.attr == "get" and environ(n.func.value)) or n.func.attr == "getenv"):
            key = n.args[0]
        elif isinstance(n, ast.Subscript) and environ(n.value) and isinstance(n.ctx, ast.Load):
            key = n.slice
        elif isinstance(n, ast.Compare) and len(n.comparators) == 1 and environ(n.comparators[0]):
            key = n.left
        if (isinstance(key, ast.Constant) and str(key.value).startswith("FLIGHTWATCH_")) or (
                isinstance(key, ast.Name) and key.id in names):
            lines.append(n.lineno)
    return lines


def test_no_module_but_settings_reads_a_flightwatch_variable(tmp_path):
    bad = [f"{os.path.relpath(f, ROOT)}:{line}" for d in PLACES
           for f in glob.glob(os.path.join(ROOT, d, "**", "*.py"), recursive=True)
           if not f.endswith(os.path.join("core", "settings.py")) for line in _variable_reads(f)]
    assert not bad, bad
    sample = tmp_path / "m.py"  # each form is found
    sample.write_text('import os\nENV = "FLIGHTWATCH_X"\nos.environ.get("FLIGHTWATCH_A")\nos.getenv(ENV)\n'
                      'os.environ["FLIGHTWATCH_B"]\n"FLIGHTWATCH_C" in os.environ\nos.environ.get("HOME")\n')
    assert _variable_reads(str(sample)) == [3, 4, 5, 6]


def test_a_variable_and_its_flag_set_the_same_and_the_flag_wins(monkeypatch):
    from loadgen.__main__ import build_parser
    from streaming.cli import build_parser as job_parser

    monkeypatch.setenv("FLIGHTWATCH_JOB_NICE", "7")
    monkeypatch.setenv("FLIGHTWATCH_JOIN_PARTITIONS", "4")
    monkeypatch.setenv("FLIGHTWATCH_DRIVER_MEMORY", "3g")
    a = job_parser().parse_args(["run", "--run", "r"])
    assert (a.nice, a.join_partitions, a.driver_memory) == (7, 4, "3g")
    a = job_parser().parse_args(["run", "--run", "r", "--nice", "2", "--driver-memory", "1500m"])
    assert (a.nice, a.driver_memory) == (2, "1500m")
    monkeypatch.setenv("FLIGHTWATCH_SHARDS", "3")
    monkeypatch.setenv("JOB_COMPLETION_INDEX", "2")
    assert build_parser().parse_args(["attack", "--rate", "1"]).shards == 3
    assert build_parser().parse_args(["attack", "--rate", "1", "--shards", "5"]).shards == 5


def test_what_a_flag_says_reaches_the_readers_below_the_parser(monkeypatch):
    """The job's ``--driver-memory`` sizes the Spark it starts; ``--log-level`` the logs; ``--trim-every-s`` the
    trimmer; ``--telemetry-slice`` the writers' slices (``settings.export``)."""
    from core import settings
    from core.slices import slice_seconds
    from streaming import session
    from streaming.cli import build_parser, config_from_args

    for name in (*settings.PROCESS_WIDE, "FLIGHTWATCH_DRIVER_MEMORY"):
        monkeypatch.setenv(name, "")  # recorded, so the values exported below are taken away after the test (a
        monkeypatch.delenv(name)      # worker's later tests start agents: a leaked log level hid their first lines)
    monkeypatch.setenv("PYTHONPATH", ROOT)
    a = build_parser().parse_args(["run", "--run", "r", "--driver-memory", "3g", "--log-level", "warning",
                                   "--telemetry-slice", "30s", "--trim-every-s", "4"])
    config_from_args(a)
    assert session.settings("local[2]", "r", "run", {})["spark.driver.memory"] == "3g"
    assert (settings.get("FLIGHTWATCH_LOG_LEVEL"), settings.get("FLIGHTWATCH_TRIM_EVERY_S")) == ("WARNING", "4.0")
    assert slice_seconds("127.0.0.1:1") == 30


def test_the_flag_test_leaves_the_environment_as_it_found_it():
    """Runs after the one above in the same process: what ``export`` wrote there is gone."""
    from core import settings

    assert not any(os.environ.get(n) in ("WARNING", "4.0", "30s", "3g") for n in (*settings.PROCESS_WIDE,
                                                                                 "FLIGHTWATCH_DRIVER_MEMORY"))


def test_an_earlier_name_is_read_and_said_once(monkeypatch, capsys):
    from core import settings

    monkeypatch.delenv("FLIGHTWATCH_JOB_METRICS_LISTEN", raising=False)
    monkeypatch.setenv("FLIGHTWATCH_JOB_METRICS", "127.0.0.1:19999")
    monkeypatch.setattr(settings, "_warned", set())
    assert settings.get("FLIGHTWATCH_JOB_METRICS_LISTEN") == "127.0.0.1:19999"
    assert settings.get("FLIGHTWATCH_JOB_METRICS_LISTEN") == "127.0.0.1:19999"
    err = capsys.readouterr().err
    assert err.count("FLIGHTWATCH_JOB_METRICS is now FLIGHTWATCH_JOB_METRICS_LISTEN") == 1, err
    monkeypatch.setenv("FLIGHTWATCH_JOB_METRICS_LISTEN", "127.0.0.1:19998")  # the new name wins
    assert settings.get("FLIGHTWATCH_JOB_METRICS_LISTEN") == "127.0.0.1:19998"
