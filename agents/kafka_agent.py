"""The Kafka receiver agent as a process (``python -m agents.receiver kafka``): its consumer of the SUT topic, polled
in the process every receiver runs (``agents.runner``). What it does with each message is ``transports.kafka.receiver``.

    main_kafka(args)   # 0 when stopped (SIGTERM, Ctrl-C), 2 on bad settings or a SUT broker it cannot reach
"""
from __future__ import annotations

import sys
import time

from agents.runner import Process, state_paths
from core import logs
from core.cli import await_brokers
from core.kafka_options import SUT_ENV, client_options
from core.units import parse_size
from transports.kafka.receiver import TOPIC_CHECK_S, KafkaReceiver


class Refused(Exception):
    """A setting or a broker that stops the agent before it starts: the one-line reason (exit 2)."""


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
        consumer, admin = sut_consumer(a)
    except Refused as e:
        print(f"receiver: error: {e}", file=sys.stderr)
        return 2
    logger = logs.setup(a.agent)
    log, warn = logs.printer(logger), logs.printer(logger, logs.WARNING)
    spool_dir, shipper_log, metrics_dir = state_paths(a.state_dir, a.agent)
    process = Process(a, a.agent, spool_dir, budget_bytes, shipper_log, log, warn, metrics_dir=metrics_dir)
    receiver = KafkaReceiver(consumer, process.spool, a.topic, a.state_dir, a.agent, log=log, warn=warn, admin=admin,
                             routes=a.routes, from_end=a.from_end, share=a.share)
    try:
        try:
            offsets = receiver.start()
        except RuntimeError as e:
            print(f"receiver: error: {e}", file=sys.stderr)
            return 2
        process.start(receiver, a.metrics_listen)
        log(f"receiver {a.agent}: {a.bootstrap}/{a.topic} -> spool {spool_dir} -> "
            f"{a.telemetry_bootstrap}/{a.telemetry_topic}")
        receiver.check_topic(offsets)  # learns the topic's ID
        last_check = time.monotonic()

        def turn() -> None:
            nonlocal last_check
            receiver.poll_once(offsets)
            if time.monotonic() - last_check >= TOPIC_CHECK_S:
                receiver.check_topic(offsets)
                last_check = time.monotonic()

        process.run_blocking(turn)
    finally:
        consumer.close()
        receiver.wal.close()
        process.close()
    return 0
