"""A synthetic run of known truth: telemetry records plus the ground truth computed from them.

Used by the tests and the pipeline benchmark. The truth is computed here with plain numpy
from the injected arrays, independently of the streaming job's code.

    python -m loadgen.synthetic --help
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, field

import numpy as np

from core import contract
from core.procs import telemetry_bootstrap

NS = 1_000_000_000


@dataclass
class SyntheticSpec:
    run_id: str = "synthetic"
    start_ns: int = 1_800_000_000 * NS
    duration_s: int = 60
    rate_per_sec: int = 1000
    latency_median_us: float = 2000.0
    latency_sigma: float = 0.8
    drop_fraction: float = 0.01
    duplicate_fraction: float = 0.002
    error_fraction: float = 0.003
    late_count: int = 5
    pause: tuple[float, float] | None = (30.0, 3.0)  # (start s, length s): no receives in it
    oom_at_s: tuple[float, ...] = (45.5,)
    num_malformed: int = 37
    drop_timeout_s: int = 30
    seed: int = 7
    heartbeat_until_s: float | None = None  # default: duration + drop timeout + 10 s
    wobble: float = 0.0  # sd of a per-second latency factor (AR(1), 0.6 from one second to the next, as real runs' window p50s): slow stretches
    config: dict | None = None  # more of the run_start's config (target, pace, scenario, ...)
    held: bool = False  # as the load generator writes: each send with its answer, once answered (contract.SEND_HOLD_NS)


@dataclass
class SyntheticRun:
    spec: SyntheticSpec
    event_id: np.ndarray
    sent_ns: np.ndarray
    intended_ns: np.ndarray
    recv_ns: np.ndarray            # first receive; -1 if never received
    errored: np.ndarray            # bool: the sender got an error ack
    dup_recv_ns: np.ndarray        # receive times of duplicate deliveries
    dup_ids: np.ndarray
    records: list[tuple[int, dict]] = field(default_factory=list)  # (arrival order key ns, record dict)
    malformed: list[bytes] = field(default_factory=list)


def generate(spec: SyntheticSpec) -> SyntheticRun:
    rng = np.random.default_rng(spec.seed)
    n = spec.duration_s * spec.rate_per_sec
    seq = np.arange(n)
    intended = spec.start_ns + (seq * NS) // spec.rate_per_sec
    send_delay = rng.exponential(30_000, n).astype(np.int64)  # ~30 µs behind schedule
    sent = intended + send_delay
    latency_ns = (rng.lognormal(np.log(spec.latency_median_us), spec.latency_sigma, n) * 1000).astype(np.int64)
    if spec.wobble:
        shocks = rng.normal(0, spec.wobble * np.sqrt(1 - 0.6 ** 2), spec.duration_s)
        level = np.zeros(spec.duration_s)
        for s in range(spec.duration_s):
            level[s] = (0.6 * level[s - 1] if s else rng.normal(0, spec.wobble)) + (shocks[s] if s else 0)
        latency_ns = (latency_ns * np.exp(level[seq // spec.rate_per_sec])).astype(np.int64)
    recv = sent + latency_ns
    if spec.pause:
        p0 = spec.start_ns + int(spec.pause[0] * NS)
        p1 = p0 + int(spec.pause[1] * NS)
        stalled = (recv >= p0) & (recv < p1)
        recv[stalled] = p1 + (recv[stalled] - p0) // 20  # backlog drains quickly after the pause
    errored = rng.random(n) < spec.error_fraction
    dropped = (rng.random(n) < spec.drop_fraction) & ~errored
    recv[dropped | errored] = -1
    late_idx = rng.choice(np.flatnonzero(recv > 0)[: n // 2], spec.late_count, replace=False)
    recv[late_idx] = sent[late_idx] + (spec.drop_timeout_s + 5) * NS
    received = np.flatnonzero(recv > 0)
    received_ontime = received[~np.isin(received, late_idx)]
    dup_pick = rng.choice(received_ontime, int(n * spec.duplicate_fraction), replace=False)
    dup_recv = recv[dup_pick] + rng.integers(1_000_000, 50_000_000, dup_pick.size)
    ids = np.array([f"sender-0-{i}" for i in seq], dtype=object)

    run = SyntheticRun(spec, ids, sent, intended, recv, errored, dup_recv, ids[dup_pick])
    agent_delay = 50_000_000  # records reach the topic ~50 ms after their event time
    rec = run.records
    rid = spec.run_id
    rec.append((spec.start_ns - NS, contract.RunStart(rid, "loadgen", spec.start_ns - NS, config=json.dumps(
        {"rate": spec.rate_per_sec, **(spec.config or {})})).to_dict()))
    answered = sent + rng.integers(0, contract.SEND_HOLD_NS, n) if spec.held else sent  # answered within the hold
    for i in range(n):
        line = {"v": 1, "kind": "send", "run_id": rid, "agent": "sender-0", "at_ns": int(sent[i]), "event_id": ids[i],
                "intended_at_ns": int(intended[i]), "bytes_out": 2048, "worker": 0}
        if spec.held:
            line["acked_at_ns"] = int(answered[i])
            if errored[i]:
                line["status" if i % 2 else "error"] = 503 if i % 2 else "timeout"
        rec.append(((int(answered[i]) if spec.held else int(sent[i])) + agent_delay, line))
        if errored[i] and not spec.held:
            rec.append((int(sent[i]) + agent_delay + 1, {"v": 1, "kind": "ack", "run_id": rid, "agent": "sender-0", "at_ns": int(sent[i]) + 1_000_000,
                                                         "event_id": ids[i], "sent_at_ns": int(sent[i]), "status": 503 if i % 2 else None,
                                                         "error": None if i % 2 else "timeout"}))
        if recv[i] > 0:
            rec.append((int(recv[i]) + agent_delay, {"v": 1, "kind": "recv", "run_id": rid, "agent": "receiver-0", "at_ns": int(recv[i]), "event_id": ids[i]}))
    for t, e in zip(dup_recv, run.dup_ids):
        rec.append((int(t) + agent_delay, {"v": 1, "kind": "recv", "run_id": rid, "agent": "receiver-0", "at_ns": int(t), "event_id": e}))
    for s in range(spec.duration_s):
        t = spec.start_ns + s * NS + NS // 2
        rec.append((t + agent_delay, contract.NodeSample(rid, "node-metrics", t, node="node-a", metric="cpu_utilization", value=0.5 + 0.01 * s).to_dict()))
    for s in spec.oom_at_s:
        t = spec.start_ns + int(s * NS)
        rec.append((t + agent_delay, contract.OomEvent(rid, "oom-watcher", t, source="cgroup", where="node-a:/leaker", count=1).to_dict()))
    stop = spec.start_ns + spec.duration_s * NS
    rec.append((stop + agent_delay, contract.RunStop(rid, "loadgen", stop, reason="completed").to_dict()))
    hb_until = spec.heartbeat_until_s if spec.heartbeat_until_s is not None else spec.duration_s + spec.drop_timeout_s + 10
    for s in range(spec.duration_s, int(hb_until) + 1):
        t = spec.start_ns + s * NS
        for agent in ("sender-0", "receiver-0"):
            rec.append((t + agent_delay, contract.Heartbeat(rid, agent, t).to_dict()))
    rec.sort(key=lambda kv: kv[0])
    bad = [b"{not json", b'{"v":1,"kind":"send","run_id":"%s","agent":"x","at_ns":"soon","event_id":"z","intended_at_ns":1}' % rid.encode(),
           b'{"v":99,"kind":"send"}', b'{"v":1,"kind":"teleport","run_id":"%s","agent":"a","at_ns":1800000000000000000}' % rid.encode(),
           b'{"v":1,"kind":"recv","run_id":"%s","agent":"a","at_ns":1800000000000000000}' % rid.encode(),  # no event_id
           b'{"v":1,"kind":"recv","run_id":"%s","agent":"a","at_ns":-5,"event_id":"q"}' % rid.encode(), b"[1,2,3]", b'"str"']
    run.malformed = [bad[i % len(bad)] for i in range(spec.num_malformed)]
    return run


def messages(run: SyntheticRun, records_per_message: int = 200, linger_ns: int = NS // 2) -> list[tuple[bytes, bytes, int]]:
    """Wire messages (key, value, arrival ns) in arrival order, malformed lines spread in.

    Like a real agent, each agent sends a message when it holds ``records_per_message``
    records or its oldest unsent record is ``linger_ns`` old.
    """
    out, buf = [], {}

    def flush(agent: str, t: int) -> None:
        if buf.get(agent):
            out.append((agent.encode(), contract.encode(buf[agent]), t))
            buf[agent] = []

    for t, r in run.records:
        for agent, b in buf.items():
            if b and t - b[0]["at_ns"] > linger_ns + 50_000_000:
                flush(agent, t)
        b = buf.setdefault(r["agent"], [])
        b.append(r)
        if len(b) >= records_per_message:
            flush(r["agent"], t)
    for agent in list(buf):
        flush(agent, run.records[-1][0])
    out.sort(key=lambda m: m[2])
    step = max(len(out) // max(len(run.malformed), 1), 1)
    for i, bad in enumerate(run.malformed):  # each bad line inside an otherwise good message
        k, v, t = out[(i * step) % len(out)]
        out[(i * step) % len(out)] = (k, v + b"\n" + bad, t)
    return out


def exact_gaps(sent_ns, recv_ns, stop_ns: int, window_ns: int = NS) -> tuple[list[tuple[int, int, int]], dict[int, int]]:
    """Gaps by their definition, one silence at a time (independent of ``streaming.gaps``): between consecutive
    receives a and b, a gap when b - a > max(100 ms, 20 / (sends in [a - 1 s, a)) s) and sends up to a outnumber
    receives up to a or a send falls in (a, b), and a is before the run's stop. Returns [(start, end, in flight)] and, per window, its ns inside a gap."""
    import bisect

    sends, recvs = sorted(int(x) for x in sent_ns), sorted(int(x) for x in recv_ns)
    gaps, silence = [], {}
    for i in range(len(recvs) - 1):
        a, b = recvs[i], recvs[i + 1]
        if a >= stop_ns:
            break
        rate = bisect.bisect_left(sends, a) - bisect.bisect_left(sends, a - NS)
        if rate == 0 or b - a <= max(100_000_000, 20 * NS / rate):
            continue
        in_flight = bisect.bisect_right(sends, a) - bisect.bisect_right(recvs, a)
        if in_flight <= 0 and bisect.bisect_left(sends, b) == bisect.bisect_right(sends, a):
            continue
        gaps.append((a, b, in_flight))
        for win in range(a - a % window_ns, b, window_ns):
            silence[win] = silence.get(win, 0) + min(b, win + window_ns) - max(a, win)
    return gaps, silence


def truth(run: SyntheticRun) -> dict:
    """Ground truth per 1 s window and per run, computed from the injected arrays."""
    spec = run.spec
    timeout = spec.drop_timeout_s * NS
    w = lambda t: (np.asarray(t) // NS) * NS  # noqa: E731
    in_time = (run.recv_ns > 0) & (run.recv_ns - run.sent_ns <= timeout)
    late = (run.recv_ns > 0) & ~in_time
    dropped = ~in_time & ~run.errored
    lat_us = (run.recv_ns - run.sent_ns) // 1000
    lat_int_us = (run.recv_ns - run.intended_ns) // 1000
    windows = {}
    def bump(key, times):
        for win, c in zip(*np.unique(w(times), return_counts=True)):
            windows.setdefault(int(win), {}).setdefault(key, 0)
            windows[int(win)][key] += int(c)
    bump("sent", run.sent_ns)
    bump("received", run.recv_ns[in_time])
    bump("dropped", run.sent_ns[dropped])
    bump("late", run.recv_ns[late])
    bump("duplicates", run.dup_recv_ns)
    bump("errors", run.sent_ns[run.errored])
    latency = {}
    for win in np.unique(w(run.recv_ns[in_time])):
        sel = in_time & (w(run.recv_ns) == win)
        latency[int(win)] = (lat_us[sel], lat_int_us[sel])
    # exemplars: per window, the 5 slowest in-time deliveries (by receive window) and the 5 first drops (by send window)
    slowest, first_dropped = {}, {}
    for i in np.flatnonzero(in_time):
        slowest.setdefault(int(w(run.recv_ns[i])), []).append((-(int(run.recv_ns[i]) - int(run.sent_ns[i])), run.event_id[i]))
    for i in np.flatnonzero(dropped):
        first_dropped.setdefault(int(w(run.sent_ns[i])), []).append((int(run.sent_ns[i]), run.event_id[i]))
    slowest_run = [i for _, i in sorted(x for v in slowest.values() for x in v)[:5]]
    first_dropped_run = [i for _, i in sorted(x for v in first_dropped.values() for x in v)[:5]]
    slowest = {k: [i for _, i in sorted(v)[:5]] for k, v in slowest.items()}
    first_dropped = {k: [i for _, i in sorted(v)[:5]] for k, v in first_dropped.items()}
    gaps, silence = exact_gaps(run.sent_ns, np.r_[run.recv_ns[run.recv_ns > 0], run.dup_recv_ns],
                               spec.start_ns + spec.duration_s * NS)
    for win, ns in silence.items():
        windows.setdefault(win, {})["silence_ns"] = ns
    return {"windows": windows, "latency": latency, "gaps": gaps, "slowest": slowest, "first_dropped": first_dropped,
            "dropped_ids": set(run.event_id[dropped]), "slowest_run": slowest_run, "first_dropped_run": first_dropped_run,
            "num_dropped": int(dropped.sum()), "num_late": int(late.sum()), "num_errors": int(run.errored.sum()),
            "num_duplicates": int(run.dup_recv_ns.size), "num_sent": int(run.sent_ns.size),
            "num_received": int(in_time.sum()), "num_malformed": len(run.malformed),
            "all_latency_us": lat_us[in_time]}


class WrittenTwice(RuntimeError):
    """The broker holds more messages than were written to it: a request retried after its answer was lost."""


def produce(run: SyntheticRun, bootstrap: str, topic: str, records_per_message: int = 200) -> int:
    """Write the run's messages to a telemetry topic, each once and in order; returns the number of messages.

    The topic's first message goes alone (its partitions' leaders known before the rest), every delivery is checked,
    and the topic is read back. A broker that holds a message twice raises ``WrittenTwice`` rather than hand a test
    a run that is not its truth: twice in CI on Tansu, the first ~40 messages were there again after the rest (a
    request retried after its answer was lost, a minute of event time on: an agent writing in real time is ~25 s on
    at most, its message timeout), and the job, which keeps an ID 30 s past its deadline, counted their sends again.
    Idempotent besides, for a broker that keeps its producers' sequences."""
    from core.kafka_options import produce as produce_one
    from core.kafka_options import telemetry_producer

    producer = telemetry_producer(bootstrap, **{"linger.ms": 5, "batch.size": 1 << 20, "enable.idempotence": True})
    msgs = messages(run, records_per_message)
    failed: list = []

    def delivered(err, _msg) -> None:
        if err is not None:
            failed.append(err)

    for i, (key, value, _) in enumerate(msgs):
        produce_one(producer, topic, value, key, on_delivery=delivered)
        if i == 0:
            producer.flush(60)
    if producer.flush(60) or failed:
        raise RuntimeError(f"telemetry broker {bootstrap} did not take every message within 60 s: {failed[:3]}")
    held = count_messages(bootstrap, topic)
    if held != len(msgs):
        raise WrittenTwice(f"{topic} on {bootstrap} holds {held:,} messages for the {len(msgs):,} written")
    return len(msgs)


def count_messages(bootstrap: str, topic: str, timeout_s: float = 60) -> int:
    """How many messages ``topic`` holds, read from each partition's start to its end."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    from core.kafka_options import client_options, librdkafka

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "flightwatch-synthetic-check", "enable.auto.commit": False,
                  "enable.partition.eof": True, **librdkafka(client_options())})
    try:
        parts = list(c.list_topics(topic, timeout=10).topics[topic].partitions)
        c.assign([TopicPartition(topic, p, 0) for p in parts])
        n, ended, deadline = 0, set(), time.monotonic() + timeout_s
        while len(ended) < len(parts) and time.monotonic() < deadline:
            for m in c.consume(1000, 0.5):
                if m.error() is None:
                    n += 1
                elif m.error().code() == KafkaError._PARTITION_EOF:
                    ended.add(m.partition())
        if len(ended) < len(parts):
            raise RuntimeError(f"{topic} on {bootstrap}: not read to its end within {timeout_s:.0f} s")
        return n
    finally:
        c.close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m loadgen.synthetic",
                                 description="Write a synthetic run of known truth into a telemetry topic.")
    ap.add_argument("--bootstrap", default=telemetry_bootstrap(), help="telemetry broker (default %(default)s)")
    ap.add_argument("--topic", default="flightwatch.telemetry", help="telemetry topic (default %(default)s)")
    ap.add_argument("--run", default="synthetic", help="run ID (default %(default)s)")
    ap.add_argument("--duration", type=int, default=60, help="seconds of event time (default %(default)s)")
    ap.add_argument("--rate", type=int, default=1000, help="events per second (default %(default)s)")
    a = ap.parse_args(argv)
    run = generate(SyntheticSpec(run_id=a.run, duration_s=a.duration, rate_per_sec=a.rate))
    n = produce(run, a.bootstrap, a.topic)
    print(f"wrote {len(run.records)} records in {n} messages for run {a.run} to {a.topic}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
