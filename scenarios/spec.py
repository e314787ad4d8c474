"""A scenario as data: one TOML file in ``scenarios/`` per published method, read and checked here.

    title = "Size and acks matrix"                 # what the report is called
    seed = "Event Streams (Kafka) performance report"
    method = "..."                                 # the method, as the report states it
    kind = "matrix"                                # the report's shape (``scenarios.report``)
    sut = "kafka"                                  # the stack's SUT it runs on by default; ``suts``: every one it can
    warmup = "2s"                                  # left out of every cell's latency figures (``--warmup``)
    cooldown = "1s"
    drop_timeout = "10s"                           # a send unanswered this long is a drop (the job's)
    pace = "1000:10,2000:10"                       # every cell's schedule (the pace syntax)
    peer_rate = 2000                               # --peer: the broker's own tool at this step's rate (default:
    peer_seconds = 20                              #   the cell's highest), for this long (``scenarios.peers``)

    [axes]                                         # one cell per combination, in this order
    payload = [128, 1024, 10240]                   # what each knob means: ``KNOBS``
    acks = ["1", "all"]

    [short]                                        # the CI's form: any key above, replaced
    pace = "500:4"
    axes = { payload = [128] }

    [report]                                       # the table: rows and columns are axes
    rows = "payload"
    columns = ["acks"]

It is the test files' language (``core.testfile``, ``flightwatch run FILE.toml``) with ``[axes]``: ``title``,
``sut``, ``pace``, ``warmup``, ``cooldown`` and ``drop_timeout`` mean what they mean in a test, and a test's
``CELL_KEYS`` (``payload``, ``workers``, ``timeout``, ``fail_on``, ``kafka_options``, ...) set every cell's attack:

    payload = 1024                                 # every cell's, unless payload is an axis
    fail_on = ["success<100%"]                     # a cell that crosses it exits 1: the scenario says so

``load(name)`` (a name in ``scenarios/``, or a file's path) returns a ``Scenario`` or raises ``ScenarioError``
naming the file, the line and the key at fault.
"""
from __future__ import annotations

import itertools
import os
from dataclasses import dataclass

from core import testfile
from core.pacer import Schedule
from core.suts import SUTS
from core.units import parse_duration_ns
from transports.base import Transport

SUT = "sut"
"""A scenario's ``target`` when its cells attack the SUT broker's queue or topic (the default)."""


def sinks() -> dict[str, Transport]:
    """The transports whose receiver is a sink (``Transport.sink``), by name: a scenario's ``target`` may be one."""
    from transports.registry import SINKS

    return {t.name: t for t in SINKS}


FOLDER = os.path.dirname(os.path.abspath(__file__))

KNOBS = {
    "payload": "event payload in bytes (the attack's --payload)",
    "acks": "the Kafka producer's acks, 1 or all (--kafka-option acks=)",
    "partitions": "partitions of the SUT topic (the stack's --partitions, on a renewed SUT)",
    "pairs": "sender-receiver pairs, each on its own AMQP 1.0 address (the target's ?pairs=N, the stack's --pairs)",
    "bindings": "queues on RabbitMQ's topic exchange, each bound with its own key (?bindings=N, the stack's --bindings)",
    "receivers": "processes of the stack's HTTP receiver on its port, each a receiver of its own (its --workers)",
}
"""Every axis a scenario may vary, and what it sets for its cells."""
KNOB_SUTS = {"acks": ("tansu", "kafka"), "partitions": ("tansu", "kafka"), "pairs": ("artemis", "rabbitmq-amqp1"),
             "bindings": ("rabbitmq",)}
"""The axes that mean something on some SUTs only."""

KINDS = ("matrix", "pairs", "routing", "bursts")
"""The report shapes ``scenarios.report`` draws."""

_KEYS = {"title", "seed", "method", "kind", "sut", "suts", "warmup", "cooldown", "drop_timeout", "pace", "axes",
         "short", "report", "attack", "pace_per_pair", "target", "peer_rate", "peer_seconds"}
_REPORT_KEYS = {"rows", "columns"}


class ScenarioError(ValueError):
    """A scenario that cannot be read or run as given: one line saying which file and what."""


@dataclass(frozen=True)
class Scenario:
    name: str
    path: str
    title: str
    seed: str
    method: str
    kind: str
    sut: str
    suts: tuple[str, ...]
    warmup: str
    cooldown: str
    drop_timeout: str
    pace: str
    axes: dict[str, list]                 # axis -> its values, in the file's order
    rows: str
    columns: tuple[str, ...]
    attack: tuple[str, ...] = ()          # more flags for every cell's attack
    pace_per_pair: bool = False           # the pace is each pair's: a cell of N pairs runs N times it
    target: str = SUT                     # "sut": the SUT broker's queue or topic; a sink's transport ("http"): its
                                          # receiver in the stack (``Transport.sink``), or ``--target``
    short: bool = False                   # this is the CI's form
    peer_rate: int | None = None          # the rate the peer's tool runs at (--peer): one of the pace's steps
    peer_seconds: int = 20                # and how long

    @property
    def sink(self) -> Transport | None:
        """The transport whose receiver the cells attack directly (the stack's, or ``--target``); None: the SUT's."""
        return sinks().get(self.target)

    def peer_rate_of(self, cell: dict) -> int:
        """The rate a cell's peer runs at, and flightwatch's figures beside it are taken at: the scenario's
        ``peer_rate`` (a step of its ramp), else the cell's highest step."""
        return self.peer_rate or int(max(s.rate_per_sec for s in Schedule.parse(self.cell_pace(cell)).steps))

    def cells(self) -> list[dict]:
        """Every combination of the axes' values, the last axis fastest."""
        names = list(self.axes)
        return [dict(zip(names, values)) for values in itertools.product(*(self.axes[n] for n in names))]

    def schedule(self) -> Schedule:
        return Schedule.parse(self.pace)

    def cell_pace(self, cell: dict) -> str:
        """The pace of a cell's whole run: the scenario's, times the cell's pairs when the pace is each pair's."""
        if not self.pace_per_pair or cell.get("pairs", 1) == 1:
            return self.pace
        return self.schedule().share(1.0 / cell["pairs"]).describe()

    def only(self, axis: str, values: list) -> Scenario:
        """The scenario with one axis restricted (``--only pairs=1000``); ``ScenarioError`` for an unknown axis."""
        if axis not in self.axes:
            raise ScenarioError(f"scenario {self.name} has no axis {axis!r} (its axes: {', '.join(self.axes) or 'none'})")
        kind = type(self.axes[axis][0])
        try:
            typed = [kind(v) for v in values]
        except ValueError:
            raise ScenarioError(f"--only {axis}=...: {values!r} are not {kind.__name__}s") from None
        return _replace(self, axes={**self.axes, axis: typed})


def _replace(s: Scenario, **changes) -> Scenario:
    import dataclasses

    return dataclasses.replace(s, **changes)


def names() -> list[str]:
    """The scenarios in ``scenarios/``, by name (their file's, less ``.toml``)."""
    return sorted(n[:-5] for n in os.listdir(FOLDER) if n.endswith(".toml"))


def is_path(name: str) -> bool:
    """A scenario given as a file (``flightwatch scenario my-matrix.toml``), not by its name in ``scenarios/``."""
    return name.endswith(".toml") or os.sep in name


def load(name: str, short: bool = False, folder: str = FOLDER) -> Scenario:
    """The scenario ``name`` (or the file at that path; ``short``: its CI form); ``ScenarioError`` if it is missing
    or wrong."""
    path = os.path.abspath(name) if is_path(name) else os.path.join(folder, f"{name}.toml")
    if not os.path.isfile(path):
        raise ScenarioError(f"no scenario {name!r} (there are: {', '.join(names()) or 'none'})" if not is_path(name)
                            else f"{name}: no such file")
    try:
        text, raw = testfile.read(path)
    except testfile.FileError as e:
        raise ScenarioError(str(e)) from None
    return parse(os.path.basename(path)[:-5] if is_path(name) else name, path, raw, short, text)


_CELL_KEYS = {k: testfile.KEYS[k] for k in testfile.CELL_KEYS}
_ALL_KEYS = _KEYS | set(_CELL_KEYS)


def _cell_flags(path: str, text: str, form: dict, axes: dict) -> tuple[str, ...]:
    """Every cell's attack flags from the test-file keys among ``form`` (checked as a test's are)."""
    given = {k: v for k, v in form.items() if k in _CELL_KEYS}
    for k in given.keys() & axes.keys():
        raise testfile.at(path, text, k)(f"{k} is an axis of this scenario: each cell has its own")
    return tuple(testfile.flags(path, text, given, _CELL_KEYS))


def parse(name: str, path: str, raw: dict, short: bool = False, text: str = "") -> Scenario:
    def bad(what: str, key: str | None = None, table: str | None = None) -> ScenarioError:
        return ScenarioError(f"{path}:{testfile.line_of(text, key, table)}: {what}" if key and text else f"{path}: {what}")

    unknown = set(raw) - _ALL_KEYS
    if unknown:
        k = sorted(unknown)[0]
        raise bad(f"unknown key {k!r}: a scenario's own ({', '.join(sorted(_KEYS))}) or a test's for every cell "
                  f"({', '.join(_CELL_KEYS)})", k)
    form = dict(raw)
    short_form = raw.get("short") or {}
    if short:
        if not short_form:
            raise bad("has no [short] form")
        unknown = set(short_form) - _ALL_KEYS
        if unknown:
            raise bad(f"[short]: unknown key {sorted(unknown)[0]!r}", sorted(unknown)[0], "short")
        form.update({k: v for k, v in short_form.items() if k != "axes"})
        form["axes"] = {**raw.get("axes", {}), **short_form.get("axes", {})}
    for key in ("title", "seed", "method", "kind", "sut", "pace"):
        if not isinstance(form.get(key), str) or not form[key].strip():
            raise bad(f"{key!r} must be given, as text", key if key in raw else None)
    if form["kind"] not in KINDS:
        raise bad(f"kind {form['kind']!r} is not one of {', '.join(KINDS)}", "kind")
    suts = tuple(form.get("suts") or (form["sut"],))
    for s in (form["sut"], *suts):
        if s not in SUTS:
            raise bad(f"SUT {s!r} is not one of the stack's ({', '.join(SUTS)})", "suts" if s in suts and "suts" in raw else "sut")
    for key in ("pace", "warmup", "cooldown", "drop_timeout"):
        try:
            Schedule.parse(form["pace"]) if key == "pace" else parse_duration_ns(str(form.get(key, "0s")))
        except ValueError as e:
            raise bad(f"{key} = {form.get(key)!r}: {e}", key, "short" if short and key in short_form else None) from None
    axes = form.get("axes") or {}
    for axis, values in axes.items():
        if axis not in KNOBS:
            raise bad(f"unknown axis {axis!r} (known: {', '.join(KNOBS)})", axis, "axes")
        if not isinstance(values, list) or not values or len({type(v) for v in values}) != 1:
            raise bad(f"axis {axis!r}: a non-empty list of values of one type", axis, "axes")
        if axis in KNOB_SUTS and set(suts) - set(KNOB_SUTS[axis]):
            raise bad(f"axis {axis!r} means something on {', '.join(KNOB_SUTS[axis])} only, not on every SUT in {suts}",
                      axis, "axes")
    peer_rate, peer_seconds = form.get("peer_rate"), form.get("peer_seconds", 20)
    if peer_rate is not None and (not isinstance(peer_rate, int) or
                                  peer_rate not in {int(st.rate_per_sec) for st in Schedule.parse(form["pace"]).steps}):
        raise bad(f"peer_rate {peer_rate!r} must be the rate of one of the pace's steps ({form['pace']})", "peer_rate")
    if not isinstance(peer_seconds, int) or peer_seconds < 8:
        raise bad(f"peer_seconds {peer_seconds!r}: whole seconds, at least 8", "peer_seconds")
    if form.get("pace_per_pair") and "pairs" not in axes:
        raise bad("pace_per_pair needs a pairs axis", "pace_per_pair")
    at = form.get("target", SUT)
    if at != SUT and at not in sinks():
        raise bad(f"target {at!r}: {SUT} (the SUT broker) or a sink's transport, its receiver in the stack or --target "
                  f"({', '.join(sinks())})", "target")
    if "receivers" in axes and at == SUT:
        raise bad(f"axis 'receivers' is the stack's receiver's: it needs target = a sink's transport ({', '.join(sinks())})")
    report = raw.get("report") or {}
    if set(report) - _REPORT_KEYS:
        raise bad(f"[report]: unknown key {sorted(set(report) - _REPORT_KEYS)[0]!r}")
    rows, columns = report.get("rows", next(iter(axes), "")), tuple(report.get("columns", [a for a in axes][1:]))
    for a in (rows, *columns):
        if a and a not in axes:
            raise bad(f"[report] names {a!r}, which is not an axis")
    try:
        cell_flags = _cell_flags(path, text, form, axes)
    except testfile.FileError as e:
        raise ScenarioError(str(e)) from None
    return Scenario(name=name, path=path, title=form["title"], seed=form["seed"], method=" ".join(form["method"].split()),
                    kind=form["kind"], sut=form["sut"], suts=suts, warmup=str(form.get("warmup", "0s")),
                    cooldown=str(form.get("cooldown", "0s")), drop_timeout=str(form.get("drop_timeout", "30s")),
                    pace=form["pace"], axes={k: list(v) for k, v in axes.items()}, rows=rows, columns=columns,
                    attack=(*(str(x) for x in form.get("attack", ())), *cell_flags), short=short,
                    pace_per_pair=bool(form.get("pace_per_pair", False)), target=form.get("target", SUT),
                    peer_rate=peer_rate, peer_seconds=peer_seconds)
