"""proton's engine driven by hand (``transports.amqp1.engine``), through the load generator's AMQP 1.0 target and the AMQP 1.0
receiver, against a peer on loopback that is proton's own container: outcomes of every kind, messages of every
kind, a connection the peer drops. A stand-in for a broker, with exact counts to check; the real brokers (Artemis,
RabbitMQ's plugin) are in ``tests/system`` (``make test-brokers``)."""
from __future__ import annotations

import asyncio
import collections
import json
import threading
import time

import pytest
from proton import Condition, Delivery, Message
from proton.handlers import MessagingHandler
from proton.reactor import Container

from core.procs import free_port, wait_port
from transports import amqp
from transports.amqp1.codec import EventEncoder
from transports.amqp1.receiver import Amqp1Receiver
from transports.registry import TargetOptions, TargetSpec, make_target


class Peer(MessagingHandler):
    """Takes what a sending link gives, with an outcome by the event's number (``outcome``); gives a receiving link
    the messages in ``to_send``; drops the connection once ``drop_after`` messages came in."""

    def __init__(self, port: int, outcome=lambda n: "accepted", to_send=(), drop_after: int | None = None) -> None:
        super().__init__(auto_accept=False)
        self.port, self.outcome, self.to_send, self.drop_after = port, outcome, list(to_send), drop_after
        self.received: list[str] = []
        self.settled = collections.Counter()
        self.connections = 0
        self.addressed: dict[str, str] = {}  # event ID -> the address of the link it came on
        self.sources: list[str] = []         # the addresses of the links the peer was asked to give from
        self.given: list[str] = []           # per message of ``to_send``, in order: the address of the link it went on

    def on_link_opened(self, event):
        if event.link.is_sender:
            self.sources.append(event.link.remote_source.address)

    def on_start(self, event):
        self.acceptor = event.container.listen(f"127.0.0.1:{self.port}")

    def on_connection_opening(self, event):
        self.connections += 1

    def on_link_opening(self, event):
        event.link.target.copy(event.link.remote_target)
        event.link.source.copy(event.link.remote_source)

    def on_sendable(self, event):
        while self.to_send and event.sender.credit:
            raw = self.to_send.pop(0)
            self.given.append(event.link.remote_source.address)
            event.sender.delivery(str(len(self.to_send)))
            event.sender.stream(raw if isinstance(raw, bytes) else raw.encode())
            event.sender.advance()

    def on_settled(self, event):
        self.settled[event.delivery.remote_state] += 1

    def on_message(self, event):
        n = len(self.received)
        self.received.append(event.message.properties[amqp.ID_HEADER])
        self.addressed[event.message.properties[amqp.ID_HEADER]] = event.link.target.address
        kind, d = self.outcome(n), event.delivery
        if kind == "rejected":
            d.local.condition = Condition("amqp:precondition-failed", "no")
            d.update(Delivery.REJECTED)
            d.settle()
        elif kind in ("released", "modified"):
            self.release(d, delivered=kind == "modified")
        else:
            self.accept(d)
        if self.drop_after is not None and len(self.received) == self.drop_after:
            event.connection.close()


@pytest.fixture
def peer_at():
    """``peer_at(**kw)``: a Peer listening on a free loopback port, in a thread of its own, stopped after the test."""
    started = []

    def start(**kw) -> Peer:
        peer = Peer(free_port(), **kw)
        container = Container(peer)
        thread = threading.Thread(target=container.run, daemon=True)
        thread.start()
        started.append((container, thread))
        assert wait_port(peer.port, 10)
        return peer
    yield start
    for container, thread in started:
        container.stop()
        thread.join(10)


class Book:
    """The attack's accounts as a target sees them: every send, and every answer (exactly one each)."""

    def __init__(self) -> None:
        self.sends: list[str] = []
        self.routes: dict[str, int | None] = {}   # where the target said each went (``contract.Send.route``)
        self.answers: dict[str, str | None] = {}

    def sent(self, eid, intended, at, route=None):
        self.sends.append(eid)
        self.routes[eid] = route

    def done(self, eid, sent, status, error):
        assert eid not in self.answers, f"{eid} answered twice"
        self.answers[eid] = error


def _attack(port: int, n: int, settle: str = "unsettled", gap_s: float = 0.0, within_s: float = 10.0, extra: str = "",
            kept: list | None = None):
    target = make_target(TargetSpec.parse(f"amqp1://127.0.0.1:{port}/orders?settle={settle}{extra}"),
                         TargetOptions(5.0, 1000, "run-1", 64))
    if kept is not None:
        kept.append(target)
    asyncio.run(target.connect())
    book = Book()
    target.start(book)
    for i in range(n):
        target.send(f"e-{i}", time.time_ns())
        target.poll(gap_s)
    deadline = time.monotonic() + within_s
    while len(book.answers) < n and time.monotonic() < deadline:
        target.poll(0.01)
    asyncio.run(target.close())
    return book


def test_every_outcome_the_broker_gives_is_counted_by_its_cause(peer_at):
    kinds = {3: "rejected", 5: "released", 7: "modified"}
    peer = peer_at(outcome=lambda n: kinds.get(n % 10, "accepted"))
    book = _attack(peer.port, 500)
    assert len(book.sends) == 500 and peer.received == [f"e-{i}" for i in range(500)]
    assert collections.Counter(book.answers.values()) == {None: 350, "rejected: precondition failed": 50,
                                                       "released": 50, "modified": 50}
    assert book.answers["e-13"] == "rejected: precondition failed" and book.answers["e-15"] == "released"


def test_presettled_sends_are_taken_at_once(peer_at):
    peer = peer_at()
    book = _attack(peer.port, 200, settle="presettled")
    assert collections.Counter(book.answers.values()) == {None: 200}
    deadline = time.monotonic() + 5
    while len(peer.received) < 200 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(peer.received) == 200


def test_a_connection_the_broker_drops_fails_what_was_in_flight_and_is_opened_again(peer_at):
    """The peer closes the connection after its 100th message: what had no outcome then fails with the peer's
    reason, sends while it is away are ``not connected``, and the target opens it again within ``RECONNECT_S``."""
    peer = peer_at(drop_after=100)
    book = _attack(peer.port, 400, gap_s=0.005)
    causes = collections.Counter(book.answers.values())
    assert len(book.answers) == 400 and peer.connections == 2, causes
    assert set(causes) <= {None, "connection closed", "not connected"}, causes
    assert causes["not connected"] > 0 and causes[None] >= 200, causes
    assert {eid for eid, error in book.answers.items() if error is None} <= set(peer.received)


def test_the_receiver_records_each_event_once_and_counts_the_rest_apart(peer_at):
    enc = EventEncoder({amqp.RUN_HEADER: "run-1"}, b"p" * 32, "application/octet-stream", amqp.ID_HEADER,
                       amqp.SENT_HEADER)
    ours = [enc.encode(f"e-{i}", time.time_ns()) for i in range(2500)]
    no_run = [Message(body=b"x", id=f"m-{i}") for i in range(7)]
    garbage = [b"\x01\x02\x03"] * 3
    peer = peer_at(to_send=ours[:1000] + no_run + garbage + ours[1000:])
    lines = []
    spool = type("Spool", (), {"append": staticmethod(lines.append), "counters": staticmethod(dict)})()
    receiver = Amqp1Receiver("127.0.0.1", peer.port, None, amqp.Amqp1Address("orders"), spool, "rx", prefetch=100)
    receiver.connect(5.0)
    deadline = time.monotonic() + 20
    while sum(peer.settled.values()) < 2510 and time.monotonic() < deadline:
        receiver.serve(0.1)
    receiver.close()
    c = receiver.counters()
    assert (c["received"], c["unattributed"], c["malformed"]) == (2500, 7, 3), c
    assert peer.settled == {Delivery.ACCEPTED: 2510}  # every one accepted, the malformed too: not given again
    records = [json.loads(line) for line in lines]
    assert [r["event_id"] for r in records] == [f"e-{i}" for i in range(2500)]  # once each, in order
    assert {(r["run_id"], r["bytes_in"], r["agent"]) for r in records} == {("run-1", 32, "rx")}


def test_pairs_each_send_on_their_own_address_and_the_receiver_consumes_every_one(peer_at):
    """``?pairs=7``: seven links on one connection, event k on ``orders.<k mod 7>``, every link attached before the
    first send; a receiver of ``?pairs=4`` attaches four links, ``orders.0`` ... ``orders.3``, and takes what each
    gives, once."""
    peer = peer_at()
    kept: list = []
    book = _attack(peer.port, 350, extra="&pairs=7", kept=kept)
    assert collections.Counter(book.answers.values()) == {None: 350}
    assert {eid: peer.addressed[eid] for eid in book.sends} == {f"e-{k}": f"orders.{k % 7}" for k in range(350)}
    assert book.routes == {f"e-{k}": k % 7 for k in range(350)}  # each send's record names its pair
    assert kept[0].shaping()["pairs"] == 7 and 0 < kept[0].attached_ns <= time.time_ns()
    enc = EventEncoder({amqp.RUN_HEADER: "run-1"}, b"p", "application/octet-stream", amqp.ID_HEADER, amqp.SENT_HEADER)
    peer = peer_at(to_send=[enc.encode(f"r-{i}", time.time_ns()) for i in range(400)])
    lines = []
    spool = type("Spool", (), {"append": staticmethod(lines.append), "counters": staticmethod(dict)})()
    receiver = Amqp1Receiver("127.0.0.1", peer.port, None, amqp.Amqp1Address.parse("/orders", "pairs=4"), spool, "rx")
    receiver.connect(5.0)
    assert receiver.link.attached_ns and len(receiver.link.links) == 4
    deadline = time.monotonic() + 20
    while sum(peer.settled.values()) < 400 and time.monotonic() < deadline:
        receiver.serve(0.1)
    receiver.close()
    assert sorted(peer.sources) == [f"orders.{i}" for i in range(4)]
    assert sorted(json.loads(line)["event_id"] for line in lines) == sorted(f"r-{i}" for i in range(400))
    # each receive names the address and the pair of the link it came on, as the peer gave it
    where = {r["event_id"]: (r["dest"], r["route"]) for r in map(json.loads, lines)}
    assert where == {f"r-{i}": (a, int(a.rpartition(".")[2])) for i, a in enumerate(peer.given)}
    assert len(set(peer.given)) > 1
