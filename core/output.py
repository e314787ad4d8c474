"""The streaming job's output contract: the window table's columns, the run summary's keys and the verdict's fields.

The engine writes these names (as partial count names that readers merge into columns), the readers build the table
and the summary from them, and the dashboard, the load generator's thresholds and the tests read them: a name
changes here or nowhere. The merge rules of the partials live here too, written once.
"""
from __future__ import annotations

from enum import StrEnum
from typing import Final, TypedDict


class State(StrEnum):
    """A window's, a step's and a run's state: the one list every reader and writer uses. A ``str``, so it is written
    to JSON and Parquet as its text and compares equal to it."""
    OK = "ok"
    DEGRADING = "degrading"
    OBSERVER_BOUND = "observer-bound"    # flightwatch's own CPU, not the SUT, was the limit
    LOADGEN_BOUND = "loadgen-bound"      # the generator could not send its schedule
    SATURATED = "saturated"
    TELEMETRY_INCOMPLETE = "telemetry-incomplete"  # flightwatch's own telemetry outage: not judged


class Lifecycle(StrEnum):
    """Where a run is (``summary.json``'s ``state``): no window yet, windows being written, closed by its job."""
    WAITING = "waiting for data"
    RUNNING = "running"
    FINISHED = "finished"


class Episode(StrEnum):
    """A shortfall episode's kind (``runs.saturation.episodes``: windows in a row that received short of their sends):
    a stall drained without loss, saturation, or one still open at the run's edge (not judged yet)."""
    STALL = "stall"
    SATURATED = "saturated"
    OPEN = "open"


SEVERITY: Final = (State.OK, State.DEGRADING, State.OBSERVER_BOUND, State.LOADGEN_BOUND, State.SATURATED)
"""The states a judged window can have, mildest first."""

# Window table: one row per window (``window_ns``, the window's start in event time).
WINDOW: Final = "window_ns"

# Counts, summed over a window's partials (by send window: sent, acked, errors, dropped, unaccounted; by receive
# window: received, duplicates, late; orphan receives when given up).
SENT: Final = "sent"
RECEIVED: Final = "received"
ACKED: Final = "acked"
ERRORS: Final = "errors"
DROPPED: Final = "dropped"
DUPLICATES: Final = "duplicates"
LATE: Final = "late"
ORPHAN_RECEIVES: Final = "orphan_receives"
UNACCOUNTED: Final = "unaccounted"                    # sends whose fate a telemetry reset took: not drops
IN_DOUBT: Final = "in_doubt"                          # failed at the sender, yet received in time (in received too)
FAILED_LATE: Final = "failed_late"                    # failed at the sender, yet received after the drop timeout
MISROUTED: Final = "misrouted"                        # first received on a route not its send's: never on time
FAILED_MISROUTED: Final = "failed_misrouted"          # misrouted, and failed at the sender (in errors too)
TELEMETRY_INCOMPLETE: Final = "telemetry_incomplete"  # > 0: a telemetry reset touched the window; not judged
OOM_KILLS: Final = "oom_kills"
CONTAINER_RESTARTS: Final = "container_restarts"
REPEATED_SEND_RECORDS: Final = "repeated_send_records"
REPEATED_RECEIVE_RECORDS: Final = "repeated_receive_records"
CLOCK_SKEW: Final = "clock_skew"                      # receives stamped before their send
NEGATIVE_SEND_DELAY: Final = "negative_send_delay"
SILENCE_NS: Final = "silence_ns"                      # a partial; the table shows it as ``silence_ms``
SILENCE_MS: Final = "silence_ms"

COUNTS: Final = (SENT, RECEIVED, DROPPED, DUPLICATES, LATE, ERRORS, ACKED, OOM_KILLS, ORPHAN_RECEIVES,
                 CONTAINER_RESTARTS, UNACCOUNTED, TELEMETRY_INCOMPLETE, IN_DOUBT, FAILED_LATE, MISROUTED,
                 FAILED_MISROUTED)
"""Integer columns every window table has (0 where nothing happened)."""
RARE_COUNTS: Final = (CLOCK_SKEW, REPEATED_SEND_RECORDS, NEGATIVE_SEND_DELAY)
"""Integer columns present only when something was counted (as are ``errors:<cause>`` and ``overflow:<hist>``)."""
TOTALS: Final = (SENT, RECEIVED, DROPPED, DUPLICATES, LATE, ERRORS)
"""What any time range of a run sums (the dashboard's range figures, the summary's totals)."""

ERRORS_BY_CAUSE: Final = "errors:"  # errors:<cause>: http_503, timeout, refused, ...
OVERFLOW: Final = "overflow:"       # overflow:<hist>: values above the histograms' range
MAX: Final = "max:"                 # max:<name>: merged by max, all other counts by sum
NODE: Final = "node:"               # node:<node>:<metric>: the window's mean of a node metric

# Window status (``runs.table.window_status``), exemplars and freshness.
IN_FLIGHT: Final = "in_flight"
RECEIVE_COMPLETE: Final = "receive_complete"
SETTLED: Final = "settled"
DROPS_FINAL: Final = "drops_final"
GAP: Final = "gap"
SLOWEST: Final = "slowest"
FIRST_DROPPED: Final = "first_dropped"
FIRST_WRITTEN_NS: Final = "first_written_ns"
LAST_WRITTEN_NS: Final = "last_written_ns"

# Histograms, per window: flight time from the actual and from the intended send (by receive window) and the send
# delay (actual - intended, by send window). Columns ``<hist>_p50``, ``_p90``, ``_p99``, ``_max``; ``latency_hdr``.
LATENCY: Final = "latency_us"
LATENCY_INTENDED: Final = "latency_intended_us"
SEND_DELAY: Final = "send_delay_us"
HISTS: Final = (LATENCY, LATENCY_INTENDED, SEND_DELAY)
PERCENTILES: Final = (50, 90, 99)
LATENCY_HDR: Final = "latency_hdr"


def errors_of(cause: str) -> str:
    return ERRORS_BY_CAUSE + cause


def overflow_of(hist: str) -> str:
    return OVERFLOW + hist


def max_of(name: str) -> str:
    """The count of a window's largest ``name`` (merged by max over partials)."""
    return MAX + name


def merges_by_max(names):
    """The merge rule of partial counts: ``max:*`` by max, every other by sum. For one name (a bool) or a pandas
    Series of names (a boolean Series, vectorised: a batch's partials hold a row per record)."""
    return names.startswith(MAX) if isinstance(names, str) else names.str.startswith(MAX)


def percentile_column(hist: str, p: int | str) -> str:
    """``latency_us_p99`` (p=99), ``latency_us_max`` (p="max")."""
    return f"{hist}_p{p}" if isinstance(p, int) else f"{hist}_{p}"


def node_column(node: str, metric: str) -> str:
    return f"{NODE}{node}:{metric}"


def oom_kills(kills_by_detector) -> int:
    """OOM kills from kills per detector over one window or one run: one kill is often seen by two detectors
    (vmstat and its cgroup), so the detector that saw most, not their sum."""
    return int(max(kills_by_detector, default=0))


class Percentiles(TypedDict):
    p50: int | None
    p90: int | None
    p99: int | None
    max: int | None
    count: int


class Gap(TypedDict):
    start_ns: int
    end_ns: int
    duration_s: float
    in_flight: int


class Step(TypedDict):
    step: int
    rate: float
    start_ns: int
    end_ns: int
    sent_per_s: float
    received_per_s: float
    success_ratio: float | None
    p50_us: int | None
    p99_us: int | None
    state: State | None          # the worst that enough of its windows reach


class Verdict(TypedDict, total=False):
    """The saturation detector's verdict (``runs.verdict.verdict``)."""
    state: State                # the message opens with it
    message: str
    stalls: list[dict]          # start_ns, end_ns (window edges), held: shortfalls that drained (not saturation)
    telemetry_incomplete_windows: int  # windows flightwatch's own telemetry outage left unjudged
    saturated_at: dict | None   # window_ns, step, rate, evidence
    knee: dict | None           # step, rate, p99_us: the last step that held
    steps: list[Step]
    latency_bound_us: int
    loadgen_bound_at: dict      # window_ns, step
    observer_bound_at: dict     # window_ns, step
    observer_bound_windows: int  # windows flightwatch's own CPU was the limit in


class Summary(TypedDict, total=False):
    """A run's summary (``runs.results.summarize``, ``summary.json``). Before any window: run_id and state."""
    run_id: str
    state: Lifecycle
    attack: dict                # the load generator's configuration: target, pace, steps, scenario, ...
    settings: dict[str, str]    # window, drop_timeout, watermark_delay as text
    started_at_ns: int | None
    stopped_at_ns: int | None
    stop_reasons: list[dict]
    aborted: bool
    num_windows: int
    sent: int
    received: int
    dropped: int
    duplicates: int
    late: int
    errors: int
    orphan_receives: int
    oom_kills: int
    unaccounted: int
    in_doubt: int               # failed at the sender, yet received in time (counted in received and errors)
    failed_late: int            # failed at the sender, yet received late (counted in late and errors)
    misrouted: int              # first received on a route not the one it was sent to (its own bucket)
    failed_misrouted: int       # misrouted, and failed at the sender (counted in misrouted and errors)
    ledger: dict[str, int]      # every sent event in one bucket (``ledger``)
    loss_ratio: float | None
    errors_by_cause: dict[str, int]
    quarantined: int
    latency_us: Percentiles
    latency_intended_us: Percentiles
    send_delay_us: Percentiles
    exemplars: dict
    gaps: list[Gap]
    oom_events: list[dict]
    oom_kills_by_source: dict[str, int]
    container_restarts: list[dict]
    clock_offsets: list[dict]
    telemetry_lost: dict[str, int]
    telemetry_held: dict[str, dict]
    telemetry_reset: list[dict]
    windows_incomplete: int
    trustworthy_fraction: float
    verdict: Verdict
    watermark_ns: int | None
    num_batches: int


SUMMARY_KEYS: Final = tuple(Summary.__annotations__)
SUMMARY_TOTALS: Final = (SENT, RECEIVED, DROPPED, DUPLICATES, LATE, ERRORS, ORPHAN_RECEIVES, OOM_KILLS, UNACCOUNTED,
                         IN_DOUBT, FAILED_LATE, MISROUTED, FAILED_MISROUTED)
LEDGER: Final = ("received", "late", "dropped", "failed", "in_doubt", "misrouted", "unaccounted", "pending")
"""The ledger's buckets: every sent event in exactly one (``ledger``)."""


def ledger(totals) -> dict[str, int]:
    """Every sent event in exactly one bucket, from a run's (or a range's) totals: ``received`` in time, ``late``
    (received after the drop timeout), ``dropped`` (never received), ``failed`` (an error at the sender, never
    received), ``in_doubt`` (an error at the sender, yet received: the counts have it in ``received`` or ``late`` and
    in ``errors`` both), ``misrouted`` (first received on a route it was not sent to: another pair's address, a queue
    its key is not bound to, a partition not its own; failed at the sender or not), ``unaccounted`` (a telemetry reset
    took its fate), ``pending`` (not decided yet: a live run's sends inside their drop timeout). Their sum is ``sent``.
    Duplicates and orphan receives are beside it, not in it. Totals from before the in-doubt or misrouted counts (an
    older summary) read them as 0."""
    get = lambda k: int(totals.get(k) or 0)  # noqa: E731
    late_ok = get(LATE) - get(FAILED_LATE)  # late receives of sends that did not fail: each also counted as a drop
    out = {"received": get(RECEIVED) - get(IN_DOUBT), "late": late_ok, "dropped": get(DROPPED) - late_ok,
           "failed": get(ERRORS) - get(IN_DOUBT) - get(FAILED_LATE) - get(FAILED_MISROUTED),
           "in_doubt": get(IN_DOUBT) + get(FAILED_LATE), "misrouted": get(MISROUTED), "unaccounted": get(UNACCOUNTED)}
    out["pending"] = get(SENT) - sum(out.values())
    return out


def ledger_text(totals) -> str:
    """``sent 60,000 = received 52,967 + in doubt 3 + failed 7,030``: the buckets that are not empty."""
    led = ledger(totals)
    parts = [f"{k.replace('_', ' ')} {v:,}" for k, v in led.items() if v]
    return f"sent {int(totals.get(SENT) or 0):,} = " + (" + ".join(parts) if parts else "0")


EXEMPLARS = 5
"""Per window, the IDs of this many slowest received events (``kind="slowest"``: at the receive, ``value`` its
flight time in µs, ns-exact) and of the first this many dropped ones (``kind="dropped_id"``: at the send,
``count`` +1, or -1 when a drop named is withdrawn). The top of a union of tops is the top of the union, so any time
range merges exactly, as the histograms do."""
