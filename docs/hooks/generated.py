"""MkDocs hook: the reference pages' generated parts, made from the code at every build so that they cannot drift.

A page asks for one with a line of its own, ``<!-- generated: KIND [ARG] -->``:

    make-targets            every `make` target with its help (the Makefile's ``## `` comments)
    make-variables          the Makefile's variables and their defaults
    help COMMAND            ``flightwatch COMMAND --help`` as it prints it (``flightwatch`` alone: the command list)
    module-help MODULE ...  ``python -m MODULE ... --help``
    settings                ``python -m core.settings``: every setting, its flag, default and meaning
    target-urls             the transports' URL schemes and examples (``transports.registry.TRANSPORTS``)
    summary-fields          ``summary.json``'s fields, from ``core.output.Summary``
    verdict-fields          ``verdict.json``'s fields, from ``core.output.Verdict``
    ledger                  the ledger's buckets, from ``core.output.ledger``
    suts                    the stack's systems under test (``core.suts.SUTS``)
    scenarios               the seeds' scenarios (``python -m scenarios list``)
    metrics                 every metric each process serves, rendered from the collectors that
                            ``tests/core/test_metrics_lint.py`` lints with promtool

An unknown kind, or a command that fails, fails the build (``mkdocs build --strict`` in CI).
"""
from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MARK = re.compile(r"^<!-- generated: ([\w-]+)(?: (.*?))? -->$", re.M)
COLUMNS = "120"


def _run(*argv: str) -> str:
    env = dict(os.environ, PYTHONPATH=ROOT, COLUMNS=COLUMNS, FLIGHTWATCH_CHECKPOINTS="./checkpoints")
    p = subprocess.run([sys.executable, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        raise RuntimeError(f"docs: `python {' '.join(argv)}` failed ({p.returncode}): {p.stderr.strip()[-500:]}")
    return p.stdout.rstrip()


def _block(text: str) -> str:
    return "```text\n" + text + "\n```"


def _makefile() -> str:
    with open(os.path.join(ROOT, "Makefile")) as f:
        return f.read()


def make_targets() -> str:
    rows = ["| target | what it does |", "|---|---|"]
    for name, what in re.findall(r"^([a-z-]+):[^\n#]*## (.*)$", _makefile(), re.M):
        rows.append(f"| `make {name}` | {what.replace('|', '&#124;')} |")
    return "\n".join(rows)


def make_variables() -> str:
    rows = ["| variable | default |", "|---|---|"]
    for name, value in re.findall(r"^([A-Z_]+)\s*\?=[ \t]*(.*)$", _makefile(), re.M):
        rows.append(f"| `{name}` | {'`' + value.strip() + '`' if value.strip() else '(none)'} |")
    return "\n".join(rows)


def help_of(command: str) -> str:
    return _block(_run("-m", "flightwatch", *([] if command == "flightwatch" else [command]), "--help"))


def module_help(args: str) -> str:
    return _block(_run("-m", *args.split(), "--help"))


def settings() -> str:
    return _run("-m", "core.settings")


def target_urls() -> str:
    from transports.registry import TRANSPORTS

    rows = ["| schemes | transport | default port (TLS) | example |", "|---|---|---|---|"]
    for cls in dict.fromkeys(TRANSPORTS.values()):
        doc = (sys.modules[cls.__module__].__doc__ or "").strip().split("\n")[0]
        tls = f" ({cls.TLS_PORT})" if cls.TLS_PORT else ""
        rows.append(f"| {', '.join(f'`{s}://`' for s in cls.SCHEMES)} | {doc} | {cls.DEFAULT_PORT}{tls} | "
                    f"`{cls.EXAMPLE}` |")
    return "\n".join(rows)


def _fields(cls) -> str:
    """A TypedDict's fields with the comment each has in the source."""
    rows = ["| field | type | what |", "|---|---|---|"]
    for line in inspect.getsource(cls).splitlines()[1:]:
        m = re.match(r"\s+(\w+): ([^#]+?)\s*(?:#\s*(.*))?$", line)
        if m and not line.strip().startswith(('"""', "#")):
            rows.append(f"| `{m[1]}` | `{m[2].strip().replace(' | ', ' or ')}` | {(m[3] or '').replace('|', '&#124;')} |")
    return "\n".join(rows)


def summary_fields() -> str:
    from core import output

    return _fields(output.Summary)


def verdict_fields() -> str:
    from core import output

    return _fields(output.Verdict)


def ledger() -> str:
    from core import output

    return inspect.cleandoc(output.ledger.__doc__)


def suts() -> str:
    from core.suts import SUTS

    rows = ["| `SUT=` | what | the stack's components |", "|---|---|---|"]
    rows += [f"| `{k}` | {s.what} | `{s.broker}`, `{s.receiver}` |" for k, s in SUTS.items()]
    return "\n".join(rows)


def scenarios() -> str:
    return _block(_run("-m", "scenarios", "list"))


def metrics() -> str:
    """Each process's metric families as its /metrics renders them (name, type, labels, help): the lint test's
    collectors, with figures in them, through prometheus-client."""
    import importlib.util
    import tempfile

    from prometheus_client.parser import text_string_to_metric_families

    spec = importlib.util.spec_from_file_location("metrics_lint", os.path.join(ROOT, "tests", "core", "test_metrics_lint.py"))
    lint = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lint)
    rows = ["| process | metric | type | labels | what |", "|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as tmp:
        for process, collector in lint.collectors(tmp).items():
            for fam in text_string_to_metric_families(lint.rendered(collector)):
                labels = sorted({k for sample in fam.samples for k in sample.labels} - {"quantile"})
                name = fam.name + ("_total" if fam.type == "counter" else "")
                rows.append(f"| {process} | `{name}` | {fam.type} | {', '.join(f'`{x}`' for x in labels)} | "
                            f"{fam.documentation.replace('|', '&#124;')} |")
    return "\n".join(rows)


KINDS = {"make-targets": make_targets, "make-variables": make_variables, "help": help_of, "module-help": module_help,
         "settings": settings, "target-urls": target_urls, "summary-fields": summary_fields,
         "verdict-fields": verdict_fields, "ledger": ledger, "suts": suts, "scenarios": scenarios, "metrics": metrics}


def expand(markdown: str, where: str = "a page") -> str:
    def one(m: re.Match) -> str:
        kind, arg = m[1], m[2]
        if kind not in KINDS:
            raise ValueError(f"{where}: unknown generated part {kind!r} (one of {', '.join(KINDS)})")
        return KINDS[kind](arg) if arg else KINDS[kind]()

    return MARK.sub(one, markdown)


def on_page_markdown(markdown: str, page, **_) -> str:
    return expand(markdown, page.file.src_path)
