"""Receiver agent for the Kafka-protocol SUT: consume the SUT topic, record each delivery's receive time.

Usage:
    python -m agents.receiver kafka [--bootstrap 127.0.0.1:29092] [--topic flightwatch.sut]
                                    [--telemetry-bootstrap 127.0.0.1:19092] [--state-dir DIR]

Each consumed record gives a receive record: event ID from the record key (or the ``ce_id``
header), run ID from the ``fw_run`` header the load generator sets, receive time = when the
agent saw it. Restart-safe without losing or double-reporting: before a batch's receive
records go to the telemetry topic, the batch (with the offsets after it) is written ahead to
``<state-dir>/wal`` (replaced atomically; it survives a crash or kill -9 of the agent, not a
power loss of the host). On restart the agent re-sends that batch *identically* and
continues from its offsets; the streaming job treats an identical repeat of a first delivery
(same event ID and receive time) as a telemetry repeat, not a duplicate.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

from agents import contract

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN_HEADER = "fw_run"
ID_HEADER = "ce_id"


def _header(headers, name: str) -> str | None:
    for k, v in headers or ():
        if k == name and v is not None:
            return v.decode("utf-8", "replace")
    return None


class KafkaReceiver:
    def __init__(self, consumer, writer, topic: str, state_dir: str, agent: str, log=print) -> None:
        self.consumer, self.writer, self.topic = consumer, writer, topic
        self.wal = os.path.join(state_dir, "wal")
        self.agent, self.log = agent, log
        self.lines = contract.FastLines("", agent)
        os.makedirs(state_dir, exist_ok=True)
        self.num_received = 0
        self.num_unattributed = 0

    def _write_ahead(self, offsets: dict, records: list[str]) -> None:
        """First line: the offsets after the batch; then the batch's receive records, one per line."""
        tmp = self.wal + ".tmp"
        with open(tmp, "w") as f:
            f.write(json.dumps(offsets))
            for line in records:
                f.write("\n")
                f.write(line)
        os.replace(tmp, self.wal)

    def _send(self, records: list[dict]) -> None:
        self.writer.write_many(records)
        if not self.writer.flush(30):
            raise RuntimeError("telemetry broker did not acknowledge within 30 s")

    def start(self) -> dict:
        """Assign every partition; resume from the write-ahead log (re-sending its batch) or from the start."""
        from kafka import TopicPartition

        parts = None
        for _ in range(100):
            parts = self.consumer.partitions_for_topic(self.topic)
            if parts:
                break
            time.sleep(0.1)
        if not parts:
            raise RuntimeError(f"topic {self.topic!r} not found")
        tps = [TopicPartition(self.topic, p) for p in sorted(parts)]
        self.consumer.assign(tps)
        offsets = {str(tp.partition): 0 for tp in tps}
        if os.path.exists(self.wal):
            with open(self.wal) as f:
                lines = f.read().split("\n")
            offsets.update(json.loads(lines[0]))
            if lines[1:]:
                self._send(lines[1:])  # identical re-send of the batch that may not have arrived
                self.log(f"resumed: re-sent {len(lines) - 1} receive records of the last batch")
        for tp in tps:
            self.consumer.seek(tp, int(offsets[str(tp.partition)]))
        return offsets

    def poll_once(self, offsets: dict, timeout_ms: int = 100) -> int:
        batch = self.consumer.poll(timeout_ms=timeout_ms, max_records=5000)
        if not batch:
            return 0
        now = time.time_ns()
        records = []
        for tp, msgs in batch.items():
            for m in msgs:
                event_id = _header(m.headers, ID_HEADER) or (m.key.decode("utf-8", "replace") if m.key else None)
                run_id = _header(m.headers, RUN_HEADER)
                offsets[str(tp.partition)] = m.offset + 1
                if not event_id or not run_id:
                    self.num_unattributed += 1
                    continue
                records.append(self.lines.recv(run_id, now, event_id, len(m.value or b"")))
        self._write_ahead(offsets, records)
        self._send(records)
        self.num_received += len(records)
        return len(records)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m agents.receiver", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    sub = ap.add_subparsers(dest="mode", required=True)
    k = sub.add_parser("kafka", help="consume the SUT topic")
    k.add_argument("--bootstrap", default=os.environ.get("FLIGHTWATCH_SUT_BOOTSTRAP", "127.0.0.1:29092"))
    k.add_argument("--topic", default="flightwatch.sut")
    k.add_argument("--telemetry-bootstrap", default=os.environ.get("FLIGHTWATCH_BOOTSTRAP", "127.0.0.1:19092"))
    k.add_argument("--telemetry-topic", default=os.environ.get("FLIGHTWATCH_TOPIC", "flightwatch.telemetry"))
    k.add_argument("--agent", default="receiver-kafka")
    k.add_argument("--state-dir", default=os.path.join(ROOT, ".stack", "receiver-kafka"))
    k.add_argument("--create-topic", type=int, default=2, metavar="PARTITIONS",
                   help="create the SUT topic with this many partitions if missing (default %(default)s)")
    try:
        a = ap.parse_args(argv)
    except SystemExit as e:
        return 2 if e.code else 0
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
    from kafka.admin import NewTopic
    from kafka.errors import KafkaError, TopicAlreadyExistsError

    from agents.telemetry import TelemetryWriter

    try:
        admin = KafkaAdminClient(bootstrap_servers=a.bootstrap.split(","))
        if a.topic not in admin.list_topics():
            try:
                admin.create_topics([NewTopic(a.topic, a.create_topic, 1)])
            except TopicAlreadyExistsError:
                pass
        admin.close()
        consumer = KafkaConsumer(bootstrap_servers=a.bootstrap.split(","), enable_auto_commit=False,
                                 fetch_max_wait_ms=20, max_partition_fetch_bytes=8 << 20)
        producer = KafkaProducer(bootstrap_servers=a.telemetry_bootstrap.split(","), linger_ms=5)
    except KafkaError as e:
        print(f"receiver: error: cannot reach a broker ({a.bootstrap} / {a.telemetry_bootstrap}): {e}", file=sys.stderr)
        return 2
    writer = TelemetryWriter(producer, a.telemetry_topic, agent=a.agent)
    receiver = KafkaReceiver(consumer, writer, a.topic, a.state_dir, a.agent)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    offsets = receiver.start()
    print(f"receiver {a.agent}: {a.bootstrap}/{a.topic} -> {a.telemetry_bootstrap}/{a.telemetry_topic}", flush=True)
    last = time.monotonic()
    try:
        while not stopping:
            receiver.poll_once(offsets)
            if time.monotonic() - last >= 10:
                c = writer.counters()
                print(f"receiver {a.agent}: {receiver.num_received:,} received, {receiver.num_unattributed:,} without "
                      f"run/event ID; telemetry sent {c['sent']:,} retried {c['retried']:,} failed {c['failed']:,}", flush=True)
                last = time.monotonic()
    except KeyboardInterrupt:
        pass
    writer.close()
    consumer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
