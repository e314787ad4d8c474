"""The Kafka receiver agent as a process (``python -m agents.receiver kafka``): its flags, and its consumer of the SUT
topic polled in the process every receiver runs (the runner it is given, ``agents.runner``). What it does with each
message is ``transports.kafka.receiver``.

    main(args, runner)   # 0 when stopped (SIGTERM, Ctrl-C), 2 on bad settings or a SUT broker it cannot reach
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from core import metrics, settings
from core.cli import add_wait, await_brokers, bootstrap_arg
from core.kafka_options import SUT_ENV, client_options
from core.procs import HOST, KAFKA_RECEIVER_METRICS_PORT, sut_bootstrap
from core.rundir import ROOT
from core.units import parse_part, parse_size
from transports.base import Runner
from transports.kafka.receiver import FETCH_MAX_WAIT_MS, TOPIC_CHECK_S, KafkaReceiver


def _share(text: str) -> tuple[int, int]:
    try:
        return parse_part(text, "--share")
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_flags(k: argparse.ArgumentParser) -> None:
    settings.add(k, "FLIGHTWATCH_SUT_BOOTSTRAP", "--bootstrap", default=sut_bootstrap(), type=bootstrap_arg,
                 help="the system under test's Kafka bootstrap")
    k.add_argument("--topic", default="flightwatch.sut")
    k.add_argument("--state-dir", default=os.path.join(ROOT, ".stack", "receiver-kafka"),
                   help="where the write-ahead log, the telemetry spool (<state-dir>/spool) and the shipper's log live "
                        "(default %(default)s)")
    k.add_argument("--spool-budget", default="2GiB", metavar="SIZE",
                   help="disk the telemetry spool may hold while the telemetry broker is away; receives past it are "
                        "counted as lost, in /metrics and in the run's summary (default %(default)s)")
    k.add_argument("--from-end", action="store_true",
                   help="on a first start (no write-ahead log in --state-dir yet), take up each partition at its end: "
                        "what the topic held before is left alone (a topic of your own; the load generator starts a "
                        "receiver this way for a run)")
    k.add_argument("--share", type=_share, default=(0, 1), metavar="INDEX/COUNT",
                   help="consume only the partitions p with p mod COUNT == INDEX: one of COUNT receivers that split "
                        "the topic between them, no consumer group joined (the load generator's --receivers N; "
                        "default 0/1)")
    k.add_argument("--routes", action="store_true",
                   help="record each receive's partition as its route: the topic is the one the load generator sends "
                        "to (the receiver that follows the target, the stack's), so an event read from a partition it "
                        "was not sent to is misrouted. Leave it off for a topic your system copies events into")
    k.add_argument("--create-topic", type=int, default=2, metavar="PARTITIONS",
                   help="create the SUT topic with this many partitions if missing (default %(default)s)")
    k.add_argument("--fetch-wait-ms", type=int, default=FETCH_MAX_WAIT_MS, metavar="MS",
                   help="fetch.wait.max.ms: the longest a broker may hold a fetch; adds to flight time on a broker "
                        "that holds it under load (Tansu), and sets the idle fetch rate (default %(default)s)")
    settings.add(k, "FLIGHTWATCH_KAFKA_RECEIVER_METRICS_LISTEN", "--metrics-listen", type=metrics.listen_arg,
                 default=f"{HOST}:{KAFKA_RECEIVER_METRICS_PORT}", metavar="HOST:PORT",
                 help="serve Prometheus metrics here ('none': not at all)")
    add_wait(k, "the SUT and telemetry brokers")


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


def main(a, runner: Runner) -> int:
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
    process = runner.Process.in_state_dir(a, budget_bytes)
    log, warn, spool_dir = process.log, process.warn, process.spool.dir
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


def stack_flags(stack) -> list[str]:
    """The stack's receiver of the SUT topic (``kafka-receiver``): every partition, made if missing, on the SUT's
    broker (Tansu or Apache Kafka)."""
    from core.suts import receiver_bootstrap, sut_partitions

    return ["--routes", "--create-topic", str(sut_partitions()), "--bootstrap", receiver_bootstrap(stack.sut),
            "--state-dir", os.path.join(stack.dir, "kafka-receiver"),
            "--metrics-listen", f"{HOST}:{stack.metrics_ports['kafka-receiver']}"]
