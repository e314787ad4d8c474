"""The Kafka receiver agent as a process (``python -m agents.receiver kafka``): its consumer of the SUT topic, its
spool and shipper, its metrics, and its loop. What it does with each message is ``agents.kafka_receiver``.

    main_kafka(args)   # 0 when stopped (SIGTERM, Ctrl-C), 2 on bad settings or a SUT broker it cannot reach
"""
from __future__ import annotations

import os
import signal
import sys
import time

from agents.kafka_receiver import TOPIC_CHECK_S, KafkaReceiver
from core import clock, contract, logs, metrics
from core.cli import await_brokers
from core.kafka_options import SUT_ENV, client_options
from core.units import parse_size


class Refused(Exception):
    """A setting or a broker that stops the agent before it starts: the one-line reason (exit 2)."""


class KafkaExposed:
    """The Kafka receiver's counters as Prometheus metrics, read at scrape time, with its shipper's (``shared``)."""

    def __init__(self, receiver: KafkaReceiver, spool) -> None:
        self.receiver, self.spool = receiver, spool
        self.shared = None  # core.metrics.Shared: the shipper process's counters

    def collect(self):
        return self.own() if self.shared is None else self.shared.collect(self.own())

    def own(self):
        r, agent = self.receiver, self.receiver.agent
        for name, value, text in (("events", r.num_received, "events received from the SUT topic and recorded"),
                                  ("unattributed", r.num_unattributed, "messages without a run or event ID, not recorded"),
                                  ("consumer_errors", r.num_errors, "errors the consumer reported (a broker away, ...)"),
                                  ("skipped_offsets", r.num_skipped, "offsets the broker never served: a later one "
                                   "came first, and the consumer moved on (their events count as dropped)"),
                                  ("topic_resets", r.num_resets, "times the SUT topic came back under a new ID (its log "
                                   "lost) and was read again from its start")):
            yield metrics.family("counter", f"flightwatch_kafka_receiver_{name}", text, ["agent"], [((agent,), value)])
        c = self.spool.counters()
        yield metrics.family("counter", "flightwatch_kafka_receiver_spooled_records", "receive records put in the "
                             "telemetry spool (the shipper sends them on)", ["agent"], [((agent,), c["spooled"])])
        yield metrics.family("counter", "flightwatch_kafka_receiver_spool_lost_records", "receive records refused: the "
                             "spool was over its budget (the telemetry broker away for long)", ["agent"],
                             [((agent,), c["lost"])])
        yield metrics.family("gauge", "flightwatch_kafka_receiver_spool_over_budget", "1 while the spool is over its "
                             "budget", ["agent"], [((agent,), int(c["over_budget"]))])


def sut_consumer(a):
    """The consumer of the SUT topic and an admin client of its broker (the topic created if it is missing);
    ``Refused`` with the reason."""
    from confluent_kafka import Consumer, KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    from core.kafka_options import librdkafka

    try:
        sut_options = client_options(env=SUT_ENV)
        consumer_config = {"bootstrap.servers": a.bootstrap, "group.id": f"flightwatch-{a.agent}",
                           "enable.auto.commit": False, "enable.auto.offset.store": False,
                           "fetch.wait.max.ms": a.fetch_wait_ms, "fetch.error.backoff.ms": 100,
                           # a position past the log's end (a SUT broker that lost its data): its new log from the start
                           "auto.offset.reset": "earliest",
                           "queued.max.messages.kbytes": 65536,
                           **librdkafka(sut_options)}
        librdkafka(client_options())  # the shipper's: a bad one is refused here, in one line
    except (ValueError, OSError) as e:
        raise Refused(f"Kafka options: {e}") from None
    try:
        admin = AdminClient({"bootstrap.servers": a.bootstrap, **librdkafka(sut_options)})
        if a.topic not in admin.list_topics(timeout=10).topics:
            try:
                admin.create_topics([NewTopic(a.topic, a.create_topic, 1)])[a.topic].result(10)
            except KafkaException as e:
                if e.args[0].name() != "TOPIC_ALREADY_EXISTS":
                    raise
        return Consumer(consumer_config), admin
    except KafkaException as e:
        why = e.args[0].str() if e.args and hasattr(e.args[0], "str") else str(e)
        raise Refused(f"cannot reach the SUT broker {a.bootstrap} ({why}): is it up, and a Kafka broker?") from None


class KafkaAgent:
    """The agent's life: ``start`` (spool, shipper, receiver, metrics server), ``run`` (poll until stopped, with the
    once-a-second, topic-check, clock and progress duties), ``stop`` (the shipper drains the spool)."""

    def __init__(self, a, consumer, admin, budget_bytes: int) -> None:
        from agents.shipper import start_shipper
        from agents.spool import SpoolWriter

        self.a, self.consumer = a, consumer
        metrics.use_shared_dir(os.path.join(a.state_dir, f"{a.agent}.metrics"), clear=True)  # the shipper's too
        self.spool_dir = os.path.join(a.state_dir, "spool")
        self.spool = SpoolWriter(self.spool_dir, budget_bytes=budget_bytes, agent=a.agent)
        self.shipper = start_shipper(self.spool_dir, a.telemetry_bootstrap, a.telemetry_topic, a.agent,
                                     log_path=os.path.join(a.state_dir, "shipper.log"))
        self.logger = logs.setup(a.agent)
        self.log = logs.printer(self.logger)
        self.receiver = KafkaReceiver(consumer, self.spool, a.topic, a.state_dir, a.agent, log=self.log,
                                      warn=logs.printer(self.logger, logs.WARNING), admin=admin,
                                      routes=getattr(a, "routes", False),
                                      from_end=getattr(a, "from_end", False), share=getattr(a, "share", (0, 1)))
        self.exposed = self.server = self.offsets = None
        self.stopping: list[int] = []
        signal.signal(signal.SIGTERM, lambda *_: self.stopping.append(1))

    def start(self) -> None:
        """``RuntimeError`` if the receiver cannot take up its offsets (the spool and shipper closed again)."""
        a = self.a
        try:
            self.offsets = self.receiver.start()
        except RuntimeError:
            self.spool.close()
            self.shipper.terminate()
            raise
        self.log(f"receiver {a.agent}: {a.bootstrap}/{a.topic} -> spool {self.spool_dir} -> "
                 f"{a.telemetry_bootstrap}/{a.telemetry_topic}")
        self.exposed = KafkaExposed(self.receiver, self.spool)
        self.exposed.shared = metrics.Shared()
        self.server = metrics.serve(self.exposed, a.metrics_listen, log=self.log)

    def run(self) -> None:
        r, offsets = self.receiver, self.offsets
        last = last_check = last_second = time.monotonic()
        last_clock, progress = 0.0, logs.Progress(lambda line: self.log(line, flush=True))
        r.check_topic(offsets)  # learns the topic's ID
        try:
            while not self.stopping:
                r.poll_once(offsets)
                now = time.monotonic()
                if now - last_second >= 1.0:  # once a second, not per batch
                    self.spool.report_lost()
                    self.exposed.shared.sync(self.exposed.own())
                    last_second = now
                if now - last_check >= TOPIC_CHECK_S:
                    r.check_topic(offsets)
                    last_check = now
                if now - last_clock >= clock.REPORT_EVERY_S:
                    clock.report(lambda rec: self.spool.append(contract.encode([rec]).decode().rstrip("\n")), self.a.agent,
                                 self.a.clock_reference, logs.printer(self.logger, logs.WARNING))
                    last_clock = now
                if now - last >= 10:  # every 10 s while it receives, every 10 minutes at idle
                    self.progress(progress)
                    last = now
        except KeyboardInterrupt:
            pass

    def progress(self, say: logs.Progress) -> None:
        c = self.receiver.counters()
        t = c["telemetry"]
        figures = (c["received"], c["unattributed"], c["consumer_errors"], c["skipped_offsets"], c["topic_resets"],
                   t["lost"])
        say(figures, f"receiver {self.a.agent}: {c['received']:,} received, {c['unattributed']:,} without run/event "
                     f"ID, {c['consumer_errors']:,} consumer errors, {c['skipped_offsets']:,} offsets never served, "
                     f"{c['topic_resets']} topic resets; telemetry spooled {t['spooled']:,} lost {t['lost']:,}")

    def stop(self) -> None:
        from agents.shipper import stop_shipper

        metrics.stop(self.server)
        self.consumer.close()
        self.receiver.wal.close()
        self.spool.report_lost()
        self.spool.close()
        self.exposed.shared.close()
        stop_shipper(self.shipper)  # it drains the spool, then exits


def main_kafka(a) -> int:
    try:
        if not 1 <= a.fetch_wait_ms <= 300_000:
            raise Refused(f"--fetch-wait-ms {a.fetch_wait_ms}: give 1 to 300000 ms")
        try:
            budget_bytes = parse_size(a.spool_budget)
        except ValueError as e:
            raise Refused(f"--spool-budget: {e}") from None
        if not await_brokers("receiver", {"SUT": a.bootstrap, "telemetry": a.telemetry_bootstrap}, a.wait):
            return 2
        agent = KafkaAgent(a, *sut_consumer(a), budget_bytes)
        agent.start()
    except (Refused, RuntimeError) as e:
        print(f"receiver: error: {e}", file=sys.stderr)
        return 2
    agent.run()
    agent.stop()
    return 0
