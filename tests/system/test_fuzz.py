"""Bad input, fuzzed with hypothesis: telemetry records, the command lines, the HTTP receiver.

Telemetry: 10,000 malformed records (truncated, wrong types, unknown kinds, missing fields, huge values, negative or
far-future timestamps, non-finite numbers, deep nesting, other versions, garbage bytes) are spread through a synthetic
run of known truth. Every one must be quarantined and counted, and the run's results must be exactly those of the run
without them: first through decode + engine (hypothesis drives it, 25 examples of 400 records: 19 CPU-s here, where
100 examples of 100 took 50, each example costing a pass over the whole run), then the same 10,000 records through the
real Spark job. (A receive stamped before its send is not malformed but clock skew, counted in
``clock_skew``, tested with the engine's tables.)
"""
from __future__ import annotations

import json
import math
import time

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from core import contract, output
from core.contract import KINDS, MAX_TS_NS, MIN_TS_NS
from loadgen.synthetic import SyntheticSpec, generate, messages, truth
from streaming import engine
from streaming.decode import decode_messages

RUN = "fuzz"
FUZZ_EXAMPLES, LINES_PER_EXAMPLE = 25, 400
GOOD_AT_NS = 1_800_000_000 * 10**9
SPEC = SyntheticSpec(run_id=RUN, duration_s=12, rate_per_sec=40, pause=(5.0, 2.0), late_count=2, num_malformed=0,
                     drop_timeout_s=3, oom_at_s=(6.5,))

# --- strategies: each draws one line that must be quarantined --------------------------------------

TEMPLATES = [
    contract.Send(RUN, "lg-0", GOOD_AT_NS, event_id="x-1", intended_at_ns=GOOD_AT_NS, bytes_out=100, worker=0),
    contract.Receive(RUN, "rx", GOOD_AT_NS, event_id="x-1", bytes_in=100),
    contract.Ack(RUN, "lg-0", GOOD_AT_NS, event_id="x-1", sent_at_ns=GOOD_AT_NS, status=202),
    contract.NodeSample(contract.ANY_RUN, "nm", GOOD_AT_NS, node="n1", metric="cpu_util", value=0.5),
    contract.OomEvent(contract.ANY_RUN, "nm", GOOD_AT_NS, source="cgroup", where="n1:/x", count=1),
    contract.ClockOffset(RUN, "rx", GOOD_AT_NS, reference="127.0.0.1:19123", offset_us=1.0, rtt_us=2.0),
    contract.Heartbeat(RUN, "job", GOOD_AT_NS),
]
WRONG_TYPED = {  # a value of another JSON type than the field's
    "int": st.one_of(st.text(max_size=8), st.booleans(), st.floats(allow_nan=False, allow_infinity=False).filter(
        lambda f: f != int(f)), st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2)),
    "str": st.one_of(st.integers(), st.floats(allow_nan=False, allow_infinity=False), st.booleans(),
                     st.lists(st.text(max_size=3), max_size=3)),
    "float": st.one_of(st.text(max_size=8), st.booleans(), st.lists(st.floats(), max_size=2)),
}


def _kind_of(field_type) -> str:
    import pyarrow as pa

    return "int" if pa.types.is_integer(field_type) else "float" if pa.types.is_floating(field_type) else "str"


@st.composite
def wrong_type(draw):
    rec = draw(st.sampled_from(TEMPLATES)).to_dict()
    name = draw(st.sampled_from(sorted(k for k in rec if k in contract.FIELD_TYPES and k not in ("v", "kind"))))
    rec[name] = draw(WRONG_TYPED[_kind_of(contract.FIELD_TYPES[name])])
    return json.dumps(rec)


@st.composite
def truncated(draw):
    text = json.dumps(draw(st.sampled_from(TEMPLATES)).to_dict())
    return text[: draw(st.integers(1, len(text) - 1))]


@st.composite
def unknown_kind(draw):
    rec = draw(st.sampled_from(TEMPLATES)).to_dict()
    rec["kind"] = draw(st.text(max_size=12).filter(lambda k: k not in KINDS))
    return json.dumps(rec)


@st.composite
def missing_required(draw):
    t = draw(st.sampled_from(TEMPLATES))
    rec = t.to_dict()
    del rec[draw(st.sampled_from(sorted(set(type(t).REQUIRED) & set(rec))))]
    return json.dumps(rec)


@st.composite
def bad_time(draw):
    rec = draw(st.sampled_from(TEMPLATES)).to_dict()
    name = draw(st.sampled_from(sorted(k for k in rec if k.endswith("_ns"))))
    rec[name] = draw(st.one_of(st.integers(-(2**63), MIN_TS_NS - 1), st.integers(MAX_TS_NS + 1, 2**63 - 1)))
    return json.dumps(rec)


@st.composite
def huge(draw):
    rec = draw(st.sampled_from(TEMPLATES)).to_dict()
    name = draw(st.sampled_from(sorted(k for k in rec if _kind_of(contract.FIELD_TYPES.get(k, None) or 0) != "str"
                                       and k in contract.FIELD_TYPES and k not in ("v",))))
    if _kind_of(contract.FIELD_TYPES[name]) == "int":
        rec[name] = draw(st.one_of(st.integers(2**63, 10**40), st.integers(-(10**40), -(2**63) - 1)))
        return json.dumps(rec)
    rec[name] = draw(st.sampled_from([math.inf, -math.inf, math.nan]))  # json.dumps writes Infinity / NaN
    return json.dumps(rec)


@st.composite
def bad_version(draw):
    rec = draw(st.sampled_from(TEMPLATES)).to_dict()
    rec["v"] = draw(st.integers().filter(lambda v: v != contract.SCHEMA_VERSION))
    return json.dumps(rec)


@st.composite
def deeply_nested(draw):
    depth = draw(st.integers(50, 5000))
    rec = draw(st.sampled_from(TEMPLATES)).to_dict()
    return json.dumps(rec)[:-1] + ', "at_ns": ' + "[" * depth + "1" + "]" * depth + "}"


not_an_object = st.one_of(st.integers(), st.floats(allow_nan=False), st.text(max_size=20), st.lists(st.integers(), max_size=4),
                          st.none(), st.booleans()).map(json.dumps)
garbage = st.one_of(st.text(min_size=1, max_size=200), st.binary(min_size=1, max_size=200).map(
    lambda b: b.decode("latin-1"))).map(lambda s: s.replace("\n", " ").replace("\r", " ")).filter(
    lambda s: s.strip() and not s.strip().startswith("{"))

BAD_LINE = st.one_of(truncated(), wrong_type(), unknown_kind(), missing_required(), bad_time(), huge(), bad_version(),
                     deeply_nested(), not_an_object, garbage)


def is_bad(line: str) -> bool:
    """Independent of the decoder: no valid record of this contract could be this line."""
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):
        return True
    if not isinstance(obj, dict) or obj.get("v") != contract.SCHEMA_VERSION or obj.get("kind") not in KINDS:
        return True
    for name, value in obj.items():
        if name not in contract.FIELD_TYPES:
            continue
        kind = _kind_of(contract.FIELD_TYPES[name])
        if value is None:
            continue
        if kind == "int" and (type(value) is not int or not -(2**63) <= value < 2**63):
            return True
        if kind == "float" and (type(value) not in (int, float) or not math.isfinite(value)):
            return True
        if kind == "str" and type(value) is not str:
            return True
        if name.endswith("_ns") and not MIN_TS_NS <= value <= MAX_TS_NS:
            return True
    return any(obj.get(r) is None for r in KINDS[obj["kind"]].REQUIRED)


# --- the clean run, and a run with bad lines spread through it -------------------------------------

CLEAN = generate(SPEC)
CLEAN_MESSAGES = [v for _, v, _ in messages(CLEAN, 50)]


def process(values: list[bytes]) -> tuple[pd.Series, int]:
    """decode + engine over the messages in 3 batches: (window counts, quarantined rows)."""
    state, counts, quarantined = engine.EngineState(), [], 0
    cfg = engine.EngineConfig(run_id=RUN, drop_timeout_ns=SPEC.drop_timeout_s * 10**9)
    for chunk in np.array_split(np.arange(len(values)), 3):
        table = decode_messages([values[i] for i in chunk], [0] * len(chunk), [int(i) for i in chunk])
        state, r = engine.process(state, table, cfg)
        counts.append(r.counts)
        quarantined += r.quarantine.num_rows
    c = pd.concat(counts)
    c = c[~c["name"].str.startswith(output.MAX)].groupby(["window_ns", "name"])["value"].sum()
    return c[c != 0], quarantined


def spread(lines: list[str], rnd) -> list[bytes]:
    """Each bad line into a random message of the clean run (after a random good line)."""
    values = list(CLEAN_MESSAGES)
    for line in lines:
        i = rnd.randrange(len(values))
        parts = values[i].split(b"\n")
        parts.insert(rnd.randrange(len(parts) + 1), line.encode("utf-8", errors="surrogatepass"))
        values[i] = b"\n".join(parts)
    return values


BASELINE, BASE_QUARANTINED = process(CLEAN_MESSAGES)
COLLECTED: list[str] = []


@settings(max_examples=FUZZ_EXAMPLES, deadline=None, derandomize=True, database=None,
          phases=[Phase.explicit, Phase.generate, Phase.shrink], suppress_health_check=[HealthCheck.too_slow])
@given(lines=st.lists(BAD_LINE, min_size=LINES_PER_EXAMPLE, max_size=LINES_PER_EXAMPLE), rnd=st.randoms(use_true_random=False))
def _quarantined_and_nothing_else_changes(lines, rnd):
    assert all(is_bad(line) for line in lines)
    counts, quarantined = process(spread(lines, rnd))
    assert quarantined == BASE_QUARANTINED + len(lines)
    pd.testing.assert_series_equal(counts, BASELINE)
    COLLECTED.extend(lines)


def test_10000_fuzzed_records_are_quarantined_and_change_nothing():
    assert BASE_QUARANTINED == 0 and BASELINE.loc[(slice(None), "sent")].sum() == truth(CLEAN)["num_sent"]
    COLLECTED.clear()
    _quarantined_and_nothing_else_changes()
    assert len(COLLECTED) >= FUZZ_EXAMPLES * LINES_PER_EXAMPLE == 10_000


@pytest.mark.integration
@pytest.mark.faults
def test_the_job_quarantines_10000_fuzzed_records_and_keeps_the_truth(broker, tmp_path):
    """The same 10,000 records (drawn by the test above) through the real Spark job."""
    import random

    from kafka import KafkaProducer
    from support import create_topic, run_job

    from runs import results
    from runs.reader import RunReader

    if len(COLLECTED) < 10_000:  # run alone: draw them
        _quarantined_and_nothing_else_changes()
    lines = COLLECTED[:10_000]
    topic = "tel-fuzz"
    create_topic(broker, topic)
    producer = KafkaProducer(bootstrap_servers=broker, max_request_size=8 << 20)
    for v in spread(lines, random.Random(11)):
        producer.send(topic, key=b"fuzz", value=v)
    producer.flush()
    producer.close()
    r = run_job("run", "--run", RUN, "--bootstrap", broker, "--topic", topic, "--out", str(tmp_path / RUN),
                "--no-heartbeat", "--available-now", "--drop-timeout", f"{SPEC.drop_timeout_s}s")
    assert r.returncode == 0 and "FINISHED" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
    s = results.summarize(str(tmp_path / RUN))
    t = truth(CLEAN)
    q = RunReader(str(tmp_path / RUN)).quarantine()
    print(f"\nfuzz through the job: {len(lines):,} bad records, quarantined {s['quarantined']:,}; "
          f"reasons: {q['quarantine_reason'].str.split(':').str[0].value_counts().head(8).to_dict()}")
    assert s["quarantined"] == len(q) == 10_000
    assert (s["sent"], s["received"], s["dropped"], s["duplicates"], s["late"], s["errors"]) == (
        t["num_sent"], t["num_received"], t["num_dropped"], t["num_duplicates"], t["num_late"], t["num_errors"])
    for p in (50, 99):
        exact = np.percentile(t["all_latency_us"], p, method="inverted_cdf")
        assert abs(s["latency_us"][f"p{p}"] - exact) / exact <= 0.001


# --- command lines ---------------------------------------------------------------------------------

LOADGEN_FLAGS = ["--rate", "--pace", "--duration", "--target", "--payload", "--workers", "--max-inflight", "--timeout",
                 "--run", "--shard", "--fail-on", "--abort-on", "--telemetry-bootstrap", "--quiet", "--stream", "--no-telemetry",
                 "--bogus", "-x"]
JOB_FLAGS = ["--run", "--checkpoints", "--trigger", "--master", "--bootstrap", "--topic", "--window", "--drop-timeout",
             "--watermark-delay", "--silence-timeout", "--max-offsets-per-trigger", "--kafka-option", "--partitions",
             "--available-now", "--no-heartbeat", "--starting-offsets", "--source", "--bogus"]
VALUES = st.one_of(st.sampled_from(["0", "-1", "5000", "1e309", "nan", "10s", "1ms", "0s", "2/2", "0/1", "1000:5,0:1", "100-:5",
                                    "p99>5ms", "loss>1%", "http://127.0.0.1:1/", "kafka://x", "a=b", "=", "", "%", "\x00"]),
                   st.text(max_size=12))


def _argv(flags):
    return st.lists(st.one_of(st.sampled_from(flags), VALUES), max_size=8)


@settings(max_examples=400, deadline=None, derandomize=True, database=None)
@given(argv=_argv(LOADGEN_FLAGS))
def test_loadgen_command_line_fuzz_gives_a_config_or_a_usage_error(argv):
    from loadgen.__main__ import UsageError, build_parser, config

    try:
        cfg, _, _ = config(build_parser().parse_args(["attack", *argv]))
    except UsageError as e:
        assert str(e) and "\n" not in str(e).strip()
        return
    assert cfg.schedule.duration_ns > 0 and cfg.workers >= 1 and 0 <= cfg.shard < cfg.shards


@settings(max_examples=400, deadline=None, derandomize=True, database=None)
@given(command=st.sampled_from(["run", "replay", "summary"]), argv=_argv(JOB_FLAGS))
def test_job_command_line_fuzz_gives_a_config_or_a_usage_error(command, argv):
    from streaming.cli import UsageError, build_parser, config_from_args

    try:
        cfg = config_from_args(build_parser().parse_args([command, *argv]))
    except UsageError as e:
        assert str(e) and "\n" not in str(e).strip()
        return
    assert cfg.engine.run_id and cfg.engine.window_ns > 0 and cfg.engine.drop_timeout_ns > 0


# --- the HTTP receiver -----------------------------------------------------------------------------

HEADER_TEXT = st.text(st.characters(min_codepoint=0x20, max_codepoint=0xFF, blacklist_characters="\x7f"), max_size=40)
ANY_ID = st.one_of(st.text(min_size=1, max_size=30), st.text(max_size=3), st.integers(), st.none(), st.text(min_size=1030, max_size=1100))


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


@st.composite
def cloudevent_request(draw):
    """(content type, headers, body, the events a correct receiver accepts: [(id, run)] or None for a 400)."""
    mode = draw(st.sampled_from(["binary", "structured", "batch", "garbage"]))
    run = draw(st.one_of(st.just("fz"), st.none(), st.just("")))
    if mode == "binary":
        eid = draw(st.one_of(HEADER_TEXT, st.none()))
        headers = {"ce-specversion": "1.0", "ce-source": "fuzz", "ce-type": "t"}
        if eid is not None:
            headers["ce-id"] = eid
        if run is not None:
            headers["ce-fwrun"] = run
        try:  # http.client sends the header as latin-1 bytes; the receiver reads UTF-8 and drops surrounding blanks
            got = eid.encode("latin-1").decode("utf-8").strip(" \t") if eid is not None else ""
        except UnicodeDecodeError:
            got = None
        ok = bool(got) and len(got) <= 1024
        return "application/octet-stream", headers, draw(st.binary(max_size=200)), [(got, run or None)] if ok else None
    if mode == "garbage":
        return draw(st.sampled_from(["application/cloudevents+json", "application/cloudevents-batch+json"])), {}, \
            draw(st.binary(max_size=200).filter(lambda b: not b.strip().startswith((b"{", b"[")))), None
    objs, expect = [], []
    for _ in range(1 if mode == "structured" else draw(st.integers(0, 6))):
        eid = draw(ANY_ID)
        obj = {"specversion": "1.0", "source": "fuzz", "type": "t", "id": eid, "data": draw(st.text(max_size=20))}
        if run is not None:
            obj["fwrun"] = run
        objs.append(obj)
        expect.append((eid, run or None) if isinstance(eid, str) and eid and len(eid) <= 1024 and _encodable(eid) else None)
    if mode == "structured":
        return "application/cloudevents+json", {}, json.dumps(objs[0]).encode(), expect if expect[0] else None
    ok = all(expect) and len(expect) > 0
    return "application/cloudevents-batch+json", {}, json.dumps(objs).encode(), expect if ok else None


@pytest.mark.integration
@pytest.mark.faults
def test_http_receiver_fuzz_answers_202_or_400_and_records_exactly_what_it_accepted(broker, tmp_path):
    """400 random CloudEvents requests (binary, structured, batched, garbage; ids of any text, missing, too long,
    of the wrong type): never a 5xx or a dropped connection; every accepted event reaches the telemetry once,
    with its ID intact, as a record the job decodes without quarantine."""
    import http.client

    from support import create_topic, health, start_receiver, telemetry

    from core.procs import free_port, stop_process

    topic, port = "tel-fuzz-http", free_port()
    create_topic(broker, topic)
    proc = start_receiver(broker, topic, tmp_path / "spool", port)
    accepted: list[tuple[str, str | None]] = []
    statuses: dict[int, int] = {}
    try:
        @settings(max_examples=400, deadline=None, derandomize=True, database=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
        @given(req=cloudevent_request())
        def one(req):
            ctype, headers, body, expect = req
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            conn.request("POST", "/", body=body, headers={"Content-Type": ctype, **headers})
            status = conn.getresponse().status
            conn.close()
            statuses[status] = statuses.get(status, 0) + 1
            assert status == (202 if expect is not None else 400), (status, req)
            if expect is not None:
                accepted.extend(expect)

        one()
        assert proc.poll() is None
        h = health(port)
        assert h["received"] + h["unattributed"] == len(accepted)
        attributed = [(e, r) for e, r in accepted if r]
        assert h["received"] == len(attributed)
        deadline = time.monotonic() + 30
        while True:
            recs = [r for r in telemetry(broker, topic, "fz") if r["kind"] == "recv"]
            if len(recs) >= len(attributed) or time.monotonic() > deadline:
                break
            time.sleep(1)
    finally:
        stop_process(proc, wait_s=30, group=True)
    print(f"\nHTTP receiver fuzz: statuses {statuses}, {len(accepted)} events accepted, {len(attributed)} with a run")
    assert sorted(r["event_id"] for r in recs) == sorted(e for e, _ in attributed)
    # the raw lines the job will read decode without a single quarantined row
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(bootstrap_servers=broker, enable_auto_commit=False)
    tps = [TopicPartition(topic, p) for p in sorted(c.partitions_for_topic(topic))]
    c.assign(tps)
    c.seek_to_beginning()
    values = [m.value for batch in [c.poll(timeout_ms=2000)] for msgs in batch.values() for m in msgs]
    c.close()
    t = decode_messages(values, [0] * len(values), list(range(len(values))))
    assert t.filter(t["quarantine_reason"].is_valid()).num_rows == 0
