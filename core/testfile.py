"""A test written down as a file (``flightwatch run checkout.toml``): TOML with the scenarios' own key names, kept
next to the system it tests, as OpenMessaging Benchmark keeps a workload file and k6 a script. Every key is one of
``flightwatch attack``'s flags; ``${NAME}`` (or ``${NAME:-default}``) in a string is taken from the environment.

    title = "Checkout events on our RabbitMQ"
    target = "amqps://fw@rabbit.example:5671/orders?queue=checkout&cafile=${CA_FILE}"
    password = "@/etc/flightwatch/rabbitmq.pw"     # the target's login (@FILE, or FLIGHTWATCH_TARGET_PASSWORD)
    rate = 2000                                     # or pace = "1000:60,1200:60"
    duration = "30s"
    fail_on = ["p99>500ms for 10s", "success<99%"]
    [kafka_options]                                 # a Kafka target's librdkafka settings (secrets as @FILE)
    "security.protocol" = "SASL_SSL"

A file with ``[axes]`` is a scenario in the same language (``scenarios.spec``): its cells are runs, ``CELL_KEYS`` set
every cell's attack, and ``flightwatch run`` runs it as ``flightwatch scenario`` does.

A secret's ``@FILE`` is relative to the test file's folder. The whole file is checked before anything starts: an unknown key, a value of the wrong kind or out of range, a
variable that is not set, or a secret's file that cannot be read is ``checkout.toml:12: ...`` and exit 2.
"""
from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass

from core.units import parse_duration_ns


class FileError(ValueError):
    """A test file's mistake, as one line: ``PATH:LINE: what``."""


@dataclass(frozen=True)
class Key:
    flag: str | None      # the attack's flag (None: the file's own, e.g. title)
    kind: type | tuple    # what TOML must give
    check: str = ""       # "duration", "positive", "threshold", "gate", "target", "pace", "choice:a|b", "secret"
    what: str = ""


KEYS = {
    "title": Key(None, str, what="what the test is, for its reader"),
    "description": Key(None, str, what="more of it"),
    "target": Key("--target", str, "target", "where the load goes (a URL, as --target takes it)"),
    "password": Key("--target-password", str, "secret", "the target's password: @FILE, a file that holds it"),
    "sut": Key("--sut", str, what="without target: the stack's SUT (tansu, rabbitmq, rabbitmq-amqp1, artemis, kafka)"),
    "rate": Key("--rate", (int, float, str), "positive", "events per second"),
    "pace": Key("--pace", str, "pace", "steps RATE:SECONDS[,...] or a ramp FROM-TO:SECONDS"),
    "duration": Key("--duration", str, "duration", "run length with rate"),
    "warmup": Key("--warmup", str, "duration", "left out of the latency figures at the start"),
    "cooldown": Key("--cooldown", str, "duration", "... and at the end"),
    "payload": Key("--payload", int, "positive", "event payload bytes"),
    "workers": Key("--workers", (int, str), "workers", "worker processes, or auto"),
    "max_inflight": Key("--max-inflight", int, "positive", "outstanding sends per worker"),
    "timeout": Key("--timeout", str, "duration", "per-send timeout"),
    "drop_timeout": Key("--drop-timeout", str, "duration", "a send unanswered this long is a drop"),
    "receivers": Key("--receiver", (str, int), "receivers", "auto: flightwatch's follow the target; N: that many "
                     "(competing); none: yours record the receives"),
    "probe_timeout": Key("--probe-timeout", str, "duration", "the probe before the load (0s: none)"),
    "fail_on": Key("--fail-on", list, "threshold", "thresholds: exit 1 when crossed"),
    "abort_on": Key("--abort-on", list, "threshold", "thresholds: stop at once (exit 3)"),
    "baseline": Key("--baseline", str, what="a finished run (or r1,r2,r3) to compare with"),
    "fail_on_regression": Key("--fail-on-regression", (str, list), "gate", "the regression gate, e.g. p99>+10%"),
    "scenario": Key("--scenario", str, what="the series the run belongs to (flightwatch history)"),
    "label": Key("--label", str, what="the build under test"),
    "run": Key("--run", str, what="the run's ID"),
    "telemetry_bootstrap": Key("--telemetry-bootstrap", str, what="your telemetry Kafka (with no_stack)"),
    "no_stack": Key("--no-stack", bool, what="start none of the embedded stack"),
    "kafka_options": Key("--kafka-option", dict, "secret", "a Kafka target's librdkafka settings"),
}
CELL_KEYS = ("payload", "workers", "max_inflight", "timeout", "fail_on", "abort_on", "kafka_options", "probe_timeout",
             "label")
"""The keys of this language a scenario (a file with ``[axes]``, ``scenarios.spec``) may set: every cell's attack
takes them. ``title``, ``sut``, ``pace``, ``warmup``, ``cooldown`` and ``drop_timeout`` mean the same there; its cells
are runs of their own, on the stack's SUT, so it sets no ``target``, ``run`` or ``baseline`` of a test."""
SCENARIO_KEYS = {
    "seed": "the published report whose method it follows",
    "method": "the method, as the report states it",
    "kind": "the report's shape: matrix, pairs, routing or bursts",
    "suts": "every stack SUT it can run on (sut: the default)",
    "target": "sut (the SUT broker's queue or topic) or http (the stack's HTTP receiver, or --target URL)",
    "axes": "[axes]: AXIS = [values]; one cell per combination (payload, acks, partitions, pairs, bindings, receivers)",
    "short": "[short]: the CI's form, any key above replaced",
    "report": "[report]: rows = AXIS, columns = [AXIS, ...]",
    "pace_per_pair": "true: the pace is each pair's (a cell of N pairs runs N times it)",
    "peer_rate": "--peer: the broker's own tool at this step's rate",
    "peer_seconds": "... for this long (whole seconds, at least 8)",
}
"""A scenario's own keys, beside ``CELL_KEYS`` and the ones it shares with a test."""
SECRET_PROPERTIES = ("sasl.password", "ssl.key.password", "ssl.keystore.password", "ssl.truststore.password",
                     "sasl.oauthbearer.client.secret")
"""librdkafka's secret properties: in a test file, only as @FILE."""
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def line_of(text: str, key: str, table: str | None = None) -> int:
    """The line of ``key`` (in ``[table]``), for an error's place (1 if it cannot be found)."""
    lines = text.splitlines()
    start = 0
    if table is not None:
        start = next((i for i, ln in enumerate(lines) if re.match(rf"\s*\[\s*{re.escape(table)}\s*\]", ln)), 0)
    pattern = re.compile(rf'\s*"?{re.escape(key)}"?\s*=')
    return next((i + 1 for i, ln in enumerate(lines[start:], start) if pattern.match(ln)), start + 1)


def _expand(value: str, where) -> str:
    def one(m) -> str:
        name, default = m.group(1), m.group(2)
        if name in os.environ:
            return os.environ[name]
        if default is not None:
            return default
        raise where(f"${{{name}}} is not set (set it, or write ${{{name}:-DEFAULT}})")
    return _VAR.sub(one, value)


def read(path: str) -> tuple[str, dict]:
    """(the file's text, its TOML); ``FileError`` (``PATH:LINE: ...``) if it cannot be read or is not TOML."""
    try:
        text = open(path).read()
    except OSError as e:
        raise FileError(f"{path}: {e.strerror or e}") from None
    try:
        return text, tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        m = re.search(r"line (\d+)", str(e))
        raise FileError(f"{path}:{m.group(1) if m else 1}: not TOML: {str(e).split(' (at line')[0]}") from None


def at(path: str, text: str, key: str, table: str | None = None):
    """A function that makes ``FileError(PATH:LINE: msg)`` at the line of ``key`` (in ``[table]``)."""
    def where(msg: str, k: str = key, t: str | None = table) -> FileError:
        return FileError(f"{path}:{line_of(text, k, t)}: {msg}")
    return where


def is_scenario(doc: dict) -> bool:
    """A file with ``[axes]`` is a scenario: its cells are runs (``flightwatch scenario``, ``scenarios.spec``)."""
    return "axes" in doc


def flags(path: str, text: str, doc: dict, keys: dict | None = None, check_target=None) -> list[str]:
    """The attack's flags for the keys of ``doc`` (``keys``: the ones allowed, KEYS by default); ``FileError`` for
    a key not allowed, a value of the wrong kind, or one the attack would refuse, at its line. ``check_target(url)``
    raises ``ValueError`` for a target the load generator would refuse (its parser, which the core cannot import)."""
    keys = KEYS if keys is None else keys
    out: list[str] = []
    for key, value in doc.items():
        where = at(path, text, key)
        spec = keys.get(key)
        if spec is None:
            raise where(f"unknown key {key!r}: one of {', '.join(keys)}")
        if isinstance(value, bool) and spec.kind is not bool or not isinstance(value, spec.kind):
            raise where(f"{key} = {value!r}: {_kind(spec.kind)} ({spec.what})")
        out += _flags(key, spec, value, where, os.path.dirname(os.path.abspath(path)), check_target)
    return out


def load(path: str, check_target=None) -> list[str]:
    """The attack's flags for the test in ``path``; ``FileError`` (``PATH:LINE: ...``) for anything wrong in it
    (``check_target``: as ``flags`` takes it)."""
    text, doc = read(path)
    if is_scenario(doc):
        raise at(path, text, "axes", "axes")("a scenario (it has [axes]): run it with flightwatch scenario "
                                             f"{path}, or flightwatch run {path} (the same)")
    return flags(path, text, doc, check_target=check_target)


def _kind(kind) -> str:
    names = {str: "a string", int: "a whole number", float: "a number", bool: "true or false", list: "a list",
             dict: "a table"}
    return " or ".join(names[k] for k in (kind if isinstance(kind, tuple) else (kind,)))


def _flags(key: str, spec: Key, value, where, folder: str, check_target=None) -> list[str]:
    """One key's flags, its value checked as the attack would check it, and named by its line when it is wrong; a
    secret's ``@FILE`` is relative to ``folder``, the test file's."""
    if spec.flag is None:
        return []
    if isinstance(value, bool):
        return [spec.flag] if value else []
    if isinstance(value, dict):  # kafka_options: KEY = VALUE each, a secret @FILE checked readable
        out = []
        for k, v in value.items():
            v = _expand(str(v).lower() if isinstance(v, bool) else str(v), lambda m, k=k: where(m, k, key))
            if k.replace("_", ".") in SECRET_PROPERTIES and not v.startswith("@"):
                raise where(f"{k}: write @FILE, a file that holds it (a secret written here would show on the load "
                            "generator's command line)", k, key)
            v = _secret(v, lambda m, k=k: where(m, k, key), folder)
            out += [spec.flag, f"{k}={v}"]
        return out
    values = value if isinstance(value, list) else [value]
    out = []
    for v in values:
        text = _expand(v, where) if isinstance(v, str) else str(v)
        _check(spec.check, key, text, where, check_target)
        if spec.check == "secret":
            if not text.startswith("@"):
                raise where(f"{key}: write @FILE, a file that holds it, or set FLIGHTWATCH_TARGET_PASSWORD (a "
                            "password written here would show on the load generator's command line)")
            text = _secret(text, where, folder)
        out += [spec.flag, text]
    if key == "receivers":
        return {"none": ["--no-receiver"], "auto": out}.get(out[1], ["--receiver", "auto", "--receivers", out[1]])
    return out


def _secret(text: str, where, folder: str = "") -> str:
    """A secret's ``@FILE``, relative to the test file's folder, checked readable; other text as it is."""
    if not text.startswith("@"):
        return text
    path = os.path.join(folder, text[1:])
    if not os.access(path, os.R_OK):
        raise where(f"the secret's file {path} cannot be read")
    return "@" + os.path.abspath(path)


def _check(check: str, key: str, text: str, where, check_target=None) -> None:
    try:
        if check == "duration":
            parse_duration_ns(text)
        elif check == "positive" and not (re.fullmatch(r"\d+(\.\d+)?", text) and float(text) > 0):
            raise ValueError("a number more than 0")
        elif check == "workers" and text != "auto" and not (text.isdigit() and int(text) > 0):
            raise ValueError("a number of processes, or auto")
        elif check == "receivers" and text not in ("auto", "none") and not (text.isdigit() and 1 <= int(text) <= 32):
            raise ValueError("auto, none, or a number of receivers (1 to 32)")
        elif check == "threshold":
            from core.thresholds import Threshold

            Threshold.parse(text, key)
        elif check == "pace":
            from core.pacer import Schedule

            Schedule.parse(text)
        elif check == "target" and check_target is not None:
            check_target(text)
    except FileError:
        raise
    except ValueError as e:
        raise where(f"{key} = {text!r}: {e}") from None
