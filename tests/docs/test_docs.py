"""Docs that cannot drift: every command, flag, make target and variable, and setting that the README and the
documentation site (``docs/``) name exists in the code, and the site's generated reference pages are asked for.

What is read: fenced ``sh`` blocks (and unmarked ones) and inline code spans. In them, ``make TARGET VAR=...``,
``flightwatch COMMAND --flag`` (``.venv/bin/flightwatch`` too) and ``python -m MODULE [SUBCOMMAND] --flag``; each
flag is looked up in what that command's ``--help`` prints (one subprocess per command, run side by side), so a flag
renamed in the code fails here. ``FLIGHTWATCH_*`` names are looked up in ``core.settings``. ``text`` blocks (what a
command prints) and the changelog (history) are not read.
"""
from __future__ import annotations

import functools
import glob
import os
import re
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from support import ROOT

from transports.registry import RECEIVERS

DOCS = sorted(glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True))
PAGES = [os.path.join(ROOT, "README.md"), *(p for p in DOCS if not p.endswith("changelog.md"))]
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.S | re.M)
SPAN = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9.-]*)")
FLIGHTWATCH_OWN = frozenset({"--no-stack"})
"""Flags ``flightwatch attack`` and ``run`` take themselves, before the component's (``flightwatch.cli.stack_step``)."""
SHELL_OPS = {"|", "||", "&&", ";", "&", ">", "2>&1", ">>", "<"}


def snippets(text: str) -> list[str]:
    """The shell a page shows: its sh (or unmarked) blocks' lines, continuations joined, and its inline code."""
    out = []
    for lang, body in FENCE.findall(text):
        if lang in ("", "sh", "bash", "shell", "console"):
            out += [line for line in re.sub(r"\\\n\s*", " ", body).splitlines() if line.strip()]
    prose = FENCE.sub("", text)
    out += SPAN.findall(prose)
    return out


def _tokens(line: str) -> list[str]:
    line = line.split(" #")[0]
    try:
        return shlex.split(line, comments=False)
    except ValueError:  # an unbalanced quote in prose: words will do
        return line.split()


@functools.cache
def makefile() -> tuple[set[str], set[str]]:
    text = open(os.path.join(ROOT, "Makefile")).read()
    targets = set(re.findall(r"^([a-z][a-z-]*):", text, re.M))
    variables = set(re.findall(r"^([A-Z][A-Z0-9_]*)\s*\?=", text, re.M))
    variables |= set(re.findall(r"\$\(([A-Z][A-Z0-9_]*)\)", text)) | set(re.findall(r"origin ([A-Z][A-Z0-9_]*)\)", text))
    return targets, variables


def _starts_command(toks: list[str], i: int) -> bool:
    """Whether ``toks[i]`` is where a command starts: the first word, or after a shell operator or ``VAR=value``s
    (``kubectl -n flightwatch`` names a namespace, not the command)."""
    k = i - 1
    while k >= 0 and re.fullmatch(r"[A-Z][A-Z0-9_]*=\S*", toks[k]):
        k -= 1
    return k < 0 or toks[k] in SHELL_OPS


@functools.cache
def settings_names() -> frozenset[str]:
    """``FLIGHTWATCH_*`` settings: given to make, they reach its commands in their environment."""
    from core.settings import SETTINGS

    return frozenset(SETTINGS)


def uses(pages=PAGES) -> dict[str, list[tuple[str, list[str]]]]:
    """Per kind (make, flightwatch, module), each use: (where, its tokens from the command on)."""
    found: dict[str, list] = {"make": [], "flightwatch": [], "module": []}
    for path in pages:
        where = os.path.relpath(path, ROOT)
        for line in snippets(open(path).read()):
            toks = _tokens(line)
            for i, t in enumerate(toks):
                rest = toks[i + 1:]
                end = next((k for k, x in enumerate(rest) if x in SHELL_OPS), len(rest))
                rest = rest[:end]
                if t == "make" and rest and re.fullmatch(r"[a-z][a-z-]*", rest[0]):
                    found["make"].append((where, rest))
                elif (t.endswith("/flightwatch") or t == "flightwatch") and _starts_command(toks, i):
                    if rest and re.fullmatch(r"[a-z]+", rest[0]):
                        found["flightwatch"].append((where, rest))
                elif t == "-m" and i > 0 and toks[i - 1].endswith("python") and rest and re.fullmatch(r"[a-z_.]+", rest[0]):
                    found["module"].append((where, rest))
    return found


@functools.cache
def _help(argv: tuple[str, ...]) -> tuple[int, str, str]:
    """``python ARGV --help``: its exit code, its output, and its usage lines (each command run once)."""
    p = subprocess.run([sys.executable, *argv, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=ROOT, COLUMNS="200"))
    out = p.stdout + p.stderr
    return p.returncode, out, " ".join(re.findall(r"^usage:.*?(?=\n\s*\n|\Z)", out, re.S | re.M))


def help_flags(argv: tuple[str, ...]) -> frozenset[str] | None:
    """The flags ``python ARGV --help`` defines, from its usage lines and its option lines, not the flags its prose
    names (None if it fails without a usage line: the command itself is wrong)."""
    code, out, usage = _help(argv)
    if code != 0 and not out.startswith("usage:"):
        return None
    options = re.findall(r"^ {2,}(-[^\n]*?)(?: {2,}|$)", out, re.M)  # "  --oom-cgroup DIR, --cgroup DIR   help"
    return frozenset(FLAG.findall(" ".join([usage, *options]))) | {"--help", "-h"}


def _command(kind: str, rest: list[str]) -> tuple[str, ...]:
    """The ``--help`` command a use's flags belong to: a module's subcommand when it has one."""
    if kind == "flightwatch":
        return ("-m", "flightwatch", rest[0])
    module, args = rest[0], rest[1:]
    sub = args[0] if args and re.fullmatch(r"[a-z][a-z-]*", args[0]) else None
    return ("-m", module, sub) if sub and sub in _subcommands(module) else ("-m", module)


def _subcommands(module: str) -> frozenset[str]:
    """The subcommands ``python -m MODULE --help`` offers (``{http,kafka,...}`` in its usage), none if it fails."""
    usage = _help(("-m", module))[2]
    return frozenset(x for group in re.findall(r"\{([a-z0-9,-]+)\}", usage) for x in group.split(","))


def _flags_of(rest: list[str]) -> list[str]:
    return [t.split("=")[0] for t in rest if FLAG.fullmatch(t.split("=")[0])]


def check(found) -> list[str]:
    """What the pages name that the code does not have, one line each."""
    targets, variables = makefile()
    bad = []
    for where, rest in found["make"]:
        if rest[0] not in targets:
            bad.append(f"{where}: make {rest[0]}: no such target")
        bad += [f"{where}: make {rest[0]} {t}: no such make variable" for t in rest[1:]
                if re.fullmatch(r"[A-Z][A-Z0-9_]*=.*", t) and t.split("=")[0] not in variables | settings_names()]
    from flightwatch.cli import COMMANDS

    commands = {}
    for kind in ("flightwatch", "module"):
        for where, rest in found[kind]:
            if kind == "flightwatch" and rest[0] not in COMMANDS:
                bad.append(f"{where}: flightwatch {rest[0]}: no such command")
                continue
            if kind == "flightwatch" and rest[0] == "ui":  # Streamlit's own flags
                continue
            commands.setdefault(_command(kind, rest), []).append((where, rest))
    with ThreadPoolExecutor(4) as pool:
        helps = dict(zip(commands, pool.map(help_flags, commands)))
    for argv, seen in commands.items():
        name = " ".join(argv[1:])
        if helps[argv] is None:
            bad.append(f"{seen[0][0]}: python -m {name}: its --help fails (no such module or command)")
            continue
        own = FLIGHTWATCH_OWN if argv[1] == "flightwatch" else frozenset()
        for where, rest in seen:
            bad += [f"{where}: {name} {f}: no such flag" for f in _flags_of(rest) if f not in helps[argv] | own]
    return sorted(set(bad))


COMPONENTS = [("-m", "loadgen", "attack"), ("-m", "streaming", "run"), ("-m", "streaming", "replay"),
              ("-m", "runs", "compare"), ("-m", "runs", "history"), ("-m", "stack", "up"), ("-m", "scenarios", "run"),
              *(("-m", "agents.receiver", mode) for mode in RECEIVERS),
              ("-m", "agents.node_metrics"), ("-m", "agents.cgroup_metrics"), ("-m", "stack.deploy", "apply"),
              *(("-m", f"bench.{b}") for b in ("loadgen", "verdict", "calibrate", "workday", "pipeline", "join"))]
"""Whose flags a flag named alone (```--probe-timeout```, in prose) may be."""
OTHER_TOOLS = frozenset({"--server.port", "--dist", "--durations", "--conf", "--master", "--deploy-mode", "--name",
                         "--set", "--version", "--create-namespace", "--namespace", "--wait", "--timeout", "--image",
                         "--digestfile", "--strict"})
"""Flags of other tools the pages name (Streamlit, pytest, spark-submit, helm, kind, podman, mkdocs): not
flightwatch's."""


def bare_flags(pages=PAGES) -> list[tuple[str, str]]:
    """The flags the pages name alone in prose (a code span that is a flag, with or without its value)."""
    out = []
    for path in pages:
        prose = FENCE.sub("", open(path).read())
        out += [(os.path.relpath(path, ROOT), m.split("=")[0].split()[0]) for m in SPAN.findall(prose)
                if re.fullmatch(r"--[a-z][a-z0-9.-]*(?:[ =]\S+)?", m)]
    return out


def test_every_flag_named_alone_is_some_components():
    with ThreadPoolExecutor(4) as pool:
        known = frozenset().union(*(f for f in pool.map(help_flags, COMPONENTS) if f))
    named = bare_flags()
    bad = sorted({f"{where}: {flag}: no component has it" for where, flag in named
                  if flag not in known | OTHER_TOOLS | FLIGHTWATCH_OWN})
    assert len(named) > 50 and not bad, "\n".join(bad)


def test_every_command_flag_and_make_variable_the_docs_name_exists():
    found = uses()
    assert len(found["make"]) > 50 and len(found["flightwatch"]) > 10 and len(found["module"]) > 20, {
        k: len(v) for k, v in found.items()}
    bad = check(found)
    assert not bad, "\n".join(bad)


def test_a_renamed_flag_target_or_command_fails(tmp_path):
    """The check is not blind: a page naming a flag, a target, a variable or a module the code lacks fails it."""
    page = tmp_path / "page.md"
    page.write_text("```sh\nmake attack RATE=5000 NO_SUCH_VAR=1\nmake no-such-target\n"
                    ".venv/bin/flightwatch attack --rate 5000 --no-such-flag 3\n"
                    "python -m loadgen attack --probe-timeout 10s --probe-timout 10s\n"
                    "python -m no_such_module --help\n```\nand `flightwatch nosuch --x`\n")
    bad = check(uses([str(page)]))
    rel = os.path.relpath(page, ROOT)
    assert bad == sorted([f"{rel}: flightwatch nosuch: no such command",
                          f"{rel}: loadgen attack --probe-timout: no such flag",
                          f"{rel}: make attack NO_SUCH_VAR=1: no such make variable",
                          f"{rel}: make no-such-target: no such target",
                          f"{rel}: python -m no_such_module: its --help fails (no such module or command)",
                          f"{rel}: flightwatch attack --no-such-flag: no such flag"]), bad


def test_every_setting_the_docs_name_exists():
    from core.settings import SETTINGS

    named = {(os.path.relpath(p, ROOT), n) for p in PAGES for n in re.findall(r"\bFLIGHTWATCH_[A-Z0-9_]*[A-Z0-9]",
                                                                            open(p).read())}
    bad = sorted((w, n) for w, n in named if n not in SETTINGS)
    assert not bad, bad


@pytest.mark.parametrize("page, kind", [("reference/settings.md", "settings"), ("reference/make.md", "make-targets"),
                                        ("reference/commands.md", "help attack"),
                                        ("reference/target-urls.md", "target-urls"),
                                        ("reference/run-folder.md", "summary-fields"),
                                        ("reference/metrics.md", "metrics")])
def test_the_reference_pages_are_generated_from_the_code(page, kind):
    """The tables that would drift are made from the code at every build (``docs/hooks/generated.py``)."""
    assert f"<!-- generated: {kind} -->" in open(os.path.join(ROOT, "docs", page)).read()


def test_the_readme_is_one_screen_and_the_manual_keeps_no_measurement_log():
    """The README fits a screen or two; dated measurements live in ``docs/benchmarks/`` only, not in the README, the
    getting-started, how-to and reference pages."""
    text = open(os.path.join(ROOT, "README.md")).read()
    assert len(text.splitlines()) <= 150
    manual = [os.path.join(ROOT, "README.md")] + [p for p in DOCS if os.path.relpath(p, os.path.join(ROOT, "docs")).split(
        os.sep)[0] in ("getting-started", "how-to", "reference")]
    dated = [(os.path.relpath(p, ROOT), m) for p in manual for m in re.findall(r"\b20\d\d-\d\d-\d\d\b", open(p).read())]
    assert len(manual) > 20 and not dated, f"a dated measurement belongs in docs/benchmarks/: {dated}"


def test_the_readmes_links_lead_somewhere():
    """The README is read on a forge, outside the site's build: each relative link names a file of the checkout."""
    links = re.findall(r"\]\(([^)#]+?)(?:#[^)]*)?\)", open(os.path.join(ROOT, "README.md")).read())
    local = [x for x in links if "://" not in x]
    assert len(local) > 30 and not [x for x in local if not os.path.exists(os.path.join(ROOT, x))], local
