"""What the telemetry source reads next across time slices (``streaming.topics.plan``), from given broker answers:
slices read in order, retired once over and read, deleted at the next planning, read on after a late write, read
on from where it ended when back under a new ID; a slice gone or recreated is a reset, never a hang. The same source against
the real broker and real writers: ``test_sources.py::test_time_slices_...``."""
from core.slices import parse_slice, slice_name, slice_seconds
from streaming.topics import View, plan, start_of, topic_offsets

BASE = "fw.tel"
T0 = 1_764_079_200  # a slice boundary
S1, S2, S3 = (slice_name(BASE, 60, T0 + i * 60) for i in range(3))


def view(ends: dict, ids: dict | None = None, known: dict | None = None) -> View:
    """The broker holding ``ends`` ({topic: [end per partition]}) under ``ids``."""
    ids = ids or {}
    listing = {t: (ids.get(t, f"id-{t}"), list(range(len(e)))) for t, e in ends.items()}
    fresh = {(t, p): o for t, e in ends.items() for p, o in enumerate(e)}
    return View(listing, fresh, dict(known or fresh))


def offsets(ends: dict, **extra) -> dict:
    return {"topics": {t: {**{str(p): o for p, o in enumerate(e)}, "id": f"id-{t}"} for t, e in ends.items()}, **extra}


def test_slice_names_and_settings():
    assert S1 == f"fw.tel.slice-{T0}-60" and parse_slice(BASE, S1) == (T0, 60)
    assert slice_name(BASE, 60, T0 + 59.9) == S1 and slice_name(BASE, 60, T0 + 60) == S2
    assert parse_slice(BASE, BASE) is None and parse_slice(BASE, "fw.telx.slice-1-60") is None
    assert parse_slice(BASE, "other.slice-1-60") is None
    assert slice_seconds("127.0.0.1:19092", "auto") == 60 and slice_seconds("kafka:9092", "auto") == 0
    assert slice_seconds("127.0.0.1:19092", "off") == 0 and slice_seconds("kafka:9092", "2m") == 120
    for bad in ("5s", "10.5s", "soon"):
        try:
            slice_seconds("kafka:9092", bad)
        except ValueError as e:
            assert "FLIGHTWATCH_TELEMETRY_SLICE" in str(e) or "duration" in str(e)
        else:
            raise AssertionError(bad)


def test_new_slices_are_read_from_their_start_and_the_base_topic_on():
    strikes: dict = {}
    start = offsets({BASE: [5, 5], S1: [10, 10]})
    made = plan(start, view({BASE: [7, 5], S1: [12, 10], S2: [3, 4]}), BASE, strikes, now_s=T0 + 70)
    assert topic_offsets(made.end, BASE) == {BASE: {"0": 7, "1": 5}, S1: {"0": 12, "1": 10}, S2: {"0": 3, "1": 4}}
    assert list(made.end["topics"]) == [BASE, S1, S2] and made.delete == [] and made.reset is None
    assert start_of(made.end, start, BASE) == {BASE: {"0": 5, "1": 5}, S1: {"0": 10, "1": 10}}  # S2 from 0


def test_a_slice_over_and_read_is_retired_then_deleted_then_forgotten():
    strikes: dict = {}
    grace = 30
    # over, but not for the grace yet: read on
    start = offsets({S1: [10, 10], S2: [4, 4]})
    made = plan(start, view({S1: [10, 10], S2: [6, 4]}), BASE, strikes, grace_s=grace, now_s=T0 + 60 + grace - 1)
    assert S1 in made.end["topics"] and "retired" not in made.end
    # past the grace but the batch's start is not at its end: read it first
    start = offsets({S1: [9, 10], S2: [4, 4]})
    made = plan(start, view({S1: [10, 10], S2: [6, 4]}), BASE, strikes, grace_s=grace, now_s=T0 + 60 + grace + 1)
    assert topic_offsets(made.end, BASE)[S1] == {"0": 10, "1": 10} and "retired" not in made.end
    # read to its end in the batch before: retired, not yet deleted
    start = made.end
    made = plan(start, view({S1: [10, 10], S2: [6, 4]}), BASE, strikes, grace_s=grace, now_s=T0 + 60 + grace + 2)
    assert S1 not in made.end["topics"] and made.end["retired"] == {S1: {"0": 10, "1": 10, "id": f"id-{S1}"}}
    assert made.delete == [] and made.reset is None
    # the next planning (the batch that retired it is committed): deleted
    start = made.end
    made = plan(start, view({S1: [10, 10], S2: [6, 4]}), BASE, strikes, grace_s=grace, now_s=T0 + 60 + grace + 3)
    assert made.delete == [S1] and S1 in made.end["retired"]
    # gone from the broker: forgotten, and no reset
    made = plan(made.end, view({S2: [6, 4]}), BASE, strikes, grace_s=grace, now_s=T0 + 60 + grace + 4)
    assert "retired" not in made.end and made.reset is None and list(made.end["topics"]) == [S2]
    made = plan(made.end, view({S2: [6, 4]}), BASE, strikes, grace_s=grace, now_s=T0 + 60 + grace + 5)
    assert made.reset is None and "resets" not in made.end


def test_a_late_write_into_a_retired_slice_is_read_on_and_one_back_under_a_new_id_from_where_it_ended():
    strikes: dict = {}
    start = offsets({S2: [4, 4]}, retired={S1: {"0": 10, "1": 10, "id": f"id-{S1}"}})
    made = plan(start, view({S1: [10, 12], S2: [4, 4]}), BASE, strikes, now_s=T0 + 130)
    assert made.delete == [] and "retired" not in made.end
    assert topic_offsets(made.end, BASE)[S1] == {"0": 10, "1": 12}
    assert start_of(made.end, start, BASE).get(S1) is None  # ... from where it was: the retired ends
    # deleted, then back under a new ID: read on from where the deleted one ended, never again from its start
    start = offsets({S2: [4, 4]}, retired={S1: {"0": 10, "1": 10, "id": f"id-{S1}"}})
    made = plan(start, view({S1: [1, 0], S2: [4, 4]}, ids={S1: "new"}, known={}), BASE, strikes, now_s=T0 + 130)
    assert made.reset is None and "retired" not in made.end
    assert made.end["topics"][S1] == {"0": 10, "1": 10, "id": "new"} and start_of(made.end, start, BASE)[S1] == {"0": 10, "1": 10}


def test_a_slice_gone_twice_in_a_row_is_a_reset_with_what_was_known_and_unread():
    strikes: dict = {}
    start = offsets({S1: [10, 10], S2: [4, 4]})
    known = {(S1, 0): 15, (S1, 1): 12, (S2, 0): 4, (S2, 1): 4}
    first = plan(start, View({S2: (f"id-{S2}", [0, 1])}, {(S2, 0): 4, (S2, 1): 4}, known), BASE, strikes, now_s=T0 + 70)
    assert first.reset is None and topic_offsets(first.end, BASE)[S1] == {"0": 10, "1": 10}  # one answer: wait
    made = plan(start, View({S2: (f"id-{S2}", [0, 1])}, {(S2, 0): 4, (S2, 1): 4}, known), BASE, strikes, now_s=T0 + 70)
    assert made.reset == f"the slice {S1} is gone" and made.end["reset_lost"] == 5 + 2
    assert made.end["resets"] == 1 and made.end["reset_topics"] == [S1] and S1 not in made.end["topics"]


def test_a_recreated_slice_is_a_reset_read_from_its_start_and_the_broker_away_is_not():
    strikes: dict = {}
    start = offsets({S1: [10, 10]}, resets=1)
    made = plan(start, view({S1: [2, 1]}, ids={S1: "other"}, known={(S1, 0): 10, (S1, 1): 11}), BASE, strikes,
                now_s=T0 + 30)
    assert "recreated" in made.reset and made.end["resets"] == 2 and made.end["reset_lost"] == 1
    assert made.end["topics"][S1] == {"0": 2, "1": 1, "id": "other"} and start_of(made.end, start, BASE) == {}
    away = plan(start, View(None, {}, {(S1, 0): 12, (S1, 1): 10}), BASE, strikes, now_s=T0 + 30)
    assert away.reset is None and topic_offsets(away.end, BASE) == {S1: {"0": 12, "1": 10}}


def test_offsets_of_an_older_checkpoint_are_the_base_topics():
    strikes: dict = {}
    made = plan({"0": 3, "1": 4, "topic_id": "x", "resets": 1}, view({BASE: [5, 4]}), BASE, strikes, now_s=T0)
    assert topic_offsets(made.end, BASE) == {BASE: {"0": 5, "1": 4}} and made.end["resets"] == 1
    assert start_of(made.end, {"0": 3, "1": 4}, BASE) == {BASE: {"0": 3, "1": 4}}


def test_a_recreated_topic_and_a_missing_slice_are_one_reset():
    strikes: dict = {}
    start = offsets({BASE: [3, 3], S1: [10, 10]})
    made = plan(start, view({BASE: [0, 0]}, ids={BASE: "new"}, known={}), BASE, strikes, now_s=T0 + 30)
    assert made.end["resets"] == 1 and made.end["reset_topics"] == [BASE, S1]
    assert made.reset == f"the topic {BASE} was recreated (ID id-{BASE} -> new); the slice {S1} is gone"


def test_a_slice_back_after_its_deletion_is_read_on_from_where_it_ended_and_deleted_at_most_three_times():
    """Tansu 0.6 creates a topic a client produces to or asks about, and answered a deleted slice brought back so with
    the deleted one's ends and no records: read on from those ends (nothing again, nothing waited for)."""
    strikes: dict = {}
    grace, now = 30, T0 + 200
    start = offsets({S3: [1, 1]}, retired={S1: {"0": 10, "1": 12, "id": f"id-{S1}"}})
    made = plan(start, view({S3: [1, 1]}), BASE, strikes, grace_s=grace, now_s=now)  # deleted
    assert made.end["deleted"] == {S1: {"0": 10, "1": 12, "n": 1}} and "retired" not in made.end
    back = view({S1: [10, 12], S3: [1, 1]}, ids={S1: "again"})
    made2 = plan(made.end, back, BASE, strikes, grace_s=grace, now_s=now + 1)
    assert made2.end["from"] == {S1: {"0": 10, "1": 12}} and made2.end["topics"][S1] == {"0": 10, "1": 12, "id": "again"}
    assert start_of(made2.end, made.end, BASE)[S1] == {"0": 10, "1": 12}  # nothing to read again
    # first back empty (its ends come back later, its records never): from where the deleted one ended all the same
    empty = plan(made.end, view({S1: [0, 0], S3: [1, 1]}, ids={S1: "again"}), BASE, strikes, grace_s=grace, now_s=now + 1)
    assert empty.end["topics"][S1] == {"0": 10, "1": 12, "id": "again"}
    assert start_of(empty.end, made.end, BASE)[S1] == {"0": 10, "1": 12}
    # a late write into it: read from where the deleted one ended
    late = view({S1: [11, 12], S3: [1, 1]}, ids={S1: "again"})
    made3 = plan(made.end, late, BASE, strikes, grace_s=grace, now_s=now + 1)
    assert start_of(made3.end, made.end, BASE)[S1] == {"0": 10, "1": 12} and made3.end["topics"][S1]["0"] == 11
    # read, over: retired and deleted again, at most MAX_DELETIONS times in all
    for n in (2, 3):
        gone = plan(made2.end, view({S1: [10, 12], S3: [1, 1]}, ids={S1: "again"}), BASE, strikes, grace_s=grace, now_s=now + n)
        assert S1 in gone.end["retired"] and gone.end["retired"][S1]["n"] == n - 1
        made = plan(gone.end, view({S3: [1, 1]}), BASE, strikes, grace_s=grace, now_s=now + n)
        assert made.end["deleted"][S1]["n"] == n
        made2 = plan(made.end, back, BASE, strikes, grace_s=grace, now_s=now + n)
    kept = plan(made2.end, view({S1: [10, 12], S3: [1, 1]}, ids={S1: "again"}), BASE, strikes, grace_s=grace, now_s=now + 5)
    assert "retired" not in kept.end and S1 in kept.end["topics"]
