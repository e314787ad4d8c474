"""Where each event arrived, on real brokers (``make test-brokers``): a relay between where the load generator sends
and where the receivers read forwards every event to its own route, but 1% of pair 0's to pair 1. Over AMQP 1.0 (the
plugin's ``/queue/...`` addresses, ``?pairs=4``) and over AMQP 0-9-1 (a topic exchange, ``?bindings=4``) on one
RabbitMQ, and over Kafka (a topic of 4 partitions copied partition for partition to another, read with ``--routes``)
on Tansu, side by side.

Ground truth is the relay's own list of the events it sent astray, kept in the test's process: the job's
``misrouted`` count, its exemplars and the per-pair (per-partition) figures (``scenarios.pairs``, from the archive) are checked
against it, and the ledger sums to ``sent`` with nothing dropped. Both relays are the test's own code: the AMQP 1.0
one moves each message's bytes untouched with flightwatch's engine (``transports.amqp1.engine``), the 0-9-1 one with pika,
the Kafka one with confluent-kafka (keys, headers and values as they came).
"""
from __future__ import annotations

import threading

import pytest
from support.brokers import EXACT_DROP_TIMEOUT, Attack, run_attacks, running

from core.output import ledger
from scenarios import pairs as pair_stats
from stack.rabbitmq import installed, start_rabbitmq, stop_rabbitmq
from transports import amqp
from transports.amqp1.codec import read_event
from transports.amqp1.engine import EngineLink

pytestmark = [pytest.mark.integration, pytest.mark.brokers,
              pytest.mark.skipif(not installed(), reason="rabbitmq-server is not installed (.ci/run installs it)")]
ROUTES = 4


@pytest.fixture(scope="module")
def rabbit(tmp_path_factory):
    yield from running(start_rabbitmq, stop_rabbitmq, tmp_path_factory, "rabbitmq")


def astray(event_id: str) -> int | None:
    """The route the relay sends an event to instead of its own: 1% of pair 0's (every hundredth of its events) go
    to pair 1; None for the others."""
    k = int(event_id.rpartition("-")[2])
    return 1 if k % ROUTES == 0 and (k // ROUTES) % 100 == 0 else None


class Relay(threading.Thread):
    """Forwards until ``stop`` is set; ``misrouted`` lists the event IDs it sent astray, ``forwarded`` counts all."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.stop, self.misrouted, self.forwarded, self.error = threading.Event(), [], 0, None
        self.ready = threading.Event()

    def route(self, event_id: str, own: int) -> int:
        self.forwarded += 1
        to = astray(event_id)
        if to is None:
            return own
        self.misrouted.append(event_id)
        return to

    def run(self) -> None:
        try:
            self.serve()
        except Exception as e:  # noqa: BLE001 (said by the test)
            self.error = repr(e)
            self.ready.set()


class Amqp1Relay(Relay):
    """``/queue/in.<i>`` to ``/queue/out.<i>``, each message's bytes as they came."""

    def __init__(self, port: int) -> None:
        super().__init__()
        self.port = port

    def serve(self) -> None:
        rx = EngineLink("127.0.0.1", self.port, None, "/queue/in", sending=False, prefetch=400, pairs=ROUTES,
                        name="relay-in")
        tx = EngineLink("127.0.0.1", self.port, None, "/queue/out", sending=True, pairs=ROUTES, name="relay-out")
        tx.on_outcome = lambda _d, error: setattr(self, "error", error) if error else None
        tag = 0

        def forward(message, pair: int) -> None:
            nonlocal tag
            event_id = read_event(message, amqp.ID_HEADER.encode(), amqp.RUN_HEADER.encode())[0]
            tag += 1
            tx.send(tag.to_bytes(8, "big"), bytes(message), False, self.route(event_id, pair))

        rx.on_message = forward
        for link in (rx, tx):
            link.open()
            link.attach(10)
        self.ready.set()
        while not self.stop.is_set():
            rx.pump(0.01)
            tx.pump(0.0)
        for _ in range(50):
            tx.pump(0.01)
        rx.close()
        tx.close()


class Amqp091Relay(Relay):
    """The topic exchange ``fw.in`` (every key, one queue) to the topic exchange ``fw.out``, with the key of the route
    it goes to."""

    def __init__(self, port: int) -> None:
        super().__init__()
        self.port = port

    def serve(self) -> None:
        import pika

        conn = pika.BlockingConnection(pika.URLParameters(f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"))
        ch = conn.channel()
        ch.exchange_declare("fw.in", "topic")
        ch.exchange_declare("fw.out", "topic")
        ch.queue_declare("relay.in")
        ch.queue_bind("relay.in", "fw.in", "#")
        ch.basic_qos(prefetch_count=400)

        def forward(ch, method, props, body) -> None:
            event_id = props.headers[amqp.ID_HEADER]
            event_id = event_id.decode() if isinstance(event_id, bytes) else event_id
            own = int(method.routing_key.rpartition(".")[2])
            ch.basic_publish("fw.out", f"fw.{self.route(event_id, own)}", body, props)
            ch.basic_ack(method.delivery_tag)

        ch.basic_consume("relay.in", forward)
        self.ready.set()
        while not self.stop.is_set():
            conn.process_data_events(time_limit=0.05)
        conn.close()


class KafkaRelay(Relay):
    """Topic ``astray-in`` to ``astray-out``, partition for partition (both of ``ROUTES``); for Kafka, pair 0 is
    partition 0 and its astray events are those whose number is a multiple of 100."""

    def __init__(self, bootstrap: str) -> None:
        super().__init__()
        self.bootstrap = bootstrap

    def serve(self) -> None:
        from confluent_kafka import Consumer, Producer, TopicPartition

        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "relay", "enable.auto.commit": False})
        consumer.assign([TopicPartition("astray-in", p, 0) for p in range(ROUTES)])
        producer = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 5})
        self.ready.set()
        while not self.stop.is_set():
            for m in consumer.consume(500, 0.05):
                if m.error() is not None:
                    continue
                event_id = m.key().decode()
                to = m.partition()
                if to == 0 and int(event_id.rpartition("-")[2]) % 100 == 0:
                    to = 1
                    self.misrouted.append(event_id)
                self.forwarded += 1
                producer.produce("astray-out", m.value(), m.key(), to, headers=m.headers())
            producer.poll(0)
        assert producer.flush(10) == 0
        consumer.close()


def test_events_a_relay_sends_to_another_pairs_address_or_binding_are_misrouted_exactly(broker, rabbit, tmp_path):
    from support import create_topic

    port, _, _ = rabbit
    for topic in ("astray-in", "astray-out"):
        create_topic(broker, topic, ROUTES)
    relays = {"amqp1": Amqp1Relay(port), "amqp091": Amqp091Relay(port), "kafka": KafkaRelay(broker)}
    for r in relays.values():
        r.start()
        assert r.ready.wait(30) and r.error is None, r.error
    attacks = [
        Attack("astray1", f"amqp1://127.0.0.1:{port}//queue/in?pairs={ROUTES}", 500, 6,
               drop_timeout=EXACT_DROP_TIMEOUT, receive_from=f"amqp1://127.0.0.1:{port}//queue/out?pairs={ROUTES}"),
        Attack("astray091", f"amqp://guest:guest@127.0.0.1:{port}/%2F?exchange=fw.in&bindings={ROUTES}", 1000, 6,
               drop_timeout=EXACT_DROP_TIMEOUT,
               receive_from=f"amqp://guest:guest@127.0.0.1:{port}/%2F?exchange=fw.out&bindings={ROUTES}"),
        Attack("astraykafka", f"kafka://{broker}/astray-in", 1000, 6, drop_timeout=EXACT_DROP_TIMEOUT,
               receive_from=f"kafka://{broker}/astray-out", receiver_args=("--routes",)),
    ]
    try:
        results = run_attacks(broker, tmp_path, attacks)
    finally:
        for r in relays.values():
            r.stop.set()
            r.join(10)
    for (name, relay), a, (s, truth, _report) in zip(relays.items(), attacks, results):
        assert relay.error is None, (name, relay.error)
        planted = set(relay.misrouted)
        led = ledger(s)
        print(f"\n{name}: {relay.forwarded:,} forwarded, {len(planted)} sent astray; job: misrouted {s['misrouted']}, "
              f"ledger {led}")
        assert 0.006 * truth["sent"] / ROUTES <= len(planted) <= 0.014 * truth["sent"] / ROUTES + 1  # 1% of pair 0's
        assert s["sent"] == truth["sent"] == relay.forwarded
        # every event sent astray is misrouted, and no other: never received in time, never a drop
        assert s["misrouted"] == len(planted) and s["failed_misrouted"] == 0, s
        assert {m["event_id"] for m in s["exemplars"]["misrouted"]} == planted
        assert {m["route"] for m in s["exemplars"]["misrouted"]} == {1}
        assert led["misrouted"] == len(planted) and led["received"] == s["sent"] - len(planted), led
        assert s["dropped"] == s["late"] == s["duplicates"] == 0 and sum(led.values()) == s["sent"]
        # per pair (a send's route: its pair, binding or partition), from what was observed: pair 0 lost none, its
        # astray events are its misrouted; pair 1 received only its own
        f = pair_stats.pair_figures(str(tmp_path / a.run_id / a.run_id), ROUTES, 5 * 10**9, s)
        rows = {r["pair"]: r for r in f["per_pair"]}
        assert f["disagreements"] == [] and f["misrouted"] == len(planted), f["disagreements"]
        assert rows[0]["misrouted"] == len(planted) and rows[0]["lost"] == 0
        assert rows[0]["received"] == rows[0]["sent"] - len(planted)
        assert all(rows[i]["misrouted"] == 0 and rows[i]["received"] == rows[i]["sent"] for i in (1, 2, 3)), rows
