"""What the telemetry source reads next: the topic and its time slices (``core.slices``), a broker that lost its
data, and slices deleted once read. Pure functions of the offsets and of what the broker said; ``streaming.sources``
asks the broker.

Offsets (a micro-batch's end, in Spark's offset log)::

    {"topics": {"<topic>": {"<partition>": next offset, ..., "id": "<topic ID>"}, ...},
     "retired": {"<slice>": {"<partition>": its end, ..., "id": ...}},   # read and committed: delete it
     "deleted": {"<slice>": {"<partition>": its end, ..., "n": times}},  # deleted lately
     "from": {"<slice>": {"<partition>": offset}},   # this batch reads a slice back after deletion from there
     "resets": n, "reset_at_ns": ..., "reset_reason": ..., "reset_lost": ..., "reset_topics": [...]}

Offsets of older checkpoints, ``{"<partition>": offset, "topic_id": ...}``, are the base topic's.

A slice is retired when its time is over (``core.slices.RETIRE_GRACE_S`` past its end), the batch's start is at
its end (so every record of it is in a committed batch, and archived) and the broker says it has nothing more. The
next planning, whose start is the end of the batch that retired it (committed too), deletes it, unless something
was written into it since: then it is read again from where it was. A slice that comes back after its deletion
(under a new ID: on the embedded stack every deleted slice came back at once, empty, then with the deleted one's
ends and none of its records) is read on from where the deleted one ended, never from its start; a slice is deleted
at most ``MAX_DELETIONS`` times, then left (it holds nothing).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from core.slices import RETIRE_GRACE_S, parse_slice, read_order

MAX_DELETIONS = 3
DELETED_KEPT_S = 600
"""How long past its end a deleted slice is remembered (to read one that comes back from where it ended)."""
RESET_KEYS = ("reset_at_ns", "reset_reason", "reset_lost", "reset_topics")
STRIKES = 2
"""Plannings in a row that must find a topic gone, or its end below the job's, before that counts as lost data
(one answer could be a stale fetch's, and a false reset reads a topic again from its start)."""

Ends = dict[str, dict[str, int]]
"""Per topic, per partition (as a string, as JSON has it): an offset."""


def topic_offsets(offsets: dict, base: str) -> Ends:
    """Each topic's partitions' offsets (without IDs); offsets of an older checkpoint are ``base``'s."""
    if "topics" in offsets:
        return {t: {p: int(o) for p, o in parts.items() if p != "id"} for t, parts in offsets["topics"].items()}
    return {base: {p: int(o) for p, o in offsets.items() if p.isdigit()}}


def topic_ids(offsets: dict) -> dict[str, str]:
    return {t: parts["id"] for t, parts in offsets.get("topics", {}).items() if parts.get("id")}


def retired_of(offsets: dict) -> dict[str, dict]:
    return offsets.get("retired", {})


def offsets_of(ends: Ends, ids: dict[str, str], retired: dict[str, dict], resets: int, deleted: dict | None = None,
               since: Ends | None = None, **reset) -> dict:
    out: dict = {"topics": {t: {**{p: ends[t][p] for p in sorted(ends[t], key=int)}, **({"id": ids[t]} if ids.get(t) else {})}
                            for t in ends}}
    for key, value in (("retired", retired), ("deleted", deleted), ("from", since)):
        if value:
            out[key] = value
    if resets:
        out["resets"] = resets
    return {**out, **reset}


@dataclass
class View:
    """What the broker said at one planning."""

    listing: dict[str, tuple[str | None, list[int]]] | None
    """Our topics (the base and its slices): ID (None if unknown) and partitions; None: the broker is away."""
    fresh: dict[tuple[str, int], int] = field(default_factory=dict)
    """Each partition's end in this planning's fetch answers."""
    known: dict[tuple[str, int], int] = field(default_factory=dict)
    """The highest end seen per partition before this planning, of the topics the job reads."""


@dataclass
class Plan:
    end: dict
    delete: list[str] = field(default_factory=list)
    reset: str | None = None


def plan(start: dict, view: View, base: str, strikes: dict[str, int], now_s: float | None = None,
         grace_s: float = RETIRE_GRACE_S) -> Plan:
    """The end of the next batch from ``start`` (before admission control and idle batching), the slices to delete
    now, and, when the broker lost data the job had not read, why. ``strikes`` is kept between plannings."""
    now_s = time.time() if now_s is None else now_s
    cur, ids, retired = topic_offsets(start, base), topic_ids(start), dict(retired_of(start))
    deleted = {t: d for t, d in start.get("deleted", {}).items()
               if t not in cur and (span := parse_slice(base, t)) and now_s < span[0] + span[1] + grace_s + DELETED_KEPT_S}
    resets = int(start.get("resets", 0))
    if view.listing is None:  # away: plan up to what is known
        ends = {t: {p: max(o, view.known.get((t, int(p)), 0)) for p, o in parts.items()} for t, parts in cur.items()}
        return Plan(offsets_of(ends, ids, retired, resets, deleted))
    listing = view.listing

    def fresh_of(t: str) -> dict[str, int] | None:
        """The topic's ends in this planning's answers, if every partition answered."""
        got = {str(p): view.fresh[(t, p)] for p in listing[t][1] if (t, p) in view.fresh}
        return got if listing[t][1] and len(got) == len(listing[t][1]) else None

    # slices retired by the batch before: delete them, unless written to since
    delete = []
    for t, was in list(retired.items()):
        if t not in listing or listing[t][0] not in (None, was.get("id")):
            del retired[t]  # deleted (and maybe back already: read below from where it ended)
            deleted[t] = {**{p: o for p, o in was.items() if p not in ("id", "n")}, "n": was.get("n", 0) + 1}
            continue
        ends = fresh_of(t)
        behind = {p: o for p, o in was.items() if p not in ("id", "n")}
        if ends is not None and ends == behind:
            delete.append(t)
        elif ends is not None and any(ends.get(p, 0) > o for p, o in behind.items()):
            del retired[t]  # a late write: read on from where it was
            cur[t] = behind
            ids[t] = was.get("id", "")
    # what the broker lost
    why: dict[str, str] = {}
    for t, parts in cur.items():
        if t not in listing:
            bad = "is gone"
        elif ids.get(t) and listing[t][0] and listing[t][0] != ids[t]:
            why[t] = f"was recreated (ID {ids[t]} -> {listing[t][0]})"
            continue
        else:
            ends = {str(p): view.fresh[(t, p)] for p in listing[t][1] if (t, p) in view.fresh}
            back = {p: (o, ends[p]) for p, o in parts.items() if p in ends and ends[p] < o}
            bad = ("its end offsets went back (" + ", ".join(f"partition {p}: {o} -> {e}" for p, (o, e) in sorted(back.items())) + ")"
                   if back and not (ids.get(t) and listing[t][0]) else "")
        strikes[t] = strikes.get(t, 0) + 1 if bad else 0
        if bad and strikes[t] >= STRIKES:
            why[t] = bad
    if why:  # a broker that lost some of our topics lost them all: those missing now are gone too (one reset)
        why.update({t: "is gone" for t in cur if t not in listing and t not in why})
    for t in why:
        strikes.pop(t, None)
    for t in list(strikes):
        if t not in cur:
            del strikes[t]
    reset: dict = {}
    if why:
        lost = sum(max(view.known.get((t, int(p)), 0) - o, 0) for t in why for p, o in cur[t].items())
        reason = "; ".join(f"the topic {t} {w}" if t == base else f"the slice {t} {w}" for t, w in sorted(why.items()))
        reset = {"reset_at_ns": time.time_ns(), "reset_reason": reason, "reset_lost": lost, "reset_topics": sorted(why)}
        resets += 1
        for t in why:
            cur.pop(t)
            ids.pop(t, None)
    # every topic the broker holds, from where the job is (a new one, or one the broker lost, from its start)
    ends: Ends = {}
    since: Ends = {}
    for t, (tid, parts) in sorted(listing.items(), key=lambda kv: read_order(base, kv[0])):
        if t in retired:
            continue
        if t in cur:
            ends[t] = {str(p): max(view.known.get((t, p), 0), view.fresh.get((t, p), 0), cur[t].get(str(p), 0))
                       for p in parts}
        else:  # what this planning's answers say (the ends known may be an earlier topic's of the same name)
            ends[t] = {str(p): view.fresh.get((t, p), 0) for p in parts}
            if t in deleted:  # back after its deletion: on from where it ended (its ends come back: records do not)
                gone = deleted[t]
                since[t] = {p: gone.get(p, 0) for p in ends[t]}
                ends[t] = {p: max(e, since[t][p]) for p, e in ends[t].items()}
        if tid:
            ids[t] = tid
    for t, parts in cur.items():  # gone, not yet for sure: stay where they are
        if t not in ends and t not in listing:
            ends[t] = dict(parts)
    # slices over, read to their end in committed batches, and with nothing more: retire (deleted next planning)
    if not why:
        for t, parts in cur.items():
            span = parse_slice(base, t)
            if span is None or now_s < span[0] + span[1] + grace_s or t not in listing:
                continue
            times = start.get("deleted", {}).get(t, {}).get("n", 0)
            if fresh_of(t) == parts and ends.get(t) == parts and times < MAX_DELETIONS:
                retired[t] = {**parts, **({"id": ids[t]} if ids.get(t) else {}), **({"n": times} if times else {})}
                ends.pop(t)
    deleted = {t: d for t, d in deleted.items() if t not in retired and (t not in cur or t in since)}
    keep = {t: d for t, d in start.get("deleted", {}).items() if t in cur and d.get("n", 0) and t not in retired}
    deleted.update({t: {"n": d["n"]} for t, d in keep.items()})  # back and read on: how often it was deleted stays
    return Plan(offsets_of(ends, ids, retired, resets, deleted, since, **reset), delete, reset.get("reset_reason"))


def start_of(end: dict, start: dict, base: str) -> Ends:
    """Where a batch from ``start`` to ``end`` reads each topic from: a topic the broker lost, from its start."""
    lost = set(end.get("reset_topics", ())) if int(end.get("resets", 0)) > int(start.get("resets", 0)) else set()
    if lost and "topics" not in start:  # older offsets: the base topic
        lost.add(base)
    begin = {t: parts for t, parts in topic_offsets(start, base).items() if t not in lost}
    for t, parts in end.get("from", {}).items():  # a slice back after its deletion
        begin.setdefault(t, parts)
    return begin


def ordered(base: str, ends: Ends) -> list[tuple[str, str]]:
    """(topic, partition) in reading order: the base topic, then slices oldest first; partitions in order."""
    return [(t, p) for t in sorted(ends, key=lambda t: read_order(base, t)) for p in sorted(ends[t], key=int)]
