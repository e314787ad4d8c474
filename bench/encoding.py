"""Wire-encoding benchmark: NDJSON batched per Kafka message vs one JSON record per message.

Usage:
    python -m bench.encoding [--records 200000] [--bootstrap HOST:PORT]

For each encoding, with a real broker: bytes per record, encode rate (records/s, one core),
produce rate (encode + librdkafka producer to the broker), and consume + decode rate
(librdkafka consumer in assign mode + the job's decoder). Medians of 3 repetitions.
"""
from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from core import contract  # noqa: E402

T0 = 1_800_000_000 * 10**9


def make_records(n: int) -> list[contract.Record]:
    half = n // 2
    sends = [contract.Send("bench", "sender-0", T0 + i * 20_000, event_id=f"sender-0-{i}", intended_at_ns=T0 + i * 20_000,
                           bytes_out=2048, worker=0) for i in range(half)]
    recvs = [contract.Receive("bench", "receiver-0", T0 + i * 20_000 + 2_000_000, event_id=f"sender-0-{i}")
             for i in range(n - half)]
    return sends + recvs


def encode_all(records, per_message: int) -> list[bytes]:
    return [contract.encode(records[k:k + per_message]) for k in range(0, len(records), per_message)]


def produce(bootstrap: str, topic: str, messages: list[bytes]) -> None:
    from core.kafka_options import produce as produce_one
    from core.kafka_options import telemetry_producer

    p = telemetry_producer(bootstrap, {}, **{"linger.ms": 5, "batch.size": 1 << 20})
    for m in messages:
        produce_one(p, topic, m, b"sender-0", partition=0)
    p.flush(60)


def consume_decode(bootstrap: str, topic: str, num_messages: int) -> int:
    from confluent_kafka import Consumer, TopicPartition

    from core.kafka_options import librdkafka
    from streaming.decode import decode_messages

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-encoding", "enable.auto.commit": False,
                  "max.partition.fetch.bytes": 16 << 20, **librdkafka({})})
    c.assign([TopicPartition(topic, 0, 0)])
    values, offsets, rows = [], [], 0
    while len(offsets) < num_messages:
        for r in c.consume(1000, 0.5):
            if r.error() is None:
                values.append(r.value())
                offsets.append(r.offset())
        if len(values) >= 2000 or len(offsets) >= num_messages:
            rows += decode_messages(values, [0] * len(values), offsets[-len(values):]).num_rows
            values = []
    c.close()
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.encoding", description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--bootstrap", help="use this broker instead of starting Tansu on a free port")
    a = ap.parse_args(argv)
    from core.kafka_options import create_topic
    from core.procs import free_port
    from stack.tansu import start_tansu

    broker, bootstrap = None, a.bootstrap
    if not bootstrap:
        port = free_port()
        broker = start_tansu(port, cluster_id="bench-enc")
        bootstrap = f"127.0.0.1:{port}"
    records = make_records(a.records)
    rows = []
    try:
        for name, per_message in (("ndjson x200", 200), ("ndjson x20", 20), ("json x1", 1)):
            enc, prod, cons = [], [], []
            for rep in range(3):
                t = time.process_time()
                msgs = encode_all(records, per_message)
                enc.append(len(records) / (time.process_time() - t))
                topic = f"enc-{per_message}-{rep}-{int(time.time())}"
                create_topic(bootstrap, topic, 1, {})
                t = time.perf_counter()
                produce(bootstrap, topic, encode_all(records, per_message))
                prod.append(len(records) / (time.perf_counter() - t))
                t = time.perf_counter()
                n = consume_decode(bootstrap, topic, len(msgs))
                assert n == len(records), (n, len(records))
                cons.append(len(records) / (time.perf_counter() - t))
            size = sum(len(m) for m in msgs) / len(records)
            rows.append((name, size, statistics.median(enc), statistics.median(prod), statistics.median(cons)))
            print(f"{name}: done", flush=True)
    finally:
        if broker:
            os.kill(broker.pid, signal.SIGTERM)
            broker.wait(10)
    print(f"\n{'encoding':<12} {'bytes/rec':>9} {'encode rec/s':>13} {'produce rec/s':>14} {'consume+decode rec/s':>21}")
    for name, size, e, p, c in rows:
        print(f"{name:<12} {size:>9.0f} {e:>13,.0f} {p:>14,.0f} {c:>21,.0f}")
    base = rows[-1]
    print(f"ratio ndjson x200 / json x1: produce {rows[0][3] / base[3]:.1f}x, consume+decode {rows[0][4] / base[4]:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
