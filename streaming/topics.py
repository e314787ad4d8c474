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
    p = _Planning(start, view, base, strikes, time.time() if now_s is None else now_s, grace_s)
    if view.listing is None:  # away: plan up to what is known
        return Plan(offsets_of(p.known_ends(), p.ids, p.retired, p.resets, p.deleted))
    delete = p.delete_retired()
    why = p.lost()
    reset = p.reset(why)
    ends, since = p.ends()
    if not why:
        p.retire(ends)
    return Plan(offsets_of(ends, p.ids, p.retired, p.resets, p.deletions(since), since, **reset), delete,
                reset.get("reset_reason"))


class _Planning:
    """One planning's working state; ``plan`` calls its steps in order, each on what the ones before it left."""

    def __init__(self, start: dict, view: View, base: str, strikes: dict[str, int], now_s: float, grace_s: float) -> None:
        self.start, self.view, self.base, self.strikes, self.now_s, self.grace_s = start, view, base, strikes, now_s, grace_s
        self.cur, self.ids, self.retired = topic_offsets(start, base), topic_ids(start), dict(retired_of(start))
        self.deleted = {t: d for t, d in start.get("deleted", {}).items()
                        if t not in self.cur and (span := parse_slice(base, t))
                        and now_s < span[0] + span[1] + grace_s + DELETED_KEPT_S}
        self.resets = int(start.get("resets", 0))
        self.listing = view.listing or {}

    def known_ends(self) -> Ends:
        """The broker away: every topic read up to what is known of it."""
        return {t: {p: max(o, self.view.known.get((t, int(p)), 0)) for p, o in parts.items()} for t, parts in self.cur.items()}

    def fresh_of(self, t: str) -> dict[str, int] | None:
        """The topic's ends in this planning's answers, if every partition answered."""
        got = {str(p): self.view.fresh[(t, p)] for p in self.listing[t][1] if (t, p) in self.view.fresh}
        return got if self.listing[t][1] and len(got) == len(self.listing[t][1]) else None

    def delete_retired(self) -> list[str]:
        """The slices retired by the batch before, to delete now, unless written to since (then read on)."""
        delete = []
        for t, was in list(self.retired.items()):
            if t not in self.listing or self.listing[t][0] not in (None, was.get("id")):
                del self.retired[t]  # deleted (and maybe back already: read below from where it ended)
                self.deleted[t] = {**{p: o for p, o in was.items() if p not in ("id", "n")}, "n": was.get("n", 0) + 1}
                continue
            ends = self.fresh_of(t)
            behind = {p: o for p, o in was.items() if p not in ("id", "n")}
            if ends is not None and ends == behind:
                delete.append(t)
            elif ends is not None and any(ends.get(p, 0) > o for p, o in behind.items()):
                del self.retired[t]  # a late write: read on from where it was
                self.cur[t] = behind
                self.ids[t] = was.get("id", "")
        return delete

    def _suspect(self, t: str, parts: dict[str, int]) -> str:
        """Why the topic may have lost data ("" when it did not): gone, or its end offsets went back."""
        if t not in self.listing:
            return "is gone"
        ends = {str(p): self.view.fresh[(t, p)] for p in self.listing[t][1] if (t, p) in self.view.fresh}
        back = {p: (o, ends[p]) for p, o in parts.items() if p in ends and ends[p] < o}
        if not back or (self.ids.get(t) and self.listing[t][0]):
            return ""
        return "its end offsets went back (" + ", ".join(f"partition {p}: {o} -> {e}" for p, (o, e) in sorted(back.items())) + ")"

    def lost(self) -> dict[str, str]:
        """Per topic the broker lost, why: recreated at once, or found suspect ``STRIKES`` plannings in a row."""
        why: dict[str, str] = {}
        strikes = self.strikes
        for t, parts in self.cur.items():
            if t in self.listing and self.ids.get(t) and self.listing[t][0] and self.listing[t][0] != self.ids[t]:
                why[t] = f"was recreated (ID {self.ids[t]} -> {self.listing[t][0]})"
                continue
            bad = self._suspect(t, parts)
            strikes[t] = strikes.get(t, 0) + 1 if bad else 0
            if bad and strikes[t] >= STRIKES:
                why[t] = bad
        if why:  # a broker that lost some of our topics lost them all: those missing now are gone too (one reset)
            why.update({t: "is gone" for t in self.cur if t not in self.listing and t not in why})
        for t in why:
            strikes.pop(t, None)
        for t in list(strikes):
            if t not in self.cur:
                del strikes[t]
        return why

    def reset(self, why: dict[str, str]) -> dict:
        """The offsets' reset keys for what the broker lost; its topics are read again from their start."""
        if not why:
            return {}
        lost = sum(max(self.view.known.get((t, int(p)), 0) - o, 0) for t in why for p, o in self.cur[t].items())
        reason = "; ".join(f"the topic {t} {w}" if t == self.base else f"the slice {t} {w}" for t, w in sorted(why.items()))
        self.resets += 1
        for t in why:
            self.cur.pop(t)
            self.ids.pop(t, None)
        return {"reset_at_ns": time.time_ns(), "reset_reason": reason, "reset_lost": lost, "reset_topics": sorted(why)}

    def ends(self) -> tuple[Ends, Ends]:
        """(every topic the broker holds, to its end, from where the job is: a new one, or one the broker lost, from
        its start; where a slice back after its deletion is read from)."""
        ends: Ends = {}
        since: Ends = {}
        view = self.view
        for t, (tid, parts) in sorted(self.listing.items(), key=lambda kv: read_order(self.base, kv[0])):
            if t in self.retired:
                continue
            if t in self.cur:
                ends[t] = {str(p): max(view.known.get((t, p), 0), view.fresh.get((t, p), 0), self.cur[t].get(str(p), 0))
                           for p in parts}
            else:  # what this planning's answers say (the ends known may be an earlier topic's of the same name)
                ends[t] = {str(p): view.fresh.get((t, p), 0) for p in parts}
                if t in self.deleted:  # back after its deletion: on from where it ended (its ends come back: records do not)
                    gone = self.deleted[t]
                    since[t] = {p: gone.get(p, 0) for p in ends[t]}
                    ends[t] = {p: max(e, since[t][p]) for p, e in ends[t].items()}
            if tid:
                self.ids[t] = tid
        for t, parts in self.cur.items():  # gone, not yet for sure: stay where they are
            if t not in ends and t not in self.listing:
                ends[t] = dict(parts)
        return ends, since

    def retire(self, ends: Ends) -> None:
        """Slices over, read to their end in committed batches, and with nothing more: retired (out of ``ends``;
        deleted next planning)."""
        for t, parts in self.cur.items():
            span = parse_slice(self.base, t)
            if span is None or self.now_s < span[0] + span[1] + self.grace_s or t not in self.listing:
                continue
            times = self.start.get("deleted", {}).get(t, {}).get("n", 0)
            if self.fresh_of(t) == parts and ends.get(t) == parts and times < MAX_DELETIONS:
                self.retired[t] = {**parts, **({"id": self.ids[t]} if self.ids.get(t) else {}), **({"n": times} if times else {})}
                ends.pop(t)

    def deletions(self, since: Ends) -> dict:
        """The slices deleted lately, to remember: how often a slice back and read on was deleted stays."""
        deleted = {t: d for t, d in self.deleted.items() if t not in self.retired and (t not in self.cur or t in since)}
        keep = {t: d for t, d in self.start.get("deleted", {}).items()
                if t in self.cur and d.get("n", 0) and t not in self.retired}
        deleted.update({t: {"n": d["n"]} for t, d in keep.items()})
        return deleted


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
